//! Kafka RecordBatch v2 (magic 2) headers: parsing, validation and offset stamping.
//!
//! The same batch bytes travel from the producer's socket to the segment file, to followers,
//! to the object store and back to consumers. This module reads the 61-byte header and checks
//! the CRC; it never decodes or re-encodes the records themselves. The broker stamps the base
//! offset and partition leader epoch, which sit before the CRC-covered region, so stamping
//! never invalidates the CRC.
//!
//! Layout (big endian):
//! ```text
//! 0  base_offset i64        27 base_timestamp i64
//! 8  batch_length i32       35 max_timestamp i64
//! 12 leader_epoch i32       43 producer_id i64
//! 16 magic i8               51 producer_epoch i16
//! 17 crc u32 (CRC32C of 21..) 53 base_sequence i32
//! 21 attributes i16         57 record_count i32
//! 23 last_offset_delta i32  61 records...
//! ```

/// Bytes before the batch-length field counts: base offset (8) + batch length (4).
pub const LOG_OVERHEAD: usize = 12;
/// Size of a v2 batch header, records excluded.
pub const HEADER_LEN: usize = 61;
/// The bytes the broker rewrites when it stamps a batch: base offset, length, leader epoch.
pub const STAMP_LEN: usize = 16;
/// Offset of the first CRC-covered byte (attributes).
pub const CRC_START: usize = 21;

const ATTR_COMPRESSION_MASK: i16 = 0x07;
const ATTR_TIMESTAMP_TYPE: i16 = 0x08;
const ATTR_TRANSACTIONAL: i16 = 0x10;
const ATTR_CONTROL: i16 = 0x20;

/// Why a byte range is not a valid batch. Every variant is a property of the bytes, so none
/// is retriable with the same input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("batch truncated: need {needed} bytes, have {available}")]
    Truncated { needed: usize, available: usize },
    #[error("unsupported record batch magic {0} (only magic 2 is accepted)")]
    BadMagic(i8),
    #[error("invalid batch length {0}")]
    BadLength(i32),
    #[error("crc mismatch: header says {expected:#010x}, bytes give {actual:#010x}")]
    CrcMismatch { expected: u32, actual: u32 },
    #[error("invalid record count {count} for last offset delta {last_offset_delta}")]
    BadRecordCount { count: i32, last_offset_delta: i32 },
    #[error("expected exactly one record batch, found trailing {0} bytes")]
    TrailingBytes(usize),
}

/// Compression codec named by the batch attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
    /// A codec id Kafka does not define (5..=7).
    Unknown(u8),
}

impl Compression {
    /// The codec's id in a batch's attributes (bits 0-2).
    pub fn id(self) -> u8 {
        match self {
            Compression::None => 0,
            Compression::Gzip => 1,
            Compression::Snappy => 2,
            Compression::Lz4 => 3,
            Compression::Zstd => 4,
            Compression::Unknown(c) => c & 0x07,
        }
    }
}

/// Compression levels, as a topic's `compression.gzip.level` (-1 for the codec's default,
/// 6), `compression.lz4.level` (1-17) and `compression.zstd.level` (KIP-390).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Levels {
    pub gzip: i32,
    pub lz4: u32,
    pub zstd: i32,
}

impl Default for Levels {
    /// Kafka's defaults.
    fn default() -> Self {
        Levels {
            gzip: -1,
            lz4: 9,
            zstd: 3,
        }
    }
}

/// A complete batch with `header` (the first [`HEADER_LEN`] bytes of a batch, as written),
/// `count` records in `body` encoded with `codec`: length, attributes, record count and CRC
/// set to match; offsets, producer id, epoch, sequence and timestamps kept.
pub fn rebuilt(
    header: &[u8],
    codec: Compression,
    count: i32,
    body: &[u8],
) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&header[..HEADER_LEN]);
    let length = i32::try_from(HEADER_LEN + body.len() - LOG_OVERHEAD)
        .map_err(|_| "rewritten batch larger than 2 GiB".to_string())?;
    out[8..12].copy_from_slice(&length.to_be_bytes());
    let attributes = i16::from_be_bytes([out[21], out[22]]);
    let attributes = (attributes & !ATTR_COMPRESSION_MASK) | i16::from(codec.id());
    out[21..23].copy_from_slice(&attributes.to_be_bytes());
    out[57..61].copy_from_slice(&count.to_be_bytes());
    out.extend_from_slice(body);
    let crc = compute_crc(&out);
    out[17..21].copy_from_slice(&crc.to_be_bytes());
    Ok(out)
}

/// The fixed header of one RecordBatch v2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    pub batch_length: i32,
    pub leader_epoch: i32,
    pub magic: i8,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub record_count: i32,
}

fn be_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}
fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().expect("4-byte slice"))
}
fn be_i64(b: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(b[at..at + 8].try_into().expect("8-byte slice"))
}

