//! The group coordinator for the groups of one `__consumer_offsets` partition this broker
//! leads: the group state machines, the pending JoinGroup / SyncGroup requests waiting for
//! their replies, the committed offsets, and the timer that fires the groups' timeouts.
//!
//! Durability goes through [`OffsetsLog`]: a commit is answered only once its records are
//! committed in the partition (acks=all), all partitions of one OffsetCommit in one append,
//! so a commit is never half-applied; a group's generation is written when it becomes
//! stable. A new coordinator rebuilds everything by replaying the partition
//! ([`Coordinator::load`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::oneshot;

use super::consumer::{
    self, ClassicJoin, ConsumerGroup, ConsumerGroupConfig, Heartbeat, HeartbeatReply,
};
use super::records::{CommittedOffset, PendingTxn, RecordKey, Replayed};
use super::state::{
    codes, Group, GroupConfig, GroupState, GroupView, Join, JoinReply, Replies, Reply, SyncReply,
};
use crate::broker::Clock;

/// Appends records (key, value; `None` = tombstone) to the coordinator's partition and
/// resolves once they are committed there.
#[tonic::async_trait]
pub trait OffsetsLog: Send + Sync + 'static {
    async fn append(&self, records: Vec<(Bytes, Option<Bytes>)>) -> Result<(), String>;

    /// Appends records as one transactional batch of `producer` (id, epoch), a
    /// TxnOffsetCommit; returns the offset of the first. A log that cannot hold
    /// transactions refuses.
    async fn append_txn(
        &self,
        _records: Vec<(Bytes, Option<Bytes>)>,
        _producer: (i64, i16),
    ) -> Result<u64, String> {
        Err("this offsets log takes no transactional commits".to_string())
    }

    /// Where the next record will go; `None` when the log cannot say (no snapshots then).
    fn end_offset(&self) -> Option<u64> {
        None
    }

    /// Deletes what lies wholly below `offset` (superseded by a snapshot).
    fn trim_before(&self, _offset: u64) {}
}

/// Records written since the last snapshot before one is taken (at least; also at least
/// twice the live state, so a snapshot never costs more than what it removes).
pub const SNAPSHOT_MIN_RECORDS: u64 = 50_000;
/// Records per batch in a snapshot.
const SNAPSHOT_BATCH: usize = 1_000;

/// One partition's commit in an OffsetCommit request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
}

#[derive(Default)]
struct Groups {
    groups: HashMap<String, Group>,
    /// member id -> the sender its pending JoinGroup / SyncGroup waits on.
    pending: HashMap<(String, String), oneshot::Sender<Reply>>,
    offsets: HashMap<String, BTreeMap<(String, i32), CommittedOffset>>,
    /// The last group record written (or replayed) for each group: what a snapshot keeps.
    persisted: HashMap<String, Bytes>,
    /// Offsets committed in open transactions, by producer id (see [`PendingTxn`]).
    txn_pending: HashMap<i64, PendingTxn>,
    /// Groups on KIP-848's consumer protocol, with the configs of their last heartbeat.
    consumer: HashMap<String, (ConsumerGroup, ConsumerGroupConfig)>,
    /// The last state record written (or replayed) of each consumer-protocol group.
    consumer_persisted: HashMap<String, Bytes>,
    /// Groups that moved between the protocols since their last consumer-protocol write:
    /// that write carries their classic record too (the classic group's state, or a
    /// tombstone), so replay never finds the group both ways.
    migrated: std::collections::HashSet<String>,
}

pub struct Coordinator {
    config: GroupConfig,
    clock: Arc<dyn Clock>,
    log: Arc<dyn OffsetsLog>,
    state: Mutex<Groups>,
    /// Set when the partition's leadership moved away: every request is refused with
    /// NOT_COORDINATOR so clients find the new coordinator.
    closed: AtomicBool,
    /// Writes hold it shared; a snapshot holds it alone, so no record lands between its
    /// batches (a commit written there would be overwritten by an older snapshot value).
    writes: tokio::sync::RwLock<()>,
    since_snapshot: AtomicU64,
    snapshot_min_records: AtomicU64,
    snapshotting: AtomicBool,
    /// Consumer-protocol groups' state records are written one at a time, each the state
    /// current when it is written, so the log's last record is always the newest state.
    consumer_writes: tokio::sync::Mutex<()>,
}

/// Kafka's NOT_COORDINATOR.
pub const NOT_COORDINATOR: i16 = 16;
/// Kafka's GROUP_ID_NOT_FOUND and NON_EMPTY_GROUP (DeleteGroups).
pub const GROUP_ID_NOT_FOUND: i16 = 69;
pub const NON_EMPTY_GROUP: i16 = 68;
/// Kafka's GROUP_SUBSCRIBED_TO_TOPIC (OffsetDelete of a topic the active group consumes).
pub const GROUP_SUBSCRIBED_TO_TOPIC: i16 = 86;

/// How long a JoinGroup or SyncGroup waits beyond the group's own timeouts.
const REPLY_MARGIN: Duration = Duration::from_secs(5);

impl Coordinator {
    pub fn new(config: GroupConfig, clock: Arc<dyn Clock>, log: Arc<dyn OffsetsLog>) -> Arc<Self> {
        Arc::new(Coordinator {
            config,
            clock,
            log,
            state: Mutex::new(Groups::default()),
            closed: AtomicBool::new(false),
            writes: tokio::sync::RwLock::new(()),
            since_snapshot: AtomicU64::new(0),
            snapshot_min_records: AtomicU64::new(SNAPSHOT_MIN_RECORDS),
            snapshotting: AtomicBool::new(false),
            consumer_writes: tokio::sync::Mutex::new(()),
        })
    }

