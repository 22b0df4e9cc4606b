use futures_util::TryStreamExt;
use object_store::memory::InMemory;
use strata_core::batch::BatchIter;
use strata_core::segment::decode_offset_entries;

use super::*;
use crate::testing::write_segment;

fn sealed(path: &std::path::Path, base: u64, end: u64) -> SealedSegment {
    SealedSegment {
        base_offset: base,
        end_offset: end,
        log: path.to_path_buf(),
        producer_snapshot: None,
        epochs: vec![(1, 0), (2, 50)],
        aborted: Vec::new(),
    }
}

fn config() -> UploadConfig {
    UploadConfig {
        index_interval: 512,
        min_backoff: Duration::from_millis(1),
        ..UploadConfig::default()
    }
}

async fn object(store: &Arc<dyn ObjectStore>, key: &str) -> Bytes {
    store
        .get(&Path::from(key))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
}

#[tokio::test]
async fn segments_go_up_in_order_with_an_index_and_are_committed_once() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let up = Uploader::new(store.clone(), PartitionPrefix::new("c", "t", 0), config());
    let mut base = 0;
    for i in 0..3 {
        let path = dir.path().join(format!("{i}.log"));
        let end = write_segment(&path, base, 20);
        let done = up.upload(3, &sealed(&path, base, end)).await.unwrap();
        assert!(
            matches!(done, Uploaded::Committed { from, .. } if from == base),
            "{done:?}"
        );
        // Uploading it again (a restart) does nothing.
        assert_eq!(
            up.upload(3, &sealed(&path, base, end)).await.unwrap(),
            Uploaded::AlreadyThere
        );
        base = end;
    }
    let m = up.manifest().load().await.unwrap();
    assert_eq!((m.segments.len(), m.end_offset(), m.version), (3, 600, 3));
    // The object is the segment byte for byte; its index points at batch starts.
    let seg = &m.segments[1];
    let data = object(&store, &seg.key).await;
    assert_eq!(
        data,
        Bytes::from(std::fs::read(dir.path().join("1.log")).unwrap())
    );
    let index =
        decode_offset_entries(&object(&store, &format!("{}.index", seg.key)).await).unwrap();
    assert!(index.len() > 1, "{index:?}");
    for e in index {
        let at = &data[e.position as usize..];
        let (h, _) = BatchIter::new(at).next().unwrap().unwrap();
        assert_eq!(
            h.base_offset as u64,
            seg.base_offset + u64::from(e.relative_offset)
        );
    }
    let epochs: Vec<(i32, u64)> =
        serde_json::from_slice(&object(&store, &format!("{}.epochs", seg.key)).await).unwrap();
    assert_eq!(epochs, vec![(1, 0), (2, 50)]);
    assert_eq!(seg.max_timestamp, 1_000 + 390);
}

#[tokio::test]
async fn a_new_leader_uploads_only_the_part_the_manifest_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let old = Uploader::new(store.clone(), PartitionPrefix::new("c", "t", 0), config());
    let first = dir.path().join("old.log");
    let end = write_segment(&first, 0, 15);
    old.upload(1, &sealed(&first, 0, end)).await.unwrap();
    // The new leader's local segment started earlier and runs further: [100, 300).
    let new = Uploader::new(store.clone(), PartitionPrefix::new("c", "t", 0), config());
    new.manifest().claim(2).await.unwrap();
    let second = dir.path().join("new.log");
    let end2 = write_segment(&second, 100, 20);
    let done = new.upload(2, &sealed(&second, 100, end2)).await.unwrap();
    assert!(
        matches!(done, Uploaded::Committed { from: 150, .. }),
        "{done:?}"
    );
    let m = new.manifest().load().await.unwrap();
    let ranges: Vec<(u64, u64)> = m
        .segments
        .iter()
        .map(|s| (s.base_offset, s.end_offset))
        .collect();
    assert_eq!(ranges, vec![(0, 150), (150, 300)], "no gap, no duplicate");
    let data = object(&store, &m.segments[1].key).await;
    let (h, _) = BatchIter::new(&data).next().unwrap().unwrap();
    assert_eq!(
        h.base_offset, 150,
        "the object starts at the manifest's end"
    );
    // The deposed leader's late upload is refused and leaves only orphans.
    let late = dir.path().join("late.log");
    let end3 = write_segment(&late, 300, 5);
    let refused = old.upload(1, &sealed(&late, 300, end3)).await;
    assert!(
        matches!(
            refused,
            Err(UploadError::Manifest(ManifestError::Fenced { .. }))
        ),
        "{refused:?}"
    );
    assert_eq!(new.manifest().load().await.unwrap().end_offset(), 300);
}