impl BatchHeader {
    /// Parses the header at the start of `buf` (which may hold more than one batch).
    /// Checks magic and that the length field is sane; does not check the CRC.
    pub fn parse(buf: &[u8]) -> Result<Self, BatchError> {
        if buf.len() < HEADER_LEN {
            // Report the magic early when we can: a v0/v1 message set is shorter.
            if buf.len() > 16 && buf[16] != 2 {
                return Err(BatchError::BadMagic(buf[16] as i8));
            }
            return Err(BatchError::Truncated {
                needed: HEADER_LEN,
                available: buf.len(),
            });
        }
        let magic = buf[16] as i8;
        if magic != 2 {
            return Err(BatchError::BadMagic(magic));
        }
        let batch_length = be_i32(buf, 8);
        if batch_length < (HEADER_LEN - LOG_OVERHEAD) as i32 {
            return Err(BatchError::BadLength(batch_length));
        }
        Ok(BatchHeader {
            base_offset: be_i64(buf, 0),
            batch_length,
            leader_epoch: be_i32(buf, 12),
            magic,
            crc: u32::from_be_bytes(buf[17..21].try_into().expect("4-byte slice")),
            attributes: be_i16(buf, 21),
            last_offset_delta: be_i32(buf, 23),
            base_timestamp: be_i64(buf, 27),
            max_timestamp: be_i64(buf, 35),
            producer_id: be_i64(buf, 43),
            producer_epoch: be_i16(buf, 51),
            base_sequence: be_i32(buf, 53),
            record_count: be_i32(buf, 57),
        })
    }

    /// Size of the whole batch on the wire and on disk.
    pub fn total_len(&self) -> usize {
        LOG_OVERHEAD + self.batch_length as usize
    }

    /// Offset of the last record (base offset + last offset delta).
    pub fn last_offset(&self) -> i64 {
        self.base_offset + i64::from(self.last_offset_delta)
    }

    pub fn compression(&self) -> Compression {
        match (self.attributes & ATTR_COMPRESSION_MASK) as u8 {
            0 => Compression::None,
            1 => Compression::Gzip,
            2 => Compression::Snappy,
            3 => Compression::Lz4,
            4 => Compression::Zstd,
            other => Compression::Unknown(other),
        }
    }

    /// True when timestamps were set by the broker (LogAppendTime).
    pub fn log_append_time(&self) -> bool {
        self.attributes & ATTR_TIMESTAMP_TYPE != 0
    }

    pub fn is_transactional(&self) -> bool {
        self.attributes & ATTR_TRANSACTIONAL != 0
    }

    pub fn is_control(&self) -> bool {
        self.attributes & ATTR_CONTROL != 0
    }

    /// True when the producer set a producer id (idempotent or transactional producer).
    pub fn has_producer_id(&self) -> bool {
        self.producer_id >= 0
    }

    /// Sequence number of the last record, wrapping as Kafka does at `i32::MAX`.
    pub fn last_sequence(&self) -> i32 {
        wrapping_seq_add(self.base_sequence, self.last_offset_delta)
    }
}

/// Adds to a producer sequence number, wrapping from `i32::MAX` to 0 as Kafka does.
pub fn wrapping_seq_add(seq: i32, delta: i32) -> i32 {
    let sum = i64::from(seq) + i64::from(delta);
    (sum % (i64::from(i32::MAX) + 1)) as i32
}

/// CRC32C over the CRC-covered region of a complete batch.
pub fn compute_crc(batch: &[u8]) -> u32 {
    // CRC-32/ISCSI is CRC-32C; the u64 holds the 32-bit value.
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, &batch[CRC_START..]) as u32
}

/// Parses the header of the complete batch at the start of `buf` and checks its CRC.
/// Returns the header; `buf` may continue past the batch.
pub fn verify(buf: &[u8]) -> Result<BatchHeader, BatchError> {
    let header = BatchHeader::parse(buf)?;
    let total = header.total_len();
    if buf.len() < total {
        return Err(BatchError::Truncated {
            needed: total,
            available: buf.len(),
        });
    }
    let actual = compute_crc(&buf[..total]);
    if actual != header.crc {
        return Err(BatchError::CrcMismatch {
            expected: header.crc,
            actual,
        });
    }
    Ok(header)
}

/// Validates the records of one partition in a produce request: exactly one complete v2
/// batch, correct CRC, a record count consistent with the last offset delta.
pub fn validate_produced(buf: &[u8]) -> Result<BatchHeader, BatchError> {
    let header = verify(buf)?;
    if header.total_len() != buf.len() {
        return Err(BatchError::TrailingBytes(buf.len() - header.total_len()));
    }
    if header.record_count < 1 || header.last_offset_delta != header.record_count - 1 {
        return Err(BatchError::BadRecordCount {
            count: header.record_count,
            last_offset_delta: header.last_offset_delta,
        });
    }
    Ok(header)
}

/// Validates one batch a leader sent a follower: as [`validate_produced`], except that a
/// compacted log's batch may hold fewer records than its offset range (some were cleaned
/// away), down to none (an empty batch kept for its producer's sequence).
pub fn validate_replicated(buf: &[u8]) -> Result<BatchHeader, BatchError> {
    let header = verify(buf)?;
    if header.total_len() != buf.len() {
        return Err(BatchError::TrailingBytes(buf.len() - header.total_len()));
    }
    if header.record_count < 0
        || header.last_offset_delta < 0
        || header.record_count > header.last_offset_delta.saturating_add(1)
    {
        return Err(BatchError::BadRecordCount {
            count: header.record_count,
            last_offset_delta: header.last_offset_delta,
        });
    }
    Ok(header)
}