    /// A coordinator taking over a partition: groups and offsets as the replay found them.
    pub fn load(
        config: GroupConfig,
        clock: Arc<dyn Clock>,
        log: Arc<dyn OffsetsLog>,
        replayed: Replayed,
    ) -> Arc<Self> {
        let now = clock.now_ms();
        let c = Coordinator::new(config, clock, log);
        {
            let mut s = c.lock();
            for (id, stored) in &replayed.groups {
                s.groups
                    .insert(id.clone(), Group::restore(id.clone(), config, stored, now));
            }
            s.offsets = replayed.offsets;
            s.txn_pending = replayed.pending;
            for (id, value) in replayed.consumer_groups {
                match ConsumerGroup::decode(&value, now) {
                    Ok(g) => {
                        s.consumer
                            .insert(id.clone(), (g, ConsumerGroupConfig::default()));
                        s.consumer_persisted.insert(id, value);
                    }
                    Err(e) => {
                        tracing::warn!(group = %id, error = %e, "skipping a consumer group record; its members will rejoin")
                    }
                }
            }
            s.persisted = replayed
                .groups
                .iter()
                .map(|(id, g)| (id.clone(), g.encode()))
                .collect();
        }
        c
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Groups> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Snapshots are taken once this many records were written since the last one (and at
    /// least twice the live state).
    pub fn set_snapshot_min_records(&self, n: u64) {
        self.snapshot_min_records.store(n, Ordering::Relaxed);
    }

    /// Appends records (durably) and then applies them to memory, both under the shared
    /// write lock.
    async fn write(
        &self,
        records: Vec<(Bytes, Option<Bytes>)>,
        apply: impl FnOnce(&mut Groups),
    ) -> Result<(), String> {
        let _shared = self.writes.read().await;
        let n = records.len() as u64;
        self.log.append(records).await?;
        apply(&mut self.lock());
        self.since_snapshot.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }

    /// Starts a snapshot when enough was written since the last one.
    fn maybe_snapshot(self: &Arc<Self>) {
        let written = self.since_snapshot.load(Ordering::Relaxed);
        if written < self.snapshot_min_records.load(Ordering::Relaxed) || self.is_closed() {
            return;
        }
        let live = {
            let s = self.lock();
            s.offsets.values().map(BTreeMap::len).sum::<usize>()
                + s.persisted.len()
                + s.consumer_persisted.len()
        } as u64;
        if written < 2 * live || self.snapshotting.swap(true, Ordering::AcqRel) {
            return;
        }
        let c = self.clone();
        tokio::spawn(async move {
            if let Err(e) = c.snapshot().await {
                tracing::warn!(error = %e, "offsets snapshot failed; will try again");
            }
            c.snapshotting.store(false, Ordering::Release);
        });
    }

    /// Writes the live state (every committed offset, every group's last record) after
    /// everything else, then deletes the log's segments wholly before it: the partition
    /// stays about as large as its state, and a new coordinator replays little. A crash
    /// midway leaves the old records in place; replay then reads both, to the same state.
    pub async fn snapshot(&self) -> Result<usize, String> {
        let _alone = self.writes.write().await;
        let Some(start) = self.log.end_offset() else {
            return Ok(0);
        };
        let records: Vec<(Bytes, Option<Bytes>)> = {
            let s = self.lock();
            let offsets = s.offsets.iter().flat_map(|(group, offsets)| {
                offsets.iter().map(move |((topic, partition), o)| {
                    let key = RecordKey::Offset {
                        group: group.clone(),
                        topic: topic.clone(),
                        partition: *partition,
                    };
                    (key.encode(), Some(o.encode()))
                })
            });
            let groups = s
                .persisted
                .iter()
                .map(|(id, v)| (RecordKey::Group(id.clone()).encode(), Some(v.clone())));
            let consumer = s.consumer_persisted.iter().map(|(id, v)| {
                (
                    RecordKey::ConsumerGroup(id.clone()).encode(),
                    Some(v.clone()),
                )
            });
            offsets.chain(groups).chain(consumer).collect()
        };
        for chunk in records.chunks(SNAPSHOT_BATCH) {
            self.log.append(chunk.to_vec()).await?;
        }
        // Offsets pending in open transactions are not in the snapshot: their records (and
        // everything after them) stay for a later coordinator's replay.
        let pending = self
            .lock()
            .txn_pending
            .values()
            .map(|p| p.first_offset.max(0) as u64)
            .min();
        self.log
            .trim_before(pending.map_or(start, |p| p.min(start)));
        self.since_snapshot.store(0, Ordering::Relaxed);
        tracing::info!(
            records = records.len(),
            from = start,
            "wrote an offsets snapshot and deleted what it supersedes"
        );
        Ok(records.len())
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The partition's leadership moved: pending requests are answered, groups are dropped
    /// (the new coordinator replays them), and every later request gets NOT_COORDINATOR.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let mut s = self.lock();
        let ids: Vec<String> = s.groups.keys().cloned().collect();
        for id in ids {
            let replies = s.groups.get_mut(&id).map(Group::kill).unwrap_or_default();
            let replies = replies
                .into_iter()
                .map(|(m, r)| (m, not_coordinator(r)))
                .collect();
            Self::deliver(&mut s, &id, replies, None);
        }
        s.groups.clear();
        s.pending.clear();
        s.offsets.clear();
        s.txn_pending.clear();
        s.consumer.clear();
        s.consumer_persisted.clear();
        s.migrated.clear();
    }

    /// Writes a group's state when it became empty, so a new coordinator does not bring
    /// back members that are gone.
    fn persist_if_emptied(self: &Arc<Self>, group: &str, was: GroupState, g: &Group) {
        if was == GroupState::Empty || g.state() != GroupState::Empty {
            return;
        }
        let record = (
            RecordKey::Group(group.to_string()).encode(),
            Some(g.stored(self.clock.now_ms()).encode()),
        );
        let (c, group) = (self.clone(), group.to_string());
        tokio::spawn(async move {
            let value = record.1.clone().unwrap_or_default();
            let id = group.clone();
            let written = c
                .write(vec![record], move |s| {
                    s.persisted.insert(id, value);
                })
                .await;
            if let Err(e) = written {
                tracing::warn!(group, error = %e, "could not persist the emptied group");
            }
        });
    }

    /// Hands replies to the members waiting for them; returns the one for `me`, if any.
    fn deliver(s: &mut Groups, group: &str, replies: Replies, me: Option<&str>) -> Option<Reply> {
        let mut mine = None;
        for (member, reply) in replies {
            if me == Some(member.as_str()) && mine.is_none() {
                mine = Some(reply);
                continue;
            }
            if let Some(tx) = s.pending.remove(&(group.to_string(), member)) {
                let _ = tx.send(reply);
            }
        }
        mine
    }

    async fn wait(rx: oneshot::Receiver<Reply>, timeout: Duration) -> Option<Reply> {
        tokio::time::timeout(timeout, rx)
            .await
            .ok()
            .and_then(Result::ok)
    }

    /// JoinGroup to a group that is not a consumer-protocol one with members (tests).
    pub async fn join(&self, group: &str, j: Join) -> JoinReply {
        self.join_with(
            group,
            j,
            &consumer::Topics::new(),
            ConsumerGroupConfig::default(),
        )
        .await
    }

    /// JoinGroup. `topics` and `config`: what a classic member of a consumer-protocol group
    /// may be assigned, and the group's configs (Kafka 4.0 lets classic members join one).
    pub async fn join_with(
        &self,
        group: &str,
        j: Join,
        topics: &consumer::Topics,
        config: ConsumerGroupConfig,
    ) -> JoinReply {
        if self.is_closed() {
            return JoinReply {
                error: NOT_COORDINATOR,
                ..join_failed(&j.member_id)
            };
        }
        let timeout = Duration::from_millis(j.rebalance_timeout_ms.max(0) as u64) + REPLY_MARGIN;
        let caller = j.member_id.clone();
        // an empty consumer group becomes a classic one, as Kafka converts it: its record
        // gets a tombstone first
        let converted = {
            let mut s = self.lock();
            s.consumer.get(group).is_some_and(|(g, _)| g.is_empty())
                && s.consumer.remove(group).is_some()
        };
        if converted {
            if let Err(e) = self.persist_consumer(group).await {
                tracing::warn!(group, error = %e, "the consumer group record of a group that became classic is not cleared yet; the next write will");
            }
        }
        let consumer_group = self
            .lock()
            .consumer
            .get(group)
            .is_some_and(|(g, _)| !g.is_empty());
        if consumer_group {
            // its members speak the consumer protocol (KIP-848): a classic consumer joins
            // them as a classic member
            return self.join_consumer_group(group, j, topics, config).await;
        }
        let rx = {
            let mut s = self.lock();
            if s.consumer.get(group).is_some_and(|(g, _)| !g.is_empty()) {
                // it became a consumer-protocol group just now: the client retries
                return join_failed(&j.member_id);
            }
            let config = self.config;
            let g = s
                .groups
                .entry(group.to_string())
                .or_insert_with(|| Group::new(group, config));
            let (taken, mut replies) = g.join_waiting(j, self.clock.now_ms());
            let mine = match &taken {
                // Taken in: its reply is the Join reply addressed to it, if there is one yet.
                Some(id) => replies
                    .iter()
                    .position(|(m, r)| m == id && matches!(r, Reply::Join(_))),
                // Refused: the refusal is the only Join reply.
                None => replies
                    .iter()
                    .position(|(_, r)| matches!(r, Reply::Join(_))),
            }
            .map(|i| replies.remove(i).1);
            Self::deliver(&mut s, group, replies, None);
            match (mine, taken) {
                (Some(Reply::Join(r)), _) => return r,
                (_, Some(id)) => {
                    let (tx, rx) = oneshot::channel();
                    s.pending.insert((group.to_string(), id), tx);
                    rx
                }
                _ => return join_failed(&caller),
            }
        };
        match Self::wait(rx, timeout).await {
            Some(Reply::Join(r)) => r,
            _ if self.is_closed() => JoinReply {
                error: NOT_COORDINATOR,
                ..join_failed(&caller)
            },
            _ => join_failed(&caller),
        }
    }

    /// A classic JoinGroup to a consumer-protocol group: the member is reconciled as a
    /// heartbeat would be and answered at once, as Kafka 4.0 does: generation = its epoch,
    /// no leader (it syncs as a follower and gets its partitions from SyncGroup).
    async fn join_consumer_group(
        &self,
        group: &str,
        j: Join,
        topics: &consumer::Topics,
        config: ConsumerGroupConfig,
    ) -> JoinReply {
        // as Kafka checks them first: the protocol type, and metadata that is a consumer
        // protocol subscription
        let readable = j
            .protocols
            .first()
            .is_some_and(|(_, md)| consumer::read_subscription(md).is_some());
        if j.protocol_type != "consumer" || !readable {
            return JoinReply {
                error: codes::INCONSISTENT_GROUP_PROTOCOL,
                ..join_failed(&j.member_id)
            };
        }
        let member_id = if j.member_id.is_empty() {
            let id = format!("{}-{}", j.client_id, uuid::Uuid::new_v4());
            if j.require_known_member_id {
                return JoinReply {
                    error: codes::MEMBER_ID_REQUIRED,
                    ..join_failed(&id)
                };
            }
            id
        } else {
            j.member_id.clone()
        };
        let join = ClassicJoin {
            member_id: member_id.clone(),
            instance_id: j.instance_id.clone(),
            client: consumer::Client {
                id: j.client_id.clone(),
                host: j.client_host.clone(),
            },
            session_timeout_ms: j.session_timeout_ms,
            rebalance_timeout_ms: j.rebalance_timeout_ms,
            protocols: j.protocols.clone(),
        };
        let joined = {
            let mut s = self.lock();
            let Some((g, c)) = s.consumer.get_mut(group) else {
                return join_failed(&member_id);
            };
            *c = config;
            g.classic_join(join, topics, config, self.clock.now_ms())
        };
        let (epoch, protocol) = match joined {
            Ok(joined) => joined,
            Err((error, why)) => {
                tracing::debug!(group, member = %member_id, error, why, "classic join to a consumer group refused");
                return JoinReply {
                    error,
                    ..join_failed(&member_id)
                };
            }
        };
        if let Err(e) = self.persist_consumer(group).await {
            tracing::warn!(group, error = %e, "consumer group state not durable");
            return JoinReply {
                error: codes::COORDINATOR_NOT_AVAILABLE,
                ..join_failed(&member_id)
            };
        }
        JoinReply {
            error: codes::NONE,
            generation: epoch,
            protocol_name: Some(protocol),
            leader: String::new(),
            member_id,
            members: Vec::new(),
            throttle_ms: 0,
        }
    }

    pub async fn sync(
        &self,
        group: &str,
        member: &str,
        generation: i32,
        assignments: Vec<(String, Bytes)>,
    ) -> SyncReply {
        if self.is_closed() {
            return sync_failed(NOT_COORDINATOR);
        }
        let (rx, persist) = {
            let mut s = self.lock();
            if let Some((g, _)) = s.consumer.get_mut(group) {
                // a classic member of a consumer-protocol group
                return match g.classic_sync(member, generation, self.clock.now_ms()) {
                    Ok((protocol, partitions)) => SyncReply {
                        error: codes::NONE,
                        protocol_name: Some(protocol),
                        assignment: strata_client::groups::encode_assignment(&partitions),
                    },
                    Err(code) => sync_failed(code),
                };
            }
            let Some(g) = s.groups.get_mut(group) else {
                return sync_failed(codes::UNKNOWN_MEMBER_ID);
            };
            let was_stable = g.state() == GroupState::Stable;
            let now = self.clock.now_ms();
            let replies = g.sync(member, generation, assignments, now);
            let persist = (!was_stable && g.state() == GroupState::Stable).then(|| {
                (
                    RecordKey::Group(group.to_string()).encode(),
                    g.stored(now).encode(),
                )
            });
            let mine = Self::deliver(&mut s, group, replies, Some(member));
            match mine {
                Some(Reply::Sync(r)) if persist.is_none() => return r,
                Some(Reply::Sync(r)) => (None, Some((persist.expect("checked"), r))),
                _ => {
                    let (tx, rx) = oneshot::channel();
                    s.pending
                        .insert((group.to_string(), member.to_string()), tx);
                    (Some(rx), None)
                }
            }
        };
        if let Some(((key, value), reply)) = persist {
            // The leader's sync made the group stable: its generation is written before the
            // leader is answered (the others were answered with their assignments already).
            let id = group.to_string();
            let kept = value.clone();
            let written = self
                .write(vec![(key, Some(value))], move |s| {
                    s.persisted.insert(id, kept);
                })
                .await;
            return match written {
                Ok(()) => reply,
                Err(e) => {
                    tracing::warn!(group, error = %e, "could not persist the group's generation");
                    sync_failed(codes::COORDINATOR_NOT_AVAILABLE)
                }
            };
        }
        match Self::wait(
            rx.expect("pending"),
            Duration::from_secs(300) + REPLY_MARGIN,
        )
        .await
        {
            Some(Reply::Sync(r)) => r,
            _ if self.is_closed() => sync_failed(NOT_COORDINATOR),
            _ => sync_failed(codes::REBALANCE_IN_PROGRESS),
        }
    }

    /// Whether a request from `member` naming static instance `instance` comes from a
    /// fenced, older incarnation of that instance.
    pub fn fenced(&self, group: &str, member: &str, instance: Option<&str>) -> bool {
        self.lock()
            .groups
            .get(group)
            .is_some_and(|g| g.is_fenced(member, instance))
    }

    pub fn heartbeat(&self, group: &str, member: &str, generation: i32) -> i16 {
        if self.is_closed() {
            return NOT_COORDINATOR;
        }
        let mut s = self.lock();
        if let Some((g, _)) = s.consumer.get_mut(group) {
            return g.classic_heartbeat(member, generation, self.clock.now_ms());
        }
        match s.groups.get_mut(group) {
            Some(g) => g.heartbeat(member, generation, self.clock.now_ms()),
            None => codes::UNKNOWN_MEMBER_ID,
        }
    }

    pub fn leave(self: &Arc<Self>, group: &str, member: &str, instance_id: Option<&str>) -> i16 {
        if self.is_closed() {
            return NOT_COORDINATOR;
        }
        let mut s = self.lock();
        if let Some((g, _)) = s.consumer.get_mut(group) {
            let code = g.classic_leave(member);
            if code == codes::NONE {
                self.maybe_downgrade(&mut s, group);
                let (c, group) = (self.clone(), group.to_string());
                tokio::spawn(async move {
                    if let Err(e) = c.persist_consumer(&group).await {
                        tracing::warn!(group, error = %e, "could not write the consumer group's state; the next change will");
                    }
                });
            }
            return code;
        }
        let Some(g) = s.groups.get_mut(group) else {
            return codes::UNKNOWN_MEMBER_ID;
        };
        let was = g.state();
        let (code, replies) = g.leave(member, instance_id, self.clock.now_ms());
        self.persist_if_emptied(group, was, g);
        Self::deliver(&mut s, group, replies, None);
        code
    }

    /// OffsetCommit: a member of the current generation (or anyone, with generation -1, for
    /// a group without members) commits offsets; answered once durable. Refused commits
    /// change nothing.
    pub async fn commit(
        &self,
        group: &str,
        member: &str,
        generation: i32,
        commits: Vec<Commit>,
    ) -> i16 {
        let error = self.may_commit(group, member, generation, &commits);
        if error != codes::NONE {
            return error;
        }
        if commits.is_empty() {
            return codes::NONE;
        }
        let records = offset_records(group, commits, self.clock.now_ms());
        let encoded = records
            .iter()
            .map(|(k, v)| (k.encode(), Some(v.encode())))
            .collect();
        let written = self
            .write(encoded, |s| {
                let offsets = s.offsets.entry(group.to_string()).or_default();
                for (k, v) in records {
                    if let RecordKey::Offset {
                        topic, partition, ..
                    } = k
                    {
                        offsets.insert((topic, partition), v);
                    }
                }
            })
            .await;
        if let Err(e) = written {
            tracing::warn!(group, error = %e, "offset commit not durable");
            return codes::COORDINATOR_NOT_AVAILABLE;
        }
        codes::NONE
    }

    /// TxnOffsetCommit: offsets committed in `producer`'s (id, epoch) open transaction,
    /// written as its transactional batch; they take effect with its commit marker
    /// ([`Coordinator::end_txn`]). A member and generation, when given (KIP-447), are
    /// checked as an OffsetCommit's.
    pub async fn txn_commit(
        &self,
        group: &str,
        producer: (i64, i16),
        member: &str,
        generation: i32,
        commits: Vec<Commit>,
    ) -> i16 {
        let error = if generation < 0 && member.is_empty() {
            // (v0-2 name no member: the transaction coordinator fenced zombies already)
            if self.is_closed() {
                NOT_COORDINATOR
            } else {
                codes::NONE
            }
        } else {
            self.may_commit(group, member, generation, &commits)
        };
        if error != codes::NONE || commits.is_empty() {
            return error;
        }
        let records = offset_records(group, commits, self.clock.now_ms());
        let encoded: Vec<_> = records
            .iter()
            .map(|(k, v)| (k.encode(), Some(v.encode())))
            .collect();
        let n = encoded.len() as u64;
        let _shared = self.writes.read().await;
        let first = match self.log.append_txn(encoded, producer).await {
            Ok(first) => first,
            Err(e) => {
                tracing::warn!(group, producer_id = producer.0, error = %e, "transactional offset commit not durable");
                return codes::COORDINATOR_NOT_AVAILABLE;
            }
        };
        let mut s = self.lock();
        let pending = s
            .txn_pending
            .entry(producer.0)
            .or_insert_with(|| PendingTxn {
                first_offset: first as i64,
                ..PendingTxn::default()
            });
        for (k, v) in records {
            if let RecordKey::Offset {
                group,
                topic,
                partition,
            } = k
            {
                pending.offsets.insert((group, topic, partition), v);
            }
        }
        drop(s);
        self.since_snapshot.fetch_add(n, Ordering::Relaxed);
        codes::NONE
    }

    /// `producer_id`'s transaction marker was written to this partition: its pending
    /// offsets become committed offsets, or are dropped.
    pub fn end_txn(&self, producer_id: i64, commit: bool) {
        let mut s = self.lock();
        if let Some(p) = s.txn_pending.remove(&producer_id) {
            if commit {
                p.commit_into(&mut s.offsets);
            }
        }
    }

    /// Whether an open transaction holds an offset of `group` for the partition (an
    /// OffsetFetch with `require_stable` is answered UNSTABLE_OFFSET_COMMIT).
    pub fn unstable(&self, group: &str, topic: &str, partition: i32) -> bool {
        self.lock()
            .txn_pending
            .values()
            .any(|p| p.holds(group, topic, partition))
    }

    /// Whether `member` of `generation` may commit `commits` now (NONE) or Kafka's error.
    fn may_commit(&self, group: &str, member: &str, generation: i32, commits: &[Commit]) -> i16 {
        if self.is_closed() {
            return NOT_COORDINATOR;
        }
        let s = self.lock();
        if let Some((g, _)) = s.consumer.get(group) {
            // an admin's commit (no member) to a group whose members all left
            if g.is_empty() && generation < 0 {
                return codes::NONE;
            }
            // KIP-848: the generation is the member's epoch
            return g.may_commit(member, generation).unwrap_or(codes::NONE);
        }
        match s.groups.get(group) {
            Some(g) if g.state() == GroupState::Dead => NOT_COORDINATOR,
            Some(g) if g.state() != GroupState::Empty || generation >= 0 => {
                let owned = || {
                    let partitions: Vec<(String, i32)> = commits
                        .iter()
                        .map(|c| (c.topic.clone(), c.partition))
                        .collect();
                    g.may_commit(member, &partitions)
                };
                if !g.member_ids().iter().any(|m| m == member) {
                    codes::UNKNOWN_MEMBER_ID
                } else if generation != g.generation() {
                    codes::ILLEGAL_GENERATION
                } else if g.state() == GroupState::CompletingRebalance {
                    codes::REBALANCE_IN_PROGRESS
                } else if owned() == Some(false) {
                    // A member committing partitions it was not given is a zombie of
                    // an older assignment: refused like a stale generation.
                    codes::ILLEGAL_GENERATION
                } else {
                    // Stable, or PreparingRebalance: members commit what they consumed
                    // before they rejoin, as with Kafka.
                    codes::NONE
                }
            }
            None if generation >= 0 => codes::ILLEGAL_GENERATION,
            _ => codes::NONE,
        }
    }

    /// OffsetFetch: the committed offset of each partition (`None`: nothing committed).
    pub fn fetch(&self, group: &str, partitions: &[(String, i32)]) -> Vec<Option<CommittedOffset>> {
        let s = self.lock();
        let offsets = s.offsets.get(group);
        partitions
            .iter()
            .map(|p| offsets.and_then(|o| o.get(p)).cloned())
            .collect()
    }

    /// Every committed offset of a group (for lag and the operator view).
    pub fn committed(&self, group: &str) -> BTreeMap<(String, i32), CommittedOffset> {
        self.lock().offsets.get(group).cloned().unwrap_or_default()
    }

    /// Groups known here (with members or committed offsets): (id, protocol type, state).
    pub fn list(&self) -> Vec<(String, String, GroupState)> {
        let s = self.lock();
        let mut out: BTreeMap<String, (String, GroupState)> = s
            .offsets
            .keys()
            .map(|g| (g.clone(), (String::new(), GroupState::Empty)))
            .collect();
        for (id, g) in &s.groups {
            let v = g.view();
            out.insert(id.clone(), (v.protocol_type, v.state));
        }
        out.into_iter().map(|(id, (t, st))| (id, t, st)).collect()
    }

    /// The groups on the consumer protocol (KIP-848): (id, state). A group whose members
    /// all left stays one (Empty) while it has committed offsets, as in Kafka.
    pub fn list_consumer_groups(&self) -> Vec<(String, &'static str)> {
        self.lock()
            .consumer
            .iter()
            .map(|(id, (g, _))| (id.clone(), g.state()))
            .collect()
    }

    /// A consumer-protocol group's view (Empty when its members left).
    pub fn describe_consumer_group(&self, group: &str) -> Option<consumer::ConsumerGroupView> {
        self.lock().consumer.get(group).map(|(g, _)| g.view())
    }

    /// ConsumerGroupHeartbeat (KIP-848). `topics`: the topics the member may be given.
    /// Answered once the change it made to the group (if any) is durable.
    pub async fn consumer_heartbeat(
        &self,
        group: &str,
        hb: Heartbeat,
        client: &consumer::Client,
        topics: &consumer::Topics,
        config: ConsumerGroupConfig,
    ) -> HeartbeatReply {
        let refused = |code: i16, message: String| HeartbeatReply {
            error: code,
            message: Some(message),
            member_id: hb.member_id.clone(),
            member_epoch: hb.member_epoch,
            heartbeat_interval_ms: 0,
            assignment: None,
        };
        if self.is_closed() {
            return refused(NOT_COORDINATOR, "the coordinator moved".into());
        }
        let reply = {
            let mut s = self.lock();
            let now = self.clock.now_ms();
            if let Some(g) = s
                .groups
                .get(group)
                .filter(|g| g.state() != GroupState::Empty)
            {
                let why = if hb.member_epoch != 0 {
                    Some(format!("member {} is not in group {group}", hb.member_id))
                } else if !g.uses_consumer_protocol() {
                    Some(format!(
                        "group {group} is a classic group of another protocol type"
                    ))
                } else if !self.config.migration.upgrades() {
                    Some(format!("group {group} is a classic group with members, and groups.consumer_migration_policy does not upgrade them"))
                } else if g.member_ids().len() >= config.max_size {
                    return refused(
                        codes::GROUP_MAX_SIZE_REACHED,
                        format!("group {group} has {} members already", config.max_size),
                    );
                } else {
                    None
                };
                if let Some(why) = why {
                    return refused(GROUP_ID_NOT_FOUND, why);
                }
                self.upgrade(&mut s, group, topics, config, now);
            }
            let entry = s
                .consumer
                .entry(group.to_string())
                .or_insert_with(|| (ConsumerGroup::new(group), config));
            entry.1 = config;
            let r = entry.0.heartbeat(hb.clone(), client, topics, config, now);
            if entry.0.is_empty() && !s.offsets.contains_key(group) {
                // nothing to remember it by: gone (one with offsets stays, listed Empty)
                s.consumer.remove(group);
            }
            self.maybe_downgrade(&mut s, group);
            r
        };
        if let Err(e) = self.persist_consumer(group).await {
            tracing::warn!(group, error = %e, "consumer group state not durable");
            return refused(
                codes::COORDINATOR_NOT_AVAILABLE,
                "the group's state could not be written; retry".into(),
            );
        }
        reply
    }

    /// Writes a consumer-protocol group's current state (a tombstone once it is gone:
    /// deleted, converted to classic, or empty with no offsets) if it differs from the last
    /// one written.
    async fn persist_consumer(&self, group: &str) -> Result<(), String> {
        // most heartbeats change nothing: answered without waiting for other groups' writes
        if self.consumer_durable(group) {
            return Ok(());
        }
        let _one_at_a_time = self.consumer_writes.lock().await;
        let (value, classic) = {
            let mut s = self.lock();
            let now = s.consumer.get(group).map(|(g, _)| g.encode());
            let migrated = s.migrated.remove(group);
            if now.as_ref() == s.consumer_persisted.get(group) && !migrated {
                return Ok(());
            }
            // the classic side of a migration: the classic group's state, or a tombstone
            let classic = migrated.then(|| {
                s.groups
                    .get(group)
                    .map(|g| g.stored(self.clock.now_ms()).encode())
            });
            (now, classic)
        };
        let mut records = vec![(
            RecordKey::ConsumerGroup(group.to_string()).encode(),
            value.clone(),
        )];
        if let Some(c) = &classic {
            records.push((RecordKey::Group(group.to_string()).encode(), c.clone()));
        }
        let id = group.to_string();
        let written_classic = classic.clone();
        let written = self
            .write(records, move |s| {
                match value {
                    Some(v) => s.consumer_persisted.insert(id.clone(), v),
                    None => s.consumer_persisted.remove(&id),
                };
                match written_classic {
                    Some(Some(v)) => {
                        s.persisted.insert(id, v);
                    }
                    Some(None) => {
                        s.persisted.remove(&id);
                    }
                    None => {}
                }
            })
            .await;
        if written.is_err() && classic.is_some() {
            // the next write carries it
            self.lock().migrated.insert(group.to_string());
        }
        written
    }

    /// The online upgrade: a consumer-protocol member joins classic group `group` with
    /// members. The classic members are taken over with what they own; their pending
    /// JoinGroup / SyncGroup are answered REBALANCE_IN_PROGRESS (they rejoin as classic
    /// members of the consumer group).
    fn upgrade(
        &self,
        s: &mut Groups,
        group: &str,
        topics: &consumer::Topics,
        config: ConsumerGroupConfig,
        now: i64,
    ) {
        let Some(mut classic) = s.groups.remove(group) else {
            return;
        };
        let members = classic.upgrade_members();
        let n = members.len();
        let g = ConsumerGroup::from_classic(group, classic.generation(), members, topics, now);
        let replies = classic
            .kill()
            .into_iter()
            .map(|(m, r)| (m, with_error(r, codes::REBALANCE_IN_PROGRESS)))
            .collect();
        Self::deliver(s, group, replies, None);
        s.consumer.insert(group.to_string(), (g, config));
        s.migrated.insert(group.to_string());
        tracing::info!(
            group,
            members = n,
            "classic group upgraded to the consumer protocol: a consumer-protocol member joined"
        );
    }

    /// The online downgrade: when only classic members are left in consumer-protocol group
    /// `group` (and the policy allows it), it becomes a classic group at a generation equal
    /// to its epoch, each member given its target assignment, and rebalances at once.
    fn maybe_downgrade(&self, s: &mut Groups, group: &str) {
        if !self.config.migration.downgrades()
            || !s.consumer.get(group).is_some_and(|(g, _)| g.only_classic())
        {
            return;
        }
        let Some((g, _)) = s.consumer.remove(group) else {
            return;
        };
        let now = self.clock.now_ms();
        let mut classic = Group::restore(group, self.config, &g.to_classic(now), now);
        let replies = classic.rebalance(now);
        Self::deliver(s, group, replies, None);
        s.groups.insert(group.to_string(), classic);
        s.migrated.insert(group.to_string());
        tracing::info!(
            group,
            members = g.member_ids().len(),
            "consumer group downgraded to the classic protocol: its last consumer-protocol member left"
        );
    }

    /// Whether a consumer-protocol group's state is the one last written.
    fn consumer_durable(&self, group: &str) -> bool {
        let s = self.lock();
        !s.migrated.contains(group)
            && s.consumer.get(group).map(|(g, _)| g.encode()).as_ref()
                == s.consumer_persisted.get(group)
    }

    /// DescribeGroups: `None` for a group this coordinator does not know (Kafka answers
    /// it as Dead with no members).
    pub fn describe(&self, group: &str) -> Option<GroupView> {
        let s = self.lock();
        if s.consumer.contains_key(group) {
            return None;
        }
        match s.groups.get(group) {
            Some(g) => Some(g.view()),
            None if s.offsets.contains_key(group) => Some(Group::new(group, self.config).view()),
            None => None,
        }
    }

    /// DeleteGroups for one group: only an empty group is deleted; its tombstone is durable
    /// before the answer.
    pub async fn delete(&self, group: &str) -> i16 {
        if self.is_closed() {
            return NOT_COORDINATOR;
        }
        {
            let s = self.lock();
            let known = s.offsets.contains_key(group)
                || s.groups.contains_key(group)
                || s.consumer.contains_key(group);
            if s.consumer.get(group).is_some_and(|(g, _)| !g.is_empty()) {
                return NON_EMPTY_GROUP;
            }
            match s.groups.get(group) {
                _ if !known => return GROUP_ID_NOT_FOUND,
                Some(g) if g.state() != GroupState::Empty => return NON_EMPTY_GROUP,
                _ => {}
            }
        }
        let mut tombstones = vec![(RecordKey::Group(group.to_string()).encode(), None)];
        if self.lock().consumer_persisted.contains_key(group) {
            tombstones.push((RecordKey::ConsumerGroup(group.to_string()).encode(), None));
        }
        let written = self
            .write(tombstones, |s| {
                if s.consumer.get(group).is_some_and(|(g, _)| g.is_empty()) {
                    s.consumer.remove(group);
                    s.consumer_persisted.remove(group);
                }
                // A member that joined while the tombstone was written keeps the group
                // alive (its offsets are gone, as they would be had it joined just after).
                if s.groups
                    .get(group)
                    .is_none_or(|g| g.state() == GroupState::Empty)
                {
                    s.groups.remove(group);
                }
                s.offsets.remove(group);
                s.persisted.remove(group);
            })
            .await;
        if let Err(e) = written {
            tracing::warn!(group, error = %e, "group deletion not durable");
            return codes::COORDINATOR_NOT_AVAILABLE;
        }
        codes::NONE
    }

    /// OffsetDelete (KIP-496): removes the group's committed offsets of these partitions,
    /// durably before the answer, except where the group is active and subscribed to the
    /// partition's topic (GROUP_SUBSCRIBED_TO_TOPIC for that partition). A partition with
    /// nothing committed is answered without error. `Err`: the request's error (an unknown
    /// group, or an active group that does not use the consumer protocol).
    pub async fn delete_offsets(
        &self,
        group: &str,
        partitions: Vec<(String, i32)>,
    ) -> Result<Vec<((String, i32), i16)>, i16> {
        if self.is_closed() {
            return Err(NOT_COORDINATOR);
        }
        let (answers, doomed) = {
            let s = self.lock();
            if !s.offsets.contains_key(group)
                && !s.groups.contains_key(group)
                && !s.consumer.contains_key(group)
            {
                return Err(GROUP_ID_NOT_FOUND);
            }
            let in_use = match s.groups.get(group) {
                _ if s.consumer.get(group).is_some_and(|(g, _)| !g.is_empty()) => {
                    s.consumer[group].0.subscribed_topics()
                }
                Some(g) if g.state() == GroupState::Dead => return Err(GROUP_ID_NOT_FOUND),
                Some(g) if g.state() != GroupState::Empty => match g.subscribed_topics() {
                    Some(topics) => topics,
                    None => return Err(NON_EMPTY_GROUP),
                },
                _ => Default::default(),
            };
            let held = s.offsets.get(group);
            let mut answers = Vec::with_capacity(partitions.len());
            let mut doomed = Vec::new();
            for p in partitions {
                if in_use.contains(&p.0) {
                    answers.push((p, GROUP_SUBSCRIBED_TO_TOPIC));
                    continue;
                }
                if held.is_some_and(|o| o.contains_key(&p)) && !doomed.contains(&p) {
                    doomed.push(p.clone());
                }
                answers.push((p, codes::NONE));
            }
            (answers, doomed)
        };
        if doomed.is_empty() {
            return Ok(answers);
        }
        let tombstones = doomed
            .iter()
            .map(|(topic, partition)| {
                let key = RecordKey::Offset {
                    group: group.to_string(),
                    topic: topic.clone(),
                    partition: *partition,
                };
                (key.encode(), None)
            })
            .collect();
        let written = self
            .write(tombstones, |s| {
                if let Some(offsets) = s.offsets.get_mut(group) {
                    for p in &doomed {
                        offsets.remove(p);
                    }
                    if offsets.is_empty() && !s.groups.contains_key(group) {
                        s.offsets.remove(group);
                    }
                }
            })
            .await;
        if let Err(e) = written {
            tracing::warn!(group, error = %e, "offset deletion not durable");
            return Err(codes::COORDINATOR_NOT_AVAILABLE);
        }
        Ok(answers)
    }

    pub fn group_state(&self, group: &str) -> Option<(GroupState, i32, Vec<String>)> {
        let s = self.lock();
        s.groups
            .get(group)
            .map(|g| (g.state(), g.generation(), g.member_ids()))
    }

    /// Fires every group's timeouts that are due; run it every `every` until the
    /// coordinator is dropped.
    pub fn spawn_timer(self: &Arc<Self>, every: Duration) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                let Some(c) = weak.upgrade() else { return };
                c.tick();
            }
        });
    }

    pub fn tick(self: &Arc<Self>) {
        self.maybe_snapshot();
        let now = self.clock.now_ms();
        let mut s = self.lock();
        let due: Vec<String> = s
            .groups
            .iter()
            .filter(|(_, g)| g.next_deadline().is_some_and(|d| d <= now))
            .map(|(id, _)| id.clone())
            .collect();
        let mut changed = Vec::new();
        let Groups {
            consumer, offsets, ..
        } = &mut *s;
        consumer.retain(|id, (g, config)| {
            for member in g.tick(*config, now) {
                tracing::info!(group = %id, member, "consumer group member removed: no heartbeat within its session, or partitions not given up within its rebalance timeout");
                changed.push(id.clone());
            }
            let keep = !g.is_empty() || offsets.contains_key(id);
            if !keep {
                // no members and no offsets left (deleted): its record gets a tombstone
                changed.push(id.clone());
            }
            keep
        });
        changed.dedup();
        for id in &changed {
            self.maybe_downgrade(&mut s, id);
        }
        for id in changed {
            let c = self.clone();
            tokio::spawn(async move {
                if let Err(e) = c.persist_consumer(&id).await {
                    tracing::warn!(group = %id, error = %e, "could not write the consumer group's state; the next change will");
                }
            });
        }
        for id in due {
            let replies = match s.groups.get_mut(&id) {
                Some(g) => {
                    let was = g.state();
                    let replies = g.tick(now);
                    self.persist_if_emptied(&id, was, g);
                    replies
                }
                None => continue,
            };
            Self::deliver(&mut s, &id, replies, None);
        }
    }
}

