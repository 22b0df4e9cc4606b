//! Uploading a sealed local segment to the cold tier and committing it in the manifest.
//!
//! The leader uploads, in offset order, the part of each sealed segment that the manifest
//! does not hold yet: normally the whole segment, after a failover the rest of one whose
//! start an earlier leader already uploaded (replicas roll segments independently). The
//! objects are, under a key naming base offset, leader epoch and a unique id:
//!
//! - `KEY` — the batches, byte for byte as stored locally (multipart when large);
//! - `KEY.index` / `KEY.timeindex` — a sparse offset and time index of those bytes, built
//!   while reading them (core's index formats, offsets relative to the object's base);
//! - `KEY.epochs` — the leader epochs that wrote the range (JSON `[[epoch, start], ...]`).
//! - `KEY.snapshot` — the producer state at the object's base, when there is one.
//!
//! Only then is the manifest updated (create-only, epoch-fenced). A crash or failure before
//! that leaves objects no manifest references (orphans for the compactor to remove); the
//! next attempt uses a new id, so nothing is overwritten, and the manifest's end tells where
//! to resume, so nothing is uploaded twice into the manifest.

use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, PutPayload, WriteMultipart};
use strata_core::batch::{BatchHeader, HEADER_LEN};
use strata_core::segment::{encode_offset_entries, encode_time_entries, OffsetEntry, TimeEntry};
use tokio::sync::Semaphore;

use crate::limit::Limiter;
use crate::manifest::{Manifest, ManifestError, ManifestStore, PartitionPrefix, RemoteSegment};

/// A sealed local segment, as the log describes it.
#[derive(Debug, Clone)]
pub struct SealedSegment {
    pub base_offset: u64,
    /// One past its last offset.
    pub end_offset: u64,
    pub log: PathBuf,
    /// The producer-state snapshot taken at `base_offset`, if the log kept one.
    pub producer_snapshot: Option<PathBuf>,
    /// Leader epochs and the offset each started at (the log's epoch checkpoint).
    pub epochs: Vec<(i32, u64)>,
    /// The transactions aborted by markers in it.
    pub aborted: Vec<crate::manifest::AbortedTxn>,
}

#[derive(Debug, Clone)]
pub struct UploadConfig {
    /// Objects larger than this go up in parts of `part_size`.
    pub multipart_threshold: u64,
    pub part_size: usize,
    /// An index entry every this many bytes of batches.
    pub index_interval: u32,
    /// Uploads running at once through one uploader; the broker also runs this many
    /// partitions' uploaders at once.
    pub concurrency: usize,
    /// Upload bandwidth cap in bytes per second (`None`: uncapped).
    pub max_bytes_per_sec: Option<u64>,
    /// Attempts per object before the upload fails (the caller tries again later).
    pub attempts: usize,
    pub min_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for UploadConfig {
    fn default() -> Self {
        UploadConfig {
            multipart_threshold: 32 << 20,
            part_size: 8 << 20,
            index_interval: 64 << 10,
            concurrency: 4,
            max_bytes_per_sec: None,
            attempts: 5,
            min_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error("manifest: {0}")]
    Manifest(#[from] ManifestError),
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("segment {path} is damaged at byte {position}: {why}")]
    Damaged {
        path: String,
        position: u64,
        why: String,
    },
    #[error("the cold tier ends at offset {manifest_end}, but this segment covers [{base}, {end}): segments must be uploaded in order")]
    Gap {
        manifest_end: u64,
        base: u64,
        end: u64,
    },
}

/// What an upload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Uploaded {
    /// The manifest already held the segment's range: nothing was written.
    AlreadyThere,
    /// Uploaded [from, end) and committed it in `manifest`.
    Committed {
        from: u64,
        bytes: u64,
        manifest: Box<Manifest>,
    },
}

/// The sparse offset and time index of a segment object, built batch by batch as its bytes
/// are read or written, with its time range.
#[derive(Debug)]
pub struct SegmentIndex {
    pub offsets: Vec<OffsetEntry>,
    pub times: Vec<TimeEntry>,
    pub min_timestamp: i64,
    pub max_timestamp: i64,
    interval: u32,
    since_entry: u64,
}

impl SegmentIndex {
    /// An index with an entry every `interval` bytes of batches.
    pub fn new(interval: u32) -> Self {
        SegmentIndex {
            offsets: Vec::new(),
            times: Vec::new(),
            min_timestamp: i64::MAX,
            max_timestamp: -1,
            interval,
            since_entry: u64::MAX,
        }
    }

