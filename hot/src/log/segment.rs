//! One segment: a `.log` file of stamped batches with its sparse offset and time indexes.
//!
//! The segment owns its files and their in-memory indexes. It writes with positioned writes
//! and reads with positioned reads through a shared `Arc<File>`, so readers need no lock on
//! the segment once they hold the file. Index files are written when the segment is sealed
//! and at clean shutdown; the active segment's index lives in memory and is rebuilt by
//! recovery after an unclean stop.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use strata_core::batch::{self, BatchError, BatchHeader, HEADER_LEN, STAMP_LEN};
use strata_core::private_fs;
use strata_core::segment::{
    self as fmt, OffsetEntry, TimeEntry, INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX,
};

/// How far a scan reads at once.
const SCAN_CHUNK: usize = 1 << 20;

pub(crate) struct Segment {
    pub base: u64,
    pub file: Arc<File>,
    /// Bytes of valid batches.
    pub size: u64,
    /// Offset after the last batch (exclusive end).
    pub next_offset: u64,
    /// Largest batch max-timestamp, `None` while empty.
    pub max_timestamp: Option<i64>,
    /// Wall-clock time the segment was created (for `segment.ms`).
    pub created_ms: i64,
    offset_index: Vec<OffsetEntry>,
    time_index: Vec<TimeEntry>,
    bytes_since_entry: u64,
    /// Bytes between offset-index entries (`index.interval.bytes`).
    index_interval: u32,
    dir: PathBuf,
}

/// Where scanning a segment stopped early, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corruption {
    pub position: u64,
    pub reason: BatchError,
}

impl Segment {
    pub fn path(&self, suffix: &str) -> PathBuf {
        self.dir.join(fmt::file_name(self.base, suffix))
    }

    /// A segment over `file` with nothing scanned or indexed yet.
    fn empty(dir: &Path, base: u64, file: File, now_ms: i64, index_interval: u32) -> Segment {
        Segment {
            base,
            file: Arc::new(file),
            size: 0,
            next_offset: base,
            max_timestamp: None,
            created_ms: now_ms,
            offset_index: Vec::new(),
            time_index: Vec::new(),
            bytes_since_entry: 0,
            index_interval,
            dir: dir.to_path_buf(),
        }
    }

    /// A segment of `base` being written again over `file` (compaction): the caller appends
    /// the batches that stay, then renames the file over the segment's.
    pub fn rewritten(
        dir: &Path,
        base: u64,
        file: File,
        now_ms: i64,
        index_interval: u32,
    ) -> Segment {
        Segment::empty(dir, base, file, now_ms, index_interval)
    }

