use object_store::memory::InMemory;
use strata_core::batch::BatchIter;

use super::*;
use crate::manifest::PartitionPrefix;
use crate::testing::write_segment;
use crate::upload::{SealedSegment, UploadConfig, Uploader};

/// Uploads a 40-batch segment [0, 400) and returns its manifest entry.
async fn uploaded(store: Arc<dyn ObjectStore>) -> RemoteSegment {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.log");
    let end = write_segment(&path, 0, 40);
    let up = Uploader::new(
        store,
        PartitionPrefix::new("c", "t", 0),
        UploadConfig {
            index_interval: 1024,
            ..UploadConfig::default()
        },
    );
    up.upload(
        1,
        &SealedSegment {
            base_offset: 0,
            end_offset: end,
            log: path,
            producer_snapshot: None,
            epochs: vec![],
            aborted: Vec::new(),
        },
    )
    .await
    .unwrap();
    up.manifest().load().await.unwrap().segments[0].clone()
}

fn offsets(bytes: &[u8]) -> Vec<i64> {
    BatchIter::new(bytes)
        .map(|b| b.unwrap().0.base_offset)
        .collect()
}

fn small_chunks() -> ReadConfig {
    ReadConfig {
        chunk_size: 700, // smaller than a batch: batches span chunks
        cache_bytes: 1 << 20,
        read_ahead: false,
        ..ReadConfig::default()
    }
}

#[tokio::test]
async fn reads_whole_batches_from_any_offset_across_chunks() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let seg = uploaded(store.clone()).await;
    let reader = RemoteReader::open(store, small_chunks()).await.unwrap();
    // From the middle of a batch: that batch first.
    let got = reader.read(&seg, 125, 1 << 20).await.unwrap();
    assert_eq!(offsets(&got).first(), Some(&120));
    assert_eq!(offsets(&got).len(), 28);
    // A byte budget smaller than a batch still returns one batch.
    let one = reader.read(&seg, 0, 1).await.unwrap();
    assert_eq!(offsets(&one), vec![0]);
    // Sequential replay reads every batch exactly once.
    let (mut at, mut seen) = (0u64, Vec::new());
    while at < seg.end_offset {
        let got = reader.read(&seg, at, 2_000).await.unwrap();
        let o = offsets(&got);
        seen.extend(o.iter().copied());
        at = *o.last().unwrap() as u64 + 10;
    }
    assert_eq!(seen, (0..40).map(|b| b * 10).collect::<Vec<_>>());
    assert!(
        reader.stats.hits.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "the cache served repeats"
    );
}

#[tokio::test]
async fn a_damaged_object_is_named_not_served() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let seg = uploaded(store.clone()).await;
    let path = Path::from(seg.key.as_str());
    let mut bytes = store
        .get(&path)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec();
    bytes[500] ^= 0xff; // a bit flip inside the second batch's records
    store.put(&path, Bytes::from(bytes).into()).await.unwrap();
    let reader = RemoteReader::open(store, small_chunks()).await.unwrap();
    let e = reader.read(&seg, 0, 1 << 20).await.unwrap_err().to_string();
    assert!(e.contains(&seg.key) && e.contains("crc"), "{e}");
}

#[tokio::test]
async fn the_cache_stays_within_its_budget() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let seg = uploaded(store.clone()).await;
    let reader = RemoteReader::open(
        store,
        ReadConfig {
            chunk_size: 1_000,
            cache_bytes: 3_000,
            read_ahead: true,
            ..ReadConfig::default()
        },
    )
    .await
    .unwrap();
    reader.read(&seg, 0, 1 << 20).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    assert!(reader.cached_bytes() <= 3_000, "{}", reader.cached_bytes());
}

