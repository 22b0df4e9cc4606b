//! Transactions (KIP-98): the coordinators of the `__transaction_state` partitions this
//! broker leads, and the writing of markers to partition leaders.
//!
//! The coordinator of transactional id T is the leader of partition hash(T) mod N of
//! `__transaction_state` (created on first use, as Kafka does); its state is the partition's
//! records, replayed when the leadership arrives. See docs/transactions.md.

pub mod coordinator;
pub mod state;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use uuid::Uuid;

use crate::broker::{AdminError, Broker, Clock, NewTopic, Partition};
use crate::group::manager::{read_records, PartitionOffsets};
use crate::group::records::partition_for_group;
use coordinator::{
    MarkerSink, ProducerIdSource, TxnCoordinator, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR,
};
use strata_core::batch::marker::Marker;

pub const TXN_TOPIC: &str = "__transaction_state";
/// Kafka's COORDINATOR_LOAD_IN_PROGRESS.
const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;

/// Transaction settings (`[transactions]` in the server config).
#[derive(Debug, Clone)]
pub struct TxnConfig {
    /// Partitions of `__transaction_state` (`transaction.state.log.num.partitions`).
    pub partitions: u32,
    /// Its replication factor, capped by the brokers registered when it is created.
    pub replication_factor: u16,
    /// `transaction.max.timeout.ms`.
    pub max_timeout_ms: i32,
    /// How long a state write may wait to be replicated.
    pub write_timeout: Duration,
    /// How often timeouts are checked (`transaction.abort.timed.out.transaction.cleanup.interval.ms`).
    pub tick: Duration,
}

impl Default for TxnConfig {
    fn default() -> Self {
        TxnConfig {
            partitions: 50,
            replication_factor: 3,
            max_timeout_ms: 900_000,
            write_timeout: Duration::from_secs(5),
            tick: Duration::from_secs(1),
        }
    }
}

struct Slot {
    topic_id: Uuid,
    epoch: i32,
    partition: Arc<Partition>,
    coordinator: Option<Arc<TxnCoordinator>>,
}

pub struct TxnManager {
    broker: Weak<Broker>,
    clock: Arc<dyn Clock>,
    config: TxnConfig,
    slots: Mutex<HashMap<u32, Slot>>,
    creating: std::sync::atomic::AtomicBool,
}

