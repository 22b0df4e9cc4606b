//! Which groups this broker coordinates: one [`Coordinator`] per `__consumer_offsets`
//! partition it leads, built by replaying the partition when the leadership arrives and
//! closed when it leaves. The internal topic is created on the first FindCoordinator, as
//! Kafka does.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use strata_core::batch::build::{self, ProducerIds, Rec};
use strata_core::batch::BatchIter;
use uuid::Uuid;

use super::coordinator::{Coordinator, OffsetsLog, NOT_COORDINATOR};
use super::records::{partition_for_group, Replayed};
use super::state::{codes, GroupConfig};
use crate::broker::partition::LeaderAppendError;
use crate::broker::{AdminError, Broker, Clock, NewTopic, Partition};

pub const OFFSETS_TOPIC: &str = "__consumer_offsets";
/// The longest a FindCoordinator waits for the offsets topic to be created or a new
/// coordinator to load. A Kafka connection answers in request order, so a slow
/// FindCoordinator would hold up the fetches behind it; clients retry
/// COORDINATOR_NOT_AVAILABLE.
const FIND_WAIT: Duration = Duration::from_millis(500);
/// Kafka's COORDINATOR_LOAD_IN_PROGRESS.
pub const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
/// Kafka's INVALID_GROUP_ID: empty, too long, or a control character.
pub const INVALID_GROUP_ID: i16 = 24;

/// Topics clients may not write to or delete.
pub fn is_internal(topic: &str) -> bool {
    topic == OFFSETS_TOPIC || topic == crate::txn::TXN_TOPIC
}

/// Group coordination settings (`[groups]` in the server config).
#[derive(Debug, Clone)]
pub struct GroupsConfig {
    pub group: GroupConfig,
    /// Partitions of `__consumer_offsets` (Kafka's `offsets.topic.num.partitions`).
    pub offsets_partitions: u32,
    /// Its replication factor, capped by the brokers registered when it is created.
    pub offsets_replication_factor: u16,
    /// How long an offset commit may wait to be replicated.
    pub commit_timeout: Duration,
    /// How often group timeouts are checked.
    pub tick: Duration,
    /// An offsets partition is snapshotted (its live state rewritten, the superseded
    /// segments deleted) after this many records, or twice its live state if larger.
    pub offsets_snapshot_records: u64,
    /// `segment.bytes` of `__consumer_offsets`: snapshots delete whole segments only.
    pub offsets_segment_bytes: u64,
}

impl Default for GroupsConfig {
    fn default() -> Self {
        GroupsConfig {
            group: GroupConfig::default(),
            offsets_partitions: 50,
            offsets_replication_factor: 3,
            commit_timeout: Duration::from_secs(5),
            tick: Duration::from_millis(100),
            offsets_snapshot_records: super::coordinator::SNAPSHOT_MIN_RECORDS,
            offsets_segment_bytes: 16 << 20,
        }
    }
}

/// A coordinator slot: one led `__consumer_offsets` partition.
struct Slot {
    topic_id: Uuid,
    epoch: i32,
    partition: Arc<Partition>,
    /// `None` while the partition is being replayed.
    coordinator: Option<Arc<Coordinator>>,
}

impl Slot {
    fn same(&self, topic_id: Uuid, epoch: i32, partition: &Arc<Partition>) -> bool {
        self.topic_id == topic_id && self.epoch == epoch && Arc::ptr_eq(&self.partition, partition)
    }
}

pub struct GroupManager {
    broker: Weak<Broker>,
    clock: Arc<dyn Clock>,
    config: GroupsConfig,
    slots: Mutex<HashMap<u32, Slot>>,
    /// Set while the internal topic is being created (in the background).
    creating: std::sync::atomic::AtomicBool,
    /// Bumped each time a coordinator finished loading.
    loaded: tokio::sync::watch::Sender<u64>,
}

