//! Compaction of a partition's local log, for topics with `cleanup.policy=compact` that are
//! not tiered (a tiered topic is compacted in the cold tier by strata-compactor). Each
//! replica compacts its own log, as Kafka's log cleaner does; what a record stays or goes
//! by is the shared batch-level code of `strata_core::compact`.
//!
//! A round runs in three steps, so the log's lock is held only to plan and to swap:
//! 1. [`PartitionLog::plan_compaction`] (under the lock) picks the sealed segments wholly
//!    below the high watermark whose newest record is older than `min.compaction.lag.ms`,
//!    and runs only when the bytes not compacted yet (past `cleaner-offset-checkpoint`) are
//!    at least `min.cleanable.dirty.ratio` of them, or the oldest of those is older than
//!    `max.compaction.lag.ms`.
//! 2. [`CompactionPlan::run`] (no lock) reads those segments twice through their open
//!    files: pass 1 learns the latest offset of every key of the dirty part (bounded by
//!    `max_map_bytes`: past it the dirty part ends at a segment boundary and the rest waits
//!    for the next round), pass 2 writes each segment that loses a record again, with only
//!    the batches and records that stay, to `<base>.log.compacted.tmp`, fsynced.
//! 3. [`PartitionLog::install_compaction`] (under the lock) swaps each rewritten segment in
//!    if it is still the one read (retention or a truncation meanwhile makes it give that
//!    one up): the old index files go first, then the new file is renamed over the old
//!    and the directory synced, then the new indexes are written. A crash at any point
//!    leaves either segment whole, with no index that does not fit it (a missing index is
//!    rebuilt at open); leftover `.tmp` files are removed at open.
//!
//! Offsets never change: a kept record keeps its offset, a segment keeps its base, and
//! readers holding an old file keep reading it. Segments are rewritten one for one, not
//! merged.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use strata_core::batch::{self, BatchHeader, HEADER_LEN, STAMP_LEN};
use strata_core::compact::{compact_batch, Index, Kept, Policy};
use strata_core::segment::{self as fmt, INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX};

use super::segment::{remove_if_exists, Segment};
use super::{read_number, write_atomically, PartitionLog};

/// Where the last compaction's dirty part ended: what lies below was compacted at least once
/// (Kafka's `cleaner-offset-checkpoint`, per partition).
pub(crate) const CLEANED_FILE: &str = "cleaner-offset-checkpoint";
/// A segment being rewritten is `<base>.log.compacted.tmp` (removed at open, as every `.tmp`).
const TMP_SUFFIX: &str = ".compacted.tmp";

/// One sealed segment a round reads, as it was when planned.
struct Planned {
    base: u64,
    file: Arc<File>,
    size: u64,
    next_offset: u64,
}

/// What a compaction round will read (from [`PartitionLog::plan_compaction`]).
pub struct CompactionPlan {
    dir: PathBuf,
    index_interval: u32,
    segments: Vec<Planned>,
    /// Index in `segments` of the first segment not compacted yet.
    clean: usize,
    policy: Policy,
    max_map_bytes: usize,
}

/// A rewritten segment waiting to be swapped in.
struct Rewritten {
    old: Arc<File>,
    old_size: u64,
    tmp: PathBuf,
    new: Segment,
}

/// What [`CompactionPlan::run`] wrote.
pub struct Compacted {
    rewritten: Vec<Rewritten>,
    dirty_end: u64,
    report: CompactionReport,
}

/// What one round did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CompactionReport {
    pub segments_read: usize,
    pub segments_rewritten: usize,
    pub bytes_before: u64,
    pub bytes_after: u64,
    pub records_removed: u64,
    /// Distinct keys of the dirty part.
    pub keys: usize,
    /// Where the dirty part ended: everything below was compacted.
    pub dirty_end: u64,
    /// Rewritten segments given up at the swap (deleted or cut meanwhile).
    pub given_up: usize,
}

impl PartitionLog {
    /// Where the last compaction's dirty part ended (0: never compacted).
    pub fn cleaned_to(&self) -> u64 {
        read_number(&self.dir.join(CLEANED_FILE)).unwrap_or(0)
    }

