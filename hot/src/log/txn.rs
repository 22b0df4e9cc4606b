//! The aborted transactions of one partition's log, and its last stable offset.
//!
//! A `read_committed` consumer reads only below the last stable offset (LSO): the first
//! offset of the oldest transaction that is still open here, or whose marker the high
//! watermark has not passed yet, and never past the high watermark. It drops the records
//! of aborted transactions itself, from the list a fetch answers with: the producer id and
//! first offset of each aborted transaction whose range meets the records fetched (as
//! Kafka's `.txnindex` serves it).
//!
//! Which transactions are open is producer state ([`super::producer_state`]); this module
//! keeps the ended ones: those whose marker may still be above the high watermark (in
//! memory), and the aborted ones, in memory and in the file `aborted-transactions`, an
//! append-only list of 28-byte entries (producer id, first offset, last offset = the abort
//! marker's offset, CRC32C of the three). The file is fsynced before every producer
//! snapshot, so an entry below a snapshot's offset is never lost with the page cache: the
//! entries at or above it are rebuilt by the replay of the log after the snapshot.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

pub const ABORTED_FILE: &str = "aborted-transactions";
const ENTRY_LEN: usize = 28;

/// One aborted transaction in this partition (the manifest's type: segments carry their
/// aborted transactions to the cold tier).
pub use strata_cold::manifest::AbortedTxn;

fn encode(t: &AbortedTxn) -> [u8; ENTRY_LEN] {
    let mut out = [0u8; ENTRY_LEN];
    out[..8].copy_from_slice(&t.producer_id.to_be_bytes());
    out[8..16].copy_from_slice(&t.first_offset.to_be_bytes());
    out[16..24].copy_from_slice(&t.last_offset.to_be_bytes());
    let crc = crc32c::crc32c(&out[..24]);
    out[24..].copy_from_slice(&crc.to_be_bytes());
    out
}

fn decode(b: &[u8]) -> Option<AbortedTxn> {
    let crc = u32::from_be_bytes(b.get(24..28)?.try_into().ok()?);
    if crc32c::crc32c(&b[..24]) != crc {
        return None;
    }
    let n = |at: usize| u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"));
    Some(AbortedTxn {
        producer_id: n(0) as i64,
        first_offset: n(8),
        last_offset: n(16),
    })
}

/// The ended transactions of one partition log.
pub struct TxnIndex {
    path: PathBuf,
    file: File,
    /// By last offset (the marker's).
    aborted: BTreeMap<u64, AbortedTxn>,
    /// Transactions ended by a marker the high watermark may not have passed: marker
    /// offset -> first offset.
    ending: BTreeMap<u64, u64>,
    /// Entries written since the last fsync.
    dirty: bool,
}

impl TxnIndex {
    /// Loads `dir`'s list, cutting a torn or damaged tail.
    pub fn open(dir: &Path) -> io::Result<Self> {
        let path = dir.join(ABORTED_FILE);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        let mut aborted = BTreeMap::new();
        let mut good = 0;
        for chunk in bytes.chunks(ENTRY_LEN) {
            let Some(t) = decode(chunk) else {
                break;
            };
            aborted.insert(t.last_offset, t);
            good += ENTRY_LEN;
        }
        let file = strata_core::private_fs::open_options()
            .create(true)
            .append(true)
            .open(&path)?;
        if good != bytes.len() {
            tracing::warn!(file = %path.display(), kept = aborted.len(), "cut a damaged tail of the aborted-transaction list");
            file.set_len(good as u64)?;
            file.sync_all()?;
        }
        Ok(TxnIndex {
            path,
            file,
            aborted,
            ending: BTreeMap::new(),
            dirty: false,
        })
    }

    /// A marker at `marker_offset` ended the transaction that started at `first`.
    pub fn ended(
        &mut self,
        producer_id: i64,
        first: u64,
        marker_offset: u64,
        commit: bool,
    ) -> io::Result<()> {
        self.ending.insert(marker_offset, first);
        if commit {
            return Ok(());
        }
        let t = AbortedTxn {
            producer_id,
            first_offset: first,
            last_offset: marker_offset,
        };
        self.file.write_all(&encode(&t))?;
        self.aborted.insert(marker_offset, t);
        self.dirty = true;
        Ok(())
    }

    /// The last stable offset at high watermark `hw`, given the first offset of the
    /// oldest open transaction.
    pub fn last_stable(&mut self, oldest_open: Option<u64>, hw: u64) -> u64 {
        // Markers below the high watermark are committed: their transactions are stable.
        while self
            .ending
            .first_key_value()
            .is_some_and(|(at, _)| *at < hw)
        {
            self.ending.pop_first();
        }
        let ending = self.ending.values().min().copied();
        [Some(hw), oldest_open, ending]
            .into_iter()
            .flatten()
            .min()
            .expect("hw is there")
    }