/// The first [`STAMP_LEN`] bytes of `batch` with the base offset and leader epoch replaced.
/// Write these followed by `batch[STAMP_LEN..]` to store the stamped batch without copying it.
pub fn stamped_prefix(batch: &[u8], base_offset: i64, leader_epoch: i32) -> [u8; STAMP_LEN] {
    let mut prefix = [0u8; STAMP_LEN];
    prefix.copy_from_slice(&batch[..STAMP_LEN]);
    prefix[0..8].copy_from_slice(&base_offset.to_be_bytes());
    prefix[12..16].copy_from_slice(&leader_epoch.to_be_bytes());
    prefix
}

/// Stamps a complete batch with the broker's append time, as Kafka's leader does for a
/// `message.timestamp.type=LogAppendTime` topic: the timestamp-type attribute is set and the
/// max timestamp becomes `append_time_ms` (every record then reads as that time; the base
/// timestamp and record deltas stay as the producer wrote them), and the CRC is recomputed
/// over the changed bytes. Returns false, changing nothing, when `batch` is shorter than its
/// header says.
pub fn set_log_append_time(batch: &mut [u8], append_time_ms: i64) -> bool {
    let Ok(h) = BatchHeader::parse(batch) else {
        return false;
    };
    if batch.len() < h.total_len() {
        return false;
    }
    let attributes = h.attributes | ATTR_TIMESTAMP_TYPE;
    batch[21..23].copy_from_slice(&attributes.to_be_bytes());
    batch[35..43].copy_from_slice(&append_time_ms.to_be_bytes());
    let crc = compute_crc(&batch[..h.total_len()]);
    batch[17..21].copy_from_slice(&crc.to_be_bytes());
    true
}

/// Reads a zigzag varint at `*pos`, advancing it. `None` on truncated or overlong input.
fn read_varint(buf: &[u8], pos: &mut usize) -> Option<i64> {
    let mut value: u64 = 0;
    for shift in (0..64).step_by(7) {
        let byte = *buf.get(*pos)?;
        *pos += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(((value >> 1) as i64) ^ -((value & 1) as i64));
        }
    }
    None
}

/// In a complete, uncompressed batch, the offset delta and timestamp of the first record whose
/// timestamp is at or after `ts`. `None` for compressed batches (the caller falls back to the
/// base offset), malformed records, or when no record qualifies.
pub fn first_record_at_or_after(batch: &[u8], ts: i64) -> Option<(u32, i64)> {
    let header = BatchHeader::parse(batch).ok()?;
    if header.log_append_time() {
        // every record carries the batch's append time
        return (header.max_timestamp >= ts).then_some((0, header.max_timestamp));
    }
    if header.compression() != Compression::None || batch.len() < header.total_len() {
        return None;
    }
    let mut pos = HEADER_LEN;
    for _ in 0..header.record_count {
        let len = read_varint(batch, &mut pos)?;
        let start = pos;
        pos += 1; // attributes
        let ts_delta = read_varint(batch, &mut pos)?;
        let offset_delta = read_varint(batch, &mut pos)?;
        let record_ts = header.base_timestamp.checked_add(ts_delta)?;
        if record_ts >= ts {
            return Some((u32::try_from(offset_delta).ok()?, record_ts));
        }
        pos = start.checked_add(usize::try_from(len).ok()?)?;
    }
    None
}

/// Iterates over the complete batches at the start of a buffer of concatenated batches, as a
/// fetch response or a segment read returns them. Stops (returns `None`) at the first
/// incomplete batch; a malformed header is yielded as an error once, then iteration ends.
pub struct BatchIter<'a> {
    buf: &'a [u8],
    pos: usize,
    done: bool,
}

impl<'a> BatchIter<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        BatchIter {
            buf,
            pos: 0,
            done: false,
        }
    }

    /// Byte position just past the last batch yielded.
    pub fn position(&self) -> usize {
        self.pos
    }
}

impl Iterator for BatchIter<'_> {
    /// The header and the byte range of the whole batch within the buffer.
    type Item = Result<(BatchHeader, std::ops::Range<usize>), BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let rest = &self.buf[self.pos..];
        match BatchHeader::parse(rest) {
            Ok(h) if h.total_len() <= rest.len() => {
                let range = self.pos..self.pos + h.total_len();
                self.pos = range.end;
                Some(Ok((h, range)))
            }
            Ok(_) | Err(BatchError::Truncated { .. }) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// One record of an uncompressed batch, as [`records`] decodes it (headers skipped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    pub offset: i64,
    pub timestamp: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
}