impl TxnManager {
    pub fn start(broker: &Arc<Broker>, clock: Arc<dyn Clock>, config: TxnConfig) -> Arc<Self> {
        let manager = Arc::new(TxnManager {
            broker: Arc::downgrade(broker),
            clock,
            config,
            slots: Mutex::new(HashMap::new()),
            creating: std::sync::atomic::AtomicBool::new(false),
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

    /// Loads coordinators for the state partitions led here; closes those no longer led.
    fn refresh(self: &Arc<Self>) {
        let Some(broker) = self.broker.upgrade() else {
            return;
        };
        let mut led = HashMap::new();
        if let Some(topic) = broker.topic(TXN_TOPIC) {
            for p in topic.local() {
                if let Some(epoch) = p.progress().leader_epoch {
                    led.insert(p.index as u32, (topic.spec.id, epoch, p.clone()));
                }
            }
        }
        let mut slots = self.slots();
        slots.retain(|index, slot| {
            let keep = led.get(index).is_some_and(|(id, epoch, p)| {
                slot.topic_id == *id && slot.epoch == *epoch && Arc::ptr_eq(&slot.partition, p)
            });
            if !keep {
                if let Some(c) = &slot.coordinator {
                    c.close();
                }
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
            tokio::spawn(async move { manager.load(index, epoch, partition).await });
        }
    }

    async fn load(self: Arc<Self>, index: u32, epoch: i32, partition: Arc<Partition>) {
        let mut replayed: HashMap<String, state::TxnMeta> = HashMap::new();
        let mut damaged = 0usize;
        let read = read_records(&partition, |_, _, key, value| {
            let Ok(id) = state::decode_key(key) else {
                damaged += 1;
                return;
            };
            match value.map(state::decode_value) {
                None => {
                    replayed.remove(&id);
                }
                Some(Ok(m)) => {
                    replayed.insert(id, m);
                }
                Some(Err(_)) => damaged += 1,
            }
        })
        .await;
        if let Err(e) = read {
            tracing::error!(partition = index, error = %e, "could not replay the transaction state partition");
            // the next layout change retries
            self.slots().remove(&index);
            return;
        }
        if damaged > 0 {
            tracing::error!(
                partition = index,
                damaged,
                "skipped unreadable transaction state records"
            );
        }
        let Some(broker) = self.broker.upgrade() else {
            return;
        };
        let log = Arc::new(PartitionOffsets::new(
            partition.clone(),
            epoch,
            self.clock.clone(),
            self.config.write_timeout,
        ));
        let ids = replayed.len();
        let c = TxnCoordinator::load(
            epoch,
            log,
            self.clock.clone(),
            Arc::new(BrokerMarkers(Arc::downgrade(&broker))),
            Arc::new(BrokerIds(Arc::downgrade(&broker))),
            replayed,
            self.config.max_timeout_ms,
        );
        let mut slots = self.slots();
        match slots.get_mut(&index) {
            Some(slot) if slot.epoch == epoch && Arc::ptr_eq(&slot.partition, &partition) => {
                c.spawn_timer(self.config.tick);
                slot.coordinator = Some(c);
                tracing::info!(
                    partition = index,
                    epoch,
                    transactional_ids = ids,
                    "coordinating the transactions of this state partition"
                );
            }
            _ => c.close(),
        }
    }

    /// The coordinator of `id` if this broker is it; else NOT_COORDINATOR or
    /// COORDINATOR_LOAD_IN_PROGRESS.
    pub fn coordinator(&self, id: &str) -> Result<Arc<TxnCoordinator>, i16> {
        let broker = self.broker.upgrade().ok_or(NOT_COORDINATOR)?;
        let topic = broker.topic(TXN_TOPIC).ok_or(NOT_COORDINATOR)?;
        let index = partition_for_group(id, topic.spec.partitions);
        match self.slots().get(&index) {
            Some(Slot {
                coordinator: Some(c),
                ..
            }) => Ok(c.clone()),
            Some(_) => Err(COORDINATOR_LOAD_IN_PROGRESS),
            None => Err(NOT_COORDINATOR),
        }
    }

    /// Every coordinator running here.
    pub fn coordinators(&self) -> Vec<Arc<TxnCoordinator>> {
        self.slots()
            .values()
            .filter_map(|s| s.coordinator.clone())
            .collect()
    }

    /// FindCoordinator for a transactional id: its coordinator's broker, creating
    /// `__transaction_state` first if needed. Err: COORDINATOR_NOT_AVAILABLE (retriable).
    pub async fn find(self: &Arc<Self>, id: &str) -> Result<i32, i16> {
        let broker = self.broker.upgrade().ok_or(COORDINATOR_NOT_AVAILABLE)?;
        if broker.topic(TXN_TOPIC).is_none() {
            use std::sync::atomic::Ordering;
            if self.creating.swap(true, Ordering::AcqRel) {
                return Err(COORDINATOR_NOT_AVAILABLE);
            }
            let (manager, b) = (self.clone(), broker.clone());
            tokio::spawn(async move {
                manager.create_topic(&b).await;
                manager.creating.store(false, Ordering::Release);
            });
        }
        let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
        let mut changes = broker.watch_layout();
        loop {
            if let Some(topic) = broker.topic(TXN_TOPIC) {
                let index = partition_for_group(id, topic.spec.partitions);
                let leader = topic.layout.get(index as usize).and_then(|l| l.leader);
                let ready = leader != Some(broker.config().node_id) || self.coordinator(id).is_ok();
                if let (Some(leader), true) = (leader, ready) {
                    return Ok(leader);
                }
            }
            let waited = tokio::time::timeout_at(deadline, async {
                tokio::select! {
                    _ = changes.changed() => {}
                    _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
            });
            if waited.await.is_err() {
                return Err(COORDINATOR_NOT_AVAILABLE);
            }
        }
    }

    async fn create_topic(&self, broker: &Arc<Broker>) {
        let registered = broker
            .cluster()
            .map_or(1, |link| link.metadata().borrow().brokers.len());
        let rf = self
            .config
            .replication_factor
            .min(u16::try_from(registered).unwrap_or(u16::MAX))
            .max(1);
        let configs = BTreeMap::from([
            // one record per transactional id is live: the broker compacts the rest away
            ("cleanup.policy".to_string(), "compact".to_string()),
            ("segment.bytes".to_string(), (16u64 << 20).to_string()),
            ("min.insync.replicas".to_string(), rf.min(2).to_string()),
        ]);
        let req = NewTopic {
            name: TXN_TOPIC.to_string(),
            partitions: Some(self.config.partitions),
            replication_factor: Some(rf),
            configs,
            assignments: Vec::new(),
        };
        match broker.create_topic(req, false).await {
            Ok(_) | Err(AdminError::TopicExists(_)) => {
                tracing::info!(
                    partitions = self.config.partitions,
                    replication_factor = rf,
                    "created {TXN_TOPIC}"
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not create {TXN_TOPIC} yet; clients will retry")
            }
        }
    }
}

/// The broker's producer-id blocks.
struct BrokerIds(Weak<Broker>);

#[tonic::async_trait]
impl ProducerIdSource for BrokerIds {
    async fn allocate(&self) -> Result<i64, String> {
        let broker = self.0.upgrade().ok_or("the broker is shutting down")?;
        broker
            .allocate_producer_id()
            .await
            .map_err(|e| e.to_string())
    }
}

/// Markers through this broker: appended here for the partitions it leads, sent over the
/// replica plane (`strata.v1.Replica/WriteTxnMarkers`) to the leaders of the others.
struct BrokerMarkers(Weak<Broker>);

#[tonic::async_trait]
impl MarkerSink for BrokerMarkers {
    async fn write(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
        partitions: Vec<(String, i32)>,
    ) -> Vec<(String, i32)> {
        let Some(broker) = self.0.upgrade() else {
            return partitions;
        };
        let marker = Marker {
            commit,
            coordinator_epoch,
        };
        let me = broker.config().node_id;
        let mut left = Vec::new();
        let mut remote: BTreeMap<i32, Vec<(String, i32)>> = BTreeMap::new();
        for (topic, index) in partitions {
            let Some(t) = broker.topic(&topic) else {
                // deleted: nothing left to mark
                continue;
            };
            match t.layout.get(index as usize).and_then(|l| l.leader) {
                Some(leader) if leader != me => {
                    remote.entry(leader).or_default().push((topic, index))
                }
                Some(_) => {
                    if let Err((code, why)) = broker
                        .write_txn_marker(&topic, index, producer_id, producer_epoch, marker)
                        .await
                    {
                        tracing::debug!(topic, partition = index, code, why, "marker not written");
                        left.push((topic, index));
                    }
                }
                None if index as usize >= t.layout.len() => {}
                None => left.push((topic, index)),
            }
        }
        for (leader, parts) in remote {
            let failed =
                send_markers(&broker, leader, producer_id, producer_epoch, marker, &parts).await;
            left.extend(failed);
        }
        left
    }
}

/// Sends one leader its markers; returns the partitions it did not take.
async fn send_markers(
    broker: &Arc<Broker>,
    leader: i32,
    producer_id: i64,
    producer_epoch: i16,
    marker: Marker,
    parts: &[(String, i32)],
) -> Vec<(String, i32)> {
    use strata_proto::v1::{
        replica_client::ReplicaClient, TxnMarker, TxnMarkerPartition, WriteTxnMarkersRequest,
    };
    let Some(link) = broker.cluster() else {
        return parts.to_vec();
    };
    let Some(addr) = link.grpc_address(leader) else {
        return parts.to_vec();
    };
    let endpoint = match strata_proto::tls::live_endpoint(&addr, link.tls().map(|t| t.as_ref())) {
        Ok(e) => e.timeout(Duration::from_secs(10)),
        Err(e) => {
            tracing::warn!(leader, addr, error = %e, "leader's gRPC address is invalid");
            return parts.to_vec();
        }
    };
    let req = WriteTxnMarkersRequest {
        coordinator_id: broker.config().node_id,
        markers: vec![TxnMarker {
            producer_id,
            producer_epoch: i32::from(producer_epoch),
            commit: marker.commit,
            coordinator_epoch: marker.coordinator_epoch,
            partitions: parts
                .iter()
                .map(|(t, p)| TxnMarkerPartition {
                    topic: t.clone(),
                    partition: *p as u32,
                })
                .collect(),
        }],
    };
    let mut client = ReplicaClient::new(endpoint.connect_lazy());
    match client.write_txn_markers(req).await {
        Ok(resp) => resp
            .into_inner()
            .results
            .into_iter()
            .filter(|r| r.error.is_some())
            .map(|r| (r.topic, r.partition as i32))
            .collect(),
        Err(status) => {
            tracing::debug!(leader, error = %status, "markers not sent");
            parts.to_vec()
        }
    }
}
