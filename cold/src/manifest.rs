//! The partition manifest: the only truth about what a partition holds in the cold tier.
//!
//! Each change writes a new manifest object, `manifest/{version:020}.json`, with a
//! create-only put (`PutMode::Create`: `If-None-Match: *` on S3, a hard link on a local
//! file system). Two writers racing for the same version cannot both win: the loser reads
//! the winner's manifest and tries again, so no update is lost, and the object store alone
//! linearizes them (no If-Match needed, which local file systems lack). The newest version
//! is the manifest; a few older ones are kept for readers that listed just before.
//!
//! Deleting old versions frees their numbers, so a create-only put alone does not prove a
//! win: a writer that read version N and stalled while N+1..N+5 were written and N+1 was
//! deleted can create N+1 and be told Ok, behind N+5. So a writer lists the versions after
//! its put and counts it as won only when none is newer; otherwise it lost the race and
//! retries on the newest, as when its create is refused (see [`ManifestStore::update`]).
//!
//! Every manifest carries the highest leader epoch that wrote it. A leader first claims the
//! manifest with its epoch; a deposed leader (lower epoch) is then refused, so an upload it
//! finishes late can never be committed. Objects it left behind are orphans, found later by
//! comparing the bucket with the manifest.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, PutMode, PutOptions};
use serde::{Deserialize, Serialize};

/// The manifest format written by this code.
pub const FORMAT: u32 = 1;
/// Attempts of one update against concurrent writers before giving up.
const MAX_ATTEMPTS: usize = 16;

fn unknown_timestamp() -> i64 {
    -1
}

/// One remote segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteSegment {
    pub base_offset: u64,
    /// One past its last offset.
    pub end_offset: u64,
    /// The earliest batch base timestamp (-1: unknown, as in manifests before it existed)
    /// and the largest record timestamp.
    #[serde(default = "unknown_timestamp")]
    pub min_timestamp: i64,
    pub max_timestamp: i64,
    pub size_bytes: u64,
    /// The leader epoch that uploaded it.
    pub leader_epoch: i32,
    /// Its data object, relative to the partition's prefix.
    pub key: String,
    /// Set by the compactor on what it rewrote (the clean section of a compacted topic);
    /// `None` for a segment as its leader uploaded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compacted: Option<Compacted>,
    /// The transactions aborted by a marker in this segment, so read_committed readers of
    /// the cold tier (and `strata-replay`) can drop their records.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aborted: Vec<AbortedTxn>,
}

/// A transaction aborted in a partition: its producer, its first offset, and the offset of
/// its abort marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AbortedTxn {
    pub producer_id: i64,
    pub first_offset: u64,
    pub last_offset: u64,
}

impl Manifest {
    /// The aborted transactions that end at or after `from` and start before `to`, from
    /// the segments that may hold such markers.
    pub fn aborted_between(&self, from: u64, to: u64) -> Vec<AbortedTxn> {
        self.segments
            .iter()
            .filter(|s| s.end_offset > from)
            .flat_map(|s| s.aborted.iter().copied())
            .filter(|t| t.last_offset >= from && t.first_offset < to)
            .collect()
    }
}

/// What the compactor left in a segment it rewrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compacted {
    /// When (ms since the epoch).
    pub at: i64,
    /// Tombstones (null values) it still holds, and the oldest one's batch timestamp (-1:
    /// none), so the compactor knows when `delete.retention.ms` lets it drop them.
    pub tombstones: u64,
    pub oldest_tombstone: i64,
}

/// What one partition holds in the cold tier.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    /// This manifest's sequence number (its object's name); 0 = none written yet.
    pub version: u64,
    /// The highest leader epoch that wrote it.
    pub leader_epoch: i32,
    /// The remote log start: what lies below was deleted by retention.
    pub log_start: u64,
    /// Contiguous, in offset order.
    pub segments: Vec<RemoteSegment>,
    /// Objects the compactor replaced, and when: no longer named, but kept for the orphan
    /// grace period so a reader holding an older manifest can finish with them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retired: Vec<Retired>,
}

/// A segment object replaced by the compactor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retired {
    pub key: String,
    /// When it was replaced (ms since the epoch).
    pub at: i64,
}

impl Manifest {
    /// One past the last offset held remotely (the remote log start when empty).
    pub fn end_offset(&self) -> u64 {
        self.segments
            .last()
            .map_or(self.log_start, |s| s.end_offset)
    }