#[tokio::test(start_paused = true)]
async fn cold_reads_keep_to_their_bandwidth_budget() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let seg = uploaded(store.clone()).await;
    let rate = 2_000u64;
    let reader = RemoteReader::open(
        store,
        ReadConfig {
            chunk_size: 1_000,
            read_ahead: false,
            max_concurrent_reads: 1,
            max_bytes_per_sec: Some(rate),
            ..ReadConfig::default()
        },
    )
    .await
    .unwrap();
    let start = tokio::time::Instant::now();
    let all = reader.read(&seg, 0, 1 << 20).await.unwrap();
    let took = start.elapsed().as_secs_f64();
    // All of it at `rate`, less the first second's credit.
    let floor = (seg.size_bytes - rate) as f64 / rate as f64;
    assert_eq!(all.len() as u64, seg.size_bytes);
    assert!(
        took >= floor,
        "{took:.2}s for {} bytes at {rate} B/s",
        seg.size_bytes
    );
}

#[tokio::test]
async fn chunks_evicted_from_memory_are_served_from_the_local_disk() {
    use std::sync::atomic::Ordering::Relaxed;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let seg = uploaded(store.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let reader = RemoteReader::open(
        store,
        ReadConfig {
            chunk_size: 1_000,
            cache_bytes: 2_500, // two chunks in memory
            disk_cache_dir: Some(dir.path().join("cache")),
            disk_cache_bytes: 64 << 20,
            read_ahead: false,
            ..ReadConfig::default()
        },
    )
    .await
    .unwrap();
    let first = reader.read(&seg, 0, 1 << 20).await.unwrap();
    let fetched = reader.stats.bytes_fetched.load(Relaxed);
    assert_eq!(fetched, seg.size_bytes, "each chunk fetched once");
    // Evicted chunks reach the disk tier in the background.
    let mut again = Bytes::new();
    for _ in 0..50 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        again = reader.read(&seg, 0, 1 << 20).await.unwrap();
        if reader.stats.disk_hits.load(Relaxed) > 0 {
            break;
        }
    }
    assert_eq!(again, first);
    assert!(
        reader.stats.disk_hits.load(Relaxed) > 0,
        "the disk tier served"
    );
    assert!(reader.cached_bytes() <= 2_500);
}

#[tokio::test]
async fn concurrent_readers_of_a_chunk_share_one_get() {
    use std::sync::atomic::Ordering::Relaxed;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let seg = uploaded(store.clone()).await;
    let reader = RemoteReader::open(store, small_chunks()).await.unwrap();
    let reads: Vec<_> = (0..8)
        .map(|_| {
            let (r, s) = (reader.clone(), seg.clone());
            tokio::spawn(async move { r.read(&s, 0, 1 << 20).await.unwrap() })
        })
        .collect();
    for r in reads {
        assert_eq!(offsets(&r.await.unwrap()).len(), 40);
    }
    assert_eq!(reader.stats.bytes_fetched.load(Relaxed), seg.size_bytes);
}

#[tokio::test]
async fn read_ahead_keeps_going_past_chunks_it_brought_and_fetches_each_once() {
    use std::sync::atomic::Ordering::Relaxed;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let seg = uploaded(store.clone()).await;
    let reader = RemoteReader::open(
        store,
        ReadConfig {
            read_ahead: true,
            ..small_chunks()
        },
    )
    .await
    .unwrap();
    let chunks = seg.size_bytes.div_ceil(700);
    let (mut at, mut seen, mut end) = (0u64, 0, 0u64);
    while at < seg.end_offset {
        let got = reader.read(&seg, at, 700).await.unwrap();
        let o = offsets(&got);
        seen += o.len();
        at = *o.last().unwrap() as u64 + 10;
        end += got.len() as u64;
        // Let the background GETs land before the next read, as decoding would.
        for _ in 0..100 {
            if reader.ahead.lock().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        // The chunk after the last one this read touched is cached already, though that
        // one was itself brought by read-ahead (a hit): the chain did not stop there.
        let next = (end - 1) / 700 + 1;
        if next < chunks {
            assert!(
                reader.chunks.contains(&chunk_key(&seg.key, next)),
                "chunk {next}"
            );
        }
    }
    assert_eq!(seen, 40);
    assert_eq!(
        reader.stats.bytes_fetched.load(Relaxed),
        seg.size_bytes,
        "every chunk fetched once"
    );
    assert_eq!(reader.stats.misses.load(Relaxed), chunks);
    assert!(reader.ahead.lock().unwrap().is_empty());
}
