use object_store::memory::InMemory;
use strata_core::batch::BatchIter;

use super::*;
use crate::manifest::PartitionPrefix;
use crate::testing::write_segment;
use crate::upload::{SealedSegment, UploadConfig, Uploader};

/// The bytes of `seg`'s object in `store`.
async fn object_of(store: &Arc<dyn ObjectStore>, seg: &RemoteSegment) -> Bytes {
    let path = Path::from(seg.key.as_str());
    store.get(&path).await.unwrap().bytes().await.unwrap()
}

/// Uploads a 40-batch segment [0, 400) and returns its manifest entry.
async fn uploaded(store: Arc<dyn ObjectStore>) -> RemoteSegment {
    uploaded_segments(store, 1).await.remove(0)
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
    let all: usize = replay(&reader, &seg, 1 << 20)
        .await
        .iter()
        .map(|(_, b)| b.len())
        .sum();
    let took = start.elapsed().as_secs_f64();
    // All of it at `rate`, less the first second's credit.
    let floor = (seg.size_bytes - rate) as f64 / rate as f64;
    assert_eq!(all as u64, seg.size_bytes);
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
    let first = replay(&reader, &seg, 1 << 20).await;
    let fetched = reader.stats.bytes_fetched.load(Relaxed);
    assert_eq!(fetched, seg.size_bytes, "each chunk fetched once");
    // Evicted chunks reach the disk tier in the background.
    let mut again = Vec::new();
    for _ in 0..50 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        again = replay(&reader, &seg, 1 << 20).await;
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
            tokio::spawn(async move { replay(&r, &s, 1 << 20).await })
        })
        .collect();
    for r in reads {
        let batches: usize = r.await.unwrap().iter().map(|(_, b)| offsets(b).len()).sum();
        assert_eq!(batches, 40);
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

/// Replays `seg` from its start, `max_bytes` at a time; returns each reply with the byte
/// position of the object it starts at.
async fn replay(
    reader: &Arc<RemoteReader>,
    seg: &RemoteSegment,
    max_bytes: usize,
) -> Vec<(u64, Bytes)> {
    let (mut at, mut position, mut replies) = (seg.base_offset, 0u64, Vec::new());
    while at < seg.end_offset {
        let got = reader.read(seg, at, max_bytes).await.unwrap();
        at = *offsets(&got).last().unwrap() as u64 + 10;
        let len = got.len() as u64;
        replies.push((position, got));
        position += len;
    }
    replies
}

#[tokio::test]
async fn a_reply_never_crosses_a_chunk_boundary_unless_its_first_batch_does() {
    use std::sync::atomic::Ordering::Relaxed;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let seg = uploaded(store.clone()).await;
    let object = object_of(&store, &seg).await;
    let size = 1_000u64; // about four batches a chunk
    let reader = RemoteReader::open(
        store,
        ReadConfig {
            chunk_size: size,
            ..small_chunks()
        },
    )
    .await
    .unwrap();
    let replies = replay(&reader, &seg, 1 << 20).await;
    let mut crossing = 0;
    for (i, (at, got)) in replies.iter().enumerate() {
        let end = at + got.len() as u64;
        let batches = offsets(got).len();
        if at / size != (end - 1) / size {
            assert_eq!(
                batches, 1,
                "reply {i} at {at}..{end} crosses with more than its first batch"
            );
            crossing += 1;
        }
        // It goes on to its chunk's end: the next batch crosses it (or the object ends).
        if end < seg.size_bytes && batches > 1 {
            let next = BatchHeader::parse(&object[end as usize..]).unwrap();
            assert!(
                end + next.total_len() as u64 > (at / size + 1) * size,
                "reply {i} stops short"
            );
        }
    }
    assert!(crossing > 0, "some batches cross a boundary");
    assert_eq!(reader.stats.copied_replies.load(Relaxed), crossing);
    // Every batch once, in order, and the bytes are the object's.
    let all: Vec<u8> = replies
        .iter()
        .flat_map(|(_, b)| b.iter().copied())
        .collect();
    assert_eq!(all, object);
    // The byte budget still bounds a reply within a chunk.
    let two = reader.read(&seg, 0, 300).await.unwrap();
    assert_eq!(offsets(&two), vec![0]);
}

/// A local directory store holding one uploaded segment: (its directory, the store, the
/// segment).
async fn local_store() -> (tempfile::TempDir, Arc<dyn ObjectStore>, RemoteSegment) {
    use object_store::local::LocalFileSystem;
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
    let seg = uploaded(store.clone()).await;
    (dir, store, seg)
}

#[tokio::test]
async fn a_local_directory_is_mapped_not_copied_and_still_checked() {
    let (_dir, store, seg) = local_store().await;
    let path = Path::from(seg.key.as_str());
    let object = object_of(&store, &seg).await;
    let reader = RemoteReader::open(store.clone(), small_chunks())
        .await
        .unwrap();
    let replies = replay(&reader, &seg, 2_000).await;
    let all: Vec<u8> = replies.iter().flat_map(|(_, b)| b.to_vec()).collect();
    assert_eq!(all, object);
    assert_eq!(reader.buffers_allocated(), 0, "no chunk copied into memory");
    // A mapping keeps the object it mapped: a rewrite goes to a new file renamed into place.
    let held = replies[0].1.clone();
    store
        .put(&path, Bytes::from(vec![0u8; object.len()]).into())
        .await
        .unwrap();
    assert_eq!(held, object.slice(..held.len()));
    // A damaged file is named, not served.
    let mut bytes = object.to_vec();
    bytes[500] ^= 0xff;
    store.put(&path, Bytes::from(bytes).into()).await.unwrap();
    let fresh = RemoteReader::open(store, small_chunks()).await.unwrap();
    let e = fresh.read(&seg, 0, 1 << 20).await.unwrap_err().to_string();
    assert!(e.contains(&seg.key) && e.contains("crc"), "{e}");
}

#[tokio::test]
async fn a_local_object_shorter_than_its_manifest_entry_is_an_error_naming_it() {
    let (dir, store, seg) = local_store().await;
    let file = dir.path().join(&seg.key);
    let len = std::fs::metadata(&file).unwrap().len();
    for keep in [0, len / 2, len - 1] {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&file)
            .unwrap()
            .set_len(keep)
            .unwrap();
        let reader = RemoteReader::open(store.clone(), small_chunks())
            .await
            .unwrap();
        let mut offset = seg.base_offset;
        let e = loop {
            match reader.read(&seg, offset, 1 << 20).await {
                Ok(got) => offset = *offsets(&got).last().unwrap() as u64 + 10,
                Err(e) => break e.to_string(),
            }
            assert!(offset < seg.end_offset, "a cut object was read to its end");
        };
        assert!(e.contains(&seg.key), "{keep}: {e}");
    }
}

