//! The transaction coordinator's state machine, as plain functions of a transactional id's
//! metadata: each request either fails at once with a Kafka error code or yields the new
//! metadata to write to `__transaction_state` before anything acts on it. No I/O, no clock
//! (times come in as arguments).
//!
//! States, as Kafka's: Empty -> Ongoing (AddPartitionsToTxn) -> PrepareCommit or
//! PrepareAbort (EndTxn, a timeout, a new InitProducerId fencing an open transaction) ->
//! CompleteCommit / CompleteAbort once every partition has its marker -> Ongoing again with
//! the next AddPartitionsToTxn, or Empty with a new epoch (InitProducerId).

use std::collections::BTreeSet;

use bytes::{BufMut, Bytes, BytesMut};

use crate::group::records::{done, get_i16, get_i32, get_i64, get_str, put_str, RecordError};

/// Kafka's error codes the coordinator answers with.
pub mod codes {
    pub const NONE: i16 = 0;
    pub const INVALID_PRODUCER_EPOCH: i16 = 47;
    pub const INVALID_TXN_STATE: i16 = 48;
    pub const INVALID_PRODUCER_ID_MAPPING: i16 = 49;
    pub const INVALID_TRANSACTION_TIMEOUT: i16 = 50;
    pub const CONCURRENT_TRANSACTIONS: i16 = 51;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
    Dead,
    PrepareEpochFence,
}

impl Status {
    /// Kafka's `TransactionState` id, as `__transaction_state` stores it.
    pub fn id(self) -> i8 {
        match self {
            Status::Empty => 0,
            Status::Ongoing => 1,
            Status::PrepareCommit => 2,
            Status::PrepareAbort => 3,
            Status::CompleteCommit => 4,
            Status::CompleteAbort => 5,
            Status::Dead => 6,
            Status::PrepareEpochFence => 7,
        }
    }

    fn of(id: i8) -> Option<Status> {
        Some(match id {
            0 => Status::Empty,
            1 => Status::Ongoing,
            2 => Status::PrepareCommit,
            3 => Status::PrepareAbort,
            4 => Status::CompleteCommit,
            5 => Status::CompleteAbort,
            6 => Status::Dead,
            7 => Status::PrepareEpochFence,
            _ => return None,
        })
    }

    /// The name Kafka's DescribeTransactions / ListTransactions give it.
    pub fn name(self) -> &'static str {
        match self {
            Status::Empty => "Empty",
            Status::Ongoing => "Ongoing",
            Status::PrepareCommit => "PrepareCommit",
            Status::PrepareAbort => "PrepareAbort",
            Status::CompleteCommit => "CompleteCommit",
            Status::CompleteAbort => "CompleteAbort",
            Status::Dead => "Dead",
            Status::PrepareEpochFence => "PrepareEpochFence",
        }
    }

    /// Markers are being written: the transaction is decided but not finished.
    pub fn preparing(self) -> Option<bool> {
        match self {
            Status::PrepareCommit => Some(true),
            Status::PrepareAbort | Status::PrepareEpochFence => Some(false),
            _ => None,
        }
    }
}

/// One transactional id's metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnMeta {
    pub producer_id: i64,
    pub epoch: i16,
    pub timeout_ms: i32,
    pub status: Status,
    /// The partitions of the current (or ending) transaction.
    pub partitions: BTreeSet<(String, i32)>,
    /// When the current transaction began (-1: none).
    pub start_ms: i64,
    pub last_update_ms: i64,
}

/// InitProducerId's decision.
#[derive(Debug, PartialEq, Eq)]
pub enum Init {
    Error(i16),
    /// A producer id must be allocated: call [`fresh`] with it.
    NewProducerId,
    /// Write this (Empty at the next epoch) and answer with its id and epoch.
    Write(TxnMeta),
    /// An open transaction must be aborted first (at a bumped epoch, fencing the old
    /// producer): write this, write its markers; the client retries
    /// (CONCURRENT_TRANSACTIONS).
    AbortFirst(TxnMeta),
}

