//! Reading remote segments: whole batches from an offset, fetched in fixed-size chunks
//! (ranged GETs) through a memory cache, with read-ahead of the next chunk for sequential
//! replay. Every batch read is CRC-checked: a damaged object is an error naming it, never
//! bad records handed to a consumer.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use object_store::path::Path;
use object_store::ObjectStore;
use strata_core::batch::{verify, BatchHeader, HEADER_LEN};
use strata_core::segment::{decode_offset_entries, OffsetEntry};

use crate::manifest::RemoteSegment;

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
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
    /// Fetch the next chunk in the background after a miss (sequential replay).
    pub read_ahead: bool,
    /// The cold-read budget: GETs at once, and bytes per second (`None`: uncapped), so a
    /// months-long replay cannot starve the broker.
    pub max_concurrent_reads: usize,
    pub max_bytes_per_sec: Option<u64>,
}

impl Default for ReadConfig {
    fn default() -> Self {
        ReadConfig {
            chunk_size: 1 << 20,
            cache_bytes: 256 << 20,
            read_ahead: true,
            max_concurrent_reads: 8,
            max_bytes_per_sec: None,
        }
    }
}

/// An LRU of chunks by (object, chunk number).
#[derive(Default)]
struct Chunks {
    map: HashMap<(String, u64), Bytes>,
    order: VecDeque<(String, u64)>,
    bytes: usize,
}

/// Counters of the cache, for metrics and benchmarks.
#[derive(Debug, Default)]
pub struct ReadStats {
    pub hits: std::sync::atomic::AtomicU64,
    pub misses: std::sync::atomic::AtomicU64,
    pub bytes_fetched: std::sync::atomic::AtomicU64,
    /// GETs running now, and GETs that waited for the budget.
    pub in_flight: std::sync::atomic::AtomicU64,
    pub throttled: std::sync::atomic::AtomicU64,
}

pub struct RemoteReader {
    store: Arc<dyn ObjectStore>,
    config: ReadConfig,
    chunks: Mutex<Chunks>,
    indexes: Mutex<HashMap<String, Arc<Vec<OffsetEntry>>>>,
    slots: tokio::sync::Semaphore,
    limiter: crate::limit::Limiter,
    pub stats: ReadStats,
}

impl RemoteReader {
    pub fn new(store: Arc<dyn ObjectStore>, config: ReadConfig) -> Arc<Self> {
        Arc::new(RemoteReader {
            store,
            chunks: Mutex::new(Chunks::default()),
            indexes: Mutex::new(HashMap::new()),
            slots: tokio::sync::Semaphore::new(config.max_concurrent_reads.max(1)),
            limiter: crate::limit::Limiter::new(config.max_bytes_per_sec),
            stats: ReadStats::default(),
            config,
        })
    }

