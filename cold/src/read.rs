//! Reading remote segments: whole batches from an offset, fetched in fixed-size chunks
//! (ranged GETs) through a foyer hybrid cache (memory, then local disk), with read-ahead of
//! the next chunks for sequential replay. Concurrent readers of one chunk share one GET.
//! Every batch read is CRC-checked once: a damaged object is an error naming it, never bad
//! records handed to a consumer. The check runs right after a chunk's GET, on the blocking
//! pool, over the whole batches the chunk holds from the first one the offset index places
//! in it; the chunk is cached with that checked span, and a consumer's read checks only the
//! batches outside it (a chunk's head before that first index entry, a batch that crosses
//! into the next chunk, a chunk that came back from the local-disk tier).
//!
//! A reply is a slice of one cached chunk, never a copy: it ends where its chunk ends
//! (Kafka lets a reply be shorter than asked; the consumer asks again from where it ends),
//! unless its first batch itself crosses a chunk boundary, when that batch alone is copied.
//! A chunk from a stream (S3) is read into a recycled buffer (`buffers`), so a long replay
//! does not fault in fresh memory for each one; a chunk of a local directory's object is a
//! mapping of the file's range (`map_file`), so it is not copied at all.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use object_store::path::Path;
use object_store::{GetOptions, GetResultPayload, ObjectStore};
use strata_core::batch::{verify, BatchHeader, HEADER_LEN};
use strata_core::segment::{decode_offset_entries, decode_time_entries, OffsetEntry};

use crate::manifest::RemoteSegment;

mod buffers;
use buffers::Buffers;

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    /// A chunk's GET failed (the store's own message may not name the object).
    #[error("remote object {key}: {source}")]
    Object {
        key: String,
        source: object_store::Error,
    },
    /// A failed chunk fetch as seen by a reader that shared another's GET.
    #[error("{0}")]
    Fetch(String),
    #[error("cold chunk cache: {0}")]
    Cache(String),
    #[error("remote object {key} is damaged at byte {position}: {why}")]
    Damaged {
        key: String,
        position: u64,
        why: String,
    },
}

#[derive(Debug, Clone)]
pub struct ReadConfig {
    /// Bytes per ranged GET and per cache entry.
    pub chunk_size: u64,
    /// Memory the chunk cache may hold.
    pub cache_bytes: usize,
    /// The cache's local-disk tier: its directory and size (no directory or 0 bytes:
    /// memory only). Chunks evicted from memory go there.
    pub disk_cache_dir: Option<PathBuf>,
    pub disk_cache_bytes: usize,
    /// Fetch the next chunks in the background (sequential replay).
    pub read_ahead: bool,
    /// The cold-read budget: GETs at once, and bytes per second (`None`: uncapped), so a
    /// months-long replay cannot starve the broker.
    pub max_concurrent_reads: usize,
    pub max_bytes_per_sec: Option<u64>,
    /// Memory for the segments' offset indexes a read needs (about 128 KiB for a 1 GiB
    /// segment at the uploader's default interval): the least recently used are dropped
    /// past it and fetched again when read.
    pub index_cache_bytes: usize,
}

impl Default for ReadConfig {
    fn default() -> Self {
        ReadConfig {
            chunk_size: 1 << 20,
            cache_bytes: 256 << 20,
            disk_cache_dir: None,
            disk_cache_bytes: 0,
            read_ahead: true,
            max_concurrent_reads: 8,
            max_bytes_per_sec: None,
            index_cache_bytes: 64 << 20,
        }
    }
}

/// Chunks a sequential reader keeps fetched ahead of the one it decodes. A GET is now the
/// slow side (read, page faults and the CRC check, on the blocking pool; the consumer's
/// thread waits for it most of the time): four in flight keep both cores on them where
/// two left gaps (docs/benchmarks.md, issue 20's fifth stop).
const READ_AHEAD_CHUNKS: u64 = 4;

/// Chunks by "object key#chunk number".
type ChunkCache = foyer::HybridCache<String, Chunk>;

