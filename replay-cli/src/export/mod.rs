//! Parquet export: one schema for every topic, files partitioned Hive-style by topic,
//! partition and UTC date (`topic=T/partition=P/date=YYYY-MM-DD/part-<first offset>.parquet`)
//! so query engines prune by path, written to a local directory or any object-store URL.
//!
//! | column | type |
//! | --- | --- |
//! | topic | utf8 |
//! | partition | int32 |
//! | offset | int64 |
//! | timestamp | timestamp(ms, UTC) |
//! | key, value | binary (null when absent) |
//! | headers | list<struct<key: utf8, value: binary>> |
//! | value_json | struct of the value's JSON fields (only with `--decode-json`) |
//!
//! An export is a pipeline of three stages that overlap: the reader (the caller's task:
//! ranged GETs through the cold reader, CRC checks), the decoder (a blocking thread:
//! decompression, records straight into Arrow column builders, a batch per file every
//! 8,192 rows) and the writer (a blocking thread: Parquet encoding, streamed to the store
//! a row group at a time, as a multipart upload once a file outgrows one part; the `value`
//! column encoded on a helper thread beside the others, see `file`). Bounded
//! channels between them keep memory to a few batches whatever the export's size.

mod file;

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::Context;
use arrow_array::builder::{ArrayBuilder, BinaryBuilder, StringBuilder};
use arrow_array::{
    Array, ArrayRef, BinaryArray, Int32Array, Int64Array, ListArray, RecordBatch, StringArray,
    StructArray, TimestampMillisecondArray,
};
use arrow_buffer::{OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, Fields};
use indicatif::ProgressBar;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;
use strata_cold::object_store::buffered::BufWriter;
use strata_cold::object_store::path::Path;
use strata_cold::object_store::ObjectStore;
use tokio::sync::mpsc;

use strata_core::batch::Headers;

use crate::source::{Batches, PartitionPlan, PartitionReader, Range, RecordRef, Source};

#[derive(Debug, Clone)]
pub struct ExportConfig {
    /// Rows per row group.
    pub row_group_rows: usize,
    /// A file is closed and a new part begun past this many bytes.
    pub file_bytes: u64,
    pub compression: Compression,
    /// Also decode JSON-object values into a typed `value_json` struct column, its fields
    /// inferred from the first records exported.
    pub decode_json: bool,
}

impl Default for ExportConfig {
    fn default() -> Self {
        ExportConfig {
            row_group_rows: 128 * 1024,
            file_bytes: 128 << 20,
            compression: Compression::ZSTD(ZstdLevel::default()),
            decode_json: false,
        }
    }
}

/// `zstd` (default), `snappy` or `none`.
pub fn parse_compression(s: &str) -> anyhow::Result<Compression> {
    Ok(match s {
        "zstd" => Compression::ZSTD(ZstdLevel::default()),
        "snappy" => Compression::SNAPPY,
        "none" | "uncompressed" => Compression::UNCOMPRESSED,
        other => anyhow::bail!("unknown compression '{other}': use zstd, snappy or none"),
    })
}

/// Records gathered before they become an Arrow batch.
const BATCH_ROWS: usize = 8192;

/// Bytes an output file buffers before its upload goes multipart (then one part at a time).
const UPLOAD_PART: usize = 16 << 20;

fn header_fields() -> Fields {
    Fields::from(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("value", DataType::Binary, true),
    ])
}

/// The value as a JSON object, if it is one.
fn json_object(value: Option<&[u8]>) -> Option<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_slice(value?).ok()?;
    v.is_object().then_some(v)
}

fn values_of(values: &BinaryArray) -> impl Iterator<Item = Option<&[u8]>> {
    (0..values.len()).map(|i| (!values.is_null(i)).then(|| values.value(i)))
}

/// The columns a JSON schema infers from `values`.
fn infer_json(values: &BinaryArray) -> anyhow::Result<arrow_schema::SchemaRef> {
    let objects: Vec<_> = values_of(values).filter_map(json_object).collect();
    anyhow::ensure!(
        !objects.is_empty(),
        "--decode-json: none of the first {} values is a JSON object to infer columns from",
        values.len()
    );
    let schema = arrow_json::reader::infer_json_schema_from_iterator(
        objects.iter().map(Ok::<_, arrow_schema::ArrowError>),
    )?;
    Ok(Arc::new(schema))
}