#[tokio::test]
async fn a_replay_longer_than_the_cache_recycles_chunk_buffers() {
    use std::sync::atomic::Ordering::Relaxed;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let seg = uploaded(store.clone()).await;
    let reader = RemoteReader::open(
        store,
        ReadConfig {
            chunk_size: 300,
            cache_bytes: 1_000, // three chunks
            read_ahead: true,
            max_concurrent_reads: 1,
            ..ReadConfig::default()
        },
    )
    .await
    .unwrap();
    let chunks = seg.size_bytes.div_ceil(300);
    for _ in 0..2 {
        replay(&reader, &seg, 1 << 20).await;
    }
    assert!(
        reader.stats.misses.load(Relaxed) >= chunks,
        "replayed from the store"
    );
    // The cache evicts as it goes: most GETs read into a buffer it let go.
    assert!(
        reader.buffers_allocated() * 10 < reader.stats.misses.load(Relaxed),
        "{} buffers allocated for {} chunks fetched",
        reader.buffers_allocated(),
        reader.stats.misses.load(Relaxed)
    );
}

#[tokio::test]
async fn a_damaged_batch_is_never_served_whether_it_crosses_a_chunk_or_not() {
    use std::sync::atomic::Ordering::Relaxed;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let seg = uploaded(store.clone()).await;
    let path = Path::from(seg.key.as_str());
    let object = store.get(&path).await.unwrap().bytes().await.unwrap();
    // Chunks smaller than a batch (most batches cross), and chunks of several batches,
    // most of them checked right after the GET (read ahead or not): the damage is caught
    // on either path.
    for (size, read_ahead) in [(700, false), (2_000, false), (2_000, true)] {
        let (mut at, mut crossing, mut checked_on_fetch) = (0, [0, 0], 0);
        while at < object.len() {
            let len = BatchHeader::parse(&object[at..]).unwrap().total_len();
            // A byte in the middle of this batch's records (covered by its CRC).
            let mut bytes = object.to_vec();
            bytes[at + len / 2] ^= 0xff;
            store.put(&path, Bytes::from(bytes).into()).await.unwrap();
            let config = ReadConfig {
                chunk_size: size,
                read_ahead,
                ..small_chunks()
            };
            let reader = RemoteReader::open(store.clone(), config).await.unwrap();
            let (mut offset, mut result) = (0, Ok(()));
            while offset < seg.end_offset && result.is_ok() {
                result = reader.read(&seg, offset, 1 << 20).await.map(|got| {
                    offset = *offsets(&got).last().unwrap() as u64 + 10;
                });
            }
            let e = result
                .expect_err("the damaged batch was served")
                .to_string();
            assert!(e.contains(&seg.key) && e.contains("crc"), "{e}");
            let at_u64 = at as u64;
            crossing[usize::from(at_u64 / size != (at_u64 + len as u64 - 1) / size)] += 1;
            checked_on_fetch += reader.stats.checked_on_fetch.load(Relaxed);
            at += len;
        }
        assert!(crossing[0] > 0 && crossing[1] > 0, "{size}: {crossing:?}");
        if size == 2_000 {
            assert!(checked_on_fetch > 0, "batches checked after their GET");
        }
    }
}

