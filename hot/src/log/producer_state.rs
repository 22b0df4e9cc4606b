//! Idempotent-producer state of one partition: the last five batches each producer id wrote.
//!
//! Pure logic, no I/O: the log feeds it every appended batch header (live appends and the
//! replay after a restart) and asks it, before each append, whether a batch is new, a retry of
//! one already written (answered with its original offsets) or out of order. Snapshots let a
//! restart replay only the log after the snapshot's offset. After a truncation the log
//! rebuilds the table (snapshot plus replay) rather than trimming it: a producer whose
//! retained batches all lay past the cut would be forgotten.
//!
//! A producer id silent for `producer.id.expiration.ms` (KIP-854, a day by default) is
//! forgotten, as in Kafka: ids are chosen by clients, and the table would otherwise grow
//! forever. "Silent" is measured from the broker's clock when its last batch was appended
//! here (or when the broker started, for batches replayed from the log), never from a
//! client-chosen timestamp. A producer with a transaction open here is never forgotten.
//!
//! Transactions: a transactional batch opens the producer's transaction at its base offset
//! (unless one is open); its marker (a control batch) ends it. The first offsets of the
//! open transactions bound the last stable offset.

use std::collections::{HashMap, VecDeque};

use strata_core::batch::{wrapping_seq_add, BatchHeader};

/// Batches remembered per producer, as in Kafka (`max.in.flight.requests.per.connection` <= 5).
pub const RETAINED_BATCHES: usize = 5;

/// A batch a producer wrote: its sequence range and where it landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WrittenBatch {
    pub first_seq: i32,
    pub last_seq: i32,
    pub base_offset: u64,
    pub last_offset: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ProducerEntry {
    epoch: i16,
    batches: VecDeque<WrittenBatch>,
    /// Broker time (ms) of its last batch here.
    last_ms: i64,
    /// The first offset of its transaction open in this partition.
    txn_first: Option<u64>,
}

/// A producer as DescribeProducers shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActiveProducer {
    pub producer_id: i64,
    pub epoch: i16,
    pub last_sequence: i32,
    pub last_offset: u64,
    /// Broker time (ms) of its last batch here.
    pub last_ms: i64,
    /// The first offset of its open transaction here.
    pub txn_first: Option<u64>,
}

/// What to do with an incoming batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceCheck {
    /// Not idempotent, or the next batch in sequence: append it.
    Append,
    /// A retry of a batch already in the log: answer with its offsets, append nothing.
    Duplicate(WrittenBatch),
    /// The producer epoch is older than one already seen (a zombie producer).
    FencedEpoch { current: i16 },
    /// The sequence does not follow the last one written (a gap or reordering).
    OutOfOrder { expected: i32, got: i32 },
    /// A plain batch from a producer whose transaction is open here (Kafka's
    /// INVALID_TXN_STATE).
    InTransaction,
}

/// Producer id -> last batches, for one partition.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ProducerStateTable {
    producers: HashMap<i64, ProducerEntry>,
    /// (first offset, producer id) of every open transaction.
    open: std::collections::BTreeSet<(u64, i64)>,
}

impl ProducerStateTable {
    /// Decides what to do with a batch before it is appended.
    pub fn check(&self, h: &BatchHeader) -> SequenceCheck {
        if !h.has_producer_id() {
            return SequenceCheck::Append;
        }
        let first = h.base_sequence;
        let last = h.last_sequence();
        let Some(entry) = self.producers.get(&h.producer_id) else {
            // Kafka accepts any sequence from a producer it has no state for (its state may have
            // been removed with the segments that held it).
            return SequenceCheck::Append;
        };
        if h.producer_epoch < entry.epoch {
            return SequenceCheck::FencedEpoch {
                current: entry.epoch,
            };
        }
        if !h.is_transactional() && entry.txn_first.is_some() && h.producer_epoch == entry.epoch {
            return SequenceCheck::InTransaction;
        }
        if h.producer_epoch > entry.epoch {
            return if first == 0 {
                SequenceCheck::Append
            } else {
                SequenceCheck::OutOfOrder {
                    expected: 0,
                    got: first,
                }
            };
        }
        if let Some(dup) = entry
            .batches
            .iter()
            .find(|b| b.first_seq == first && b.last_seq == last)
        {
            return SequenceCheck::Duplicate(*dup);
        }
        match entry.batches.back() {
            Some(prev) if wrapping_seq_add(prev.last_seq, 1) != first => {
                SequenceCheck::OutOfOrder {
                    expected: wrapping_seq_add(prev.last_seq, 1),
                    got: first,
                }
            }
            _ => SequenceCheck::Append,
        }
    }

