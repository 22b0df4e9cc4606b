//! Test helpers: an object store that fails on demand.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};

use strata_core::batch::build::{batch, ProducerIds, Rec};
use strata_core::batch::{stamped_prefix, STAMP_LEN};

use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

/// A store that fails on demand: the next `fail_puts` puts fail before writing; after
/// `outage_after` more puts, the next `outage` fail; the next `lose_put_answers` puts are
/// written but answered with an error (a lost response); the next `fail_reads` reads fail;
/// the next `fail_deletes` deletes fail.
#[derive(Debug, Default)]
pub struct Flaky {
    pub inner: InMemory,
    pub fail_puts: AtomicUsize,
    pub outage_after: AtomicUsize,
    pub outage: AtomicUsize,
    pub lose_put_answers: AtomicUsize,
    pub fail_reads: AtomicUsize,
    pub fail_deletes: AtomicUsize,
}

fn take(counter: &AtomicUsize) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

fn injected() -> object_store::Error {
    object_store::Error::Generic {
        store: "flaky",
        source: "injected failure".into(),
    }
}

impl std::fmt::Display for Flaky {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Flaky")
    }
}

#[async_trait::async_trait]
impl ObjectStore for Flaky {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        if take(&self.fail_puts) {
            return Err(injected());
        }
        if !take(&self.outage_after) && take(&self.outage) {
            return Err(injected());
        }
        let r = self.inner.put_opts(location, payload, opts).await?;
        if take(&self.lose_put_answers) {
            return Err(injected());
        }
        Ok(r)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        if take(&self.fail_reads) {
            return Err(injected());
        }
        self.inner.get_opts(location, options).await
    }

    async fn delete(&self, location: &Path) -> object_store::Result<()> {
        if take(&self.fail_deletes) {
            return Err(injected());
        }
        self.inner.delete(location).await
    }

    fn list(
        &self,
        prefix: Option<&Path>,
    ) -> futures_util::stream::BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy(&self, from: &Path, to: &Path) -> object_store::Result<()> {
        self.inner.copy(from, to).await
    }

    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> object_store::Result<()> {
        self.inner.copy_if_not_exists(from, to).await
    }
}

/// Writes a segment file of `batches` batches of 10 records from `base`; returns its end.
pub fn write_segment(path: &std::path::Path, base: u64, batches: u64) -> u64 {
    let mut f = std::fs::File::create(path).unwrap();
    let mut offset = base;
    for b in 0..batches {
        let values: Vec<String> = (0..10).map(|i| format!("value-{}", offset + i)).collect();
        let recs: Vec<Rec<'_>> = values
            .iter()
            .map(|v| Rec {
                key: None,
                value: Some(v.as_bytes()),
                timestamp_delta: 0,
            })
            .collect();
        let raw = batch(1_000 + (offset as i64), ProducerIds::NONE, &recs);
        f.write_all(&stamped_prefix(&raw, offset as i64, 1 + (b / 5) as i32))
            .unwrap();
        f.write_all(&raw[STAMP_LEN..]).unwrap();
        offset += 10;
    }
    offset
}
