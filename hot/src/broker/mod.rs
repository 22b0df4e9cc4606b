//! The broker's partitions and topics on this node, independent of any wire protocol.
//!
//! `Broker` owns the topic store, opens every partition log at start, serialises topic
//! administration, hands out producer ids and runs retention. The Kafka listener (and later
//! the gRPC one) translate requests into calls here.

mod isr;
pub mod partition;
mod reconcile;
mod storage;
pub mod tier;
pub mod topics;

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use uuid::Uuid;

use crate::cluster::ClusterLink;
use crate::log::{ConfigError, LogConfig, PartitionLog};
pub use partition::{Partition, Progress, WaitError};
use strata_controller::metadata::dynamic::ConfigScope;
use strata_core::dynamic_config::DynamicConfigError;
pub use topics::{validate_topic_name, TopicSpec, TopicStore};

/// Wall-clock milliseconds, injected so tests can move time.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> i64;
}

pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64)
    }
}

/// What the broker needs to know at start.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// Super users and the default for resources no ACL names.
    pub authorizer: strata_controller::metadata::acl::AuthorizerConfig,
    pub data_dir: PathBuf,
    pub node_id: i32,
    /// Broker-wide defaults for topic configs (Kafka names); topics override them.
    pub topic_defaults: BTreeMap<String, String>,
    pub default_partitions: u32,
    pub retention_check_interval: Duration,
    /// A producer id with no batch for this long is forgotten (`producer.id.expiration.ms`,
    /// KIP-854); checked with retention.
    pub producer_id_expiration: Duration,
    /// How often compacted topics' local logs are checked (`log.cleaner.backoff.ms`), and
    /// the memory of a round's key table (`log.cleaner.dedupe.buffer.size`).
    pub compaction_check_interval: Duration,
    pub compaction_map_bytes: usize,
    pub auto_create_topics: bool,
    /// `replica.lag.time.max.ms`: how long a follower may lag before it leaves the ISR.
    pub replica_lag_time_max: Duration,
    /// A replica whose log takes longer than this to open (recover) is reported stuck and
    /// left unavailable until the open finishes.
    pub replica_open_timeout: Duration,
    /// Which replica consumers are told to fetch from (KIP-392).
    pub replica_selector: crate::config::ReplicaSelector,
    /// Consumer group coordination.
    pub groups: crate::group::manager::GroupsConfig,
    /// Transaction coordination.
    pub transactions: crate::txn::TxnConfig,
    /// The cold tier (`None`: topics cannot enable `remote.storage.enable`).
    pub tier: Option<tier::TierConfig>,
}

/// Why a topic administration request was refused.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("{0}")]
    InvalidTopic(String),
    #[error("{0}")]
    InvalidPartitions(String),
    #[error("{0}")]
    InvalidReplicationFactor(String),
    #[error("{0}")]
    InvalidReplicaAssignment(String),
    #[error(transparent)]
    InvalidConfig(#[from] ConfigError),
    #[error("{0}")]
    TopicExists(String),
    #[error("topic '{0}' does not exist")]
    UnknownTopic(String),
    #[error("storage error: {0}")]
    Io(#[from] io::Error),
}

/// A topic as this broker sees it.
pub struct Topic {
    pub spec: TopicSpec,
    /// The replicas this broker holds, by partition index (`None`: held elsewhere).
    pub partitions: Vec<Option<Arc<Partition>>>,
    /// Who holds and leads each partition, by partition index.
    pub layout: Vec<PartitionLayout>,
}

/// Placement and leadership of one partition, from the cluster metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionLayout {
    pub leader: Option<i32>,
    pub leader_epoch: i32,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
    /// A reassignment in progress: the replicas it adds and removes, and how fast each
    /// added one may copy (bytes per second, `None`: unthrottled).
    pub adding: Vec<i32>,
    pub removing: Vec<i32>,
    pub throttle: Option<u64>,
}

impl Topic {
    /// This broker's local replicas.
    pub fn local(&self) -> impl Iterator<Item = &Arc<Partition>> {
        self.partitions.iter().flatten()
    }
}