    pub fn size_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.size_bytes).sum()
    }

    /// The segment holding `offset`, if any.
    pub fn segment_for(&self, offset: u64) -> Option<&RemoteSegment> {
        let i = self.segments.partition_point(|s| s.end_offset <= offset);
        self.segments.get(i).filter(|s| s.base_offset <= offset)
    }

    /// Checks the invariants: segments non-empty, contiguous, in order, at or after the log
    /// start.
    pub fn validate(&self) -> Result<(), String> {
        let mut next = None;
        for s in &self.segments {
            if s.end_offset <= s.base_offset {
                return Err(format!(
                    "segment {} is empty or reversed (end {})",
                    s.base_offset, s.end_offset
                ));
            }
            if s.base_offset < self.log_start {
                return Err(format!(
                    "segment {} starts below the log start {}",
                    s.base_offset, self.log_start
                ));
            }
            if let Some(n) = next {
                if s.base_offset != n {
                    return Err(format!(
                        "segment {} does not follow the previous one, which ends at {n}",
                        s.base_offset
                    ));
                }
            }
            next = Some(s.end_offset);
        }
        Ok(())
    }
}

/// A replica's leader-epoch lineage (its `leader-epoch-checkpoint`) and its log's range:
/// what a replica checks remote segments against before it counts them as its own history
/// (KIP-405). After an unclean election (or any bug that let replicas diverge), the cold
/// tier may hold a deposed leader's records at offsets where this log holds others.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lineage {
    /// (epoch, first offset written in it), in order.
    pub epochs: Vec<(i32, u64)>,
    /// The local log start (the lineage starts there too).
    pub log_start: u64,
    /// The local log end.
    pub log_end: u64,
}

/// The epoch that wrote `offset` in a history of (epoch, start offset) entries.
fn epoch_at(history: &[(i32, u64)], offset: u64) -> Option<i32> {
    history
        .iter()
        .filter(|(_, start)| *start <= offset)
        .max_by_key(|(epoch, start)| (*start, *epoch))
        .map(|(epoch, _)| *epoch)
}

impl Lineage {
    /// Whether `seg`, whose records were written at `epochs` (its `.epochs` companion:
    /// (epoch, start) pairs covering its range; `None` or empty when unknown), holds the
    /// records this log holds at the same offsets. Offsets below the local log start cannot
    /// be checked and are trusted: this replica deleted them itself, as tiered. Offsets
    /// past the local log end are records this log does not have.
    pub fn holds(&self, seg: &RemoteSegment, epochs: Option<&[(i32, u64)]>) -> bool {
        if seg.end_offset <= self.log_start {
            return true;
        }
        if seg.end_offset > self.log_end {
            return false;
        }
        let from = seg.base_offset.max(self.log_start);
        let inside = |start: &u64| *start > from && *start < seg.end_offset;
        let mine = |o| epoch_at(&self.epochs, o);
        match epochs.filter(|e| !e.is_empty()) {
            // Both histories are step functions of the offset: they agree on the range
            // when they agree where it starts and wherever either one steps.
            Some(theirs) => std::iter::once(from)
                .chain(
                    theirs
                        .iter()
                        .chain(&self.epochs)
                        .map(|e| e.1)
                        .filter(inside),
                )
                .all(|o| mine(o).is_some_and(|e| Some(e) == epoch_at(theirs, o))),
            // Only the uploader's epoch is known, and no record in the segment was
            // written after it: a newer epoch of this log in the range means divergence.
            None => std::iter::once(from)
                .chain(self.epochs.iter().map(|e| e.1).filter(inside))
                .all(|o| mine(o).is_some_and(|e| e <= seg.leader_epoch)),
        }
    }
}

/// The end of the longest prefix of `m`'s segments whose records `lineage` also holds (see
/// [`Lineage::holds`]); `epochs` has each segment's `.epochs` companion by key (a segment
/// missing from it is checked against the epoch that uploaded it). `m`'s log start when no
/// segment qualifies. The prefix is whole segments, so a replica may count it as tiered
/// and a leader may cut the manifest back to it (`ManifestStore::cut_back`).
pub fn consistent_end(
    m: &Manifest,
    epochs: &std::collections::HashMap<String, Vec<(i32, u64)>>,
    lineage: &Lineage,
) -> u64 {
    let mut end = m.log_start;
    for s in &m.segments {
        if !lineage.holds(s, epochs.get(&s.key).map(Vec::as_slice)) {
            break;
        }
        end = s.end_offset;
    }
    end
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("fenced: leader epoch {mine} is older than the manifest's {manifest}")]
    Fenced { mine: i32, manifest: i32 },
    #[error("gave up after {0} attempts against concurrent manifest writers")]
    Contended(usize),
    #[error("the manifest object {key} is unreadable: {why}")]
    Invalid { key: String, why: String },
    #[error("refused manifest change: {0}")]
    Rejected(String),
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
}

/// Where a partition's objects live: `{cluster}/{topic id}/{partition}/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionPrefix(String);

