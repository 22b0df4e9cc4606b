//! Segment file naming and the sparse index entry formats.
//!
//! A segment is named by its base offset, zero-padded to 20 digits, with one file per kind:
//! `00000000000000000000.log` (batches), `.index` (offset index), `.timeindex` (time index),
//! `.snapshot` (producer state at that offset). Index entries are fixed-size big-endian
//! records, as in Kafka:
//! - offset index: relative offset u32, byte position u32 (8 bytes);
//! - time index: max timestamp so far i64, relative offset u32 (12 bytes).

use std::fmt;

pub const LOG_SUFFIX: &str = "log";
pub const INDEX_SUFFIX: &str = "index";
pub const TIME_INDEX_SUFFIX: &str = "timeindex";
pub const SNAPSHOT_SUFFIX: &str = "snapshot";

pub const OFFSET_ENTRY_LEN: usize = 8;
pub const TIME_ENTRY_LEN: usize = 12;

/// File name of the `suffix` file of the segment starting at `base_offset`.
pub fn file_name(base_offset: u64, suffix: &str) -> String {
    format!("{base_offset:020}.{suffix}")
}

/// Parses a segment file name back into (base offset, suffix). `None` for other files.
pub fn parse_file_name(name: &str) -> Option<(u64, &str)> {
    let (stem, suffix) = name.split_once('.')?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((stem.parse().ok()?, suffix))
}

/// One offset-index entry: the batch starting at `base + relative_offset` begins at `position`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffsetEntry {
    pub relative_offset: u32,
    pub position: u32,
}

/// One time-index entry: up to and including the batch at `base + relative_offset`, no
/// timestamp exceeded `timestamp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeEntry {
    pub timestamp: i64,
    pub relative_offset: u32,
}

/// Why an index file cannot be trusted; the caller rebuilds it from the log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    #[error("index length {len} is not a multiple of the {entry}-byte entry")]
    Length { len: usize, entry: usize },
    #[error("index entry {at} goes backwards")]
    NotMonotonic { at: usize },
}

impl fmt::Display for OffsetEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "+{}@{}", self.relative_offset, self.position)
    }
}

pub fn encode_offset_entries(entries: &[OffsetEntry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * OFFSET_ENTRY_LEN);
    for e in entries {
        out.extend_from_slice(&e.relative_offset.to_be_bytes());
        out.extend_from_slice(&e.position.to_be_bytes());
    }
    out
}

/// Decodes an offset index, checking that offsets and positions strictly increase.
pub fn decode_offset_entries(bytes: &[u8]) -> Result<Vec<OffsetEntry>, IndexError> {
    if !bytes.len().is_multiple_of(OFFSET_ENTRY_LEN) {
        return Err(IndexError::Length {
            len: bytes.len(),
            entry: OFFSET_ENTRY_LEN,
        });
    }
    let entries: Vec<OffsetEntry> = bytes
        .chunks_exact(OFFSET_ENTRY_LEN)
        .map(|c| OffsetEntry {
            relative_offset: u32::from_be_bytes(c[0..4].try_into().expect("4 bytes")),
            position: u32::from_be_bytes(c[4..8].try_into().expect("4 bytes")),
        })
        .collect();
    for (i, w) in entries.windows(2).enumerate() {
        if w[1].relative_offset <= w[0].relative_offset || w[1].position <= w[0].position {
            return Err(IndexError::NotMonotonic { at: i + 1 });
        }
    }
    Ok(entries)
}

pub fn encode_time_entries(entries: &[TimeEntry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * TIME_ENTRY_LEN);
    for e in entries {
        out.extend_from_slice(&e.timestamp.to_be_bytes());
        out.extend_from_slice(&e.relative_offset.to_be_bytes());
    }
    out
}

/// Decodes a time index, checking that timestamps and offsets never go backwards.
pub fn decode_time_entries(bytes: &[u8]) -> Result<Vec<TimeEntry>, IndexError> {
    if !bytes.len().is_multiple_of(TIME_ENTRY_LEN) {
        return Err(IndexError::Length {
            len: bytes.len(),
            entry: TIME_ENTRY_LEN,
        });
    }
    let entries: Vec<TimeEntry> = bytes
        .chunks_exact(TIME_ENTRY_LEN)
        .map(|c| TimeEntry {
            timestamp: i64::from_be_bytes(c[0..8].try_into().expect("8 bytes")),
            relative_offset: u32::from_be_bytes(c[8..12].try_into().expect("4 bytes")),
        })
        .collect();
    for (i, w) in entries.windows(2).enumerate() {
        if w[1].relative_offset < w[0].relative_offset || w[1].timestamp < w[0].timestamp {
            return Err(IndexError::NotMonotonic { at: i + 1 });
        }
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_round_trip() {
        assert_eq!(file_name(42, LOG_SUFFIX), "00000000000000000042.log");
        assert_eq!(
            parse_file_name("00000000000000000042.timeindex"),
            Some((42, "timeindex"))
        );
        assert_eq!(parse_file_name("leader-epoch-checkpoint"), None);
        assert_eq!(parse_file_name("0042.log"), None);
    }

    #[test]
    fn non_monotonic_index_is_refused() {
        let e = [
            OffsetEntry {
                relative_offset: 5,
                position: 100,
            },
            OffsetEntry {
                relative_offset: 4,
                position: 200,
            },
        ];
        assert_eq!(
            decode_offset_entries(&encode_offset_entries(&e)),
            Err(IndexError::NotMonotonic { at: 1 })
        );
        assert!(decode_offset_entries(&[0; 7]).is_err());
    }

    proptest! {
        #[test]
        fn offset_entries_round_trip(steps in proptest::collection::vec((1u32..1000, 1u32..100_000), 0..50)) {
            let mut rel = 0; let mut pos = 0;
            let entries: Vec<_> = steps.iter().map(|(dr, dp)| { rel += dr; pos += dp; OffsetEntry { relative_offset: rel, position: pos } }).collect();
            prop_assert_eq!(decode_offset_entries(&encode_offset_entries(&entries)).unwrap(), entries);
        }

        #[test]
        fn time_entries_round_trip(steps in proptest::collection::vec((0i64..1000, 0u32..100), 0..50)) {
            let mut ts = 0; let mut rel = 0;
            let entries: Vec<_> = steps.iter().map(|(dt, dr)| { ts += dt; rel += dr; TimeEntry { timestamp: ts, relative_offset: rel } }).collect();
            prop_assert_eq!(decode_time_entries(&encode_time_entries(&entries)).unwrap(), entries);
        }
    }
}