/// The `value_json` column: each JSON-object value decoded into `schema`'s fields (nulls
/// where the value is not a JSON object or lacks a field).
fn json_column(schema: &arrow_schema::SchemaRef, values: &BinaryArray) -> anyhow::Result<ArrayRef> {
    let mut decoder = arrow_json::ReaderBuilder::new(schema.clone())
        .with_batch_size(values.len().max(1))
        .with_coerce_primitive(true)
        .build_decoder()?;
    let mut lines = Vec::new();
    for v in values_of(values) {
        match json_object(v) {
            Some(v) => serde_json::to_writer(&mut lines, &v)?,
            None => lines.extend_from_slice(b"{}"),
        }
        lines.push(b'\n');
    }
    decoder.decode(&lines).map_err(|e| {
        anyhow::anyhow!(
            "--decode-json: a value does not fit the columns inferred from the first records: {e}"
        )
    })?;
    let batch = decoder.flush()?.context("decoded nothing")?;
    Ok(Arc::new(arrow_array::StructArray::from(batch)))
}

/// Days since the epoch (UTC) of epoch milliseconds.
fn utc_day(ms: i64) -> i64 {
    ms.div_euclid(86_400_000)
}

/// `YYYY-MM-DD` of days since the epoch.
fn day_date(days: i64) -> String {
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Which file a record goes to: its partition and UTC day.
type FileKey = (u32, i64);

/// The rows of one file's next batch, straight into Arrow column builders.
struct Rows {
    first_offset: i64,
    offsets: Vec<i64>,
    timestamps: Vec<i64>,
    keys: BinaryBuilder,
    values: BinaryBuilder,
    headers: HeaderColumns,
}

/// The `headers` column's buffers, filled row by row and put together as a list of
/// structs at the end (a `ListBuilder<StructBuilder>` finds its field builders by dynamic
/// downcast for every header).
struct HeaderColumns {
    keys: StringBuilder,
    values: BinaryBuilder,
    /// Where each row's headers begin, and the end.
    offsets: Vec<i32>,
}

impl HeaderColumns {
    fn new() -> HeaderColumns {
        let mut offsets = Vec::with_capacity(BATCH_ROWS + 1);
        offsets.push(0);
        HeaderColumns {
            keys: StringBuilder::with_capacity(BATCH_ROWS, BATCH_ROWS * 8),
            values: BinaryBuilder::with_capacity(BATCH_ROWS, BATCH_ROWS * 8),
            offsets,
        }
    }

    fn push(&mut self, headers: Headers<'_>) {
        for (k, v) in headers {
            self.keys.append_value(String::from_utf8_lossy(k));
            self.values.append_option(v);
        }
        self.offsets.push(self.keys.len() as i32);
    }

    fn finish(mut self) -> anyhow::Result<ListArray> {
        let entries = StructArray::try_new(
            header_fields(),
            vec![Arc::new(self.keys.finish()), Arc::new(self.values.finish())],
            None,
        )?;
        Ok(ListArray::try_new(
            Arc::new(Field::new("item", DataType::Struct(header_fields()), false)),
            OffsetBuffer::new(ScalarBuffer::from(self.offsets)),
            Arc::new(entries),
            None,
        )?)
    }
}

impl Rows {
    fn new(first_offset: i64) -> Rows {
        Rows {
            first_offset,
            offsets: Vec::with_capacity(BATCH_ROWS),
            timestamps: Vec::with_capacity(BATCH_ROWS),
            keys: BinaryBuilder::with_capacity(BATCH_ROWS, BATCH_ROWS * 16),
            values: BinaryBuilder::with_capacity(BATCH_ROWS, BATCH_ROWS * 256),
            headers: HeaderColumns::new(),
        }
    }

    fn len(&self) -> usize {
        self.offsets.len()
    }

    fn push(&mut self, r: &RecordRef<'_>) {
        self.offsets.push(r.offset);
        self.timestamps.push(r.timestamp);
        self.keys.append_option(r.key);
        self.values.append_option(r.value);
        self.headers.push(r.headers);
    }

    /// The Arrow batch of these rows of `topic`'s `partition` (with `value_json` when given
    /// its schema, inferring it first when asked to and not done yet).
    fn into_batch(
        mut self,
        topic: &str,
        partition: u32,
        json: Option<&mut Option<arrow_schema::SchemaRef>>,
    ) -> anyhow::Result<RecordBatch> {
        let n = self.len();
        let values = self.values.finish();
        let json = match json {
            None => None,
            Some(schema) => {
                if schema.is_none() {
                    *schema = Some(infer_json(&values)?);
                }
                let schema = schema.as_ref().expect("inferred above");
                Some(json_column(schema, &values)?)
            }
        };
        let mut columns: Vec<(&str, ArrayRef, bool)> = vec![
            (
                "topic",
                Arc::new(StringArray::from_iter_values(std::iter::repeat_n(topic, n))),
                false,
            ),
            (
                "partition",
                Arc::new(Int32Array::from_value(partition as i32, n)),
                false,
            ),
            ("offset", Arc::new(Int64Array::from(self.offsets)), false),
            (
                "timestamp",
                Arc::new(TimestampMillisecondArray::from(self.timestamps).with_timezone("UTC")),
                false,
            ),
            ("key", Arc::new(self.keys.finish()), true),
            ("value", Arc::new(values), true),
            ("headers", Arc::new(self.headers.finish()?), false),
        ];
        if let Some(column) = json {
            columns.push(("value_json", column, true));
        }
        Ok(RecordBatch::try_from_iter_with_nullable(columns)?)
    }
}

/// A batch of one file's rows, in offset order after the file's earlier batches.
pub struct Piece {
    partition: u32,
    day: i64,
    /// The offset of its first row: a file begun with this batch is named by it.
    first_offset: i64,
    batch: RecordBatch,
}

/// The decoder's side: records into per-file batches of `BATCH_ROWS` rows.
pub struct Batcher {
    topic: String,
    /// `Some` with `--decode-json` (the columns inferred from the first batch, once).
    json_schema: Option<Option<arrow_schema::SchemaRef>>,
    /// Few: the days of the partition being read (the last one used first).
    open: Vec<(FileKey, Rows)>,
    /// Records taken.
    pub rows: u64,
}

impl Batcher {
    pub fn new(topic: &str, config: &ExportConfig) -> Batcher {
        Batcher {
            topic: topic.to_string(),
            json_schema: config.decode_json.then_some(None),
            open: Vec::new(),
            rows: 0,
        }
    }

    /// Adds one record (records of a partition arrive in offset order); a batch complete
    /// goes to `out`.
    pub fn push(&mut self, r: &RecordRef<'_>, out: &mut Vec<Piece>) -> anyhow::Result<()> {
        let key = (r.partition, utc_day(r.timestamp));
        let at = match self.open.iter().rposition(|(k, _)| *k == key) {
            Some(at) => at,
            None => {
                self.open.push((key, Rows::new(r.offset)));
                self.open.len() - 1
            }
        };
        let rows = &mut self.open[at].1;
        rows.push(r);
        self.rows += 1;
        if rows.len() >= BATCH_ROWS {
            let (key, rows) = self.open.swap_remove(at);
            out.push(self.piece(key, rows)?);
        }
        Ok(())
    }

    fn piece(&mut self, (partition, day): FileKey, rows: Rows) -> anyhow::Result<Piece> {
        let first_offset = rows.first_offset;
        let batch = rows.into_batch(&self.topic, partition, self.json_schema.as_mut())?;
        Ok(Piece {
            partition,
            day,
            first_offset,
            batch,
        })
    }

    /// The last batches of a partition (or of every partition).
    pub fn flush(&mut self, partition: Option<u32>, out: &mut Vec<Piece>) -> anyhow::Result<()> {
        let (mut done, open): (Vec<_>, Vec<_>) = std::mem::take(&mut self.open)
            .into_iter()
            .partition(|((p, _), _)| partition.is_none_or(|want| *p == want));
        self.open = open;
        done.sort_unstable_by_key(|(k, _)| *k);
        for (k, rows) in done {
            out.push(self.piece(k, rows)?);
        }
        Ok(())
    }
}

/// Columns written without a dictionary: every offset of a row group is distinct, so a
/// dictionary for them only costs a hash table of 131,072 entries per row group (rebuilt,
/// grown and probed for every row) before the encoder gives up on it at 1 MiB.
pub const PLAIN_COLUMNS: &[&str] = &["offset"];

/// The writer's settings: the defaults (dictionary pages and data pages of 1 MiB, page
/// statistics, zstd level 1), the configured compression and row group size, and no
/// dictionary for [`PLAIN_COLUMNS`].
fn writer_properties(config: &ExportConfig) -> WriterProperties {
    let mut props = WriterProperties::builder()
        .set_compression(config.compression)
        .set_max_row_group_row_count(Some(config.row_group_rows.max(1)));
    for column in PLAIN_COLUMNS {
        props = props.set_column_dictionary_enabled(ColumnPath::from(*column), false);
    }
    props.build()
}

struct OpenFile {
    path: Path,
    writer: file::FileWriter,
}

/// The writer's side: batches into Parquet files under a prefix of a store, streamed.
pub struct Files {
    store: Arc<dyn ObjectStore>,
    prefix: String,
    topic: String,
    config: ExportConfig,
    open: HashMap<FileKey, OpenFile>,
    files: Vec<String>,
    bytes_written: u64,
}

impl Files {
    pub fn new(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        topic: &str,
        config: ExportConfig,
    ) -> Self {
        Files {
            store,
            prefix: prefix.trim_matches('/').to_string(),
            topic: topic.to_string(),
            config,
            open: HashMap::new(),
            files: Vec::new(),
            bytes_written: 0,
        }
    }

    fn path(&self, (partition, day): FileKey, first_offset: i64) -> Path {
        let dir = format!(
            "topic={}/partition={partition}/date={}/part-{first_offset:020}.parquet",
            self.topic,
            day_date(day)
        );
        if self.prefix.is_empty() {
            Path::from(dir)
        } else {
            Path::from(format!("{}/{dir}", self.prefix))
        }
    }

    /// Writes a batch to its file, beginning the file if none is open, and closing it
    /// once it has grown past the file size.
    pub async fn write(&mut self, piece: Piece) -> anyhow::Result<()> {
        let key = (piece.partition, piece.day);
        if !self.open.contains_key(&key) {
            let path = self.path(key, piece.first_offset);
            let props = writer_properties(&self.config);
            let upload = BufWriter::with_capacity(self.store.clone(), path.clone(), UPLOAD_PART);
            let writer = file::FileWriter::try_new(piece.batch.schema(), props, upload)?;
            self.open.insert(key, OpenFile { path, writer });
        }
        let file = self.open.get_mut(&key).expect("opened above");
        if let Err(e) = file.writer.write(&piece.batch).await {
            let file = self.open.remove(&key).expect("present");
            return Err(abandon(file, e).await);
        }
        let w = &file.writer;
        if w.bytes_written() as u64 + w.in_progress_size() as u64 >= self.config.file_bytes {
            let file = self.open.remove(&key).expect("present");
            self.finish(file).await?;
        }
        Ok(())
    }

    async fn finish(&mut self, mut file: OpenFile) -> anyhow::Result<()> {
        if let Err(e) = file.writer.finish().await {
            return Err(abandon(file, e).await);
        }
        self.bytes_written += file.writer.bytes_written() as u64;
        self.files.push(file.path.to_string());
        Ok(())
    }

    /// Closes the files of a partition whose records are all written (keeps few files open).
    pub async fn finish_partition(&mut self, partition: u32) -> anyhow::Result<()> {
        let mut keys: Vec<_> = self
            .open
            .keys()
            .filter(|(p, _)| *p == partition)
            .copied()
            .collect();
        keys.sort_unstable();
        for k in keys {
            let file = self.open.remove(&k).expect("listed");
            self.finish(file).await?;
        }
        Ok(())
    }

    /// Closes every open file: the files written (sorted) and their bytes.
    pub async fn close(mut self) -> anyhow::Result<(Vec<String>, u64)> {
        let mut keys: Vec<_> = self.open.keys().copied().collect();
        keys.sort_unstable();
        for k in keys {
            let file = self.open.remove(&k).expect("listed");
            self.finish(file).await?;
        }
        self.files.sort();
        Ok((self.files, self.bytes_written))
    }

    /// Gives up every open file (an upload begun is aborted, leaving no part behind).
    pub async fn abort(mut self) {
        for (_, file) in self.open.drain() {
            file.writer.abort().await;
        }
    }
}

/// A file that failed: its upload aborted, the error named by its path.
async fn abandon(file: OpenFile, e: anyhow::Error) -> anyhow::Error {
    file.writer.abort().await;
    e.context(format!("writing {}", file.path))
}

/// A stage's error that only says a later or earlier stage stopped (that stage's own
/// error says why).
#[derive(Debug)]
struct Stopped(&'static str);

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the {} stopped", self.0)
    }
}