/// A cached chunk: its bytes, the span of them (positions within the chunk) made of whole
/// batches whose CRCs were checked right after the GET, and those batches, so a read finds
/// its batches there without parsing their headers again.
#[derive(Debug, Clone)]
struct Chunk {
    bytes: Bytes,
    checked: std::ops::Range<usize>,
    batches: Arc<[CheckedBatch]>,
}

/// A batch of a chunk's checked span: where it starts in the chunk, its length and its
/// last offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CheckedBatch {
    at: u32,
    len: u32,
    last_offset: i64,
}

impl Chunk {
    /// The chunk with its whole batches from `first` (where a batch starts, if one is known
    /// to start in it) checked: see [`check_batches`].
    fn checked_from(bytes: Bytes, first: Option<usize>) -> Chunk {
        let (checked, batches) = match first {
            Some(at) => check_batches(&bytes, at),
            None => (0..0, Vec::new()),
        };
        Chunk {
            bytes,
            checked,
            batches: batches.into(),
        }
    }

    /// Whether the batch at `[at, at + len)` of the chunk was checked after the GET.
    fn was_checked(&self, at: usize, len: usize) -> bool {
        self.checked.start <= at && at + len <= self.checked.end
    }

    /// Which of the checked batches starts at `at`, if one does.
    fn batch_at(&self, at: usize) -> Option<usize> {
        self.batches
            .binary_search_by_key(&at, |b| b.at as usize)
            .ok()
    }
}

/// The local-disk tier stores a chunk's bytes only: a chunk read back from it has nothing
/// checked, so each batch is checked again as it is served (the disk may have damaged it).
impl foyer::Code for Chunk {
    fn encode(&self, writer: &mut impl std::io::Write) -> foyer::Result<()> {
        self.bytes.encode(writer)
    }

    fn decode(reader: &mut impl std::io::Read) -> foyer::Result<Self> {
        Ok(Chunk {
            bytes: Bytes::decode(reader)?,
            checked: 0..0,
            batches: Arc::new([]),
        })
    }

    fn estimated_size(&self) -> usize {
        self.bytes.estimated_size()
    }
}

/// The span of `chunk` from `first` (a batch's start) made of whole batches that pass their
/// CRC check, and those batches: it ends before the first batch that does not end within
/// the chunk, does not parse, or fails its check (a consumer's read checks that one itself
/// and names the damage).
fn check_batches(chunk: &[u8], first: usize) -> (std::ops::Range<usize>, Vec<CheckedBatch>) {
    let mut at = first.min(chunk.len());
    let start = at;
    let mut batches = Vec::new();
    while let Some(Ok(h)) = chunk.get(at..).map(verify) {
        let len = h.total_len();
        batches.push(CheckedBatch {
            at: at as u32,
            len: len as u32,
            last_offset: h.last_offset(),
        });
        at += len;
    }
    (start..at, batches)
}

/// Where, within the chunk `[start, end)` of a segment's object, the first batch that
/// `index` places in it starts: the object's start for its first chunk, else the first
/// index entry in the chunk (none: no batch of the chunk is known to start anywhere).
fn first_batch_in(index: &[OffsetEntry], start: u64, end: u64) -> Option<usize> {
    if start == 0 {
        return Some(0);
    }
    let i = index.partition_point(|e| u64::from(e.position) < start);
    let at = u64::from(index.get(i)?.position);
    (at < end).then(|| (at - start) as usize)
}

fn chunk_key(key: &str, n: u64) -> String {
    format!("{key}#{n}")
}

/// Counters of the cache, for metrics and benchmarks.
#[derive(Debug, Default)]
pub struct ReadStats {
    /// Chunk lookups served by memory, by the local disk, and by a GET.
    pub hits: std::sync::atomic::AtomicU64,
    pub disk_hits: std::sync::atomic::AtomicU64,
    pub misses: std::sync::atomic::AtomicU64,
    pub bytes_fetched: std::sync::atomic::AtomicU64,
    /// GETs running now, and GETs that waited for the budget.
    pub in_flight: std::sync::atomic::AtomicU64,
    pub throttled: std::sync::atomic::AtomicU64,
    /// Replies copied out of two or more chunks (their first batch crosses a chunk
    /// boundary); every other reply is a slice of one chunk.
    pub copied_replies: std::sync::atomic::AtomicU64,
    /// Bytes of batches CRC-checked right after their chunk's GET, and by a consumer's
    /// read (batches outside the span checked after the GET).
    pub checked_on_fetch: std::sync::atomic::AtomicU64,
    pub checked_on_read: std::sync::atomic::AtomicU64,
}

