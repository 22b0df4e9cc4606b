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

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::Context;
use arrow_array::builder::{BinaryBuilder, ListBuilder, StringBuilder, StructBuilder};
use arrow_array::{
    ArrayRef, BinaryArray, Int32Array, Int64Array, RecordBatch, StringArray,
    TimestampMillisecondArray,
};
use arrow_schema::{DataType, Field, Fields};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use strata_cold::object_store::path::Path;
use strata_cold::object_store::ObjectStore;

use crate::source::Record;

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

/// Records buffered before they become an Arrow batch.
const BATCH_ROWS: usize = 8192;

fn header_fields() -> Fields {
    Fields::from(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("value", DataType::Binary, true),
    ])
}

/// The value as a JSON object, if it is one.
fn json_object(r: &Record) -> Option<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_slice(r.value.as_deref()?).ok()?;
    v.is_object().then_some(v)
}

/// The columns a JSON schema infers from the values of `records`.
fn infer_json(records: &[Record]) -> anyhow::Result<arrow_schema::SchemaRef> {
    let objects: Vec<_> = records.iter().filter_map(json_object).collect();
    anyhow::ensure!(
        !objects.is_empty(),
        "--decode-json: none of the first {} values is a JSON object to infer columns from",
        records.len()
    );
    let schema = arrow_json::reader::infer_json_schema_from_iterator(
        objects.iter().map(Ok::<_, arrow_schema::ArrowError>),
    )?;
    Ok(Arc::new(schema))
}