impl GroupManager {
    /// Starts following the broker's leaderships of `__consumer_offsets`.
    pub fn start(broker: &Arc<Broker>, clock: Arc<dyn Clock>, config: GroupsConfig) -> Arc<Self> {
        let manager = Arc::new(GroupManager {
            broker: Arc::downgrade(broker),
            clock,
            config,
            slots: Mutex::new(HashMap::new()),
            creating: std::sync::atomic::AtomicBool::new(false),
            loaded: tokio::sync::watch::channel(0).0,
        });
        let weak = Arc::downgrade(&manager);
        let mut changes = broker.watch_layout();
        tokio::spawn(async move {
            loop {
                match weak.upgrade() {
                    Some(m) => m.refresh(),
                    None => return,
                }
                if changes.changed().await.is_err() {
                    return;
                }
            }
        });
        manager
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Slot>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Loads coordinators for partitions this broker now leads and closes those it lost.
    fn refresh(self: &Arc<Self>) {
        let Some(broker) = self.broker.upgrade() else {
            return;
        };
        let mut led = HashMap::new();
        if let Some(topic) = broker.topic(OFFSETS_TOPIC) {
            for p in topic.local() {
                if let Some(epoch) = p.progress().leader_epoch {
                    led.insert(p.index as u32, (topic.spec.id, epoch, p.clone()));
                }
            }
        }
        let mut slots = self.slots();
        slots.retain(|index, slot| {
            let keep = led
                .get(index)
                .is_some_and(|(id, epoch, p)| slot.same(*id, *epoch, p));
            if !keep {
                if let Some(c) = &slot.coordinator {
                    c.close();
                }
                tracing::info!(
                    partition = index,
                    "no longer coordinating the groups of this offsets partition"
                );
            }
            keep
        });
        for (index, (topic_id, epoch, partition)) in led {
            if slots.contains_key(&index) {
                continue;
            }
            slots.insert(
                index,
                Slot {
                    topic_id,
                    epoch,
                    partition: partition.clone(),
                    coordinator: None,
                },
            );
            let manager = self.clone();
            tokio::spawn(async move {
                manager.load(index, topic_id, epoch, partition).await;
            });
        }
    }

    /// Replays a partition this broker just became leader of and installs its coordinator.
    async fn load(
        self: Arc<Self>,
        index: u32,
        topic_id: Uuid,
        epoch: i32,
        partition: Arc<Partition>,
    ) {
        let started = std::time::Instant::now();
        let mut backoff = Duration::from_millis(100);
        let (replayed, records) = loop {
            match replay(&partition).await {
                Ok(r) => break r,
                Err(e) => {
                    tracing::error!(partition = index, error = %e, "could not replay the offsets partition; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    let still = self
                        .slots()
                        .get(&index)
                        .is_some_and(|s| s.same(topic_id, epoch, &partition));
                    if !still {
                        return;
                    }
                }
            }
        };
        if !replayed.damaged.is_empty() {
            tracing::error!(partition = index, damaged = replayed.damaged.len(), first = ?replayed.damaged.first(), "skipped unreadable records in the offsets partition");
        }
        let (groups, offsets) = (replayed.groups.len(), replayed.offsets.len());
        let log = Arc::new(PartitionOffsets {
            partition: partition.clone(),
            epoch,
            clock: self.clock.clone(),
            timeout: self.config.commit_timeout,
        });
        let coordinator = Coordinator::load(self.config.group, self.clock.clone(), log, replayed);
        coordinator.set_snapshot_min_records(self.config.offsets_snapshot_records);
        let mut slots = self.slots();
        match slots.get_mut(&index) {
            Some(slot) if slot.same(topic_id, epoch, &partition) => {
                coordinator.spawn_timer(self.config.tick);
                slot.coordinator = Some(coordinator);
                drop(slots);
                self.loaded.send_modify(|v| *v += 1);
                if records > 0 {
                    tracing::info!(partition = index, epoch, records, groups, groups_with_offsets = offsets, took = ?started.elapsed(), "coordinating the groups of this offsets partition");
                } else {
                    tracing::debug!(
                        partition = index,
                        epoch,
                        "coordinating the groups of this (empty) offsets partition"
                    );
                }
            }
            // The leadership moved on while replaying.
            _ => coordinator.close(),
        }
    }

    /// The coordinator of `group` if this broker is it; otherwise Kafka's error:
    /// NOT_COORDINATOR, or COORDINATOR_LOAD_IN_PROGRESS while the partition is replayed.
    pub fn coordinator(&self, group: &str) -> Result<Arc<Coordinator>, i16> {
        if super::invalid_group_id(group).is_some() {
            return Err(INVALID_GROUP_ID);
        }
        let broker = self.broker.upgrade().ok_or(NOT_COORDINATOR)?;
        let topic = broker.topic(OFFSETS_TOPIC).ok_or(NOT_COORDINATOR)?;
        let index = partition_for_group(group, topic.spec.partitions);
        match self.slots().get(&index) {
            Some(Slot {
                coordinator: Some(c),
                ..
            }) => Ok(c.clone()),
            Some(_) => Err(COORDINATOR_LOAD_IN_PROGRESS),
            // Elected here but the role is not applied yet: the same broker will answer soon.
            None if topic.layout.get(index as usize).and_then(|l| l.leader)
                == Some(broker.config().node_id) =>
            {
                Err(COORDINATOR_LOAD_IN_PROGRESS)
            }
            None => Err(NOT_COORDINATOR),
        }
    }

    /// Every coordinator running here.
    pub fn coordinators(&self) -> Vec<Arc<Coordinator>> {
        self.slots()
            .values()
            .filter_map(|s| s.coordinator.clone())
            .collect()
    }

    /// FindCoordinator: the broker that coordinates `group`, creating `__consumer_offsets`
    /// first if it does not exist. Err: COORDINATOR_NOT_AVAILABLE (retriable).
    /// Answers within `FIND_WAIT`, even when the controllers are unreachable.
    pub async fn find(self: &Arc<Self>, group: &str) -> Result<i32, i16> {
        let broker = self
            .broker
            .upgrade()
            .ok_or(codes::COORDINATOR_NOT_AVAILABLE)?;
        if broker.topic(OFFSETS_TOPIC).is_none() {
            use std::sync::atomic::Ordering;
            if self.creating.swap(true, Ordering::AcqRel) {
                // Another request is creating it: the client retries.
                return Err(codes::COORDINATOR_NOT_AVAILABLE);
            }
            let (manager, b) = (self.clone(), broker.clone());
            tokio::spawn(async move {
                let _ = manager.create_offsets_topic(&b).await;
                manager.creating.store(false, Ordering::Release);
            });
        }
        // A new topic's leaders are elected (and loaded) in a moment: wait briefly rather
        // than send the client into its retry backoff.
        let deadline = tokio::time::Instant::now() + FIND_WAIT;
        let mut changes = broker.watch_layout();
        let mut loaded = self.loaded.subscribe();
        loop {
            if let Some(topic) = broker.topic(OFFSETS_TOPIC) {
                let index = partition_for_group(group, topic.spec.partitions);
                let leader = topic.layout.get(index as usize).and_then(|l| l.leader);
                // When this broker coordinates, it answers once the partition is loaded,
                // so the client's next request does not meet COORDINATOR_LOAD_IN_PROGRESS.
                let ready =
                    leader != Some(broker.config().node_id) || self.coordinator(group).is_ok();
                if let (Some(leader), true) = (leader, ready) {
                    return Ok(leader);
                }
            }
            let changed = async {
                tokio::select! {
                    _ = changes.changed() => {}
                    _ = loaded.changed() => {}
                }
            };
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Err(codes::COORDINATOR_NOT_AVAILABLE);
            }
        }
    }

    async fn create_offsets_topic(&self, broker: &Arc<Broker>) -> Result<(), i16> {
        if broker.topic(OFFSETS_TOPIC).is_some() {
            return Ok(());
        }
        let registered = broker
            .cluster()
            .map_or(1, |link| link.metadata().borrow().brokers.len());
        let rf = self
            .config
            .offsets_replication_factor
            .min(u16::try_from(registered).unwrap_or(u16::MAX))
            .max(1);
        let configs = BTreeMap::from([
            // Never expired by time or size: the coordinators' snapshots delete what is
            // superseded (see docs/consumer-groups.md).
            ("retention.ms".to_string(), "-1".to_string()),
            ("retention.bytes".to_string(), "-1".to_string()),
            (
                "segment.bytes".to_string(),
                self.config.offsets_segment_bytes.to_string(),
            ),
            ("max.message.bytes".to_string(), (10u64 << 20).to_string()),
        ]);
        let req = NewTopic {
            name: OFFSETS_TOPIC.to_string(),
            partitions: Some(self.config.offsets_partitions),
            replication_factor: Some(rf),
            configs,
            assignments: Vec::new(),
        };
        match broker.create_topic(req, false).await {
            Ok(_) | Err(AdminError::TopicExists(_)) => {
                tracing::info!(
                    partitions = self.config.offsets_partitions,
                    replication_factor = rf,
                    "created {OFFSETS_TOPIC}"
                );
                Ok(())
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not create {OFFSETS_TOPIC} yet; clients will retry");
                Err(codes::COORDINATOR_NOT_AVAILABLE)
            }
        }
    }
}

/// Reads a partition from its start to its end (as led now) into group state. Returns the
/// state and how many records it read.
async fn replay(partition: &Arc<Partition>) -> Result<(Replayed, u64), String> {
    let mut replayed = Replayed::default();
    let records = read_records(partition, |_, offset, key, value| {
        replayed.apply(offset, key, value)
    })
    .await?;
    Ok((replayed, records))
}

/// Reads an internal topic's partition from its start to its end (as led now), calling `f`
/// with each keyed record's batch header, offset, key and value (control batches skipped).
/// Returns how many records it read.
pub(crate) async fn read_records(
    partition: &Arc<Partition>,
    mut f: impl FnMut(&strata_core::batch::BatchHeader, i64, Bytes, Option<Bytes>),
) -> Result<u64, String> {
    let progress = partition.progress();
    let (mut offset, end) = (progress.log_start, progress.log_end);
    let mut records = 0u64;
    while offset < end {
        let plan = partition
            .lock()
            .plan_read(offset, end)
            .map_err(|e| e.to_string())?;
        let Some(plan) = plan else { break };
        let bytes = tokio::task::spawn_blocking(move || plan.read(4 << 20))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        if bytes.is_empty() {
            break;
        }
        for item in BatchIter::new(&bytes) {
            let (header, range) = item.map_err(|e| format!("at offset {offset}: {e}"))?;
            offset = header.last_offset() as u64 + 1;
            if header.is_control() {
                continue;
            }
            let Some(batch) = strata_core::batch::records(&bytes[range]) else {
                tracing::error!(
                    topic = %partition.topic,
                    base_offset = header.base_offset,
                    "unreadable batch in an internal topic; skipped"
                );
                continue;
            };
            for r in batch {
                records += 1;
                let Some(key) = r.key else { continue };
                f(
                    &header,
                    r.offset,
                    Bytes::copy_from_slice(key),
                    r.value.map(Bytes::copy_from_slice),
                );
            }
        }
    }
    Ok(records)
}

/// The coordinator's writes: one batch per call, appended as leader at the epoch the
/// coordinator was loaded in, answered once committed (acks=all).
pub(crate) struct PartitionOffsets {
    partition: Arc<Partition>,
    epoch: i32,
    clock: Arc<dyn Clock>,
    timeout: Duration,
}

impl PartitionOffsets {
    /// Writes to `partition` while it is led at `epoch`, each write waiting up to
    /// `timeout` to be committed.
    pub(crate) fn new(
        partition: Arc<Partition>,
        epoch: i32,
        clock: Arc<dyn Clock>,
        timeout: Duration,
    ) -> Self {
        PartitionOffsets {
            partition,
            epoch,
            clock,
            timeout,
        }
    }
}

#[tonic::async_trait]
impl OffsetsLog for PartitionOffsets {
    async fn append(&self, records: Vec<(Bytes, Option<Bytes>)>) -> Result<(), String> {
        if records.is_empty() {
            return Ok(());
        }
        let now = self.clock.now_ms();
        let recs: Vec<Rec<'_>> = records
            .iter()
            .map(|(k, v)| Rec {
                key: Some(k),
                value: v.as_deref(),
                timestamp_delta: 0,
            })
            .collect();
        let bytes = Bytes::from(build::batch(now, ProducerIds::NONE, &recs));
        let batch = crate::log::ValidBatch::new(bytes).map_err(|e| e.to_string())?;
        // The epoch is checked inside the append: a coordinator closed by a leadership
        // change must not write after its successor has loaded (and maybe written).
        let appended = self
            .partition
            .append_in_epoch(self.epoch, &batch, -1, now)
            .map_err(|e| match e {
                LeaderAppendError::NotLeader => format!(
                    "the offsets partition is no longer led by this broker at epoch {}",
                    self.epoch
                ),
                e => e.to_string(),
            })?;
        self.partition
            .wait_durable(appended.last_offset + 1, self.epoch, self.timeout)
            .await
            .map_err(|e| e.to_string())
    }