pub struct RemoteReader {
    store: Arc<dyn ObjectStore>,
    config: ReadConfig,
    chunks: ChunkCache,
    /// Offset indexes by segment object key, least recently used dropped past
    /// `index_cache_bytes`.
    indexes: foyer::Cache<String, Arc<Vec<OffsetEntry>>>,
    /// Chunks being read ahead now, by cache key.
    ahead: Mutex<HashSet<String>>,
    slots: tokio::sync::Semaphore,
    limiter: crate::limit::Limiter,
    buffers: Arc<Buffers>,
    pub stats: ReadStats,
}

impl RemoteReader {
    /// A reader with its chunk cache (creating the disk cache's directory).
    pub async fn open(
        store: Arc<dyn ObjectStore>,
        config: ReadConfig,
    ) -> Result<Arc<Self>, ReadError> {
        let memory = foyer::HybridCacheBuilder::new()
            .with_name("strata-cold")
            .memory(config.cache_bytes.max(1))
            // Each shard holds a share of the budget: keep shards several chunks large.
            .with_shards((config.cache_bytes / (4 * config.chunk_size as usize).max(1)).clamp(1, 8))
            // The batch table counts too: 16 bytes a batch, up to a fifth of a chunk of
            // the smallest batches.
            .with_weighter(|k: &String, v: &Chunk| {
                k.len() + v.bytes.len() + std::mem::size_of_val(&*v.batches)
            });
        let disk = match &config.disk_cache_dir {
            Some(dir) if config.disk_cache_bytes > 0 => Some(dir),
            _ => None,
        };
        let storage = memory.storage();
        let chunks = match disk {
            None => storage.build().await,
            Some(dir) => {
                strata_core::private_fs::create_dir_all(dir).map_err(|e| {
                    ReadError::Cache(format!("cannot create {}: {e}", dir.display()))
                })?;
                use foyer::DeviceBuilder;
                let device = foyer::FsDeviceBuilder::new(dir)
                    .with_capacity(config.disk_cache_bytes)
                    .build()
                    .map_err(|e| ReadError::Cache(format!("{}: {e}", dir.display())))?;
                // A block bounds the largest entry: room for a chunk and its key.
                let block = (config.chunk_size as usize + 64 * 1024).max(4 << 20);
                storage
                    .with_engine_config(
                        foyer::BlockEngineConfig::new(device).with_block_size(block),
                    )
                    .build()
                    .await
            }
        }
        .map_err(|e| ReadError::Cache(e.to_string()))?;
        Ok(Arc::new(RemoteReader {
            store,
            chunks,
            indexes: foyer::CacheBuilder::new(config.index_cache_bytes.max(1))
                .with_name("strata-cold-indexes")
                .with_shards((config.index_cache_bytes >> 20).clamp(1, 4))
                .with_eviction_config(foyer::LruConfig::default())
                .with_weighter(|k: &String, v: &Arc<Vec<OffsetEntry>>| {
                    k.len() + v.len() * std::mem::size_of::<OffsetEntry>()
                })
                .build(),
            ahead: Mutex::new(HashSet::new()),
            slots: tokio::sync::Semaphore::new(config.max_concurrent_reads.max(1)),
            limiter: crate::limit::Limiter::new(config.max_bytes_per_sec),
            // Enough for the GETs in flight and the chunks being decoded; more come back
            // as the cache evicts.
            buffers: Buffers::new(
                config.chunk_size as usize,
                config.max_concurrent_reads.max(1) + 2 * READ_AHEAD_CHUNKS as usize + 4,
            ),
            stats: ReadStats::default(),
            config,
        }))
    }

