//! One simulated broker's replica of the partition: an in-memory log with what a crash keeps
//! (the fsynced prefix, plus any part of the unsynced tail), around the broker's real pure
//! state machines: `LeaderState` (HW and ISR proposals), `LeaderEpochCache` and the
//! follower's truncation rounds, and `ProducerStateTable` (idempotent producers).
//!
//! The glue mirrors `broker/partition.rs`, `replication/follower.rs` and `broker/isr.rs`:
//! what those do on each event, this does on the same event, and nothing more.

use std::collections::BTreeMap;

use strata_core::batch::BatchHeader;
use strata_hot::log::producer_state::{ProducerStateTable, SequenceCheck};
use strata_hot::replication::epochs::{truncation_round, LeaderEpochCache};
use strata_hot::replication::leader::{Assignment, IsrRefusal, LeaderState, Policy};

use crate::rng::Rng;

/// One record (the simulation writes one-record batches).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rec {
    /// The leader epoch that wrote it.
    pub epoch: i32,
    pub pid: i64,
    pub seq: i32,
}

/// The header the log keeps for `rec` at `offset`.
pub fn header(rec: &Rec, offset: u64) -> BatchHeader {
    BatchHeader {
        base_offset: offset as i64,
        batch_length: 61,
        leader_epoch: rec.epoch,
        magic: 2,
        crc: 0,
        attributes: 0,
        last_offset_delta: 0,
        base_timestamp: 0,
        max_timestamp: 0,
        producer_id: rec.pid,
        producer_epoch: 0,
        base_sequence: rec.seq,
        record_count: 1,
    }
}

pub const POLICY: Policy = Policy {
    min_insync_replicas: 2,
    replica_lag_max_ms: 3_000,
};

/// Producer snapshots kept (as the log keeps besides the newest).
const SNAPSHOTS_KEPT: usize = 3;

/// Why the controllers refused an ISR change (or the call failed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The change itself is invalid: nothing was committed.
    Invalid,
    /// A stale partition epoch, a deposed leader, or no answer: it may have been committed.
    Unknown,
}

/// An acks=all produce waiting for the HW.
#[derive(Debug, Clone)]
pub struct Waiter {
    pub req: u64,
    pub seq: i32,
    pub base: u64,
    pub end: u64,
    pub epoch: i32,
    pub since: i64,
}

/// An AlterIsr call to the controllers in flight.
#[derive(Debug, Clone)]
pub struct IsrCall {
    pub req: u64,
    /// The partition epoch the proposal was made on.
    pub proposed_at: i32,
    pub sent_at: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Asking the leader where the logs agree (OffsetForLeaderEpoch rounds).
    Truncating,
    Fetching,
}

pub enum Role {
    Idle,
    Leader {
        epoch: i32,
        state: LeaderState,
        call: Option<IsrCall>,
        /// The highest HW published in this epoch (invariant: never moves back).
        max_hw: u64,
    },
    Follower {
        leader: i32,
        epoch: i32,
        phase: Phase,
        /// The request in flight and when it was sent.
        awaiting: Option<(u64, i64)>,
        /// The epoch asked in the truncation round in flight.
        asked: i32,
        /// Truncation rounds answered "ask again" in a row (a liveness check).
        rounds: u32,
    },
}

pub struct Replica {
    pub id: i32,
    pub alive: bool,
    /// Bumped at every restart: replies to an older incarnation's requests are lost.
    pub incarnation: u32,
    pub log: Vec<Rec>,
    /// The fsynced prefix.
    pub durable: usize,
    /// The leader-epoch checkpoint (written at every change, so it survives crashes).
    pub epochs: LeaderEpochCache,
    pub producers: ProducerStateTable,
    /// Producer snapshot files: offset -> table as of that offset.
    pub snapshots: BTreeMap<u64, ProducerStateTable>,
    pub hw: u64,
    pub role: Role,
    pub waiters: Vec<Waiter>,
}

/// What a produce is answered, when it is answered at once.
pub enum ProduceOutcome {
    Wait(Waiter),
    Refused(&'static str),
}

/// Why a replica fetch or epoch query is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchError {
    NotLeader,
    FencedEpoch,
    UnknownEpoch,
    NotReplica,
    OutOfRange { leader_end: u64 },
}

impl Replica {
    pub fn new(id: i32) -> Self {
        Replica {
            id,
            alive: true,
            incarnation: 0,
            log: Vec::new(),
            durable: 0,
            epochs: LeaderEpochCache::default(),
            producers: ProducerStateTable::default(),
            snapshots: BTreeMap::new(),
            hw: 0,
            role: Role::Idle,
            waiters: Vec::new(),
        }
    }

    pub fn end(&self) -> u64 {
        self.log.len() as u64
    }

    pub fn leader_epoch(&self) -> Option<i32> {
        match &self.role {
            Role::Leader { epoch, .. } => Some(*epoch),
            _ => None,
        }
    }