    /// Records a batch that is now in the log (stamped header: base offset is final),
    /// appended (or replayed) at broker time `at_ms`.
    pub fn record(&mut self, h: &BatchHeader, at_ms: i64) {
        if !h.has_producer_id() || h.base_offset < 0 {
            return;
        }
        if h.is_control() {
            self.end_txn(h.producer_id, h.producer_epoch, at_ms);
            return;
        }
        let written = WrittenBatch {
            first_seq: h.base_sequence,
            last_seq: h.last_sequence(),
            base_offset: h.base_offset as u64,
            last_offset: h.last_offset() as u64,
        };
        let entry = self
            .producers
            .entry(h.producer_id)
            .or_insert_with(|| ProducerEntry {
                epoch: h.producer_epoch,
                batches: VecDeque::new(),
                last_ms: at_ms,
                txn_first: None,
            });
        entry.last_ms = entry.last_ms.max(at_ms);
        if h.producer_epoch != entry.epoch {
            entry.epoch = h.producer_epoch;
            entry.batches.clear();
        }
        if h.is_transactional() && entry.txn_first.is_none() {
            entry.txn_first = Some(written.base_offset);
            self.open.insert((written.base_offset, h.producer_id));
        }
        if entry.batches.len() == RETAINED_BATCHES {
            entry.batches.pop_front();
        }
        entry.batches.push_back(written);
    }

    pub fn len(&self) -> usize {
        self.producers.len()
    }

    /// A marker of `producer_id` at `epoch` ends its transaction here (if one is open);
    /// returns where that transaction started. A marker's epoch may be newer than the
    /// producer's (the coordinator bumped it to fence a zombie): its sequences start over.
    pub fn end_txn(&mut self, producer_id: i64, epoch: i16, at_ms: i64) -> Option<u64> {
        let entry = self
            .producers
            .entry(producer_id)
            .or_insert_with(|| ProducerEntry {
                epoch,
                batches: VecDeque::new(),
                last_ms: at_ms,
                txn_first: None,
            });
        entry.last_ms = entry.last_ms.max(at_ms);
        if epoch > entry.epoch {
            entry.epoch = epoch;
            entry.batches.clear();
        }
        let first = entry.txn_first.take()?;
        self.open.remove(&(first, producer_id));
        Some(first)
    }

    /// Whether a write at `epoch` for `producer_id` that carries no sequence (a marker, a
    /// coordinator's batch) may go: not when the producer has written at a newer epoch
    /// here (a marker's coordinator, or the producer, is stale).
    pub fn check_epoch(&self, producer_id: i64, epoch: i16) -> Result<(), i16> {
        match self.producers.get(&producer_id) {
            Some(e) if epoch < e.epoch => Err(e.epoch),
            _ => Ok(()),
        }
    }

    /// The first offset of `producer_id`'s open transaction here.
    /// Whether `producer_id`'s transaction at `epoch` is open here.
    pub fn txn_open_at(&self, producer_id: i64, epoch: i16) -> bool {
        self.producers
            .get(&producer_id)
            .is_some_and(|e| e.epoch == epoch && e.txn_first.is_some())
    }

    /// Whether this partition remembers `producer_id`.
    pub fn knows(&self, producer_id: i64) -> bool {
        self.producers.contains_key(&producer_id)
    }

    pub fn open_txn(&self, producer_id: i64) -> Option<u64> {
        self.producers.get(&producer_id)?.txn_first
    }

    /// The first offset of the oldest transaction open here.
    pub fn first_open_txn(&self) -> Option<u64> {
        self.open.first().map(|(o, _)| *o)
    }