    fn end_offset(&self) -> Option<u64> {
        Some(self.partition.progress().log_end)
    }

    fn trim_before(&self, offset: u64) {
        if let Err(e) = self.partition.trim_before(offset) {
            tracing::warn!(partition = self.partition.index, error = %e, "could not delete superseded offsets segments");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::SystemClock;
    use crate::log::{LogConfig, PartitionLog};
    use crate::replication::leader::{Assignment, Policy};

    fn lead(p: &Partition, epoch: i32) {
        p.become_leader(
            epoch,
            Assignment {
                me: 1,
                replicas: vec![1],
                isr: vec![1],
                partition_epoch: epoch,
            },
            Policy {
                min_insync_replicas: 1,
                replica_lag_max_ms: 10_000,
            },
            0,
        );
    }

    /// Issue 14, defect 8: a coordinator loaded at epoch 1 whose partition is now led at
    /// epoch 2 (a successor coordinator loaded and may have written) appended its commit
    /// first and checked the epoch after: its stale write landed behind the successor's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_closed_coordinator_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = PartitionLog::open(dir.path(), LogConfig::default(), 0).unwrap();
        let partition = Partition::start(Arc::from("__consumer_offsets"), 0, log, 0);
        lead(&partition, 1);
        let offsets = PartitionOffsets {
            partition: partition.clone(),
            epoch: 1,
            clock: Arc::new(SystemClock),
            timeout: Duration::from_secs(5),
        };
        let commit = || vec![(Bytes::from_static(b"k"), Some(Bytes::from_static(b"v")))];
        offsets
            .append(commit())
            .await
            .expect("written while leading at 1");
        assert_eq!(partition.progress().log_end, 1);
        lead(&partition, 2);
        let refused = offsets.append(commit()).await;
        assert!(
            refused.is_err(),
            "a write of epoch 1's coordinator at epoch 2"
        );
        assert_eq!(
            partition.progress().log_end,
            1,
            "nothing may be appended by the closed coordinator"
        );
    }
}