    /// Keeps the compacted point inside the log after it was cut to `end`: what is written
    /// again past the cut is dirty.
    pub(super) fn clamp_cleaned_to(&self, end: u64) -> io::Result<()> {
        if self.cleaned_to() > end {
            write_atomically(&self.dir, CLEANED_FILE, end.to_string().as_bytes())?;
        }
        Ok(())
    }

    /// A compaction round, if one is due: only for a compacted topic that is not tiered,
    /// over sealed segments wholly below `upper` (the high watermark). `max_map_bytes`
    /// bounds pass 1's key table.
    pub fn plan_compaction(
        &self,
        upper: u64,
        now_ms: i64,
        max_map_bytes: usize,
    ) -> Option<CompactionPlan> {
        let c = &self.config;
        if self.closed || !c.compacted() || c.remote_storage {
            return None;
        }
        let active = self.active().base;
        let youngest = now_ms.saturating_sub(c.min_compaction_lag_ms);
        let segments: Vec<Planned> = self
            .segments
            .values()
            .take_while(|s| {
                s.base < active
                    && s.next_offset <= upper
                    && s.max_timestamp.unwrap_or(s.created_ms) <= youngest
            })
            .map(|s| Planned {
                base: s.base,
                file: s.file.clone(),
                size: s.size,
                next_offset: s.next_offset,
            })
            .collect();
        let cleaned = self.cleaned_to();
        let clean = segments.partition_point(|s| s.next_offset <= cleaned);
        if clean == segments.len() {
            return None;
        }
        let total: u64 = segments.iter().map(|s| s.size).sum();
        let dirty: u64 = segments[clean..].iter().map(|s| s.size).sum();
        let ratio_due = u128::from(dirty) * 1_000_000
            >= u128::from(total) * u128::from(c.min_cleanable_dirty_ratio_ppm);
        let oldest_dirty = self
            .segments
            .get(&segments[clean].base)
            .and_then(|s| s.max_timestamp)
            .unwrap_or(now_ms);
        let lag_due = now_ms.saturating_sub(oldest_dirty) > c.max_compaction_lag_ms;
        if !(ratio_due || lag_due) {
            return None;
        }
        Some(CompactionPlan {
            dir: self.dir.clone(),
            index_interval: c.index_interval_bytes,
            segments,
            clean,
            policy: Policy {
                now_ms,
                delete_retention_ms: c.delete_retention_ms,
            },
            max_map_bytes,
        })
    }

    /// Swaps in what [`CompactionPlan::run`] wrote, segment by segment, where the segment
    /// is still the one read; records how far the log is compacted.
    pub fn install_compaction(&mut self, done: Compacted) -> io::Result<CompactionReport> {
        let mut report = done.report;
        let mut all = true;
        for r in done.rewritten {
            let base = r.new.base;
            let current = self.segments.get(&base);
            let same = !self.closed
                && self.segments.keys().next_back() != Some(&base)
                && current.is_some_and(|s| Arc::ptr_eq(&s.file, &r.old) && s.size == r.old_size);
            if !same {
                remove_if_exists(&r.tmp)?;
                report.given_up += 1;
                all = false;
                continue;
            }
            let mut new = r.new;
            // An index that does not fit the file must never sit beside it: the old
            // indexes go before the new file takes the name; the new ones come after.
            remove_if_exists(&new.path(INDEX_SUFFIX))?;
            remove_if_exists(&new.path(TIME_INDEX_SUFFIX))?;
            self.dir_handle.sync_all()?;
            std::fs::rename(&r.tmp, new.path(LOG_SUFFIX))?;
            self.dir_handle.sync_all()?;
            new.write_indexes()?;
            self.unsynced_sealed.retain(|f| !Arc::ptr_eq(f, &r.old));
            self.segments.insert(base, new);
        }
        if all {
            write_atomically(
                &self.dir,
                CLEANED_FILE,
                done.dirty_end.to_string().as_bytes(),
            )?;
        }
        Ok(report)
    }
}