impl std::error::Error for Stopped {}

/// What the reader hands the decoder.
enum Read {
    Batches(Batches),
    /// Every record of a partition has been read.
    PartitionDone(u32),
    /// Every partition has been read.
    End,
}

/// What the decoder hands the writer.
enum Write {
    Piece(Piece),
    PartitionDone(u32),
    End,
}

/// What an export did.
pub struct Exported {
    pub records: u64,
    /// Bytes of batches read.
    pub bytes: u64,
    pub files: Vec<String>,
    /// Bytes of Parquet written.
    pub written: u64,
}

/// Batches of 4 MiB read ahead of the decoder, and Arrow batches of 8,192 rows ahead of
/// the writer.
const READ_AHEAD: usize = 4;
const DECODED_AHEAD: usize = 4;

/// Exports the records of `plans` in `range`: read here (with the hot tail when `hot` is
/// given), decoded on one blocking thread and written by `files` on another, overlapping.
/// `bar` counts the bytes read.
pub async fn export(
    src: &mut Source,
    mut hot: Option<&mut crate::cluster::Cluster>,
    plans: &[PartitionPlan],
    range: &Range,
    mut batcher: Batcher,
    mut files: Files,
    bar: &ProgressBar,
) -> anyhow::Result<Exported> {
    let (read_tx, mut read_rx) = mpsc::channel::<Read>(READ_AHEAD);
    let (write_tx, mut write_rx) = mpsc::channel::<Write>(DECODED_AHEAD);
    let decode_range = range.clone();
    let decode_bar = bar.clone();
    let decoder = tokio::task::spawn_blocking(move || -> anyhow::Result<u64> {
        let mut out = Vec::new();
        let send = |out: &mut Vec<Piece>| -> anyhow::Result<()> {
            for piece in out.drain(..) {
                write_tx
                    .blocking_send(Write::Piece(piece))
                    .map_err(|_| Stopped("Parquet writer"))?;
            }
            Ok(())
        };
        loop {
            match read_rx.blocking_recv() {
                Some(Read::Batches(b)) => {
                    let mut failed = None;
                    b.decode_each(&decode_range, |r| {
                        if failed.is_none() {
                            failed = batcher.push(r, &mut out).err();
                        }
                    })?;
                    if let Some(e) = failed {
                        return Err(e);
                    }
                    send(&mut out)?;
                    decode_bar.set_message(format!("{} records", batcher.rows));
                }
                Some(Read::PartitionDone(p)) => {
                    batcher.flush(Some(p), &mut out)?;
                    send(&mut out)?;
                    write_tx
                        .blocking_send(Write::PartitionDone(p))
                        .map_err(|_| Stopped("Parquet writer"))?;
                }
                Some(Read::End) => {
                    batcher.flush(None, &mut out)?;
                    send(&mut out)?;
                    write_tx
                        .blocking_send(Write::End)
                        .map_err(|_| Stopped("Parquet writer"))?;
                    return Ok(batcher.rows);
                }
                None => return Err(Stopped("reader").into()),
            }
        }
    });
    let runtime = tokio::runtime::Handle::current();
    let writer = tokio::task::spawn_blocking(move || {
        runtime.block_on(async move {
            let done = async {
                loop {
                    match write_rx.recv().await {
                        Some(Write::Piece(piece)) => files.write(piece).await?,
                        Some(Write::PartitionDone(p)) => files.finish_partition(p).await?,
                        Some(Write::End) => return Ok(()),
                        None => return Err(Stopped("decoder").into()),
                    }
                }
            }
            .await;
            match done {
                Ok(()) => files.close().await,
                Err(e) => {
                    files.abort().await;
                    Err(e)
                }
            }
        })
    });
    // The reader: here, in the caller's task.
    let mut bytes = 0u64;
    let read = async {
        for plan in plans {
            let mut reader = PartitionReader::new(plan, range.clone());
            while let Some(b) = reader.next_batches(src, hot.as_deref_mut()).await? {
                bytes += b.bytes();
                bar.inc(b.bytes());
                if read_tx.send(Read::Batches(b)).await.is_err() {
                    return Ok(()); // the decoder stopped: its error says why
                }
            }
            if read_tx
                .send(Read::PartitionDone(plan.partition))
                .await
                .is_err()
            {
                return Ok(());
            }
        }
        let _ = read_tx.send(Read::End).await;
        anyhow::Ok(())
    }
    .await;
    drop(read_tx);
    let decoded = decoder.await.context("the decoder thread")?;
    let written = writer.await.context("the writer thread")?;
    let (records, (files, written)) = match (read, decoded, written) {
        (Ok(()), Ok(records), Ok(written)) => (records, written),
        (read, decoded, written) => {
            // The stage that failed says why; the others only saw it stop.
            let mut failed: Vec<_> = [read.err(), decoded.err(), written.err()]
                .into_iter()
                .flatten()
                .collect();
            let why = failed.iter().position(|e| !e.is::<Stopped>()).unwrap_or(0);
            return Err(failed.swap_remove(why));
        }
    };
    Ok(Exported {
        records,
        bytes,
        files,
        written,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::Record;
    use arrow_array::cast::AsArray;
    use bytes::Bytes;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    fn utc_date(ms: i64) -> String {
        day_date(utc_day(ms))
    }

    /// Exports `records` (each partition's in offset order, offsets contiguous) as the
    /// pipeline does, on this task: encoded into batches of up to 500 records, decoded,
    /// batched and written. The files written, rows and bytes.
    async fn export_records(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        topic: &str,
        config: ExportConfig,
        records: &[Record],
    ) -> anyhow::Result<(Vec<String>, u64, u64)> {
        let mut batcher = Batcher::new(topic, &config);
        let mut files = Files::new(store, prefix, topic, config);
        let range = Range::default();
        let mut out = Vec::new();
        let mut parts = records
            .chunk_by(|a, b| a.partition == b.partition)
            .peekable();
        while let Some(part) = parts.next() {
            let p = part[0].partition;
            for chunk in part.chunks(500) {
                let raw = crate::publish::encode(chunk)?;
                let base = chunk[0].offset;
                let mut stamped = strata_core::batch::stamped_prefix(&raw, base, 0).to_vec();
                stamped.extend_from_slice(&raw[strata_core::batch::STAMP_LEN..]);
                let b = Batches::new(
                    p,
                    Bytes::from(stamped),
                    (base as u64, u64::MAX),
                    Vec::new(),
                    "test",
                    false,
                )?;
                let mut failed = None;
                b.decode_each(&range, |r| {
                    if let Err(e) = batcher.push(r, &mut out) {
                        failed.get_or_insert(e);
                    }
                })?;
                failed.map_or(Ok(()), Err)?;
                for piece in out.drain(..) {
                    files.write(piece).await?;
                }
            }
            if parts.peek().is_some() {
                batcher.flush(Some(p), &mut out)?;
                for piece in out.drain(..) {
                    files.write(piece).await?;
                }
                files.finish_partition(p).await?;
            }
        }
        batcher.flush(None, &mut out)?;
        for piece in out.drain(..) {
            files.write(piece).await?;
        }
        let rows = batcher.rows;
        let (names, bytes) = files.close().await?;
        Ok((names, rows, bytes))
    }

    #[test]
    fn dates_are_utc_calendar_days() {
        assert_eq!(utc_date(0), "1970-01-01");
        assert_eq!(utc_date(86_400_000 - 1), "1970-01-01");
        assert_eq!(utc_date(1_709_164_800_000), "2024-02-29");
        assert_eq!(utc_date(1_796_083_200_000), "2026-12-01");
        assert_eq!(utc_date(-1), "1969-12-31");
    }

    fn rec(p: u32, o: i64, ts: i64) -> Record {
        Record {
            partition: p,
            offset: o,
            timestamp: ts,
            key: Some(Bytes::from(format!("k{o}"))),
            value: (o % 7 != 0).then(|| Bytes::from(vec![o as u8; 3])),
            headers: vec![
                ("h".into(), Some(Bytes::from_static(b"x"))),
                ("n".into(), None),
            ],
        }
    }

    #[tokio::test]
    async fn json_values_decode_into_typed_columns_when_asked() {
        let store: Arc<dyn ObjectStore> =
            Arc::new(strata_cold::object_store::memory::InMemory::new());
        let records: Vec<Record> = (0..100)
            .map(|o| {
                let mut r = rec(0, o, 0);
                r.value = Some(Bytes::from(if o == 5 {
                    "not json".to_string()
                } else {
                    format!(r#"{{"seq": {o}, "amount": {}.5, "memo": "m{o}"}}"#, o * 2)
                }));
                r
            })
            .collect();
        let config = ExportConfig {
            decode_json: true,
            ..ExportConfig::default()
        };
        let (files, _, _) = export_records(store.clone(), "", "t", config, &records)
            .await
            .unwrap();
        let bytes = bytes_of(&store, &files[0]).await;
        let b = ParquetRecordBatchReaderBuilder::try_new(bytes)
            .unwrap()
            .build()
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        let json = b
            .column_by_name("value_json")
            .unwrap()
            .as_any()
            .downcast_ref::<arrow_array::StructArray>()
            .unwrap()
            .clone();
        let seq = json
            .column_by_name("seq")
            .unwrap()
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap()
            .clone();
        assert_eq!(seq.value(7), 7);
        assert!(seq.is_null(5), "a value that is not JSON has null fields");
        let memo = json
            .column_by_name("memo")
            .unwrap()
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap()
            .clone();
        assert_eq!(memo.value(9), "m9");
    }

    async fn bytes_of(store: &Arc<dyn ObjectStore>, file: &str) -> bytes::Bytes {
        store
            .get(&Path::from(file))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn offsets_are_written_without_a_dictionary_the_rest_with_one() {
        let store: Arc<dyn ObjectStore> =
            Arc::new(strata_cold::object_store::memory::InMemory::new());
        let records: Vec<Record> = (0..2_000).map(|o| rec(0, o, o)).collect();
        let (files, _, _) =
            export_records(store.clone(), "", "t", ExportConfig::default(), &records)
                .await
                .unwrap();
        let bytes = bytes_of(&store, &files[0]).await;
        let meta = ParquetRecordBatchReaderBuilder::try_new(bytes)
            .unwrap()
            .metadata()
            .clone();
        for c in meta.row_group(0).columns() {
            let path = c.column_path().string();
            let dictionary = c.dictionary_page_offset().is_some();
            assert_eq!(
                dictionary,
                !PLAIN_COLUMNS.contains(&path.as_str()),
                "{path}: {:?}",
                c.encodings().collect::<Vec<_>>()
            );
        }
    }

    #[tokio::test]
    async fn files_split_by_partition_date_and_size_and_read_back() {
        let store: Arc<dyn ObjectStore> =
            Arc::new(strata_cold::object_store::memory::InMemory::new());
        let day = 86_400_000;
        let config = ExportConfig {
            row_group_rows: 1000,
            file_bytes: 64 << 10,
            ..ExportConfig::default()
        };
        let mut records: Vec<Record> = (0..30_000).map(|o| rec(0, o, day * 10 + o)).collect();
        records.push(rec(1, 0, day * 11));
        let (files, rows, _) = export_records(store.clone(), "out", "ledger", config, &records)
            .await
            .unwrap();
        assert_eq!(rows, 30_001);
        assert!(files.len() >= 3, "split by size: {files:?}");
        assert!(files
            .iter()
            .any(|f| f.starts_with("out/topic=ledger/partition=1/date=1970-01-12/")));
        // A file is named by its first offset, and the next picks up where it ended.
        let firsts: Vec<i64> = files
            .iter()
            .filter(|f| f.contains("partition=0/"))
            .map(|f| f.rsplit("part-").next().unwrap()[..20].parse().unwrap())
            .collect();
        assert_eq!(firsts[0], 0);
        assert!(
            firsts.iter().skip(1).all(|o| o % BATCH_ROWS as i64 == 0),
            "{firsts:?}"
        );
        // Read everything back: every offset once, every field as it went in.
        let by_offset: HashMap<(i32, i64), &Record> = records
            .iter()
            .map(|r| ((r.partition as i32, r.offset), r))
            .collect();
        let mut seen = Vec::new();
        for f in &files {
            let bytes = store
                .get(&Path::from(f.as_str()))
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap();
            let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
                .unwrap()
                .build()
                .unwrap();
            for b in reader {
                let b = b.unwrap();
                let p = b
                    .column_by_name("partition")
                    .unwrap()
                    .as_any()
                    .downcast_ref::<Int32Array>()
                    .unwrap()
                    .clone();
                let o = b
                    .column_by_name("offset")
                    .unwrap()
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap()
                    .clone();
                let bin = |name: &str| b.column_by_name(name).unwrap().as_binary::<i32>().clone();
                let (k, v) = (bin("key"), bin("value"));
                let ts = b.column_by_name("timestamp").unwrap();
                let ts = ts
                    .as_primitive::<arrow_array::types::TimestampMillisecondType>()
                    .clone();
                let topic = b
                    .column_by_name("topic")
                    .unwrap()
                    .as_string::<i32>()
                    .clone();
                let headers = b
                    .column_by_name("headers")
                    .unwrap()
                    .as_list::<i32>()
                    .clone();
                for i in 0..b.num_rows() {
                    let want = by_offset[&(p.value(i), o.value(i))];
                    let opt = |a: &BinaryArray| (!a.is_null(i)).then(|| a.value(i).to_vec());
                    assert_eq!(topic.value(i), "ledger");
                    assert_eq!(ts.value(i), want.timestamp);
                    assert_eq!(opt(&k), want.key.as_ref().map(|b| b.to_vec()));
                    assert_eq!(opt(&v), want.value.as_ref().map(|b| b.to_vec()));
                    let h = headers.value(i);
                    let h = h.as_struct();
                    let (hk, hv) = (
                        h.column(0).as_string::<i32>(),
                        h.column(1).as_binary::<i32>(),
                    );
                    let got: Vec<(String, Option<Vec<u8>>)> = (0..h.len())
                        .map(|j| {
                            (
                                hk.value(j).to_string(),
                                (!hv.is_null(j)).then(|| hv.value(j).to_vec()),
                            )
                        })
                        .collect();
                    let want_h: Vec<(String, Option<Vec<u8>>)> = want
                        .headers
                        .iter()
                        .map(|(k, v)| (k.clone(), v.as_ref().map(|v| v.to_vec())))
                        .collect();
                    assert_eq!(got, want_h);
                    seen.push((p.value(i), o.value(i)));
                }
            }
        }
        seen.sort();
        let mut want: Vec<_> = (0..30_000).map(|o| (0, o)).collect();
        want.push((1, 0));
        assert_eq!(seen, want);
    }
}
