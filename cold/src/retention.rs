//! Remote retention: `retention.ms` and `retention.bytes` of a tiered topic delete its
//! oldest remote segments, manifest first, then objects. A reader holding the previous
//! manifest may find an object gone and gets a retriable error; the next manifest no longer
//! names it. Objects whose deletion failed are orphans, removed later like any other.

use std::sync::Arc;

use object_store::path::Path;
use object_store::ObjectStore;

use crate::manifest::{Manifest, ManifestError, ManifestStore, RemoteSegment};

/// The objects of one remote segment: its data and what the uploader puts beside it.
pub const SUFFIXES: [&str; 5] = ["", ".index", ".timeindex", ".epochs", ".snapshot"];

/// A topic's total retention (`None`: unlimited), and a partition's DeleteRecords point.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    pub ms: Option<u64>,
    pub bytes: Option<u64>,
    /// Records below this offset were deleted (DeleteRecords): segments wholly below it
    /// expire whatever their age and size.
    pub deleted_below: u64,
}

/// How many of the manifest's oldest segments retention removes at `now_ms`.
/// `local_only_bytes` is what the partition holds past the manifest's end: with the remote
/// bytes it makes the size `retention.bytes` limits, as in Kafka.
pub fn expired(m: &Manifest, now_ms: i64, policy: Retention, local_only_bytes: u64) -> usize {
    let mut total = m.size_bytes() + local_only_bytes;
    m.segments
        .iter()
        .take_while(|s| {
            let by_time = policy
                .ms
                .is_some_and(|r| i128::from(now_ms) - i128::from(s.max_timestamp) > i128::from(r));
            let by_size = policy
                .bytes
                .is_some_and(|limit| total - s.size_bytes >= limit);
            let deleted = s.end_offset <= policy.deleted_below;
            if by_time || by_size || deleted {
                total -= s.size_bytes;
            }
            by_time || by_size || deleted
        })
        .count()
}

/// What one retention pass removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Expired {
    pub segments: Vec<RemoteSegment>,
    /// Objects whose deletion failed (left as orphans).
    pub orphaned: usize,
}

/// Applies retention as leader `epoch`: drops the expired segments from the manifest (a
/// fenced leader changes nothing), then deletes their objects.
pub async fn apply(
    store: &Arc<dyn ObjectStore>,
    manifests: &ManifestStore,
    epoch: i32,
    now_ms: i64,
    policy: Retention,
    local_only_bytes: u64,
) -> Result<Expired, ManifestError> {
    if policy == Retention::default() {
        return Ok(Expired::default());
    }
    let before = manifests.load().await?;
    if expired(&before, now_ms, policy, local_only_bytes) == 0 {
        return Ok(Expired::default());
    }
    let after = manifests
        .update(epoch, |m| {
            let n = expired(m, now_ms, policy, local_only_bytes);
            if n == 0 {
                return Ok(None);
            }
            let mut next = m.clone();
            let gone: Vec<_> = next.segments.drain(..n).collect();
            next.log_start = gone.last().map_or(m.log_start, |s| s.end_offset);
            Ok(Some(next))
        })
        .await?;
    // What the committed manifest dropped, by the manifest read before: segments are only
    // ever dropped from the front, so those below its log start are gone.
    let mut out = Expired::default();
    for seg in before
        .segments
        .into_iter()
        .filter(|s| s.end_offset <= after.log_start)
    {
        out.orphaned += delete_objects(store, &seg.key).await;
        out.segments.push(seg);
    }
    Ok(out)
}

/// Deletes a segment's objects; returns how many could not be deleted (a missing one is
/// already deleted).
pub async fn delete_objects(store: &Arc<dyn ObjectStore>, key: &str) -> usize {
    let mut failed = 0;
    for suffix in SUFFIXES {
        let path = Path::from(format!("{key}{suffix}"));
        match store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => {
                tracing::warn!(object = %path, error = %e, "could not delete an expired remote object; it stays as an orphan");
                failed += 1;
            }
        }
    }
    failed
}

#[cfg(test)]
mod tests;