#[tokio::test]
async fn each_batch_is_checked_once_after_its_get_or_by_the_read() {
    use std::sync::atomic::Ordering::Relaxed;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let seg = uploaded(store.clone()).await;
    let object = object_of(&store, &seg).await;
    let reader = RemoteReader::open(
        store,
        ReadConfig {
            chunk_size: 2_000,
            read_ahead: true,
            ..small_chunks()
        },
    )
    .await
    .unwrap();
    let all: Vec<u8> = replay(&reader, &seg, 1 << 20)
        .await
        .into_iter()
        .flat_map(|(_, b)| b.to_vec())
        .collect();
    assert_eq!(all, object);
    let on_fetch = reader.stats.checked_on_fetch.load(Relaxed);
    let on_read = reader.stats.checked_on_read.load(Relaxed);
    assert_eq!(
        reader.stats.bytes_fetched.load(Relaxed),
        seg.size_bytes,
        "each chunk fetched once"
    );
    // Each chunk's span checked after the GET, and every batch outside the spans by the
    // read that served it: the object once, no batch twice, none skipped.
    assert_eq!(on_fetch + on_read, seg.size_bytes, "{on_fetch} + {on_read}");
    assert!(
        on_fetch > on_read,
        "{on_fetch} after the GET, {on_read} by reads"
    );
    // A warm replay checks again only what the reads checked (batches outside the
    // spans, those across chunk boundaries among them): the cached chunks carry theirs.
    replay(&reader, &seg, 1 << 20).await;
    assert_eq!(reader.stats.checked_on_fetch.load(Relaxed), on_fetch);
    assert_eq!(reader.stats.checked_on_read.load(Relaxed), 2 * on_read);
}

#[test]
fn the_check_after_a_get_stops_before_a_batch_it_cannot_vouch_for() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.log");
    write_segment(&path, 0, 6);
    let object = std::fs::read(&path).unwrap();
    let mut starts = vec![0];
    while *starts.last().unwrap() < object.len() {
        let at = *starts.last().unwrap();
        starts.push(at + BatchHeader::parse(&object[at..]).unwrap().total_len());
    }
    assert_eq!(starts.len(), 7);
    // Whole batches from the first one given, up to the last that ends in the chunk.
    let span = |chunk: &[u8], first| check_batches(chunk, first).0;
    let chunk = &object[..starts[4] + 10];
    assert_eq!(span(chunk, 0), 0..starts[4]);
    assert_eq!(span(chunk, starts[1]), starts[1]..starts[4]);
    assert_eq!(span(&object, starts[2]), starts[2]..object.len());
    // With each batch's place, length and last offset (10 records a batch).
    let (_, batches) = check_batches(chunk, starts[1]);
    let expected: Vec<CheckedBatch> = (1..4)
        .map(|i| CheckedBatch {
            at: starts[i] as u32,
            len: (starts[i + 1] - starts[i]) as u32,
            last_offset: 10 * i as i64 + 9,
        })
        .collect();
    assert_eq!(batches, expected);
    // A damaged batch ends the span before it; the read checks it and names it.
    let mut damaged = object.clone();
    damaged[(starts[2] + starts[3]) / 2] ^= 0xff;
    let (checked, batches) = check_batches(&damaged, 0);
    assert_eq!(checked, 0..starts[2]);
    assert_eq!(batches.len(), 2);
    assert_eq!(batches[1], expected[0]);
    // Starting past the end, or in no batch at all: nothing checked.
    assert_eq!(
        check_batches(chunk, chunk.len() + 5),
        (chunk.len()..chunk.len(), vec![])
    );
    assert_eq!(check_batches(&object, 3), (3..3, vec![]));
    let mut chunk = Chunk::checked_from(Bytes::from(object.clone()), Some(starts[1]));
    assert!(chunk.was_checked(starts[1], starts[2] - starts[1]));
    assert!(!chunk.was_checked(0, starts[1]));
    // The local-disk tier keeps a chunk's bytes only: read back, nothing is checked.
    use foyer::Code;
    let mut encoded = Vec::new();
    chunk.encode(&mut encoded).unwrap();
    chunk = Chunk::decode(&mut &encoded[..]).unwrap();
    assert_eq!(chunk.bytes, object);
    assert!(chunk.checked.is_empty());
    assert!(chunk.batches.is_empty());
}