    /// Creates a new, empty segment starting at `base`.
    pub fn create(dir: &Path, base: u64, now_ms: i64, index_interval: u32) -> io::Result<Segment> {
        let path = dir.join(fmt::file_name(base, LOG_SUFFIX));
        // A leftover empty file from an interrupted roll is fine to reuse; data is not.
        let file = private_fs::open_options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        if file.metadata()?.len() != 0 {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("segment {} already holds data", path.display()),
            ));
        }
        for suffix in [INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
            remove_if_exists(&dir.join(fmt::file_name(base, suffix)))?;
        }
        Ok(Segment::empty(dir, base, file, now_ms, index_interval))
    }

    fn open_file(dir: &Path, base: u64) -> io::Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.join(fmt::file_name(base, LOG_SUFFIX)))
    }

    /// Opens a segment trusted to be intact (sealed and synced before the last recovery
    /// point, or closed cleanly): loads its index files, falling back to a scan without CRC
    /// checks when an index is missing or damaged, and scans only past the last index entry
    /// to find the end.
    pub fn open_trusted(
        dir: &Path,
        base: u64,
        now_ms: i64,
        index_interval: u32,
    ) -> io::Result<Segment> {
        let file = Self::open_file(dir, base)?;
        let len = file.metadata()?.len();
        let offset_index = read_index(dir, base, INDEX_SUFFIX, fmt::decode_offset_entries)
            .filter(|e| e.last().is_none_or(|l| u64::from(l.position) < len));
        let time_index = read_index(dir, base, TIME_INDEX_SUFFIX, fmt::decode_time_entries);
        let mut seg = Segment::empty(dir, base, file, now_ms, index_interval);
        match (offset_index, time_index) {
            (Some(oi), Some(ti)) => {
                let start = oi.last().map_or(0, |e| u64::from(e.position));
                seg.offset_index = oi;
                seg.time_index = ti;
                seg.max_timestamp = seg.time_index.last().map(|e| e.timestamp);
                seg.size = start;
                // Replay the tail after the last entry without re-adding index entries there.
                seg.bytes_since_entry = 0;
                let corruption = seg.scan_from(start, len, false, false)?;
                if let Some(c) = corruption {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "trusted segment {} is damaged at byte {}: {}",
                            seg.path(LOG_SUFFIX).display(),
                            c.position,
                            c.reason
                        ),
                    ));
                }
                Ok(seg)
            }
            _ => {
                tracing::warn!(segment = %seg.path(LOG_SUFFIX).display(), "index missing or damaged, rebuilding");
                let corruption = seg.scan_from(0, len, true, true)?;
                if let Some(c) = corruption {
                    seg.truncate_tail(c.position)?;
                }
                Ok(seg)
            }
        }
    }

    /// Opens a segment that may have a torn or corrupt tail: checks the CRC of every batch,
    /// rebuilds both indexes and truncates the file at the first bad batch.
    pub fn recover(
        dir: &Path,
        base: u64,
        now_ms: i64,
        index_interval: u32,
    ) -> io::Result<(Segment, Option<Corruption>)> {
        let file = Self::open_file(dir, base)?;
        let len = file.metadata()?.len();
        let mut seg = Segment::empty(dir, base, file, now_ms, index_interval);
        let corruption = seg.scan_from(0, len, true, true)?;
        if let Some(c) = &corruption {
            seg.truncate_tail(c.position)?;
        }
        Ok((seg, corruption))
    }

    /// Cuts the segment before the batch holding `offset` (replication truncation) and
    /// rebuilds its indexes from the batches that remain.
    pub fn truncate_to_offset(&mut self, offset: u64) -> io::Result<()> {
        let Some(pos) = self.position_of(offset)? else {
            return Ok(());
        };
        self.file.set_len(pos)?;
        self.file.sync_all()?;
        self.size = 0;
        self.next_offset = self.base;
        self.max_timestamp = None;
        self.offset_index.clear();
        self.time_index.clear();
        self.bytes_since_entry = 0;
        if let Some(c) = self.scan_from(0, pos, false, true)? {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "segment damaged at byte {} while truncating: {}",
                    c.position, c.reason
                ),
            ));
        }
        Ok(())
    }

    fn truncate_tail(&mut self, at: u64) -> io::Result<()> {
        tracing::warn!(segment = %self.path(LOG_SUFFIX).display(), position = at, "truncating segment tail");
        self.file.set_len(at)?;
        self.file.sync_all()?;
        self.size = at;
        Ok(())
    }

    /// Scans batches from byte `from` to `len`, updating the end, timestamps and (when asked)
    /// the indexes. Returns where and why it stopped early, if it did.
    fn scan_from(
        &mut self,
        from: u64,
        len: u64,
        verify: bool,
        build_index: bool,
    ) -> io::Result<Option<Corruption>> {
        let mut pos = from;
        let mut buf: Vec<u8> = Vec::new();
        let mut buf_start = from;
        let mut expected_offset: Option<u64> = None;
        while pos < len {
            let need_header = HEADER_LEN.min((len - pos) as usize);
            ensure_buffered(&self.file, &mut buf, &mut buf_start, pos, need_header, len)?;
            let at = (pos - buf_start) as usize;
            let header = match BatchHeader::parse(&buf[at..]) {
                Ok(h) => h,
                Err(reason) => {
                    return Ok(Some(Corruption {
                        position: pos,
                        reason,
                    }))
                }
            };
            let total = header.total_len();
            if pos + total as u64 > len {
                return Ok(Some(Corruption {
                    position: pos,
                    reason: BatchError::Truncated {
                        needed: total,
                        available: (len - pos) as usize,
                    },
                }));
            }
            if verify {
                ensure_buffered(&self.file, &mut buf, &mut buf_start, pos, total, len)?;
                let at = (pos - buf_start) as usize;
                if let Err(reason) = batch::verify(&buf[at..at + total]) {
                    return Ok(Some(Corruption {
                        position: pos,
                        reason,
                    }));
                }
            }
            let offsets_ok = header.base_offset >= 0
                && (header.base_offset as u64) >= self.base
                && header.last_offset_delta >= 0
                && header.last_offset() - (self.base as i64) < i64::from(u32::MAX)
                && expected_offset.is_none_or(|e| header.base_offset as u64 >= e);
            if !offsets_ok {
                return Ok(Some(Corruption {
                    position: pos,
                    reason: BatchError::BadLength(header.batch_length),
                }));
            }
            if build_index {
                self.note_batch(&header, pos);
            } else {
                self.max_timestamp = Some(
                    self.max_timestamp
                        .map_or(header.max_timestamp, |m| m.max(header.max_timestamp)),
                );
            }
            pos += total as u64;
            self.size = pos;
            self.next_offset = header.last_offset() as u64 + 1;
            expected_offset = Some(self.next_offset);
        }
        Ok(None)
    }

    /// Updates indexes and end markers for a batch written at `position`.
    fn note_batch(&mut self, h: &BatchHeader, position: u64) {
        let rel = (h.base_offset as u64 - self.base) as u32;
        let max_ts = self
            .max_timestamp
            .map_or(h.max_timestamp, |m| m.max(h.max_timestamp));
        let interval_reached = self.offset_index.is_empty()
            || self.bytes_since_entry >= u64::from(self.index_interval);
        if interval_reached {
            self.offset_index.push(OffsetEntry {
                relative_offset: rel,
                position: position as u32,
            });
            if self.time_index.last().is_none_or(|e| max_ts > e.timestamp) {
                self.time_index.push(TimeEntry {
                    timestamp: max_ts,
                    relative_offset: rel,
                });
            }
            self.bytes_since_entry = 0;
        }
        self.bytes_since_entry += h.total_len() as u64;
        self.max_timestamp = Some(max_ts);
    }

    /// Appends a validated batch, stamped with `prefix`, at the end of the segment. On error
    /// the segment is cut back to its previous size so the log stays readable.
    pub fn append(
        &mut self,
        prefix: &[u8; STAMP_LEN],
        batch: &[u8],
        stamped: &BatchHeader,
    ) -> io::Result<()> {
        let position = self.size;
        let result = self.file.write_all_at(prefix, position).and_then(|()| {
            self.file
                .write_all_at(&batch[STAMP_LEN..], position + STAMP_LEN as u64)
        });
        if let Err(e) = result {
            if let Err(cut) = self.file.set_len(position) {
                tracing::error!(segment = %self.path(LOG_SUFFIX).display(), error = %cut, "cannot cut back a failed append");
            }
            return Err(e);
        }
        self.note_batch(stamped, position);
        self.size = position + batch.len() as u64;
        self.next_offset = stamped.last_offset() as u64 + 1;
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// Byte position of the batch holding `offset`, or `None` when `offset` is at or past the
    /// end of this segment.
    pub fn position_of(&self, offset: u64) -> io::Result<Option<u64>> {
        if offset >= self.next_offset {
            return Ok(None);
        }
        let rel = offset.saturating_sub(self.base) as u32;
        let idx = self
            .offset_index
            .partition_point(|e| e.relative_offset <= rel);
        let mut pos = if idx == 0 {
            0
        } else {
            u64::from(self.offset_index[idx - 1].position)
        };
        let mut header = [0u8; HEADER_LEN];
        while pos < self.size {
            self.file.read_exact_at(&mut header, pos)?;
            let h = BatchHeader::parse(&header).map_err(|e| invalid_data(pos, e))?;
            if h.last_offset() as u64 >= offset {
                return Ok(Some(pos));
            }
            pos += h.total_len() as u64;
        }
        Ok(None)
    }

    /// First offset whose record timestamp is at or after `ts`, with that timestamp, if this
    /// segment has one.
    pub fn offset_for_timestamp(&self, ts: i64) -> io::Result<Option<(u64, i64)>> {
        if self.max_timestamp.is_none_or(|m| m < ts) {
            return Ok(None);
        }
        let idx = self.time_index.partition_point(|e| e.timestamp < ts);
        let start_offset = if idx == 0 {
            self.base
        } else {
            self.base + u64::from(self.time_index[idx - 1].relative_offset)
        };
        let Some(mut pos) = self.position_of(start_offset)? else {
            return Ok(None);
        };
        while pos < self.size {
            let mut header = [0u8; HEADER_LEN];
            self.file.read_exact_at(&mut header, pos)?;
            let h = BatchHeader::parse(&header).map_err(|e| invalid_data(pos, e))?;
            if h.max_timestamp >= ts {
                let mut whole = vec![0u8; h.total_len()];
                self.file.read_exact_at(&mut whole, pos)?;
                // Compressed batches answer with their base offset: a consumer starting there
                // sees every record at or after `ts`, plus a few earlier ones.
                let (delta, found) =
                    batch::first_record_at_or_after(&whole, ts).unwrap_or((0, h.max_timestamp));
                return Ok(Some((h.base_offset as u64 + u64::from(delta), found)));
            }
            pos += h.total_len() as u64;
        }
        Ok(None)
    }

    /// Writes both index files and a final time-index entry. Called when sealing a segment
    /// and at clean shutdown; the caller syncs.
    pub fn write_indexes(&mut self) -> io::Result<()> {
        if let Some(max_ts) = self.max_timestamp {
            let last_rel = (self.next_offset - 1 - self.base) as u32;
            if self.time_index.last().is_none_or(|e| e.timestamp < max_ts) {
                self.time_index.push(TimeEntry {
                    timestamp: max_ts,
                    relative_offset: last_rel,
                });
            }
        }
        write_file(
            &self.path(INDEX_SUFFIX),
            &fmt::encode_offset_entries(&self.offset_index),
        )?;
        write_file(
            &self.path(TIME_INDEX_SUFFIX),
            &fmt::encode_time_entries(&self.time_index),
        )
    }

    /// Removes the segment's files (after retention). Open readers keep their handles.
    pub fn delete_files(&self) -> io::Result<()> {
        for suffix in [LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
            remove_if_exists(&self.path(suffix))?;
        }
        Ok(())
    }
}