    fn chunks(&self) -> std::sync::MutexGuard<'_, Chunks> {
        self.chunks.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn index(&self, seg: &RemoteSegment) -> Result<Arc<Vec<OffsetEntry>>, ReadError> {
        if let Some(i) = self
            .indexes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&seg.key)
        {
            return Ok(i.clone());
        }
        let key = format!("{}.index", seg.key);
        let bytes = self
            .store
            .get(&Path::from(key.as_str()))
            .await?
            .bytes()
            .await?;
        let entries = decode_offset_entries(&bytes).map_err(|e| ReadError::Damaged {
            key: key.clone(),
            position: 0,
            why: e.to_string(),
        })?;
        let entries = Arc::new(entries);
        self.indexes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(seg.key.clone(), entries.clone());
        Ok(entries)
    }

    /// Chunk `n` of a segment's object, from the cache or the store.
    async fn chunk(self: &Arc<Self>, seg: &RemoteSegment, n: u64) -> Result<Bytes, ReadError> {
        use std::sync::atomic::Ordering::Relaxed;
        let id = (seg.key.clone(), n);
        if let Some(b) = self.chunks().map.get(&id).cloned() {
            self.stats.hits.fetch_add(1, Relaxed);
            return Ok(b);
        }
        self.stats.misses.fetch_add(1, Relaxed);
        let bytes = self.fetch_chunk(seg, n).await?;
        if self.config.read_ahead && (n + 1) * self.config.chunk_size < seg.size_bytes {
            let (me, seg) = (self.clone(), seg.clone());
            tokio::spawn(async move {
                if !me.chunks().map.contains_key(&(seg.key.clone(), n + 1)) {
                    let _ = me.fetch_chunk(&seg, n + 1).await;
                }
            });
        }
        Ok(bytes)
    }

    async fn fetch_chunk(&self, seg: &RemoteSegment, n: u64) -> Result<Bytes, ReadError> {
        use std::sync::atomic::Ordering::Relaxed;
        let start = n * self.config.chunk_size;
        let end = (start + self.config.chunk_size).min(seg.size_bytes);
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
        let got = self
            .store
            .get_range(&Path::from(seg.key.as_str()), start..end)
            .await;
        self.stats.in_flight.fetch_sub(1, Relaxed);
        drop(permit);
        let bytes = got?;
        self.stats
            .bytes_fetched
            .fetch_add(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let mut c = self.chunks();
        if c.map.insert((seg.key.clone(), n), bytes.clone()).is_none() {
            c.order.push_back((seg.key.clone(), n));
            c.bytes += bytes.len();
        }
        while c.bytes > self.config.cache_bytes {
            let Some(old) = c.order.pop_front() else {
                break;
            };
            if let Some(b) = c.map.remove(&old) {
                c.bytes -= b.len();
            }
        }
        Ok(bytes)
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
            let c = self.chunk(seg, first).await?;
            let at = (from - first * size) as usize;
            let end = (to - first * size) as usize;
            return c
                .get(at..end)
                .map(Bytes::copy_from_slice)
                .ok_or_else(|| ReadError::Damaged {
                    key: seg.key.clone(),
                    position: from,
                    why: "object shorter than the manifest says".into(),
                });
        }
        let mut out = BytesMut::with_capacity((to - from) as usize);
        for n in first..=last {
            let c = self.chunk(seg, n).await?;
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

    /// Whole batches of `seg` from the one holding `offset`, up to `max_bytes` (the first
    /// batch whole even when larger, so a consumer always progresses).
    pub async fn read(
        self: &Arc<Self>,
        seg: &RemoteSegment,
        offset: u64,
        max_bytes: usize,
    ) -> Result<Bytes, ReadError> {
        let index = self.index(seg).await?;
        let rel = offset.saturating_sub(seg.base_offset);
        let mut pos = index
            .iter()
            .take_while(|e| u64::from(e.relative_offset) <= rel)
            .last()
            .map_or(0, |e| u64::from(e.position));
        let damaged = |position: u64, why: String| ReadError::Damaged {
            key: seg.key.clone(),
            position,
            why,
        };
        let mut out = BytesMut::new();
        while pos + HEADER_LEN as u64 <= seg.size_bytes {
            let header = self.range(seg, pos, pos + HEADER_LEN as u64).await?;
            let h = BatchHeader::parse(&header).map_err(|e| damaged(pos, e.to_string()))?;
            let len = h.total_len() as u64;
            if pos + len > seg.size_bytes {
                return Err(damaged(pos, "batch runs past the end of the object".into()));
            }
            if (h.last_offset() as u64) < offset {
                pos += len;
                continue;
            }
            if !out.is_empty() && out.len() as u64 + len > max_bytes as u64 {
                break;
            }
            let batch = self.range(seg, pos, pos + len).await?;
            verify(&batch).map_err(|e| damaged(pos, e.to_string()))?;
            out.extend_from_slice(&batch);
            pos += len;
            if out.len() >= max_bytes {
                break;
            }
        }
        Ok(out.freeze())
    }
}

#[cfg(test)]
mod tests;