#[test]
fn the_first_batch_in_a_chunk_is_the_first_the_index_places_there() {
    let index: Vec<OffsetEntry> = [(10, 1_500), (20, 2_600), (30, 4_100)]
        .into_iter()
        .map(|(relative_offset, position)| OffsetEntry {
            relative_offset,
            position,
        })
        .collect();
    assert_eq!(first_batch_in(&index, 0, 1_000), Some(0));
    assert_eq!(first_batch_in(&index, 1_000, 2_000), Some(500));
    assert_eq!(first_batch_in(&index, 1_500, 2_500), Some(0));
    assert_eq!(first_batch_in(&index, 2_700, 4_100), None);
    assert_eq!(first_batch_in(&index, 4_200, 5_000), None);
}

/// Uploads `n` contiguous 40-batch segments (400 offsets each) of one partition, with an
/// offset index entry every 1 KiB; returns their manifest entries in order.
async fn uploaded_segments(store: Arc<dyn ObjectStore>, n: u64) -> Vec<RemoteSegment> {
    let dir = tempfile::tempdir().unwrap();
    let up = Uploader::new(
        store,
        PartitionPrefix::new("c", "t", 0),
        UploadConfig {
            index_interval: 1024,
            ..UploadConfig::default()
        },
    );
    let mut base = 0;
    for i in 0..n {
        let path = dir.path().join(format!("{i}.log"));
        let end = write_segment(&path, base, 40);
        let sealed = SealedSegment {
            base_offset: base,
            end_offset: end,
            log: path,
            producer_snapshot: None,
            epochs: vec![],
            aborted: Vec::new(),
        };
        up.upload(1, &sealed).await.unwrap();
        base = end;
    }
    up.manifest().load().await.unwrap().segments
}

#[tokio::test]
async fn offset_indexes_stay_within_their_budget_over_a_long_replay() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let segs = uploaded_segments(store.clone(), 12).await;
    let one = {
        let r = RemoteReader::open(store.clone(), ReadConfig::default())
            .await
            .unwrap();
        r.read(&segs[0], 0, 1).await.unwrap();
        r.index_bytes()
    };
    assert!(one > 0);
    // Room for about three segments' indexes.
    let budget = 3 * one + one / 2;
    let reader = RemoteReader::open(
        store,
        ReadConfig {
            index_cache_bytes: budget,
            ..ReadConfig::default()
        },
    )
    .await
    .unwrap();
    let mut most = 0;
    for _ in 0..2 {
        for seg in &segs {
            let (mut at, mut seen) = (seg.base_offset, 0);
            while at < seg.end_offset {
                let got = reader.read(seg, at, 2_000).await.unwrap();
                let o = offsets(&got);
                seen += o.len();
                at = *o.last().unwrap() as u64 + 10;
                most = most.max(reader.index_bytes());
            }
            assert_eq!(seen, 40, "{}", seg.key);
        }
    }
    assert!(
        most <= budget,
        "indexes held {most} bytes at most, over the {budget}-byte budget"
    );
}