/// Reads a varint-length-prefixed byte string (`-1`: null) at `*pos`.
fn read_bytes<'a>(buf: &'a [u8], pos: &mut usize) -> Option<Option<&'a [u8]>> {
    let len = read_varint(buf, pos)?;
    if len < 0 {
        return Some(None);
    }
    let end = pos.checked_add(usize::try_from(len).ok()?)?;
    let bytes = buf.get(*pos..end)?;
    *pos = end;
    Some(Some(bytes))
}

/// Decodes the records of one complete, uncompressed batch (the broker's own internal
/// records, which it writes uncompressed). `None` for a compressed or malformed batch.
pub fn records(batch: &[u8]) -> Option<Vec<Record<'_>>> {
    let header = BatchHeader::parse(batch).ok()?;
    if header.compression() != Compression::None || batch.len() < header.total_len() {
        return None;
    }
    let raw = raw_records(&batch[HEADER_LEN..header.total_len()], header.record_count)?;
    raw.into_iter()
        .map(|r| {
            Some(Record {
                offset: header.base_offset.checked_add(r.offset_delta)?,
                timestamp: header.base_timestamp.checked_add(r.timestamp_delta)?,
                key: r.key,
                value: r.value,
            })
        })
        .collect()
}

/// One record of a batch's (uncompressed) records section, with its bytes as written, so
/// a tool that drops some records can copy the others unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawRecord<'a> {
    /// The whole record, its length prefix included.
    pub bytes: &'a [u8],
    pub timestamp_delta: i64,
    pub offset_delta: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    /// Its headers in order (a key may repeat).
    pub headers: Vec<(&'a [u8], Option<&'a [u8]>)>,
}

/// Splits an uncompressed records section holding `count` records. `None` when it is
/// malformed or holds more or fewer bytes than those records.
pub fn raw_records(section: &[u8], count: i32) -> Option<Vec<RawRecord<'_>>> {
    let mut out = Vec::with_capacity(usize::try_from(count).ok()?.min(4096));
    for r in RecordViews::new(section, count)? {
        let r = r.ok()?;
        out.push(RawRecord {
            bytes: r.bytes,
            timestamp_delta: r.timestamp_delta,
            offset_delta: r.offset_delta,
            key: r.key,
            value: r.value,
            headers: r.headers.collect(),
        });
    }
    Some(out)
}

/// One record of a records section read in place, as [`RecordViews`] yields it: nothing is
/// allocated (its headers are walked when asked for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordView<'a> {
    /// The whole record, its length prefix included.
    pub bytes: &'a [u8],
    pub timestamp_delta: i64,
    pub offset_delta: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub headers: Headers<'a>,
}

/// A record's headers in order (a key may repeat), read from its bytes as iterated. The
/// bytes were checked when the record was read, so iteration never fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Headers<'a> {
    /// The headers' bytes, their count excluded.
    buf: &'a [u8],
    left: usize,
}

impl Headers<'_> {
    /// Headers not yet iterated.
    pub fn len(&self) -> usize {
        self.left
    }

    pub fn is_empty(&self) -> bool {
        self.left == 0
    }
}

/// One header at `*pos`: its key (never null) and value.
fn read_header<'a>(buf: &'a [u8], pos: &mut usize) -> Option<(&'a [u8], Option<&'a [u8]>)> {
    let name = read_bytes(buf, pos)??;
    Some((name, read_bytes(buf, pos)?))
}

impl<'a> Iterator for Headers<'a> {
    type Item = (&'a [u8], Option<&'a [u8]>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        let mut pos = 0;
        // Checked when the record was read: a failure here is a bug, and ends the headers.
        let Some(header) = read_header(self.buf, &mut pos) else {
            debug_assert!(false, "headers checked when read");
            self.left = 0;
            return None;
        };
        self.buf = &self.buf[pos..];
        self.left -= 1;
        Some(header)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for Headers<'_> {}

/// The records section is malformed: a record does not parse, or the section holds more or
/// fewer bytes than its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed records section (at byte {at})")]
pub struct Malformed {
    /// Where the record that does not parse begins, or the first byte past the records.
    pub at: usize,
}

/// The records of an uncompressed records section holding `count` records, read in place
/// one at a time (what [`raw_records`] returns, without a vector per batch and per record).
/// A malformed record, or bytes left over after the last, is yielded as an error once, then
/// iteration ends: records before it have been yielded already.
#[derive(Debug, Clone)]
pub struct RecordViews<'a> {
    section: &'a [u8],
    pos: usize,
    left: usize,
    failed: bool,
}

impl<'a> RecordViews<'a> {
    /// `None` for a negative `count`.
    pub fn new(section: &'a [u8], count: i32) -> Option<Self> {
        Some(RecordViews {
            section,
            pos: 0,
            left: usize::try_from(count).ok()?,
            failed: false,
        })
    }

