//! The local log of one partition: a directory of segments, appended by a single writer.
//!
//! `PartitionLog` owns the segment files, their indexes, the idempotent-producer state and the
//! recovery checkpoints. It does synchronous file I/O and knows nothing of networks or
//! replication: the caller serialises appends (one writer per partition), runs
//! [`SyncWork`] on a blocking thread, and reads through [`ReadPlan`]s outside its lock.
//!
//! Files in a partition directory:
//! - `<base>.log`, `<base>.index`, `<base>.timeindex`: segments (see `strata_core::segment`);
//! - `<offset>.snapshot`: producer state as of `offset`, written at each roll and at close;
//! - `recovery-point`: every segment wholly below this offset is synced and trusted;
//! - `leader-epoch-checkpoint`: the first offset of every leader epoch in the log;
//! - `clean-shutdown`: present only while the log is closed cleanly; its log end offset lets
//!   the next open skip the CRC scan;
//! - `cleaner-offset-checkpoint`: a compacted topic's log is compacted below this offset
//!   (see [`compaction`]);
//! - `aborted-transactions`: the transactions aborted in this log (see [`txn`]).

pub mod compaction;
pub mod config;
pub mod fuzzing;
pub mod producer_state;
mod segment;
pub mod txn;

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use strata_core::batch::marker::Marker;
use strata_core::batch::{self, BatchError, BatchHeader, BatchIter, HEADER_LEN};
use strata_core::segment::{self as fmt, LOG_SUFFIX, SNAPSHOT_SUFFIX};

use crate::replication::epochs::LeaderEpochCache;
pub use config::{ConfigError, FlushPolicy, LogConfig};
use producer_state::{ProducerStateTable, SequenceCheck};
pub use segment::Corruption;
use segment::{remove_if_exists, write_file, Segment};

const RECOVERY_POINT_FILE: &str = "recovery-point";
const CLEAN_SHUTDOWN_FILE: &str = "clean-shutdown";
const EPOCH_CHECKPOINT_FILE: &str = "leader-epoch-checkpoint";
/// Where DeleteRecords moved the log start (Kafka's `log-start-offset-checkpoint`, per
/// partition): records below it are gone even where a segment still holds them.
const LOG_START_FILE: &str = "log-start-offset";
/// Producer snapshots kept besides the newest.
const SNAPSHOTS_KEPT: usize = 2;

/// A batch whose header, CRC and record count were checked (outside any lock).
#[derive(Debug, Clone)]
pub struct ValidBatch {
    bytes: Bytes,
    header: BatchHeader,
}

impl ValidBatch {
    /// Checks one produced batch: exactly one v2 batch with a good CRC and record count.
    pub fn new(bytes: Bytes) -> Result<Self, BatchError> {
        let header = batch::validate_produced(&bytes)?;
        Ok(ValidBatch { bytes, header })
    }

    /// Checks one batch fetched from the leader: as [`ValidBatch::new`], but a compacted
    /// log's batch may hold fewer records than offsets, or none.
    pub fn replicated(bytes: Bytes) -> Result<Self, BatchError> {
        let header = batch::validate_replicated(&bytes)?;
        Ok(ValidBatch { bytes, header })
    }

    pub fn header(&self) -> &BatchHeader {
        &self.header
    }

    /// Checks the records inside (see [`strata_core::validate`]); a compressed batch is
    /// decompressed as a stream for it. CPU-bound: about the cost of one decompression.
    pub fn check_records(
        &self,
        rules: strata_core::validate::RecordRules,
    ) -> Result<(), strata_core::validate::RecordsError> {
        strata_core::codec::check_produced(&self.bytes, &self.header, rules)
    }

    /// This batch stamped with the broker's append time (`message.timestamp.type=
    /// LogAppendTime`): timestamp-type attribute set, max timestamp = `append_time_ms`, CRC
    /// recomputed. Copies the batch once.
    pub fn with_log_append_time(self, append_time_ms: i64) -> ValidBatch {
        let mut bytes = bytes::BytesMut::from(&self.bytes[..]);
        if !batch::set_log_append_time(&mut bytes, append_time_ms) {
            return self; // cannot happen: the batch was validated whole
        }
        let bytes = bytes.freeze();
        let header = BatchHeader::parse(&bytes).unwrap_or(self.header);
        ValidBatch { bytes, header }
    }

    /// This batch with its records re-encoded with `to` (a topic's `compression.type`):
    /// same offsets, producer and sequence, new codec, length and CRC. Decompresses and
    /// compresses the records once each.
    pub fn recompressed(
        &self,
        to: strata_core::batch::Compression,
        levels: strata_core::batch::Levels,
    ) -> Result<ValidBatch, String> {
        let bytes = strata_core::codec::recompress(&self.bytes, &self.header, to, levels)?;
        ValidBatch::new(Bytes::from(bytes)).map_err(|e| e.to_string())
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// Why an append was refused. Each maps to one Kafka error code at the listener.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    #[error("batch of {size} bytes exceeds max.message.bytes {max}")]
    TooLarge { size: usize, max: u32 },
    #[error("out of order sequence: expected {expected}, got {got}")]
    OutOfOrderSequence { expected: i32, got: i32 },
    #[error("producer epoch is older than the current epoch {current}")]
    InvalidProducerEpoch { current: i16 },
    #[error("a non-transactional batch from a producer whose transaction is open here")]
    InvalidTxnState,
    #[error(
        "this partition is not in the producer's open transaction (KIP-890 verification with \
         its transaction coordinator), or the transaction ended meanwhile: add the partition \
         to the transaction first (AddPartitionsToTxn); a late batch of an ended transaction \
         cannot reopen it"
    )]
    TxnNotVerified,
    #[error("{0}")]
    Unsupported(&'static str),
    #[error("replicated batch starts at offset {got}, but the log ends at {expected}")]
    NotContiguous { expected: u64, got: u64 },
    #[error("log i/o failed: {0}")]
    Io(#[from] io::Error),
}

/// Where an appended (or deduplicated) batch is in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    pub base_offset: u64,
    pub last_offset: u64,
    /// True when this was a retry of a batch already in the log.
    pub duplicate: bool,
    /// True when the caller should start a flush now.
    pub flush_now: bool,
}

/// Why a read could not be planned.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("offset {offset} is outside the log [{start}, {end}]")]
    OffsetOutOfRange { offset: u64, start: u64, end: u64 },
    #[error("log i/o failed: {0}")]
    Io(#[from] io::Error),
}

/// What opening a log found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct OpenReport {
    /// True when the previous close was clean and no CRC scan was needed.
    pub clean: bool,
    /// Segments whose every batch was CRC-checked.
    pub scanned_segments: usize,
    /// Where a corrupt or torn tail was cut, with the reason.
    pub truncated: Option<(u64, Corruption)>,
    /// Later segments removed because they followed a corrupt one.
    pub removed_segments: Vec<u64>,
}

/// Files to fsync so that the log is durable up to `end`. Runs on a blocking thread.
pub struct SyncWork {
    files: Vec<Arc<File>>,
    /// The log directory, held open: syncing never needs a new file descriptor, so running
    /// out of them (sockets flooding the process) cannot fail a partition's fsync.
    dir: Option<Arc<File>>,
    pub end: u64,
    recovery_point: Option<u64>,
    /// The log's cut count when this was handed out (see [`PartitionLog::cuts`]).
    cuts_seen: u64,
    cuts: Arc<std::sync::Mutex<u64>>,
}