impl PartitionPrefix {
    pub fn new(cluster: &str, topic_id: &str, partition: u32) -> Self {
        PartitionPrefix(format!("{cluster}/{topic_id}/{partition}"))
    }

    fn manifest_dir(&self) -> Path {
        Path::from(format!("{}/manifest", self.0))
    }

    fn manifest(&self, version: u64) -> Path {
        Path::from(format!("{}/manifest/{version:020}.json", self.0))
    }

    /// Where the partition's segment objects live.
    pub fn segments_dir(&self) -> Path {
        Path::from(format!("{}/segments", self.0))
    }

    /// The object key of a segment uploaded by `leader_epoch`: named by base offset, epoch
    /// and a unique id, so retried or competing uploads never overwrite each other.
    pub fn segment_key(&self, base_offset: u64, leader_epoch: i32, id: uuid::Uuid) -> String {
        format!(
            "{}/segments/{base_offset:020}-{leader_epoch}-{}.log",
            self.0,
            id.simple()
        )
    }
}

/// Reads and conditionally updates one partition's manifest.
pub struct ManifestStore {
    store: Arc<dyn ObjectStore>,
    prefix: PartitionPrefix,
    /// Older versions kept after an update.
    keep: u64,
}

impl ManifestStore {
    pub fn new(store: Arc<dyn ObjectStore>, prefix: PartitionPrefix) -> Self {
        ManifestStore {
            store,
            prefix,
            keep: 3,
        }
    }

    /// Where the partition's objects live.
    pub fn prefix(&self) -> &PartitionPrefix {
        &self.prefix
    }

    /// The manifest versions in the store, in no particular order.
    async fn versions(&self) -> Result<Vec<u64>, ManifestError> {
        let listed: Vec<_> = self
            .store
            .list(Some(&self.prefix.manifest_dir()))
            .try_collect()
            .await?;
        Ok(listed
            .iter()
            .filter_map(|o| {
                o.location
                    .filename()?
                    .strip_suffix(".json")?
                    .parse::<u64>()
                    .ok()
            })
            .collect())
    }

    /// The newest manifest version written (0: none).
    async fn latest_version(&self) -> Result<u64, ManifestError> {
        Ok(self.versions().await?.into_iter().max().unwrap_or(0))
    }

