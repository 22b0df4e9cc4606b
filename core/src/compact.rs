//! Compaction at the level of one record batch, shared by the broker's compaction of its
//! local log and by strata-compactor's of the cold tier.
//!
//! Pass 1 ([`Index::observe`]) learns, over the range being compacted, the latest offset of
//! every key in its dirty part, the outcome of every transaction (its commit or abort
//! marker) and each producer's last batch. Pass 2 ([`compact_batch`]) then decides each
//! record: a record stays when it is its key's latest, or has no key, or belongs to a
//! transaction not decided yet; a tombstone (null value) stays until `delete.retention.ms`
//! after its batch's timestamp; records of aborted transactions go.
//!
//! A batch that keeps some records is rewritten as Kafka's log cleaner does for v2
//! batches: the original header (base offset, last offset delta, timestamps, producer id,
//! epoch and base sequence, attributes) is kept, so every kept record keeps its offset and
//! sequence number and a producer's state stays valid; the kept records are copied byte for
//! byte (their deltas are relative to that unchanged header), recompressed with the batch's
//! own codec, and the CRC is recomputed. A batch that keeps none is dropped, unless it is a
//! segment's last (so readers still find where the segment ends) or its producer's last
//! (so the producer's sequence survives), in which case it stays as an empty batch.
//! Control batches (transaction markers) stay as they are.

use std::collections::HashMap;

use crate::batch::{raw_records, rebuilt, BatchHeader, Compression, RawRecord};
pub use crate::codec::{compress, records_section};

fn split<'a>(section: &'a [u8], h: &BatchHeader) -> Result<Vec<RawRecord<'a>>, String> {
    raw_records(section, h.record_count)
        .ok_or_else(|| format!("malformed records in the batch at offset {}", h.base_offset))
}

/// A control batch's marker: `Some(true)` commit, `Some(false)` abort, `None` another kind.
fn marker(batch: &[u8], h: &BatchHeader) -> Result<Option<bool>, String> {
    let section = records_section(batch, h)?;
    let recs = split(&section, h)?;
    let kind = recs
        .first()
        .and_then(|r| r.key)
        .and_then(|k| k.get(2..4))
        .map(|t| i16::from_be_bytes([t[0], t[1]]));
    Ok(match kind {
        Some(0) => Some(false),
        Some(1) => Some(true),
        _ => None,
    })
}

/// A record's key and offset.
type KeyAt = (Box<[u8]>, i64);

/// What pass 1 learns over the range being compacted.
#[derive(Debug, Default)]
pub struct Index {
    /// Every key of the dirty part, with its latest offset (committed or non-transactional).
    latest: HashMap<Box<[u8]>, i64>,
    key_bytes: usize,
    /// Transaction markers per producer id, in offset order: (offset, committed).
    markers: HashMap<i64, Vec<(i64, bool)>>,
    /// Keys of transactional records whose marker is not seen yet, per producer id.
    pending: HashMap<i64, Vec<KeyAt>>,
    pending_bytes: usize,
    /// The first offset of each producer's transaction not decided yet.
    open_since: HashMap<i64, i64>,
    /// The last offset of each producer's last data batch.
    last_batch: HashMap<i64, i64>,
}

/// The offset of record `delta` of a batch, checked against the batch's own range (a
/// damaged record must not claim another offset).
fn record_offset(h: &BatchHeader, delta: i64) -> Result<i64, String> {
    if !(0..=i64::from(h.last_offset_delta)).contains(&delta) {
        return Err(format!(
            "record offset delta {delta} outside the batch at offset {} (last delta {})",
            h.base_offset, h.last_offset_delta
        ));
    }
    h.base_offset.checked_add(delta).ok_or_else(|| {
        format!(
            "record offset overflows in the batch at offset {}",
            h.base_offset
        )
    })
}

impl Index {
    /// Distinct keys learned.
    pub fn keys(&self) -> usize {
        self.latest.len()
    }

    /// Approximate memory held, in bytes (keys and table entries, waiting transactions').
    pub fn memory(&self) -> usize {
        self.key_bytes + self.latest.len() * 48 + self.pending_bytes
    }

    /// The first offset of a transaction not decided within the range read: what lies
    /// from there on cannot be called clean yet (a later marker may decide it).
    pub fn first_undecided(&self) -> Option<i64> {
        self.open_since.values().copied().min()
    }