/// Calls `f` with every batch of `file` below `size`, in order, with whether it is the
/// segment's last. Checks each batch's CRC.
fn for_each_batch(
    file: &File,
    size: u64,
    mut f: impl FnMut(&[u8], &BatchHeader, bool) -> io::Result<()>,
) -> io::Result<()> {
    let mut pos = 0u64;
    let mut header = [0u8; HEADER_LEN];
    let mut buf = Vec::new();
    while pos + HEADER_LEN as u64 <= size {
        file.read_exact_at(&mut header, pos)?;
        let h = BatchHeader::parse(&header).map_err(|e| damaged(pos, e))?;
        let len = h.total_len();
        if pos + len as u64 > size {
            return Err(damaged(
                pos,
                batch::BatchError::Truncated {
                    needed: len,
                    available: (size - pos) as usize,
                },
            ));
        }
        buf.resize(len, 0);
        file.read_exact_at(&mut buf, pos)?;
        batch::verify(&buf).map_err(|e| damaged(pos, e))?;
        pos += len as u64;
        f(&buf, &h, pos == size)?;
    }
    Ok(())
}

fn damaged(pos: u64, e: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("a sealed segment is damaged at byte {pos}: {e}; compaction skips this log"),
    )
}

impl CompactionPlan {
    /// Reads the planned segments and writes those that lose records again, to temporary
    /// files; blocking, and done without the log's lock.
    pub fn run(self) -> io::Result<Compacted> {
        // Pass 1: the latest offset of every key of the dirty part.
        let mut index = Index::default();
        let mut end = self.segments.len();
        for (i, s) in self.segments.iter().enumerate() {
            let dirty = i >= self.clean;
            for_each_batch(&s.file, s.size, |b, h, _| {
                index
                    .observe(b, h, dirty)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
            })?;
            if dirty && index.memory() > self.max_map_bytes && i + 1 < self.segments.len() {
                end = i + 1;
                break;
            }
        }
        let mut report = CompactionReport {
            segments_read: end,
            keys: index.keys(),
            dirty_end: self.segments[end - 1].next_offset,
            ..CompactionReport::default()
        };
        // Pass 2: each segment again, with only what stays.
        let mut rewritten = Vec::new();
        for s in &self.segments[..end] {
            let tmp = self.dir.join(format!(
                "{}{TMP_SUFFIX}",
                fmt::file_name(s.base, LOG_SUFFIX)
            ));
            let file = strata_core::private_fs::open_options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)?;
            let mut new = Segment::rewritten(
                &self.dir,
                s.base,
                file,
                self.policy.now_ms,
                self.index_interval,
            );
            let mut removed = 0;
            let mut dropped_batches = 0;
            let written = for_each_batch(&s.file, s.size, |b, h, last| {
                let decided = compact_batch(b, h, &index, self.policy, last)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                removed += decided.records_removed;
                let bytes = match &decided.kept {
                    Kept::Whole => b,
                    Kept::Rewritten(bytes) => bytes.as_slice(),
                    Kept::Dropped => {
                        dropped_batches += 1;
                        return Ok(());
                    }
                };
                let kept = BatchHeader::parse(bytes).map_err(|e| damaged(0, e))?;
                let mut prefix = [0u8; STAMP_LEN];
                prefix.copy_from_slice(&bytes[..STAMP_LEN]);
                new.append(&prefix, bytes, &kept)
            });
            if let Err(e) = written {
                remove_if_exists(&tmp)?;
                return Err(e);
            }
            report.bytes_before += s.size;
            if removed == 0 && dropped_batches == 0 {
                // Nothing changed: the segment stays as it is.
                drop(new);
                remove_if_exists(&tmp)?;
                report.bytes_after += s.size;
                continue;
            }
            new.file.sync_all()?;
            report.bytes_after += new.size;
            report.records_removed += removed;
            report.segments_rewritten += 1;
            rewritten.push(Rewritten {
                old: s.file.clone(),
                old_size: s.size,
                tmp,
                new,
            });
        }
        Ok(Compacted {
            rewritten,
            dirty_end: report.dirty_end,
            report,
        })
    }

    /// The base offsets of the segments planned (for logs and tests).
    pub fn bases(&self) -> Vec<u64> {
        self.segments.iter().map(|s| s.base).collect()
    }
}

#[cfg(test)]
mod tests;
