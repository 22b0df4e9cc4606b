//! What a broker checks inside a produced batch before it appends it, as Kafka's log
//! validator does: every record well-formed to its last byte, offset deltas 0, 1, 2, ...,
//! exactly the record count the header claims and nothing after it, and a key on every
//! record of a compacted topic.
//!
//! The header and CRC are [`crate::batch`]'s; this module reads the records section as a
//! stream ([`check_records`] takes any [`BufRead`]), so a compressed batch is checked while it
//! is decompressed (feature `codecs`: [`crate::codec::check_produced`]) without ever holding
//! its output: memory stays at the reader's buffer whatever the batch claims, and output
//! past the limit is refused. Nothing here allocates from a number the batch carries.

use std::io::{self, BufRead};

/// Why the records of a produced batch are refused. None is retriable: the same bytes fail
/// the same way (Kafka answers INVALID_RECORD).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordsError {
    #[error("record {index} is malformed: {what}")]
    Malformed { index: i32, what: String },
    #[error("the batch holds bytes after its {count} records")]
    Trailing { count: i32 },
    #[error("cannot decompress the batch: {0}")]
    Decompress(String),
    #[error(
        "the topic takes only transactional producers (transactions.required=true); set a \
         transactional.id"
    )]
    NotTransactional,
    #[error(
        "its records decompress to more than {limit} bytes, the most one batch may hold \
         (a decompression bomb, or a batch no producer should write)"
    )]
    TooLarge { limit: u64 },
    #[error(
        "record {index} has no key; a compacted topic (cleanup.policy=compact) needs one{}",
        more(also)
    )]
    NoKey {
        index: i32,
        /// The other records of the batch refused for a key or a timestamp.
        also: Vec<i32>,
    },
    #[error(
        "record {index} has timestamp {timestamp}, outside the topic's window [{earliest}, \
         {latest}] (message.timestamp.before.max.ms / message.timestamp.after.max.ms){}",
        more(also)
    )]
    Timestamp {
        index: i32,
        timestamp: i64,
        earliest: i64,
        latest: i64,
        /// The other records of the batch refused for a key or a timestamp.
        also: Vec<i32>,
    },
}

fn more(also: &[i32]) -> String {
    match also.len() {
        0 => String::new(),
        n => format!(" (and {n} more records of the batch)"),
    }
}

impl RecordsError {
    /// The records it names (KIP-467's `batch_index`es), first the one it describes.
    pub fn record_indexes(&self) -> Vec<i32> {
        match self {
            RecordsError::Malformed { index, .. } => vec![*index],
            RecordsError::NoKey { index, also } | RecordsError::Timestamp { index, also, .. } => {
                std::iter::once(*index)
                    .chain(also.iter().copied())
                    .collect()
            }
            _ => Vec::new(),
        }
    }
}

/// The error a decompressing reader returns when its output would pass the limit, so that
/// the checker reports [`RecordsError::TooLarge`] rather than a decoding failure.
#[derive(Debug)]
pub struct OverLimit;

impl std::fmt::Display for OverLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("output past the limit")
    }
}

impl std::error::Error for OverLimit {}

/// What a topic asks of the records it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordRules {
    /// Every record needs a key (`cleanup.policy` includes `compact`).
    pub keys_required: bool,
    /// The most bytes the records section may hold (decompressed).
    pub limit: u64,
    /// Record timestamps must fall in this window (`message.timestamp.type=CreateTime`
    /// with `message.timestamp.before.max.ms` / `after.max.ms`); `None`: any timestamp.
    pub timestamps: Option<TimestampWindow>,
}

/// The timestamps a batch's records may carry: `base` is the batch's base timestamp (each
/// record's is `base` + its delta); `[earliest, latest]` the accepted range. A record
/// without a timestamp (-1) is not checked, as in Kafka.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimestampWindow {
    pub base: i64,
    pub earliest: i64,
    pub latest: i64,
}