/// Why a produce to one partition was refused.
#[derive(Debug, thiserror::Error)]
pub enum ProduceError {
    #[error("{topic}-{partition} does not exist")]
    UnknownTopicOrPartition { topic: String, partition: i32 },
    #[error("this broker does not lead {topic}-{partition}")]
    NotLeader {
        topic: String,
        partition: i32,
        leader: Option<i32>,
    },
    #[error("{0}")]
    NotEnoughReplicas(String),
    #[error("topic '{topic}' requires min.acks={required}; the producer asked for acks={acks}")]
    AcksTooWeak {
        topic: String,
        acks: i16,
        required: String,
    },
    /// Only the broker writes its internal topics (the group coordinator appends to its
    /// partitions directly); every client path refuses them here.
    #[error("cannot append to internal topic {0}")]
    InternalTopic(String),
    #[error(transparent)]
    Batch(#[from] strata_core::batch::BatchError),
    /// The records inside a batch whose header and CRC are good.
    #[error("{topic}-{partition}: {error}")]
    Records {
        topic: String,
        partition: i32,
        error: strata_core::validate::RecordsError,
    },
    #[error(transparent)]
    Append(#[from] crate::log::AppendError),
}

/// A batch appended on the leader, with what it takes for it to become durable.
pub struct PendingAppend {
    partition: Arc<Partition>,
    records: u64,
    bytes: u64,
    base_offset: u64,
    /// The append time the batch was stamped with (LogAppendTime topics): the Produce
    /// response's `log_append_time_ms`.
    log_append_time: Option<i64>,
    /// The high watermark must reach this, in this leader epoch, for the write to be
    /// committed; `None` when the producer asked for less than acks=all.
    durable_at: Option<(u64, i32)>,
    log_start: u64,
    appended_at: std::time::Instant,
    /// Whether this broker holds its lease (cluster mode): a wait ends with NOT_LEADER when
    /// the lease runs out, so the producer retries with the next leader at once instead of
    /// waiting out its request timeout on a broker that no longer leads.
    leading: Option<Arc<crate::cluster::ClusterLink>>,
}

impl PendingAppend {
    pub fn base_offset(&self) -> u64 {
        self.base_offset
    }

    pub fn log_start(&self) -> u64 {
        self.log_start
    }

    /// The broker's append time on a LogAppendTime topic, else -1 (Kafka's answer).
    pub fn log_append_time_ms(&self) -> i64 {
        self.log_append_time.unwrap_or(-1)
    }

    /// Waits until the write is committed per the topic's policy (acks=all only); records
    /// the wait in `commit_latency`.
    pub async fn durable(
        &self,
        timeout: std::time::Duration,
        commit_latency: &crate::metrics::Histogram,
    ) -> Result<(), WaitError> {
        match self.durable_at {
            Some((end, epoch)) => {
                let wait = self.partition.wait_durable(end, epoch, timeout);
                let result = match &self.leading {
                    Some(link) => {
                        let lost = async {
                            let mut leading = link.leading();
                            loop {
                                let _ = leading.wait_for(|held| !*held).await;
                                // the published flag may lag a renewal: ask the lease itself
                                if !link.holds_lease() {
                                    return;
                                }
                                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                            }
                        };
                        tokio::select! {
                            r = wait => r,
                            _ = lost => Err(WaitError::NotLeader),
                        }
                    }
                    None => wait.await,
                };
                if result.is_ok() {
                    commit_latency.observe(self.appended_at.elapsed());
                }
                result
            }
            None => Ok(()),
        }
    }
}

/// How a client's leader epoch compares with the broker's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpochCheck {
    Current,
    /// The client knows an older leader epoch: it talks to a leadership that is gone.
    Fenced,
    /// The client knows a newer epoch than this broker has seen yet.
    Unknown,
}

/// Where a produce or fetch for a partition goes.
pub enum Route {
    /// This broker leads the partition.
    Leader(Arc<Partition>),
    /// The partition exists but another broker (or none, while offline) leads it.
    NotLeader,
    UnknownTopicOrPartition,
}

/// A request to create a topic, as the admin APIs give it.
#[derive(Debug, Clone, Default)]
pub struct NewTopic {
    pub name: String,
    /// `None` = the broker default.
    pub partitions: Option<u32>,
    /// `None` = the broker default (1 on a single node).
    pub replication_factor: Option<u16>,
    pub configs: BTreeMap<String, String>,
    /// Each partition's replicas, the preferred leader first (Kafka's manual assignment;
    /// then `partitions` and `replication_factor` are its sizes); empty: placed by the
    /// controllers.
    pub assignments: Vec<Vec<i32>>,
}

/// How many producer ids are reserved durably at a time.
const PRODUCER_ID_BLOCK: i64 = 1000;
pub use strata_core::topic::MAX_PARTITIONS;

pub struct Broker {
    config: BrokerConfig,
    clock: Arc<dyn Clock>,
    store: tokio::sync::Mutex<TopicStore>,
    cluster_id: String,
    topics: RwLock<HashMap<String, Arc<Topic>>>,
    /// Next producer id to hand out and the end of the reserved block.
    producer_ids: Mutex<(i64, i64)>,
    /// The controller link in cluster mode; `None` for a single node.
    cluster: Option<Arc<ClusterLink>>,
    /// The cluster metadata version the topics above reflect (cluster mode).
    metadata_version: tokio::sync::watch::Sender<u64>,
    /// Bumped whenever the topics, their partitions or their leaders change here.
    layout_version: tokio::sync::watch::Sender<u64>,
    metrics: crate::metrics::Metrics,
    /// Replica logs still opening (recovering) in the background, by directory.
    opening: Mutex<HashMap<PathBuf, reconcile::Opening>>,
    /// Bounds the replica logs opened at once (see [`reconcile::OPENS_AT_ONCE`]).
    open_slots: Arc<tokio::sync::Semaphore>,
    /// Poked when a background open finishes, so the metadata is applied again.
    reconcile_again: Arc<tokio::sync::Notify>,
    /// Whether copies of replicas moved away while this broker was down have been looked
    /// for (once, at the first metadata at least as new as this broker's registration).
    strays_checked: std::sync::atomic::AtomicBool,
    /// The consumer group coordinators of the offsets partitions this broker leads.
    groups: std::sync::OnceLock<Arc<crate::group::manager::GroupManager>>,
    /// The transaction coordinators of the `__transaction_state` partitions led here.
    txns: std::sync::OnceLock<Arc<crate::txn::TxnManager>>,
    /// The cold tier, when configured.
    cold: std::sync::OnceLock<Arc<tier::ColdTier>>,
    /// Follower fetch sessions, one per leader broker (cluster mode).
    sessions: Arc<crate::replication::session::Sessions>,
}

impl Broker {
    /// Opens the data directory: the topic store and every partition log (recovering them).
    /// In cluster mode (`cluster` given) the topics come from the controller's metadata
    /// instead, and this broker opens the partitions it holds a replica of as they appear.
    pub async fn open(
        config: BrokerConfig,
        clock: Arc<dyn Clock>,
        cluster: Option<Arc<ClusterLink>>,
    ) -> io::Result<Arc<Broker>> {
        let meta = config.data_dir.join("meta");
        let logs = config.data_dir.join("logs");
        strata_core::private_fs::create_dir_all(&logs)?;
        let store = TopicStore::open(&meta)?;
        let cluster_id = match &cluster {
            Some(link) => link.cluster_id().to_string(),
            None => store.cluster_id().to_string(),
        };
        let specs = if cluster.is_some() {
            Vec::new()
        } else {
            store.topics().to_vec()
        };
        let broker = Arc::new(Broker {
            config,
            clock,
            store: tokio::sync::Mutex::new(store),
            cluster_id,
            topics: RwLock::new(HashMap::new()),
            producer_ids: Mutex::new((0, 0)),
            cluster,
            metadata_version: tokio::sync::watch::channel(0).0,
            layout_version: tokio::sync::watch::channel(0).0,
            metrics: crate::metrics::Metrics::default(),
            opening: Mutex::new(HashMap::new()),
            open_slots: Arc::new(tokio::sync::Semaphore::new(reconcile::OPENS_AT_ONCE)),
            reconcile_again: Arc::new(tokio::sync::Notify::new()),
            strays_checked: std::sync::atomic::AtomicBool::new(false),
            groups: std::sync::OnceLock::new(),
            txns: std::sync::OnceLock::new(),
            cold: std::sync::OnceLock::new(),
            sessions: Default::default(),
        });
        let groups = crate::group::manager::GroupManager::start(
            &broker,
            broker.clock.clone(),
            broker.config.groups.clone(),
        );
        let _ = broker.groups.set(groups);
        let txns = crate::txn::TxnManager::start(
            &broker,
            broker.clock.clone(),
            broker.config.transactions.clone(),
        );
        let _ = broker.txns.set(txns);
        if let Some(config) = broker.config.tier.clone() {
            let store = strata_cold::store::open(&config.store).map_err(io::Error::other)?;
            tracing::info!(store = %store, "tiering sealed segments of topics with remote.storage.enable");
            let reader = strata_cold::read::RemoteReader::open(store.clone(), config.read.clone())
                .await
                .map_err(io::Error::other)?;
            let cold = Arc::new(tier::ColdTier::new(reader));
            let _ = broker.cold.set(cold.clone());
            tokio::spawn(tier::run(Arc::downgrade(&broker), store, cold, config));
        }
        remove_deleted_dirs(&logs)?;
        for spec in specs {
            let topic = broker.open_topic(spec).await?;
            broker.topics_write().insert(topic.spec.name.clone(), topic);
        }
        broker.layout_changed();
        if let Some(link) = broker.cluster.clone() {
            tokio::spawn(reconcile::follow_metadata(
                Arc::downgrade(&broker),
                link.metadata(),
                broker.reconcile_again.clone(),
            ));
            tokio::spawn(isr::run(Arc::downgrade(&broker), link));
        } else {
            broker.warn_orphans(&logs)?;
        }
        broker.spawn_storage_recovery();
        Ok(broker)
    }

    /// The cold tier's reader and manifests, when one is configured.
    pub fn cold(&self) -> Option<&Arc<tier::ColdTier>> {
        self.cold.get()
    }

    /// The consumer group coordination of this broker.
    pub fn groups(&self) -> &Arc<crate::group::manager::GroupManager> {
        self.groups.get().expect("set when the broker opens")
    }

