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

use strata_core::batch::marker::Marker;
use strata_proto::v1::replica_client::ReplicaClient;
use tonic::transport::Channel;

use crate::broker::{AdminError, Broker, Clock, NewTopic};
use crate::group::coordinator::NOT_COORDINATOR;
use crate::internal::{
    self, read_records, Gained, Item, Leaderships, PartitionOffsets, COORDINATOR_NOT_AVAILABLE,
};
use coordinator::{MarkerSink, ProducerIdSource, TxnCoordinator};

pub const TXN_TOPIC: &str = "__transaction_state";

/// How long a partition leader waits for a coordinator's KIP-890 answer.
const VERIFY_TIMEOUT: Duration = Duration::from_secs(5);
/// Kafka's NOT_ENOUGH_REPLICAS: what a produce gets when its verification could not be
/// done (producers retry it).
const NOT_ENOUGH_REPLICAS: i16 = 19;

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
    /// KIP-890 (`transaction.partition.verification.enable`): partition leaders ask the
    /// coordinator before a transactional batch opens a transaction on their partition.
    pub partition_verification: bool,
    /// A transactional id with no transaction open and no request for this long is
    /// forgotten (`transactional.id.expiration.ms`): its state record gets a tombstone.
    pub id_expiration: Duration,
}

impl Default for TxnConfig {
    fn default() -> Self {
        TxnConfig {
            partitions: 50,
            replication_factor: 3,
            max_timeout_ms: 900_000,
            write_timeout: Duration::from_secs(5),
            tick: Duration::from_secs(1),
            partition_verification: true,
            id_expiration: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

pub struct TxnManager {
    broker: Weak<Broker>,
    clock: Arc<dyn Clock>,
    config: TxnConfig,
    led: Arc<Leaderships<TxnCoordinator>>,
    markers: Arc<BrokerMarkers>,
}

impl internal::Closable for TxnCoordinator {
    fn close(&self) {
        TxnCoordinator::close(self)
    }
}

impl TxnManager {
    pub fn start(broker: &Arc<Broker>, clock: Arc<dyn Clock>, config: TxnConfig) -> Arc<Self> {
        let manager = Arc::new(TxnManager {
            broker: Arc::downgrade(broker),
            clock,
            config,
            led: Arc::new(Leaderships::new(TXN_TOPIC)),
            markers: Arc::new(BrokerMarkers {
                broker: Arc::downgrade(broker),
                clients: Mutex::default(),
            }),
        });
        internal::follow_layout(broker, &manager, TxnManager::refresh);
        manager
    }

    /// Loads coordinators for the state partitions led here; closes those no longer led.
    fn refresh(self: &Arc<Self>) {
        let Some(broker) = self.broker.upgrade() else {
            return;
        };
        let (_, gained) = self.led.refresh(&broker);
        for g in gained {
            let manager = self.clone();
            tokio::spawn(async move { manager.load(g).await });
        }
    }

    async fn load(self: Arc<Self>, g: Gained) {
        let mut replayed: HashMap<String, state::TxnMeta> = HashMap::new();
        let mut damaged = 0usize;
        let read = read_records(&g.partition, |item| {
            let Item::Record { key, value, .. } = item else {
                return;
            };
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
            tracing::error!(partition = g.index, error = %e, "could not replay the transaction state partition");
            // the next layout change retries
            self.led.forget(&g);
            return;
        }
        if damaged > 0 {
            tracing::error!(
                partition = g.index,
                damaged,
                "skipped unreadable transaction state records"
            );
        }
        let Some(broker) = self.broker.upgrade() else {
            return;
        };
        let log = Arc::new(PartitionOffsets::new(
            g.partition.clone(),
            g.epoch,
            self.clock.clone(),
            self.config.write_timeout,
        ));
        let ids = replayed.len();
        let c = TxnCoordinator::load(
            g.epoch,
            log,
            self.clock.clone(),
            self.markers.clone(),
            Arc::new(BrokerIds(Arc::downgrade(&broker))),
            replayed,
            &self.config,
        );
        if self.led.install(&g, c.clone()) {
            c.spawn_timer(self.config.tick);
            tracing::info!(
                partition = g.index,
                epoch = g.epoch,
                transactional_ids = ids,
                "coordinating the transactions of this state partition"
            );
        }
    }

    /// The coordinator of `id` if this broker is it; else NOT_COORDINATOR or
    /// COORDINATOR_LOAD_IN_PROGRESS.
    pub fn coordinator(&self, id: &str) -> Result<Arc<TxnCoordinator>, i16> {
        let broker = self.broker.upgrade().ok_or(NOT_COORDINATOR)?;
        self.led.coordinator(&broker, id)
    }

    /// Every coordinator running here.
    pub fn coordinators(&self) -> Vec<Arc<TxnCoordinator>> {
        self.led.all()
    }

    /// Whether partition leaders verify transactional batches (KIP-890).
    pub fn verifies(&self) -> bool {
        self.config.partition_verification
    }

    /// KIP-890 verification by the coordinator of `id` if it runs here (the replica
    /// plane's VerifyTxn): per partition, Ok or Kafka's code.
    pub async fn verify_here(
        &self,
        id: &str,
        producer_id: i64,
        epoch: i16,
        partitions: &[(String, i32)],
    ) -> Vec<Result<(), i16>> {
        match self.coordinator(id) {
            Ok(c) => c.verify(id, producer_id, epoch, partitions).await,
            Err(code) => vec![Err(code); partitions.len()],
        }
    }

    /// KIP-890: asks the coordinator of `id`, here or over the replica plane, whether each
    /// partition is in the open transaction of `producer_id` at `epoch`. When the
    /// coordinator cannot answer (moving, loading, unreachable) the answer is
    /// NOT_ENOUGH_REPLICAS, which producers retry, as Kafka maps it.
    pub async fn verify(
        &self,
        id: &str,
        producer_id: i64,
        epoch: i16,
        partitions: &[(String, i32)],
    ) -> Vec<Result<(), i16>> {
        let retriable = |r: Result<(), i16>| match r {
            Err(
                NOT_COORDINATOR
                | COORDINATOR_NOT_AVAILABLE
                | crate::internal::COORDINATOR_LOAD_IN_PROGRESS,
            ) => Err(NOT_ENOUGH_REPLICAS),
            other => other,
        };
        let answers = if self.coordinator(id).is_ok() {
            self.verify_here(id, producer_id, epoch, partitions).await
        } else {
            self.verify_remote(id, producer_id, epoch, partitions).await
        };
        answers.into_iter().map(retriable).collect()
    }

    async fn verify_remote(
        &self,
        id: &str,
        producer_id: i64,
        epoch: i16,
        partitions: &[(String, i32)],
    ) -> Vec<Result<(), i16>> {
        let unavailable = vec![Err(COORDINATOR_NOT_AVAILABLE); partitions.len()];
        let Some(broker) = self.broker.upgrade() else {
            return unavailable;
        };
        let me = broker.config().node_id;
        let leader = broker.topic(TXN_TOPIC).and_then(|t| {
            let index = crate::group::records::partition_for_group(id, t.spec.partitions);
            t.layout.get(index as usize).and_then(|l| l.leader)
        });
        let Some(client) = leader
            .filter(|l| *l != me)
            .and_then(|l| self.markers.client(&broker, l))
        else {
            return unavailable;
        };
        let req = strata_proto::v1::VerifyTxnRequest {
            leader_id: me,
            transactional_id: id.to_string(),
            producer_id,
            producer_epoch: i32::from(epoch),
            partitions: partitions
                .iter()
                .map(|(t, p)| strata_proto::v1::TxnMarkerPartition {
                    topic: t.clone(),
                    partition: *p as u32,
                })
                .collect(),
        };
        let mut client = client;
        match tokio::time::timeout(VERIFY_TIMEOUT, client.verify_txn(req)).await {
            Ok(Ok(resp)) => {
                let codes = resp.into_inner().error_codes;
                if codes.len() != partitions.len() {
                    return unavailable;
                }
                codes
                    .into_iter()
                    .map(|c| match c {
                        0 => Ok(()),
                        c => Err(i16::try_from(c).unwrap_or(COORDINATOR_NOT_AVAILABLE)),
                    })
                    .collect()
            }
            Ok(Err(status)) => {
                tracing::debug!(transactional_id = id, error = %status, "transaction verification failed");
                unavailable
            }
            Err(_) => unavailable,
        }
    }

    /// FindCoordinator for a transactional id: its coordinator's broker, creating
    /// `__transaction_state` first if needed. Err: COORDINATOR_NOT_AVAILABLE (retriable).
    pub async fn find(self: &Arc<Self>, id: &str) -> Result<i32, i16> {
        let broker = self.broker.upgrade().ok_or(COORDINATOR_NOT_AVAILABLE)?;
        let (manager, b) = (self.clone(), broker.clone());
        let create = async move { manager.create_topic(&b).await };
        self.led.find(&broker, id, create).await
    }

    async fn create_topic(&self, broker: &Arc<Broker>) {
        let rf = internal::replication_factor(broker, self.config.replication_factor);
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
/// replica plane (`strata.v1.Replica/WriteTxnMarkers`) to the leaders of the others, one
/// channel per leader kept for the next transactions (re-made when its address changes).
struct BrokerMarkers {
    broker: Weak<Broker>,
    clients: Mutex<HashMap<i32, (String, ReplicaClient<Channel>)>>,
}

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
        let Some(broker) = self.broker.upgrade() else {
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
            let failed = match self.client(&broker, leader) {
                Some(client) => {
                    send_markers(
                        client,
                        me,
                        leader,
                        producer_id,
                        producer_epoch,
                        marker,
                        &parts,
                    )
                    .await
                }
                None => parts,
            };
            left.extend(failed);
        }
        left
    }
}

impl BrokerMarkers {
    /// The replica-plane client of broker `leader`, if its address is known.
    fn client(&self, broker: &Broker, leader: i32) -> Option<ReplicaClient<Channel>> {
        let link = broker.cluster()?;
        let addr = link.grpc_address(leader)?;
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((known, c)) = clients.get(&leader) {
            if *known == addr {
                return Some(c.clone());
            }
        }
        let endpoint = match strata_proto::tls::live_endpoint(&addr, link.tls().map(|t| t.as_ref()))
        {
            Ok(e) => e.timeout(Duration::from_secs(10)),
            Err(e) => {
                tracing::warn!(leader, addr, error = %e, "leader's gRPC address is invalid");
                return None;
            }
        };
        let c = ReplicaClient::new(endpoint.connect_lazy());
        clients.insert(leader, (addr, c.clone()));
        Some(c)
    }
}

/// Sends one leader its markers; returns the partitions it did not take.
async fn send_markers(
    mut client: ReplicaClient<Channel>,
    coordinator_id: i32,
    leader: i32,
    producer_id: i64,
    producer_epoch: i16,
    marker: Marker,
    parts: &[(String, i32)],
) -> Vec<(String, i32)> {
    use strata_proto::v1::{TxnMarker, TxnMarkerPartition, WriteTxnMarkersRequest};
    let req = WriteTxnMarkersRequest {
        coordinator_id,
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