    /// Adds the batch `h`, at `relative` offsets past the object's base and `position`
    /// bytes into it.
    pub fn push(&mut self, h: &BatchHeader, relative: u32, position: u32) {
        self.max_timestamp = self.max_timestamp.max(h.max_timestamp);
        self.min_timestamp = self.min_timestamp.min(h.base_timestamp);
        if self.since_entry >= u64::from(self.interval) {
            self.offsets.push(OffsetEntry {
                relative_offset: relative,
                position,
            });
            self.times.push(TimeEntry {
                timestamp: self.max_timestamp,
                relative_offset: relative,
            });
            self.since_entry = 0;
        }
        self.since_entry += h.total_len() as u64;
    }

    /// The offset index, as the reader fetches it (`KEY.index`).
    pub fn encoded_offsets(&self) -> Bytes {
        Bytes::from(encode_offset_entries(&self.offsets))
    }

    /// The time index (`KEY.timeindex`).
    pub fn encoded_times(&self) -> Bytes {
        Bytes::from(encode_time_entries(&self.times))
    }
}

/// The batches of a segment file from `from` on: where they start and the indexes of them.
struct Scanned {
    start_position: u64,
    end_position: u64,
    index: SegmentIndex,
}

/// Reads the batch headers of `log` (not the records) from the batch holding `from` to the
/// one ending at `end`, building a sparse index relative to `from`'s batch.
fn scan(log: &std::path::Path, from: u64, end: u64, interval: u32) -> Result<Scanned, UploadError> {
    let path = log.display().to_string();
    let read_err = |source| UploadError::Read {
        path: path.clone(),
        source,
    };
    let damaged = |position: u64, why: String| UploadError::Damaged {
        path: path.clone(),
        position,
        why,
    };
    let mut file = std::fs::File::open(log).map_err(read_err)?;
    let size = file.metadata().map_err(read_err)?.len();
    let mut position = 0u64;
    let mut header = [0u8; HEADER_LEN];
    let mut out = Scanned {
        start_position: 0,
        end_position: 0,
        index: SegmentIndex::new(interval),
    };
    let mut started = false;
    let mut base = 0u64;
    while position < size {
        file.seek(SeekFrom::Start(position)).map_err(read_err)?;
        file.read_exact(&mut header).map_err(read_err)?;
        let h = BatchHeader::parse(&header).map_err(|e| damaged(position, e.to_string()))?;
        let (first, last) = (h.base_offset as u64, h.last_offset() as u64);
        let len = h.total_len() as u64;
        if last >= end {
            break;
        }
        if last >= from {
            if !started {
                started = true;
                out.start_position = position;
                base = first;
            }
            let relative = u32::try_from(first - base)
                .map_err(|_| damaged(position, "more than 2^32 offsets in one segment".into()))?;
            let at = u32::try_from(position - out.start_position)
                .map_err(|_| damaged(position, "segment part larger than 4 GiB".into()))?;
            out.index.push(&h, relative, at);
        }
        position += len;
        if started {
            out.end_position = position;
        }
    }
    if !started {
        return Err(damaged(
            0,
            format!("no batch at or after offset {from} below {end}"),
        ));
    }
    Ok(out)
}

/// Uploads sealed segments of one partition and commits them in its manifest.
pub struct Uploader {
    store: Arc<dyn ObjectStore>,
    manifest: ManifestStore,
    prefix: PartitionPrefix,
    config: UploadConfig,
    limiter: Arc<Limiter>,
    slots: Arc<Semaphore>,
}

impl Uploader {
    pub fn new(store: Arc<dyn ObjectStore>, prefix: PartitionPrefix, config: UploadConfig) -> Self {
        Uploader {
            manifest: ManifestStore::new(store.clone(), prefix.clone()),
            limiter: Arc::new(Limiter::new(config.max_bytes_per_sec)),
            slots: Arc::new(Semaphore::new(config.concurrency.max(1))),
            store,
            prefix,
            config,
        }
    }