    /// The transaction coordination of this broker.
    pub fn txns(&self) -> &Arc<crate::txn::TxnManager> {
        self.txns.get().expect("set when the broker opens")
    }

    /// Appends a transaction coordinator's marker to a partition led here and waits until
    /// it is committed. A partition that no longer exists needs none; a marker older than
    /// the producer's epoch in the partition is obsolete (a newer coordinator decided).
    pub async fn write_txn_marker(
        &self,
        topic: &str,
        index: i32,
        producer_id: i64,
        producer_epoch: i16,
        marker: strata_core::batch::marker::Marker,
    ) -> Result<(), (i16, String)> {
        use crate::kafka::codes;
        let partition = match self.route(topic, index) {
            Route::Leader(p) => p,
            Route::NotLeader => {
                return Err((
                    codes::NOT_LEADER_OR_FOLLOWER,
                    format!("this broker does not lead {topic}-{index}"),
                ))
            }
            Route::UnknownTopicOrPartition => return Ok(()),
        };
        let appended = partition.append_marker(producer_id, producer_epoch, marker, self.now_ms());
        let (at, epoch) = match appended {
            Ok(a) => a,
            Err(partition::LeaderAppendError::Append(
                crate::log::AppendError::InvalidProducerEpoch { current },
            )) => {
                tracing::info!(
                    topic,
                    partition = index,
                    producer_id,
                    producer_epoch,
                    current,
                    "obsolete transaction marker dropped"
                );
                return Ok(());
            }
            Err(e) => return Err((codes::NOT_ENOUGH_REPLICAS, e.to_string())),
        };
        partition
            .wait_durable(at.last_offset + 1, epoch, std::time::Duration::from_secs(5))
            .await
            .map_err(|e| (codes::wait(&e).0, e.to_string()))?;
        if topic == crate::group::manager::OFFSETS_TOPIC {
            // the group coordinator of that partition (this broker) applies the offsets
            self.groups()
                .txn_marker(index, producer_id, marker.commit)
                .map_err(|code| (code, "the group coordinator is loading".to_string()))?;
        }
        Ok(())
    }

    pub fn metrics(&self) -> &crate::metrics::Metrics {
        &self.metrics
    }

    /// The controller link, in cluster mode.
    pub fn cluster(&self) -> Option<&Arc<ClusterLink>> {
        self.cluster.as_ref()
    }

    /// Live brokers' Kafka endpoints (id, host, port); `None` on a single node (the
    /// listener answers with its own address).
    /// Live brokers' endpoints of Kafka listener `listener` (a client is told about the
    /// listener it connected to, as Kafka does); None on a single node without controllers.
    pub fn kafka_endpoints(&self, listener: &str) -> Option<Vec<(i32, String, u16)>> {
        self.cluster
            .as_ref()
            .map(|link| reconcile::kafka_endpoints(&link.metadata().borrow(), listener))
    }

    /// Whether `principal` from `host` may do `operation` on a resource, by the ACLs in the
    /// metadata (none on a single node without controllers) and `[auth]`.
    pub fn authorize(
        &self,
        principal: &str,
        host: &str,
        operation: strata_controller::metadata::acl::Operation,
        resource_type: strata_controller::metadata::acl::ResourceType,
        name: &str,
    ) -> bool {
        let metadata = self.cluster.as_ref().map(|l| l.metadata().borrow().clone());
        let acls = metadata.as_ref().map(|m| &m.acls);
        strata_controller::metadata::acl::authorize(
            acls.into_iter().flatten(),
            &self.config.authorizer,
            principal,
            host,
            operation,
            resource_type,
            name,
        )
    }

    /// The SCRAM credentials SASL logins are checked against: the metadata's.
    pub fn credentials(&self) -> MetadataCredentials {
        MetadataCredentials(
            self.cluster
                .as_ref()
                .map(|link| link.metadata().borrow().clone()),
        )
    }

    pub fn config(&self) -> &BrokerConfig {
        &self.config
    }

    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Replicas whose log has been opening for longer than `replica_open_timeout`.
    pub fn stuck_opening(&self) -> usize {
        let limit = self.config.replica_open_timeout;
        self.opening
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|o| o.started.get().is_some_and(|s| s.elapsed() > limit))
            .count()
    }

    pub fn replica_lag_ms(&self) -> i64 {
        self.config.replica_lag_time_max.as_millis() as i64
    }

