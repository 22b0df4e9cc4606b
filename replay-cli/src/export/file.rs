//! One Parquet file written as `ArrowWriter` writes it (the same row groups, pages and
//! bytes), with the `value` and `key` columns encoded on a second thread while this one
//! encodes the others. Each row group is handed to the upload as soon as it is closed.

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use parquet::arrow::arrow_writer::{
    compute_leaves, ArrowColumnWriter, ArrowLeafColumn, ArrowRowGroupWriterFactory,
};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use strata_cold::object_store::buffered::BufWriter;
use tokio::io::AsyncWriteExt;

/// The columns encoded beside the others: the values (most of a record's bytes, so of the
/// encoding and compression) and the keys (hashed into their dictionary row by row), about
/// half the work of a file of Kafka records.
const HELPER_COLUMNS: &[&str] = &["value", "key"];

pub struct FileWriter {
    file: SerializedFileWriter<Vec<u8>>,
    factory: ArrowRowGroupWriterFactory,
    schema: SchemaRef,
    max_rows: usize,
    /// The row group being written: its column writers and rows.
    columns: Option<Vec<ArrowColumnWriter>>,
    rows: usize,
    upload: BufWriter,
}

impl FileWriter {
    pub fn try_new(
        schema: SchemaRef,
        props: WriterProperties,
        upload: BufWriter,
    ) -> anyhow::Result<FileWriter> {
        let max_rows = props.max_row_group_row_count().unwrap_or(usize::MAX).max(1);
        let (file, factory) = ArrowWriter::try_new(Vec::new(), schema.clone(), Some(props))?
            .into_serialized_writer()?;
        Ok(FileWriter {
            file,
            factory,
            schema,
            max_rows,
            columns: None,
            rows: 0,
            upload,
        })
    }

    /// Bytes of the file written so far (closed row groups).
    pub fn bytes_written(&self) -> usize {
        self.file.bytes_written()
    }

    /// Bytes the row group being written holds, encoded.
    pub fn in_progress_size(&self) -> usize {
        self.columns
            .as_ref()
            .map_or(0, |c| c.iter().map(|w| w.get_estimated_total_bytes()).sum())
    }

    /// Writes `batch`, closing (and uploading) each row group that fills up.
    pub async fn write(&mut self, batch: &RecordBatch) -> anyhow::Result<()> {
        let mut rest = batch.clone();
        while rest.num_rows() > 0 {
            let fit = (self.max_rows - self.rows).min(rest.num_rows());
            self.encode(&rest.slice(0, fit))?;
            rest = rest.slice(fit, rest.num_rows() - fit);
            if self.rows >= self.max_rows {
                self.flush().await?;
            }
        }
        Ok(())
    }

    /// Encodes `batch` into the row group: the helper columns on a scoped thread, the rest
    /// here.
    fn encode(&mut self, batch: &RecordBatch) -> anyhow::Result<()> {
        if self.columns.is_none() {
            let index = self.file.flushed_row_groups().len();
            self.columns = Some(self.factory.create_column_writers(index)?);
        }
        let writers = self.columns.as_mut().expect("created above");
        let mut leaves: Vec<(ArrowLeafColumn, bool)> = Vec::with_capacity(writers.len());
        for (field, column) in self.schema.fields().iter().zip(batch.columns()) {
            let beside = HELPER_COLUMNS.contains(&field.name().as_str());
            leaves.extend(
                compute_leaves(field.as_ref(), column)?
                    .into_iter()
                    .map(|leaf| (leaf, beside)),
            );
        }
        let (beside, here): (Vec<_>, Vec<_>) = writers
            .iter_mut()
            .zip(&leaves)
            .partition(|(_, (_, beside))| *beside);
        let write = |columns: Vec<(&mut ArrowColumnWriter, &(ArrowLeafColumn, bool))>| {
            columns
                .into_iter()
                .try_for_each(|(w, (leaf, _))| w.write(leaf))
        };
        if beside.is_empty() {
            write(here)?;
        } else {
            std::thread::scope(|s| -> anyhow::Result<()> {
                let helper = s.spawn(|| write(beside));
                write(here)?;
                helper
                    .join()
                    .map_err(|_| anyhow::anyhow!("the column encoder panicked"))??;
                Ok(())
            })?;
        }
        self.rows += batch.num_rows();
        Ok(())
    }

    /// Closes the row group being written and hands its bytes to the upload.
    async fn flush(&mut self) -> anyhow::Result<()> {
        let Some(columns) = self.columns.take() else {
            return Ok(());
        };
        let mut group = self.file.next_row_group()?;
        for c in columns {
            c.close()?.append_to_row_group(&mut group)?;
        }
        group.close()?;
        self.rows = 0;
        self.upload_buffered().await
    }

    async fn upload_buffered(&mut self) -> anyhow::Result<()> {
        let bytes = std::mem::take(self.file.inner_mut());
        self.upload.write_all(&bytes).await?;
        Ok(())
    }

    /// Closes the last row group, writes the footer and completes the upload.
    pub async fn finish(&mut self) -> anyhow::Result<()> {
        self.flush().await?;
        self.file.finish()?;
        self.upload_buffered().await?;
        self.upload.shutdown().await?;
        Ok(())
    }

    /// Gives the file up: an upload begun is aborted.
    pub async fn abort(mut self) {
        let _ = self.upload.abort().await;
    }
}