    /// Learns from one whole batch (its CRC already checked). The keys of `dirty` batches
    /// count; of the others (the clean part) only markers and producers.
    pub fn observe(&mut self, batch: &[u8], h: &BatchHeader, dirty: bool) -> Result<(), String> {
        let pid = h.producer_id;
        if h.is_control() {
            if let Some(committed) = marker(batch, h)? {
                self.markers
                    .entry(pid)
                    .or_default()
                    .push((h.base_offset, committed));
                self.open_since.remove(&pid);
                let waiting = self.pending.remove(&pid).unwrap_or_default();
                for (key, offset) in waiting {
                    self.pending_bytes -= key.len() + 48;
                    if committed {
                        self.note(key, offset);
                    }
                }
            }
            return Ok(());
        }
        if h.has_producer_id() {
            self.last_batch.insert(pid, h.last_offset());
        }
        if h.is_transactional() {
            self.open_since.entry(pid).or_insert(h.base_offset);
        }
        if !dirty {
            return Ok(());
        }
        let section = records_section(batch, h)?;
        for r in split(&section, h)? {
            let Some(key) = r.key else { continue };
            let offset = record_offset(h, r.offset_delta)?;
            if h.is_transactional() {
                self.pending_bytes += key.len() + 48;
                self.pending
                    .entry(pid)
                    .or_default()
                    .push((key.into(), offset));
            } else {
                self.note(key.into(), offset);
            }
        }
        Ok(())
    }

    fn note(&mut self, key: Box<[u8]>, offset: i64) {
        match self.latest.get_mut(&key) {
            Some(o) => *o = (*o).max(offset),
            None => {
                self.key_bytes += key.len();
                self.latest.insert(key, offset);
            }
        }
    }

    /// The outcome of the transaction holding the batch at `offset`: the producer's first
    /// marker after it (`None`: not decided within the range).
    fn outcome(&self, pid: i64, offset: i64) -> Option<bool> {
        let m = self.markers.get(&pid)?;
        let i = m.partition_point(|(o, _)| *o < offset);
        m.get(i).map(|(_, committed)| *committed)
    }
}

/// When tombstones may go.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    pub now_ms: i64,
    /// `delete.retention.ms`: a tombstone stays this long after its batch's timestamp.
    pub delete_retention_ms: i64,
}

/// What became of one batch.
#[derive(Debug, PartialEq, Eq)]
pub enum Kept {
    /// Every record stays: the batch is copied as it is.
    Whole,
    /// Some records (possibly none) stay in this rewritten batch.
    Rewritten(Vec<u8>),
    /// No record stays and nothing needs the batch.
    Dropped,
}

/// Pass 2's decision on one batch, with what it counted.
#[derive(Debug)]
pub struct Decided {
    pub kept: Kept,
    pub records_removed: u64,
    /// Tombstones kept, and the oldest one's batch timestamp (-1: none).
    pub tombstones: u64,
    pub oldest_tombstone: i64,
}

/// Decides one whole batch. `segment_end`: it ends the segment being written.
pub fn compact_batch(
    batch: &[u8],
    h: &BatchHeader,
    index: &Index,
    policy: Policy,
    segment_end: bool,
) -> Result<Decided, String> {
    let whole = |tombstones, oldest_tombstone| Decided {
        kept: Kept::Whole,
        records_removed: 0,
        tombstones,
        oldest_tombstone,
    };
    if h.is_control() {
        return Ok(whole(0, -1));
    }
    let outcome = h
        .is_transactional()
        .then(|| index.outcome(h.producer_id, h.base_offset));
    if outcome == Some(None) {
        // Its transaction is still open as far as the cold tier knows: keep it as it is.
        return Ok(whole(0, -1));
    }
    let aborted = outcome == Some(Some(false));
    let section = records_section(batch, h)?;
    let recs = split(&section, h)?;
    let expired = policy.now_ms.saturating_sub(h.max_timestamp) > policy.delete_retention_ms;
    let mut kept: Vec<&RawRecord> = Vec::with_capacity(recs.len());
    let mut tombstones = 0;
    for r in &recs {
        let offset = record_offset(h, r.offset_delta)?;
        let stays = !aborted
            && match r.key {
                None => true,
                Some(k) => {
                    let superseded = index.latest.get(k).is_some_and(|&o| o > offset);
                    !superseded && (r.value.is_some() || !expired)
                }
            };
        if stays {
            tombstones += u64::from(r.value.is_none() && r.key.is_some());
            kept.push(r);
        }
    }
    let oldest = if tombstones > 0 { h.max_timestamp } else { -1 };
    let removed = (recs.len() - kept.len()) as u64;
    if removed == 0 {
        return Ok(whole(tombstones, oldest));
    }
    let needed = segment_end
        || (h.has_producer_id() && index.last_batch.get(&h.producer_id) == Some(&h.last_offset()));
    let kept = if kept.is_empty() && !needed {
        Kept::Dropped
    } else {
        Kept::Rewritten(rebuild(batch, h, &kept)?)
    };
    Ok(Decided {
        kept,
        records_removed: removed,
        tombstones,
        oldest_tombstone: oldest,
    })
}

/// The batch with only `kept` records: the original header with a new record count,
/// length and CRC; an empty batch is written uncompressed.
fn rebuild(batch: &[u8], h: &BatchHeader, kept: &[&RawRecord]) -> Result<Vec<u8>, String> {
    let raw: Vec<u8> = kept.iter().flat_map(|r| r.bytes.iter().copied()).collect();
    if kept.is_empty() {
        return rebuilt(batch, Compression::None, 0, &[]);
    }
    let body = compress(h.compression(), &raw)?;
    rebuilt(batch, h.compression(), kept.len() as i32, &body)
}

#[cfg(test)]
mod tests;