/// The metadata of a transactional id that just got a new producer id.
pub fn fresh(producer_id: i64, timeout_ms: i32, now_ms: i64) -> TxnMeta {
    TxnMeta {
        producer_id,
        epoch: 0,
        timeout_ms,
        status: Status::Empty,
        partitions: BTreeSet::new(),
        start_ms: -1,
        last_update_ms: now_ms,
    }
}

/// InitProducerId with a transactional id. `hint`: the producer id and epoch the client
/// has (KIP-360), if any.
pub fn init(
    current: Option<&TxnMeta>,
    timeout_ms: i32,
    hint: Option<(i64, i16)>,
    now_ms: i64,
) -> Init {
    let Some(m) = current else {
        return Init::NewProducerId;
    };
    if m.status.preparing().is_some() {
        return Init::Error(codes::CONCURRENT_TRANSACTIONS);
    }
    if let Some((pid, epoch)) = hint {
        if pid != m.producer_id {
            return Init::Error(codes::INVALID_PRODUCER_ID_MAPPING);
        }
        if epoch != m.epoch {
            return Init::Error(codes::INVALID_PRODUCER_EPOCH);
        }
    }
    if m.status == Status::Ongoing {
        return Init::AbortFirst(TxnMeta {
            epoch: m.epoch.saturating_add(1),
            status: Status::PrepareAbort,
            last_update_ms: now_ms,
            ..m.clone()
        });
    }
    if m.epoch >= i16::MAX - 1 {
        return Init::NewProducerId;
    }
    Init::Write(TxnMeta {
        epoch: m.epoch + 1,
        timeout_ms,
        status: Status::Empty,
        partitions: BTreeSet::new(),
        start_ms: -1,
        last_update_ms: now_ms,
        ..m.clone()
    })
}

/// Checks that a request comes from the producer that holds the id now.
fn check_producer(
    current: Option<&TxnMeta>,
    producer_id: i64,
    epoch: i16,
) -> Result<&TxnMeta, i16> {
    let m = current.ok_or(codes::INVALID_PRODUCER_ID_MAPPING)?;
    if m.producer_id != producer_id {
        return Err(codes::INVALID_PRODUCER_ID_MAPPING);
    }
    if m.epoch != epoch {
        return Err(codes::INVALID_PRODUCER_EPOCH);
    }
    Ok(m)
}

/// AddPartitionsToTxn (and AddOffsetsToTxn, with the group's offsets partition): the new
/// metadata to write, or `None` when every partition is in the transaction already.
pub fn add_partitions(
    current: Option<&TxnMeta>,
    producer_id: i64,
    epoch: i16,
    partitions: &[(String, i32)],
    now_ms: i64,
) -> Result<Option<TxnMeta>, i16> {
    let m = check_producer(current, producer_id, epoch)?;
    match m.status {
        Status::Ongoing if partitions.iter().all(|p| m.partitions.contains(p)) => Ok(None),
        Status::Empty | Status::Ongoing | Status::CompleteCommit | Status::CompleteAbort => {
            let mut next = m.clone();
            if m.status != Status::Ongoing {
                next.partitions.clear();
                next.start_ms = now_ms;
            }
            next.status = Status::Ongoing;
            next.partitions.extend(partitions.iter().cloned());
            next.last_update_ms = now_ms;
            Ok(Some(next))
        }
        Status::Dead => Err(codes::INVALID_PRODUCER_ID_MAPPING),
        _ => Err(codes::CONCURRENT_TRANSACTIONS),
    }
}

/// KIP-890's check for a partition leader about to append a producer's first transactional
/// batch of a transaction: is the partition in this producer's open transaction? Anything
/// else (no transaction open, another partition set, an ended transaction) is
/// INVALID_TXN_STATE, so a stray or late batch cannot open a transaction no marker will ever
/// close (a hanging transaction, holding the last stable offset back for good).
pub fn verify(
    current: Option<&TxnMeta>,
    producer_id: i64,
    epoch: i16,
    partition: &(String, i32),
) -> Result<(), i16> {
    let m = check_producer(current, producer_id, epoch)?;
    if m.status == Status::Ongoing && m.partitions.contains(partition) {
        Ok(())
    } else {
        Err(codes::INVALID_TXN_STATE)
    }
}

