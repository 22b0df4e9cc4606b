//! One simulated broker's replica of the partition: an in-memory log with what a crash keeps
//! (the fsynced prefix, plus any part of the unsynced tail), around the broker's real pure
//! state machines: `LeaderState` (HW and ISR proposals), `LeaderEpochCache` and the
//! follower's truncation rounds, and `ProducerStateTable` (idempotent producers).
//!
//! The glue mirrors `broker/partition.rs`, `replication/follower.rs` and `broker/isr.rs`:
//! what those do on each event, this does on the same event, and nothing more.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

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

/// The producer id of offset-commit records (the group coordinator writes without one).
pub const COMMIT_PID: i64 = -1;

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

/// Whether a coordinator's queue has a commit it can work on at `now`.
pub fn commit_ready(queue: &VecDeque<(u64, u64, i64)>, now: i64) -> bool {
    queue.front().is_some_and(|(_, _, at)| *at <= now)
}

/// Why a fetcher's records were not written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotWritten {
    /// This replica no longer follows the leader and epoch the fetcher fetched from.
    NotFollowing,
    /// They do not continue the log.
    Gap,
}

/// Whom a fetcher follows (`broker::partition::Following`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Following {
    pub leader: i32,
    pub epoch: i32,
}

/// A sync handed to the flusher: the log end it covers, the cut count when it was handed
/// out, and the recovery point it writes once done.
#[derive(Debug, Clone, Copy)]
pub struct Sync {
    pub end: u64,
    pub cuts: u64,
    pub recovery_point: Option<u64>,
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
    /// A group's offset commit (`seq` holds the committed offset), not a produce.
    pub commit: bool,
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
    /// The controllers' epoch for its current registration (what its fetches carry).
    pub broker_epoch: u64,
    pub log: Vec<Rec>,
    /// The fsynced prefix: what a crash keeps.
    pub durable: usize,
    /// The durable end the broker published (`Progress::durable_end`): what the fetcher
    /// waits for before it reports its log end, and what the leader counts as its own.
    /// It must never pass `durable`.
    pub published: u64,
    /// The flusher's sync in flight (`SyncWork`).
    pub sync: Option<Sync>,
    /// Truncations so far (`Partition::cuts`).
    pub cuts: u64,
    /// The segments' base offsets.
    pub segments: BTreeSet<u64>,
    /// The `recovery-point` file: segments wholly below it are trusted by the next open
    /// without a CRC scan.
    pub recovery_point: u64,
    /// The recovery point the next sync writes (the base of the newest roll).
    pub pending_recovery_point: Option<u64>,
    /// A record a crash left torn (garbage on disk), until the next open finds it.
    pub torn: Option<u64>,
    /// An open that trusted a torn record: the log serves garbage from then on.
    pub corrupt: Option<String>,
    /// Fetchers of earlier roles with a request in flight: (request, leader, epoch). A
    /// fetcher task learns of a role change only when it next looks, so the answer to its
    /// last request may still reach it and it writes what it got (`Partition`'s writes
    /// then check, under the role lock, that this replica still follows that leader and
    /// epoch).
    pub stale_fetchers: Vec<(u64, Following)>,
    /// The group coordinators on this broker by the leader epoch they were loaded at, and
    /// the commits each has queued: (request, offset, not before).
    pub coordinators: BTreeMap<i32, VecDeque<(u64, u64, i64)>>,
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
            broker_epoch: 0,
            log: Vec::new(),
            durable: 0,
            published: 0,
            sync: None,
            cuts: 0,
            segments: BTreeSet::from([0]),
            recovery_point: 0,
            pending_recovery_point: None,
            torn: None,
            corrupt: None,
            stale_fetchers: Vec::new(),
            coordinators: BTreeMap::new(),
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

    /// Whom this replica follows now.
    pub fn following(&self) -> Option<Following> {
        match self.role {
            Role::Follower { leader, epoch, .. } => Some(Following { leader, epoch }),
            _ => None,
        }
    }

