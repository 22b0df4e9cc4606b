//! The runtime of one partition on this broker: the single-writer log behind a short lock,
//! a flusher task that group-commits fsyncs, the replica's role (leader, follower or idle),
//! and the high watermark that releases `acks=all` producers and long-polling consumers.
//!
//! The locks are held only for in-memory work and page-cache writes, never across network
//! I/O; fsyncs run on the blocking pool and reads run outside the lock from a [`ReadPlan`].
//! Lock order: `role`, then `log`.
//!
//! As leader, the high watermark is the minimum durable log end over the ISR
//! ([`LeaderState`]); as follower, it is what the leader last said, capped at the local end.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{watch, Notify};

use strata_core::validate::{RecordRules, RecordsError};

use crate::log::{AppendError, Appended, PartitionLog, ReadError, ReadPlan, ValidBatch};
use crate::replication::leader::{
    Assignment, FollowerStatus, IsrProposal, IsrRefusal, LeaderState, NotEnoughReplicas, Policy,
};

/// Kafka's special ListOffsets timestamps.
const LATEST: i64 = -1;
pub(crate) const EARLIEST: i64 = -2;
const MAX_TIMESTAMP: i64 = -3;

/// What consumers and producers may rely on, published after every change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Offsets below this are committed (durable on the ISR per the topic's flush policy)
    /// and visible to consumers.
    pub high_watermark: u64,
    /// Where the local log starts (retention and DeleteRecords move it).
    pub log_start: u64,
    /// Records below this were deleted by DeleteRecords: no tier serves them (the cold
    /// tier may still hold some until its retention catches up).
    pub deleted_below: u64,
    pub log_end: u64,
    /// Offsets below this are fsynced in the local log.
    pub durable_end: u64,
    /// Set when an fsync failed: nothing more will be acknowledged.
    pub failed: bool,
    /// The leader epoch while this replica leads.
    pub leader_epoch: Option<i32>,
    /// The committed ISR is smaller than `min.insync.replicas`.
    pub under_min_isr: bool,
    /// Where the cold tier's manifest ends (tiered topics; `None` until known): local
    /// retention deletes nothing at or past it.
    pub tiered_end: Option<u64>,
}

/// Why waiting for an acknowledgement ended without one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WaitError {
    #[error("timed out waiting for the write to be replicated and durable")]
    Timeout,
    #[error("the partition's storage failed; the write is not known to be durable")]
    StorageFailed,
    #[error("this broker stopped leading the partition before the write was committed")]
    NotLeader,
    #[error("the write was committed, but the ISR shrank below min.insync.replicas")]
    NotEnoughReplicasAfterAppend,
}

/// Why a produce to this replica was refused before append.
#[derive(Debug, thiserror::Error)]
pub enum LeaderAppendError {
    #[error("this replica does not lead the partition")]
    NotLeader,
    /// The producer asked for weaker acks than the topic's `min.acks`.
    #[error("the topic requires min.acks={min_acks}")]
    AcksTooWeak { min_acks: i16 },
    #[error(transparent)]
    NotEnoughReplicas(#[from] NotEnoughReplicas),
    #[error(transparent)]
    Append(#[from] AppendError),
}

/// Why a DeleteRecords was not done (or not known to be done on the ISR).
#[derive(Debug, thiserror::Error)]
pub enum DeleteRecordsError {
    #[error("this replica does not lead the partition")]
    NotLeader,
    #[error("offset {offset} is not between 0 and the high watermark {hw}")]
    OutOfRange { offset: i64, hw: u64 },
    #[error("the log could not be changed: {0}")]
    Storage(std::io::Error),
    #[error("the ISR had not deleted the records in time (low watermark {low})")]
    Timeout { low: u64 },
}

/// Why a replica fetch was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReplicaFetchError {
    #[error("this replica does not lead the partition")]
    NotLeader,
    #[error("the follower's leader epoch {0} is older than the leader's")]
    FencedLeaderEpoch(i32),
    #[error("the follower's leader epoch {0} is newer than the leader's")]
    UnknownLeaderEpoch(i32),
    #[error("broker {0} is not a replica of the partition")]
    NotReplica(i32),
}

/// The leader and leader epoch a follower's fetcher acts for: its writes apply only while the
/// replica still follows that leader at that epoch, checked under the lock that orders role
/// changes, so a fetcher outliving its role can never write into a leader's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Following {
    pub leader: i32,
    pub epoch: i32,
}

/// Why a follower's write was not made.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaWriteError {
    #[error("this replica no longer follows broker {leader} at leader epoch {epoch}")]
    NotFollowing { leader: i32, epoch: i32 },
    #[error(transparent)]
    Append(#[from] AppendError),
    #[error("log i/o failed: {0}")]
    Io(#[from] std::io::Error),
}

/// What a follower's fetch says of it: who (and which registration of it), at which leader
/// epoch, everything below `offset` in its log, and its DeleteRecords point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowerFetch {
    pub replica: i32,
    pub broker_epoch: u64,
    pub epoch: i32,
    pub offset: u64,
    pub deleted_below: u64,
    /// Answer as soon as the high watermark is past this (the follower's), records or not.
    pub wake_past_hw: Option<u64>,
}

/// A leader's answer to a replica fetch that was accepted.
pub struct ReplicaFetchAnswer {
    pub records: bytes::Bytes,
    pub progress: Progress,
}

enum Role {
    /// Neither leading nor following (offline, or not yet told by the metadata).
    Idle,
    Leader {
        epoch: i32,
        state: LeaderState,
        /// When recent appends were made, for the per-stage latency histograms.
        timing: Box<crate::replication::stages::AppendTimes>,
    },
    Follower {
        leader: i32,
        epoch: i32,
        /// Turning it true stops the fetcher task.
        stop: watch::Sender<bool>,
    },
}

pub struct Partition {
    pub topic: Arc<str>,
    pub index: i32,
    role: Mutex<Role>,
    log: Mutex<PartitionLog>,
    progress: watch::Sender<Progress>,
    flush: Notify,
    stop: watch::Sender<bool>,
    /// Counts truncations, so a flush that ran across one does not claim the new data.
    cuts: std::sync::atomic::AtomicU64,
    /// As leader: where each follower last said its DeleteRecords point is (in its
    /// fetches), so a DeleteRecords is answered once the ISR has it.
    follower_deleted_below: watch::Sender<std::collections::BTreeMap<i32, u64>>,
    /// What a produced batch's records are checked against, from the topic config (kept
    /// here so that a produce reads it without the log lock).
    rules: Mutex<ProduceRules>,
    /// Batch bytes appended here as leader, and record bytes fetched by consumers (per-topic
    /// byte rates in /metrics).
    pub bytes_in: std::sync::atomic::AtomicU64,
    pub bytes_out: std::sync::atomic::AtomicU64,
}

/// The parts of a topic's config that [`Partition::check_records`] needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProduceRules {
    max_message_bytes: u32,
    keys_required: bool,
    /// `transactions.required`: only transactional batches.
    transactions_required: bool,
    /// `message.timestamp.type=LogAppendTime`: the leader stamps batches with its time.
    log_append_time: bool,
    /// CreateTime: how far behind / ahead of the broker's clock record timestamps may be.
    timestamp_before_max_ms: i64,
    timestamp_after_max_ms: i64,
    /// `compression.type` other than `producer`: batches in another codec are re-encoded.
    compression: Option<strata_core::batch::Compression>,
    levels: strata_core::batch::Levels,
}

impl ProduceRules {
    fn of(config: &crate::log::LogConfig) -> Self {
        ProduceRules {
            max_message_bytes: config.max_message_bytes,
            keys_required: config.compacted(),
            transactions_required: config.transactions_required,
            log_append_time: config.timestamp_type
                == crate::log::config::TimestampType::LogAppendTime,
            timestamp_before_max_ms: config.timestamp_before_max_ms,
            timestamp_after_max_ms: config.timestamp_after_max_ms,
            compression: config.compression,
            levels: config.compression_levels,
        }
    }

    /// The window record timestamps must fall in at `now_ms` (CreateTime with limits).
    fn window(&self, now_ms: i64) -> Option<(i64, i64)> {
        if self.log_append_time
            || (self.timestamp_before_max_ms == i64::MAX && self.timestamp_after_max_ms == i64::MAX)
        {
            return None;
        }
        Some((
            now_ms.saturating_sub(self.timestamp_before_max_ms),
            now_ms.saturating_add(self.timestamp_after_max_ms),
        ))
    }
}