    /// Every open transaction: (first offset, producer id), oldest first.
    pub fn open_txns(&self) -> impl Iterator<Item = (u64, i64)> + '_ {
        self.open.iter().copied()
    }

    /// The producers this partition remembers, by id: their epoch, the last sequence and
    /// offset written, and the broker time of their last batch (DescribeProducers).
    pub fn active(&self) -> Vec<ActiveProducer> {
        let mut out: Vec<ActiveProducer> = self
            .producers
            .iter()
            .filter_map(|(id, e)| {
                let last = e.batches.back()?;
                Some(ActiveProducer {
                    producer_id: *id,
                    epoch: e.epoch,
                    last_sequence: last.last_seq,
                    last_offset: last.last_offset,
                    last_ms: e.last_ms,
                    txn_first: e.txn_first,
                })
            })
            .collect();
        out.sort_unstable_by_key(|p| p.producer_id);
        out
    }

    /// Forgets the producers with no batch for `after_ms` or more by `now_ms`; returns how
    /// many.
    pub fn expire(&mut self, now_ms: i64, after_ms: i64) -> usize {
        let before = self.producers.len();
        self.producers
            .retain(|_, e| e.txn_first.is_some() || now_ms.saturating_sub(e.last_ms) < after_ms);
        before - self.producers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }

    /// Encodes the table with a trailing CRC32C. `offset` is the log offset it is valid at.
    pub fn encode_snapshot(&self, offset: u64) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(SNAPSHOT_MAGIC);
        out.extend_from_slice(&offset.to_be_bytes());
        out.extend_from_slice(&(self.producers.len() as u32).to_be_bytes());
        let mut ids: Vec<_> = self.producers.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let e = &self.producers[&id];
            out.extend_from_slice(&id.to_be_bytes());
            out.extend_from_slice(&e.epoch.to_be_bytes());
            out.extend_from_slice(&e.last_ms.to_be_bytes());
            out.extend_from_slice(&e.txn_first.map_or(-1, |o| o as i64).to_be_bytes());
            out.push(e.batches.len() as u8);
            for b in &e.batches {
                out.extend_from_slice(&b.first_seq.to_be_bytes());
                out.extend_from_slice(&b.last_seq.to_be_bytes());
                out.extend_from_slice(&b.base_offset.to_be_bytes());
                out.extend_from_slice(&b.last_offset.to_be_bytes());
            }
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_be_bytes());
        out
    }

    /// Decodes a snapshot; `None` when it is damaged (the caller then replays more log).
    /// Producers of a snapshot written before expiry existed (`SPS1`) count as last seen at
    /// `loaded_ms`.
    pub fn decode_snapshot(bytes: &[u8], loaded_ms: i64) -> Option<(u64, Self)> {
        let (body, crc) = bytes.split_at_checked(bytes.len().checked_sub(4)?)?;
        if crc32c::crc32c(body) != u32::from_be_bytes(crc.try_into().ok()?) {
            return None;
        }
        let mut r = Reader(body);
        let (timed, txns) = match r.take(SNAPSHOT_MAGIC.len())? {
            m if m == SNAPSHOT_MAGIC => (true, true),
            m if m == SNAPSHOT_MAGIC_V2 => (true, false),
            m if m == SNAPSHOT_MAGIC_V1 => (false, false),
            _ => return None,
        };
        let offset = r.u64()?;
        let count = r.u32()?;
        let mut table = ProducerStateTable::default();
        for _ in 0..count {
            let id = r.u64()? as i64;
            let epoch = r.u16()? as i16;
            let last_ms = if timed { r.u64()? as i64 } else { loaded_ms };
            let txn_first = if txns {
                Some(r.u64()? as i64).filter(|o| *o >= 0).map(|o| o as u64)
            } else {
                None
            };
            let n = r.take(1)?[0] as usize;
            let mut batches = VecDeque::with_capacity(n);
            for _ in 0..n {
                batches.push_back(WrittenBatch {
                    first_seq: r.u32()? as i32,
                    last_seq: r.u32()? as i32,
                    base_offset: r.u64()?,
                    last_offset: r.u64()?,
                });
            }
            if let Some(first) = txn_first {
                table.open.insert((first, id));
            }
            table.producers.insert(
                id,
                ProducerEntry {
                    epoch,
                    batches,
                    last_ms,
                    txn_first,
                },
            );
        }
        r.0.is_empty().then_some((offset, table))
    }
}