    fn read(&mut self) -> Option<RecordView<'a>> {
        let start = self.pos;
        let mut pos = start;
        let len = read_varint(self.section, &mut pos)?;
        let end = pos.checked_add(usize::try_from(len).ok()?)?;
        let rec = self.section.get(..end)?;
        pos += 1; // attributes
        let timestamp_delta = read_varint(rec, &mut pos)?;
        let offset_delta = read_varint(rec, &mut pos)?;
        let key = read_bytes(rec, &mut pos)?;
        let value = read_bytes(rec, &mut pos)?;
        let count = read_varint(rec, &mut pos)?.max(0);
        let headers_at = pos;
        for _ in 0..count {
            read_header(rec, &mut pos)?;
        }
        if pos != end {
            return None;
        }
        self.pos = end;
        Some(RecordView {
            bytes: &self.section[start..end],
            timestamp_delta,
            offset_delta,
            key,
            value,
            headers: Headers {
                buf: &rec[headers_at..end],
                left: usize::try_from(count).ok()?,
            },
        })
    }
}

impl<'a> Iterator for RecordViews<'a> {
    type Item = Result<RecordView<'a>, Malformed>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        if self.left == 0 {
            if self.pos == self.section.len() {
                return None;
            }
            self.failed = true;
            return Some(Err(Malformed { at: self.pos }));
        }
        match self.read() {
            Some(r) => {
                self.left -= 1;
                Some(Ok(r))
            }
            None => {
                self.failed = true;
                Some(Err(Malformed { at: self.pos }))
            }
        }
    }
}

/// Builds an uncompressed v2 batch of records with the given keys and values. Used by tests
/// and tools; the broker never builds batches.
pub mod build {
    use super::*;

    /// One record to encode.
    pub struct Rec<'a> {
        pub key: Option<&'a [u8]>,
        pub value: Option<&'a [u8]>,
        pub timestamp_delta: i64,
    }

    /// Producer identity for an idempotent batch.
    #[derive(Clone, Copy)]
    pub struct ProducerIds {
        pub producer_id: i64,
        pub producer_epoch: i16,
        pub base_sequence: i32,
    }

    impl ProducerIds {
        pub const NONE: ProducerIds = ProducerIds {
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
        };
    }

    fn put_varint(out: &mut Vec<u8>, v: i64) {
        let mut z = ((v << 1) ^ (v >> 63)) as u64;
        loop {
            if z < 0x80 {
                out.push(z as u8);
                return;
            }
            out.push((z as u8 & 0x7f) | 0x80);
            z >>= 7;
        }
    }

    fn put_bytes(out: &mut Vec<u8>, b: Option<&[u8]>) {
        match b {
            None => put_varint(out, -1),
            Some(b) => {
                put_varint(out, b.len() as i64);
                out.extend_from_slice(b);
            }
        }
    }

    /// A record with headers and its own timestamp, for [`batch_with_headers`].
    pub struct FullRec<'a> {
        pub key: Option<&'a [u8]>,
        pub value: Option<&'a [u8]>,
        pub timestamp: i64,
        /// In order; a key may repeat.
        pub headers: Vec<(&'a [u8], Option<&'a [u8]>)>,
    }

    fn put_record(
        body: &mut Vec<u8>,
        timestamp_delta: i64,
        offset_delta: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[(&[u8], Option<&[u8]>)],
    ) {
        let mut rec = Vec::new();
        rec.push(0u8); // attributes
        put_varint(&mut rec, timestamp_delta);
        put_varint(&mut rec, offset_delta);
        put_bytes(&mut rec, key);
        put_bytes(&mut rec, value);
        put_varint(&mut rec, headers.len() as i64);
        for (k, v) in headers {
            put_bytes(&mut rec, Some(k));
            put_bytes(&mut rec, *v);
        }
        put_varint(body, rec.len() as i64);
        body.extend_from_slice(&rec);
    }

    /// Encodes `records` (headers included, each with its own timestamp; the earliest is
    /// the batch's base) as one uncompressed batch with base offset 0 and no producer id.
    pub fn batch_with_headers(records: &[FullRec<'_>]) -> Vec<u8> {
        assert!(!records.is_empty(), "a batch holds at least one record");
        let base_timestamp = records.iter().map(|r| r.timestamp).min().unwrap_or(0);
        let mut body = Vec::new();
        for (i, r) in records.iter().enumerate() {
            let delta = r.timestamp - base_timestamp;
            put_record(&mut body, delta, i as i64, r.key, r.value, &r.headers);
        }
        let max_ts = records.iter().map(|r| r.timestamp).max().unwrap_or(0);
        finish(
            body,
            records.len(),
            base_timestamp,
            max_ts,
            ProducerIds::NONE,
        )
    }

    /// Encodes `records` as one uncompressed batch with base offset 0.
    pub fn batch(base_timestamp: i64, ids: ProducerIds, records: &[Rec<'_>]) -> Vec<u8> {
        assert!(!records.is_empty(), "a batch holds at least one record");
        let mut body = Vec::new();
        let mut max_ts = base_timestamp;
        for (i, r) in records.iter().enumerate() {
            put_record(&mut body, r.timestamp_delta, i as i64, r.key, r.value, &[]);
            max_ts = max_ts.max(base_timestamp + r.timestamp_delta);
        }
        finish(body, records.len(), base_timestamp, max_ts, ids)
    }

    /// `batch` (whole, as built here) marked transactional: the attribute set, the CRC
    /// recomputed.
    pub fn transactional(batch: Vec<u8>) -> Vec<u8> {
        with_attributes(batch, ATTR_TRANSACTIONAL)
    }

    /// `batch` with `extra` attribute bits set and its CRC recomputed.
    pub(super) fn with_attributes(mut batch: Vec<u8>, extra: i16) -> Vec<u8> {
        let attrs = i16::from_be_bytes([batch[21], batch[22]]) | extra;
        batch[21..23].copy_from_slice(&attrs.to_be_bytes());
        let crc = compute_crc(&batch);
        batch[17..21].copy_from_slice(&crc.to_be_bytes());
        batch
    }

    /// The header before `body` (the records section), and the CRC.
    fn finish(
        body: Vec<u8>,
        records_len: usize,
        base_timestamp: i64,
        max_ts: i64,
        ids: ProducerIds,
    ) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + body.len());
        out.extend_from_slice(&0i64.to_be_bytes());
        out.extend_from_slice(&((HEADER_LEN - LOG_OVERHEAD + body.len()) as i32).to_be_bytes());
        out.extend_from_slice(&0i32.to_be_bytes()); // leader epoch
        out.push(2); // magic
        out.extend_from_slice(&[0; 4]); // crc, filled below
        out.extend_from_slice(&0i16.to_be_bytes()); // attributes
        out.extend_from_slice(&((records_len - 1) as i32).to_be_bytes());
        out.extend_from_slice(&base_timestamp.to_be_bytes());
        out.extend_from_slice(&max_ts.to_be_bytes());
        out.extend_from_slice(&ids.producer_id.to_be_bytes());
        out.extend_from_slice(&ids.producer_epoch.to_be_bytes());
        out.extend_from_slice(&ids.base_sequence.to_be_bytes());
        out.extend_from_slice(&(records_len as i32).to_be_bytes());
        out.extend_from_slice(&body);
        let crc = compute_crc(&out);
        out[17..21].copy_from_slice(&crc.to_be_bytes());
        out
    }
}