/// Checks the `count` records of a records section read from `r` (already decompressed):
/// each one's length frames it exactly, its offset delta is its index, lengths are sane,
/// and the section ends after the last one.
pub fn check_records<R: BufRead>(r: R, count: i32, rules: RecordRules) -> Result<(), RecordsError> {
    let mut s = Stream {
        r,
        read: 0,
        limit: rules.limit,
    };
    // A record without a key, or outside the timestamp window, is whole: the check goes on,
    // so the answer names every such record of the batch, as Kafka's validator does.
    let mut refused: Option<(i32, Fault)> = None;
    let mut also = Vec::new();
    for index in 0..count.max(0) {
        match check_record(&mut s, index, rules).map_err(|e| e.at(index, rules.limit))? {
            Some(fault) if refused.is_none() => refused = Some((index, fault)),
            Some(_) => also.push(index),
            None => {}
        }
    }
    match s.r.fill_buf() {
        Ok([]) => {}
        Ok(_) => return Err(RecordsError::Trailing { count }),
        Err(e) => return Err(Fault::Io(e).at(count, rules.limit)),
    }
    match refused {
        None => Ok(()),
        Some((index, fault)) => Err(match fault.at(index, rules.limit) {
            RecordsError::NoKey { index, .. } => RecordsError::NoKey { index, also },
            RecordsError::Timestamp {
                index,
                timestamp,
                earliest,
                latest,
                ..
            } => RecordsError::Timestamp {
                index,
                timestamp,
                earliest,
                latest,
                also,
            },
            other => other,
        }),
    }
}

/// A failure while reading one record, before it is given the record's index.
enum Fault {
    Malformed(&'static str),
    TooLarge(u64),
    NoKey,
    Timestamp(i64, TimestampWindow),
    Io(io::Error),
}

impl Fault {
    fn at(self, index: i32, limit: u64) -> RecordsError {
        match self {
            Fault::Malformed(what) => RecordsError::Malformed {
                index,
                what: what.to_string(),
            },
            Fault::TooLarge(limit) => RecordsError::TooLarge { limit },
            Fault::NoKey => RecordsError::NoKey {
                index,
                also: Vec::new(),
            },
            Fault::Timestamp(timestamp, w) => RecordsError::Timestamp {
                index,
                timestamp,
                earliest: w.earliest,
                latest: w.latest,
                also: Vec::new(),
            },
            Fault::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof => RecordsError::Malformed {
                index,
                what: "the records section ends inside it".to_string(),
            },
            Fault::Io(e) if e.get_ref().is_some_and(|i| i.is::<OverLimit>()) => {
                RecordsError::TooLarge { limit }
            }
            Fault::Io(e) => RecordsError::Decompress(e.to_string()),
        }
    }
}

/// A records section being read: counts what was taken, refuses to pass the limit.
struct Stream<R> {
    r: R,
    read: u64,
    limit: u64,
}

impl<R: BufRead> Stream<R> {
    fn take(&mut self, n: u64) -> Result<(), Fault> {
        self.read += n;
        if self.read > self.limit {
            return Err(Fault::TooLarge(self.limit));
        }
        Ok(())
    }

    fn byte(&mut self) -> Result<u8, Fault> {
        self.take(1)?;
        let buf = self.r.fill_buf().map_err(Fault::Io)?;
        let Some(&b) = buf.first() else {
            return Err(Fault::Io(io::ErrorKind::UnexpectedEof.into()));
        };
        self.r.consume(1);
        Ok(b)
    }

    /// A zigzag varint or varlong (at most 10 bytes).
    fn varint(&mut self) -> Result<i64, Fault> {
        let mut value: u64 = 0;
        for shift in (0..70).step_by(7) {
            let b = self.byte()?;
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(((value >> 1) as i64) ^ -((value & 1) as i64));
            }
        }
        Err(Fault::Malformed("a varint runs past 10 bytes"))
    }