/// Snapshots with each producer's last time and open transaction; `SPS2` (without the
/// transaction) and `SPS1` (without either) are still read.
const SNAPSHOT_MAGIC: &[u8] = b"SPS3";
const SNAPSHOT_MAGIC_V2: &[u8] = b"SPS2";
const SNAPSHOT_MAGIC_V1: &[u8] = b"SPS1";

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header(pid: i64, epoch: i16, seq: i32, count: i32, base: i64) -> BatchHeader {
        BatchHeader {
            base_offset: base,
            batch_length: 100,
            leader_epoch: 0,
            magic: 2,
            crc: 0,
            attributes: 0,
            last_offset_delta: count - 1,
            base_timestamp: 0,
            max_timestamp: 0,
            producer_id: pid,
            producer_epoch: epoch,
            base_sequence: seq,
            record_count: count,
        }
    }

    #[test]
    fn in_order_batches_append_and_retries_are_duplicates() {
        let mut t = ProducerStateTable::default();
        let b0 = header(7, 0, 0, 3, 10);
        assert_eq!(t.check(&b0), SequenceCheck::Append);
        t.record(&b0, 0);
        let b1 = header(7, 0, 3, 2, 13);
        assert_eq!(t.check(&b1), SequenceCheck::Append);
        t.record(&b1, 0);
        // retry of b0 with an unstamped base offset
        match t.check(&header(7, 0, 0, 3, 0)) {
            SequenceCheck::Duplicate(w) => assert_eq!((w.base_offset, w.last_offset), (10, 12)),
            other => panic!("expected duplicate, got {other:?}"),
        }
        assert_eq!(
            t.check(&header(7, 0, 6, 1, 0)),
            SequenceCheck::OutOfOrder {
                expected: 5,
                got: 6
            }
        );
    }

    #[test]
    fn active_producers_show_their_last_batch_and_newest_epoch() {
        let mut t = ProducerStateTable::default();
        t.record(&header(9, 0, 0, 3, 0), 100);
        t.record(&header(4, 2, 0, 1, 3), 200);
        t.record(&header(9, 0, 3, 2, 4), 300);
        t.record(&header(4, 3, 0, 5, 6), 400);
        let got: Vec<_> = t
            .active()
            .iter()
            .map(|p| {
                (
                    p.producer_id,
                    p.epoch,
                    p.last_sequence,
                    p.last_offset,
                    p.last_ms,
                )
            })
            .collect();
        assert_eq!(got, vec![(4, 3, 4, 10, 400), (9, 0, 4, 5, 300)]);
    }

    #[test]
    fn only_last_five_batches_are_remembered() {
        let mut t = ProducerStateTable::default();
        for i in 0..6 {
            t.record(&header(1, 0, i, 1, i as i64), 0);
        }
        assert!(matches!(
            t.check(&header(1, 0, 0, 1, 0)),
            SequenceCheck::OutOfOrder { .. }
        ));
        assert!(matches!(
            t.check(&header(1, 0, 1, 1, 0)),
            SequenceCheck::Duplicate(_)
        ));
    }

    #[test]
    fn epochs_fence_and_reset() {
        let mut t = ProducerStateTable::default();
        t.record(&header(1, 3, 0, 1, 0), 0);
        assert_eq!(
            t.check(&header(1, 2, 1, 1, 0)),
            SequenceCheck::FencedEpoch { current: 3 }
        );
        assert!(matches!(
            t.check(&header(1, 4, 5, 1, 0)),
            SequenceCheck::OutOfOrder { .. }
        ));
        assert_eq!(t.check(&header(1, 4, 0, 1, 0)), SequenceCheck::Append);
        // unknown producers and non-idempotent batches always append
        assert_eq!(t.check(&header(9, 0, 77, 1, 0)), SequenceCheck::Append);
        assert_eq!(t.check(&header(-1, -1, -1, 1, 0)), SequenceCheck::Append);
    }

    #[test]
    fn sequence_wraps_at_i32_max() {
        let mut t = ProducerStateTable::default();
        t.record(&header(1, 0, i32::MAX - 1, 2, 0), 0);
        assert_eq!(t.check(&header(1, 0, 0, 1, 2)), SequenceCheck::Append);
    }

    #[test]
    fn damaged_snapshot_is_refused() {
        let mut t = ProducerStateTable::default();
        t.record(&header(1, 0, 0, 1, 0), 0);
        let mut bytes = t.encode_snapshot(1);
        bytes[6] ^= 1;
        assert!(ProducerStateTable::decode_snapshot(&bytes, 0).is_none());
        assert!(ProducerStateTable::decode_snapshot(&[], 0).is_none());
    }

    #[test]
    fn silent_producers_expire_and_leave_the_snapshot() {
        const DAY: i64 = 86_400_000;
        let mut t = ProducerStateTable::default();
        t.record(&header(1, 0, 0, 1, 0), 1_000);
        t.record(&header(2, 0, 0, 1, 1), 1_000);
        t.record(&header(2, 0, 1, 1, 2), 1_000 + DAY - 1);
        assert_eq!(t.expire(1_000 + DAY - 1, DAY), 0);
        assert_eq!(t.expire(1_000 + DAY, DAY), 1, "producer 1 was silent a day");
        // expired: any sequence is taken again, as from a producer never seen
        assert_eq!(t.check(&header(1, 0, 42, 1, 0)), SequenceCheck::Append);
        assert!(matches!(
            t.check(&header(2, 0, 42, 1, 0)),
            SequenceCheck::OutOfOrder { .. }
        ));
        let (_, back) =
            ProducerStateTable::decode_snapshot(&t.encode_snapshot(3), 0).expect("a snapshot");
        assert_eq!(back.len(), 1);
        assert_eq!(back, t, "the last-seen time survives the snapshot");
    }

    #[test]
    fn a_snapshot_from_before_expiry_reads_as_seen_at_load() {
        let mut t = ProducerStateTable::default();
        t.record(&header(5, 1, 0, 2, 0), 123);
        let mut v1 = t.encode_snapshot(2);
        // the SPS1 layout: no last-seen time (nor open transaction) after the epoch
        v1.truncate(v1.len() - 4);
        v1[..4].copy_from_slice(SNAPSHOT_MAGIC_V1);
        let at = 4 + 8 + 4 + 8 + 2;
        v1.drain(at..at + 16);
        let crc = crc32c::crc32c(&v1);
        v1.extend_from_slice(&crc.to_be_bytes());
        let (offset, mut old) =
            ProducerStateTable::decode_snapshot(&v1, 9_999).expect("an SPS1 snapshot");
        assert_eq!(offset, 2);
        assert!(matches!(
            old.check(&header(5, 1, 0, 2, 0)),
            SequenceCheck::Duplicate(_)
        ));
        assert_eq!(old.expire(9_999 + 10, 10), 1, "seen at load, not at 0");
    }

    fn txn_header(pid: i64, epoch: i16, seq: i32, count: i32, base: i64) -> BatchHeader {
        BatchHeader {
            attributes: 0x10,
            ..header(pid, epoch, seq, count, base)
        }
    }

    fn marker_header(pid: i64, epoch: i16, base: i64) -> BatchHeader {
        BatchHeader {
            attributes: 0x30,
            base_sequence: -1,
            ..header(pid, epoch, -1, 1, base)
        }
    }

    #[test]
    fn a_transaction_is_open_from_its_first_batch_to_its_marker() {
        let mut t = ProducerStateTable::default();
        t.record(&txn_header(1, 0, 0, 2, 10), 0);
        t.record(&txn_header(2, 0, 0, 1, 12), 0);
        t.record(&txn_header(1, 0, 2, 1, 13), 0);
        assert_eq!(t.open_txn(1), Some(10));
        assert_eq!(t.first_open_txn(), Some(10));
        assert_eq!(
            t.check(&header(1, 0, 3, 1, 0)),
            SequenceCheck::InTransaction,
            "a plain batch inside its own transaction"
        );
        t.record(&marker_header(1, 0, 14), 0);
        assert_eq!(t.open_txn(1), None);
        assert_eq!(t.first_open_txn(), Some(12));
        assert_eq!(t.check(&txn_header(1, 0, 3, 1, 0)), SequenceCheck::Append);
        // a marker at a bumped epoch (a fenced producer's abort) resets its sequences
        assert_eq!(t.end_txn(2, 1, 0), Some(12));
        assert_eq!(t.first_open_txn(), None);
        assert_eq!(t.check_epoch(2, 0), Err(1), "a stale coordinator's marker");
        assert_eq!(t.check(&txn_header(2, 1, 0, 1, 0)), SequenceCheck::Append);
        assert!(matches!(
            t.check(&txn_header(2, 0, 1, 1, 0)),
            SequenceCheck::FencedEpoch { current: 1 }
        ));
    }

    #[test]
    fn open_transactions_survive_snapshots_and_expiry() {
        let mut t = ProducerStateTable::default();
        t.record(&txn_header(7, 2, 0, 3, 100), 0);
        t.record(&header(8, 0, 0, 1, 103), 0);
        assert_eq!(
            t.expire(1_000_000, 10),
            1,
            "only the producer without a transaction"
        );
        let (_, back) =
            ProducerStateTable::decode_snapshot(&t.encode_snapshot(104), 0).expect("a snapshot");
        assert_eq!(back.open_txn(7), Some(100));
        assert_eq!(back.first_open_txn(), Some(100));
        assert_eq!(back, t);
    }

    proptest! {
        #[test]
        fn snapshot_round_trips(batches in proptest::collection::vec((0i64..5, 0i16..3, 1i32..4), 0..40)) {
            let mut t = ProducerStateTable::default();
            let mut offset = 0i64;
            let mut seqs = HashMap::new();
            for (pid, epoch, count) in batches {
                let seq = seqs.entry((pid, epoch)).or_insert(0);
                t.record(&header(pid, epoch, *seq, count, offset), 0);
                *seq += count;
                offset += i64::from(count);
            }
            let decoded = ProducerStateTable::decode_snapshot(&t.encode_snapshot(offset as u64), 0);
            prop_assert_eq!(decoded, Some((offset as u64, t)));
        }
    }
}