impl SyncWork {
    /// fsyncs the files (and the directory when segments were created), then records the new
    /// recovery point. An error means the synced data cannot be trusted; failing to record the
    /// recovery point does not (see below).
    pub fn run(&self, log_dir: &Path) -> io::Result<()> {
        for f in &self.files {
            f.sync_data()?;
        }
        if let Some(dir) = &self.dir {
            dir.sync_all()?;
        }
        if let Some(rp) = self.recovery_point {
            // A truncation since this was handed out may have removed the segments this
            // point vouches for (and lowered the file): then it must not be written.
            let cuts = self.cuts.lock().unwrap_or_else(|e| e.into_inner());
            if *cuts == self.cuts_seen {
                // Only how much the next open checks depends on it: a write that fails (a
                // full disk) leaves the old file, whose lower point is still true, and the
                // data above it is synced all the same. The next roll records a new one.
                if let Err(e) =
                    write_atomically(log_dir, RECOVERY_POINT_FILE, rp.to_string().as_bytes())
                {
                    tracing::warn!(dir = %log_dir.display(), error = %e, "could not record the recovery point; the next start checks more of the log");
                }
            }
        }
        Ok(())
    }
}

/// A planned read of whole batches from one segment, done without the log's lock.
pub struct ReadPlan {
    file: Arc<File>,
    position: u64,
    /// Bytes of whole batches available from `position` when the plan was made.
    available: u64,
    /// Exclusive offset bound: batches ending at or past it are not returned.
    upper: u64,
    /// The log's cut count when the plan was made (see [`PartitionLog::cuts`]).
    cuts_seen: u64,
    cuts: Arc<std::sync::Mutex<u64>>,
}

impl ReadPlan {
    /// Reads up to `max_bytes` of whole batches below the plan's bound; the first batch is
    /// returned whole even when larger than `max_bytes`, so a consumer always progresses.
    /// May wait for the disk: call it on a blocking thread.
    pub fn read(&self, max_bytes: usize) -> io::Result<Bytes> {
        let read = self.read_with(max_bytes, |file, len, pos| {
            read_new_at(file, len, pos).map(Some)
        })?;
        Ok(read.expect("a blocking read always reads"))
    }

    /// [`Self::read`] from the page cache only, without waiting for the disk, so that it may
    /// run on a runtime thread: `Ok(None)` when some of the bytes are not in memory, or the
    /// read is longer than [`CACHED_READ_MAX`]; then `read` on a blocking thread does it.
    ///
    /// A follower or consumer at the end of the log reads what was just written, which is
    /// in the page cache; handing that read to the blocking pool cost two thread wake-ups
    /// per fetch, on the path of every replicated acknowledgement.
    pub fn read_cached(&self, max_bytes: usize) -> io::Result<Option<Bytes>> {
        self.read_with(max_bytes, |file, len, pos| {
            if len > CACHED_READ_MAX {
                return Ok(None);
            }
            let mut buf = vec![0; len];
            Ok(read_exact_cached(file, &mut buf, pos)?.then_some(buf))
        })
    }

    fn read_with(
        &self,
        max_bytes: usize,
        read: impl Fn(&File, usize, u64) -> io::Result<Option<Vec<u8>>>,
    ) -> io::Result<Option<Bytes>> {
        if self.available < HEADER_LEN as u64 {
            return Ok(Some(Bytes::new()));
        }
        let Some(header) = read(&self.file, HEADER_LEN, self.position)? else {
            return Ok(None);
        };
        let first = BatchHeader::parse(&header).map_err(bad_batch)?;
        if first.last_offset() as u64 >= self.upper {
            return Ok(Some(Bytes::new()));
        }
        let len = (max_bytes as u64)
            .max(first.total_len() as u64)
            .min(self.available);
        let Some(mut buf) = read(&self.file, len as usize, self.position)? else {
            return Ok(None);
        };
        let mut end = 0;
        for item in BatchIter::new(&buf) {
            let (h, range) = item.map_err(bad_batch)?;
            if h.last_offset() as u64 >= self.upper {
                break;
            }
            end = range.end;
        }
        buf.truncate(end);
        Ok(Some(Bytes::from(buf)))
    }

    /// What [`Self::read`] with `max_bytes` would return, as a place in the segment file
    /// found from the batch headers alone: for a plaintext fetch, which sends the bytes
    /// from the file (`sendfile`) instead of reading them and writing them again.
    ///
    /// `None` when reading is the better way: fewer than [`SPAN_MIN`] bytes, batches too
    /// small to walk their headers one by one (more than [`SPAN_MAX_BATCHES`] before the
    /// end), or some of the bytes not in the page cache (a `sendfile` runs on a runtime
    /// thread, which must not wait for the disk; the read that replaces it brings them in).
    pub fn span(&self, max_bytes: usize) -> io::Result<Option<FileSpan>> {
        if !SPANS.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(None);
        }
        // Checked before the walk: the walk's header reads start the kernel's read-ahead,
        // and pages still being read count as cached.
        let ahead = (max_bytes as u64).min(self.available);
        if ahead < SPAN_MIN as u64 || !all_cached(&self.file, self.position, ahead) {
            return Ok(None);
        }
        let mut header = [0u8; HEADER_LEN];
        let mut pos = self.position;
        let mut limit = None;
        let mut last_offset = None;
        let mut walked = 0;
        loop {
            let len = pos - self.position;
            if self.available < len + HEADER_LEN as u64 {
                break;
            }
            if walked == SPAN_MAX_BATCHES {
                return Ok(None);
            }
            walked += 1;
            self.file.read_exact_at(&mut header, pos)?;
            let h = BatchHeader::parse(&header).map_err(bad_batch)?;
            // (as `read`: the first batch whole, then whole batches within the larger of
            // `max_bytes` and it)
            let limit = *limit.get_or_insert(
                (max_bytes as u64)
                    .max(h.total_len() as u64)
                    .min(self.available),
            );
            if h.last_offset() as u64 >= self.upper || len + h.total_len() as u64 > limit {
                break;
            }
            pos += h.total_len() as u64;
            last_offset = Some(h.last_offset() as u64);
        }
        let len = pos - self.position;
        let Some(last_offset) = last_offset else {
            return Ok(None);
        };
        // (a first batch longer than `max_bytes` goes past what was checked)
        if (len as usize) < SPAN_MIN
            || (len > ahead && !all_cached(&self.file, self.position + ahead, len - ahead))
        {
            return Ok(None);
        }
        Ok(Some(FileSpan {
            file: self.file.clone(),
            position: self.position,
            len: len as usize,
            last_offset,
            cuts_seen: self.cuts_seen,
            cuts: self.cuts.clone(),
        }))
    }
}

/// Whole batches in a segment file, to be sent from the file: see [`ReadPlan::span`].
#[derive(Clone, Debug)]
pub struct FileSpan {
    pub file: Arc<File>,
    pub position: u64,
    pub len: usize,
    /// The offset of the last record in the span.
    pub last_offset: u64,
    /// The log's cut count when the span was planned.
    cuts_seen: u64,
    cuts: Arc<std::sync::Mutex<u64>>,
}

impl FileSpan {
    /// A span of `len` bytes at `position` of `file` that no log cuts (for tests).
    #[cfg(test)]
    pub fn of_file(file: Arc<File>, position: u64, len: usize) -> FileSpan {
        FileSpan {
            file,
            position,
            len,
            last_offset: 0,
            cuts_seen: 0,
            cuts: Arc::default(),
        }
    }

    /// The part of the span `skip` bytes on, `len` long.
    pub fn part(&self, skip: usize, len: usize) -> FileSpan {
        FileSpan {
            position: self.position + skip as u64,
            len,
            ..self.clone()
        }
    }

    /// Whether the log was cut (truncated, or a segment rewritten) since the span was
    /// planned: then its place in the file may hold other batches, and it must not be sent.
    pub fn cut_since(&self) -> bool {
        *self.cuts.lock().unwrap_or_else(|e| e.into_inner()) != self.cuts_seen
    }