    /// Passes over `n` bytes without copying them.
    fn skip(&mut self, mut n: u64) -> Result<(), Fault> {
        self.take(n)?;
        while n > 0 {
            let buf = self.r.fill_buf().map_err(Fault::Io)?;
            if buf.is_empty() {
                return Err(Fault::Io(io::ErrorKind::UnexpectedEof.into()));
            }
            let step = buf.len().min(usize::try_from(n).unwrap_or(usize::MAX));
            self.r.consume(step);
            n -= step as u64;
        }
        Ok(())
    }
}

/// One record (Kafka's DefaultRecord): length, attributes, timestamp delta, offset delta,
/// key, value, headers; `index` is its place in the batch. `Ok(Some(..))`: a whole record
/// the topic refuses (no key, a timestamp outside the window).
fn check_record<R: BufRead>(
    s: &mut Stream<R>,
    index: i32,
    rules: RecordRules,
) -> Result<Option<Fault>, Fault> {
    let mut refused = None;
    let len = s.varint()?;
    if len <= 0 || len > i64::from(i32::MAX) {
        return Err(Fault::Malformed("its length is not positive"));
    }
    let end = s.read + len as u64;
    // what is left of the record: no field may claim more
    let left = |s: &Stream<R>| end.saturating_sub(s.read);
    s.byte()?; // attributes (unused in v2)
    let delta = s.varint()?;
    if let Some(w) = rules.timestamps {
        let ts = w.base.saturating_add(delta);
        if ts != -1 && (ts < w.earliest || ts > w.latest) {
            refused = Some(Fault::Timestamp(ts, w));
        }
    }
    if s.varint()? != i64::from(index) {
        return Err(Fault::Malformed(
            "its offset delta is not its index in the batch",
        ));
    }
    let key = s.varint()?;
    if key < -1 {
        return Err(Fault::Malformed("its key length is below -1"));
    }
    if key == -1 && rules.keys_required && refused.is_none() {
        refused = Some(Fault::NoKey);
    }
    bytes(s, key, left(s))?;
    let value = s.varint()?;
    if value < -1 {
        return Err(Fault::Malformed("its value length is below -1"));
    }
    bytes(s, value, left(s))?;
    let headers = s.varint()?;
    // each header takes at least two bytes (two lengths)
    if headers < 0 || headers as u64 > left(s) / 2 {
        return Err(Fault::Malformed("its header count does not fit its length"));
    }
    for _ in 0..headers {
        let name = s.varint()?;
        if name < 0 {
            return Err(Fault::Malformed("a header name is null or negative"));
        }
        bytes(s, name, left(s))?;
        let value = s.varint()?;
        if value < -1 {
            return Err(Fault::Malformed("a header value length is below -1"));
        }
        bytes(s, value, left(s))?;
    }
    if s.read != end {
        return Err(Fault::Malformed("its fields do not add up to its length"));
    }
    Ok(refused)
}