    fn publish_hw(&mut self, hw: Option<u64>) {
        if let Some(hw) = hw {
            self.hw = self.hw.max(hw);
        }
    }

    /// `Partition::become_leader`.
    pub fn become_leader(&mut self, epoch: i32, assignment: Assignment, now: i64) {
        if let Role::Leader {
            epoch: e, state, ..
        } = &mut self.role
        {
            if *e == epoch {
                let hw = state.on_isr_committed(assignment.isr, assignment.partition_epoch);
                self.publish_hw(hw);
                return;
            }
        }
        // `PartitionLog::begin_leader_epoch`
        if self.epochs.latest().is_none_or(|l| l.epoch < epoch) {
            self.epochs.assign(epoch, self.end());
        }
        let state = LeaderState::new(
            assignment,
            self.end(),
            self.durable as u64,
            self.hw,
            POLICY,
            now,
        );
        self.hw = self.hw.max(state.high_watermark());
        self.role = Role::Leader {
            epoch,
            state,
            call: None,
            max_hw: self.hw,
        };
    }

    /// `Partition::become_follower`; true when a new fetcher starts.
    pub fn become_follower(&mut self, leader: i32, epoch: i32) -> bool {
        if matches!(self.role, Role::Follower { leader: l, epoch: e, .. } if l == leader && e == epoch)
        {
            return false;
        }
        self.role = Role::Follower {
            leader,
            epoch,
            phase: Phase::Truncating,
            awaiting: None,
            asked: -1,
            rounds: 0,
        };
        true
    }

    pub fn become_idle(&mut self) {
        self.role = Role::Idle;
    }

    /// A produced record arrives (`Partition::append` with acks=all).
    pub fn produce(&mut self, req: u64, pid: i64, seq: i32, now: i64) -> ProduceOutcome {
        let Role::Leader { epoch, state, .. } = &mut self.role else {
            return ProduceOutcome::Refused("NOT_LEADER_OR_FOLLOWER");
        };
        let epoch = *epoch;
        if state.check_acks_all().is_err() {
            return ProduceOutcome::Refused("NOT_ENOUGH_REPLICAS");
        }
        let rec = Rec { epoch, pid, seq };
        let base = match self.producers.check(&header(&rec, 0)) {
            SequenceCheck::Append => {
                let base = self.end();
                if self.epochs.latest().is_none_or(|l| l.epoch < epoch) {
                    self.epochs.assign(epoch, base);
                }
                self.log.push(rec);
                self.producers.record(&header(&rec, base));
                base
            }
            SequenceCheck::Duplicate(w) => w.base_offset,
            SequenceCheck::FencedEpoch { .. } => {
                return ProduceOutcome::Refused("INVALID_PRODUCER_EPOCH")
            }
            SequenceCheck::OutOfOrder { .. } => {
                return ProduceOutcome::Refused("OUT_OF_ORDER_SEQUENCE_NUMBER")
            }
        };
        ProduceOutcome::Wait(Waiter {
            req,
            seq,
            base,
            end: base + 1,
            epoch,
            since: now,
        })
    }

    /// The flusher's fsync completes: everything written so far is durable.
    pub fn flush(&mut self) {
        self.durable = self.log.len();
        let end = self.end();
        if let Role::Leader { state, .. } = &mut self.role {
            let hw = state.on_leader_durable(end);
            self.publish_hw(hw);
        }
    }

    /// A segment roll: a producer snapshot is written at the log end.
    pub fn roll(&mut self) {
        let end = self.end();
        self.snapshots.insert(end, self.producers.clone());
        while self.snapshots.len() > SNAPSHOTS_KEPT {
            let oldest = *self.snapshots.keys().next().expect("non-empty");
            self.snapshots.remove(&oldest);
        }
    }

    /// `Partition::replica_fetch` as leader.
    pub fn serve_fetch(
        &mut self,
        from: i32,
        epoch: i32,
        offset: u64,
        now: i64,
    ) -> Result<(Vec<Rec>, u64), FetchError> {
        let end = self.end();
        let Role::Leader {
            epoch: mine, state, ..
        } = &mut self.role
        else {
            return Err(FetchError::NotLeader);
        };
        if epoch < *mine {
            return Err(FetchError::FencedEpoch);
        }
        if epoch > *mine {
            return Err(FetchError::UnknownEpoch);
        }
        if !state.replicas().contains(&from) {
            return Err(FetchError::NotReplica);
        }
        if offset > end {
            return Err(FetchError::OutOfRange { leader_end: end });
        }
        let hw = state.on_follower_fetch(from, offset, end, now);
        self.publish_hw(hw);
        let upto = (offset + 4).min(end) as usize;
        Ok((self.log[offset as usize..upto].to_vec(), self.hw))
    }