impl Partition {
    /// Wraps an opened log and starts its flusher on the current runtime. The replica is
    /// idle until told to lead or follow; `high_watermark` is where the HW starts.
    pub fn start(
        topic: Arc<str>,
        index: i32,
        log: PartitionLog,
        high_watermark: u64,
    ) -> Arc<Partition> {
        let end = log.end_offset();
        let (progress, _) = watch::channel(Progress {
            high_watermark: high_watermark.min(end),
            log_start: log.start_offset(),
            deleted_below: log.deleted_below(),
            log_end: end,
            durable_end: end,
            failed: false,
            leader_epoch: None,
            under_min_isr: false,
            tiered_end: None,
        });
        let (stop, _) = watch::channel(false);
        let rules = Mutex::new(ProduceRules::of(log.config()));
        let p = Arc::new(Partition {
            topic,
            index,
            role: Mutex::new(Role::Idle),
            log: Mutex::new(log),
            progress,
            flush: Notify::new(),
            stop,
            cuts: std::sync::atomic::AtomicU64::new(0),
            follower_deleted_below: watch::Sender::new(Default::default()),
            rules,
            bytes_in: Default::default(),
            bytes_out: Default::default(),
        });
        tokio::spawn(p.clone().run_flusher());
        p
    }

    /// A partition of a single-node broker (or a benchmark): its own leader, alone in the
    /// ISR, at leader epoch 0.
    pub fn start_standalone(
        topic: Arc<str>,
        index: i32,
        log: PartitionLog,
        node_id: i32,
    ) -> Arc<Partition> {
        let end = log.end_offset();
        let p = Partition::start(topic, index, log, end);
        p.lead_alone(node_id);
        p
    }

    /// Leads at epoch 0 with `node_id` the only replica (a single-node broker).
    pub fn lead_alone(&self, node_id: i32) {
        let min_isr = usize::from(self.lock().config().min_insync_replicas);
        self.become_leader(
            0,
            Assignment {
                me: node_id,
                replicas: vec![node_id],
                isr: vec![node_id],
                partition_epoch: 0,
            },
            Policy {
                min_insync_replicas: min_isr,
                replica_lag_max_ms: i64::MAX,
            },
            0,
        );
    }

    /// Locks the log. A panic while holding the lock cannot leave a half-written batch
    /// visible (the high watermark did not move), so a poisoned lock is still usable.
    pub fn lock(&self) -> MutexGuard<'_, PartitionLog> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn role(&self) -> MutexGuard<'_, Role> {
        self.role.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether this replica leads now.
    pub fn is_leader(&self) -> bool {
        matches!(&*self.role(), Role::Leader { .. })
    }

    /// Bytes of this replica's local log segments.
    pub fn size_bytes(&self) -> u64 {
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .size_bytes()
    }

    pub fn progress(&self) -> Progress {
        *self.progress.borrow()
    }

    pub fn subscribe(&self) -> watch::Receiver<Progress> {
        self.progress.subscribe()
    }

    fn publish_hw(&self, hw: Option<u64>) {
        if let Some(hw) = hw {
            self.progress.send_if_modified(|p| {
                let moved = hw > p.high_watermark;
                p.high_watermark = p.high_watermark.max(hw);
                moved
            });
        }
    }

    /// Publishes whether the ISR is below `min.insync.replicas`, and a moved HW.
    fn publish_isr_state(&self, under_min_isr: bool, hw: Option<u64>) {
        self.progress.send_if_modified(|p| {
            let changed = p.under_min_isr != under_min_isr;
            p.under_min_isr = under_min_isr;
            changed
        });
        self.publish_hw(hw);
    }

    /// Makes this replica the leader at `epoch`, or updates the ISR if it already is.
    /// A follower's fetcher is stopped first.
    pub fn become_leader(&self, epoch: i32, assignment: Assignment, policy: Policy, now_ms: i64) {
        let mut role = self.role();
        if self.failed() {
            // Its role comes back after the restart (see `Partition::restart`).
            tracing::debug!(topic = %self.topic, partition = self.index, epoch, "not leading a partition whose storage failed");
            return;
        }
        if let Role::Leader {
            epoch: e, state, ..
        } = &mut *role
        {
            if *e == epoch {
                let hw = state.on_isr_committed(assignment.isr, assignment.partition_epoch);
                state.set_policy(policy);
                let under = state.under_min_isr();
                drop(role);
                self.publish_isr_state(under, hw);
                return;
            }
        }
        if let Role::Follower { stop, .. } = &*role {
            stop.send_replace(true);
        }
        // Followers tell a new leader afresh where their DeleteRecords points are.
        self.follower_deleted_below.send_replace(Default::default());
        let (leader_end, log_end) = {
            let mut log = self.lock();
            if let Err(e) = log.begin_leader_epoch(epoch) {
                tracing::error!(topic = %self.topic, partition = self.index, epoch, error = %e, "could not record the new leader epoch; partition stops accepting writes");
                self.progress.send_modify(|p| p.failed = true);
            }
            let end = log.end_offset();
            if log.config().acks_wait_for_fsync() {
                (self.progress().durable_end, end)
            } else {
                (end, end)
            }
        };
        let hw = self.progress().high_watermark;
        let state = LeaderState::new(assignment, log_end, leader_end, hw, policy, now_ms);
        let (hw, under) = (state.high_watermark(), state.under_min_isr());
        *role = Role::Leader {
            epoch,
            state,
            timing: Box::new(crate::replication::stages::AppendTimes::new(leader_end)),
        };
        drop(role);
        self.progress.send_modify(|p| {
            p.leader_epoch = Some(epoch);
            p.under_min_isr = under;
            p.high_watermark = p.high_watermark.max(hw);
        });
        tracing::info!(topic = %self.topic, partition = self.index, epoch, log_end, high_watermark = hw, "leading");
    }

    /// Makes this replica a follower of `leader` at `epoch`. Returns the stop signal for a
    /// new fetcher task when one must be started (`None`: already following so).
    pub fn become_follower(&self, leader: i32, epoch: i32) -> Option<watch::Receiver<bool>> {
        let mut role = self.role();
        if self.failed() {
            tracing::debug!(topic = %self.topic, partition = self.index, leader, epoch, "not following for a partition whose storage failed");
            return None;
        }
        match &*role {
            Role::Follower {
                leader: l,
                epoch: e,
                ..
            } if *l == leader && *e == epoch => return None,
            Role::Follower { stop, .. } => {
                stop.send_replace(true);
            }
            _ => {}
        }
        let (stop, stop_rx) = watch::channel(false);
        *role = Role::Follower {
            leader,
            epoch,
            stop,
        };
        drop(role);
        // Waiting producers fail: whatever they wrote may be truncated now.
        self.progress.send_modify(|p| {
            p.leader_epoch = None;
            p.under_min_isr = false;
        });
        tracing::info!(topic = %self.topic, partition = self.index, leader, epoch, "following");
        Some(stop_rx)
    }

    /// Neither leads nor follows (the partition is offline or being removed).
    pub fn become_idle(&self) {
        let mut role = self.role();
        if let Role::Follower { stop, .. } = &*role {
            stop.send_replace(true);
        }
        let was_idle = matches!(*role, Role::Idle);
        *role = Role::Idle;
        drop(role);
        if !was_idle {
            self.progress.send_modify(|p| p.leader_epoch = None);
        }
    }

    /// Whether this replica follows `leader` at `epoch` (the fetcher checks before acting).
    pub fn follows(&self, leader: i32, epoch: i32) -> bool {
        matches!(&*self.role(), Role::Follower { leader: l, epoch: e, .. } if *l == leader && *e == epoch)
    }

    /// Checks the records inside a produced batch, outside any log lock: well-formed, offset
    /// deltas in order, keys on a compacted topic, timestamps inside the topic's window
    /// (`message.timestamp.before.max.ms` / `after.max.ms` around `now_ms`, CreateTime
    /// topics); a compressed batch is decompressed as a stream, to at most
    /// [`strata_core::codec::MAX_DECOMPRESSED_BATCH`] (what the tools that decode batches
    /// accept), so a decompression bomb is refused before it is stored. A batch over
    /// `max.message.bytes` is left for the append to refuse, undecompressed.
    ///
    /// On a topic whose `compression.type` names a codec, a batch in another one comes back
    /// re-encoded in it, as Kafka's leader does (the append then checks the new size against
    /// `max.message.bytes`).
    ///
    /// On a `message.timestamp.type=LogAppendTime` topic the batch comes back stamped with
    /// `now_ms` as its append time (CRC recomputed), as Kafka's leader stamps it; otherwise
    /// as it was. Returns the append time it was stamped with, if any.
    pub fn check_records(
        &self,
        batch: ValidBatch,
        now_ms: i64,
    ) -> Result<(ValidBatch, Option<i64>), RecordsError> {
        let rules = *self.rules.lock().unwrap_or_else(|e| e.into_inner());
        if batch.len() > rules.max_message_bytes as usize {
            return Ok((batch, None));
        }
        if rules.transactions_required && !batch.header().is_transactional() {
            return Err(RecordsError::NotTransactional);
        }
        batch.check_records(RecordRules {
            keys_required: rules.keys_required,
            limit: strata_core::codec::MAX_DECOMPRESSED_BATCH as u64,
            timestamps: rules.window(now_ms).map(|(earliest, latest)| {
                strata_core::validate::TimestampWindow {
                    base: batch.header().base_timestamp,
                    earliest,
                    latest,
                }
            }),
        })?;
        let batch = match rules.compression {
            Some(to) if to != batch.header().compression() => batch
                .recompressed(to, rules.levels)
                .map_err(RecordsError::Decompress)?,
            _ => batch,
        };
        if rules.log_append_time {
            return Ok((batch.with_log_append_time(now_ms), Some(now_ms)));
        }
        Ok((batch, None))
    }

    /// Appends a produced batch as leader. `acks=-1` is refused before append when the ISR
    /// is smaller than `min.insync.replicas`. Returns where the batch landed and the leader
    /// epoch it was written in (pass both to [`Partition::wait_durable`]).
    pub fn append(
        &self,
        batch: &ValidBatch,
        acks: i16,
        now_ms: i64,
    ) -> Result<(Appended, i32), LeaderAppendError> {
        self.append_verified(batch, acks, None, now_ms)
    }

    /// [`Partition::append`], with what KIP-890 verification found for a transactional
    /// batch (`None`: not verified, as for Strata's own clients).
    pub fn append_verified(
        &self,
        batch: &ValidBatch,
        acks: i16,
        verified: Option<crate::log::TxnVerified>,
        now_ms: i64,
    ) -> Result<(Appended, i32), LeaderAppendError> {
        self.append_checked(acks, None, |log| match verified {
            Some(v) => log.append_verified(batch, v, now_ms),
            None => log.append(batch, now_ms),
        })
    }

    /// The KIP-890 guard for a transactional batch of `producer_id` at `epoch`, as leader
    /// ([`PartitionLog::txn_guard`]); `None` also when not leading (the append says so).
    pub fn txn_guard(&self, producer_id: i64, epoch: i16) -> Option<Option<u64>> {
        let role = self.role();
        if !matches!(&*role, Role::Leader { .. }) {
            return None;
        }
        let guard = self.lock().txn_guard(producer_id, epoch);
        Some(guard)
    }

    /// Appends a transaction marker for `producer_id` as leader (acks=all: refused before
    /// append when the ISR is below `min.insync.replicas`). Returns where it landed and the
    /// leader epoch, as [`Partition::append`].
    pub fn append_marker(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        marker: strata_core::batch::marker::Marker,
        now_ms: i64,
    ) -> Result<(Appended, i32), LeaderAppendError> {
        self.append_checked(-1, None, |log| {
            log.append_marker(producer_id, producer_epoch, marker, now_ms)
        })
    }

    /// A coordinator's write ([`PartitionLog::append_unsequenced`]), only while this
    /// replica leads at `epoch` (checked under the lock the append holds: a writer bound to
    /// one leadership, such as a group coordinator, never writes into a later one).
    pub fn append_in_epoch(
        &self,
        epoch: i32,
        batch: &ValidBatch,
        acks: i16,
        now_ms: i64,
    ) -> Result<Appended, LeaderAppendError> {
        self.append_checked(acks, Some(epoch), |log| {
            log.append_unsequenced(batch, now_ms)
        })
        .map(|(a, _)| a)
    }

    fn append_checked(
        &self,
        acks: i16,
        expected_epoch: Option<i32>,
        write: impl FnOnce(&mut PartitionLog) -> Result<Appended, AppendError>,
    ) -> Result<(Appended, i32), LeaderAppendError> {
        if self.failed() {
            return Err(AppendError::Io(std::io::Error::other(
                "partition storage failed; the broker is restarting the partition, retry shortly",
            ))
            .into());
        }
        let mut role = self.role();
        let Role::Leader {
            epoch,
            state,
            timing,
        } = &mut *role
        else {
            return Err(LeaderAppendError::NotLeader);
        };
        if expected_epoch.is_some_and(|e| e != *epoch) {
            return Err(LeaderAppendError::NotLeader);
        }
        let mut log = self.lock();
        let min_acks = log.config().min_acks;
        if !crate::log::LogConfig::accepts(min_acks, acks) {
            return Err(LeaderAppendError::AcksTooWeak { min_acks });
        }
        if acks == -1 {
            state.check_acks_all()?;
        }
        let epoch = *epoch;
        let appended = write(&mut log)?;
        let wait_for_fsync = log.config().acks_wait_for_fsync();
        let (start, end) = (log.start_offset(), log.end_offset());
        drop(log);
        if acks == -1 && wait_for_fsync {
            timing.appended(end, std::time::Instant::now());
        }
        let hw = (!wait_for_fsync)
            .then(|| state.on_leader_durable(end))
            .flatten();
        drop(role);
        self.progress.send_modify(|p| {
            p.log_start = start;
            p.log_end = end;
            if let Some(hw) = hw {
                p.high_watermark = p.high_watermark.max(hw);
            }
        });
        if appended.flush_now {
            self.flush.notify_one();
        }
        Ok((appended, epoch))
    }

    /// Holds the role lock while this replica follows `at`; the caller then takes the log.
    fn following(&self, at: Following) -> Result<MutexGuard<'_, Role>, ReplicaWriteError> {
        let role = self.role();
        match &*role {
            Role::Follower { leader, epoch, .. } if *leader == at.leader && *epoch == at.epoch => {
                Ok(role)
            }
            _ => Err(ReplicaWriteError::NotFollowing {
                leader: at.leader,
                epoch: at.epoch,
            }),
        }
    }