/// EndTxn's decision.
#[derive(Debug, PartialEq, Eq)]
pub enum End {
    Error(i16),
    /// A retry of an end already done: answer success.
    Done,
    /// Write this (PrepareCommit / PrepareAbort), answer, then write the markers.
    Prepare(TxnMeta),
}

pub fn end(
    current: Option<&TxnMeta>,
    producer_id: i64,
    epoch: i16,
    commit: bool,
    now_ms: i64,
) -> End {
    let m = match check_producer(current, producer_id, epoch) {
        Ok(m) => m,
        Err(code) => return End::Error(code),
    };
    match (m.status, commit) {
        (Status::Ongoing, _) => End::Prepare(TxnMeta {
            status: if commit {
                Status::PrepareCommit
            } else {
                Status::PrepareAbort
            },
            last_update_ms: now_ms,
            ..m.clone()
        }),
        (Status::CompleteCommit, true) | (Status::CompleteAbort, false) => End::Done,
        (Status::PrepareCommit, true) | (Status::PrepareAbort, false) => {
            End::Error(codes::CONCURRENT_TRANSACTIONS)
        }
        _ => End::Error(codes::INVALID_TXN_STATE),
    }
}

/// Every marker is written: the transaction is complete.
pub fn complete(m: &TxnMeta, now_ms: i64) -> TxnMeta {
    TxnMeta {
        status: if m.status == Status::PrepareCommit {
            Status::CompleteCommit
        } else {
            Status::CompleteAbort
        },
        partitions: BTreeSet::new(),
        start_ms: -1,
        last_update_ms: now_ms,
        ..m.clone()
    }
}

/// An open transaction past its timeout: aborted at a bumped epoch, so the producer that
/// let it expire is fenced (its next request fails with INVALID_PRODUCER_EPOCH).
pub fn expire(m: &TxnMeta, now_ms: i64) -> Option<TxnMeta> {
    let expired =
        m.status == Status::Ongoing && now_ms.saturating_sub(m.start_ms) > i64::from(m.timeout_ms);
    expired.then(|| TxnMeta {
        epoch: m.epoch.saturating_add(1),
        status: Status::PrepareAbort,
        last_update_ms: now_ms,
        ..m.clone()
    })
}

/// Whether a transactional id may be forgotten: no transaction open or ending, and nothing
/// heard of it for longer than `expiration_ms` (Kafka's `transactional.id.expiration.ms`).
pub fn forgettable(m: &TxnMeta, now_ms: i64, expiration_ms: i64) -> bool {
    matches!(
        m.status,
        Status::Empty | Status::CompleteCommit | Status::CompleteAbort
    ) && now_ms.saturating_sub(m.last_update_ms) > expiration_ms
}

/// `__transaction_state`'s key (version 0: the transactional id).
pub fn encode_key(transactional_id: &str) -> Bytes {
    let mut buf = BytesMut::new();
    buf.put_i16(0);
    put_str(&mut buf, transactional_id);
    buf.freeze()
}

pub fn decode_key(mut buf: Bytes) -> Result<String, RecordError> {
    match get_i16(&mut buf, "key version")? {
        0 => {}
        v => return Err(RecordError::KeyVersion(v)),
    }
    let id = get_str(&mut buf, "transactional id")?;
    done(&buf)?;
    Ok(id)
}

/// Its value, in Kafka's version 0 layout.
pub fn encode_value(m: &TxnMeta) -> Bytes {
    let mut buf = BytesMut::new();
    buf.put_i16(0);
    buf.put_i64(m.producer_id);
    buf.put_i16(m.epoch);
    buf.put_i32(m.timeout_ms);
    buf.put_i8(m.status.id());
    let mut topics: Vec<(&str, Vec<i32>)> = Vec::new();
    for (t, p) in &m.partitions {
        match topics.last_mut() {
            Some((last, ps)) if last == t => ps.push(*p),
            _ => topics.push((t, vec![*p])),
        }
    }
    buf.put_i32(topics.len() as i32);
    for (t, ps) in topics {
        put_str(&mut buf, t);
        buf.put_i32(ps.len() as i32);
        for p in ps {
            buf.put_i32(p);
        }
    }
    buf.put_i64(m.last_update_ms);
    buf.put_i64(m.start_ms);
    buf.freeze()
}