/// Waits for the background read-ahead GETs to land.
async fn settle(reader: &RemoteReader) {
    for _ in 0..200 {
        if reader.ahead.lock().unwrap().is_empty() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    panic!("read-ahead never settled");
}

#[tokio::test]
async fn read_ahead_goes_on_into_the_next_segment_near_the_end_of_one() {
    use std::sync::atomic::Ordering::Relaxed;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let segs = uploaded_segments(store.clone(), 3).await;
    let config = ReadConfig {
        read_ahead: true,
        ..small_chunks()
    };
    let reader = RemoteReader::open(store.clone(), config.clone())
        .await
        .unwrap();
    let first_chunk = |seg: &RemoteSegment| chunk_key(&seg.key, 0);
    let (mut seen, mut fetched) = (0, 0);
    for (i, seg) in segs.iter().enumerate() {
        let next = segs.get(i + 1);
        let mut at = seg.base_offset;
        while at < seg.end_offset {
            // Early in the segment the next one is not touched yet.
            if at == seg.base_offset + 10 {
                if let Some(n) = next {
                    assert!(!reader.chunks.contains(&first_chunk(n)));
                }
            }
            let got = reader.read_then(seg, at, 700, next).await.unwrap();
            let o = offsets(&got);
            seen += o.len();
            at = *o.last().unwrap() as u64 + 10;
            settle(&reader).await;
        }
        fetched += seg.size_bytes;
        if let Some(n) = next {
            // Its index and first chunks came before the reader got there.
            assert!(
                reader.indexes.contains(&n.key),
                "index of segment {}",
                i + 1
            );
            for m in 0..READ_AHEAD_CHUNKS {
                let key = chunk_key(&n.key, m);
                assert!(reader.chunks.contains(&key), "{key}");
            }
        }
    }
    assert_eq!(seen, 3 * 40);
    assert_eq!(
        reader.stats.bytes_fetched.load(Relaxed),
        fetched,
        "every chunk fetched once"
    );

    // A plain read stops at the segment's end.
    let alone = RemoteReader::open(store, config).await.unwrap();
    let mut at = 0;
    while at < segs[0].end_offset {
        let got = alone.read(&segs[0], at, 700).await.unwrap();
        at = *offsets(&got).last().unwrap() as u64 + 10;
        settle(&alone).await;
    }
    assert!(!alone.chunks.contains(&first_chunk(&segs[1])));
    assert!(!alone.indexes.contains(&segs[1].key));
}

/// The reply `read` must give at `offset`, worked out from the object's bytes alone: whole
/// batches from the one holding `offset` (the first whole whatever its size), then those
/// that fit in `max_bytes` and end within the first one's chunk, stopping once `max_bytes`
/// is reached.
fn expected_reply(object: &[u8], chunk: usize, offset: u64, max_bytes: usize) -> &[u8] {
    let mut at = 0;
    let mut start = None;
    while at < object.len() {
        let h = BatchHeader::parse(&object[at..]).unwrap();
        let len = h.total_len();
        if (h.last_offset() as u64) < offset {
            at += len;
            continue;
        }
        let s = *start.get_or_insert(at);
        if at > s && (at + len - s > max_bytes || at + len > (s / chunk + 1) * chunk) {
            break;
        }
        at += len;
        if at - s >= max_bytes {
            break;
        }
    }
    start.map_or(&[][..], |s| &object[s..at])
}

#[tokio::test]
async fn reads_from_checked_chunks_equal_reads_worked_out_from_the_bytes() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let seg = uploaded(store.clone()).await;
    let object = object_of(&store, &seg).await;
    for chunk in [700, 1_000, 1_500, 4_096, 1 << 20] {
        let reader = RemoteReader::open(
            store.clone(),
            ReadConfig {
                chunk_size: chunk,
                ..small_chunks()
            },
        )
        .await
        .unwrap();
        for max_bytes in [1, 300, 1_000, 2_500, 1 << 20] {
            for offset in (0..seg.end_offset).step_by(3) {
                let got = reader.read(&seg, offset, max_bytes).await.unwrap();
                let want = expected_reply(&object, chunk as usize, offset, max_bytes);
                assert!(
                    got == want,
                    "chunk {chunk}, max_bytes {max_bytes}, offset {offset}: {} bytes, want {}",
                    got.len(),
                    want.len()
                );
            }
        }
        // Bigger chunks hold whole batches: most of those replies came from the tables.
        if chunk >= 1_500 {
            assert!(reader.stats.checked_on_fetch.load(Relaxed) > 0);
        }
    }
}

#[tokio::test]
async fn the_cache_counts_a_chunks_batch_table_against_its_budget() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let seg = uploaded(store.clone()).await;
    let reader = RemoteReader::open(
        store,
        ReadConfig {
            chunk_size: 1 << 20, // the whole object in one chunk: its 40 batches checked
            read_ahead: false,
            ..small_chunks()
        },
    )
    .await
    .unwrap();
    reader.read(&seg, 0, 1).await.unwrap();
    let key = chunk_key(&seg.key, 0);
    assert_eq!(
        reader.cached_bytes(),
        key.len() + seg.size_bytes as usize + 40 * std::mem::size_of::<CheckedBatch>()
    );
}