    /// Whether the page cache still holds the `len` bytes `skip` bytes into the span (a
    /// `sendfile` of them does not wait for the disk).
    pub fn cached(&self, skip: usize, len: usize) -> bool {
        all_cached(&self.file, self.position + skip as u64, len as u64)
    }

    /// Stops spans for good (the kernel refused to `sendfile` from a segment file).
    pub fn stop_spans() {
        SPANS.store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// The span's bytes from `skip` on, read (for a connection that cannot send from a file).
    /// May wait for the disk.
    pub fn read_from(&self, skip: usize) -> io::Result<Vec<u8>> {
        let skip = skip.min(self.len);
        read_new_at(&self.file, self.len - skip, self.position + skip as u64)
    }
}

/// Spans shorter than this are read: a read and a write of a few KiB cost less than the
/// header walk and the page-cache check.
pub const SPAN_MIN: usize = 64 << 10;

/// The most batch headers [`ReadPlan::span`] reads one by one; a response of many smaller
/// batches is read instead.
pub const SPAN_MAX_BATCHES: usize = 256;

/// Cleared for good when the kernel cannot tell which pages of a file are cached
/// (`cachestat`, Linux 6.5) or refuses to `sendfile` from a segment file: then every fetch
/// reads its records, as before.
static SPANS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Whether every page of `len` bytes at `position` of `file` is in the page cache
/// (`cachestat(2)`). `false` on kernels without it (and from then on, no spans).
fn all_cached(file: &File, position: u64, len: u64) -> bool {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        use std::os::fd::AsRawFd;
        // (x86_64 and aarch64 alike)
        const SYS_CACHESTAT: libc::c_long = 451;
        #[repr(C)]
        struct Range {
            off: u64,
            len: u64,
        }
        #[repr(C)]
        #[derive(Default)]
        struct Stat {
            nr_cache: u64,
            nr_dirty: u64,
            nr_writeback: u64,
            nr_evicted: u64,
            nr_recently_evicted: u64,
        }
        let range = Range { off: position, len };
        let mut stat = Stat::default();
        // SAFETY: cachestat reads `range` and writes `stat`, both live and laid out as
        // the kernel's `struct cachestat_range` and `struct cachestat`.
        let done = unsafe {
            libc::syscall(
                SYS_CACHESTAT,
                file.as_raw_fd(),
                &range as *const Range,
                &mut stat as *mut Stat,
                0 as libc::c_uint,
            )
        };
        if done != 0 {
            let e = io::Error::last_os_error();
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOSYS | libc::EPERM | libc::EOPNOTSUPP)
            ) {
                SPANS.store(false, std::sync::atomic::Ordering::Relaxed);
                tracing::info!(error = %e, "this kernel does not say which pages of a file are cached (cachestat); fetches read their records instead of sending them from the file");
            }
            return false;
        }
        let page = rustix::param::page_size() as u64;
        let pages = (position + len).div_ceil(page) - position / page;
        stat.nr_cache >= pages
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = (file, position, len);
        SPANS.store(false, std::sync::atomic::Ordering::Relaxed);
        false
    }
}

/// The longest read [`ReadPlan::read_cached`] tries on a runtime thread (it zeroes its buffer
/// first, and copies while the thread serves no other task); longer reads are catch-up reads,
/// for which a thread hop costs little beside the copy.
pub const CACHED_READ_MAX: usize = 256 << 10;

/// Cleared for good the first time the kernel or the filesystem refuses `RWF_NOWAIT` reads:
/// then every read goes to the blocking pool, as before.
static NOWAIT_READS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Fills `buf` from `pos` if the page cache holds all of it (`preadv2` with `RWF_NOWAIT`);
/// `false` when some of it would have to come from the disk.
fn read_exact_cached(file: &File, buf: &mut [u8], pos: u64) -> io::Result<bool> {
    use rustix::io::{Errno, ReadWriteFlags};
    use std::sync::atomic::Ordering::Relaxed;
    if !NOWAIT_READS.load(Relaxed) {
        return Ok(false);
    }
    let mut done = 0;
    while done < buf.len() {
        let mut slice = [io::IoSliceMut::new(&mut buf[done..])];
        match rustix::io::preadv2(file, &mut slice, pos + done as u64, ReadWriteFlags::NOWAIT) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            // a short read returns what is cached; the next call tells whether the rest is
            Ok(n) => done += n,
            Err(Errno::INTR) => {}
            Err(Errno::AGAIN) => return Ok(false),
            Err(Errno::OPNOTSUPP | Errno::INVAL | Errno::NOSYS) => {
                NOWAIT_READS.store(false, Relaxed);
                tracing::info!("this kernel or filesystem does not read without waiting (RWF_NOWAIT); every segment read goes to the blocking pool");
                return Ok(false);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

/// Reads `len` bytes at `pos` into a new buffer without zeroing it first (zeroing an 8 MiB
/// fetch buffer was a fifth of a broker's CPU while it served a consumer from page cache).
fn read_new_at(file: &File, len: usize, pos: u64) -> io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(len);
    while buf.len() < len {
        let at = pos + buf.len() as u64;
        // reads into the spare capacity and extends the vector by what was read
        match rustix::io::pread(file, rustix::buffer::spare_capacity(&mut buf), at) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    buf.truncate(len);
    Ok(buf)
}

fn bad_batch(e: BatchError) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("bad batch in segment: {e}"),
    )
}

/// The log of one partition.
pub struct PartitionLog {
    dir: PathBuf,
    /// `dir`, open for fsyncs (see [`SyncWork`]).
    dir_handle: Arc<File>,
    config: LogConfig,
    segments: BTreeMap<u64, Segment>,
    producers: ProducerStateTable,
    leader_epoch: i32,
    /// Sealed segments' files not yet fsynced.
    unsynced_sealed: Vec<Arc<File>>,
    dir_dirty: bool,
    /// Offset up to which a sync has been handed out.
    sync_handed_out: u64,
    pending_recovery_point: Option<u64>,
    /// Counts truncations; held while the `recovery-point` file is written, so a cut and an
    /// in-flight sync's write of that file are ordered.
    cuts: Arc<std::sync::Mutex<u64>>,
    messages_since_flush: u64,
    /// Set by [`PartitionLog::close`]; a closed log refuses appends.
    closed: bool,
    /// Which leader epoch wrote which offsets (`leader-epoch-checkpoint`).
    epochs: LeaderEpochCache,
    /// Records below this offset were deleted (DeleteRecords), whether or not a segment
    /// still holds their bytes (`log-start-offset`; 0 when never set).
    deleted_below: u64,
    /// Ended (and aborted) transactions.
    txns: txn::TxnIndex,
    /// KIP-890: producers whose first transactional batch here is being verified with their
    /// transaction coordinator, with the guard handed out. A marker (or the transaction's
    /// first batch) removes the entry, so a verification that raced a marker no longer
    /// lets its batch in.
    verifying: HashMap<i64, u64>,
    next_guard: u64,
}

/// What KIP-890 verification found before a transactional batch was offered for append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnVerified {
    /// The producer's transaction was already open here: it must still be.
    AlreadyOpen,
    /// The coordinator said this partition is in the producer's open transaction; valid
    /// while the guard handed out by [`PartitionLog::txn_guard`] stands.
    Guard(u64),
}