    /// Bytes the memory tier of the chunk cache holds now.
    pub fn cached_bytes(&self) -> usize {
        self.chunks.memory().usage()
    }

    /// Bytes the cached offset indexes hold now.
    pub fn index_bytes(&self) -> usize {
        self.indexes.usage()
    }

    /// Chunk buffers allocated so far (the others were recycled).
    pub fn buffers_allocated(&self) -> u64 {
        self.buffers.allocated.load(Relaxed)
    }

    /// `seg`'s offset index, from the index cache or its object (readers of an index
    /// being fetched wait for that one GET).
    async fn index(&self, seg: &RemoteSegment) -> Result<Arc<Vec<OffsetEntry>>, ReadError> {
        // A hit (nearly every read) clones neither the store nor the segment.
        if let Some(entry) = self.indexes.get(&seg.key) {
            return Ok(entry.value().clone());
        }
        let (store, s) = (self.store.clone(), seg.clone());
        let entry = self
            .indexes
            .get_or_fetch(&seg.key, move || async move {
                companion(store.as_ref(), &s, ".index", decode_offset_entries)
                    .await
                    .map(Arc::new)
            })
            .await
            .map_err(|e| match e.downcast_ref::<ReadError>() {
                // Damage stays damage (the replay's --skip-corrupt skips it).
                Some(ReadError::Damaged { key, position, why }) => ReadError::Damaged {
                    key: key.clone(),
                    position: *position,
                    why: why.clone(),
                },
                Some(e) => ReadError::Fetch(e.to_string()),
                None => ReadError::Cache(e.to_string()),
            })?;
        Ok(entry.value().clone())
    }

    /// Chunk `n` of a segment's object, from the cache or the store. With read-ahead, the
    /// next [`READ_AHEAD_CHUNKS`] chunks not cached yet are fetched in the background, so
    /// a sequential replay keeps GETs in flight ahead of its decoding (on every access,
    /// not only after a miss: a chunk brought by read-ahead is a hit, and the chain must
    /// not stop there). A chunk already being read ahead is not asked for twice. Near the
    /// end of `seg`, the window goes on into `next` (the segment a sequential reader reads
    /// after it): its index and first chunks are fetched before the reader gets there.
    async fn chunk(
        self: &Arc<Self>,
        seg: &RemoteSegment,
        n: u64,
        next: Option<&RemoteSegment>,
    ) -> Result<Chunk, ReadError> {
        let chunk = self.cached_or_fetch(seg, n).await?;
        if self.config.read_ahead {
            let size = self.config.chunk_size;
            let chunks = seg.size_bytes.div_ceil(size);
            for m in n + 1..(n + 1 + READ_AHEAD_CHUNKS).min(chunks) {
                self.read_ahead(seg, m);
            }
            let past = (n + 1 + READ_AHEAD_CHUNKS).saturating_sub(chunks.max(n + 1));
            if let Some(next) = next.filter(|_| past > 0) {
                for m in 0..past.min(next.size_bytes.div_ceil(size)) {
                    self.read_ahead(next, m);
                }
            }
        }
        Ok(chunk)
    }