#[tokio::test]
async fn out_of_order_segments_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let up = Uploader::new(store, PartitionPrefix::new("c", "t", 0), config());
    let a = dir.path().join("a.log");
    write_segment(&a, 0, 2);
    up.upload(1, &sealed(&a, 0, 20)).await.unwrap();
    let c = dir.path().join("c.log");
    write_segment(&c, 40, 2);
    let e = up.upload(1, &sealed(&c, 40, 60)).await.unwrap_err();
    assert!(
        matches!(
            e,
            UploadError::Gap {
                manifest_end: 20,
                ..
            }
        ),
        "{e}"
    );
    // A first upload may start anywhere (older data was never tiered).
    let fresh = Uploader::new(
        Arc::new(InMemory::new()),
        PartitionPrefix::new("c", "t", 1),
        config(),
    );
    fresh.upload(1, &sealed(&c, 40, 60)).await.unwrap();
    let m = fresh.manifest().load().await.unwrap();
    assert_eq!((m.log_start, m.end_offset()), (40, 60));
}

#[tokio::test]
async fn large_segments_go_up_in_parts() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let cfg = UploadConfig {
        multipart_threshold: 4096,
        part_size: 8192, // many parts, streamed from the file one at a time
        ..config()
    };
    let up = Uploader::new(store.clone(), PartitionPrefix::new("c", "t", 0), cfg);
    let path = dir.path().join("big.log");
    let end = write_segment(&path, 0, 400);
    up.upload(1, &sealed(&path, 0, end)).await.unwrap();
    let m = up.manifest().load().await.unwrap();
    let file = std::fs::read(&path).unwrap();
    assert!(file.len() > 4 * 8192, "{}", file.len());
    assert_eq!(&object(&store, &m.segments[0].key).await[..], &file[..]);
}

#[tokio::test(start_paused = true)]
async fn the_bandwidth_cap_holds() {
    let limiter = Limiter::new(Some(1_000_000));
    let start = tokio::time::Instant::now();
    for _ in 0..5 {
        limiter.take(1_000_000).await;
    }
    let took = start.elapsed();
    // 5 MB at 1 MB/s, the first second's credit excepted.
    assert!(took >= Duration::from_secs(4), "{took:?}");
    let open = Limiter::new(None);
    let start = tokio::time::Instant::now();
    open.take(u64::MAX).await;
    assert_eq!(start.elapsed(), Duration::ZERO);
}

#[tokio::test]
async fn failed_puts_are_retried_and_a_failed_upload_commits_nothing() {
    use crate::testing::Flaky;
    let dir = tempfile::tempdir().unwrap();
    let flaky = Arc::new(Flaky::default());
    let store: Arc<dyn ObjectStore> = flaky.clone();
    let up = Uploader::new(store.clone(), PartitionPrefix::new("c", "t", 0), config());
    let path = dir.path().join("a.log");
    let end = write_segment(&path, 0, 10);
    // Two failures: retried within the upload.
    flaky
        .fail_puts
        .store(2, std::sync::atomic::Ordering::SeqCst);
    up.upload(1, &sealed(&path, 0, end)).await.unwrap();
    // More failures than attempts: the upload fails, the manifest is unchanged, and the
    // objects written so far are orphans (no manifest references them).
    let path2 = dir.path().join("b.log");
    let end2 = write_segment(&path2, end, 10);
    flaky
        .outage_after
        .store(2, std::sync::atomic::Ordering::SeqCst);
    flaky
        .outage
        .store(1_000, std::sync::atomic::Ordering::SeqCst);
    assert!(up.upload(1, &sealed(&path2, end, end2)).await.is_err());
    let m = up.manifest().load().await.unwrap();
    assert_eq!(m.end_offset(), end);
    let listed: Vec<_> = store.list(None).try_collect().await.unwrap();
    let referenced = |k: &str| m.segments.iter().any(|s| k.starts_with(&s.key));
    let orphans = listed.iter().filter(|o| {
        let k = o.location.to_string();
        k.contains("/segments/") && !referenced(&k)
    });
    assert!(orphans.count() >= 1);
    // Later, with the store back, the same segment goes up and is committed.
    flaky.outage.store(0, std::sync::atomic::Ordering::SeqCst);
    assert!(matches!(
        up.upload(1, &sealed(&path2, end, end2)).await.unwrap(),
        Uploaded::Committed { .. }
    ));
}