impl PartitionLog {
    /// Opens (creating if needed) the log in `dir`, recovering from an unclean stop.
    pub fn open(dir: &Path, config: LogConfig, now_ms: i64) -> io::Result<(Self, OpenReport)> {
        strata_core::private_fs::create_dir_all(dir)?;
        let mut report = OpenReport::default();
        let mut bases = Vec::new();
        for entry in fs::read_dir(dir)? {
            let name = entry?.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.ends_with(".tmp") {
                remove_if_exists(&dir.join(name))?;
            } else if let Some((base, LOG_SUFFIX)) = fmt::parse_file_name(name) {
                bases.push(base);
            }
        }
        bases.sort_unstable();
        let clean_end = read_number(&dir.join(CLEAN_SHUTDOWN_FILE));
        let recovery_point = read_number(&dir.join(RECOVERY_POINT_FILE)).unwrap_or(0);
        report.clean = clean_end.is_some();
        let interval = config.index_interval_bytes;
        let mut segments = BTreeMap::new();
        for (i, &base) in bases.iter().enumerate() {
            let next_base = bases.get(i + 1).copied();
            let trusted = clean_end.is_some() || next_base.is_some_and(|n| n <= recovery_point);
            if trusted {
                segments.insert(base, Segment::open_trusted(dir, base, now_ms, interval)?);
                continue;
            }
            let (seg, corruption) = Segment::recover(dir, base, now_ms, interval)?;
            report.scanned_segments += 1;
            segments.insert(base, seg);
            if let Some(c) = corruption {
                tracing::warn!(dir = %dir.display(), segment = base, position = c.position, reason = %c.reason, "cut corrupt log tail");
                report.truncated = Some((base, c));
                for &later in &bases[i + 1..] {
                    let doomed = Segment::open_trusted(dir, later, now_ms, interval);
                    match doomed {
                        Ok(s) => s.delete_files()?,
                        Err(_) => remove_if_exists(&dir.join(fmt::file_name(later, LOG_SUFFIX)))?,
                    }
                    report.removed_segments.push(later);
                }
                break;
            }
        }
        if let Some(end) = clean_end {
            let actual = segments.values().next_back().map_or(0, |s| s.next_offset);
            if end != actual {
                tracing::warn!(dir = %dir.display(), marker = end, actual, "clean-shutdown marker disagrees with the log end");
            }
        }
        if segments.is_empty() {
            segments.insert(0, Segment::create(dir, 0, now_ms, interval)?);
        }
        // A recovery point past the last segment's base was left by a truncation that a crash
        // interrupted: lower it, or that segment, once rewritten and rolled, would be trusted.
        let last_base = *segments.keys().next_back().expect("a segment");
        if recovery_point > last_base {
            write_atomically(dir, RECOVERY_POINT_FILE, last_base.to_string().as_bytes())?;
        }
        let mut log = PartitionLog {
            dir: dir.to_path_buf(),
            dir_handle: Arc::new(File::open(dir)?),
            config,
            segments,
            producers: ProducerStateTable::default(),
            leader_epoch: 0,
            unsynced_sealed: Vec::new(),
            dir_dirty: true,
            sync_handed_out: 0,
            pending_recovery_point: None,
            cuts: Arc::default(),
            messages_since_flush: 0,
            closed: false,
            epochs: LeaderEpochCache::default(),
            deleted_below: 0,
            txns: txn::TxnIndex::open(dir)?,
            verifying: HashMap::new(),
            next_guard: 0,
        };
        log.sync_handed_out = log.end_offset();
        // A deletion point past the recovered end (the tail it covered was lost with the
        // page cache) can only be the end now.
        log.deleted_below = read_number(&dir.join(LOG_START_FILE))
            .unwrap_or(0)
            .min(log.end_offset());
        // Snapshots past the recovered end describe a tail that was lost (or cut by a
        // truncation the crash interrupted); loading one after the log grows back past it
        // would resurrect that history's producer state.
        log.remove_snapshots_from(log.end_offset() + 1)?;
        log.rebuild_producer_state(now_ms)?;
        log.load_epochs()?;
        if !report.clean {
            // The recovered tail may be in the page cache only (the process died, the machine
            // did not): make it durable before anyone counts it, since a replica reports its
            // log end as durable to the leader.
            for seg in log.segments.range(recovery_point..).map(|(_, s)| s) {
                seg.file.sync_data()?;
            }
            File::open(dir)?.sync_all()?;
        }
        if report.clean {
            remove_if_exists(&dir.join(CLEAN_SHUTDOWN_FILE))?;
            File::open(dir)?.sync_all()?;
        }
        Ok((log, report))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn config(&self) -> &LogConfig {
        &self.config
    }

    pub fn set_config(&mut self, config: LogConfig) {
        self.config = config;
    }

    /// This replica starts leading at `epoch`: appends are stamped with it, and the epoch
    /// history records that it starts at the log end now, before any record of it is
    /// written (as Kafka does). Without the entry, a follower whose latest epoch is older
    /// than every epoch this leader knows would get no answer to OffsetForLeaderEpoch and
    /// fall back to its high watermark, keeping records this leader does not have.
    pub fn begin_leader_epoch(&mut self, epoch: i32) -> io::Result<()> {
        self.leader_epoch = epoch;
        if self.epochs.latest().is_none_or(|l| l.epoch < epoch) {
            self.epochs.assign(epoch, self.end_offset());
            self.persist_epochs()?;
        }
        Ok(())
    }

    /// First offset still in the log: the oldest segment's base, or where DeleteRecords
    /// moved the start inside it.
    pub fn start_offset(&self) -> u64 {
        self.segments
            .values()
            .next()
            .map_or(0, |s| s.base)
            .max(self.deleted_below)
    }

    /// Where DeleteRecords last moved the log start (0 when never): no tier serves records
    /// below it, while [`PartitionLog::start_offset`] is only where the local log starts.
    pub fn deleted_below(&self) -> u64 {
        self.deleted_below
    }

    /// DeleteRecords: records below `offset` (at most the log end) are gone from now on.
    /// The point is made durable first, then the segments wholly below it are deleted;
    /// the one holding it stays and is read from the new start. A point at or below the
    /// current one changes nothing. Returns the log start.
    pub fn delete_records_before(&mut self, offset: u64) -> io::Result<u64> {
        let offset = offset.min(self.end_offset());
        if offset <= self.deleted_below {
            return Ok(self.start_offset());
        }
        write_atomically(&self.dir, LOG_START_FILE, offset.to_string().as_bytes())?;
        self.deleted_below = offset;
        let deleted = self.delete_oldest_while(|_, next_base| next_base <= offset)?;
        if deleted.is_empty() {
            // (delete_oldest_while trims these when it deletes a segment.)
            self.prune_snapshots()?;
            self.epochs.truncate_from_start(self.start_offset());
            self.persist_epochs()?;
        }
        tracing::info!(dir = %self.dir.display(), log_start = self.start_offset(), segments = deleted.len(), "deleted records");
        Ok(self.start_offset())
    }

    /// Keeps the DeleteRecords point inside the log after it was cut to `end`.
    fn clamp_deleted_below(&mut self, end: u64) -> io::Result<()> {
        if self.deleted_below > end {
            self.deleted_below = end;
            write_atomically(&self.dir, LOG_START_FILE, end.to_string().as_bytes())?;
        }
        Ok(())
    }

    /// Offset the next appended record gets (log end offset).
    pub fn end_offset(&self) -> u64 {
        self.active().next_offset
    }

    /// Total bytes of all segments.
    pub fn size_bytes(&self) -> u64 {
        self.segments.values().map(|s| s.size).sum()
    }

    /// Bytes of the segments starting at or after `offset`.
    pub fn size_from(&self, offset: u64) -> u64 {
        self.segments.range(offset..).map(|(_, s)| s.size).sum()
    }

    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    fn active(&self) -> &Segment {
        self.segments
            .values()
            .next_back()
            .expect("a log always has an active segment")
    }

    fn active_mut(&mut self) -> &mut Segment {
        self.segments
            .values_mut()
            .next_back()
            .expect("a log always has an active segment")
    }

    /// Appends a validated batch: checks size and producer sequence, stamps the base offset
    /// and leader epoch, writes it. Returns where it landed; a retry of a recent batch returns
    /// the original offsets without writing.
    pub fn append(&mut self, batch: &ValidBatch, now_ms: i64) -> Result<Appended, AppendError> {
        self.append_checked(batch, true, None, now_ms)
    }

    /// [`PartitionLog::append`] of a producer's batch that went through KIP-890
    /// verification: a transactional batch that would open a transaction here is taken
    /// only with a guard that still stands (no marker for its producer since).
    pub fn append_verified(
        &mut self,
        batch: &ValidBatch,
        verified: TxnVerified,
        now_ms: i64,
    ) -> Result<Appended, AppendError> {
        self.append_checked(batch, true, Some(verified), now_ms)
    }

    /// Before a transactional batch of `producer_id` at `epoch` is appended: `None` when
    /// its transaction is open here already (no verification needed), else the guard to
    /// verify under (one per producer until a marker or its first batch lands).
    pub fn txn_guard(&mut self, producer_id: i64, epoch: i16) -> Option<u64> {
        if self.producers.txn_open_at(producer_id, epoch) {
            return None;
        }
        let next = &mut self.next_guard;
        Some(*self.verifying.entry(producer_id).or_insert_with(|| {
            *next += 1;
            *next
        }))
    }

    /// [`PartitionLog::append`] for a coordinator's own batch (an internal topic's records,
    /// a transactional offset commit): no producer sequence to check (it has none, as in
    /// Kafka's coordinator writes), but an older producer epoch is still refused.
    pub fn append_unsequenced(
        &mut self,
        batch: &ValidBatch,
        now_ms: i64,
    ) -> Result<Appended, AppendError> {
        self.append_checked(batch, false, None, now_ms)
    }

    fn append_checked(
        &mut self,
        batch: &ValidBatch,
        sequenced: bool,
        verified: Option<TxnVerified>,
        now_ms: i64,
    ) -> Result<Appended, AppendError> {
        let h = batch.header;
        if self.closed {
            return Err(AppendError::Io(io::Error::other(
                "the log is closed (broker shutting down)",
            )));
        }
        if batch.len() > self.config.max_message_bytes as usize {
            return Err(AppendError::TooLarge {
                size: batch.len(),
                max: self.config.max_message_bytes,
            });
        }
        if h.is_control() {
            return Err(AppendError::Unsupported(
                "producers may not write control batches",
            ));
        }
        if !sequenced {
            if let Err(current) = self.producers.check_epoch(h.producer_id, h.producer_epoch) {
                return Err(AppendError::InvalidProducerEpoch { current });
            }
            return self.write_stamped(&batch.bytes, h, None, now_ms);
        }
        match self.producers.check(&h) {
            SequenceCheck::Append => {}
            SequenceCheck::Duplicate(w) => {
                return Ok(Appended {
                    base_offset: w.base_offset,
                    last_offset: w.last_offset,
                    duplicate: true,
                    flush_now: false,
                })
            }
            SequenceCheck::FencedEpoch { current } => {
                return Err(AppendError::InvalidProducerEpoch { current })
            }
            SequenceCheck::OutOfOrder { expected, got } => {
                return Err(AppendError::OutOfOrderSequence { expected, got })
            }
            SequenceCheck::InTransaction => return Err(AppendError::InvalidTxnState),
        }
        if let Some(v) = verified {
            if h.is_transactional() && !self.producers.txn_open_at(h.producer_id, h.producer_epoch)
            {
                // it would open a transaction here: only under a guard that still stands
                let stands = match v {
                    TxnVerified::AlreadyOpen => false,
                    TxnVerified::Guard(g) => self.verifying.get(&h.producer_id) == Some(&g),
                };
                if !stands {
                    return Err(AppendError::TxnNotVerified);
                }
            }
        }
        self.write_stamped(&batch.bytes, h, None, now_ms)
    }

    /// A transaction coordinator's marker: ends `producer_id`'s transaction here (if one
    /// is open) with a commit or an abort, written as leader like a produced batch.
    /// Refused when the producer has written here at a newer epoch than the marker's.
    pub fn append_marker(
        &mut self,
        producer_id: i64,
        producer_epoch: i16,
        marker: Marker,
        now_ms: i64,
    ) -> Result<Appended, AppendError> {
        if self.closed {
            return Err(AppendError::Io(io::Error::other(
                "the log is closed (broker shutting down)",
            )));
        }
        if let Err(current) = self.producers.check_epoch(producer_id, producer_epoch) {
            return Err(AppendError::InvalidProducerEpoch { current });
        }
        let bytes = batch::marker::build(producer_id, producer_epoch, marker, now_ms);
        let h = BatchHeader::parse(&bytes).expect("a marker batch parses");
        self.write_stamped(&bytes, h, Some(marker), now_ms)
    }

    /// Stamps a checked batch with the log end and the leader epoch, writes it and records
    /// its producer (and transaction) state.
    fn write_stamped(
        &mut self,
        bytes: &[u8],
        h: BatchHeader,
        marker: Option<Marker>,
        now_ms: i64,
    ) -> Result<Appended, AppendError> {
        self.maybe_roll(bytes.len() as u64, now_ms)?;
        let base = self.end_offset();
        let epoch = self.leader_epoch;
        if self.epochs.latest().is_none_or(|l| l.epoch < epoch) {
            // Recorded before the batch is written, so the checkpoint always covers every
            // epoch in the log (an entry past the end is trimmed at the next open).
            self.epochs.assign(epoch, base);
            self.persist_epochs()?;
        }
        let prefix = batch::stamped_prefix(bytes, base as i64, epoch);
        let mut stamped = h;
        stamped.base_offset = base as i64;
        stamped.leader_epoch = epoch;
        self.active_mut().append(&prefix, bytes, &stamped)?;
        self.record_batch(&stamped, marker, now_ms)?;
        self.messages_since_flush += h.record_count as u64;
        let flush_now = match self.config.flush {
            FlushPolicy::EveryAppend => true,
            FlushPolicy::EveryMessages(n) => self.messages_since_flush >= n,
            FlushPolicy::Os => !self.unsynced_sealed.is_empty(),
        };
        Ok(Appended {
            base_offset: base,
            last_offset: stamped.last_offset() as u64,
            duplicate: false,
            flush_now,
        })
    }

    /// Appends a batch copied from the leader as it is: its base offset must be at or past
    /// this log's end (past it where the leader's compaction removed the records between,
    /// as Kafka's followers allow), and its offsets and leader epoch are kept (a follower
    /// never stamps).
    pub fn append_replicated(
        &mut self,
        batch: &ValidBatch,
        now_ms: i64,
    ) -> Result<Appended, AppendError> {
        let h = batch.header;
        if self.closed {
            return Err(AppendError::Io(io::Error::other("the log is closed")));
        }
        let end = self.end_offset();
        if h.base_offset < 0 || (h.base_offset as u64) < end {
            return Err(AppendError::NotContiguous {
                expected: end,
                got: h.base_offset.max(0) as u64,
            });
        }
        self.maybe_roll(batch.len() as u64, now_ms)?;
        if self
            .epochs
            .latest()
            .is_none_or(|l| l.epoch < h.leader_epoch)
        {
            self.epochs.assign(h.leader_epoch, h.base_offset as u64);
            self.persist_epochs()?;
        }
        let mut prefix = [0u8; batch::STAMP_LEN];
        prefix.copy_from_slice(&batch.bytes[..batch::STAMP_LEN]);
        self.active_mut().append(&prefix, &batch.bytes, &h)?;
        let marker = h
            .is_control()
            .then(|| batch::marker::parse(&batch.bytes))
            .flatten();
        self.record_batch(&h, marker, now_ms)?;
        self.messages_since_flush += h.record_count as u64;
        Ok(Appended {
            base_offset: h.base_offset as u64,
            last_offset: h.last_offset() as u64,
            duplicate: false,
            flush_now: self.config.flush != FlushPolicy::Os,
        })
    }

    /// Removes everything at and after `offset` (a follower truncating to where it agrees
    /// with the leader). An offset below the log start empties the log, which then starts at
    /// `offset`.
    pub fn truncate_to(&mut self, offset: u64, now_ms: i64) -> io::Result<()> {
        if offset >= self.end_offset() {
            // Nothing to cut; but an epoch that starts here holds no record (a leadership
            // that wrote nothing), and a follower drops it: its truncation rounds would
            // otherwise ask the leader about it forever.
            let before = self.epochs.entries().len();
            self.epochs.truncate_from_end(offset);
            if self.epochs.entries().len() != before {
                self.persist_epochs()?;
            }
            return Ok(());
        }
        tracing::info!(dir = %self.dir.display(), from = self.end_offset(), to = offset, "truncating log");
        // Before any file changes: a crash in the middle must not leave a recovery point that
        // vouches for the segment being rewritten.
        let holder = self
            .segments
            .range(..=offset)
            .next_back()
            .map_or(offset, |(base, _)| *base);
        self.lower_recovery_point(holder)?;
        // Segments starting after `offset` go whole; the one holding it is cut.
        for (_, seg) in self.segments.split_off(&(offset + 1)) {
            seg.delete_files()?;
        }
        if let Some((_, seg)) = self.segments.range_mut(..=offset).next_back() {
            seg.truncate_to_offset(offset)?;
        }
        if self.segments.is_empty() {
            let seg = Segment::create(&self.dir, offset, now_ms, self.config.index_interval_bytes)?;
            self.segments.insert(offset, seg);
        }
        self.clamp_deleted_below(offset)?;
        self.clamp_cleaned_to(offset)?;
        // The next sync covers the cut files and the directory, whatever sync was in flight
        // across the cut (the flusher discards that one).
        self.dir_dirty = true;
        self.epochs.truncate_from_end(offset);
        self.persist_epochs()?;
        // Producer state as of the cut: from the newest snapshot not past it plus the log
        // up to it. Forgetting only the batches past the cut would forget producers whose
        // retained batches all lie there, and a retry of their last batch below the cut would
        // then be appended twice; snapshots past the cut describe a history that is gone.
        self.remove_snapshots_from(self.end_offset() + 1)?;
        self.producers = ProducerStateTable::default();
        self.rebuild_producer_state(now_ms)?;
        self.sync_handed_out = self.sync_handed_out.min(self.end_offset());
        self.dir_handle.sync_all()
    }

    /// Removes every segment and restarts the log empty at `offset` (a follower whose next
    /// offset the leader no longer has: it starts over at the leader's log start).
    pub fn reset_to(&mut self, offset: u64, now_ms: i64) -> io::Result<()> {
        tracing::info!(dir = %self.dir.display(), from = self.end_offset(), to = offset, "emptying log to restart at the leader's log start");
        for (_, seg) in std::mem::take(&mut self.segments) {
            seg.delete_files()?;
        }
        let seg = Segment::create(&self.dir, offset, now_ms, self.config.index_interval_bytes)?;
        self.segments.insert(offset, seg);
        self.lower_recovery_point(offset)?;
        // Not a DeleteRecords point: what lies below `offset` may still be in the cold tier
        // (the leader's local retention removed it after tiering). The leader's own point
        // arrives with its fetch responses.
        self.clamp_deleted_below(offset)?;
        self.clamp_cleaned_to(offset)?;
        self.producers = ProducerStateTable::default();
        self.txns.forget_from(0)?;
        self.epochs.truncate_from_end(0);
        self.persist_epochs()?;
        self.unsynced_sealed.clear();
        self.sync_handed_out = offset;
        self.pending_recovery_point = None;
        self.remove_snapshots_from(0)?;
        self.dir_handle.sync_all()
    }

    /// After a cut: no segment at or past `base` (the segment now being rewritten) may be
    /// trusted by the next open without a CRC scan, whatever syncs recorded before the cut.
    fn lower_recovery_point(&mut self, base: u64) -> io::Result<()> {
        let mut cuts = self.cuts.lock().unwrap_or_else(|e| e.into_inner());
        *cuts += 1;
        self.pending_recovery_point = self.pending_recovery_point.filter(|rp| *rp <= base);
        let path = self.dir.join(RECOVERY_POINT_FILE);
        if read_number(&path).is_some_and(|rp| rp > base) {
            write_atomically(&self.dir, RECOVERY_POINT_FILE, base.to_string().as_bytes())?;
        }
        Ok(())
    }

    fn maybe_roll(&mut self, incoming: u64, now_ms: i64) -> io::Result<()> {
        let active = self.active();
        let too_big = active.size + incoming > self.config.segment_bytes;
        let too_old =
            now_ms.saturating_sub(active.created_ms) as u128 >= self.config.segment_ms.as_millis();
        // Relative offsets and positions are u32 in the indexes.
        let too_far = active.size + incoming > u64::from(u32::MAX)
            || active.next_offset - active.base > u64::from(u32::MAX) / 2;
        if !active.is_empty() && (too_big || too_old || too_far) {
            self.roll(now_ms)?;
        }
        Ok(())
    }

    /// Records a batch now in the log (stamped) in the producer and transaction state.
    fn record_batch(
        &mut self,
        h: &BatchHeader,
        marker: Option<Marker>,
        now_ms: i64,
    ) -> io::Result<()> {
        let ended = match marker {
            Some(_) => self.producers.open_txn(h.producer_id),
            None => None,
        };
        if marker.is_some() || h.is_transactional() {
            self.verifying.remove(&h.producer_id);
        }
        self.producers.record(h, now_ms);
        if let (Some(m), Some(first)) = (marker, ended) {
            self.txns
                .ended(h.producer_id, first, h.base_offset as u64, m.commit)?;
        }
        Ok(())
    }

    /// The last stable offset at high watermark `hw` (read_committed consumers read below
    /// it; see [`txn`]).
    pub fn last_stable_offset(&mut self, hw: u64) -> u64 {
        self.txns.last_stable(self.producers.first_open_txn(), hw)
    }

    /// The aborted transactions a read_committed fetch of `[from, to)` must report.
    pub fn aborted_between(&self, from: u64, to: u64) -> Vec<txn::AbortedTxn> {
        self.txns.aborted_between(from, to)
    }

    /// The aborted transactions whose markers lie in `[from, to)`.
    pub fn aborted_in(&self, from: u64, to: u64) -> Vec<txn::AbortedTxn> {
        self.txns.aborted_in(from, to)
    }

    /// The transactions open here: (first offset, producer id), oldest first.
    pub fn open_txns(&self) -> Vec<(u64, i64)> {
        self.producers.open_txns().collect()
    }

    /// The idempotent producers this partition remembers (DescribeProducers).
    pub fn active_producers(&self) -> Vec<producer_state::ActiveProducer> {
        self.producers.active()
    }

    /// Forgets the producer ids silent for `after_ms` (KIP-854); the next snapshot leaves
    /// them out. Returns how many went and how many are left.
    pub fn expire_producers(&mut self, now_ms: i64, after_ms: i64) -> (usize, usize) {
        let gone = self.producers.expire(now_ms, after_ms);
        let producers = &self.producers;
        self.verifying.retain(|pid, _| producers.knows(*pid));
        (gone, self.producers.len())
    }

    /// Seals the active segment and starts a new one at the log end offset.
    pub fn roll(&mut self, now_ms: i64) -> io::Result<()> {
        let base = self.end_offset();
        let interval = self.config.index_interval_bytes;
        let sealed = self.active_mut();
        sealed.write_indexes()?;
        let sealed_file = sealed.file.clone();
        // The snapshot vouches for everything below it, aborted transactions included.
        self.txns.sync()?;
        let snapshot = self.producers.encode_snapshot(base);
        write_file(
            &self.dir.join(fmt::file_name(base, SNAPSHOT_SUFFIX)),
            &snapshot,
        )?;
        let seg = Segment::create(&self.dir, base, now_ms, interval)?;
        self.segments.insert(base, seg);
        self.unsynced_sealed.push(sealed_file);
        self.dir_dirty = true;
        self.pending_recovery_point = Some(base);
        self.prune_snapshots()?;
        tracing::debug!(dir = %self.dir.display(), base, "rolled segment");
        Ok(())
    }

    /// What to fsync for the log to be durable up to its current end; `None` if nothing new.
    pub fn take_sync_work(&mut self) -> Option<SyncWork> {
        let end = self.end_offset();
        if self.closed {
            return None;
        }
        if end == self.sync_handed_out && self.unsynced_sealed.is_empty() && !self.dir_dirty {
            return None;
        }
        let mut files = std::mem::take(&mut self.unsynced_sealed);
        files.push(self.active().file.clone());
        self.sync_handed_out = end;
        self.messages_since_flush = 0;
        Some(SyncWork {
            files,
            dir: std::mem::take(&mut self.dir_dirty).then(|| self.dir_handle.clone()),
            end,
            recovery_point: self.pending_recovery_point.take(),
            cuts_seen: *self.cuts.lock().unwrap_or_else(|e| e.into_inner()),
            cuts: self.cuts.clone(),
        })
    }

    /// Plans a read of the batch holding `offset` and those after it in the same segment,
    /// bounded by `upper` (exclusive; the high watermark for consumers). `Ok(None)` when
    /// there is nothing below `upper` at `offset` yet.
    pub fn plan_read(&self, offset: u64, upper: u64) -> Result<Option<ReadPlan>, ReadError> {
        let (start, end) = (self.start_offset(), self.end_offset());
        if offset < start || offset > end {
            return Err(ReadError::OffsetOutOfRange { offset, start, end });
        }
        if offset >= upper.min(end) {
            return Ok(None);
        }
        for seg in self
            .segments
            .range(..=offset)
            .next_back()
            .into_iter()
            .map(|(_, s)| s)
            .chain(self.segments.range(offset + 1..).map(|(_, s)| s))
        {
            if let Some(position) = seg.position_of(offset.max(seg.base))? {
                return Ok(Some(ReadPlan {
                    file: seg.file.clone(),
                    position,
                    available: seg.size - position,
                    upper,
                    cuts_seen: *self.cuts.lock().unwrap_or_else(|e| e.into_inner()),
                    cuts: self.cuts.clone(),
                }));
            }
        }
        Ok(None)
    }

    /// First offset with a record timestamp at or after `ts`, and that record's timestamp;
    /// `None` if every record is older.
    pub fn offset_for_timestamp(&self, ts: i64) -> io::Result<Option<(u64, i64)>> {
        for seg in self.segments.values() {
            if let Some(o) = seg.offset_for_timestamp(ts)? {
                return Ok(Some(o));
            }
        }
        Ok(None)
    }

    /// Largest record timestamp in the log and the offset of its batch (ListOffsets -3).
    pub fn max_timestamp(&self) -> Option<(i64, u64)> {
        let seg = self
            .segments
            .values()
            .filter(|s| s.max_timestamp.is_some())
            .max_by_key(|s| s.max_timestamp)?;
        let ts = seg.max_timestamp?;
        let (offset, _) = seg.offset_for_timestamp(ts).ok().flatten()?;
        Some((ts, offset))
    }

    /// The sealed segments (every one but the active), oldest first.
    pub fn sealed_segments(&self) -> Vec<strata_cold::upload::SealedSegment> {
        let bases: Vec<u64> = self.segments.keys().copied().collect();
        let epochs: Vec<(i32, u64)> = self
            .epochs
            .entries()
            .iter()
            .map(|e| (e.epoch, e.start_offset))
            .collect();
        bases
            .windows(2)
            .map(|w| {
                let snapshot = self.dir.join(fmt::file_name(w[0], SNAPSHOT_SUFFIX));
                strata_cold::upload::SealedSegment {
                    base_offset: w[0],
                    end_offset: w[1],
                    log: self.dir.join(fmt::file_name(w[0], LOG_SUFFIX)),
                    producer_snapshot: snapshot.exists().then_some(snapshot),
                    epochs: epochs.clone(),
                    aborted: self.txns.aborted_in(w[0], w[1]),
                }
            })
            .collect()
    }

    /// Deletes sealed segments past `retention.ms` or beyond `retention.bytes`, oldest first.
    /// Returns the base offsets deleted. The active segment is never deleted.
    ///
    /// With `remote.storage.enable`, `local.retention.*` applies instead, and only to
    /// segments wholly below `tiered_end` (the end of what the cold tier's manifest holds;
    /// `None` when unknown): nothing is deleted that is not safely uploaded.
    pub fn apply_retention(
        &mut self,
        now_ms: i64,
        tiered_end: Option<u64>,
    ) -> io::Result<Vec<u64>> {
        let mut total = self.size_bytes();
        let remote = self.config.remote_storage;
        let (retention_ms, retention_bytes) = if remote {
            (
                self.config.local_retention_ms,
                self.config.local_retention_bytes,
            )
        } else {
            (self.config.retention_ms, self.config.retention_bytes)
        };
        let deleted = self.delete_oldest_while(|oldest, next_base| {
            if remote && tiered_end.is_none_or(|end| next_base > end) {
                return false;
            }
            let expired_by_time = retention_ms.is_some_and(|r| {
                let newest = oldest.max_timestamp.unwrap_or(oldest.created_ms);
                // (A timestamp in the future is young, not expired.)
                i128::from(now_ms) - i128::from(newest) > r.as_millis() as i128
            });
            let expired_by_size = retention_bytes.is_some_and(|limit| total - oldest.size >= limit);
            if expired_by_time || expired_by_size {
                total -= oldest.size;
                return true;
            }
            false
        })?;
        if !deleted.is_empty() {
            tracing::info!(dir = %self.dir.display(), segments = deleted.len(), log_start = self.start_offset(), "retention deleted segments");
        }
        Ok(deleted)
    }

    /// Deletes the sealed segments whose records are all below `offset` (whole segments
    /// only: the log start becomes at most `offset`). Used when everything before `offset`
    /// is superseded (a consumer-offsets snapshot), and by followers to follow their
    /// leader's log start.
    pub fn trim_before(&mut self, offset: u64) -> io::Result<Vec<u64>> {
        // (Retention of a tiered topic does the same, behind the manifest: apply_retention.)
        let deleted = self.delete_oldest_while(|_, next_base| next_base <= offset)?;
        if !deleted.is_empty() {
            tracing::debug!(dir = %self.dir.display(), segments = deleted.len(), log_start = self.start_offset(), "deleted segments below {offset}");
        }
        Ok(deleted)
    }

    /// Deletes the oldest segment while `expired(oldest, base of the next segment)` holds,
    /// never the active one; returns the base offsets deleted.
    fn delete_oldest_while(
        &mut self,
        mut expired: impl FnMut(&Segment, u64) -> bool,
    ) -> io::Result<Vec<u64>> {
        let mut deleted = Vec::new();
        while self.segments.len() > 1 {
            let mut it = self.segments.iter();
            let (&base, oldest) = it.next().expect("non-empty");
            let (&next_base, _) = it.next().expect("two segments");
            if !expired(oldest, next_base) {
                break;
            }
            let seg = self.segments.remove(&base).expect("present");
            seg.delete_files()?;
            deleted.push(base);
        }
        if !deleted.is_empty() {
            self.prune_snapshots()?;
            self.epochs.truncate_from_start(self.start_offset());
            self.persist_epochs()?;
            // (a tiered topic's segments carry theirs to the cold tier's manifest)
            self.txns.forget_before(self.start_offset())?;
        }
        Ok(deleted)
    }

    /// Writes indexes, a producer snapshot and the clean-shutdown marker after syncing all.
    pub fn close(&mut self) -> io::Result<()> {
        if std::mem::replace(&mut self.closed, true) {
            return Ok(());
        }
        let end = self.end_offset();
        let active = self.active_mut();
        active.write_indexes()?;
        active.file.sync_all()?;
        for f in &self.unsynced_sealed {
            f.sync_all()?;
        }
        self.txns.sync()?;
        write_file(
            &self.dir.join(fmt::file_name(end, SNAPSHOT_SUFFIX)),
            &self.producers.encode_snapshot(end),
        )?;
        self.prune_snapshots()?;
        write_atomically(&self.dir, CLEAN_SHUTDOWN_FILE, end.to_string().as_bytes())
    }

    /// Loads the newest usable producer snapshot and replays batch headers after it; the
    /// replayed producers count as seen at `now_ms`.
    fn rebuild_producer_state(&mut self, now_ms: i64) -> io::Result<()> {
        let end = self.end_offset();
        let start = self.start_offset();
        let mut from = start;
        let mut snapshots = self.snapshot_offsets()?;
        snapshots.reverse();
        for offset in snapshots {
            if offset > end || offset < start {
                continue;
            }
            let bytes = fs::read(self.dir.join(fmt::file_name(offset, SNAPSHOT_SUFFIX)))?;
            if let Some((at, table)) = ProducerStateTable::decode_snapshot(&bytes, now_ms) {
                if at == offset {
                    self.producers = table;
                    from = offset;
                    break;
                }
            }
            tracing::warn!(dir = %self.dir.display(), offset, "ignoring damaged producer snapshot");
        }
        let mut replayed = 0usize;
        // What ended at or after `from` is rebuilt from the log.
        self.txns.forget_from(from)?;
        let mut ended = Vec::new();
        let mut producers = std::mem::take(&mut self.producers);
        self.for_each_header(from, |h, marker| {
            if let Some(m) = marker {
                if let Some(first) = producers.open_txn(h.producer_id) {
                    ended.push((h.producer_id, first, h.base_offset as u64, m.commit));
                }
            }
            producers.record(h, now_ms);
            replayed += 1;
        })?;
        self.producers = producers;
        for (pid, first, at, commit) in ended {
            self.txns.ended(pid, first, at, commit)?;
        }
        tracing::debug!(dir = %self.dir.display(), from, replayed, producers = self.producers.len(), "rebuilt producer state");
        Ok(())
    }

    /// Calls `f` with the header of every batch whose base offset is at or after `from`,
    /// and for a transaction marker what it says.
    fn for_each_header(
        &self,
        from: u64,
        mut f: impl FnMut(&BatchHeader, Option<Marker>),
    ) -> io::Result<()> {
        for seg in self.segments.values() {
            if seg.next_offset <= from {
                continue;
            }
            let Some(mut pos) = seg.position_of(from.max(seg.base))? else {
                continue;
            };
            let mut header = [0u8; HEADER_LEN];
            while pos < seg.size {
                seg.file.read_exact_at(&mut header, pos)?;
                let h = BatchHeader::parse(&header)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                if h.base_offset as u64 >= from {
                    let marker = if h.is_control() && h.total_len() <= 4096 {
                        let mut whole = vec![0u8; h.total_len()];
                        seg.file.read_exact_at(&mut whole, pos)?;
                        batch::marker::parse(&whole)
                    } else {
                        None
                    };
                    f(&h, marker);
                }
                pos += h.total_len() as u64;
            }
        }
        Ok(())
    }

    /// Loads the leader-epoch history, rebuilding it from batch headers when the checkpoint
    /// is missing or damaged, and trims it to the log's current range.
    fn load_epochs(&mut self) -> io::Result<()> {
        let path = self.dir.join(EPOCH_CHECKPOINT_FILE);
        let loaded = match fs::read_to_string(&path) {
            Ok(text) => LeaderEpochCache::decode(&text)
                .inspect_err(|e| tracing::warn!(file = %path.display(), error = %e, "rebuilding the leader-epoch history"))
                .ok(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let rebuilt = loaded.is_none();
        let mut epochs = match loaded {
            Some(c) => c,
            None => {
                let mut c = LeaderEpochCache::default();
                self.for_each_header(self.start_offset(), |h, _| {
                    c.assign(h.leader_epoch, h.base_offset as u64)
                })?;
                c
            }
        };
        let before = epochs.clone();
        epochs.truncate_from_end(self.end_offset());
        epochs.truncate_from_start(self.start_offset());
        let changed = rebuilt || epochs != before;
        self.epochs = epochs;
        if changed && !self.epochs.entries().is_empty() {
            self.persist_epochs()?;
        }
        Ok(())
    }

    fn persist_epochs(&self) -> io::Result<()> {
        write_atomically(
            &self.dir,
            EPOCH_CHECKPOINT_FILE,
            self.epochs.encode().as_bytes(),
        )
    }

    /// The leader-epoch history (for OffsetsForLeaderEpoch and follower truncation).
    pub fn epochs(&self) -> &LeaderEpochCache {
        &self.epochs
    }

    /// OffsetsForLeaderEpoch: the largest epoch `<= epoch` in this log and where it ends.
    pub fn epoch_end_offset(&self, epoch: i32) -> Option<(i32, u64)> {
        self.epochs.end_offset_for(epoch, self.end_offset())
    }

    fn snapshot_offsets(&self) -> io::Result<Vec<u64>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let name = entry?.file_name();
            if let Some((o, SNAPSHOT_SUFFIX)) = name.to_str().and_then(fmt::parse_file_name) {
                out.push(o);
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// Removes the producer snapshots at or past `offset`.
    fn remove_snapshots_from(&self, offset: u64) -> io::Result<()> {
        for o in self.snapshot_offsets()? {
            if o >= offset {
                remove_if_exists(&self.dir.join(fmt::file_name(o, SNAPSHOT_SUFFIX)))?;
            }
        }
        Ok(())
    }

    /// Keeps the newest snapshots and removes those below the log start.
    fn prune_snapshots(&self) -> io::Result<()> {
        let offsets = self.snapshot_offsets()?;
        let keep_from = offsets.len().saturating_sub(SNAPSHOTS_KEPT + 1);
        let start = self.start_offset();
        for (i, o) in offsets.iter().enumerate() {
            if i < keep_from || *o < start {
                remove_if_exists(&self.dir.join(fmt::file_name(*o, SNAPSHOT_SUFFIX)))?;
            }
        }
        Ok(())
    }
}

fn read_number(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Writes `name` in `dir` through a temporary file, rename and directory fsync.
pub(crate) fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    write_file(&tmp, bytes)?;
    fs::rename(&tmp, dir.join(name))?;
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests;