    /// Fetches chunk `n` into the cache in the background, unless it is there or on its way.
    fn read_ahead(self: &Arc<Self>, seg: &RemoteSegment, n: u64) {
        let key = chunk_key(&seg.key, n);
        if self.chunks.contains(&key) {
            return;
        }
        if !self
            .ahead
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone())
        {
            return;
        }
        let (me, seg) = (self.clone(), seg.clone());
        tokio::spawn(async move {
            // A failed read-ahead is not an error: the reader's own fetch reports it.
            let _ = me.cached_or_fetch(&seg, n).await;
            me.ahead
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&key);
        });
    }

    /// The chunk, counted as a memory hit, a disk hit or a GET. Readers of a chunk being
    /// fetched wait for that one GET.
    async fn cached_or_fetch(
        self: &Arc<Self>,
        seg: &RemoteSegment,
        n: u64,
    ) -> Result<Chunk, ReadError> {
        let (me, s) = (self.clone(), seg.clone());
        let entry = self
            .chunks
            .get_or_fetch(&chunk_key(&seg.key, n), move || async move {
                me.fetch_chunk(&s, n).await
            })
            .await
            .map_err(|e| match e.downcast_ref::<ReadError>() {
                Some(e) => ReadError::Fetch(e.to_string()),
                None => ReadError::Cache(e.to_string()),
            })?;
        let counter = match entry.source() {
            foyer::Source::Memory => &self.stats.hits,
            foyer::Source::Disk => &self.stats.disk_hits,
            foyer::Source::Outer => &self.stats.misses,
        };
        counter.fetch_add(1, Relaxed);
        Ok(entry.value().clone())
    }

    async fn fetch_chunk(&self, seg: &RemoteSegment, n: u64) -> Result<Chunk, ReadError> {
        let start = n * self.config.chunk_size;
        let end = (start + self.config.chunk_size).min(seg.size_bytes);
        let first = first_batch_in(&self.index(seg).await?, start, end);
        // The cold-read budget: GETs at once and bytes per second.
        let permit = match self.slots.try_acquire() {
            Ok(p) => p,
            Err(_) => {
                self.stats.throttled.fetch_add(1, Relaxed);
                self.slots.acquire().await.expect("never closed")
            }
        };
        self.limiter.take(end - start).await;
        self.stats.in_flight.fetch_add(1, Relaxed);
        let got = self.get_into_buffer(seg, start..end, first).await;
        self.stats.in_flight.fetch_sub(1, Relaxed);
        drop(permit);
        let chunk = got?;
        self.stats
            .bytes_fetched
            .fetch_add(chunk.bytes.len() as u64, Relaxed);
        self.stats
            .checked_on_fetch
            .fetch_add(chunk.checked.len() as u64, Relaxed);
        Ok(chunk)
    }

    /// A ranged GET, then its whole batches from `first` CRC-checked on the blocking pool:
    /// a local file's range is mapped (a slice of the page cache, no copy and no fresh
    /// memory: `map_file`), a stream is copied into a recycled chunk buffer as it arrives.
    async fn get_into_buffer(
        &self,
        seg: &RemoteSegment,
        range: std::ops::Range<u64>,
        first: Option<usize>,
    ) -> Result<Chunk, ReadError> {
        let options = GetOptions {
            range: Some(range.into()),
            ..GetOptions::default()
        };
        let failed = |source| ReadError::Object {
            key: seg.key.clone(),
            source,
        };
        let got = self
            .store
            .get_opts(&Path::from(seg.key.as_str()), options)
            .await
            .map_err(failed)?;
        match got.payload {
            GetResultPayload::File(file, path) => {
                let (at, len) = (got.range.start, range_len(&got.range) as usize);
                tokio::task::spawn_blocking(move || {
                    map_file(&file, at, len).map(|bytes| Chunk::checked_from(bytes, first))
                })
                .await
                .map_err(|e| ReadError::Fetch(e.to_string()))?
                .map_err(|e| {
                    failed(object_store::Error::Generic {
                        store: "LocalFileSystem",
                        source: format!("reading {}: {e}", path.display()).into(),
                    })
                })
            }
            GetResultPayload::Stream(mut parts) => {
                let mut buf = self.buffers.take((range_len(&got.range)) as usize);
                while let Some(part) = parts.next().await {
                    if !buf.extend(&part.map_err(failed)?) {
                        return Err(ReadError::Damaged {
                            key: seg.key.clone(),
                            position: got.range.start,
                            why: "the store returned more than the range asked for".into(),
                        });
                    }
                }
                let bytes = buf.freeze();
                tokio::task::spawn_blocking(move || Chunk::checked_from(bytes, first))
                    .await
                    .map_err(|e| ReadError::Fetch(e.to_string()))
            }
        }
    }

    /// Bytes `[from, to)` of a segment's object.
    async fn range(
        self: &Arc<Self>,
        seg: &RemoteSegment,
        from: u64,
        to: u64,
    ) -> Result<Bytes, ReadError> {
        let size = self.config.chunk_size;
        let (first, last) = (from / size, (to - 1) / size);
        if first == last {
            let c = self.chunk(seg, first, None).await?.bytes;
            let at = (from - first * size) as usize;
            let end = (to - first * size) as usize;
            if end > c.len() {
                return Err(ReadError::Damaged {
                    key: seg.key.clone(),
                    position: from,
                    why: "object shorter than the manifest says".into(),
                });
            }
            return Ok(c.slice(at..end));
        }
        let mut out = BytesMut::with_capacity((to - from) as usize);
        for n in first..=last {
            let c = self.chunk(seg, n, None).await?.bytes;
            let lo = from.max(n * size) - n * size;
            let hi = to.min((n + 1) * size) - n * size;
            let part = c
                .get(lo as usize..hi as usize)
                .ok_or_else(|| ReadError::Damaged {
                    key: seg.key.clone(),
                    position: n * size + lo,
                    why: "object shorter than the manifest says".into(),
                })?;
            out.extend_from_slice(part);
        }
        Ok(out.freeze())
    }

    /// Like `range`, reusing `cur` (the last chunk this read touched) when the span lies
    /// within it, so walking batch headers costs no cache lookups.
    async fn span(
        self: &Arc<Self>,
        seg: &RemoteSegment,
        cur: &mut Option<(u64, Chunk)>,
        from: u64,
        to: u64,
    ) -> Result<Bytes, ReadError> {
        let size = self.config.chunk_size;
        let n = from / size;
        if (to - 1) / size != n {
            self.stats.copied_replies.fetch_add(1, Relaxed);
            return self.range(seg, from, to).await;
        }
        if cur.as_ref().is_none_or(|(m, _)| *m != n) {
            *cur = Some((n, self.chunk(seg, n, None).await?));
        }
        let c = &cur.as_ref().expect("set above").1.bytes;
        let (at, end) = ((from - n * size) as usize, (to - n * size) as usize);
        if end > c.len() {
            return Err(ReadError::Damaged {
                key: seg.key.clone(),
                position: from,
                why: "object shorter than the manifest says".into(),
            });
        }
        Ok(c.slice(at..end))
    }

    /// The first offset of `seg` whose record timestamp is at or after `ts`, with that
    /// timestamp (ListOffsets by time): the segment's time index narrows the search, then
    /// batch headers are read from there. A compressed batch answers with its base offset.
    pub async fn offset_for_timestamp(
        self: &Arc<Self>,
        seg: &RemoteSegment,
        ts: i64,
    ) -> Result<Option<(u64, i64)>, ReadError> {
        if seg.max_timestamp < ts {
            return Ok(None);
        }
        let times = companion(self.store.as_ref(), seg, ".timeindex", decode_time_entries).await?;
        let idx = times.partition_point(|e| e.timestamp < ts);
        let mut at = match idx {
            0 => seg.base_offset,
            i => seg.base_offset + u64::from(times[i - 1].relative_offset),
        };
        while at < seg.end_offset {
            let got = self.read(seg, at, self.config.chunk_size as usize).await?;
            if got.is_empty() {
                break;
            }
            let mut pos = 0;
            while pos + HEADER_LEN <= got.len() {
                let h = BatchHeader::parse(&got[pos..]).map_err(|e| ReadError::Damaged {
                    key: seg.key.clone(),
                    position: pos as u64,
                    why: e.to_string(),
                })?;
                let whole = &got[pos..pos + h.total_len()];
                if h.max_timestamp >= ts {
                    let (delta, found) = strata_core::batch::first_record_at_or_after(whole, ts)
                        .unwrap_or((0, h.max_timestamp));
                    return Ok(Some((h.base_offset as u64 + u64::from(delta), found)));
                }
                at = h.last_offset() as u64 + 1;
                pos += h.total_len();
            }
        }
        Ok(None)
    }

    /// Whole batches of `seg` from the one holding `offset`, up to `max_bytes` (the first
    /// batch whole even when larger, so a consumer always progresses) and up to the end of
    /// the first batch's chunk: a reply never crosses a chunk boundary unless its first
    /// batch does, and is then that batch alone.
    pub async fn read(
        self: &Arc<Self>,
        seg: &RemoteSegment,
        offset: u64,
        max_bytes: usize,
    ) -> Result<Bytes, ReadError> {
        self.read_then(seg, offset, max_bytes, None).await
    }

    /// [`read`](Self::read) by a sequential reader that goes on into `next` after `seg`
    /// (the manifest's following segment): near `seg`'s end, read-ahead fetches `next`'s
    /// index and first chunks, so crossing into it does not wait for them.
    pub async fn read_then(
        self: &Arc<Self>,
        seg: &RemoteSegment,
        offset: u64,
        max_bytes: usize,
        next: Option<&RemoteSegment>,
    ) -> Result<Bytes, ReadError> {
        let index = self.index(seg).await?;
        let rel = offset.saturating_sub(seg.base_offset);
        let mut pos = match index.partition_point(|e| u64::from(e.relative_offset) <= rel) {
            0 => 0,
            i => u64::from(index[i - 1].position),
        };
        let damaged = |position: u64, why: String| ReadError::Damaged {
            key: seg.key.clone(),
            position,
            why,
        };
        // Walk the batches to the range to answer with, then take it whole (a slice of one
        // cached chunk when it lies in one) and check every batch's CRC. Batches the check
        // after the chunk's GET found are taken from its table, without a parse; other
        // headers within the chunk in hand are parsed in place: no cache lookup, no await.
        let size = self.config.chunk_size;
        let mut cur: Option<(u64, Chunk)> = None;
        let (mut first, mut end) = (None, pos);
        'walk: while pos + HEADER_LEN as u64 <= seg.size_bytes {
            let n = pos / size;
            let in_chunk = (pos + HEADER_LEN as u64 - 1) / size == n;
            if in_chunk && cur.as_ref().is_none_or(|(m, _)| *m != n) {
                cur = Some((n, self.chunk(seg, n, next).await?));
            }
            if let Some((_, c)) = cur.as_ref().filter(|(m, _)| *m == n) {
                if let Some(mut i) = c.batch_at((pos - n * size) as usize) {
                    if first.is_none() {
                        i += c.batches[i..].partition_point(|b| (b.last_offset as u64) < offset);
                    }
                    // The same rules as the parsed walk below; these batches are checked.
                    for b in &c.batches[i..] {
                        let (at, len) = (n * size + u64::from(b.at), u64::from(b.len));
                        let start = *first.get_or_insert(at);
                        if !takes(start, at, len, max_bytes, size) {
                            break 'walk;
                        }
                        end = at + len;
                        if end - start >= max_bytes as u64 {
                            break 'walk;
                        }
                    }
                    // On from the end of the checked span, parsing.
                    pos = n * size + c.checked.end as u64;
                    continue;
                }
            }
            let h = if in_chunk {
                let c = &cur.as_ref().expect("set above").1.bytes;
                let at = (pos - n * size) as usize;
                let header = c
                    .get(at..at + HEADER_LEN)
                    .ok_or_else(|| damaged(pos, "object shorter than the manifest says".into()))?;
                BatchHeader::parse(header)
            } else {
                BatchHeader::parse(&self.range(seg, pos, pos + HEADER_LEN as u64).await?)
            }
            .map_err(|e| damaged(pos, e.to_string()))?;
            let len = h.total_len() as u64;
            if pos + len > seg.size_bytes {
                return Err(damaged(pos, "batch runs past the end of the object".into()));
            }
            if (h.last_offset() as u64) < offset {
                pos += len;
                continue;
            }
            let start = *first.get_or_insert(pos);
            if !takes(start, pos, len, max_bytes, size) {
                break;
            }
            // Each batch taken is CRC-checked once: most were, right after their chunk's GET
            // (both walks start where the offset index says a batch starts, so within the
            // checked span they are the same batches); the others here, in place. A batch
            // that crosses a chunk boundary (only ever a reply's first) is checked below,
            // once copied. Its header lies in its chunk: `cur`.
            if (pos + len - 1) / size == n {
                let c = &cur.as_ref().expect("the header's chunk").1;
                let at = (pos - n * size) as usize;
                if !c.was_checked(at, len as usize) {
                    let whole = c.bytes.get(at..at + len as usize).ok_or_else(|| {
                        damaged(pos, "object shorter than the manifest says".into())
                    })?;
                    verify(whole).map_err(|e| damaged(pos, e.to_string()))?;
                    self.stats.checked_on_read.fetch_add(len, Relaxed);
                }
            }
            pos += len;
            end = pos;
            if end - start >= max_bytes as u64 {
                break;
            }
        }
        let Some(start) = first else {
            return Ok(Bytes::new());
        };
        let out = self.span(seg, &mut cur, start, end).await?;
        if start / size != (end - 1) / size {
            let mut at = 0;
            while at < out.len() {
                let h =
                    verify(&out[at..]).map_err(|e| damaged(start + at as u64, e.to_string()))?;
                at += h.total_len();
            }
            self.stats
                .checked_on_read
                .fetch_add(out.len() as u64, Relaxed);
        }
        Ok(out)
    }
}