    /// The aborted transactions a fetch of `[from, to)` must report: those ending at or
    /// after `from` and starting before `to`.
    pub fn aborted_between(&self, from: u64, to: u64) -> Vec<AbortedTxn> {
        self.aborted
            .range(from..)
            .map(|(_, t)| *t)
            .filter(|t| t.first_offset < to)
            .collect()
    }

    /// Every aborted transaction whose marker lies in `[from, to)` (a segment's range).
    pub fn aborted_in(&self, from: u64, to: u64) -> Vec<AbortedTxn> {
        self.aborted.range(from..to).map(|(_, t)| *t).collect()
    }

    pub fn aborted_count(&self) -> usize {
        self.aborted.len()
    }

    /// Forgets what ended at or after `offset` (a truncation, or the replay after a
    /// snapshot at `offset` is about to rebuild it).
    pub fn forget_from(&mut self, offset: u64) -> io::Result<()> {
        self.ending.split_off(&offset);
        if self.aborted.range(offset..).next().is_some() {
            self.aborted.split_off(&offset);
            self.rewrite()?;
        }
        Ok(())
    }

    /// Forgets the aborted transactions wholly below the log start `start`.
    pub fn forget_before(&mut self, start: u64) -> io::Result<()> {
        if self.aborted.range(..start).next().is_some() {
            self.aborted = self.aborted.split_off(&start);
            self.rewrite()?;
        }
        Ok(())
    }

    /// fsyncs entries written since the last call.
    pub fn sync(&mut self) -> io::Result<()> {
        if std::mem::take(&mut self.dirty) {
            self.file.sync_data()?;
        }
        Ok(())
    }

    fn rewrite(&mut self) -> io::Result<()> {
        let bytes: Vec<u8> = self.aborted.values().flat_map(encode).collect();
        let dir = self.path.parent().expect("a log directory");
        super::write_atomically(dir, ABORTED_FILE, &bytes)?;
        self.file = OpenOptions::new().append(true).open(&self.path)?;
        self.dirty = false;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_stable_offset_waits_for_open_and_uncommitted_markers() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = TxnIndex::open(dir.path()).unwrap();
        assert_eq!(t.last_stable(None, 10), 10);
        assert_eq!(t.last_stable(Some(4), 10), 4, "an open transaction");
        t.ended(1, 4, 12, true).unwrap();
        assert_eq!(
            t.last_stable(None, 12),
            4,
            "its marker is not below the hw yet"
        );
        assert_eq!(t.last_stable(None, 13), 13);
        assert_eq!(
            t.last_stable(None, 12),
            12,
            "a marker once committed stays stable"
        );
    }

    #[test]
    fn aborted_transactions_are_reported_where_they_meet_a_fetch_and_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = TxnIndex::open(dir.path()).unwrap();
        t.ended(1, 0, 5, false).unwrap();
        t.ended(2, 3, 6, true).unwrap();
        t.ended(3, 7, 9, false).unwrap();
        let ids = |v: Vec<AbortedTxn>| v.iter().map(|a| a.producer_id).collect::<Vec<_>>();
        assert_eq!(ids(t.aborted_between(0, 3)), vec![1]);
        assert_eq!(ids(t.aborted_between(6, 8)), vec![3]);
        assert_eq!(ids(t.aborted_between(5, 20)), vec![1, 3]);
        assert_eq!(ids(t.aborted_between(10, 20)), Vec::<i64>::new());
        drop(t);
        // a torn last entry is cut
        let path = dir.path().join(ABORTED_FILE);
        let mut bytes = fs::read(&path).unwrap();
        bytes.extend_from_slice(&[1, 2, 3]);
        fs::write(&path, &bytes).unwrap();
        let mut t = TxnIndex::open(dir.path()).unwrap();
        assert_eq!(ids(t.aborted_between(0, 20)), vec![1, 3]);
        assert_eq!(fs::metadata(&path).unwrap().len(), 2 * ENTRY_LEN as u64);
        t.forget_from(8).unwrap();
        t.forget_before(1).unwrap();
        assert_eq!(ids(t.aborted_between(0, 20)), vec![1]);
        t.ended(4, 10, 11, false).unwrap();
        drop(t);
        let t = TxnIndex::open(dir.path()).unwrap();
        assert_eq!(ids(t.aborted_between(0, 20)), vec![1, 4]);
        assert_eq!(t.aborted_in(6, 12).len(), 1);
    }
}