    pub fn manifest(&self) -> &ManifestStore {
        &self.manifest
    }

    /// Runs `attempt` until it succeeds, up to `attempts` times with exponential backoff;
    /// a local read error is not retried.
    async fn retrying<F, Fut>(&self, key: &Path, mut attempt: F) -> Result<(), UploadError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<(), UploadError>>,
    {
        let mut backoff = self.config.min_backoff;
        let mut tries = 0;
        loop {
            tries += 1;
            match attempt().await {
                Ok(()) => return Ok(()),
                Err(e @ UploadError::Read { .. }) => return Err(e),
                Err(e) if tries < self.config.attempts => {
                    tracing::warn!(key = %key, attempt = tries, error = %e, "upload failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(self.config.max_backoff);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Puts one small object (an index, a snapshot, ...), retrying with backoff.
    pub async fn put(&self, key: &Path, data: Bytes) -> Result<(), UploadError> {
        self.retrying(key, || async {
            self.limiter.take(data.len() as u64).await;
            self.store
                .put(key, PutPayload::from_bytes(data.clone()))
                .await
                .map(|_| ())
                .map_err(UploadError::from)
        })
        .await
    }

    /// Puts bytes `[start, end)` of a file: in one PUT up to the multipart threshold,
    /// else as a multipart upload streamed from the file a part at a time (memory: a few
    /// parts, whatever the segment size), each attempt from the start, with backoff.
    pub async fn put_file(
        &self,
        key: &Path,
        file: &std::path::Path,
        start: u64,
        end: u64,
    ) -> Result<(), UploadError> {
        if end - start <= self.config.multipart_threshold {
            return self.put(key, read_range(file, start, end).await?).await;
        }
        self.retrying(key, || self.stream_multipart(key, file, start, end))
            .await
    }

    async fn stream_multipart(
        &self,
        key: &Path,
        file: &std::path::Path,
        start: u64,
        end: u64,
    ) -> Result<(), UploadError> {
        let upload = self.store.put_multipart(key).await?;
        let part_size = self.config.part_size as u64;
        let mut w = WriteMultipart::new_with_chunk_size(upload, part_size as usize);
        let mut at = start;
        let sent: Result<(), UploadError> = async {
            while at < end {
                let to = (at + part_size).min(end);
                let part = read_range(file, at, to).await?;
                self.limiter.take(part.len() as u64).await;
                w.wait_for_capacity(2).await?;
                w.put(part);
                at = to;
            }
            Ok(())
        }
        .await;
        match sent {
            Ok(()) => w.finish().await.map(|_| ()).map_err(Into::into),
            Err(e) => {
                let _ = w.abort().await;
                Err(e)
            }
        }
    }

    /// Uploads what the manifest lacks of `seg` as leader `epoch` and commits it.
    pub async fn upload(&self, epoch: i32, seg: &SealedSegment) -> Result<Uploaded, UploadError> {
        let _slot = self.slots.acquire().await.expect("never closed");
        let current = self.manifest.load().await?;
        let from = current.end_offset();
        if from >= seg.end_offset {
            return Ok(Uploaded::AlreadyThere);
        }
        if from < seg.base_offset && !current.segments.is_empty() {
            return Err(UploadError::Gap {
                manifest_end: from,
                base: seg.base_offset,
                end: seg.end_offset,
            });
        }
        let from = from.max(seg.base_offset);
        let (log, interval) = (seg.log.clone(), self.config.index_interval);
        let end = seg.end_offset;
        let scanned = tokio::task::spawn_blocking(move || scan(&log, from, end, interval))
            .await
            .map_err(|e| UploadError::Read {
                path: seg.log.display().to_string(),
                source: std::io::Error::other(e),
            })??;
        let bytes = scanned.end_position - scanned.start_position;
        let key = self.prefix.segment_key(from, epoch, uuid::Uuid::new_v4());
        let epochs: Vec<(i32, u64)> = seg
            .epochs
            .iter()
            .filter(|(_, start)| *start < end)
            .copied()
            .collect();
        self.put_file(
            &Path::from(key.clone()),
            &seg.log,
            scanned.start_position,
            scanned.end_position,
        )
        .await?;
        self.put(
            &Path::from(format!("{key}.index")),
            scanned.index.encoded_offsets(),
        )
        .await?;
        self.put(
            &Path::from(format!("{key}.timeindex")),
            scanned.index.encoded_times(),
        )
        .await?;
        self.put(
            &Path::from(format!("{key}.epochs")),
            Bytes::from(serde_json::to_vec(&epochs).expect("pairs serialize")),
        )
        .await?;
        if let (Some(snapshot), true) = (&seg.producer_snapshot, from == seg.base_offset) {
            // The log prunes old snapshots; one gone since the segment was listed is simply
            // not uploaded (producer state can be rebuilt from the batch headers).
            match read_range(snapshot, 0, u64::MAX).await {
                Ok(data) => {
                    self.put(&Path::from(format!("{key}.snapshot")), data)
                        .await?
                }
                Err(UploadError::Read { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        let remote = RemoteSegment {
            base_offset: from,
            end_offset: end,
            min_timestamp: scanned.index.min_timestamp,
            max_timestamp: scanned.index.max_timestamp,
            size_bytes: bytes,
            leader_epoch: epoch,
            key: key.clone(),
            compacted: None,
            // (from the part uploaded: a partial segment's tail goes up with its rest)
            aborted: seg
                .aborted
                .iter()
                .filter(|t| (from..end).contains(&t.last_offset))
                .copied()
                .collect(),
        };
        let committed = self
            .manifest
            .update(epoch, |m: &Manifest| {
                if m.end_offset() >= remote.end_offset {
                    return Ok(None); // committed by our own lost-answer attempt, or a race
                }
                let first = m.segments.is_empty() && remote.base_offset >= m.log_start;
                if m.end_offset() != remote.base_offset && !first {
                    return Err(format!(
                        "the manifest now ends at {}, not at {}",
                        m.end_offset(),
                        remote.base_offset
                    ));
                }
                let mut next = m.clone();
                if first {
                    // What lies below was never tiered (deleted locally before): the cold
                    // tier starts here.
                    next.log_start = remote.base_offset;
                }
                next.segments.push(remote.clone());
                Ok(Some(next))
            })
            .await?;
        if !committed.segments.iter().any(|s| s.key == key) {
            return Ok(Uploaded::AlreadyThere);
        }
        tracing::info!(key = %key, from, end, bytes, version = committed.version, "uploaded segment to the cold tier");
        Ok(Uploaded::Committed {
            from,
            bytes,
            manifest: Box::new(committed),
        })
    }
}

/// Reads `[start, end)` of a file (to its end when `end` is past it).
async fn read_range(path: &std::path::Path, start: u64, end: u64) -> Result<Bytes, UploadError> {
    let p = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let mut f = std::fs::File::open(&p)?;
        let size = f.metadata()?.len();
        let end = end.min(size);
        f.seek(SeekFrom::Start(start))?;
        let mut buf = vec![0u8; end.saturating_sub(start) as usize];
        f.read_exact(&mut buf)?;
        Ok::<_, std::io::Error>(Bytes::from(buf))
    })
    .await
    .map_err(std::io::Error::other)
    .and_then(|r| r)
    .map_err(|source| UploadError::Read {
        path: path.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests;