/// The `value_json` column: each JSON-object value decoded into `schema`'s fields (nulls
/// where the value is not a JSON object or lacks a field).
fn json_column(schema: &arrow_schema::SchemaRef, records: &[Record]) -> anyhow::Result<ArrayRef> {
    let mut decoder = arrow_json::ReaderBuilder::new(schema.clone())
        .with_batch_size(records.len().max(1))
        .with_coerce_primitive(true)
        .build_decoder()?;
    let mut lines = Vec::new();
    for r in records {
        match json_object(r) {
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

/// The Arrow batch of `records` of `topic` (with `value_json` when given its schema).
fn to_batch(
    topic: &str,
    records: &[Record],
    json: Option<&arrow_schema::SchemaRef>,
) -> anyhow::Result<RecordBatch> {
    let mut headers = ListBuilder::new(StructBuilder::new(
        header_fields(),
        vec![
            Box::new(StringBuilder::new()),
            Box::new(BinaryBuilder::new()),
        ],
    ))
    .with_field(Arc::new(Field::new(
        "item",
        DataType::Struct(header_fields()),
        false,
    )));
    for r in records {
        let entries = headers.values();
        for (k, v) in &r.headers {
            entries
                .field_builder::<StringBuilder>(0)
                .expect("utf8 key")
                .append_value(k);
            entries
                .field_builder::<BinaryBuilder>(1)
                .expect("binary value")
                .append_option(v.as_deref());
            entries.append(true);
        }
        headers.append(true);
    }
    let columns: Vec<(&str, ArrayRef, bool)> = vec![
        (
            "topic",
            Arc::new(StringArray::from(vec![topic; records.len()])),
            false,
        ),
        (
            "partition",
            Arc::new(Int32Array::from_iter_values(
                records.iter().map(|r| r.partition as i32),
            )),
            false,
        ),
        (
            "offset",
            Arc::new(Int64Array::from_iter_values(
                records.iter().map(|r| r.offset),
            )),
            false,
        ),
        (
            "timestamp",
            Arc::new(
                TimestampMillisecondArray::from_iter_values(records.iter().map(|r| r.timestamp))
                    .with_timezone("UTC"),
            ),
            false,
        ),
        (
            "key",
            Arc::new(BinaryArray::from_iter(
                records.iter().map(|r| r.key.as_deref()),
            )),
            true,
        ),
        (
            "value",
            Arc::new(BinaryArray::from_iter(
                records.iter().map(|r| r.value.as_deref()),
            )),
            true,
        ),
        ("headers", Arc::new(headers.finish()), false),
    ];
    let mut columns = columns;
    if let Some(schema) = json {
        columns.push(("value_json", json_column(schema, records)?, true));
    }
    Ok(RecordBatch::try_from_iter_with_nullable(columns)?)
}

/// UTC calendar date of epoch milliseconds, `YYYY-MM-DD`.
pub fn utc_date(ms: i64) -> String {
    // Howard Hinnant's civil_from_days.
    let z = ms.div_euclid(86_400_000) + 719_468;
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

/// Writes `records` to `file`, creating its writer with the first batch (inferring the
/// JSON columns first, once per export, when asked to decode them).
fn write_batch(
    topic: &str,
    config: &ExportConfig,
    json_schema: &mut Option<arrow_schema::SchemaRef>,
    file: &mut OpenFile,
    records: &[Record],
) -> anyhow::Result<()> {
    if config.decode_json && json_schema.is_none() {
        *json_schema = Some(infer_json(records)?);
    }
    let batch = to_batch(topic, records, json_schema.as_ref())?;
    if file.writer.is_none() {
        let props = WriterProperties::builder()
            .set_compression(config.compression)
            .set_max_row_group_row_count(Some(config.row_group_rows.max(1)))
            .build();
        file.writer = Some(ArrowWriter::try_new(
            Vec::new(),
            batch.schema(),
            Some(props),
        )?);
    }
    file.writer.as_mut().expect("created").write(&batch)?;
    Ok(())
}

struct OpenFile {
    path: Path,
    /// Created with the first batch (its schema may depend on inferred JSON columns).
    writer: Option<ArrowWriter<Vec<u8>>>,
    pending: Vec<Record>,
}

/// Writes records into Parquet files under a prefix of a store.
pub struct Exporter {
    store: Arc<dyn ObjectStore>,
    prefix: String,
    topic: String,
    config: ExportConfig,
    open: HashMap<(u32, String), OpenFile>,
    json_schema: Option<arrow_schema::SchemaRef>,
    pub files: Vec<String>,
    pub rows: u64,
    pub bytes_written: u64,
}

impl Exporter {
    pub fn new(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        topic: &str,
        config: ExportConfig,
    ) -> Self {
        Exporter {
            store,
            prefix: prefix.trim_matches('/').to_string(),
            topic: topic.to_string(),
            config,
            open: HashMap::new(),
            json_schema: None,
            files: Vec::new(),
            rows: 0,
            bytes_written: 0,
        }
    }

    /// Adds one record (records of a partition arrive in offset order).
    pub async fn push(&mut self, r: Record) -> anyhow::Result<()> {
        let key = (r.partition, utc_date(r.timestamp));
        if !self.open.contains_key(&key) {
            let dir = format!(
                "topic={}/partition={}/date={}/part-{:020}.parquet",
                self.topic, r.partition, key.1, r.offset
            );
            let path = if self.prefix.is_empty() {
                Path::from(dir)
            } else {
                Path::from(format!("{}/{dir}", self.prefix))
            };
            self.open.insert(
                key.clone(),
                OpenFile {
                    path,
                    writer: None,
                    pending: Vec::with_capacity(BATCH_ROWS),
                },
            );
        }
        let file = self.open.get_mut(&key).expect("opened above");
        file.pending.push(r);
        self.rows += 1;
        if file.pending.len() >= BATCH_ROWS {
            let pending = std::mem::take(&mut file.pending);
            write_batch(
                &self.topic,
                &self.config,
                &mut self.json_schema,
                file,
                &pending,
            )?;
            let w = file.writer.as_ref().expect("written");
            if w.bytes_written() as u64 + w.in_progress_size() as u64 >= self.config.file_bytes {
                let file = self.open.remove(&key).expect("present");
                self.finish(file).await?;
            }
        }
        Ok(())
    }

    async fn finish(&mut self, mut file: OpenFile) -> anyhow::Result<()> {
        if !file.pending.is_empty() {
            let pending = std::mem::take(&mut file.pending);
            write_batch(
                &self.topic,
                &self.config,
                &mut self.json_schema,
                &mut file,
                &pending,
            )?;
        }
        let Some(writer) = file.writer else {
            return Ok(()); // nothing was written to it
        };
        let bytes = writer.into_inner()?;
        self.bytes_written += bytes.len() as u64;
        self.store
            .put(&file.path, bytes::Bytes::from(bytes).into())
            .await
            .with_context(|| format!("writing {}", file.path))?;
        self.files.push(file.path.to_string());
        Ok(())
    }

    /// Closes the files of a partition whose records are all written (keeps few files open).
    pub async fn finish_partition(&mut self, partition: u32) -> anyhow::Result<()> {
        let keys: Vec<_> = self
            .open
            .keys()
            .filter(|(p, _)| *p == partition)
            .cloned()
            .collect();
        for k in keys {
            let file = self.open.remove(&k).expect("listed");
            self.finish(file).await?;
        }
        Ok(())
    }

    /// Closes every open file.
    pub async fn close(mut self) -> anyhow::Result<(Vec<String>, u64, u64)> {
        let keys: Vec<_> = self.open.keys().cloned().collect();
        for k in keys {
            let file = self.open.remove(&k).expect("listed");
            self.finish(file).await?;
        }
        self.files.sort();
        Ok((self.files, self.rows, self.bytes_written))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Array;
    use bytes::Bytes;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

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
        let mut e = Exporter::new(
            store.clone(),
            "",
            "t",
            ExportConfig {
                decode_json: true,
                ..ExportConfig::default()
            },
        );
        for o in 0..100 {
            let mut r = rec(0, o, 0);
            r.value = Some(Bytes::from(if o == 5 {
                "not json".to_string()
            } else {
                format!(r#"{{"seq": {o}, "amount": {}.5, "memo": "m{o}"}}"#, o * 2)
            }));
            e.push(r).await.unwrap();
        }
        let (files, _, _) = e.close().await.unwrap();
        let bytes = store
            .get(&Path::from(files[0].as_str()))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
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

    #[tokio::test]
    async fn files_split_by_partition_date_and_size_and_read_back() {
        let store: Arc<dyn ObjectStore> =
            Arc::new(strata_cold::object_store::memory::InMemory::new());
        let day = 86_400_000;
        let mut e = Exporter::new(
            store.clone(),
            "out",
            "ledger",
            ExportConfig {
                row_group_rows: 1000,
                file_bytes: 64 << 10,
                ..ExportConfig::default()
            },
        );
        for o in 0..30_000 {
            e.push(rec(0, o, day * 10 + o)).await.unwrap();
        }
        e.push(rec(1, 0, day * 11)).await.unwrap();
        let (files, rows, _) = e.close().await.unwrap();
        assert_eq!(rows, 30_001);
        assert!(files.len() >= 3, "split by size: {files:?}");
        assert!(files
            .iter()
            .any(|f| f.starts_with("out/topic=ledger/partition=1/date=1970-01-12/")));
        // Read everything back: every offset once, values and headers intact.
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
                let v = b
                    .column_by_name("value")
                    .unwrap()
                    .as_any()
                    .downcast_ref::<BinaryArray>()
                    .unwrap()
                    .clone();
                for i in 0..b.num_rows() {
                    if o.value(i) % 7 == 0 {
                        assert!(v.is_null(i));
                    } else {
                        assert_eq!(v.value(i), &[o.value(i) as u8; 3]);
                    }
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