/// Whether a reply that starts at `start` takes the batch `[at, at + len)`: its first batch
/// whole, whatever its size; after it, only batches that fit in `max_bytes` and end within
/// the first batch's chunk (of `size` bytes), so the reply is one slice of that chunk.
fn takes(start: u64, at: u64, len: u64, max_bytes: usize, size: u64) -> bool {
    at == start || (at + len - start <= max_bytes as u64 && at + len <= (start / size + 1) * size)
}

/// A segment's companion index object (`KEY.index`, `KEY.timeindex`), decoded.
async fn companion<T, E: std::fmt::Display>(
    store: &dyn ObjectStore,
    seg: &RemoteSegment,
    suffix: &str,
    decode: impl Fn(&[u8]) -> Result<Vec<T>, E>,
) -> Result<Vec<T>, ReadError> {
    let key = format!("{}{suffix}", seg.key);
    let bytes = store.get(&Path::from(key.as_str())).await?.bytes().await?;
    decode(&bytes).map_err(|e| ReadError::Damaged {
        key,
        position: 0,
        why: e.to_string(),
    })
}

/// Bytes `[at, at + len)` of a local object file (blocking), mapped read-only with its page
/// tables filled in one call (`MAP_POPULATE`): the chunk is a slice of the page cache, so
/// reading it costs neither a copy nor fresh memory, which against a local directory were
/// most of a cold read's cost (docs/benchmarks.md). A file shorter than the range is an
/// error here, before anything is mapped.
///
/// Objects are immutable: the store writes a new object to a temporary file and renames it
/// into place, so an object rewritten or deleted later leaves this mapping's file as it
/// was. Only a file cut short in place by hand under a running reader could fault its
/// reads (SIGBUS), which docs/tiered-storage.md warns about.
fn map_file(file: &std::fs::File, at: u64, len: usize) -> std::io::Result<Bytes> {
    let size = file.metadata()?.len();
    if at.checked_add(len as u64).is_none_or(|end| end > size) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!(
                "the file holds {size} bytes, the range ends at byte {}",
                at.saturating_add(len as u64)
            ),
        ));
    }
    if len == 0 {
        return Ok(Bytes::new());
    }
    // SAFETY: the mapping is read-only and private to this process's reads; the bytes
    // stay valid while the file keeps its length, which the object store never changes
    // for an object it has written (see above).
    let map = unsafe {
        memmap2::MmapOptions::new()
            .offset(at)
            .len(len)
            .populate()
            .map(file)?
    };
    Ok(Bytes::from_owner(map))
}

fn range_len(r: &std::ops::Range<u64>) -> u64 {
    r.end.saturating_sub(r.start)
}

#[cfg(test)]
mod tests;