    fn topics_write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Arc<Topic>>> {
        self.topics.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Tells watchers (the group coordinators) that topics or leaderships changed.
    fn layout_changed(&self) {
        self.layout_version.send_modify(|v| *v += 1);
    }

    /// Changes whenever topics, partitions or leaderships on this broker change.
    pub fn watch_layout(&self) -> tokio::sync::watch::Receiver<u64> {
        self.layout_version.subscribe()
    }

    pub fn topic(&self, name: &str) -> Option<Arc<Topic>> {
        self.topics
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    /// Counts record bytes a consumer fetched from `topic`-`index` (all of them, and the
    /// partition's own count behind the per-topic rate).
    pub fn count_fetched(&self, topic: &str, index: i32, bytes: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        if bytes == 0 {
            return;
        }
        self.metrics.fetched_bytes.fetch_add(bytes, Relaxed);
        let local = self.topic(topic).and_then(|t| {
            usize::try_from(index)
                .ok()
                .and_then(|i| t.partitions.get(i).cloned().flatten())
        });
        if let Some(p) = local {
            p.bytes_out.fetch_add(bytes, Relaxed);
        }
    }

    /// Validates and appends one produced batch on this broker, the partition's leader. The
    /// append happens now (callers keep request order); waiting for durability is left to
    /// the returned [`PendingAppend`].
    pub fn append(
        &self,
        topic: &str,
        index: i32,
        records: bytes::Bytes,
        acks: i16,
        now_ms: i64,
    ) -> Result<PendingAppend, ProduceError> {
        self.append_verified(topic, index, records, acks, None, now_ms)
    }

    /// [`Broker::append`] of a Kafka producer's records, with what KIP-890 verification
    /// found for their transactional batch.
    pub fn append_verified(
        &self,
        topic: &str,
        index: i32,
        records: bytes::Bytes,
        acks: i16,
        verified: Option<crate::log::TxnVerified>,
        now_ms: i64,
    ) -> Result<PendingAppend, ProduceError> {
        use std::sync::atomic::Ordering::Relaxed;
        self.metrics.produce_requests.fetch_add(1, Relaxed);
        let appended = self.append_inner(topic, index, records, acks, verified, now_ms);
        match &appended {
            Ok(p) => {
                self.metrics.produced_records.fetch_add(p.records, Relaxed);
                self.metrics.produced_bytes.fetch_add(p.bytes, Relaxed);
                p.partition.bytes_in.fetch_add(p.bytes, Relaxed);
            }
            Err(_) => {
                self.metrics.produce_errors.fetch_add(1, Relaxed);
            }
        }
        appended
    }

    /// The KIP-890 guard for a transactional batch of `producer_id` at `epoch` to
    /// `topic`-`index`: `Some(None)` when its transaction is open there already,
    /// `Some(Some(guard))` when the coordinator must be asked, `None` when this broker
    /// does not lead the partition (the append will say so).
    pub fn txn_guard(
        &self,
        topic: &str,
        index: i32,
        producer_id: i64,
        epoch: i16,
    ) -> Option<Option<u64>> {
        match self.route(topic, index) {
            Route::Leader(p) => p.txn_guard(producer_id, epoch),
            _ => None,
        }
    }

    fn append_inner(
        &self,
        topic: &str,
        index: i32,
        records: bytes::Bytes,
        acks: i16,
        verified: Option<crate::log::TxnVerified>,
        now_ms: i64,
    ) -> Result<PendingAppend, ProduceError> {
        if crate::group::manager::is_internal(topic) {
            return Err(ProduceError::InternalTopic(topic.to_string()));
        }
        let partition = match self.route(topic, index) {
            Route::Leader(p) => p,
            Route::NotLeader => {
                let leader = self
                    .topic(topic)
                    .and_then(|t| t.layout.get(index as usize).and_then(|l| l.leader));
                return Err(ProduceError::NotLeader {
                    topic: topic.to_string(),
                    partition: index,
                    leader,
                });
            }
            Route::UnknownTopicOrPartition => {
                return Err(ProduceError::UnknownTopicOrPartition {
                    topic: topic.to_string(),
                    partition: index,
                })
            }
        };
        let batch = crate::log::ValidBatch::new(records).inspect_err(|e| {
            tracing::debug!(topic, partition = index, error = %e, "refused produced batch");
        })?;
        let (batch, log_append_time) = partition.check_records(batch, now_ms).map_err(|error| {
            tracing::debug!(topic, partition = index, %error, "refused produced records");
            ProduceError::Records {
                topic: topic.to_string(),
                partition: index,
                error,
            }
        })?;
        let (appended, epoch) = partition
            .append_verified(&batch, acks, verified, now_ms)
            .map_err(|e| match e {
                partition::LeaderAppendError::NotLeader => ProduceError::NotLeader {
                    topic: topic.to_string(),
                    partition: index,
                    leader: None,
                },
                partition::LeaderAppendError::AcksTooWeak { min_acks } => {
                    ProduceError::AcksTooWeak {
                        topic: topic.to_string(),
                        acks,
                        required: if min_acks == -1 {
                            "all".into()
                        } else {
                            min_acks.to_string()
                        },
                    }
                }
                partition::LeaderAppendError::NotEnoughReplicas(n) => {
                    ProduceError::NotEnoughReplicas(format!("{topic}-{index}: {n}"))
                }
                partition::LeaderAppendError::Append(e) => {
                    if let crate::log::AppendError::Io(io) = &e {
                        tracing::error!(topic, partition = index, error = %e, "append failed");
                        if let Some(cluster) = &self.cluster {
                            cluster.storage_error(io);
                        }
                    }
                    ProduceError::Append(e)
                }
            })?;
        let progress = partition.progress();
        Ok(PendingAppend {
            records: if appended.duplicate {
                0
            } else {
                u64::from(batch.header().record_count.max(0) as u32)
            },
            bytes: if appended.duplicate {
                0
            } else {
                batch.len() as u64
            },
            base_offset: appended.base_offset,
            log_append_time,
            durable_at: (acks == -1).then_some((appended.last_offset + 1, epoch)),
            log_start: progress.log_start,
            appended_at: std::time::Instant::now(),
            leading: self.cluster.clone(),
            partition,
        })
    }

    /// Compares a client's view of a partition's leader epoch with this broker's (Kafka's
    /// `current_leader_epoch`; negative means the client did not say).
    pub fn leader_epoch_check(&self, topic: &str, index: i32, requested: i32) -> EpochCheck {
        if requested < 0 {
            return EpochCheck::Current;
        }
        let current = self
            .topic(topic)
            .and_then(|t| t.layout.get(index as usize).map(|l| l.leader_epoch));
        match current {
            Some(c) if requested < c => EpochCheck::Fenced,
            Some(c) if requested > c => EpochCheck::Unknown,
            _ => EpochCheck::Current,
        }
    }

    /// Where requests for a partition go: here if this broker leads it.
    pub fn route(&self, topic: &str, index: i32) -> Route {
        let Some(t) = self.topic(topic) else {
            return Route::UnknownTopicOrPartition;
        };
        let Some(i) = usize::try_from(index).ok().filter(|i| *i < t.layout.len()) else {
            return Route::UnknownTopicOrPartition;
        };
        match (&t.partitions[i], t.layout[i].leader) {
            (Some(p), Some(leader)) if leader == self.config.node_id && self.holds_lease() => {
                Route::Leader(p.clone())
            }
            _ => Route::NotLeader,
        }
    }

    /// This broker's replica of a partition another broker leads, for a consumer fetching
    /// from a follower (KIP-392): it serves what is below its own high watermark, which is
    /// committed. `None` when the partition is not held here, or led here.
    pub fn follower_replica(&self, topic: &str, index: i32) -> Option<Arc<Partition>> {
        let t = self.topic(topic)?;
        let i = usize::try_from(index).ok()?;
        let layout = t.layout.get(i)?;
        let me = self.config.node_id;
        (layout.leader != Some(me) && layout.replicas.contains(&me))
            .then(|| t.partitions.get(i)?.clone())
            .flatten()
    }

    /// The replica a consumer in `rack` should fetch this partition from instead of this
    /// broker, its leader (KIP-392): with the rack-aware selector, when this broker is not
    /// in that rack, the lowest-numbered in-sync, unfenced follower that is. `None`: read
    /// here.
    pub fn preferred_read_replica(&self, topic: &str, index: i32, rack: &str) -> Option<i32> {
        if rack.is_empty()
            || self.config.replica_selector != crate::config::ReplicaSelector::RackAware
        {
            return None;
        }
        let link = self.cluster.as_ref()?;
        let metadata = link.metadata().borrow().clone();
        let me = self.config.node_id;
        let rack_of = |id: i32| {
            metadata
                .brokers
                .get(&id)
                .filter(|b| !b.fenced)
                .and_then(|b| b.rack.as_deref())
        };
        if rack_of(me) == Some(rack) {
            return None;
        }
        let t = self.topic(topic)?;
        let layout = t.layout.get(usize::try_from(index).ok()?)?;
        layout
            .isr
            .iter()
            .copied()
            .filter(|&id| id != me && rack_of(id) == Some(rack))
            .min()
    }

    /// Whether this broker may act as the leader of the partitions the metadata gives it:
    /// always on a single node without controllers; in a cluster, while its lease holds
    /// (`ClusterLink::holds_lease`). A broker cut off from the controllers for longer than
    /// its lease answers NOT_LEADER_OR_FOLLOWER and names no leader for its partitions,
    /// before the controllers elect other leaders for them.
    pub fn holds_lease(&self) -> bool {
        self.cluster.as_ref().is_none_or(|link| link.holds_lease())
    }

    /// All topics, sorted by name.
    pub fn topics(&self) -> Vec<Arc<Topic>> {
        let mut all: Vec<_> = self
            .topics
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        all.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
        all
    }

    fn partition_dir(&self, topic: &str, index: u32) -> PathBuf {
        self.config
            .data_dir
            .join("logs")
            .join(format!("{topic}-{index}"))
    }

    /// The dynamic configs this broker has in the metadata: its own and the cluster-wide
    /// defaults (none without controllers).
    pub fn dynamic_broker_configs(&self) -> (DynamicLayer, DynamicLayer) {
        (
            self.dynamic_layer(&ConfigScope::Broker(self.config.node_id)),
            self.dynamic_layer(&ConfigScope::ClusterDefault),
        )
    }

    /// The dynamic configs set at `scope` in this broker's metadata (none without
    /// controllers).
    pub fn dynamic_layer(&self, scope: &ConfigScope) -> DynamicLayer {
        self.cluster
            .as_ref()
            .and_then(|link| {
                link.metadata()
                    .borrow()
                    .dynamic_configs
                    .layer(scope)
                    .cloned()
            })
            .unwrap_or_default()
    }

    /// The topic defaults on this broker, strongest first: its own dynamic ones, the
    /// cluster's dynamic ones, the static `[topics.defaults]` (topic config names).
    pub fn topic_default_layers(&self) -> [(ConfigSource, BTreeMap<String, String>); 3] {
        use strata_core::dynamic_config::topic_defaults;
        let (own, cluster) = self.dynamic_broker_configs();
        [
            (ConfigSource::DynamicBroker, topic_defaults(&own)),
            (ConfigSource::DynamicDefault, topic_defaults(&cluster)),
            (ConfigSource::Broker, self.config.topic_defaults.clone()),
        ]
    }

    /// The effective log config of a topic: its overrides over the broker defaults.
    pub fn log_config(
        &self,
        overrides: &BTreeMap<String, String>,
    ) -> Result<LogConfig, ConfigError> {
        let mut merged = BTreeMap::new();
        for (_, layer) in self.topic_default_layers().into_iter().rev() {
            merged.extend(layer);
        }
        merged.extend(overrides.iter().map(|(k, v)| (k.clone(), v.clone())));
        LogConfig::from_map(&merged)
    }

    /// Every topic config with its effective value and where that comes from.
    pub fn describe_configs(&self, spec: &TopicSpec) -> Vec<(String, String, ConfigSource)> {
        let layers = self.topic_default_layers();
        crate::log::config::TOPIC_CONFIG_KEYS
            .iter()
            .map(|(key, default)| {
                let (value, source) = spec
                    .configs
                    .get(*key)
                    .map(|v| (v.clone(), ConfigSource::Topic))
                    .or_else(|| {
                        layers
                            .iter()
                            .find_map(|(source, l)| Some((l.get(*key)?.clone(), *source)))
                    })
                    .unwrap_or_else(|| (default.to_string(), ConfigSource::Default));
                (key.to_string(), value, source)
            })
            .collect()
    }

    /// Removes, then sets, dynamic configs at `scope` (Kafka's BROKER and GROUP config
    /// resources), checked here first so a refusal names its reason exactly; waits until
    /// this broker's metadata has the change.
    pub async fn alter_dynamic_configs(
        &self,
        scope: &ConfigScope,
        set: BTreeMap<String, String>,
        remove: Vec<String>,
        validate_only: bool,
    ) -> Result<(), DynamicConfigError> {
        let Some(link) = &self.cluster else {
            return Err(DynamicConfigError::Invalid(
                "dynamic configs live in the metadata log: this broker runs without \
                 controllers"
                    .into(),
            ));
        };
        strata_core::dynamic_config::check_names(&scope.core(), &set)?;
        let mut layer = self.dynamic_layer(scope);
        for k in &remove {
            layer.remove(k);
        }
        layer.extend(set.clone());
        strata_core::dynamic_config::check_layer(&scope.core(), &layer)?;
        if validate_only {
            return Ok(());
        }
        let version = link
            .alter_dynamic_configs(scope, &set, &remove)
            .await
            .map_err(|e| {
                DynamicConfigError::Invalid(format!(
                    "the controllers refused the change: {}",
                    e.message()
                ))
            })?;
        self.wait_for_metadata(version).await;
        Ok(())
    }

    async fn open_topic(&self, spec: TopicSpec) -> io::Result<Arc<Topic>> {
        let config = self.log_config(&spec.configs).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("topic '{}': {e}", spec.name),
            )
        })?;
        let now = self.clock.now_ms();
        let dirs: Vec<PathBuf> = (0..spec.partitions)
            .map(|p| self.partition_dir(&spec.name, p))
            .collect();
        let name = spec.name.clone();
        let logs = tokio::task::spawn_blocking(move || {
            dirs.iter()
                .map(|dir| {
                    let (log, report) = PartitionLog::open(dir, config.clone(), now)?;
                    if report.truncated.is_some() || report.scanned_segments > 0 {
                        tracing::info!(dir = %dir.display(), clean = report.clean, scanned = report.scanned_segments, truncated = report.truncated.is_some(), "recovered partition log");
                    }
                    Ok(log)
                })
                .collect::<io::Result<Vec<_>>>()
        })
        .await
        .map_err(io::Error::other)??;
        let topic_name: Arc<str> = Arc::from(name.as_str());
        let node = self.config.node_id;
        let partitions = logs
            .into_iter()
            .enumerate()
            .map(|(i, log)| {
                Some(Partition::start_standalone(
                    topic_name.clone(),
                    i as i32,
                    log,
                    node,
                ))
            })
            .collect();
        let layout = (0..spec.partitions)
            .map(|_| PartitionLayout {
                leader: Some(node),
                leader_epoch: 0,
                replicas: vec![node],
                isr: vec![node],
                adding: Vec::new(),
                removing: Vec::new(),
                throttle: None,
            })
            .collect();
        Ok(Arc::new(Topic {
            spec,
            partitions,
            layout,
        }))
    }

    /// Creates a topic. Creating one that exists with the same partition count and
    /// replication factor succeeds without change; a different spec is refused.
    pub async fn create_topic(
        &self,
        req: NewTopic,
        validate_only: bool,
    ) -> Result<TopicSpec, AdminError> {
        validate_topic_name(&req.name).map_err(AdminError::InvalidTopic)?;
        let partitions = req.partitions.unwrap_or(self.config.default_partitions);
        if partitions == 0 || partitions > MAX_PARTITIONS {
            return Err(AdminError::InvalidPartitions(format!(
                "partition count {partitions} is invalid; it must be between 1 and {MAX_PARTITIONS}"
            )));
        }
        let rf = req.replication_factor.unwrap_or(1);
        if !req.assignments.is_empty() {
            let alone = self.config.node_id;
            if self.cluster.is_none() && req.assignments.iter().flatten().any(|b| *b != alone) {
                return Err(AdminError::InvalidReplicaAssignment(format!(
                    "replica assignments may only name broker {alone}"
                )));
            }
        }
        let available = match &self.cluster {
            Some(link) => link.metadata().borrow().live_brokers().len(),
            None => 1,
        };
        if rf == 0 || usize::from(rf) > available {
            return Err(AdminError::InvalidReplicationFactor(format!(
                "replication factor {rf} is invalid: {available} broker(s) available"
            )));
        }
        self.log_config(&req.configs)?;
        if let Some(link) = &self.cluster {
            return self
                .create_topic_in_cluster(link, req, partitions, rf, validate_only)
                .await;
        }
        let mut store = self.store.lock().await;
        if let Some(existing) = self.topic(&req.name) {
            let s = &existing.spec;
            if s.partitions == partitions && s.replication_factor == rf {
                return Ok(s.clone());
            }
            return Err(AdminError::TopicExists(format!(
                "topic '{}' already exists with {} partitions and replication factor {}; \
                 refusing to change it to {partitions} and {rf}",
                s.name, s.partitions, s.replication_factor
            )));
        }
        let spec = TopicSpec {
            name: req.name,
            id: Uuid::new_v4(),
            partitions,
            replication_factor: rf,
            configs: req.configs,
        };
        if validate_only {
            return Ok(spec);
        }
        store.insert(spec.clone())?;
        let topic = self.open_topic(spec.clone()).await?;
        self.topics_write().insert(spec.name.clone(), topic);
        self.layout_changed();
        tracing::info!(topic = %spec.name, partitions, "created topic");
        Ok(spec)
    }

    async fn create_topic_in_cluster(
        &self,
        link: &ClusterLink,
        req: NewTopic,
        partitions: u32,
        rf: u16,
        validate_only: bool,
    ) -> Result<TopicSpec, AdminError> {
        if let Some(existing) = self.topic(&req.name) {
            let s = &existing.spec;
            if s.partitions != partitions || s.replication_factor != rf {
                return Err(AdminError::TopicExists(format!(
                    "topic '{}' already exists with {} partitions and replication factor {}; \
                     refusing to change it to {partitions} and {rf}",
                    s.name, s.partitions, s.replication_factor
                )));
            }
        }
        if validate_only {
            return Ok(TopicSpec {
                name: req.name,
                id: Uuid::nil(),
                partitions,
                replication_factor: rf,
                configs: req.configs,
            });
        }
        let created = link
            .create_topic(&req.name, partitions, rf, &req.configs, &req.assignments)
            .await
            .map_err(|e| match e.code() {
                tonic::Code::AlreadyExists => AdminError::TopicExists(e.message().to_string()),
                // with an assignment, what the controllers refuse is the assignment
                tonic::Code::InvalidArgument if !req.assignments.is_empty() => {
                    AdminError::InvalidReplicaAssignment(e.message().to_string())
                }
                tonic::Code::InvalidArgument => {
                    AdminError::InvalidReplicationFactor(e.message().to_string())
                }
                _ => AdminError::Io(io::Error::other(format!(
                    "the controllers did not create the topic: {}",
                    e.message()
                ))),
            })?;
        // Answer once this broker's metadata shows the topic, so the client's next Metadata
        // request (to this broker) sees it.
        self.wait_for_metadata(created.version).await;
        let id = Uuid::parse_str(&created.topic_id).unwrap_or_default();
        Ok(TopicSpec {
            name: req.name,
            id,
            partitions,
            replication_factor: rf,
            configs: req.configs,
        })
    }

    /// Deletes a topic and its data.
    pub async fn delete_topic(&self, name: &str) -> Result<(), AdminError> {
        if crate::group::manager::is_internal(name) {
            return Err(AdminError::InvalidTopic(format!(
                "internal topic {name} cannot be deleted"
            )));
        }
        if let Some(link) = &self.cluster {
            if self.topic(name).is_none() {
                return Err(AdminError::UnknownTopic(name.to_string()));
            }
            return link.delete_topic(name).await.map_err(|e| match e.code() {
                tonic::Code::NotFound => AdminError::UnknownTopic(name.to_string()),
                _ => AdminError::Io(io::Error::other(format!(
                    "the controllers did not delete the topic: {}",
                    e.message()
                ))),
            });
        }
        let mut store = self.store.lock().await;
        let Some(topic) = self.topics_write().remove(name) else {
            return Err(AdminError::UnknownTopic(name.to_string()));
        };
        self.layout_changed();
        for p in topic.local() {
            p.stop();
        }
        store.remove(name)?;
        let dirs: Vec<PathBuf> = (0..topic.spec.partitions)
            .map(|p| self.partition_dir(name, p))
            .collect();
        let id = topic.spec.id.simple().to_string();
        tokio::task::spawn_blocking(move || {
            for dir in dirs {
                let doomed = PathBuf::from(format!("{}.{id}.deleted", dir.display()));
                let result = fs::rename(&dir, &doomed).and_then(|()| fs::remove_dir_all(&doomed));
                if let Err(e) = result {
                    tracing::warn!(dir = %dir.display(), error = %e, "could not remove deleted partition data");
                }
            }
        })
        .await
        .map_err(io::Error::other)?;
        tracing::info!(topic = name, "deleted topic");
        Ok(())
    }

    /// Sets and removes topic config overrides (Kafka's IncrementalAlterConfigs).
    pub async fn alter_topic_configs(
        &self,
        name: &str,
        set: BTreeMap<String, String>,
        remove: Vec<String>,
        validate_only: bool,
    ) -> Result<(), AdminError> {
        let topic = self
            .topic(name)
            .ok_or_else(|| AdminError::UnknownTopic(name.to_string()))?;
        let mut configs = topic.spec.configs.clone();
        for k in &remove {
            configs.remove(k);
        }
        configs.extend(set.clone());
        let config = self.log_config(&configs)?;
        if validate_only {
            return Ok(());
        }
        if let Some(link) = &self.cluster {
            let version = link
                .alter_topic_configs(name, &set, &remove)
                .await
                .map_err(|e| controller_error(name, e))?;
            self.wait_for_metadata(version).await;
            return Ok(());
        }
        let mut store = self.store.lock().await;
        let mut spec = topic.spec.clone();
        spec.configs = configs;
        store.insert(spec.clone())?;
        for p in topic.local() {
            p.set_config(config.clone(), self.replica_lag_ms());
        }
        let updated = Topic {
            spec,
            partitions: topic.partitions.clone(),
            layout: topic.layout.clone(),
        };
        self.topics_write()
            .insert(name.to_string(), Arc::new(updated));
        tracing::info!(topic = name, "altered topic configs");
        Ok(())
    }

    /// Grows a topic to `total` partitions (Kafka's CreatePartitions); `assignments`: the new
    /// partitions' replicas, the preferred leader first (empty: placed by the controllers).
    pub async fn create_partitions(
        &self,
        name: &str,
        total: u32,
        assignments: &[Vec<i32>],
        validate_only: bool,
    ) -> Result<(), AdminError> {
        let topic = self
            .topic(name)
            .ok_or_else(|| AdminError::UnknownTopic(name.to_string()))?;
        let current = topic.spec.partitions;
        if total <= current || total > MAX_PARTITIONS {
            return Err(AdminError::InvalidPartitions(format!(
                "topic '{name}' has {current} partitions; the new count {total} must be larger (at most {MAX_PARTITIONS})"
            )));
        }
        if !assignments.is_empty() {
            let invalid = |why: String| {
                Err(AdminError::InvalidReplicaAssignment(format!(
                    "topic '{name}': {why}"
                )))
            };
            if assignments.len() as u32 != total - current {
                return invalid(format!(
                    "{} assignments for {} new partitions",
                    assignments.len(),
                    total - current
                ));
            }
            let alone = self.config.node_id;
            if self.cluster.is_none() && assignments.iter().flatten().any(|b| *b != alone) {
                return invalid(format!("replica assignments may only name broker {alone}"));
            }
        }
        if validate_only {
            return Ok(());
        }
        if let Some(link) = &self.cluster {
            let version = link
                .create_partitions(name, total, assignments)
                .await
                .map_err(|e| match e.code() {
                    // with an assignment, what the controllers refuse is the assignment
                    tonic::Code::InvalidArgument if !assignments.is_empty() => {
                        AdminError::InvalidReplicaAssignment(e.message().to_string())
                    }
                    _ => controller_error(name, e),
                })?;
            self.wait_for_metadata(version).await;
            return Ok(());
        }
        let mut store = self.store.lock().await;
        let mut spec = topic.spec.clone();
        spec.partitions = total;
        let grown = self.open_topic(spec.clone()).await?;
        store.insert(spec)?;
        // Keep the partitions already open; the new ones come from `grown`.
        let partitions = grown
            .partitions
            .iter()
            .enumerate()
            .map(|(i, p)| {
                topic
                    .partitions
                    .get(i)
                    .cloned()
                    .flatten()
                    .or_else(|| p.clone())
            })
            .collect();
        for p in grown.partitions.iter().take(current as usize).flatten() {
            p.stop();
        }
        let updated = Topic {
            spec: grown.spec.clone(),
            partitions,
            layout: grown.layout.clone(),
        };
        self.topics_write()
            .insert(name.to_string(), Arc::new(updated));
        self.layout_changed();
        tracing::info!(topic = name, from = current, to = total, "added partitions");
        Ok(())
    }

    /// In cluster mode, waits until this broker is registered, unfenced, and its topics
    /// reflect the metadata that says so; a broker serves nothing before that.
    /// Registered under the link's current epoch, not fenced, and every metadata version
    /// the link has received applied here.
    fn registered(&self, link: &ClusterLink) -> bool {
        link.epoch().is_some_and(|epoch| {
            let m = link.metadata().borrow().clone();
            m.brokers
                .get(&self.config.node_id)
                .is_some_and(|b| b.epoch == epoch && !b.fenced)
                && *self.metadata_version.borrow() >= m.version
        })
    }

    /// Whether this broker serves current data (`/readyz`): registered and unfenced with
    /// its metadata applied, and no partition still opening; otherwise why not.
    pub fn readiness(&self) -> Result<(), String> {
        if let Some(link) = &self.cluster {
            if !self.registered(link) {
                return Err(
                    "the broker is not registered with the controllers, is fenced, or is still applying their metadata"
                        .into(),
                );
            }
        }
        let opening = self.opening.lock().unwrap_or_else(|e| e.into_inner()).len();
        if opening > 0 {
            return Err(format!(
                "{opening} partition replicas are still opening (recovering their logs)"
            ));
        }
        Ok(())
    }

    pub async fn wait_until_registered(&self, timeout: std::time::Duration) -> io::Result<()> {
        let Some(link) = &self.cluster else {
            return Ok(());
        };
        let id = self.config.node_id;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut applied = self.metadata_version.subscribe();
        loop {
            if self.registered(link) {
                return Ok(());
            }
            let wait = tokio::time::sleep(std::time::Duration::from_millis(50));
            tokio::select! {
                _ = wait => {}
                _ = applied.changed() => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("broker {id} did not register with the controllers within {timeout:?}; are they running and reachable?"),
                ));
            }
        }
    }

    /// Kafka's ElectLeaders (`partitions` `None`: every partition): in a cluster through the
    /// controllers, answered once this broker's metadata shows the elections; a single
    /// broker leads every partition already. Each partition's (topic, partition, Kafka
    /// error code, message).
    pub async fn elect_leaders(
        &self,
        unclean: bool,
        partitions: Option<Vec<(String, u32)>>,
    ) -> Result<Vec<(String, u32, i16, String)>, tonic::Status> {
        if let Some(link) = &self.cluster {
            let (results, version) = link.elect_leaders(unclean, partitions).await?;
            self.wait_for_metadata(version).await;
            return Ok(results);
        }
        // (Every partition asked for: none needs an election, and those are left out.)
        Ok(partitions
            .unwrap_or_default()
            .into_iter()
            .map(|(topic, partition)| {
                let known = self
                    .topic(&topic)
                    .is_some_and(|t| partition < t.spec.partitions);
                let (code, message) = if known {
                    (84, "its only replica leads it".to_string())
                } else {
                    (3, format!("{topic}-{partition} does not exist"))
                };
                (topic, partition, code, message)
            })
            .collect())
    }

    /// Kafka's AlterPartitionReassignments: in a cluster through the controllers, answered
    /// once this broker's metadata shows the changes. A single broker has nowhere to move a
    /// partition. Each move's (topic, partition, Kafka error code, message).
    pub async fn reassign_partitions(
        &self,
        moves: Vec<strata_proto::v1::PartitionMove>,
    ) -> Result<Vec<(String, u32, i16, String)>, tonic::Status> {
        if let Some(link) = &self.cluster {
            let (results, version) = link.reassign_partitions(moves).await?;
            self.wait_for_metadata(version).await;
            return Ok(results);
        }
        let node = self.config.node_id;
        Ok(moves
            .into_iter()
            .map(|m| {
                let known = self
                    .topic(&m.topic)
                    .is_some_and(|t| m.partition < t.spec.partitions);
                let (code, message) = if !known {
                    (3, format!("{}-{} does not exist", m.topic, m.partition))
                } else if m.cancel {
                    (85, format!("{}-{} is not being reassigned", m.topic, m.partition))
                } else if m.replicas == [node] {
                    (0, String::new())
                } else {
                    (
                        39,
                        format!("this single broker is broker {node}; there is nowhere else to move a partition"),
                    )
                };
                (m.topic, m.partition, code, message)
            })
            .collect())
    }

    /// Waits (bounded) until this broker's topics reflect metadata `version`.
    async fn wait_for_metadata(&self, version: u64) {
        let mut applied = self.metadata_version.subscribe();
        let wait = applied.wait_for(|v| *v >= version);
        if tokio::time::timeout(std::time::Duration::from_secs(10), wait)
            .await
            .is_err()
        {
            tracing::warn!(
                version,
                "the controllers applied a change this broker has not seen yet"
            );
        }
    }

    /// Hands out a new producer id, reserving blocks durably so ids never repeat.
    pub async fn allocate_producer_id(&self) -> io::Result<i64> {
        {
            let mut ids = self.producer_ids.lock().unwrap_or_else(|e| e.into_inner());
            if ids.0 < ids.1 {
                ids.0 += 1;
                return Ok(ids.0 - 1);
            }
        }
        let mut store = self.store.lock().await;
        let exhausted = {
            let ids = self.producer_ids.lock().unwrap_or_else(|e| e.into_inner());
            ids.0 >= ids.1
        };
        if exhausted {
            let first = match &self.cluster {
                Some(link) => link
                    .allocate_producer_ids(PRODUCER_ID_BLOCK as u32)
                    .await
                    .map_err(|e| {
                        io::Error::other(format!(
                            "the controllers gave no producer ids: {}",
                            e.message()
                        ))
                    })?,
                None => store.reserve_producer_ids(PRODUCER_ID_BLOCK)?,
            };
            *self.producer_ids.lock().unwrap_or_else(|e| e.into_inner()) =
                (first, first + PRODUCER_ID_BLOCK);
        }
        let mut ids = self.producer_ids.lock().unwrap_or_else(|e| e.into_inner());
        ids.0 += 1;
        Ok(ids.0 - 1)
    }

    /// Runs retention over every partition every `retention_check_interval`, until the
    /// broker is dropped.
    pub fn spawn_retention(self: &Arc<Self>) {
        let every = self.config.retention_check_interval;
        self.spawn_every(every, "retention", |_| true, |broker, partitions| {
            let now = broker.clock.now_ms();
            let expiration = broker.config.producer_id_expiration.as_millis() as i64;
            let (mut expired, mut remaining) = (0, 0);
            for p in partitions {
                if let Err(e) = p.apply_retention(now) {
                    tracing::warn!(topic = %p.topic, partition = p.index, error = %e, "retention failed; will retry");
                }
                let (gone, left) = p.expire_producers(now, expiration);
                expired += gone as u64;
                remaining += left as u64;
            }
            let m = broker.metrics();
            m.producer_ids.store(remaining, std::sync::atomic::Ordering::Relaxed);
            m.producer_ids_expired
                .fetch_add(expired, std::sync::atomic::Ordering::Relaxed);
            if expired > 0 {
                tracing::debug!(expired, remaining, "expired silent producer ids");
            }
        });
    }

    /// Compacts the local logs of compacted topics that are not tiered, one partition at a
    /// time (Kafka's single log-cleaner thread), every `compaction_check_interval`.
    pub fn spawn_compaction(self: &Arc<Self>) {
        let every = self.config.compaction_check_interval;
        let map_bytes = self.config.compaction_map_bytes;
        let wanted = |p: &Partition| {
            let c = p.log_config();
            c.compacted() && !c.remote_storage
        };
        self.spawn_every(every, "compaction", wanted, move |broker, partitions| {
            use std::sync::atomic::Ordering::Relaxed;
            let m = broker.metrics();
            for p in partitions {
                match p.compact(broker.clock.now_ms(), map_bytes) {
                    Ok(None) => {}
                    Ok(Some(r)) => {
                        m.compactions.fetch_add(1, Relaxed);
                        m.compaction_records_removed
                            .fetch_add(r.records_removed, Relaxed);
                        m.compaction_bytes_removed
                            .fetch_add(r.bytes_before.saturating_sub(r.bytes_after), Relaxed);
                        tracing::info!(topic = %p.topic, partition = p.index, segments = r.segments_rewritten, records_removed = r.records_removed, bytes_before = r.bytes_before, bytes_after = r.bytes_after, keys = r.keys, compacted_to = r.dirty_end, given_up = r.given_up, "compacted the local log");
                    }
                    Err(e) => {
                        m.compaction_errors.fetch_add(1, Relaxed);
                        tracing::warn!(topic = %p.topic, partition = p.index, error = %e, "compaction failed; will retry");
                    }
                }
            }
        });
    }

    /// Every `every` (the first time one interval from now), while the broker lives, runs
    /// `work` on the blocking pool over this broker's local partitions that `wanted` picks
    /// (none at all is fine); `what` names it in the log should it panic.
    fn spawn_every(
        self: &Arc<Self>,
        every: std::time::Duration,
        what: &'static str,
        wanted: fn(&Partition) -> bool,
        work: impl Fn(&Arc<Broker>, Vec<Arc<Partition>>) + Send + Sync + 'static,
    ) {
        let weak = Arc::downgrade(self);
        let work = Arc::new(work);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(broker) = weak.upgrade() else { return };
                let partitions: Vec<_> = broker
                    .topics()
                    .iter()
                    .flat_map(|t| t.local().cloned().collect::<Vec<_>>())
                    .filter(|p| wanted(p))
                    .collect();
                let work = work.clone();
                let result = tokio::task::spawn_blocking(move || work(&broker, partitions)).await;
                if let Err(e) = result {
                    tracing::error!(error = %e, task = what, "periodic task panicked");
                }
            }
        });
    }

    /// Closes every partition cleanly so the next start skips recovery.
    pub fn shutdown(&self) {
        for topic in self.topics() {
            for p in topic.local() {
                if let Err(e) = p.close() {
                    tracing::error!(topic = %p.topic, partition = p.index, error = %e, "clean close failed; the next start will recover this partition");
                }
            }
        }
    }

    fn warn_orphans(&self, logs: &Path) -> io::Result<()> {
        let topics = self.topics();
        for entry in fs::read_dir(logs)? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            let known = topics.iter().any(|t| {
                name.strip_prefix(&t.spec.name)
                    .and_then(|rest| rest.strip_prefix('-'))
                    .and_then(|p| p.parse::<u32>().ok())
                    .is_some_and(|p| p < t.spec.partitions)
            });
            if !known {
                tracing::warn!(dir = %logs.join(&name).display(), "partition directory belongs to no topic; left in place");
            }
        }
        Ok(())
    }
}