/// Passes over a length-prefixed field (`-1`: null) that must fit in `left` bytes.
fn bytes<R: BufRead>(s: &mut Stream<R>, len: i64, left: u64) -> Result<(), Fault> {
    if len <= 0 {
        return Ok(());
    }
    if len as u64 > left {
        return Err(Fault::Malformed("a field runs past the record's length"));
    }
    s.skip(len as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::build::{batch, batch_with_headers, FullRec, ProducerIds, Rec};
    use crate::batch::HEADER_LEN;

    const OPEN: RecordRules = RecordRules {
        keys_required: false,
        limit: 1 << 20,
        timestamps: None,
    };

    fn section(b: &[u8]) -> &[u8] {
        &b[HEADER_LEN..]
    }

    fn recs(n: usize) -> Vec<u8> {
        let values: Vec<Vec<u8>> = (0..n).map(|i| vec![b'v'; i * 7]).collect();
        let recs: Vec<Rec> = values
            .iter()
            .enumerate()
            .map(|(i, v)| Rec {
                key: (i % 2 == 0).then_some(b"k".as_slice()),
                value: Some(v),
                timestamp_delta: i as i64,
            })
            .collect();
        batch(0, ProducerIds::NONE, &recs)
    }

    #[test]
    fn well_formed_records_pass() {
        let b = recs(20);
        check_records(section(&b), 20, OPEN).unwrap();
        let h = batch_with_headers(&[FullRec {
            key: Some(b"k"),
            value: None,
            timestamp: 5,
            headers: vec![(b"h".as_slice(), Some(b"x".as_slice())), (b"e", None)],
        }]);
        check_records(section(&h), 1, OPEN).unwrap();
    }

    #[test]
    fn a_count_that_disagrees_with_the_records_is_refused() {
        let b = recs(3);
        assert_eq!(
            check_records(section(&b), 2, OPEN),
            Err(RecordsError::Trailing { count: 2 })
        );
        assert!(matches!(
            check_records(section(&b), 4, OPEN),
            Err(RecordsError::Malformed { index: 3, .. })
        ));
    }

    #[test]
    fn a_compacted_topic_needs_keys() {
        let b = recs(3);
        let rules = RecordRules {
            keys_required: true,
            ..OPEN
        };
        assert_eq!(
            check_records(section(&b), 3, rules),
            Err(RecordsError::NoKey {
                index: 1,
                also: vec![]
            })
        );
    }

    #[test]
    fn record_timestamps_outside_the_window_are_refused() {
        let b = recs(4); // timestamp deltas 0..=3
        let window = |base, earliest, latest| RecordRules {
            timestamps: Some(TimestampWindow {
                base,
                earliest,
                latest,
            }),
            ..OPEN
        };
        assert_eq!(check_records(section(&b), 4, window(100, 100, 103)), Ok(()));
        assert_eq!(
            check_records(section(&b), 4, window(100, 100, 102)),
            Err(RecordsError::Timestamp {
                index: 3,
                timestamp: 103,
                earliest: 100,
                latest: 102,
                also: vec![]
            })
        );
        let early = check_records(section(&b), 4, window(100, 101, 200)).unwrap_err();
        assert_eq!(early.record_indexes(), vec![0]);
        // every record outside the window is named, the first described
        let late = check_records(section(&b), 4, window(100, 100, 101)).unwrap_err();
        assert_eq!(late.record_indexes(), vec![2, 3]);
        assert!(late.to_string().contains("and 1 more record"), "{late}");
        assert!(early.to_string().contains("timestamp 100"), "{early}");
        // a record without a timestamp (-1) is not checked
        let one = recs(1);
        assert_eq!(check_records(section(&one), 1, window(-1, 0, 10)), Ok(()));
    }

    #[test]
    fn the_limit_bounds_what_is_read() {
        let b = recs(20);
        let rules = RecordRules { limit: 100, ..OPEN };
        assert_eq!(
            check_records(section(&b), 20, rules),
            Err(RecordsError::TooLarge { limit: 100 })
        );
    }

    /// Whatever a damaged section holds, the checker never panics, and what it accepts the
    /// tools' decoder ([`crate::batch::raw_records`]) reads as the same records, in order.
    #[test]
    fn damaged_records_are_refused_or_decodable() {
        let b = recs(20);
        let clean = section(&b).to_vec();
        let mut refused = 0;
        for at in 0..clean.len() {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut d = clean.clone();
                d[at] ^= flip;
                if check_records(d.as_slice(), 20, OPEN).is_err() {
                    refused += 1;
                    continue;
                }
                let decoded = crate::batch::raw_records(&d, 20)
                    .unwrap_or_else(|| panic!("accepted, but undecodable: byte {at} ^ {flip:#x}"));
                assert!(decoded
                    .iter()
                    .enumerate()
                    .all(|(i, r)| r.offset_delta == i as i64));
            }
        }
        assert!(refused > 100, "only {refused} refused");
    }

    #[test]
    fn an_offset_delta_out_of_place_is_refused() {
        // record: len 6, attrs 0, ts 0, offset delta 1 (zigzag 2), key -1, value -1, 0 headers
        let rec = [12u8, 0, 0, 2, 1, 1, 0];
        assert!(matches!(
            check_records(rec.as_slice(), 1, OPEN),
            Err(RecordsError::Malformed { index: 0, ref what }) if what.contains("offset delta")
        ));
    }
}
