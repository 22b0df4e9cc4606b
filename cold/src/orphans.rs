//! Orphans: segment objects no manifest names, left by an upload that failed or was cut
//! short (a crash, a deposed leader) before its manifest commit, or by a retention delete
//! that failed. The manifest is the only truth, so they are never read; they are removed
//! once older than a grace period, which keeps an upload in progress (its objects are
//! young and not committed yet) safe.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::TryStreamExt;
use object_store::ObjectStore;

use crate::manifest::{Manifest, PartitionPrefix};
use crate::retention::SUFFIXES;

/// What a sweep found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Objects deleted.
    pub deleted: Vec<String>,
    /// Unnamed objects still inside the grace period.
    pub young: usize,
}

/// The segment key an object belongs to: its own key, less a companion suffix.
fn segment_of(key: &str) -> &str {
    SUFFIXES
        .iter()
        .filter(|s| !s.is_empty())
        .find_map(|s| key.strip_suffix(s))
        .unwrap_or(key)
}

/// Deletes the partition's segment objects that `manifest` does not name and that are older
/// than `grace`.
pub async fn sweep(
    store: &Arc<dyn ObjectStore>,
    prefix: &PartitionPrefix,
    manifest: &Manifest,
    grace: Duration,
) -> Result<Swept, object_store::Error> {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    // Objects the compactor replaced count as named for the grace period after that.
    let recently_retired = manifest
        .retired
        .iter()
        .filter(|r| now_ms - r.at < grace.as_millis() as i64)
        .map(|r| r.key.as_str());
    let named: HashSet<&str> = manifest
        .segments
        .iter()
        .map(|s| s.key.as_str())
        .chain(recently_retired)
        .collect();
    let listed: Vec<_> = store
        .list(Some(&prefix.segments_dir()))
        .try_collect()
        .await?;
    let mut out = Swept::default();
    for o in listed {
        let key = o.location.to_string();
        if named.contains(segment_of(&key)) {
            continue;
        }
        let age_ms = now_ms - o.last_modified.timestamp_millis();
        if age_ms < grace.as_millis() as i64 {
            out.young += 1;
            continue;
        }
        match store.delete(&o.location).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => out.deleted.push(key),
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::write_segment;
    use crate::upload::{SealedSegment, UploadConfig, Uploader};
    use object_store::memory::InMemory;
    use object_store::path::Path;

    #[tokio::test]
    async fn objects_the_compactor_replaced_stay_for_the_grace_period_after_it() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let prefix = PartitionPrefix::new("c", "t", 0);
        let old = prefix.segment_key(0, 1, uuid::Uuid::new_v4());
        store
            .put(
                &Path::from(old.as_str()),
                bytes::Bytes::from_static(b"x").into(),
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let grace = Duration::from_millis(200);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let mut m = Manifest::default();
        m.retired.push(crate::manifest::Retired {
            key: old.clone(),
            at: now,
        });
        // Older than the grace period, but replaced just now: kept.
        let kept = sweep(&store, &prefix, &m, grace).await.unwrap();
        assert!(kept.deleted.is_empty());
        // Replaced longer ago than the grace period: deleted.
        m.retired[0].at = now - 250;
        let swept = sweep(&store, &prefix, &m, grace).await.unwrap();
        assert_eq!(swept.deleted, vec![old]);
    }

    #[tokio::test]
    async fn unnamed_objects_go_after_the_grace_period_named_ones_stay() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let prefix = PartitionPrefix::new("c", "t", 0);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        let end = write_segment(&path, 0, 10);
        let up = Uploader::new(store.clone(), prefix.clone(), UploadConfig::default());
        let seg = SealedSegment {
            base_offset: 0,
            end_offset: end,
            log: path,
            producer_snapshot: None,
            epochs: vec![],
            aborted: Vec::new(),
        };
        up.upload(1, &seg).await.unwrap();
        // What a killed upload leaves: a data object and one companion, never committed.
        let orphan = prefix.segment_key(end, 1, uuid::Uuid::new_v4());
        for k in [orphan.clone(), format!("{orphan}.index")] {
            store
                .put(&Path::from(k), bytes::Bytes::from_static(b"x").into())
                .await
                .unwrap();
        }
        let m = up.manifest().load().await.unwrap();
        let young = sweep(&store, &prefix, &m, Duration::from_secs(3600))
            .await
            .unwrap();
        assert_eq!(young.deleted.len(), 0);
        assert_eq!(
            young.young, 2,
            "an upload in progress looks like this: kept"
        );
        let swept = sweep(&store, &prefix, &m, Duration::ZERO).await.unwrap();
        let mut deleted = swept.deleted.clone();
        deleted.sort();
        assert_eq!(deleted, vec![orphan.clone(), format!("{orphan}.index")]);
        // The committed segment and its companions are all still there.
        let left: Vec<_> = store
            .list(Some(&prefix.segments_dir()))
            .try_collect()
            .await
            .unwrap();
        assert_eq!(left.len(), 4, "{left:?}");
        assert!(left
            .iter()
            .all(|o| segment_of(o.location.as_ref()) == m.segments[0].key));
    }
}