/// Maps a controller's refusal of a topic change to the admin error Kafka clients expect.
fn controller_error(topic: &str, e: tonic::Status) -> AdminError {
    match e.code() {
        tonic::Code::NotFound => AdminError::UnknownTopic(topic.to_string()),
        tonic::Code::InvalidArgument => AdminError::InvalidPartitions(e.message().to_string()),
        _ => AdminError::Io(io::Error::other(format!(
            "the controllers refused the change: {}",
            e.message()
        ))),
    }
}

/// Where a described config value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigSource {
    Topic,
    /// This broker's dynamic config (metadata log).
    DynamicBroker,
    /// The cluster-wide dynamic default (metadata log).
    DynamicDefault,
    /// The static `[topics.defaults]` of the config file.
    Broker,
    Default,
}

/// One scope's dynamic configs, under Kafka's broker-level names.
pub type DynamicLayer = BTreeMap<String, String>;

fn remove_deleted_dirs(logs: &Path) -> io::Result<()> {
    for entry in fs::read_dir(logs)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "deleted") {
            fs::remove_dir_all(&path)?;
        }
    }
    Ok(())
}

/// The credentials of one metadata view (none without controllers).
pub struct MetadataCredentials(Option<Arc<strata_controller::metadata::ClusterMetadata>>);