/// The offset records of `commits` by `group`, committed at `now`.
fn offset_records(
    group: &str,
    commits: Vec<Commit>,
    now: i64,
) -> Vec<(RecordKey, CommittedOffset)> {
    commits
        .into_iter()
        .map(|c| {
            (
                RecordKey::Offset {
                    group: group.to_string(),
                    topic: c.topic,
                    partition: c.partition,
                },
                CommittedOffset {
                    offset: c.offset,
                    leader_epoch: c.leader_epoch,
                    metadata: c.metadata,
                    commit_timestamp: now,
                },
            )
        })
        .collect()
}

fn join_failed(member: &str) -> JoinReply {
    JoinReply {
        error: codes::REBALANCE_IN_PROGRESS,
        generation: -1,
        protocol_name: None,
        leader: String::new(),
        member_id: member.to_string(),
        members: Vec::new(),
        throttle_ms: 0,
    }
}

/// A pending request's reply, turned into NOT_COORDINATOR (the coordinator moved).
fn not_coordinator(reply: Reply) -> Reply {
    match reply {
        Reply::Join(r) => Reply::Join(JoinReply {
            error: NOT_COORDINATOR,
            ..r
        }),
        Reply::Sync(r) => Reply::Sync(SyncReply {
            error: NOT_COORDINATOR,
            ..r
        }),
    }
}

/// A pending request's reply, turned into `error`.
fn with_error(reply: Reply, error: i16) -> Reply {
    match reply {
        Reply::Join(r) => Reply::Join(JoinReply { error, ..r }),
        Reply::Sync(r) => Reply::Sync(SyncReply { error, ..r }),
    }
}

fn sync_failed(error: i16) -> SyncReply {
    SyncReply {
        error,
        protocol_name: None,
        assignment: Bytes::new(),
    }
}

#[cfg(test)]
mod tests;
