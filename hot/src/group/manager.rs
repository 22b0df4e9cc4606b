//! Which groups this broker coordinates: one [`Coordinator`] per `__consumer_offsets`
//! partition it leads, built by replaying the partition when the leadership arrives and
//! closed when it leaves (see [`crate::internal`]). The internal topic is created on the
//! first FindCoordinator, as Kafka does.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::coordinator::{Coordinator, NOT_COORDINATOR};
use super::records::Replayed;
use super::state::{codes, GroupConfig};
use crate::broker::{AdminError, Broker, Clock, NewTopic, Partition};
use crate::internal::{self, Gained, Item, Leaderships, PartitionOffsets};

pub const OFFSETS_TOPIC: &str = "__consumer_offsets";
pub use crate::internal::COORDINATOR_LOAD_IN_PROGRESS;
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
    /// Defaults and bounds of consumer-protocol (KIP-848) groups.
    pub consumer: super::consumer::ConsumerProtocolConfig,
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
            consumer: super::consumer::ConsumerProtocolConfig::default(),
        }
    }
}

pub struct GroupManager {
    broker: Weak<Broker>,
    clock: Arc<dyn Clock>,
    config: GroupsConfig,
    led: Arc<Leaderships<Coordinator>>,
}

impl internal::Closable for Coordinator {
    fn close(&self) {
        Coordinator::close(self)
    }
}

impl GroupManager {
    /// Starts following the broker's leaderships of `__consumer_offsets`.
    pub fn start(broker: &Arc<Broker>, clock: Arc<dyn Clock>, config: GroupsConfig) -> Arc<Self> {
        let manager = Arc::new(GroupManager {
            broker: Arc::downgrade(broker),
            clock,
            config,
            led: Arc::new(Leaderships::new(OFFSETS_TOPIC)),
        });
        internal::follow_layout(broker, &manager, GroupManager::refresh);
        manager
    }

    /// Loads coordinators for partitions this broker now leads and closes those it lost.
    fn refresh(self: &Arc<Self>) {
        let Some(broker) = self.broker.upgrade() else {
            return;
        };
        let (lost, gained) = self.led.refresh(&broker);
        for index in lost {
            tracing::info!(
                partition = index,
                "no longer coordinating the groups of this offsets partition"
            );
        }
        for g in gained {
            let manager = self.clone();
            tokio::spawn(async move { manager.load(g).await });
        }
    }

    /// Replays a partition this broker just became leader of and installs its coordinator.
    async fn load(self: Arc<Self>, g: Gained) {
        let started = std::time::Instant::now();
        let mut backoff = Duration::from_millis(100);
        let (index, epoch) = (g.index, g.epoch);
        let (replayed, records) = loop {
            match replay(&g.partition).await {
                Ok(r) => break r,
                Err(e) => {
                    tracing::error!(partition = index, error = %e, "could not replay the offsets partition; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    if !self.led.still_led(&g) {
                        return;
                    }
                }
            }
        };
        if !replayed.damaged.is_empty() {
            tracing::error!(partition = index, damaged = replayed.damaged.len(), first = ?replayed.damaged.first(), "skipped unreadable records in the offsets partition");
        }
        let (groups, offsets) = (replayed.groups.len(), replayed.offsets.len());
        let log = Arc::new(PartitionOffsets::new(
            g.partition.clone(),
            epoch,
            self.clock.clone(),
            self.config.commit_timeout,
        ));
        let coordinator = Coordinator::load(self.config.group, self.clock.clone(), log, replayed);
        coordinator.set_snapshot_min_records(self.config.offsets_snapshot_records);
        // (closed again at once if the leadership moved on while replaying)
        if self.led.install(&g, coordinator.clone()) {
            coordinator.spawn_timer(self.config.tick);
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
    }

    /// The coordinator of `group` if this broker is it; otherwise Kafka's error:
    /// NOT_COORDINATOR, or COORDINATOR_LOAD_IN_PROGRESS while the partition is replayed.
    pub fn coordinator(&self, group: &str) -> Result<Arc<Coordinator>, i16> {
        if super::invalid_group_id(group).is_some() {
            return Err(INVALID_GROUP_ID);
        }
        let broker = self.broker.upgrade().ok_or(NOT_COORDINATOR)?;
        self.led.coordinator(&broker, group)
    }

    /// Every coordinator running here.
    pub fn coordinators(&self) -> Vec<Arc<Coordinator>> {
        self.led.all()
    }

    /// The `__consumer_offsets` partition of `group` (AddOffsetsToTxn); Err while the
    /// topic does not exist (COORDINATOR_NOT_AVAILABLE: the client finds the group's
    /// coordinator first, which creates it).
    pub fn offsets_partition(&self, group: &str) -> Result<(String, i32), i16> {
        if super::invalid_group_id(group).is_some() {
            return Err(INVALID_GROUP_ID);
        }
        let broker = self
            .broker
            .upgrade()
            .ok_or(codes::COORDINATOR_NOT_AVAILABLE)?;
        let topic = broker
            .topic(OFFSETS_TOPIC)
            .ok_or(codes::COORDINATOR_NOT_AVAILABLE)?;
        let index = super::records::partition_for_group(group, topic.spec.partitions);
        Ok((OFFSETS_TOPIC.to_string(), index as i32))
    }

    /// A transaction marker of `producer_id` is committed in offsets partition `index`,
    /// led here: its coordinator applies (or drops) the producer's pending offsets. Err
    /// (retriable) while that coordinator is still loading: the marker is sent again.
    pub fn txn_marker(&self, index: i32, producer_id: i64, commit: bool) -> Result<(), i16> {
        match self.led.at(index as u32) {
            internal::At::Loaded(c) => {
                c.end_txn(producer_id, commit);
                Ok(())
            }
            internal::At::Loading => Err(COORDINATOR_LOAD_IN_PROGRESS),
            // no longer led here: the next coordinator replays the marker
            internal::At::NotLed => Ok(()),
        }
    }

    /// FindCoordinator: the broker that coordinates `group`, creating `__consumer_offsets`
    /// first if it does not exist. Err: COORDINATOR_NOT_AVAILABLE (retriable).
    pub async fn find(self: &Arc<Self>, group: &str) -> Result<i32, i16> {
        let broker = self
            .broker
            .upgrade()
            .ok_or(codes::COORDINATOR_NOT_AVAILABLE)?;
        let (manager, b) = (self.clone(), broker.clone());
        let create = async move {
            let _ = manager.create_offsets_topic(&b).await;
        };
        self.led.find(&broker, group, create).await
    }

    async fn create_offsets_topic(&self, broker: &Arc<Broker>) -> Result<(), i16> {
        if broker.topic(OFFSETS_TOPIC).is_some() {
            return Ok(());
        }
        let rf = internal::replication_factor(broker, self.config.offsets_replication_factor);
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
    let records = internal::read_records(partition, |item| match item {
        Item::Record {
            header,
            offset,
            key,
            value,
        } if header.is_transactional() => {
            replayed.apply_txn(header.producer_id, offset, key, value)
        }
        Item::Record {
            offset, key, value, ..
        } => replayed.apply(offset, key, value),
        Item::Marker {
            producer_id,
            commit,
        } => replayed.end_txn(producer_id, commit),
    })
    .await?;
    Ok((replayed, records))
}