pub fn decode_value(mut buf: Bytes) -> Result<TxnMeta, RecordError> {
    use bytes::Buf;
    let version = get_i16(&mut buf, "value version")?;
    if version != 0 {
        return Err(RecordError::ValueVersion(version, "transaction"));
    }
    let producer_id = get_i64(&mut buf, "producer id")?;
    let epoch = get_i16(&mut buf, "producer epoch")?;
    let timeout_ms = get_i32(&mut buf, "timeout")?;
    if buf.is_empty() {
        return Err(RecordError::Truncated("status"));
    }
    let status = Status::of(buf.get_i8()).ok_or(RecordError::BadLength("status"))?;
    let topics = get_i32(&mut buf, "partitions")?;
    let mut partitions = BTreeSet::new();
    for _ in 0..topics.max(0) {
        let topic = get_str(&mut buf, "topic")?;
        let n = get_i32(&mut buf, "partition count")?;
        for _ in 0..n.max(0) {
            partitions.insert((topic.clone(), get_i32(&mut buf, "partition")?));
        }
    }
    let last_update_ms = get_i64(&mut buf, "last update")?;
    let start_ms = get_i64(&mut buf, "start")?;
    done(&buf)?;
    Ok(TxnMeta {
        producer_id,
        epoch,
        timeout_ms,
        status,
        partitions,
        start_ms,
        last_update_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(v: &[(&str, i32)]) -> Vec<(String, i32)> {
        v.iter().map(|(t, p)| (t.to_string(), *p)).collect()
    }

    #[test]
    fn only_a_partition_of_the_open_transaction_verifies() {
        let m = fresh(7, 60_000, 0);
        let a0 = ("a".to_string(), 0);
        assert_eq!(verify(Some(&m), 7, 0, &a0), Err(codes::INVALID_TXN_STATE));
        let m = add_partitions(Some(&m), 7, 0, &parts(&[("a", 0)]), 10)
            .unwrap()
            .unwrap();
        assert_eq!(verify(Some(&m), 7, 0, &a0), Ok(()));
        assert_eq!(
            verify(Some(&m), 7, 0, &("a".to_string(), 1)),
            Err(codes::INVALID_TXN_STATE)
        );
        assert_eq!(
            verify(Some(&m), 7, 1, &a0),
            Err(codes::INVALID_PRODUCER_EPOCH)
        );
        assert_eq!(
            verify(Some(&m), 8, 0, &a0),
            Err(codes::INVALID_PRODUCER_ID_MAPPING)
        );
        assert_eq!(
            verify(None, 7, 0, &a0),
            Err(codes::INVALID_PRODUCER_ID_MAPPING)
        );
        // ending, or ended: a late batch of the transaction is refused
        let End::Prepare(p) = end(Some(&m), 7, 0, false, 20) else {
            panic!("an open transaction prepares");
        };
        assert_eq!(verify(Some(&p), 7, 0, &a0), Err(codes::INVALID_TXN_STATE));
        assert_eq!(
            verify(Some(&complete(&p, 30)), 7, 0, &a0),
            Err(codes::INVALID_TXN_STATE)
        );
    }

    #[test]
    fn a_transaction_goes_from_empty_to_complete_and_back() {
        assert_eq!(init(None, 60_000, None, 0), Init::NewProducerId);
        let m = fresh(7, 60_000, 0);
        let m = add_partitions(Some(&m), 7, 0, &parts(&[("a", 0), ("a", 1)]), 10)
            .unwrap()
            .unwrap();
        assert_eq!(
            (m.status, m.start_ms, m.partitions.len()),
            (Status::Ongoing, 10, 2)
        );
        assert_eq!(
            add_partitions(Some(&m), 7, 0, &parts(&[("a", 1)]), 11),
            Ok(None)
        );
        assert_eq!(
            add_partitions(Some(&m), 7, 1, &parts(&[("b", 0)]), 11),
            Err(codes::INVALID_PRODUCER_EPOCH)
        );
        assert_eq!(
            add_partitions(Some(&m), 8, 0, &parts(&[("b", 0)]), 11),
            Err(codes::INVALID_PRODUCER_ID_MAPPING)
        );
        let End::Prepare(p) = end(Some(&m), 7, 0, true, 20) else {
            panic!("an open transaction prepares");
        };
        assert_eq!(p.status, Status::PrepareCommit);
        assert_eq!(
            end(Some(&p), 7, 0, true, 21),
            End::Error(codes::CONCURRENT_TRANSACTIONS)
        );
        assert_eq!(
            add_partitions(Some(&p), 7, 0, &parts(&[("b", 0)]), 21),
            Err(codes::CONCURRENT_TRANSACTIONS)
        );
        assert_eq!(
            init(Some(&p), 60_000, None, 21),
            Init::Error(codes::CONCURRENT_TRANSACTIONS)
        );
        let c = complete(&p, 30);
        assert_eq!((c.status, c.partitions.len()), (Status::CompleteCommit, 0));
        assert_eq!(end(Some(&c), 7, 0, true, 31), End::Done, "a retried commit");
        assert_eq!(
            end(Some(&c), 7, 0, false, 31),
            End::Error(codes::INVALID_TXN_STATE)
        );
        let next = add_partitions(Some(&c), 7, 0, &parts(&[("b", 0)]), 40)
            .unwrap()
            .unwrap();
        assert_eq!(
            (next.status, next.start_ms, next.partitions.len()),
            (Status::Ongoing, 40, 1)
        );
        // a restarted producer: a new epoch, and its open transaction is aborted first
        let Init::AbortFirst(a) = init(Some(&next), 60_000, None, 50) else {
            panic!("the open transaction is aborted first");
        };
        assert_eq!((a.status, a.epoch), (Status::PrepareAbort, 1));
        let Init::Write(w) = init(Some(&complete(&a, 60)), 60_000, None, 61) else {
            panic!("then the epoch is bumped");
        };
        assert_eq!((w.status, w.epoch, w.producer_id), (Status::Empty, 2, 7));
    }

    #[test]
    fn an_expired_transaction_is_aborted_at_a_bumped_epoch() {
        let m = add_partitions(Some(&fresh(1, 100, 0)), 1, 0, &parts(&[("a", 0)]), 0)
            .unwrap()
            .unwrap();
        assert_eq!(expire(&m, 100), None);
        let a = expire(&m, 101).expect("past its timeout");
        assert_eq!((a.status, a.epoch), (Status::PrepareAbort, 1));
        assert_eq!(
            end(Some(&a), 1, 0, true, 102),
            End::Error(codes::INVALID_PRODUCER_EPOCH)
        );
    }

    #[test]
    fn only_an_idle_id_without_an_open_transaction_is_forgotten() {
        let idle = fresh(1, 100, 0);
        assert!(!forgettable(&idle, 1_000, 1_000), "not idle long enough");
        assert!(forgettable(&idle, 1_001, 1_000));
        let open = add_partitions(Some(&idle), 1, 0, &parts(&[("a", 0)]), 0)
            .unwrap()
            .unwrap();
        assert!(
            !forgettable(&open, 1_000_000, 1_000),
            "a transaction is open"
        );
        let ending = expire(&open, 1_000_000).expect("timed out");
        assert!(
            !forgettable(&ending, 2_000_000, 1_000),
            "its markers are not written"
        );
        let done = complete(&ending, 2_000_000);
        assert!(forgettable(&done, 2_001_001, 1_000));
    }

    #[test]
    fn metadata_round_trips_through_kafkas_layout() {
        let mut m = add_partitions(
            Some(&fresh(9, 5_000, 1)),
            9,
            0,
            &parts(&[("b", 2), ("a", 0), ("b", 1)]),
            3,
        )
        .unwrap()
        .unwrap();
        m.epoch = 4;
        assert_eq!(decode_value(encode_value(&m)), Ok(m.clone()));
        assert_eq!(decode_key(encode_key("tx-1")), Ok("tx-1".to_string()));
        let v = encode_value(&m);
        for cut in 0..v.len() {
            assert!(decode_value(v.slice(..cut)).is_err(), "cut at {cut}");
        }
    }
}