/// Transaction markers: the control batch a transaction coordinator has each partition
/// leader append to end a producer's transaction there (Kafka's `EndTransactionMarker`).
/// One record: key = version (i16 0), type (i16: 0 abort, 1 commit); value = version
/// (i16 0), coordinator epoch (i32). The batch is uncompressed, with the control and
/// transactional attributes, the producer's id and epoch, and no sequence.
pub mod marker {
    use super::*;

    /// What a marker says.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Marker {
        pub commit: bool,
        pub coordinator_epoch: i32,
    }

    /// A marker batch for `producer_id` at `producer_epoch`, base offset 0.
    pub fn build(producer_id: i64, producer_epoch: i16, marker: Marker, timestamp: i64) -> Vec<u8> {
        let key = [0u8, 0, 0, u8::from(marker.commit)];
        let mut value = [0u8; 6];
        value[2..].copy_from_slice(&marker.coordinator_epoch.to_be_bytes());
        let out = super::build::batch(
            timestamp,
            super::build::ProducerIds {
                producer_id,
                producer_epoch,
                base_sequence: -1,
            },
            &[super::build::Rec {
                key: Some(&key),
                value: Some(&value),
                timestamp_delta: 0,
            }],
        );
        super::build::with_attributes(out, ATTR_CONTROL | ATTR_TRANSACTIONAL)
    }

    /// The marker in a whole control batch; `None` when it is not a transaction marker
    /// (another control type, compressed, or malformed).
    pub fn parse(batch: &[u8]) -> Option<Marker> {
        let recs = records(batch)?;
        let first = recs.first()?;
        let key = first.key?;
        if key.len() < 4 || key[..2] != [0, 0] {
            return None;
        }
        let commit = match i16::from_be_bytes([key[2], key[3]]) {
            0 => false,
            1 => true,
            _ => return None,
        };
        let coordinator_epoch = first
            .value
            .and_then(|v| v.get(2..6))
            .map_or(-1, |e| i32::from_be_bytes([e[0], e[1], e[2], e[3]]));
        Some(Marker {
            commit,
            coordinator_epoch,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::build::*;
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn markers_read_back_what_they_say() {
        for commit in [false, true] {
            let m = marker::Marker {
                commit,
                coordinator_epoch: 7,
            };
            let b = marker::build(42, 3, m, 1_000);
            let h = verify(&b).expect("a whole batch with a good CRC");
            assert!(h.is_control() && h.is_transactional());
            assert_eq!(
                (h.producer_id, h.producer_epoch, h.base_sequence),
                (42, 3, -1)
            );
            assert_eq!(marker::parse(&b), Some(m));
        }
        let data = batch(
            0,
            ProducerIds::NONE,
            &[Rec {
                key: Some(b"k"),
                value: None,
                timestamp_delta: 0,
            }],
        );
        assert_eq!(marker::parse(&data), None, "a one-byte key is no marker");
    }

    #[test]
    fn records_decode_what_build_wrote() {
        let ids = ProducerIds::NONE;
        let b = batch(
            1_000,
            ids,
            &[
                Rec {
                    key: Some(b"k1"),
                    value: Some(b"v1"),
                    timestamp_delta: 0,
                },
                Rec {
                    key: Some(b"k2"),
                    value: None,
                    timestamp_delta: 5,
                },
            ],
        );
        let got = records(&b).expect("decodes");
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].offset, got[0].timestamp), (0, 1_000));
        assert_eq!(got[0].key, Some(&b"k1"[..]));
        assert_eq!(got[1].value, None);
        assert_eq!((got[1].offset, got[1].timestamp), (1, 1_005));
        // Cut anywhere inside the records, the batch does not decode.
        for cut in HEADER_LEN..b.len() {
            assert!(records(&b[..cut]).is_none(), "cut at {cut}");
        }
    }

    fn sample(n: usize) -> Vec<u8> {
        let vals: Vec<Vec<u8>> = (0..n).map(|i| format!("value-{i}").into_bytes()).collect();
        let recs: Vec<Rec<'_>> = vals
            .iter()
            .enumerate()
            .map(|(i, v)| Rec {
                key: Some(b"k"),
                value: Some(v),
                timestamp_delta: i as i64,
            })
            .collect();
        batch(1_000, ProducerIds::NONE, &recs)
    }

    #[test]
    fn built_batch_validates() {
        let b = sample(3);
        let h = validate_produced(&b).unwrap();
        assert_eq!(h.record_count, 3);
        assert_eq!(h.last_offset_delta, 2);
        assert_eq!(h.max_timestamp, 1_002);
        assert_eq!(h.total_len(), b.len());
        assert_eq!(h.compression(), Compression::None);
    }

    #[test]
    fn stamping_keeps_crc_valid() {
        let b = sample(2);
        let prefix = stamped_prefix(&b, 42, 7);
        let mut stamped = prefix.to_vec();
        stamped.extend_from_slice(&b[STAMP_LEN..]);
        let h = verify(&stamped).unwrap();
        assert_eq!(h.base_offset, 42);
        assert_eq!(h.leader_epoch, 7);
        assert_eq!(h.last_offset(), 43);
    }

    #[test]
    fn log_append_time_stamping_keeps_the_crc_valid() {
        let mut b = sample(3); // producer timestamps 1000..=1002
        assert!(set_log_append_time(&mut b, 5_000_000));
        let h = validate_produced(&b).expect("CRC recomputed");
        assert!(h.log_append_time());
        assert_eq!(h.max_timestamp, 5_000_000);
        assert_eq!(
            h.base_timestamp, 1_000,
            "the producer's base timestamp stays"
        );
        assert_eq!(h.compression(), Compression::None, "other attributes kept");
        // every record reads as the append time for a time lookup
        assert_eq!(first_record_at_or_after(&b, 2_000), Some((0, 5_000_000)));
        assert_eq!(first_record_at_or_after(&b, 5_000_001), None);
        // the offsets stamped later keep it valid too
        let prefix = stamped_prefix(&b, 9, 2);
        let mut stored = prefix.to_vec();
        stored.extend_from_slice(&b[STAMP_LEN..]);
        assert!(verify(&stored).unwrap().log_append_time());
        // a truncated batch is left alone
        let mut short = sample(2);
        short.pop();
        let before = short.clone();
        assert!(!set_log_append_time(&mut short, 1));
        assert_eq!(short, before);
    }

    #[test]
    fn corrupt_and_truncated_batches_are_refused() {
        let mut b = sample(2);
        let last = b.len() - 1;
        b[last] ^= 0xff;
        assert!(matches!(verify(&b), Err(BatchError::CrcMismatch { .. })));
        let b = sample(2);
        assert!(matches!(
            verify(&b[..b.len() - 1]),
            Err(BatchError::Truncated { .. })
        ));
        let mut b = sample(1);
        b[16] = 1;
        assert_eq!(verify(&b), Err(BatchError::BadMagic(1)));
        let mut two = sample(1);
        two.extend_from_slice(&sample(1));
        assert!(matches!(
            validate_produced(&two),
            Err(BatchError::TrailingBytes(_))
        ));
    }

    #[test]
    fn a_replicated_batch_may_have_fewer_records_than_offsets() {
        let with_count = |b: &[u8], count: i32| {
            let mut b = b.to_vec();
            b[57..61].copy_from_slice(&count.to_be_bytes());
            let crc = compute_crc(&b);
            b[17..21].copy_from_slice(&crc.to_be_bytes());
            b
        };
        let b = sample(3); // last offset delta 2
        assert!(validate_replicated(&b).is_ok());
        // two records cleaned away, or all three: fine for a follower, not for a producer
        for count in [1, 0] {
            let fewer = with_count(&b, count);
            assert!(validate_replicated(&fewer).is_ok(), "count {count}");
            assert!(matches!(
                validate_produced(&fewer),
                Err(BatchError::BadRecordCount { .. })
            ));
        }
        for count in [4, -1] {
            assert!(matches!(
                validate_replicated(&with_count(&b, count)),
                Err(BatchError::BadRecordCount { .. })
            ));
        }
    }

    #[test]
    fn finds_first_record_by_timestamp() {
        let b = sample(4); // timestamps 1000..=1003
        assert_eq!(first_record_at_or_after(&b, 0), Some((0, 1_000)));
        assert_eq!(first_record_at_or_after(&b, 1_002), Some((2, 1_002)));
        assert_eq!(first_record_at_or_after(&b, 1_004), None);
        assert_eq!(first_record_at_or_after(&b[..b.len() - 3], 1_000), None);
    }

    #[test]
    fn sequence_wraps_like_kafka() {
        assert_eq!(wrapping_seq_add(i32::MAX, 1), 0);
        assert_eq!(wrapping_seq_add(i32::MAX - 1, 3), 1);
        assert_eq!(wrapping_seq_add(5, 4), 9);
    }

    #[test]
    fn iter_stops_at_partial_batch() {
        let mut buf = sample(1);
        buf.extend_from_slice(&sample(2));
        let full = buf.len();
        buf.extend_from_slice(&sample(3)[..20]);
        let items: Vec<_> = BatchIter::new(&buf).collect::<Result<_, _>>().unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[1].1.end, full);
    }

    #[test]
    fn the_batch_crc_is_crc32c() {
        // The check value of CRC-32C ("123456789"), after 21 bytes the CRC does not cover.
        let mut b = vec![0xAA; CRC_START];
        b.extend_from_slice(b"123456789");
        assert_eq!(compute_crc(&b), 0xE306_9283);
    }

    proptest! {
        #[test]
        fn the_batch_crc_agrees_with_the_crc32c_crate(
            bytes in proptest::collection::vec(any::<u8>(), CRC_START + 64..70_000),
            cut in 0usize..70_000,
            skip in 0usize..64,
        ) {
            // Every length and alignment: the folding code's head, body and tail paths.
            let end = skip + CRC_START + cut % (bytes.len() - skip - CRC_START + 1);
            let b = &bytes[skip..end];
            prop_assert_eq!(compute_crc(b), crc32c::crc32c(&b[CRC_START..]));
        }

        #[test]
        fn any_single_byte_flip_in_crc_region_is_detected(n in 1usize..5, at in 0usize..1000, bit in 0u8..8) {
            let mut b = sample(n);
            let at = CRC_START + at % (b.len() - CRC_START);
            b[at] ^= 1 << bit;
            prop_assert!(verify(&b).is_err());
        }

        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = verify(&bytes);
            let _ = BatchIter::new(&bytes).count();
        }

        #[test]
        fn record_views_read_back_what_was_built(
            records in proptest::collection::vec(
                (
                    proptest::option::of(proptest::collection::vec(any::<u8>(), 0..20)),
                    proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
                    0i64..1_000,
                    proptest::collection::vec(
                        (
                            proptest::collection::vec(any::<u8>(), 0..8),
                            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..8)),
                        ),
                        0..4,
                    ),
                ),
                1..20,
            ),
        ) {
            let full: Vec<FullRec<'_>> = records
                .iter()
                .map(|(k, v, ts, h)| FullRec {
                    key: k.as_deref(),
                    value: v.as_deref(),
                    timestamp: *ts,
                    headers: h.iter().map(|(k, v)| (&k[..], v.as_deref())).collect(),
                })
                .collect();
            let b = batch_with_headers(&full);
            let section = &b[HEADER_LEN..];
            let n = full.len() as i32;
            let views: Vec<RecordView<'_>> = RecordViews::new(section, n)
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            let raws = raw_records(section, n).unwrap();
            prop_assert_eq!(views.len(), full.len());
            for ((v, r), want) in views.iter().zip(&raws).zip(&full) {
                prop_assert_eq!(v.key, want.key);
                prop_assert_eq!(v.value, want.value);
                prop_assert_eq!(v.headers.len(), want.headers.len());
                prop_assert_eq!(v.headers.collect::<Vec<_>>(), want.headers.clone());
                prop_assert_eq!(v.bytes, r.bytes);
                prop_assert_eq!((v.offset_delta, v.timestamp_delta), (r.offset_delta, r.timestamp_delta));
                prop_assert_eq!(&v.headers.collect::<Vec<_>>(), &r.headers);
            }
            // Cut short or with a byte too many: an error after the records that parse.
            for bad in [&section[..section.len() - 1], &[section, &[0u8][..]].concat()[..]] {
                let got: Vec<_> = RecordViews::new(bad, n).unwrap().collect();
                prop_assert!(got.last().unwrap().is_err(), "{:?}", got.last());
                prop_assert!(got[..got.len() - 1].iter().all(|r| r.is_ok()));
                prop_assert!(raw_records(bad, n).is_none());
            }
        }

        #[test]
        fn record_views_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200), n in 0i32..10) {
            let got: Vec<_> = RecordViews::new(&bytes, n).unwrap().collect();
            prop_assert!(got.iter().filter(|r| r.is_err()).count() <= 1);
            prop_assert_eq!(raw_records(&bytes, n).is_some(), got.iter().all(|r| r.is_ok()) && got.len() == n as usize);
        }
    }
}