    /// Appends batches copied from the leader (a follower's write) while this replica follows
    /// `at`; returns the new log end.
    pub fn append_replicated(
        &self,
        at: Following,
        batches: &[ValidBatch],
        now_ms: i64,
    ) -> Result<u64, ReplicaWriteError> {
        let role = self.following(at)?;
        let mut log = self.lock();
        let mut flush = false;
        let mut result = Ok(());
        for b in batches {
            match log.append_replicated(b, now_ms) {
                Ok(a) => flush |= a.flush_now,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        let (start, end) = (log.start_offset(), log.end_offset());
        drop(log);
        drop(role);
        self.progress.send_modify(|p| {
            p.log_start = start;
            p.log_end = end;
        });
        if flush {
            self.flush.notify_one();
        }
        Ok(result.map(|()| end)?)
    }

    /// A follower of `at` learned the leader's high watermark; false when it no longer
    /// follows `at` (nothing is published then).
    pub fn set_follower_hw(&self, at: Following, leader_hw: u64) -> bool {
        let Ok(_role) = self.following(at) else {
            return false;
        };
        self.progress.send_if_modified(|p| {
            let hw = leader_hw.min(p.log_end);
            let changed = hw != p.high_watermark;
            p.high_watermark = hw;
            changed
        });
        true
    }

    /// Makes the log durable up to its current end before returning (a follower reports its
    /// fetch offset as durable to the leader). Fails when the storage failed.
    pub async fn wait_synced(&self) -> Result<(), WaitError> {
        let end = self.progress().log_end;
        let mut rx = self.progress.subscribe();
        if rx.borrow().durable_end >= end {
            return Ok(());
        }
        self.flush.notify_one();
        let synced = rx
            .wait_for(|p| p.durable_end >= end || p.failed)
            .await
            .is_ok_and(|p| !p.failed);
        if synced {
            Ok(())
        } else {
            Err(WaitError::StorageFailed)
        }
    }

    /// Waits until everything below `end`, written at leader `epoch`, is committed. Fails
    /// when this replica stops leading at that epoch first, and with
    /// NOT_ENOUGH_REPLICAS_AFTER_APPEND when the ISR is below `min.insync.replicas` then.
    pub async fn wait_durable(
        &self,
        end: u64,
        epoch: i32,
        timeout: Duration,
    ) -> Result<(), WaitError> {
        let mut rx = self.progress.subscribe();
        let waited = tokio::time::timeout(timeout, async {
            let p = rx
                .wait_for(|p| p.high_watermark >= end || p.failed || p.leader_epoch != Some(epoch))
                .await
                .map(|p| *p);
            match p {
                Err(_) => Err(WaitError::StorageFailed),
                Ok(p) if p.leader_epoch != Some(epoch) => Err(WaitError::NotLeader),
                Ok(p) if p.high_watermark >= end && p.under_min_isr => {
                    Err(WaitError::NotEnoughReplicasAfterAppend)
                }
                Ok(p) if p.high_watermark >= end => Ok(()),
                Ok(_) => Err(WaitError::StorageFailed),
            }
        })
        .await;
        waited.unwrap_or(Err(WaitError::Timeout))
    }

    /// Plans a consumer read at `offset`, bounded by the high watermark, or with
    /// `committed` (read_committed) by the last stable offset. Returns the plan, the
    /// progress it was made at and the last stable offset then.
    pub fn plan_read(
        &self,
        offset: u64,
        committed: bool,
    ) -> Result<(Option<ReadPlan>, Progress, u64), ReadError> {
        let mut log = self.lock();
        let progress = self.progress();
        let lso = log.last_stable_offset(progress.high_watermark);
        let bound = if committed {
            lso
        } else {
            progress.high_watermark
        };
        let plan = log.plan_read(offset, bound)?;
        Ok((plan, progress, lso))
    }

    /// The last stable offset now (see [`crate::log::txn`]).
    pub fn last_stable_offset(&self) -> u64 {
        let mut log = self.lock();
        let hw = self.progress().high_watermark;
        log.last_stable_offset(hw)
    }

    /// The aborted transactions a read_committed fetch of `[from, to)` must report.
    pub fn aborted_between(&self, from: u64, to: u64) -> Vec<crate::log::txn::AbortedTxn> {
        self.lock().aborted_between(from, to)
    }

    /// Reads whole batches at `offset` below the high watermark, waiting up to `max_wait`
    /// for some to arrive (a long poll for one partition).
    pub async fn read_waiting(
        &self,
        offset: u64,
        max_bytes: usize,
        max_wait: Duration,
    ) -> Result<(bytes::Bytes, Progress), ReadError> {
        self.read_until(offset, max_bytes, max_wait, |p| p.high_watermark, None)
            .await
    }

    async fn read_until(
        &self,
        offset: u64,
        max_bytes: usize,
        max_wait: Duration,
        bound: impl Fn(&Progress) -> u64,
        wake_past_hw: Option<u64>,
    ) -> Result<(bytes::Bytes, Progress), ReadError> {
        let deadline = tokio::time::Instant::now() + max_wait;
        let mut rx = self.progress.subscribe();
        let deleted_below = rx.borrow().deleted_below;
        loop {
            if rx.borrow_and_update().deleted_below != deleted_below {
                // A DeleteRecords: answer now, so followers learn of it without waiting
                // for records.
                return Ok((bytes::Bytes::new(), self.progress()));
            }
            let (plan, progress) = {
                let log = self.lock();
                let progress = self.progress();
                (log.plan_read(offset, bound(&progress))?, progress)
            };
            if let Some(plan) = plan {
                // What a follower at the end asks for was just written: from the page cache,
                // here; anything else on a blocking thread.
                let bytes = match plan.read_cached(max_bytes)? {
                    Some(bytes) => bytes,
                    None => tokio::task::spawn_blocking(move || plan.read(max_bytes))
                        .await
                        .map_err(|e| ReadError::Io(std::io::Error::other(e)))??,
                };
                if !bytes.is_empty() {
                    return Ok((bytes, progress));
                }
            }
            if wake_past_hw.is_some_and(|hw| progress.high_watermark > hw) {
                // No records, but the follower's readers (KIP-392) wait on this.
                return Ok((bytes::Bytes::new(), progress));
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                return Ok((bytes::Bytes::new(), self.progress()));
            }
        }
    }

    /// Serves a follower's fetch as leader: records that `replica` has everything below
    /// `offset` (moving the high watermark), then long-polls for batches from `offset` up to
    /// the log end.
    pub async fn replica_fetch(
        &self,
        fetch: FollowerFetch,
        max_bytes: usize,
        max_wait: Duration,
        now_ms: i64,
    ) -> Result<Result<ReplicaFetchAnswer, ReadError>, ReplicaFetchError> {
        let FollowerFetch {
            replica,
            broker_epoch,
            epoch,
            offset,
            deleted_below,
            wake_past_hw,
        } = fetch;
        let hw = {
            let mut role = self.role();
            let Role::Leader {
                epoch: mine,
                state,
                timing,
            } = &mut *role
            else {
                return Err(ReplicaFetchError::NotLeader);
            };
            if epoch < *mine {
                return Err(ReplicaFetchError::FencedLeaderEpoch(epoch));
            }
            if epoch > *mine {
                return Err(ReplicaFetchError::UnknownLeaderEpoch(epoch));
            }
            if !state.replicas().contains(&replica) {
                return Err(ReplicaFetchError::NotReplica(replica));
            }
            self.follower_deleted_below
                .send_if_modified(|m| m.insert(replica, deleted_below) != Some(deleted_below));
            let Progress {
                log_start, log_end, ..
            } = self.progress();
            // An offset outside the log is answered OFFSET_OUT_OF_RANGE below; it says
            // nothing of what the follower holds, so it must not count as its position.
            let known = (log_start..=log_end).contains(&offset);
            if known {
                timing.fetched(replica, offset, &crate::metrics::STAGES.replica_ack);
            }
            known
                .then(|| state.on_follower_fetch(replica, broker_epoch, offset, log_end, now_ms))
                .flatten()
        };
        self.publish_hw(hw);
        Ok(self
            .read_until(offset, max_bytes, max_wait, |p| p.log_end, wake_past_hw)
            .await
            .map(|(records, progress)| ReplicaFetchAnswer { records, progress }))
    }

    /// Checks that this replica leads at `epoch` (a follower's view of the leader epoch).
    pub fn check_leader(&self, epoch: i32) -> Result<(), ReplicaFetchError> {
        match &*self.role() {
            Role::Leader { epoch: mine, .. } if epoch < *mine => {
                Err(ReplicaFetchError::FencedLeaderEpoch(epoch))
            }
            Role::Leader { epoch: mine, .. } if epoch > *mine => {
                Err(ReplicaFetchError::UnknownLeaderEpoch(epoch))
            }
            Role::Leader { .. } => Ok(()),
            _ => Err(ReplicaFetchError::NotLeader),
        }
    }

    /// The leader's ISR change to propose now, with the leader epoch to send it under.
    pub fn isr_proposal(&self, now_ms: i64) -> Option<(IsrProposal, i32)> {
        match &mut *self.role() {
            Role::Leader { epoch, state, .. } => state.tick(now_ms).map(|p| (p, *epoch)),
            _ => None,
        }
    }

    /// The controller answered the ISR proposal made at leader `epoch` on partition epoch
    /// `proposed_at`: committed (`Ok((isr, partition_epoch))`) or not (how far that is known).
    pub fn isr_answer(
        &self,
        epoch: i32,
        proposed_at: i32,
        committed: Result<(Vec<i32>, i32), IsrRefusal>,
        now_ms: i64,
    ) {
        let mut role = self.role();
        let Role::Leader {
            epoch: e, state, ..
        } = &mut *role
        else {
            return;
        };
        if *e != epoch {
            return;
        }
        let hw = match committed {
            Ok((isr, pe)) => state.on_isr_committed(isr, pe),
            Err(why) => {
                state.on_isr_refused(why, proposed_at, now_ms);
                None
            }
        };
        let under = state.under_min_isr();
        drop(role);
        self.publish_isr_state(under, hw);
    }

    /// As leader: the replicas, the committed ISR and each follower's state.
    pub fn leader_view(&self, now_ms: i64) -> Option<(Vec<i32>, Vec<i32>, Vec<FollowerStatus>)> {
        let log_end = self.progress().log_end;
        match &*self.role() {
            Role::Leader { state, .. } => Some((
                state.replicas().to_vec(),
                state.isr().to_vec(),
                state.followers(log_end, now_ms),
            )),
            _ => None,
        }
    }

    /// Cuts the log at `offset` (a follower of `at` truncating to where it agrees with its
    /// leader). An I/O error leaves the log's files and its in-memory state possibly apart:
    /// the partition then stops acknowledging (reopening rebuilds everything from the files).
    pub fn truncate_to(
        &self,
        at: Following,
        offset: u64,
        now_ms: i64,
    ) -> Result<(), ReplicaWriteError> {
        let _role = self.following(at)?;
        let mut log = self.lock();
        let cut = log.truncate_to(offset, now_ms);
        self.after_cut(&log, cut.is_err());
        Ok(cut?)
    }

    /// Empties the log and restarts it at `offset` (a follower of `at` far behind a leader
    /// whose retention removed what it would fetch next).
    pub fn reset_to(
        &self,
        at: Following,
        offset: u64,
        now_ms: i64,
    ) -> Result<(), ReplicaWriteError> {
        let _role = self.following(at)?;
        let mut log = self.lock();
        let reset = log.reset_to(offset, now_ms);
        self.after_cut(&log, reset.is_err());
        if reset.is_ok() {
            // An empty log whose directory was synced: durable to its (new) end.
            self.progress.send_modify(|p| p.durable_end = offset);
        }
        Ok(reset?)
    }

    fn after_cut(&self, log: &PartitionLog, failed: bool) {
        self.cuts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let (start, end) = (log.start_offset(), log.end_offset());
        let deleted_below = log.deleted_below();
        if failed {
            tracing::error!(topic = %self.topic, partition = self.index, "truncating the log failed; partition stops accepting writes until the broker restarts it");
        }
        self.progress.send_modify(|p| {
            p.log_start = start;
            p.deleted_below = deleted_below;
            p.log_end = end;
            p.durable_end = p.durable_end.min(end);
            p.high_watermark = p.high_watermark.min(end);
            p.failed |= failed;
        });
    }

    /// Applies a changed topic config (retention, segment and flush settings, and the
    /// replication policy when leading).
    /// The log config this replica runs with.
    pub fn log_config(&self) -> crate::log::LogConfig {
        self.lock().config().clone()
    }

    pub fn set_config(&self, config: crate::log::LogConfig, replica_lag_max_ms: i64) {
        *self.rules.lock().unwrap_or_else(|e| e.into_inner()) = ProduceRules::of(&config);
        let policy = Policy {
            min_insync_replicas: usize::from(config.min_insync_replicas),
            replica_lag_max_ms,
        };
        let mut role = self.role();
        if let Role::Leader { state, .. } = &mut *role {
            state.set_policy(policy);
            self.publish_isr_state(state.under_min_isr(), None);
        }
        let mut log = self.lock();
        if *log.config() != config {
            log.set_config(config);
        }
    }

    /// (timestamp, offset) for a ListOffsets query: -1 latest (the high watermark), -2
    /// earliest, -3 the largest timestamp, or the first record at or after a timestamp;
    /// (-1, -1) when no record below the high watermark qualifies.
    pub fn offset_for(&self, timestamp: i64) -> std::io::Result<(i64, i64)> {
        let progress = self.progress();
        let hw = progress.high_watermark;
        match timestamp {
            LATEST => Ok((-1, hw as i64)),
            EARLIEST => Ok((-1, progress.log_start.max(progress.deleted_below) as i64)),
            MAX_TIMESTAMP => Ok(self
                .lock()
                .max_timestamp()
                .filter(|(_, o)| *o < hw)
                .map_or((-1, -1), |(ts, o)| (ts, o as i64))),
            ts => Ok(self
                .lock()
                .offset_for_timestamp(ts)?
                .map(|(o, found)| (o.max(progress.deleted_below), found))
                .filter(|(o, _)| *o < hw)
                .map_or((-1, -1), |(o, found)| (found, o as i64))),
        }
    }

    /// Applies retention; publishes the new log start.
    pub fn apply_retention(&self, now_ms: i64) -> std::io::Result<usize> {
        let tiered_end = self.progress().tiered_end;
        self.delete_segments(|log| log.apply_retention(now_ms, tiered_end))
    }

    /// One compaction round of this replica's log if one is due (a compacted topic that
    /// is not tiered), below its high watermark. Blocking: reads and writes segment files,
    /// holding the log's lock only to plan and to swap.
    pub fn compact(
        &self,
        now_ms: i64,
        max_map_bytes: usize,
    ) -> std::io::Result<Option<crate::log::compaction::CompactionReport>> {
        if self.failed() {
            return Ok(None);
        }
        let upper = self.progress().high_watermark;
        let Some(plan) = self.lock().plan_compaction(upper, now_ms, max_map_bytes) else {
            return Ok(None);
        };
        let done = plan.run()?;
        let report = self.lock().install_compaction(done)?;
        Ok(Some(report))
    }

    /// Records where the cold tier's manifest ends.
    pub fn set_tiered_end(&self, end: u64) {
        self.progress.send_if_modified(|p| {
            let changed = p.tiered_end != Some(end);
            p.tiered_end = Some(end);
            changed
        });
    }

    /// The sealed segments (every one but the active), oldest first, with what an upload
    /// needs: range, files, and the leader epochs of the log.
    pub fn sealed_segments(&self) -> Vec<strata_cold::upload::SealedSegment> {
        self.lock().sealed_segments()
    }

    /// Deletes the segments wholly below `offset` (see [`PartitionLog::trim_before`]).
    pub fn trim_before(&self, offset: u64) -> std::io::Result<usize> {
        self.delete_segments(|log| log.trim_before(offset))
    }

    /// DeleteRecords as leader: records below `offset` (`-1`: the high watermark) are
    /// deleted; only committed records may be (`offset` at most the high watermark).
    /// Returns the point, durable in this replica's log; [`Partition::deleted_on_isr`]
    /// then waits for the followers. Blocking: writes the log's files.
    pub fn delete_records(&self, offset: i64) -> Result<u64, DeleteRecordsError> {
        let role = self.role();
        if !matches!(&*role, Role::Leader { .. }) {
            return Err(DeleteRecordsError::NotLeader);
        }
        if self.failed() {
            return Err(DeleteRecordsError::Storage(std::io::Error::other(
                "the partition's storage failed; it is being restarted",
            )));
        }
        let hw = self.progress().high_watermark;
        let point = match offset {
            -1 => hw,
            o if o >= 0 && o as u64 <= hw => o as u64,
            o => return Err(DeleteRecordsError::OutOfRange { offset: o, hw }),
        };
        self.delete_segments(|log| log.delete_records_before(point).map(|_| Vec::new()))
            .map_err(DeleteRecordsError::Storage)?;
        drop(role);
        Ok(point)
    }

    /// As leader: waits until every follower in the ISR has deleted the records below
    /// `point` (they say so in their fetches), so that no replica that could lead next
    /// still serves them. Returns the partition's low watermark: the lowest DeleteRecords
    /// point over the leader and its ISR.
    pub async fn deleted_on_isr(
        &self,
        point: u64,
        timeout: Duration,
    ) -> Result<u64, DeleteRecordsError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut starts = self.follower_deleted_below.subscribe();
        let mut progress = self.progress.subscribe();
        loop {
            let low = {
                let role = self.role();
                let Role::Leader { state, .. } = &*role else {
                    return Err(DeleteRecordsError::NotLeader);
                };
                let mine = self.progress().deleted_below;
                let known = starts.borrow_and_update();
                state
                    .isr()
                    .iter()
                    .filter(|b| **b != state.me())
                    .map(|b| known.get(b).copied().unwrap_or(0))
                    .fold(mine, u64::min)
            };
            progress.borrow_and_update();
            if low >= point {
                return Ok(low);
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return Err(DeleteRecordsError::Timeout { low }),
                _ = starts.changed() => {}
                _ = progress.changed() => {}
            }
        }
    }

    /// A follower replicated the leader's DeleteRecords point: records below it go here
    /// too (at most up to this log's end; the rest arrives with the records).
    pub fn follow_deleted_below(&self, point: u64) -> std::io::Result<usize> {
        self.delete_segments(|log| log.delete_records_before(point).map(|_| Vec::new()))
    }

    fn delete_segments(
        &self,
        delete: impl FnOnce(&mut PartitionLog) -> std::io::Result<Vec<u64>>,
    ) -> std::io::Result<usize> {
        if self.failed() {
            // The files are left as they are for the restart to reopen.
            return Ok(0);
        }
        let mut log = self.lock();
        let deleted = delete(&mut log)?;
        let (start, deleted_below) = (log.start_offset(), log.deleted_below());
        drop(log);
        self.progress.send_modify(|p| {
            p.log_start = start;
            p.deleted_below = deleted_below;
        });
        Ok(deleted.len())
    }

    /// Forgets the producer ids silent for `after_ms` (KIP-854); returns how many went and
    /// how many are left.
    pub fn expire_producers(&self, now_ms: i64, after_ms: i64) -> (usize, usize) {
        self.lock().expire_producers(now_ms, after_ms)
    }

    /// Whether the partition's storage failed (see [`Partition::restart`]).
    pub fn failed(&self) -> bool {
        self.progress.borrow().failed
    }

    /// Reopens the log of a partition whose storage failed (an fsync, or the truncation or
    /// epoch record after a cut, returned an error), cut back to where its last fsync
    /// succeeded: after a failed fsync the page cache may hold writes that never reached the
    /// disk and never will (fsyncgate), so nothing past that point is trusted, and the open
    /// checks everything past the recovery point again. Nothing committed on an fsync topic
    /// lies past it (acks=all waited for the fsync).
    ///
    /// The replica is left idle: the caller gives it its role again from the metadata (in a
    /// cluster, a leader only once the controllers have moved its leadership to a newer
    /// epoch, so that it never appends in the epoch whose writes it dropped). Blocking: reads
    /// the log's files. Returns the new log end; on an error the partition stays failed and
    /// the old log stays in place.
    pub fn restart(&self, now_ms: i64) -> std::io::Result<u64> {
        if !self.failed() {
            return Ok(self.progress().log_end);
        }
        self.become_idle();
        let (dir, config) = {
            let log = self.lock();
            (log.dir().to_path_buf(), log.config().clone())
        };
        let durable = self.progress().durable_end;
        // Opened beside the old log, which nothing changes while the partition is failed
        // (appends are refused, the replica is idle, retention skips it).
        let (mut fresh, report) = PartitionLog::open(&dir, config, now_ms)?;
        if fresh.end_offset() > durable {
            fresh.truncate_to(durable, now_ms)?;
        }
        let _role = self.role();
        let mut log = self.lock();
        let from = log.end_offset();
        *log = fresh;
        self.cuts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let (start, end) = (log.start_offset(), log.end_offset());
        let deleted_below = log.deleted_below();
        drop(log);
        self.progress.send_modify(|p| {
            p.log_start = start;
            p.deleted_below = deleted_below;
            p.log_end = end;
            p.durable_end = end;
            p.high_watermark = p.high_watermark.min(end);
            p.failed = false;
        });
        tracing::warn!(topic = %self.topic, partition = self.index, from, to = end, scanned_segments = report.scanned_segments, "partition restarted after a storage failure: reopened and cut back to its last successful fsync");
        self.flush.notify_one();
        Ok(end)
    }

    /// Stops the flusher and the fetcher and closes the log cleanly (flushing everything).
    pub fn close(&self) -> std::io::Result<()> {
        self.become_idle();
        self.stop.send_replace(true);
        self.lock().close()
    }

    /// Stops the flusher and the fetcher without closing (the partition's files are about
    /// to be deleted).
    pub fn stop(&self) {
        self.become_idle();
        self.stop.send_replace(true);
    }

    /// Failpoint `fsync-fails-<pid>-<topic>-<partition>`: while armed, this partition's
    /// fsyncs fail with EIO (as on a disk that lost writes), for the process tests of
    /// restarting a partition without restarting the broker.
    fn fsync_fails_while_a_test_asks(&self) -> bool {
        strata_controller::failpoint::enabled()
            && strata_controller::failpoint::armed(&format!(
                "fsync-fails-{}-{}-{}",
                std::process::id(),
                self.topic,
                self.index
            ))
    }

    async fn run_flusher(self: Arc<Self>) {
        let mut stop = self.stop.subscribe();
        loop {
            tokio::select! {
                _ = self.flush.notified() => {}
                _ = async { let _ = stop.wait_for(|s| *s).await.is_ok(); } => return,
            }
            if self.failed() {
                // After a failed fsync the page cache cannot be trusted, and a second fsync
                // may report success for writes the disk never got (fsyncgate): nothing is
                // synced again until the partition is restarted (`Partition::restart`).
                continue;
            }
            let (work, dir, wait_for_fsync, cuts) = {
                let mut log = self.lock();
                let cuts = self.cuts.load(std::sync::atomic::Ordering::SeqCst);
                (
                    log.take_sync_work(),
                    log.dir().to_path_buf(),
                    log.config().acks_wait_for_fsync(),
                    cuts,
                )
            };
            let Some(work) = work else { continue };
            let end = work.end;
            let injected = self.fsync_fails_while_a_test_asks();
            let result = tokio::task::spawn_blocking(move || match injected {
                true => Err(std::io::Error::from_raw_os_error(5)), // EIO
                false => {
                    let started = std::time::Instant::now();
                    let r = work.run(&dir);
                    crate::metrics::STAGES.fsync.observe(started.elapsed());
                    r
                }
            })
            .await;
            match result {
                Ok(Ok(())) => {
                    // Compared and published under the log lock, which every cut holds: a
                    // truncation either came before (and this sync may not count) or comes
                    // after (and lowers what this publishes).
                    let mut role = self.role();
                    let log = self.lock();
                    if self.cuts.load(std::sync::atomic::Ordering::SeqCst) != cuts {
                        // The log was cut while this ran: what it synced may be gone and
                        // what follows the cut is not covered. Sync again.
                        drop(log);
                        drop(role);
                        self.flush.notify_one();
                        continue;
                    }
                    let hw = match &mut *role {
                        Role::Leader { state, timing, .. } if wait_for_fsync => {
                            timing.durable(end, &crate::metrics::STAGES.leader_durable);
                            state.on_leader_durable(end)
                        }
                        _ => None,
                    };
                    self.progress.send_modify(|p| {
                        p.durable_end = p.durable_end.max(end);
                        if let Some(hw) = hw {
                            p.high_watermark = p.high_watermark.max(hw);
                        }
                    });
                    drop(log);
                }
                Ok(Err(e)) => {
                    tracing::error!(topic = %self.topic, partition = self.index, error = %e, durable_end = self.progress().durable_end, "fsync failed; partition stops accepting writes until the broker restarts it");
                    self.progress.send_modify(|p| p.failed = true);
                }
                Err(e) => {
                    tracing::error!(topic = %self.topic, partition = self.index, error = %e, "flush task panicked; partition stops accepting writes until the broker restarts it");
                    self.progress.send_modify(|p| p.failed = true);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_core::batch::build::{batch, ProducerIds, Rec};

    const WAIT: Duration = Duration::from_secs(5);

    fn records(n: usize) -> ValidBatch {
        let recs: Vec<Rec<'_>> = (0..n)
            .map(|i| Rec {
                key: None,
                value: Some(b"settlement"),
                timestamp_delta: i as i64,
            })
            .collect();
        ValidBatch::new(bytes::Bytes::from(batch(0, ProducerIds::NONE, &recs))).unwrap()
    }

    /// A log config whose flushing is left to the OS: appends alone never sync.
    fn flushed_by_the_os() -> crate::log::LogConfig {
        crate::log::LogConfig::from_map(&std::collections::BTreeMap::from([(
            "flush.messages".to_string(),
            i64::MAX.to_string(),
        )]))
        .unwrap()
    }

    /// Broker 1 (of replicas 1, 2, 3) leads at `epoch` with `isr`, min.insync.replicas 2.
    fn lead(p: &Partition, epoch: i32, isr: Vec<i32>, partition_epoch: i32) {
        p.become_leader(
            epoch,
            Assignment {
                me: 1,
                replicas: vec![1, 2, 3],
                isr,
                partition_epoch,
            },
            Policy {
                min_insync_replicas: 2,
                replica_lag_max_ms: 10_000,
            },
            0,
        );
    }

    /// Broker 1 leads at epoch 1 with followers 2 and 3 in the ISR, min.insync.replicas 2.
    fn leader(dir: &std::path::Path) -> Arc<Partition> {
        let (log, _) = PartitionLog::open(dir, crate::log::LogConfig::default(), 0).unwrap();
        let p = Partition::start(Arc::from("t"), 0, log, 0);
        lead(&p, 1, vec![1, 2, 3], 0);
        p
    }

    /// An acks=all producer waiting for `end` in `epoch`, as a task.
    fn spawn_wait(
        p: &Arc<Partition>,
        end: u64,
        epoch: i32,
    ) -> tokio::task::JoinHandle<Result<(), WaitError>> {
        let p = p.clone();
        tokio::spawn(async move { p.wait_durable(end, epoch, WAIT).await })
    }

    async fn fetch(
        p: &Partition,
        replica: i32,
        epoch: i32,
        offset: u64,
    ) -> Result<(), ReplicaFetchError> {
        let at = FollowerFetch {
            replica,
            broker_epoch: 1,
            epoch,
            offset,
            deleted_below: 0,
            wake_past_hw: None,
        };
        p.replica_fetch(at, 1 << 20, Duration::ZERO, 0)
            .await
            .map(|_| ())
    }

    fn configured(dir: &std::path::Path, pairs: &[(&str, &str)]) -> Arc<Partition> {
        let config = crate::log::LogConfig::from_map(
            &pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
        .unwrap();
        let (log, _) = PartitionLog::open(dir, config, 0).unwrap();
        let p = Partition::start(Arc::from("t"), 0, log, 0);
        lead(&p, 1, vec![1, 2, 3], 0);
        p
    }

    /// Kafka's LogAppendTime: the leader stamps the batch's max timestamp with its append
    /// time and sets the timestamp-type bit; what is stored passes the CRC check, and a time
    /// lookup sees the append time, not the producer's timestamps (0, 1, 2).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_log_append_time_topic_stores_batches_stamped_with_a_valid_crc() {
        let dir = tempfile::tempdir().unwrap();
        let p = configured(dir.path(), &[("message.timestamp.type", "LogAppendTime")]);
        let (stamped, at) = p.check_records(records(3), 7_000).unwrap();
        assert_eq!(at, Some(7_000));
        p.append(&stamped, 1, 7_000).unwrap();
        let log = p.lock();
        let bytes = log
            .plan_read(0, u64::MAX)
            .unwrap()
            .unwrap()
            .read(1 << 20)
            .unwrap();
        let h = strata_core::batch::verify(&bytes).expect("the stored batch's CRC is valid");
        assert!(h.log_append_time());
        assert_eq!((h.base_offset, h.max_timestamp), (0, 7_000));
        assert_eq!(log.offset_for_timestamp(1).unwrap(), Some((0, 7_000)));
        assert_eq!(log.offset_for_timestamp(7_001).unwrap(), None);
        drop(log);
        // a CreateTime topic keeps the producer's timestamps and bytes
        let dir = tempfile::tempdir().unwrap();
        let p = configured(dir.path(), &[]);
        let (kept, at) = p.check_records(records(3), 7_000).unwrap();
        assert_eq!(at, None);
        assert!(!kept.header().log_append_time());
        assert_eq!(kept.header().max_timestamp, 2);
    }

    /// `message.timestamp.before.max.ms` / `after.max.ms` (and the older
    /// `difference.max.ms`) refuse records whose timestamp is too far from the broker's clock.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn records_outside_the_timestamp_window_are_refused_before_append() {
        let dir = tempfile::tempdir().unwrap();
        let p = configured(dir.path(), &[("message.timestamp.before.max.ms", "100")]);
        // records at 0, 1, 2; now 101: record 0 is 101 ms old
        assert!(matches!(
            p.check_records(records(3), 101),
            Err(RecordsError::Timestamp {
                index: 0,
                timestamp: 0,
                ..
            })
        ));
        assert!(p.check_records(records(3), 100).is_ok());
        let dir = tempfile::tempdir().unwrap();
        let p = configured(dir.path(), &[("message.timestamp.difference.max.ms", "1")]);
        // now -1: record 1 is 2 ms ahead
        assert!(matches!(
            p.check_records(records(3), -1),
            Err(RecordsError::Timestamp { index: 1, .. })
        ));
        // LogAppendTime replaces the timestamps: no window
        let dir = tempfile::tempdir().unwrap();
        let p = configured(
            dir.path(),
            &[
                ("message.timestamp.type", "LogAppendTime"),
                ("message.timestamp.difference.max.ms", "1"),
            ],
        );
        assert!(p.check_records(records(3), 1_000_000).is_ok());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn acks_all_is_released_only_once_every_isr_member_has_the_write() {
        let dir = tempfile::tempdir().unwrap();
        let p = leader(dir.path());
        let (a, epoch) = p.append(&records(3), -1, 0).unwrap();
        let end = a.last_offset + 1;
        let waiter = spawn_wait(&p, end, epoch);
        // the leader's own fsync is not enough, nor one follower
        fetch(&p, 2, 1, end).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiter.is_finished(), "released before follower 3 has it");
        assert_eq!(p.progress().high_watermark, 0);
        fetch(&p, 3, 1, end).await.unwrap();
        assert_eq!(waiter.await.unwrap(), Ok(()));
        assert_eq!(p.progress().high_watermark, end);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_follower_waiting_past_its_high_watermark_is_answered_when_it_moves() {
        let dir = tempfile::tempdir().unwrap();
        let p = leader(dir.path());
        let (a, _) = p.append(&records(3), -1, 0).unwrap();
        let end = a.last_offset + 1;
        fetch(&p, 2, 1, end).await.unwrap();
        let caught_up = move |replica, wake_past_hw| FollowerFetch {
            replica,
            broker_epoch: 1,
            epoch: 1,
            offset: end,
            deleted_below: 0,
            wake_past_hw,
        };
        // Without it, a caught-up follower waits for records; with it, for the high
        // watermark too, which follower 3's fetch moves.
        let p2 = p.clone();
        let plain = tokio::spawn(async move {
            p2.replica_fetch(caught_up(2, None), 1 << 20, Duration::from_secs(2), 0)
                .await
        });
        let p2 = p.clone();
        let woken = tokio::spawn(async move {
            p2.replica_fetch(caught_up(2, Some(0)), 1 << 20, Duration::from_secs(10), 0)
                .await
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !woken.is_finished(),
            "answered before the high watermark moved"
        );
        fetch(&p, 3, 1, end).await.unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(1), woken)
            .await
            .expect("not woken by the high watermark")
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(answer.records.is_empty());
        assert_eq!(answer.progress.high_watermark, end);
        assert!(!plain.is_finished(), "woken without asking");
        // Already past it: answered at once.
        let at_once = p.replica_fetch(
            caught_up(2, Some(end - 1)),
            1 << 20,
            Duration::from_secs(10),
            0,
        );
        let answer = tokio::time::timeout(Duration::from_secs(1), at_once)
            .await
            .expect("waited though the high watermark is past")
            .unwrap()
            .unwrap();
        assert_eq!(answer.progress.high_watermark, end);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn delete_records_is_answered_once_the_isr_has_deleted_them() {
        let dir = tempfile::tempdir().unwrap();
        let p = leader(dir.path());
        let (a, epoch) = p.append(&records(10), -1, 0).unwrap();
        let end = a.last_offset + 1;
        let waiter = spawn_wait(&p, end, epoch);
        fetch(&p, 2, 1, end).await.unwrap();
        fetch(&p, 3, 1, end).await.unwrap();
        waiter.await.unwrap().unwrap();
        // Past the high watermark, and below zero other than -1, is out of range.
        assert!(matches!(
            p.delete_records(end as i64 + 1),
            Err(DeleteRecordsError::OutOfRange { .. })
        ));
        assert!(matches!(
            p.delete_records(-2),
            Err(DeleteRecordsError::OutOfRange { .. })
        ));
        assert_eq!(p.delete_records(4).unwrap(), 4);
        let progress = p.progress();
        assert_eq!((progress.log_start, progress.deleted_below), (4, 4));
        assert_eq!(p.offset_for(EARLIEST).unwrap(), (-1, 4));
        assert!(matches!(
            p.plan_read(3, false),
            Err(crate::log::ReadError::OffsetOutOfRange { .. })
        ));
        // Not answered until both followers say they have deleted them too.
        let short = p.deleted_on_isr(4, Duration::from_millis(100)).await;
        assert!(matches!(short, Err(DeleteRecordsError::Timeout { low: 0 })));
        let p2 = p.clone();
        let waiting = tokio::spawn(async move { p2.deleted_on_isr(4, WAIT).await });
        let at = FollowerFetch {
            replica: 2,
            broker_epoch: 1,
            epoch: 1,
            offset: end,
            deleted_below: 4,
            wake_past_hw: None,
        };
        p.replica_fetch(at, 1 << 20, Duration::ZERO, 0)
            .await
            .unwrap()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !waiting.is_finished(),
            "answered before follower 3 deleted them"
        );
        let at = FollowerFetch {
            replica: 3,
            broker_epoch: 1,
            epoch: 1,
            offset: end,
            deleted_below: 4,
            wake_past_hw: None,
        };
        p.replica_fetch(at, 1 << 20, Duration::ZERO, 0)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(waiting.await.unwrap().unwrap(), 4);
        // -1 deletes up to the high watermark.
        assert_eq!(p.delete_records(-1).unwrap(), end);
        // A follower refuses: it leads nothing.
        p.become_idle();
        assert!(matches!(
            p.delete_records(-1),
            Err(DeleteRecordsError::NotLeader)
        ));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_deposed_leader_acknowledges_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let p = leader(dir.path());
        let (a, epoch) = p.append(&records(2), -1, 0).unwrap();
        let waiter = spawn_wait(&p, a.last_offset + 1, epoch);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let _stop = p.become_follower(2, 2).expect("a new follower role");
        assert_eq!(waiter.await.unwrap(), Err(WaitError::NotLeader));
        // even if the new leader's HW later covers that offset (with other records)
        assert!(p.set_follower_hw(
            Following {
                leader: 2,
                epoch: 2
            },
            100
        ));
        assert_eq!(
            p.wait_durable(a.last_offset + 1, epoch, Duration::from_millis(100))
                .await,
            Err(WaitError::NotLeader)
        );
        assert!(matches!(
            p.append(&records(1), -1, 0),
            Err(LeaderAppendError::NotLeader)
        ));
        assert_eq!(fetch(&p, 3, 1, 0).await, Err(ReplicaFetchError::NotLeader));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_isr_shrunk_below_min_fails_the_write_after_append_and_refuses_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let p = leader(dir.path());
        let (a, epoch) = p.append(&records(2), -1, 0).unwrap();
        let waiter = spawn_wait(&p, a.last_offset + 1, epoch);
        // the controllers fenced both followers: the ISR is the leader alone
        lead(&p, 1, vec![1], 2);
        assert_eq!(
            waiter.await.unwrap(),
            Err(WaitError::NotEnoughReplicasAfterAppend)
        );
        assert!(matches!(
            p.append(&records(1), -1, 0),
            Err(LeaderAppendError::NotEnoughReplicas(NotEnoughReplicas {
                isr: 1,
                min: 2
            }))
        ));
        let before = p.progress().log_end;
        assert!(
            p.append(&records(1), 1, 0).is_ok(),
            "acks=1 is not bound by it"
        );
        assert_eq!(p.progress().log_end, before + 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn replica_fetches_at_another_epoch_or_from_strangers_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = leader(dir.path());
        assert_eq!(
            fetch(&p, 2, 0, 0).await,
            Err(ReplicaFetchError::FencedLeaderEpoch(0))
        );
        assert_eq!(
            fetch(&p, 2, 2, 0).await,
            Err(ReplicaFetchError::UnknownLeaderEpoch(2))
        );
        assert_eq!(
            fetch(&p, 7, 1, 0).await,
            Err(ReplicaFetchError::NotReplica(7))
        );
        assert_eq!(fetch(&p, 2, 1, 0).await, Ok(()));
    }

    /// A stamped batch of `n` records at `base` in leader epoch `epoch` (what a leader sends).
    fn replicated(base: u64, n: usize, epoch: i32) -> ValidBatch {
        let recs: Vec<Rec<'_>> = (0..n)
            .map(|i| Rec {
                key: None,
                value: Some(b"settlement"),
                timestamp_delta: i as i64,
            })
            .collect();
        let mut bytes = batch(0, ProducerIds::NONE, &recs);
        let prefix = strata_core::batch::stamped_prefix(&bytes, base as i64, epoch);
        bytes[..prefix.len()].copy_from_slice(&prefix);
        ValidBatch::new(bytes::Bytes::from(bytes)).unwrap()
    }

    /// A follower of broker 2 at epoch 1 that appended records 0..3 from it.
    fn following_with_three_records(log: PartitionLog) -> Arc<Partition> {
        let p = Partition::start(Arc::from("t"), 0, log, 0);
        p.become_follower(2, 1).expect("following");
        let at = Following {
            leader: 2,
            epoch: 1,
        };
        p.append_replicated(at, &[replicated(0, 3, 1)], 0).unwrap();
        p
    }

    /// Issue 14, defect 9: a fetcher that outlived its role (the replica became leader, or
    /// follows another leader now) could still append, truncate and set the HW.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fetcher_of_an_old_role_cannot_write() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = PartitionLog::open(dir.path(), crate::log::LogConfig::default(), 0).unwrap();
        let p = Partition::start(Arc::from("t"), 0, log, 0);
        let old = Following {
            leader: 2,
            epoch: 3,
        };
        p.become_follower(2, 3).expect("following");
        p.append_replicated(old, &[replicated(0, 2, 3)], 0).unwrap();
        assert!(p.set_follower_hw(old, 2));
        // the replica is elected leader at epoch 4 while the old fetcher is mid-round
        lead(&p, 4, vec![1, 2, 3], 5);
        assert!(matches!(
            p.append_replicated(old, &[replicated(2, 1, 3)], 0),
            Err(ReplicaWriteError::NotFollowing { .. })
        ));
        assert!(matches!(
            p.truncate_to(old, 0, 0),
            Err(ReplicaWriteError::NotFollowing { .. })
        ));
        assert!(!p.set_follower_hw(old, 0));
        assert_eq!(p.progress().log_end, 2, "the leader's log is untouched");
        // and a follower of epoch 3 cannot write once it follows epoch 5
        p.become_follower(3, 5).expect("following again");
        assert!(matches!(
            p.append_replicated(old, &[replicated(2, 1, 3)], 0),
            Err(ReplicaWriteError::NotFollowing { .. })
        ));
    }

    /// Issue 14, defect 6: the flusher compared the cut count and published its durable end
    /// in two steps, so a truncation between them left `durable_end` past the log end (a
    /// follower then reported unsynced records as durable). The test holds the role lock,
    /// which the flusher takes between the two, and cuts the log meanwhile.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_truncation_during_a_sync_is_not_published_as_durable() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = PartitionLog::open(dir.path(), crate::log::LogConfig::default(), 0).unwrap();
        let p = following_with_three_records(log);
        let role = p.role();
        // the flusher syncs offsets 0..3 (on the other worker), then waits for the role lock
        // held here
        std::thread::sleep(Duration::from_millis(300));
        {
            let mut log = p.lock();
            log.truncate_to(0, 0).unwrap();
            p.after_cut(&log, false);
        }
        drop(role);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let q = p.progress();
        assert_eq!(q.log_end, 0, "{q:?}");
        assert!(
            q.durable_end <= q.log_end,
            "durable end {} published past the log end {}",
            q.durable_end,
            q.log_end
        );
    }

    /// Issue 14, defect 6: a new fetcher's first fetch offset was the log end even when the
    /// tail was not fsynced yet (an earlier role or fetcher appended it), so the leader
    /// counted unsynced records as this replica's. `wait_synced` makes the log durable to its
    /// end before returning; the fetcher calls it before every fetch.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_fetch_offset_waits_until_the_tail_is_fsynced() {
        let dir = tempfile::tempdir().unwrap();
        let config = flushed_by_the_os();
        let (log, _) = PartitionLog::open(dir.path(), config, 0).unwrap();
        let p = following_with_three_records(log);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let q = p.progress();
        assert_eq!(
            (q.durable_end, q.log_end),
            (0, 3),
            "the tail is not synced: {q:?}"
        );
        p.wait_synced().await.unwrap();
        let q = p.progress();
        assert_eq!(q.durable_end, q.log_end, "{q:?}");
    }

    /// Review finding: a reset left `durable_end` at the old log's durable end, below the
    /// new (empty) log's end, and nothing would sync again: the fetcher's `wait_synced`
    /// waited forever before its next fetch.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reset_log_is_durable_at_its_new_start() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = PartitionLog::open(dir.path(), crate::log::LogConfig::default(), 0).unwrap();
        let p = following_with_three_records(log);
        let at = Following {
            leader: 2,
            epoch: 1,
        };
        p.reset_to(at, 1_000, 0).unwrap();
        let synced = tokio::time::timeout(Duration::from_secs(5), p.wait_synced()).await;
        assert!(
            matches!(synced, Ok(Ok(()))),
            "the fetcher would wait forever: {:?}",
            p.progress()
        );
        assert_eq!(p.progress().durable_end, 1_000);
    }

    /// Issue 17, item 3: a partition whose fsync failed refused writes until the broker
    /// restarted. `restart` reopens it cut back to the last successful fsync (what came
    /// after may never have reached the disk), idle until given a role, then writable.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_partition_restarts_at_its_last_successful_fsync() {
        let dir = tempfile::tempdir().unwrap();
        let config = flushed_by_the_os();
        let (log, _) = PartitionLog::open(dir.path(), config, 0).unwrap();
        let p = Partition::start(Arc::from("t"), 0, log, 0);
        p.lead_alone(1);
        p.append(&records(3), 1, 0).unwrap();
        p.wait_synced().await.unwrap();
        // two more records reach the page cache; then a sync of them fails
        p.append(&records(2), 1, 0).unwrap();
        p.progress.send_modify(|q| q.failed = true);
        assert!(matches!(
            p.append(&records(1), 1, 0),
            Err(LeaderAppendError::Append(_))
        ));
        assert!(
            p.become_follower(2, 1).is_none(),
            "a failed partition took a role"
        );
        let end = tokio::task::spawn_blocking({
            let p = p.clone();
            move || p.restart(0)
        })
        .await
        .unwrap()
        .unwrap();
        let q = p.progress();
        assert_eq!(end, 3, "cut back to the last successful fsync");
        assert_eq!((q.log_end, q.durable_end, q.failed), (3, 3, false), "{q:?}");
        assert_eq!(q.leader_epoch, None, "idle until given a role again");
        assert!(matches!(
            p.append(&records(1), 1, 0),
            Err(LeaderAppendError::NotLeader)
        ));
        p.lead_alone(1);
        let (a, _) = p.append(&records(1), 1, 0).unwrap();
        assert_eq!(
            a.base_offset, 3,
            "the next write follows the restarted log's end"
        );
        p.wait_synced().await.unwrap();
        assert_eq!(p.progress().durable_end, 4);
    }
}