    /// The role is about to change: a fetcher with a request in flight lives on until its
    /// answer arrives.
    fn retire_fetcher(&mut self) {
        if let Role::Follower {
            leader,
            epoch,
            awaiting: Some((req, _)),
            ..
        } = self.role
        {
            self.stale_fetchers.push((req, Following { leader, epoch }));
        }
    }

    /// `Partition::following`: writes of a fetcher of `at` go through only while this
    /// replica follows `at`.
    fn follows(&self, at: Following) -> bool {
        self.following() == Some(at)
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
        self.retire_fetcher();
        let state = LeaderState::new(assignment, self.end(), self.published, self.hw, POLICY, now);
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
        self.retire_fetcher();
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
        self.retire_fetcher();
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
            SequenceCheck::Append => self.push(rec),
            SequenceCheck::Duplicate(w) => w.base_offset,
            SequenceCheck::FencedEpoch { .. } => {
                return ProduceOutcome::Refused("INVALID_PRODUCER_EPOCH")
            }
            SequenceCheck::OutOfOrder { .. } => {
                return ProduceOutcome::Refused("OUT_OF_ORDER_SEQUENCE_NUMBER")
            }
            // (the simulation's producers are not transactional)
            SequenceCheck::InTransaction => return ProduceOutcome::Refused("INVALID_TXN_STATE"),
        };
        ProduceOutcome::Wait(Waiter {
            req,
            seq,
            base,
            end: base + 1,
            epoch,
            since: now,
            commit: false,
        })
    }

    /// A consumer's offset commit reaches this broker: the group coordinator, which exists
    /// while it leads the offsets partition, queues it (it serves a group's requests in
    /// order). The coordinator may stall on it for seconds (a slow disk, a long pause).
    pub fn accept_commit(
        &mut self,
        req: u64,
        value: u64,
        rng: &mut Rng,
        now: i64,
    ) -> Result<i32, &'static str> {
        let Role::Leader { epoch, .. } = self.role else {
            return Err("NOT_COORDINATOR");
        };
        let stall = if rng.chance(100) {
            1_000 + rng.below(15_000) as i64
        } else {
            0
        };
        self.coordinators
            .entry(epoch)
            .or_default()
            .push_back((req, value, now + stall));
        Ok(epoch)
    }

    /// One of this broker's coordinators (the current one, or one closed by a leadership
    /// change that still has requests queued) appends its next commit
    /// (`PartitionOffsets::append`, through `Partition::append_in_epoch`: refused unless the
    /// partition is still led at the coordinator's epoch, checked inside the append).
    /// Returns (req, value, epoch, what happened).
    pub fn coordinator_step(
        &mut self,
        rng: &mut Rng,
        now: i64,
    ) -> Option<(u64, u64, i32, Result<Waiter, &'static str>)> {
        let current = self.leader_epoch();
        self.coordinators
            .retain(|e, q| !q.is_empty() || Some(*e) == current);
        let ready: Vec<i32> = self
            .coordinators
            .iter()
            .filter(|(_, q)| commit_ready(q, now))
            .map(|(e, _)| *e)
            .collect();
        let e = *ready.get(rng.below(ready.len().max(1) as u64) as usize)?;
        let (req, value, _) = self.coordinators.get_mut(&e)?.pop_front()?;
        let Role::Leader { epoch, state, .. } = &self.role else {
            return Some((req, value, e, Err("NOT_COORDINATOR")));
        };
        if *epoch != e {
            return Some((req, value, e, Err("NOT_COORDINATOR")));
        }
        if state.check_acks_all().is_err() {
            return Some((req, value, e, Err("NOT_ENOUGH_REPLICAS")));
        }
        let rec = Rec {
            epoch: *epoch,
            pid: COMMIT_PID,
            seq: value as i32,
        };
        let base = self.push(rec);
        Some((
            req,
            value,
            e,
            Ok(Waiter {
                req,
                seq: value as i32,
                base,
                end: base + 1,
                epoch: e,
                since: now,
                commit: true,
            }),
        ))
    }

    /// One step of the flusher (`Partition::run_flusher`): with no sync in flight, take the
    /// work (`PartitionLog::take_sync_work`: the log end, the cut count and the pending
    /// recovery point) and fsync (the log as it is now becomes durable); with one, finish
    /// it unless the log was cut meanwhile (then what it synced may be gone and what follows
    /// the cut is not covered: the next step syncs again): `SyncWork::run` writes the
    /// recovery point, and the flusher publishes the durable end under the log lock.
    /// Returns the end published.
    pub fn flush(&mut self) -> Option<u64> {
        let Some(sync) = self.sync.take() else {
            self.sync = Some(Sync {
                end: self.end(),
                cuts: self.cuts,
                recovery_point: self.pending_recovery_point.take(),
            });
            self.durable = self.log.len();
            return None;
        };
        if sync.cuts != self.cuts {
            return None;
        }
        if let Some(rp) = sync.recovery_point {
            self.recovery_point = rp;
        }
        let end = sync.end;
        self.published = self.published.max(end);
        if let Role::Leader { state, .. } = &mut self.role {
            let hw = state.on_leader_durable(end);
            self.publish_hw(hw);
        }
        Some(end)
    }

    /// A segment roll (`PartitionLog::roll`): a new segment at the log end, a producer
    /// snapshot there, and the next sync's recovery point.
    pub fn roll(&mut self) -> bool {
        let end = self.end();
        if self.segments.last().is_some_and(|b| *b >= end) {
            return false; // the active segment is empty
        }
        self.segments.insert(end);
        self.pending_recovery_point = Some(end);
        self.snapshots.insert(end, self.producers.clone());
        while self.snapshots.len() > SNAPSHOTS_KEPT {
            let oldest = *self.snapshots.keys().next().expect("non-empty");
            self.snapshots.remove(&oldest);
        }
        true
    }

    /// `Partition::replica_fetch` as leader.
    pub fn serve_fetch(
        &mut self,
        from: i32,
        broker_epoch: u64,
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
        let hw = state.on_follower_fetch(from, broker_epoch, offset, end, now);
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

    /// A truncation round of a fetcher of `at` was answered; returns true when another
    /// round is needed (`None`: this replica no longer follows `at`, nothing was cut).
    pub fn on_epoch_answer(&mut self, at: Following, answer: Option<(i32, u64)>) -> Option<bool> {
        let round = truncation_round(&self.epochs, self.end(), self.hw, answer);
        if round.truncate_to < self.end() || round.again {
            self.cut_as(at, round.truncate_to)?;
        }
        Some(round.again)
    }

    /// `Partition::truncate_to`: a fetcher of `at` cuts the log.
    pub fn cut_as(&mut self, at: Following, to: u64) -> Option<()> {
        if !self.follows(at) {
            return None;
        }
        self.truncate_to(to);
        Some(())
    }

    /// `PartitionLog::truncate_to` (and `Partition::after_cut`).
    pub fn truncate_to(&mut self, to: u64) {
        if to >= self.end() {
            // an epoch starting at the end holds no record: dropped
            self.epochs.truncate_from_end(to);
            return;
        }
        // `PartitionLog::lower_recovery_point`, before any file changes: the segment being
        // rewritten must be CRC-scanned by the next open
        let holder = self.holder(to);
        self.cuts += 1;
        self.pending_recovery_point = self.pending_recovery_point.filter(|rp| *rp <= holder);
        self.recovery_point = self.recovery_point.min(holder);
        self.segments.retain(|b| *b <= to);
        self.log.truncate(to as usize);
        self.durable = self.durable.min(to as usize);
        // `Partition::after_cut`
        self.published = self.published.min(to);
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
            table.record(&header(rec, o as u64), 0);
        }
        table
    }

    /// Appends records a fetcher of `at` got from the leader.
    pub fn append_replicated(
        &mut self,
        at: Following,
        offset: u64,
        recs: &[Rec],
    ) -> Result<(), NotWritten> {
        if !self.follows(at) {
            return Err(NotWritten::NotFollowing);
        }
        if offset != self.end() {
            return Err(NotWritten::Gap);
        }
        for rec in recs {
            self.push(*rec);
        }
        Ok(())
    }

    /// Appends `rec` at the log end (`PartitionLog`'s append): a new epoch starts in the
    /// epoch history, and the producer state records it (commits have no producer).
    /// Returns its offset.
    fn push(&mut self, rec: Rec) -> u64 {
        let at = self.end();
        if self.epochs.latest().is_none_or(|l| l.epoch < rec.epoch) {
            self.epochs.assign(rec.epoch, at);
        }
        self.log.push(rec);
        self.producers.record(&header(&rec, at), 0);
        at
    }

    /// `Partition::set_follower_hw`: false when this replica no longer follows `at`.
    pub fn set_follower_hw(&mut self, at: Following, leader_hw: u64) -> bool {
        if !self.follows(at) {
            return false;
        }
        self.hw = leader_hw.min(self.end());
        true
    }

    /// The ISR change to propose now (`broker/isr.rs` tick), when no call is in flight.
    #[allow(clippy::type_complexity)]
    pub fn isr_tick(&mut self, now: i64) -> Option<(i32, i32, Vec<i32>, Vec<(i32, u64)>)> {
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
        Some((*epoch, p.partition_epoch, p.isr, p.joining))
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

    /// The base of the segment holding `offset`.
    fn holder(&self, offset: u64) -> u64 {
        *self.segments.range(..=offset).next_back().unwrap_or(&0)
    }

    /// The process dies: what was not fsynced may be lost, any part of it, and one unsynced
    /// record kept may be torn (garbage on disk: pages reach the disk in any order).
    pub fn crash(&mut self, rng: &mut Rng) {
        let kept = rng.below((self.log.len() - self.durable) as u64 + 1) as usize;
        self.log.truncate(self.durable + kept);
        if kept > 0 && rng.chance(500) {
            self.torn = Some((self.durable as u64) + rng.below(kept as u64));
        }
        let end = self.end();
        self.segments.retain(|b| *b <= end);
        self.pending_recovery_point = None;
        self.alive = false;
        self.role = Role::Idle;
        self.waiters.clear();
        self.producers = ProducerStateTable::default();
        self.sync = None;
        self.stale_fetchers.clear();
        self.coordinators.clear();
    }

    /// The disk is replaced while the process is down: it starts again with an empty log, no
    /// epochs and no producer state, as a broker whose data directory was lost.
    pub fn lose_disk(&mut self) {
        self.log.clear();
        self.durable = 0;
        self.segments = BTreeSet::from([0]);
        self.recovery_point = 0;
        self.pending_recovery_point = None;
        self.torn = None;
        self.epochs = LeaderEpochCache::default();
        self.snapshots.clear();
        self.producers = ProducerStateTable::default();
    }

    /// The process starts again: `PartitionLog::open` and a fresh `Partition`.
    pub fn restart(&mut self) {
        // Segments wholly below the recovery point are trusted; the others are CRC-scanned,
        // and the log is cut at the first bad record.
        if let Some(t) = self.torn.take() {
            let holder = self.holder(t);
            let next = self.segments.range(holder + 1..).next().copied();
            if next.is_some_and(|n| n <= self.recovery_point) {
                self.corrupt = Some(format!(
                    "b{} trusted the torn record at offset {t} on restart: its segment [{holder}, {}) lies below the recovery point {}, so it was not CRC-scanned",
                    self.id,
                    next.unwrap_or_default(),
                    self.recovery_point
                ));
            } else {
                self.log.truncate(t as usize);
                self.segments.retain(|b| *b <= t);
            }
        }
        // A recovery point past the last segment's base was left by a truncation that a
        // crash interrupted: lowered.
        let last = *self.segments.last().unwrap_or(&0);
        self.recovery_point = self.recovery_point.min(last);
        self.alive = true;
        self.incarnation += 1;
        self.durable = self.log.len();
        let end = self.end();
        self.published = end;
        self.epochs.truncate_from_end(end);
        self.snapshots.retain(|o, _| *o <= end);
        self.producers = self.rebuilt_producers();
        self.hw = 0;
        self.role = Role::Idle;
    }
}