    /// OffsetForLeaderEpoch as leader.
    pub fn serve_epoch_query(
        &self,
        epoch: i32,
        asked: i32,
    ) -> Result<Option<(i32, u64)>, FetchError> {
        match &self.role {
            Role::Leader { epoch: mine, .. } if *mine == epoch => {
                Ok(self.epochs.end_offset_for(asked, self.end()))
            }
            Role::Leader { epoch: mine, .. } if epoch < *mine => Err(FetchError::FencedEpoch),
            Role::Leader { .. } => Err(FetchError::UnknownEpoch),
            _ => Err(FetchError::NotLeader),
        }
    }

    /// A follower's truncation round was answered; returns true when another round is needed.
    pub fn on_epoch_answer(&mut self, answer: Option<(i32, u64)>) -> bool {
        let round = truncation_round(&self.epochs, self.end(), self.hw, answer);
        if round.truncate_to < self.end() || round.again {
            self.truncate_to(round.truncate_to);
        }
        round.again
    }

    /// `PartitionLog::truncate_to` (and `Partition::after_cut`).
    pub fn truncate_to(&mut self, to: u64) {
        if to >= self.end() {
            // an epoch starting at the end holds no record: dropped
            self.epochs.truncate_from_end(to);
            return;
        }
        self.log.truncate(to as usize);
        self.durable = self.durable.min(to as usize);
        self.epochs.truncate_from_end(to);
        self.snapshots.retain(|o, _| *o <= to);
        self.producers = self.rebuilt_producers();
        self.hw = self.hw.min(to);
    }

    /// The producer state from the newest snapshot not past the log end, plus the log after
    /// it (`PartitionLog::rebuild_producer_state`).
    fn rebuilt_producers(&self) -> ProducerStateTable {
        let end = self.end();
        let (from, mut table) = self
            .snapshots
            .range(..=end)
            .next_back()
            .map_or((0, ProducerStateTable::default()), |(o, t)| (*o, t.clone()));
        for (o, rec) in self.log.iter().enumerate().skip(from as usize) {
            table.record(&header(rec, o as u64));
        }
        table
    }

    /// Appends records fetched from the leader; `Err` when they do not continue the log.
    pub fn append_replicated(&mut self, offset: u64, recs: &[Rec]) -> Result<(), ()> {
        if offset != self.end() {
            return Err(());
        }
        for rec in recs {
            let at = self.end();
            if self.epochs.latest().is_none_or(|l| l.epoch < rec.epoch) {
                self.epochs.assign(rec.epoch, at);
            }
            self.log.push(*rec);
            self.producers.record(&header(rec, at));
        }
        Ok(())
    }

    /// `Partition::set_follower_hw`.
    pub fn set_follower_hw(&mut self, leader_hw: u64) {
        self.hw = leader_hw.min(self.end());
    }

    /// The ISR change to propose now (`broker/isr.rs` tick), when no call is in flight.
    pub fn isr_tick(&mut self, now: i64) -> Option<(i32, i32, Vec<i32>)> {
        let Role::Leader {
            epoch, state, call, ..
        } = &mut self.role
        else {
            return None;
        };
        if call.is_some() {
            return None;
        }
        let p = state.tick(now)?;
        Some((*epoch, p.partition_epoch, p.isr))
    }

    /// The controllers answered (or the call failed): `Partition::isr_answer`.
    pub fn isr_answer(&mut self, epoch: i32, answer: Result<(Vec<i32>, i32), Refusal>, now: i64) {
        let Role::Leader {
            epoch: e,
            state,
            call,
            ..
        } = &mut self.role
        else {
            return;
        };
        if *e != epoch {
            return;
        }
        let Some(c) = call.take() else {
            return;
        };
        let hw = match answer {
            Ok((isr, pe)) => state.on_isr_committed(isr, pe),
            Err(why) => {
                let why = match why {
                    Refusal::Invalid => IsrRefusal::Rejected,
                    Refusal::Unknown => IsrRefusal::Unknown,
                };
                state.on_isr_refused(why, c.proposed_at, now);
                None
            }
        };
        self.publish_hw(hw);
    }

    /// The process dies: what was not fsynced may be lost, any part of it.
    pub fn crash(&mut self, rng: &mut Rng) {
        let torn = rng.below((self.log.len() - self.durable) as u64 + 1) as usize;
        self.log.truncate(self.durable + torn);
        self.alive = false;
        self.role = Role::Idle;
        self.waiters.clear();
        self.producers = ProducerStateTable::default();
    }

    /// The process starts again: `PartitionLog::open` and a fresh `Partition`.
    pub fn restart(&mut self) {
        self.alive = true;
        self.incarnation += 1;
        self.durable = self.log.len();
        let end = self.end();
        self.epochs.truncate_from_end(end);
        self.snapshots.retain(|o, _| *o <= end);
        self.producers = self.rebuilt_producers();
        self.hw = 0;
        self.role = Role::Idle;
    }
}
