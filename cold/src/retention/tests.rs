use std::sync::atomic::Ordering;

use futures_util::TryStreamExt;

use super::*;
use crate::manifest::PartitionPrefix;
use crate::testing::{write_segment, Flaky};
use crate::upload::{SealedSegment, UploadConfig, Uploader};

fn seg(base: u64, end: u64, ts: i64, size: u64) -> RemoteSegment {
    RemoteSegment {
        base_offset: base,
        end_offset: end,
        min_timestamp: 0,
        max_timestamp: ts,
        size_bytes: size,
        leader_epoch: 1,
        key: format!("s{base}"),
        compacted: None,
        aborted: Vec::new(),
    }
}

fn manifest() -> Manifest {
    Manifest {
        segments: vec![
            seg(0, 10, 1_000, 100),
            seg(10, 20, 2_000, 100),
            seg(20, 30, 3_000, 100),
        ],
        ..Manifest::default()
    }
}

#[test]
fn time_retention_drops_segments_whose_newest_record_is_too_old() {
    let m = manifest();
    let by = |ms| Retention {
        ms: Some(ms),
        ..Retention::default()
    };
    assert_eq!(expired(&m, 2_500, by(1_000), 0), 1);
    assert_eq!(expired(&m, 2_500, by(10_000), 0), 0);
    assert_eq!(expired(&m, 99_999, by(1_000), 0), 3);
    // Only from the front: an old segment after a young one (here, timestamped in the
    // future by a producer's clock) stays until the young one expires.
    let mut m2 = m.clone();
    m2.segments[0].max_timestamp = 9_000;
    assert_eq!(expired(&m2, 5_000, by(1_000), 0), 0);
    assert_eq!(expired(&m2, 10_001, by(1_000), 0), 3);
    assert_eq!(expired(&m, 2_500, Retention::default(), 0), 0);
}

#[test]
fn size_retention_counts_the_local_only_bytes_too() {
    let m = manifest();
    let by = |b| Retention {
        bytes: Some(b),
        ..Retention::default()
    };
    // As in Kafka: a segment goes while what remains is still at least the limit.
    assert_eq!(expired(&m, 0, by(300), 0), 0);
    assert_eq!(expired(&m, 0, by(250), 0), 0);
    assert_eq!(expired(&m, 0, by(200), 0), 1);
    assert_eq!(expired(&m, 0, by(300), 150), 1, "450 bytes in all");
    assert_eq!(expired(&m, 0, by(200), 150), 2);
    assert_eq!(expired(&m, 0, by(10), 0), 2);
}

#[test]
fn a_delete_records_point_expires_the_segments_wholly_below_it() {
    let m = manifest();
    let below = |o| Retention {
        deleted_below: o,
        ..Retention::default()
    };
    let first_end = m.segments[0].end_offset;
    assert_eq!(
        expired(&m, 0, below(first_end - 1), 0),
        0,
        "the segment holding it stays"
    );
    assert_eq!(expired(&m, 0, below(first_end), 0), 1);
    assert_eq!(expired(&m, 0, below(u64::MAX), 0), 3);
}

/// Uploads three 100-record segments of `store` as leader epoch 1.
async fn three_segments(store: Arc<dyn ObjectStore>) -> (Uploader, Manifest) {
    let dir = tempfile::tempdir().unwrap();
    let up = Uploader::new(
        store,
        PartitionPrefix::new("c", "t", 0),
        UploadConfig::default(),
    );
    up.manifest().claim(1).await.unwrap();
    for i in 0..3u64 {
        let path = dir.path().join(format!("{i}.log"));
        let end = write_segment(&path, i * 100, 10);
        up.upload(
            1,
            &SealedSegment {
                base_offset: i * 100,
                end_offset: end,
                log: path,
                producer_snapshot: None,
                epochs: vec![],
                aborted: Vec::new(),
            },
        )
        .await
        .unwrap();
    }
    let m = up.manifest().load().await.unwrap();
    (up, m)
}

async fn keys(store: &Arc<dyn ObjectStore>) -> Vec<String> {
    let listed: Vec<_> = store.list(None).try_collect().await.unwrap();
    listed.into_iter().map(|o| o.location.to_string()).collect()
}

#[tokio::test]
async fn the_manifest_drops_segments_first_then_their_objects_go() {
    let flaky = Arc::new(Flaky::default());
    let store: Arc<dyn ObjectStore> = flaky.clone();
    let (up, m) = three_segments(store.clone()).await;
    assert_eq!(m.segments.len(), 3);
    let limit = m.segments[1].size_bytes + m.segments[2].size_bytes;
    let policy = Retention {
        bytes: Some(limit),
        ..Retention::default()
    };
    // A deposed leader changes nothing.
    up.manifest().claim(2).await.unwrap();
    let e = apply(&store, up.manifest(), 1, 0, policy, 0).await;
    assert!(matches!(e, Err(ManifestError::Fenced { .. })), "{e:?}");
    assert_eq!(up.manifest().load().await.unwrap().segments.len(), 3);

    let gone = apply(&store, up.manifest(), 2, 0, policy, 0).await.unwrap();
    assert_eq!(gone.segments, vec![m.segments[0].clone()]);
    assert_eq!(gone.orphaned, 0);
    let after = up.manifest().load().await.unwrap();
    assert_eq!(after.log_start, 100);
    assert_eq!(after.segments, m.segments[1..].to_vec());
    let left = keys(&store).await;
    assert!(
        !left.iter().any(|k| k.starts_with(&m.segments[0].key)),
        "{left:?}"
    );
    assert!(left.iter().any(|k| *k == m.segments[1].key));
    // Nothing more to do under the limit.
    let again = apply(&store, up.manifest(), 2, 0, policy, 0).await.unwrap();
    assert_eq!(again, Expired::default());

    // Failed deletes leave orphans, counted; the manifest moved on regardless.
    flaky.fail_deletes.store(2, Ordering::SeqCst);
    let tight = Retention {
        ms: Some(0),
        ..Retention::default()
    };
    let gone = apply(&store, up.manifest(), 2, i64::MAX, tight, 0)
        .await
        .unwrap();
    assert_eq!(gone.segments.len(), 2);
    // (The manifest update's pruning of old versions may take one of the failures.)
    let left = keys(&store).await;
    let orphans = left
        .iter()
        .filter(|k| gone.segments.iter().any(|s| k.starts_with(&s.key)))
        .count();
    assert!(orphans >= 1, "{left:?}");
    assert_eq!(gone.orphaned, orphans);
    let after = up.manifest().load().await.unwrap();
    assert!(after.segments.is_empty());
    assert_eq!(after.log_start, 300);
    assert_eq!(after.end_offset(), 300, "uploads resume at the old end");
}