    /// The current manifest (an empty one, version 0, when none was written).
    pub async fn load(&self) -> Result<Manifest, ManifestError> {
        loop {
            let version = self.latest_version().await?;
            if version == 0 {
                return Ok(Manifest {
                    format: FORMAT,
                    ..Manifest::default()
                });
            }
            let key = self.prefix.manifest(version);
            let bytes = match self.store.get(&key).await {
                Ok(r) => r.bytes().await?,
                // Deleted between the listing and the read: a newer one exists.
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            let invalid = |why: String| ManifestError::Invalid {
                key: key.to_string(),
                why,
            };
            let m: Manifest = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
            if m.format > FORMAT {
                return Err(invalid(format!(
                    "format {} is newer than this broker's {FORMAT}; upgrade it",
                    m.format
                )));
            }
            if m.version != version {
                return Err(invalid(format!(
                    "says version {} in object {version}",
                    m.version
                )));
            }
            m.validate().map_err(invalid)?;
            return Ok(m);
        }
    }

    /// Applies `change` to the current manifest as leader `epoch` and writes the result as
    /// the next version, retrying against concurrent writers. `change` returns `None` when
    /// there is nothing to do (it must be idempotent: after a write whose answer was lost,
    /// it sees its own change already made). Refused when the manifest has a newer epoch.
    ///
    /// A write counts only when, listed right after its put, no newer version exists. Version
    /// numbers are reused once deleted, and the alternative, never reusing them, would mean
    /// never deleting a version (or leaving a tombstone per version): the listing every
    /// read starts with would grow forever, and a deletion delay would only shrink the
    /// window, since a writer can stall for any time between its read and its put. The
    /// re-read needs no such bound: the newest version is never deleted (only versions
    /// `keep` below a confirmed newest one are), so a put that re-created an old number
    /// always finds a newer version in the listing (object stores list strongly after
    /// writes, as `load` already relies on). Such a write is then a lost race and is retried
    /// on the newest manifest. A write that did win but was built on right away is retried
    /// too; its idempotent change then finds itself applied and writes nothing.
    pub async fn update(
        &self,
        epoch: i32,
        change: impl Fn(&Manifest) -> Result<Option<Manifest>, String>,
    ) -> Result<Manifest, ManifestError> {
        self.update_with(Some(epoch), change).await
    }

    /// Like [`update`](Self::update), for a writer that is no leader (the compactor): each
    /// attempt keeps the epoch of the manifest it changes, so it neither fences a leader
    /// nor is fenced by one. Its change must re-check, on each manifest it is given, that
    /// what it replaces is still there.
    pub async fn update_unfenced(
        &self,
        change: impl Fn(&Manifest) -> Result<Option<Manifest>, String>,
    ) -> Result<Manifest, ManifestError> {
        self.update_with(None, change).await
    }

    async fn update_with(
        &self,
        epoch: Option<i32>,
        change: impl Fn(&Manifest) -> Result<Option<Manifest>, String>,
    ) -> Result<Manifest, ManifestError> {
        for _ in 0..MAX_ATTEMPTS {
            let current = self.load().await?;
            let epoch = epoch.unwrap_or(current.leader_epoch);
            if current.leader_epoch > epoch {
                return Err(ManifestError::Fenced {
                    mine: epoch,
                    manifest: current.leader_epoch,
                });
            }
            let Some(mut next) = change(&current).map_err(ManifestError::Rejected)? else {
                return Ok(current);
            };
            next.format = FORMAT;
            next.version = current.version + 1;
            next.leader_epoch = epoch.max(current.leader_epoch);
            next.validate().map_err(ManifestError::Rejected)?;
            let body =
                Bytes::from(serde_json::to_vec_pretty(&next).expect("a manifest serializes"));
            let opts = PutOptions {
                mode: PutMode::Create,
                ..PutOptions::default()
            };
            match self
                .store
                .put_opts(&self.prefix.manifest(next.version), body.into(), opts)
                .await
            {
                Ok(_) => {}
                // Another writer took this version: read it and try again.
                Err(object_store::Error::AlreadyExists { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
            // The put may have re-created a version deleted as old: it won only if nothing
            // newer exists. (A listing that fails leaves the outcome unknown, as a lost
            // answer does: the caller retries, and its idempotent change sees what landed.)
            let versions = self.versions().await?;
            if let Some(&newer) = versions.iter().find(|&&v| v > next.version) {
                tracing::debug!(prefix = %self.prefix.0, version = next.version, newer, "manifest version written behind a newer one; retrying on the newest");
                continue;
            }
            self.remove_old(next.version, &versions).await;
            return Ok(next);
        }
        Err(ManifestError::Contended(MAX_ATTEMPTS))
    }

    /// A new leader takes the manifest over: from now on, writers with an older epoch are
    /// refused.
    pub async fn claim(&self, epoch: i32) -> Result<Manifest, ManifestError> {
        self.update(epoch, |m| Ok((m.leader_epoch < epoch).then(|| m.clone())))
            .await
    }

    /// The leader epochs that wrote `seg` (its `.epochs` companion): `None` when it has
    /// none or it is unreadable (a damaged one is logged).
    pub async fn segment_epochs(
        &self,
        seg: &RemoteSegment,
    ) -> Result<Option<Vec<(i32, u64)>>, ManifestError> {
        let key = Path::from(format!("{}.epochs", seg.key));
        let bytes = match self.store.get(&key).await {
            Ok(r) => r.bytes().await?,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        match serde_json::from_slice(&bytes) {
            Ok(pairs) => Ok(Some(pairs)),
            Err(e) => {
                tracing::warn!(key = %key, error = %e, "unreadable segment epochs; checking the segment by its upload epoch");
                Ok(None)
            }
        }
    }

    /// As leader `epoch`: drops the segments from `end` on (records of another history, see
    /// [`consistent_end`]), so that this leader uploads its own in their place. Their
    /// objects become orphans. Refused when no segment boundary is at `end` any more (the
    /// manifest changed since `end` was found: check again).
    pub async fn cut_back(&self, epoch: i32, end: u64) -> Result<Manifest, ManifestError> {
        self.update(epoch, |m| {
            let keep = m.segments.partition_point(|s| s.end_offset <= end);
            let Some(first_dropped) = m.segments.get(keep) else {
                return Ok(None);
            };
            if first_dropped.base_offset != end {
                return Err(format!(
                    "cannot cut the manifest back to {end}: segment [{}, {}) spans it",
                    first_dropped.base_offset, first_dropped.end_offset
                ));
            }
            let mut next = m.clone();
            next.segments.truncate(keep);
            Ok(Some(next))
        })
        .await
    }

    /// Deletes, of the `listed` versions, those older than the few kept below `newest`, the
    /// version just written and confirmed newest (best effort).
    async fn remove_old(&self, newest: u64, listed: &[u64]) {
        let Some(below) = newest.checked_sub(self.keep) else {
            return;
        };
        for &v in listed.iter().filter(|&&v| v < below) {
            let key = self.prefix.manifest(v);
            if let Err(e) = self.store.delete(&key).await {
                tracing::debug!(key = %key, error = %e, "could not delete an old manifest");
            }
        }
    }
}

#[cfg(test)]
mod tests;