impl crate::kafka::sasl::Credentials for MetadataCredentials {
    fn scram(
        &self,
        user: &str,
        mechanism: strata_controller::metadata::ScramMechanism,
    ) -> Option<strata_controller::metadata::ScramCredential> {
        self.0
            .as_ref()?
            .scram_credentials
            .get(user)?
            .get(&mechanism)
            .cloned()
    }

    /// Derived from the metadata's secret, with the iterations most of the real users of
    /// `mechanism` have (the CLI's default when there are none).
    fn stand_in(
        &self,
        user: &str,
        mechanism: strata_controller::metadata::ScramMechanism,
    ) -> strata_controller::metadata::ScramCredential {
        use crate::kafka::sasl::scram;
        let Some(m) = self.0.as_ref() else {
            return scram::stand_in(&[], mechanism, user, scram::DEFAULT_ITERATIONS);
        };
        let mut counts = BTreeMap::<u32, usize>::new();
        for c in m
            .scram_credentials
            .values()
            .filter_map(|u| u.get(&mechanism))
        {
            *counts.entry(c.iterations).or_default() += 1;
        }
        let iterations = counts
            .into_iter()
            .max_by_key(|(iterations, n)| (*n, *iterations))
            .map_or(scram::DEFAULT_ITERATIONS, |(iterations, _)| iterations);
        scram::stand_in(m.scram_mock_key(), mechanism, user, iterations)
    }
}