fn invalid_data(pos: u64, e: BatchError) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("bad batch header at byte {pos}: {e}"),
    )
}

/// Makes `buf` hold file bytes `[pos, pos + need)`, reading ahead up to [`SCAN_CHUNK`].
fn ensure_buffered(
    file: &File,
    buf: &mut Vec<u8>,
    buf_start: &mut u64,
    pos: u64,
    need: usize,
    len: u64,
) -> io::Result<()> {
    let have_end = *buf_start + buf.len() as u64;
    if pos >= *buf_start && pos + need as u64 <= have_end {
        return Ok(());
    }
    let want = need.max(SCAN_CHUNK).min((len - pos) as usize);
    buf.resize(want, 0);
    file.read_exact_at(buf, pos)?;
    *buf_start = pos;
    Ok(())
}

fn read_index<T>(
    dir: &Path,
    base: u64,
    suffix: &str,
    decode: impl Fn(&[u8]) -> Result<Vec<T>, fmt::IndexError>,
) -> Option<Vec<T>> {
    let path = dir.join(fmt::file_name(base, suffix));
    let bytes = fs::read(&path).ok()?;
    match decode(&bytes) {
        Ok(entries) => Some(entries),
        Err(e) => {
            tracing::warn!(index = %path.display(), error = %e, "ignoring damaged index");
            None
        }
    }
}

/// Writes `bytes` as the whole of `path` (mode 600) and fsyncs it.
pub(crate) fn write_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let file = private_fs::create(path)?;
    file.write_all_at(bytes, 0)?;
    file.sync_all()
}

pub(crate) fn remove_if_exists(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
