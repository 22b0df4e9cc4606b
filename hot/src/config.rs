//! The server configuration file (TOML), environment overrides, and validation into the
//! runtime structs. `strata.example.toml` at the repository root documents every field.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::broker::BrokerConfig;
use crate::kafka::ListenerConfig;
use crate::log::LogConfig;

/// Environment variables with this prefix override the file: `STRATA__KAFKA__LISTEN=...`
/// sets `[kafka] listen`; path segments are separated by `__` and lower-cased.
pub const ENV_PREFIX: &str = "STRATA__";

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Which roles this process runs: "broker", "controller", or both (combined mode).
    pub roles: Vec<Role>,
    pub node_id: i32,
    pub data_dir: PathBuf,
    pub kafka: KafkaSection,
    pub topics: TopicsSection,
    pub groups: GroupsSection,
    pub transactions: TransactionsSection,
    /// The cold tier; absent: no tiering (`strata dev` uses `<data_dir>/cold`).
    pub cold: Option<ColdSection>,
    pub controller: Option<ControllerSection>,
    /// Where the controllers are, for a broker in a cluster; absent for a single node.
    pub cluster: Option<ClusterSection>,
    /// The broker's native gRPC data plane; absent: not served.
    pub grpc: Option<GrpcSection>,
    /// The Prometheus endpoint (`GET /metrics`); absent: not served.
    pub metrics: Option<MetricsSection>,
    /// Authorization of Kafka requests by ACLs (docs/security.md).
    pub auth: AuthSection,
    /// mTLS on every gRPC port this node serves or calls (Raft, controller API, broker
    /// data plane, replication); absent: plaintext, open to whoever reaches the ports.
    pub tls: Option<GrpcTlsSection>,
    /// SCRAM users (name, password) the embedded controller creates when missing: the
    /// `admin` of `strata dev --secure`. Never read from a file.
    #[serde(skip)]
    pub bootstrap_users: Vec<(String, String)>,
}

/// `[tls]`: the cluster CA and this node's certificate. A broker's certificate must name it
/// `CN=broker-<node_id>`, a controller's `CN=controller-<id>` (docs/security.md).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GrpcTlsSection {
    /// PEM CA certificate(s) that sign every node's and client's certificate.
    pub ca: PathBuf,
    /// PEM certificate chain of this node.
    pub cert: PathBuf,
    /// PEM private key; refused when other users may read it.
    pub key: PathBuf,
}

/// `[auth]`: Kafka's `super.users` and `allow.everyone.if.no.acl.found`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSection {
    /// Principals that may do anything, e.g. ["User:admin", "User:CN=ops,O=Funds"].
    pub super_users: Vec<String>,
    /// Whether a resource no ACL names is open to everyone. Default: true while no listener
    /// authenticates its clients, false once one does (SASL, or TLS client certificates).
    pub allow_everyone_if_no_acl_found: Option<bool>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSection {
    pub listen: SocketAddr,
    /// Serve `/metrics` over HTTPS with this certificate and key.
    pub tls: Option<MetricsTls>,
    /// Require HTTP basic authentication (what Prometheus's `basic_auth` sends).
    pub basic_auth: Option<BasicAuthSection>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsTls {
    pub cert: PathBuf,
    /// Refused when other users may read it.
    pub key: PathBuf,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BasicAuthSection {
    pub user: String,
    /// A file whose first line is the password; refused when other users may read it.
    pub password_file: PathBuf,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GrpcSection {
    pub listen: SocketAddr,
    /// Connections the port keeps open at most; more wait until one closes.
    #[serde(default = "default_grpc_max_connections")]
    pub max_connections: usize,
    /// A connection that sends nothing for this long is closed (live peers answer the
    /// server's keepalive pings every 5 s).
    #[serde(
        default = "default_grpc_idle_timeout",
        deserialize_with = "duration",
        serialize_with = "show_duration"
    )]
    pub idle_timeout: Duration,
}

fn default_grpc_max_connections() -> usize {
    strata_controller::incoming::DEFAULT_MAX_CONNECTIONS
}

fn default_grpc_idle_timeout() -> Duration {
    strata_controller::incoming::DEFAULT_IDLE_TIMEOUT
}

/// A gRPC port's connection limits, checked.
fn grpc_limits(
    section: &str,
    max_connections: usize,
    idle_timeout: Duration,
) -> anyhow::Result<strata_controller::incoming::ConnectionLimits> {
    if max_connections == 0 {
        anyhow::bail!("{section}.max_connections must be at least 1");
    }
    // Live peers answer a keepalive ping within 10 s of going silent (5 s, then 5 s for the
    // answer): a shorter idle timeout would close them.
    if idle_timeout < Duration::from_secs(15) {
        anyhow::bail!(
            "{section}.idle_timeout must be at least 15s (gRPC keepalive pings a silent peer after 5 s and waits 5 s for its answer), not {idle_timeout:?}"
        );
    }
    Ok(strata_controller::incoming::ConnectionLimits {
        max_connections,
        idle_timeout,
    })
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    /// Controller gRPC addresses; any of them will do.
    pub controllers: Vec<String>,
    /// This broker's rack, for rack-aware placement.
    pub rack: Option<String>,
    /// The cluster id Kafka clients see; give every broker the same.
    #[serde(default = "default_cluster_id")]
    pub cluster_id: String,
    /// A follower not caught up with its leader for this long leaves the ISR (Kafka's
    /// `replica.lag.time.max.ms`).
    #[serde(
        default = "default_replica_lag",
        deserialize_with = "duration",
        serialize_with = "show_duration"
    )]
    pub replica_lag_time_max: Duration,
    /// A replica whose log takes longer to open (recover) is reported stuck (an ERROR and
    /// `strata_partitions_stuck_opening`) and stays unavailable until the open finishes.
    #[serde(
        default = "default_replica_open_timeout",
        deserialize_with = "duration",
        serialize_with = "show_duration"
    )]
    pub replica_open_timeout: Duration,
    /// Which replica a consumer is told to fetch from (KIP-392, Kafka's
    /// `replica.selector.class`): `"leader"` (the default, as Kafka's) or `"rack-aware"`,
    /// an in-sync follower in the consumer's `client.rack` when the leader is elsewhere.
    #[serde(default)]
    pub replica_selector: ReplicaSelector,
}

/// Which replica a consumer fetches from (KIP-392).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReplicaSelector {
    /// Always the leader (Kafka without `replica.selector.class`).
    #[default]
    Leader,
    /// A follower in the consumer's rack, if one is in sync and the leader is not in that
    /// rack (Kafka's `RackAwareReplicaSelector`).
    RackAware,
}

fn default_replica_open_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_replica_lag() -> Duration {
    Duration::from_secs(30)
}

fn default_cluster_id() -> String {
    "strata".to_string()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Broker,
    Controller,
}

/// The metadata quorum member this process runs when `roles` includes "controller".
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ControllerSection {
    /// This controller's id among the voters.
    pub node_id: u64,
    /// Address of the controller's gRPC listener (Raft and the controller API).
    pub listen: SocketAddr,
    /// Every voter: id -> address, this one included, e.g. { 1 = "127.0.0.1:19301", ... }.
    pub voters: BTreeMap<String, String>,
    /// Brokers whose heartbeats stop for this long are fenced.
    #[serde(
        default = "default_broker_lease",
        deserialize_with = "duration",
        serialize_with = "show_duration"
    )]
    pub broker_lease: Duration,
    /// Raft heartbeat interval; elections time out after 3 to 6 of them.
    #[serde(
        default = "default_raft_heartbeat",
        deserialize_with = "duration",
        serialize_with = "show_duration"
    )]
    pub raft_heartbeat: Duration,
    /// Connections the controller's gRPC port keeps open at most; more wait.
    #[serde(default = "default_grpc_max_connections")]
    pub max_connections: usize,
    /// A connection to it that sends nothing for this long is closed.
    #[serde(
        default = "default_grpc_idle_timeout",
        deserialize_with = "duration",
        serialize_with = "show_duration"
    )]
    pub idle_timeout: Duration,
}

fn default_broker_lease() -> Duration {
    Duration::from_secs(6)
}

fn default_raft_heartbeat() -> Duration {
    Duration::from_millis(100)
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaSection {
    pub listen: SocketAddr,
    /// Host clients are told to connect to; defaults to the listen address's IP.
    pub advertised_host: Option<String>,
    pub advertised_port: Option<u16>,
    pub max_request_bytes: usize,
    #[serde(deserialize_with = "duration", serialize_with = "show_duration")]
    pub idle_timeout: Duration,
    #[serde(deserialize_with = "duration", serialize_with = "show_duration")]
    pub frame_timeout: Duration,
    /// Request bytes read and not yet answered, across all connections (Kafka's
    /// `queued.max.request.bytes`); reads pause while it is all in use.
    pub queued_max_request_bytes: usize,
    /// Open client connections, all listeners (`max.connections`); the accept loop waits
    /// for one to close.
    pub max_connections: usize,
    /// Open connections from one address (`max.connections.per.ip`); more are closed.
    pub max_connections_per_ip: usize,
    /// Per-address exceptions to `max_connections_per_ip`, e.g. `{ "10.0.0.7" = 2000 }`.
    pub max_connections_per_ip_overrides: BTreeMap<String, usize>,
    /// The most record bytes one fetch response carries (`fetch.max.bytes`), whatever the
    /// request asks; the first batch may exceed it (KIP-74).
    pub fetch_max_bytes: usize,
    /// The longest a fetch may wait for data, whatever its `max_wait_ms`.
    #[serde(deserialize_with = "duration", serialize_with = "show_duration")]
    pub fetch_max_wait: Duration,
    /// Fetches on plaintext listeners send large reads from the page cache straight from
    /// the segment files (`sendfile`), as Kafka does; `false` reads them and writes them.
    pub sendfile: bool,
    /// Fetch sessions (KIP-227) the broker keeps (Kafka's
    /// `max.incremental.fetch.session.cache.slots`); 0 turns them off.
    pub fetch_session_cache_slots: usize,
    /// The partitions all fetch sessions may hold between them.
    pub fetch_session_cache_partitions: usize,
    /// Named listeners, each with its security protocol (Kafka's `listeners` and
    /// `listener.security.protocol.map`). When given, they replace `listen`.
    pub listeners: Vec<NamedListener>,
    /// Certificate and key for SSL and SASL_SSL listeners.
    pub tls: Option<crate::kafka::tls::TlsSection>,
    pub sasl: SaslSection,
}

impl KafkaSection {
    /// The listener limits these settings give; an override naming no IP address is an error.
    pub fn limits(&self) -> anyhow::Result<crate::kafka::limits::LimitsConfig> {
        let overrides = self
            .max_connections_per_ip_overrides
            .iter()
            .map(|(ip, n)| {
                let ip = ip.parse::<std::net::IpAddr>().with_context(|| {
                    format!("kafka.max_connections_per_ip_overrides: '{ip}' is not an IP address")
                })?;
                Ok((ip, *n))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(crate::kafka::limits::LimitsConfig {
            max_connections: self.max_connections,
            max_connections_per_ip: self.max_connections_per_ip,
            max_connections_per_ip_overrides: overrides,
            queued_max_request_bytes: self.queued_max_request_bytes,
            fetch_session_cache_slots: self.fetch_session_cache_slots,
            fetch_session_cache_partitions: self.fetch_session_cache_partitions,
        })
    }
}

/// One `[[kafka.listeners]]` entry.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NamedListener {
    pub name: String,
    pub listen: SocketAddr,
    pub protocol: crate::kafka::SecurityProtocol,
    pub advertised_host: Option<String>,
    pub advertised_port: Option<u16>,
    /// Overrides `[kafka.tls] client_auth` on this listener (Kafka's
    /// `listener.name.<name>.ssl.client.auth`).
    pub client_auth: Option<crate::kafka::tls::ClientAuth>,
}

/// `[kafka.sasl]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SaslSection {
    /// Offered on SASL_PLAINTEXT and SASL_SSL listeners, in this order.
    pub mechanisms: Vec<String>,
    /// Kafka's `connections.max.reauth.ms` (KIP-368): an authenticated session lasts this
    /// long; clients re-authenticate on the same connection before it ends, and a
    /// connection that does not is closed at its next request. Absent: sessions last as
    /// long as their connection, and re-authentication is refused.
    #[serde(
        default,
        deserialize_with = "opt_duration",
        serialize_with = "show_opt_duration"
    )]
    pub connections_max_reauth: Option<Duration>,
    /// Kafka's `connection.failed.authentication.delay.ms`: a failed login is answered (and
    /// its connection closed) only after this long, so that passwords cannot be guessed at
    /// the speed of the network. At most the frame timeout.
    #[serde(deserialize_with = "duration", serialize_with = "show_duration")]
    pub failed_authentication_delay: Duration,
    /// How OAUTHBEARER tokens are checked; needed when `mechanisms` offers OAUTHBEARER.
    pub oauthbearer: Option<crate::kafka::sasl::oauthbearer::OAuthSection>,
}

fn opt_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
}

impl Default for SaslSection {
    fn default() -> Self {
        SaslSection {
            mechanisms: vec![
                "SCRAM-SHA-512".into(),
                "SCRAM-SHA-256".into(),
                "PLAIN".into(),
            ],
            connections_max_reauth: None,
            failed_authentication_delay: Duration::from_millis(100),
            oauthbearer: None,
        }
    }
}

/// The cold tier (tiered storage).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ColdSection {
    /// `file:///abs/dir`, `s3://bucket[/prefix]`.
    pub url: String,
    /// S3-compatible servers: the endpoint (e.g. `http://127.0.0.1:9000`).
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// Path-style S3 requests, as most S3-compatible servers want.
    #[serde(default)]
    pub path_style: bool,
    /// How long one object store request may take before it fails and is retried.
    #[serde(
        default = "default_request_timeout",
        deserialize_with = "duration",
        serialize_with = "show_duration"
    )]
    pub request_timeout: Duration,
    /// Partitions uploading at once on this broker (each uploads its segments in order).
    #[serde(default = "default_upload_concurrency")]
    pub upload_concurrency: usize,
    /// Upload bandwidth cap per partition, bytes per second (0: uncapped).
    #[serde(default)]
    pub upload_bytes_per_sec: u64,
    /// How often sealed segments are looked for.
    #[serde(
        default = "default_tier_interval",
        deserialize_with = "duration",
        serialize_with = "show_duration"
    )]
    pub interval: Duration,
    /// Objects no manifest names (left by killed or deposed uploads) are deleted once this
    /// old; keep it well above the longest upload.
    #[serde(
        default = "default_orphan_grace",
        deserialize_with = "duration",
        serialize_with = "show_duration"
    )]
    pub orphan_grace: Duration,
    /// The cold-read budget of this broker: GETs at once and bytes per second (0:
    /// uncapped), so a long replay does not starve real-time traffic.
    #[serde(default = "default_read_concurrency")]
    pub read_concurrency: usize,
    #[serde(default)]
    pub read_bytes_per_sec: u64,
    /// Memory for cached cold chunks, and the chunk (ranged GET) size.
    #[serde(default = "default_cache_bytes")]
    pub cache_bytes: usize,
    #[serde(default = "default_chunk_bytes")]
    pub chunk_bytes: u64,
    /// The cache's local-disk tier, under `cache_dir` (default `<data_dir>/cold-cache`;
    /// 0 bytes: memory only). Chunks evicted from memory are kept there.
    #[serde(default = "default_disk_cache_bytes")]
    pub disk_cache_bytes: usize,
    pub cache_dir: Option<PathBuf>,
    /// Memory for the offset indexes of the cold segments being read (about 128 KiB per
    /// 1 GiB segment); the least recently used are dropped past it and fetched again.
    #[serde(default = "default_index_cache_bytes")]
    pub index_cache_bytes: usize,
}

fn default_index_cache_bytes() -> usize {
    64 << 20
}

fn default_orphan_grace() -> Duration {
    Duration::from_secs(3600)
}

fn default_request_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_disk_cache_bytes() -> usize {
    1 << 30
}

fn default_read_concurrency() -> usize {
    8
}

fn default_cache_bytes() -> usize {
    256 << 20
}

fn default_chunk_bytes() -> u64 {
    1 << 20
}

fn default_upload_concurrency() -> usize {
    4
}

fn default_tier_interval() -> Duration {
    Duration::from_secs(1)
}

impl ColdSection {
    fn at(url: String) -> Self {
        ColdSection {
            url,
            endpoint: None,
            region: None,
            path_style: false,
            request_timeout: default_request_timeout(),
            upload_concurrency: default_upload_concurrency(),
            upload_bytes_per_sec: 0,
            interval: default_tier_interval(),
            orphan_grace: default_orphan_grace(),
            read_concurrency: default_read_concurrency(),
            read_bytes_per_sec: 0,
            cache_bytes: default_cache_bytes(),
            chunk_bytes: default_chunk_bytes(),
            disk_cache_bytes: default_disk_cache_bytes(),
            cache_dir: None,
            index_cache_bytes: default_index_cache_bytes(),
        }
    }

    fn store(&self) -> strata_cold::store::StoreConfig {
        strata_cold::store::StoreConfig {
            url: self.url.clone(),
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
            path_style: self.path_style,
            request_timeout: Some(self.request_timeout),
        }
    }

    fn runtime(&self, data_dir: &std::path::Path) -> crate::broker::tier::TierConfig {
        crate::broker::tier::TierConfig {
            store: self.store(),
            upload: strata_cold::upload::UploadConfig {
                concurrency: self.upload_concurrency.max(1),
                max_bytes_per_sec: (self.upload_bytes_per_sec > 0)
                    .then_some(self.upload_bytes_per_sec),
                ..Default::default()
            },
            read: strata_cold::read::ReadConfig {
                chunk_size: self.chunk_bytes.max(4096),
                cache_bytes: self.cache_bytes,
                disk_cache_dir: Some(
                    self.cache_dir
                        .clone()
                        .unwrap_or_else(|| data_dir.join("cold-cache")),
                ),
                disk_cache_bytes: self.disk_cache_bytes,
                read_ahead: true,
                max_concurrent_reads: self.read_concurrency.max(1),
                max_bytes_per_sec: (self.read_bytes_per_sec > 0).then_some(self.read_bytes_per_sec),
                index_cache_bytes: self.index_cache_bytes.max(1 << 20),
            },
            interval: self.interval,
            orphan_grace: self.orphan_grace,
        }
    }
}

/// Consumer group coordination (Kafka's `offsets.*` and `group.*` broker settings).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct GroupsSection {
    /// Partitions of `__consumer_offsets` (`offsets.topic.num.partitions`); fixed once the
    /// topic exists.
    pub offsets_topic_partitions: u32,
    /// Its replication factor (`offsets.topic.replication.factor`), capped by the number
    /// of brokers registered when it is created.
    pub offsets_topic_replication_factor: u16,
    /// `group.min.session.timeout.ms` / `group.max.session.timeout.ms`.
    #[serde(deserialize_with = "duration", serialize_with = "show_duration")]
    pub min_session_timeout: Duration,
    #[serde(deserialize_with = "duration", serialize_with = "show_duration")]
    pub max_session_timeout: Duration,
    /// How long an offset commit may wait to be replicated (`offsets.commit.timeout.ms`).
    #[serde(deserialize_with = "duration", serialize_with = "show_duration")]
    pub commit_timeout: Duration,
    /// A member that forces more rebalances than this within `flap_window` is turned away
    /// with a backoff that doubles each time.
    pub max_rebalances_per_member: usize,
    #[serde(deserialize_with = "duration", serialize_with = "show_duration")]
    pub flap_window: Duration,
    /// An offsets partition rewrites its live state and deletes what that supersedes after
    /// this many records (or twice its live state if larger).
    pub offsets_snapshot_records: u64,
    /// `segment.bytes` of `__consumer_offsets` (fixed once it exists).
    pub offsets_topic_segment_bytes: u64,
    /// Members one group may have (`group.max.size`).
    pub max_size: usize,
    /// How long a group that was empty waits for more members before its first generation
    /// (`group.initial.rebalance.delay.ms`); 0 answers at once.
    #[serde(deserialize_with = "duration", serialize_with = "show_duration")]
    pub initial_rebalance_delay: Duration,
    /// Consumer-protocol (KIP-848) groups: the session timeout and heartbeat interval of
    /// a group without its own `consumer.*` group configs, and the bounds those must fall
    /// within (Kafka's `group.consumer.session.timeout.ms`, `...min...`, `...max...`).
    #[serde(deserialize_with = "duration", serialize_with = "show_duration")]
    pub consumer_session_timeout: Duration,
    #[serde(deserialize_with = "duration", serialize_with = "show_duration")]
    pub consumer_min_session_timeout: Duration,
    #[serde(deserialize_with = "duration", serialize_with = "show_duration")]
    pub consumer_max_session_timeout: Duration,
    #[serde(deserialize_with = "duration", serialize_with = "show_duration")]
    pub consumer_heartbeat_interval: Duration,
    #[serde(deserialize_with = "duration", serialize_with = "show_duration")]
    pub consumer_min_heartbeat_interval: Duration,
    #[serde(deserialize_with = "duration", serialize_with = "show_duration")]
    pub consumer_max_heartbeat_interval: Duration,
    /// Whether groups with members move between the classic and the consumer protocol
    /// (Kafka's `group.consumer.migration.policy`): `bidirectional` (the default),
    /// `upgrade`, `downgrade` or `disabled`.
    pub consumer_migration_policy: String,
}

impl Default for GroupsSection {
    fn default() -> Self {
        let d = crate::group::manager::GroupsConfig::default();
        let ms = |v: i64| Duration::from_millis(v as u64);
        GroupsSection {
            offsets_topic_partitions: d.offsets_partitions,
            offsets_topic_replication_factor: d.offsets_replication_factor,
            min_session_timeout: ms(d.group.min_session_timeout_ms),
            max_session_timeout: ms(d.group.max_session_timeout_ms),
            commit_timeout: d.commit_timeout,
            max_rebalances_per_member: d.group.max_rebalances_per_member,
            flap_window: ms(d.group.flap_window_ms),
            offsets_snapshot_records: d.offsets_snapshot_records,
            offsets_topic_segment_bytes: d.offsets_segment_bytes,
            max_size: d.group.max_size,
            initial_rebalance_delay: ms(d.group.initial_rebalance_delay_ms),
            consumer_session_timeout: ms(d.consumer.session_timeout_ms),
            consumer_min_session_timeout: ms(d.consumer.min_session_timeout_ms),
            consumer_max_session_timeout: ms(d.consumer.max_session_timeout_ms),
            consumer_heartbeat_interval: ms(d.consumer.heartbeat_interval_ms),
            consumer_min_heartbeat_interval: ms(d.consumer.min_heartbeat_interval_ms),
            consumer_max_heartbeat_interval: ms(d.consumer.max_heartbeat_interval_ms),
            consumer_migration_policy: d.group.migration.name().to_string(),
        }
    }
}

/// `[transactions]`: the transaction coordinators.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TransactionsSection {
    /// The longest transaction a producer may ask for (`transaction.max.timeout.ms`).
    #[serde(deserialize_with = "duration", serialize_with = "show_duration")]
    pub max_timeout: Duration,
    /// A transactional id idle this long (no transaction open) is forgotten
    /// (`transactional.id.expiration.ms`).
    #[serde(deserialize_with = "duration", serialize_with = "show_duration")]
    pub transactional_id_expiration: Duration,
    /// KIP-890 (`transaction.partition.verification.enable`): a partition leader asks the
    /// transaction coordinator before a transactional batch opens a transaction on its
    /// partition, so a stray or late batch cannot leave a transaction no marker will close.
    pub partition_verification: bool,
}

impl Default for TransactionsSection {
    fn default() -> Self {
        let d = crate::txn::TxnConfig::default();
        TransactionsSection {
            max_timeout: Duration::from_millis(d.max_timeout_ms as u64),
            transactional_id_expiration: d.id_expiration,
            partition_verification: d.partition_verification,
        }
    }
}

impl TransactionsSection {
    fn runtime(&self) -> crate::txn::TxnConfig {
        crate::txn::TxnConfig {
            max_timeout_ms: self.max_timeout.as_millis().min(i32::MAX as u128) as i32,
            id_expiration: self.transactional_id_expiration,
            partition_verification: self.partition_verification,
            ..crate::txn::TxnConfig::default()
        }
    }
}

impl GroupsSection {
    fn runtime(&self) -> crate::group::manager::GroupsConfig {
        let d = crate::group::manager::GroupsConfig::default();
        let ms = |v: Duration| v.as_millis().min(i64::MAX as u128) as i64;
        crate::group::manager::GroupsConfig {
            group: crate::group::state::GroupConfig {
                min_session_timeout_ms: ms(self.min_session_timeout),
                max_session_timeout_ms: ms(self.max_session_timeout),
                max_rebalances_per_member: self.max_rebalances_per_member,
                flap_window_ms: ms(self.flap_window),
                max_size: self.max_size,
                initial_rebalance_delay_ms: ms(self.initial_rebalance_delay),
                migration: crate::group::consumer::MigrationPolicy::from_name(
                    &self.consumer_migration_policy,
                )
                .unwrap_or(d.group.migration),
                ..d.group
            },
            offsets_partitions: self.offsets_topic_partitions,
            offsets_replication_factor: self.offsets_topic_replication_factor,
            commit_timeout: self.commit_timeout,
            offsets_snapshot_records: self.offsets_snapshot_records,
            offsets_segment_bytes: self.offsets_topic_segment_bytes,
            consumer: crate::group::consumer::ConsumerProtocolConfig {
                session_timeout_ms: ms(self.consumer_session_timeout),
                min_session_timeout_ms: ms(self.consumer_min_session_timeout),
                max_session_timeout_ms: ms(self.consumer_max_session_timeout),
                heartbeat_interval_ms: ms(self.consumer_heartbeat_interval),
                min_heartbeat_interval_ms: ms(self.consumer_min_heartbeat_interval),
                max_heartbeat_interval_ms: ms(self.consumer_max_heartbeat_interval),
            },
            ..d
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TopicsSection {
    pub default_partitions: u32,
    pub auto_create: bool,
    #[serde(deserialize_with = "duration", serialize_with = "show_duration")]
    pub retention_check_interval: Duration,
    /// A producer id with no batch for this long is forgotten (`producer.id.expiration.ms`).
    #[serde(deserialize_with = "duration", serialize_with = "show_duration")]
    pub producer_id_expiration: Duration,
    /// How often compacted topics' local logs are checked for a compaction that is due
    /// (Kafka's `log.cleaner.backoff.ms`).
    #[serde(deserialize_with = "duration", serialize_with = "show_duration")]
    pub compaction_check_interval: Duration,
    /// Memory for one compaction round's key table (Kafka's
    /// `log.cleaner.dedupe.buffer.size`): past it a round stops at a segment boundary and
    /// the next one goes on.
    pub compaction_map_bytes: usize,
    /// Broker-wide defaults for topic configs, under Kafka's names.
    #[serde(deserialize_with = "config_strings")]
    pub defaults: BTreeMap<String, String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            roles: vec![Role::Broker],
            node_id: 0,
            data_dir: PathBuf::from("./strata-data"),
            kafka: KafkaSection::default(),
            topics: TopicsSection::default(),
            groups: GroupsSection::default(),
            transactions: TransactionsSection::default(),
            cold: None,
            controller: None,
            cluster: None,
            grpc: None,
            metrics: None,
            auth: AuthSection::default(),
            tls: None,
            bootstrap_users: Vec::new(),
        }
    }
}

impl Default for KafkaSection {
    fn default() -> Self {
        KafkaSection {
            listen: "127.0.0.1:9092".parse().expect("valid literal"),
            advertised_host: None,
            advertised_port: None,
            max_request_bytes: 100 << 20,
            idle_timeout: Duration::from_secs(600),
            frame_timeout: Duration::from_secs(30),
            queued_max_request_bytes: 512 << 20,
            max_connections: 4096,
            max_connections_per_ip: 1000,
            max_connections_per_ip_overrides: BTreeMap::new(),
            fetch_max_bytes: 55 << 20,
            fetch_max_wait: Duration::from_secs(30),
            sendfile: true,
            fetch_session_cache_slots: 1000,
            fetch_session_cache_partitions: 200_000,
            listeners: Vec::new(),
            tls: None,
            sasl: SaslSection::default(),
        }
    }
}

impl Default for TopicsSection {
    fn default() -> Self {
        TopicsSection {
            default_partitions: 1,
            auto_create: false,
            retention_check_interval: Duration::from_secs(30),
            producer_id_expiration: Duration::from_secs(86_400),
            compaction_check_interval: Duration::from_secs(15),
            compaction_map_bytes: 128 << 20,
            defaults: BTreeMap::new(),
        }
    }
}

pub(crate) fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    humantime::parse_duration(&text).map_err(|e| {
        serde::de::Error::custom(format!(
            "'{text}' is not a duration like \"30s\" or \"10m\": {e}"
        ))
    })
}

/// A duration as the config file spells it ("30s", "1h 30m").
pub(crate) fn show_duration<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&humantime::format_duration(*d).to_string())
}

fn show_opt_duration<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => show_duration(d, s),
        None => s.serialize_none(),
    }
}

/// `strata dev` command-line flags.
#[derive(Debug, Default)]
pub struct DevFlags {
    pub data_dir: Option<PathBuf>,
    pub listen: Option<String>,
    pub grpc: Option<String>,
    pub controller_listen: Option<String>,
    pub metrics: Option<String>,
}

impl ServerConfig {
    /// The `strata dev` configuration: without a config file, one process runs both roles (a
    /// single-voter controller quorum and a broker registered with it), like KRaft's combined
    /// mode; flags and `STRATA__*` variables override.
    pub fn dev(
        path: Option<&Path>,
        flags: DevFlags,
        env: impl Iterator<Item = (String, String)>,
    ) -> anyhow::Result<Self> {
        let mut overrides: BTreeMap<String, String> = env.collect();
        if let Some(d) = &flags.data_dir {
            overrides.insert("STRATA__DATA_DIR".into(), d.display().to_string());
        }
        let tunes_cold = overrides.keys().any(|k| k.starts_with("STRATA__COLD__"));
        if path.is_none() && tunes_cold && !overrides.contains_key("STRATA__COLD__URL") {
            // Cold-tier settings without a URL: the embedded default store, as below.
            let data_dir = overrides
                .get("STRATA__DATA_DIR")
                .map_or_else(|| PathBuf::from("./strata-data"), PathBuf::from);
            let dir = std::env::current_dir()
                .context("reading the current directory")?
                .join(data_dir)
                .join("cold");
            overrides.insert(
                "STRATA__COLD__URL".into(),
                format!("file://{}", dir.display()),
            );
        }
        let default_listen =
            flags.listen.is_none() && !overrides.contains_key("STRATA__KAFKA__LISTEN");
        if let Some(l) = flags.listen {
            overrides.insert("STRATA__KAFKA__LISTEN".into(), l);
        }
        match flags.grpc {
            Some(g) => {
                overrides.insert("STRATA__GRPC__LISTEN".into(), g);
            }
            None if default_listen && path.is_none() => {
                overrides
                    .entry("STRATA__GRPC__LISTEN".into())
                    .or_insert_with(|| "127.0.0.1:9095".into());
            }
            None => {}
        }
        match flags.metrics {
            Some(m) => {
                overrides.insert("STRATA__METRICS__LISTEN".into(), m);
            }
            None if default_listen && path.is_none() => {
                overrides
                    .entry("STRATA__METRICS__LISTEN".into())
                    .or_insert_with(|| "127.0.0.1:9096".into());
            }
            None => {}
        }
        let mut config = ServerConfig::load(path, overrides.into_iter())?;
        if config.cold.is_none() {
            // The embedded default: the cold tier in a directory beside the data.
            let dir = std::env::current_dir()
                .context("reading the current directory")?
                .join(&config.data_dir)
                .join("cold");
            config.cold = Some(ColdSection::at(format!("file://{}", dir.display())));
        }
        if config.controller.is_none() && config.cluster.is_none() {
            let listen: SocketAddr = flags
                .controller_listen
                .as_deref()
                .unwrap_or("127.0.0.1:9093")
                .parse()
                .context("--controller-listen is not HOST:PORT")?;
            config.roles = vec![Role::Broker, Role::Controller];
            config.node_id = 1;
            config.controller = Some(ControllerSection {
                node_id: 1,
                listen,
                voters: BTreeMap::from([("1".to_string(), listen.to_string())]),
                broker_lease: default_broker_lease(),
                raft_heartbeat: default_raft_heartbeat(),
                max_connections: default_grpc_max_connections(),
                idle_timeout: default_grpc_idle_timeout(),
            });
            config.cluster = Some(ClusterSection {
                controllers: vec![listen.to_string()],
                rack: None,
                cluster_id: default_cluster_id(),
                replica_lag_time_max: default_replica_lag(),
                replica_open_timeout: default_replica_open_timeout(),
                replica_selector: ReplicaSelector::Leader,
            });
            config.validate()?;
        }
        Ok(config)
    }

    /// Reads `path` (if given), applies `STRATA__*` environment overrides, and validates.
    pub fn load(
        path: Option<&Path>,
        env: impl Iterator<Item = (String, String)>,
    ) -> anyhow::Result<Self> {
        let file = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("reading config file {}", p.display()))?;
                text.parse::<toml::Table>()
                    .with_context(|| format!("parsing config file {}", p.display()))?
            }
            None => toml::Table::new(),
        };
        let overrides = env
            .filter_map(|(var, raw)| Override::new(var, &raw))
            .collect();
        let config = resolve(file, overrides)?;
        config.validate()?;
        Ok(config)
    }

    /// The configuration as a TOML file would give it, every default filled in: what
    /// `strata config check` prints.
    pub fn effective_toml(&self) -> anyhow::Result<String> {
        toml::to_string(self).context("writing the configuration as TOML")
    }

    pub(crate) fn validate(&self) -> anyhow::Result<()> {
        if let Some(t) = &self.kafka.tls {
            crate::kafka::tls::choices(t)?;
        }
        for (name, d) in [
            (
                "retention_check_interval",
                self.topics.retention_check_interval,
            ),
            (
                "compaction_check_interval",
                self.topics.compaction_check_interval,
            ),
        ] {
            if d.is_zero() {
                bail!("topics.{name} must be more than 0s");
            }
        }
        if self.topics.compaction_map_bytes < 1 << 20 {
            bail!(
                "topics.compaction_map_bytes must be at least 1048576 (1 MiB), not {}",
                self.topics.compaction_map_bytes
            );
        }
        if self.node_id < 0 {
            bail!("node_id must be 0 or more, not {}", self.node_id);
        }
        if self.kafka.max_request_bytes < 1024 || self.kafka.max_request_bytes > i32::MAX as usize {
            bail!("kafka.max_request_bytes must be between 1024 and 2147483647");
        }
        if self.kafka.queued_max_request_bytes < self.kafka.max_request_bytes {
            bail!(
                "kafka.queued_max_request_bytes ({}) must be at least kafka.max_request_bytes ({}): a request of the largest size must fit",
                self.kafka.queued_max_request_bytes,
                self.kafka.max_request_bytes
            );
        }
        if self.kafka.max_connections == 0 || self.kafka.max_connections_per_ip == 0 {
            bail!("kafka.max_connections and kafka.max_connections_per_ip must be at least 1");
        }
        self.grpc_connection_limits()?;
        if let Some(c) = &self.controller {
            grpc_limits("controller", c.max_connections, c.idle_timeout)?;
        }
        self.kafka.limits()?;
        if self.kafka.fetch_max_bytes < 1024 {
            bail!("kafka.fetch_max_bytes must be at least 1024");
        }
        let listeners = self.kafka_listeners();
        let mut names = std::collections::HashSet::new();
        for l in &listeners {
            if l.name.is_empty() || l.name == "grpc" || !names.insert(l.name.as_str()) {
                bail!(
                    "kafka.listeners: names must be unique, not empty and not 'grpc' ('{}')",
                    l.name
                );
            }
        }
        let t = &self.transactions;
        if t.max_timeout < Duration::from_millis(1)
            || t.max_timeout > Duration::from_millis(i32::MAX as u64)
        {
            bail!("transactions.max_timeout must be between 1ms and 24d (transaction.max.timeout.ms is an int)");
        }
        if t.transactional_id_expiration < Duration::from_secs(1) {
            bail!("transactions.transactional_id_expiration must be at least 1s");
        }
        for p in &self.auth.super_users {
            if !p.contains(':') {
                bail!("auth.super_users: '{p}' is not a principal of the form User:name");
            }
        }
        if listeners.iter().any(|l| l.protocol.tls()) && self.kafka.tls.is_none() {
            bail!("an SSL or SASL_SSL listener needs [kafka.tls] (cert and key)");
        }
        if self
            .kafka
            .sasl
            .connections_max_reauth
            .is_some_and(|d| d < Duration::from_secs(1))
        {
            bail!("kafka.sasl.connections_max_reauth must be at least 1s");
        }
        if self.kafka.sasl.failed_authentication_delay > self.kafka.frame_timeout {
            bail!(
                "kafka.sasl.failed_authentication_delay ({:?}) must not be longer than kafka.frame_timeout ({:?})",
                self.kafka.sasl.failed_authentication_delay,
                self.kafka.frame_timeout
            );
        }
        let mechanisms = self.sasl_mechanisms()?;
        if mechanisms.contains(&crate::kafka::sasl::Mechanism::OAuthBearer)
            && self.kafka.sasl.oauthbearer.is_none()
        {
            bail!("kafka.sasl.mechanisms offers OAUTHBEARER but [kafka.sasl.oauthbearer] is missing (jwks, issuer, audience)");
        }
        self.oauth_validator()?;
        if listeners.iter().any(|l| l.protocol.sasl()) && mechanisms.is_empty() {
            bail!("a SASL listener needs at least one of kafka.sasl.mechanisms");
        }
        if self.topics.default_partitions == 0 {
            bail!("topics.default_partitions must be at least 1");
        }
        LogConfig::from_map(&self.topics.defaults).context("invalid [topics.defaults]")?;
        let g = &self.groups;
        if g.offsets_topic_partitions == 0
            || g.offsets_topic_partitions > crate::broker::MAX_PARTITIONS
        {
            bail!(
                "groups.offsets_topic_partitions must be between 1 and {}",
                crate::broker::MAX_PARTITIONS
            );
        }
        if g.offsets_topic_replication_factor == 0 {
            bail!("groups.offsets_topic_replication_factor must be at least 1");
        }
        if g.min_session_timeout > g.max_session_timeout {
            bail!("groups.min_session_timeout is above groups.max_session_timeout");
        }
        for (what, min, v, max) in [
            (
                "session_timeout",
                g.consumer_min_session_timeout,
                g.consumer_session_timeout,
                g.consumer_max_session_timeout,
            ),
            (
                "heartbeat_interval",
                g.consumer_min_heartbeat_interval,
                g.consumer_heartbeat_interval,
                g.consumer_max_heartbeat_interval,
            ),
        ] {
            if min.is_zero() || !(min <= v && v <= max) {
                bail!(
                    "groups.consumer_{what} must be between groups.consumer_min_{what} and \
                     groups.consumer_max_{what}, and the minimum above zero (now {v:?}, \
                     {min:?} and {max:?})"
                );
            }
        }
        if crate::group::consumer::MigrationPolicy::from_name(&g.consumer_migration_policy)
            .is_none()
        {
            bail!(
                "groups.consumer_migration_policy is '{}'; use bidirectional, upgrade, downgrade or disabled",
                g.consumer_migration_policy
            );
        }
        if g.consumer_heartbeat_interval >= g.consumer_session_timeout {
            bail!("groups.consumer_heartbeat_interval must be shorter than groups.consumer_session_timeout");
        }
        if let Some(c) = &self.cold {
            if c.interval.is_zero() {
                bail!("cold.interval must be above zero");
            }
            strata_cold::store::open(&c.store())
                .map(|_| ())
                .or_else(|e| match e {
                    // Only the URL's shape is checked here; the store is opened at start.
                    strata_cold::store::StoreError::BadUrl { .. } => Err(e),
                    _ => Ok(()),
                })
                .context("invalid [cold]")?;
        }
        if g.offsets_topic_segment_bytes < 1024 {
            bail!("groups.offsets_topic_segment_bytes must be at least 1024");
        }
        if g.offsets_snapshot_records < 100 {
            bail!("groups.offsets_snapshot_records must be at least 100");
        }
        if g.commit_timeout.is_zero() {
            bail!("groups.commit_timeout must be above zero");
        }
        if self.roles.is_empty() {
            bail!("roles is empty; give \"broker\", \"controller\" or both");
        }
        if self.roles.contains(&Role::Controller) {
            self.controller_config()?;
        } else {
            self.grpc_tls()?;
        }
        if self
            .cluster
            .as_ref()
            .is_some_and(|c| c.controllers.is_empty())
        {
            bail!("[cluster] controllers is empty");
        }
        Ok(())
    }

    /// The broker's gRPC port's connection limits (the defaults without a `[grpc]` section).
    pub fn grpc_connection_limits(
        &self,
    ) -> anyhow::Result<strata_controller::incoming::ConnectionLimits> {
        match &self.grpc {
            Some(g) => grpc_limits("grpc", g.max_connections, g.idle_timeout),
            None => Ok(Default::default()),
        }
    }

    /// The controller settings, when this process runs the controller role.
    pub fn controller_config(&self) -> anyhow::Result<strata_controller::ControllerConfig> {
        let c = self
            .controller
            .as_ref()
            .context("roles include \"controller\" but there is no [controller] section")?;
        let voters = c
            .voters
            .iter()
            .map(|(id, addr)| {
                let id: u64 = id
                    .parse()
                    .with_context(|| format!("controller.voters key '{id}' is not a node id"))?;
                Ok((id, addr.clone()))
            })
            .collect::<anyhow::Result<BTreeMap<u64, String>>>()?;
        if !voters.contains_key(&c.node_id) {
            bail!(
                "controller.node_id {} is not one of controller.voters",
                c.node_id
            );
        }
        Ok(strata_controller::ControllerConfig {
            node_id: c.node_id,
            listen: c.listen,
            voters,
            data_dir: self.data_dir.join("controller"),
            broker_lease: c.broker_lease,
            raft_heartbeat: c.raft_heartbeat,
            tls: self.grpc_tls()?,
            admins: self.auth.super_users.clone(),
            connections: grpc_limits("controller", c.max_connections, c.idle_timeout)?,
        })
    }

    /// The `[tls]` files, read and checked (a key others may read is refused).
    pub fn grpc_tls(&self) -> anyhow::Result<Option<Arc<strata_proto::tls::GrpcTls>>> {
        let Some(t) = &self.tls else {
            return Ok(None);
        };
        crate::kafka::tls::check_private(&t.key)?;
        let tls = strata_proto::tls::GrpcTls::load(&t.ca, Some((&t.cert, &t.key)))
            .context("invalid [tls]")?;
        self.check_identity(&t.cert)?;
        Ok(Some(Arc::new(tls)))
    }

    /// The certificate must name this node as its peers will check it: a broker (or a
    /// single combined node) `CN=broker-<node_id>`, a controller `CN=controller-<id>`.
    fn check_identity(&self, cert: &Path) -> anyhow::Result<()> {
        use rustls::pki_types::pem::PemObject;
        use strata_proto::tls::Peer;
        let first = rustls::pki_types::CertificateDer::pem_file_iter(cert)
            .with_context(|| format!("reading {}", cert.display()))?
            .next()
            .with_context(|| format!("{} holds no PEM certificate", cert.display()))?
            .with_context(|| format!("parsing {}", cert.display()))?;
        let named = Peer::from_der(first.as_ref());
        let broker = self.roles.contains(&Role::Broker);
        let controller = self
            .controller
            .as_ref()
            .filter(|_| self.roles.contains(&Role::Controller));
        let expected = match (broker, controller) {
            (true, Some(c)) if c.voters.len() > 1 => bail!(
                "[tls]: a node that is both broker and controller can hold only one identity; \
                 with mTLS run the controllers and brokers of a multi-node cluster as separate processes"
            ),
            (true, _) => Peer::Broker(self.node_id),
            (false, Some(c)) => Peer::Controller(c.node_id),
            (false, None) => return Ok(()),
        };
        if named != expected {
            bail!(
                "[tls]: {} names {named}, but this node is {expected}; peers would refuse it \
                 (make one with: strata certs --node {})",
                cert.display(),
                expected
                    .principal()
                    .unwrap_or_default()
                    .trim_start_matches("User:CN=")
            );
        }
        Ok(())
    }

    pub fn broker(&self) -> BrokerConfig {
        BrokerConfig {
            data_dir: self.data_dir.clone(),
            node_id: self.node_id,
            topic_defaults: self.topics.defaults.clone(),
            default_partitions: self.topics.default_partitions,
            retention_check_interval: self.topics.retention_check_interval,
            producer_id_expiration: self.topics.producer_id_expiration,
            compaction_check_interval: self.topics.compaction_check_interval,
            compaction_map_bytes: self.topics.compaction_map_bytes,
            auto_create_topics: self.topics.auto_create,
            replica_lag_time_max: self
                .cluster
                .as_ref()
                .map_or_else(default_replica_lag, |c| c.replica_lag_time_max),
            replica_open_timeout: self
                .cluster
                .as_ref()
                .map_or_else(default_replica_open_timeout, |c| c.replica_open_timeout),
            replica_selector: self
                .cluster
                .as_ref()
                .map_or(ReplicaSelector::Leader, |c| c.replica_selector),
            groups: self.groups.runtime(),
            transactions: self.transactions.runtime(),
            tier: self.cold.as_ref().map(|c| c.runtime(&self.data_dir)),
            authorizer: self.authorizer(),
        }
    }

    fn authorizer(&self) -> strata_controller::metadata::acl::AuthorizerConfig {
        let client_auth = self.kafka.tls.as_ref().map(|t| t.client_auth);
        let authenticates = self.kafka_listeners().iter().any(|l| {
            l.protocol.sasl()
                || (l.protocol.tls()
                    && l.client_auth.or(client_auth).unwrap_or_default()
                        != crate::kafka::tls::ClientAuth::None)
        }) || self.tls.is_some();
        strata_controller::metadata::acl::AuthorizerConfig {
            super_users: self.auth.super_users.clone(),
            allow_if_no_acl: self
                .auth
                .allow_everyone_if_no_acl_found
                .unwrap_or(!authenticates),
        }
    }

    /// The listener settings; `bound` is the address actually bound (port 0 resolved).
    /// The Kafka listeners: `[[kafka.listeners]]`, or else one PLAINTEXT listener named
    /// "kafka" on `[kafka] listen`.
    pub fn kafka_listeners(&self) -> Vec<NamedListener> {
        if !self.kafka.listeners.is_empty() {
            return self.kafka.listeners.clone();
        }
        vec![NamedListener {
            name: "kafka".into(),
            listen: self.kafka.listen,
            protocol: crate::kafka::SecurityProtocol::Plaintext,
            advertised_host: self.kafka.advertised_host.clone(),
            advertised_port: self.kafka.advertised_port,
            client_auth: None,
        }]
    }

    /// A listener's runtime settings, once bound (an advertised port defaults to the bound
    /// one). Builds its TLS acceptor, so bad certificate files fail here.
    /// `oauth`: the OAUTHBEARER token checks ([`ServerConfig::oauth_validator`]), read once
    /// for every listener and the gRPC data plane.
    pub fn listener(
        &self,
        l: &NamedListener,
        bound: SocketAddr,
        oauth: Option<Arc<crate::kafka::sasl::oauthbearer::Validator>>,
    ) -> anyhow::Result<ListenerConfig> {
        let tls = match (l.protocol.tls(), &self.kafka.tls) {
            (false, _) => None,
            (true, None) => bail!("listener '{}' uses TLS but [kafka.tls] is missing", l.name),
            (true, Some(t)) => Some(
                crate::kafka::tls::acceptor(t, l.client_auth.unwrap_or(t.client_auth))
                    .with_context(|| format!("setting up TLS for listener '{}'", l.name))?,
            ),
        };
        let sasl_mechanisms = if l.protocol.sasl() {
            self.sasl_mechanisms()?
        } else {
            Vec::new()
        };
        // only where OAUTHBEARER is offered
        let oauth =
            oauth.filter(|_| sasl_mechanisms.contains(&crate::kafka::sasl::Mechanism::OAuthBearer));
        // (TLS encrypts every byte in this process: nothing to send from a file)
        let sendfile = self.kafka.sendfile && tls.is_none();
        Ok(ListenerConfig {
            name: l.name.clone(),
            protocol: l.protocol,
            tls,
            sasl_mechanisms,
            oauth,
            advertised_host: l
                .advertised_host
                .clone()
                .unwrap_or_else(|| bound.ip().to_string()),
            advertised_port: l.advertised_port.unwrap_or(bound.port()),
            max_request_bytes: self.kafka.max_request_bytes,
            max_reauth: self.kafka.sasl.connections_max_reauth,
            failed_authentication_delay: self.kafka.sasl.failed_authentication_delay,
            idle_timeout: self.kafka.idle_timeout,
            frame_timeout: self.kafka.frame_timeout,
            fetch_max_bytes: self.kafka.fetch_max_bytes,
            fetch_max_wait: self.kafka.fetch_max_wait,
            sendfile,
        })
    }

    /// The OAUTHBEARER token checks, when `[kafka.sasl.oauthbearer]` is given (its JWKS is
    /// read here).
    pub fn oauth_validator(
        &self,
    ) -> anyhow::Result<Option<Arc<crate::kafka::sasl::oauthbearer::Validator>>> {
        self.kafka
            .sasl
            .oauthbearer
            .as_ref()
            .map(|section| {
                crate::kafka::sasl::oauthbearer::Validator::load(section)
                    .context("invalid [kafka.sasl.oauthbearer]")
                    .map(Arc::new)
            })
            .transpose()
    }

    fn sasl_mechanisms(&self) -> anyhow::Result<Vec<crate::kafka::sasl::Mechanism>> {
        self.kafka
            .sasl
            .mechanisms
            .iter()
            .map(|m| {
                crate::kafka::sasl::Mechanism::from_name(m).with_context(|| {
                    format!("unknown SASL mechanism '{m}' in kafka.sasl.mechanisms (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER)")
                })
            })
            .collect()
    }
}

/// One `STRATA__*` variable: the field it sets and the readings of its text, tried in turn
/// until the field accepts one: a TOML value (`3600000`, `true`, `["a", "b"]`), the text
/// itself (`STRATA__CLUSTER__RACK=1` for a string field), and a comma-separated list
/// (`STRATA__ROLES=broker,controller`, `STRATA__CLUSTER__CONTROLLERS=a:9093`).
struct Override {
    var: String,
    raw: String,
    path: Vec<String>,
    readings: Vec<toml::Value>,
    reading: usize,
    /// Why a reading did not fit (and whether the error was inside the value): what to
    /// report when none does.
    error: Option<(bool, String)>,
}

impl Override {
    fn new(var: String, raw: &str) -> Option<Self> {
        let path = var
            .strip_prefix(ENV_PREFIX)?
            .split("__")
            .map(|s| s.to_ascii_lowercase())
            .collect();
        let text = toml::Value::String(raw.to_string());
        let mut readings: Vec<toml::Value> = toml_value(raw).into_iter().collect();
        if !readings.contains(&text) {
            readings.push(text);
        }
        let items = raw.split(',').map(str::trim).filter(|s| !s.is_empty());
        readings.push(toml::Value::Array(
            items
                .map(|s| toml_value(s).unwrap_or_else(|| toml::Value::String(s.to_string())))
                .collect(),
        ));
        Some(Override {
            var,
            raw: raw.to_string(),
            path,
            readings,
            reading: 0,
            error: None,
        })
    }

    /// Whether the field at `at` (`kafka.listeners[0].name`) is this override's or in it.
    fn covers(&self, at: &str) -> bool {
        let mine = self.path.join(".");
        at == mine
            || at
                .strip_prefix(&mine)
                .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
    }
}

/// `raw` read as a TOML value, if it is one.
fn toml_value(raw: &str) -> Option<toml::Value> {
    let mut t = format!("v = {raw}").parse::<toml::Table>().ok()?;
    (t.len() == 1).then(|| t.remove("v")).flatten()
}

/// The file's table with the overrides applied, as a config: an override whose reading a
/// field refuses is read the next way, and an error names the field (and the variable).
fn resolve(file: toml::Table, mut overrides: Vec<Override>) -> anyhow::Result<ServerConfig> {
    loop {
        let mut value = file.clone();
        for o in &overrides {
            set_path(&mut value, &o.path, o.readings[o.reading].clone())
                .with_context(|| format!("applying {}", o.var))?;
        }
        let error = match serde_path_to_error::deserialize(toml::Value::Table(value)) {
            Ok(config) => return Ok(config),
            Err(e) => e,
        };
        let at = error.path().to_string();
        let inner = error.into_inner().to_string();
        let culprit = overrides
            .iter_mut()
            .filter(|o| o.covers(&at))
            .max_by_key(|o| o.path.len());
        match culprit {
            Some(o) => {
                // A reading whose shape fit and whose part did not (`roles[1]: unknown
                // variant`) says more than one of the wrong shape.
                let inside = at != o.path.join(".");
                if o.error
                    .as_ref()
                    .is_none_or(|(was_inside, _)| inside && !was_inside)
                {
                    o.error = Some((inside, inner));
                }
                if o.reading + 1 < o.readings.len() {
                    o.reading += 1;
                    continue;
                }
                let (_, why) = o.error.as_ref().expect("set above");
                bail!("{}={}: {why} (see strata.example.toml)", o.var, o.raw);
            }
            None => bail!("invalid configuration: {at}: {inner} (see strata.example.toml)"),
        }
    }
}

/// A map of Kafka-style configs (`"retention.ms" = 3600000`): numbers and booleans are
/// taken as their text, as Kafka's own configs are, and `_` in a name reads as `.` (Kafka's
/// names have none, and an environment variable cannot carry a dot:
/// `STRATA__TOPICS__DEFAULTS__RETENTION_MS` sets `retention.ms`).
fn config_strings<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Scalar {
        Text(String),
        Integer(i64),
        Float(f64),
        Bool(bool),
    }
    let map = BTreeMap::<String, Scalar>::deserialize(d)?;
    Ok(map
        .into_iter()
        .map(|(k, v)| {
            let v = match v {
                Scalar::Text(s) => s,
                Scalar::Integer(i) => i.to_string(),
                Scalar::Float(f) => f.to_string(),
                Scalar::Bool(b) => b.to_string(),
            };
            (k.replace('_', "."), v)
        })
        .collect())
}

fn set_path(table: &mut toml::Table, path: &[String], value: toml::Value) -> anyhow::Result<()> {
    match path {
        [] => bail!("empty key"),
        [last] => {
            table.insert(last.clone(), value);
            Ok(())
        }
        [first, rest @ ..] => {
            let entry = table
                .entry(first.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            match entry {
                toml::Value::Table(t) => set_path(t, rest, value),
                _ => bail!("'{first}' is not a section"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_toml(text: &str) -> anyhow::Result<ServerConfig> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, text).unwrap();
        ServerConfig::load(Some(&path), std::iter::empty())
    }

    #[test]
    fn listeners_are_checked_and_authentication_closes_the_default() {
        let listener = |name: &str, protocol: &str| {
            format!("[[kafka.listeners]]\nname = \"{name}\"\nlisten = \"127.0.0.1:0\"\nprotocol = \"{protocol}\"\n")
        };
        let open = from_toml(&listener("A", "PLAINTEXT")).unwrap();
        assert!(open.broker().authorizer.allow_if_no_acl);
        let sasl =
            from_toml(&(listener("A", "PLAINTEXT") + &listener("B", "SASL_PLAINTEXT"))).unwrap();
        assert!(
            !sasl.broker().authorizer.allow_if_no_acl,
            "closed once clients authenticate"
        );
        let opened = from_toml(
            &(listener("B", "SASL_PLAINTEXT") + "[auth]\nallow_everyone_if_no_acl_found = true\nsuper_users = [\"User:admin\"]\n"),
        )
        .unwrap();
        assert!(opened.broker().authorizer.allow_if_no_acl);
        assert_eq!(opened.broker().authorizer.super_users, ["User:admin"]);
        for (text, error) in [
            (listener("A", "SSL"), "needs [kafka.tls]"),
            (
                listener("A", "PLAINTEXT") + &listener("A", "PLAINTEXT"),
                "unique",
            ),
            (listener("grpc", "PLAINTEXT"), "unique"),
            (listener("A", "TLS"), "unknown variant"),
            (
                listener("A", "SASL_PLAINTEXT") + "[kafka.sasl]\nmechanisms = [\"GSSAPI\"]\n",
                "unknown SASL mechanism",
            ),
            (
                "[auth]\nsuper_users = [\"admin\"]\n".to_string(),
                "User:name",
            ),
            (
                listener("A", "SASL_PLAINTEXT") + "[kafka.sasl]\nmechanisms = [\"OAUTHBEARER\"]\n",
                "[kafka.sasl.oauthbearer] is missing",
            ),
            (
                "[kafka.sasl]\nconnections_max_reauth = \"10ms\"\n".to_string(),
                "at least 1s",
            ),
        ] {
            let e = format!("{:#}", from_toml(&text).unwrap_err());
            assert!(e.contains(error), "{text}: {e}");
        }
    }

    #[test]
    fn a_node_certificate_must_name_the_node() {
        let dir = tempfile::tempdir().unwrap();
        let certs = dir.path().join("certs");
        crate::certs::run(crate::certs::CertsArgs {
            out: certs.clone(),
            nodes: vec!["broker-1".into(), "controller-1".into()],
            hosts: vec!["127.0.0.1".into()],
            clients: vec![],
            days: 1,
        })
        .unwrap();
        let tls = |name: &str| {
            format!(
                "[tls]\nca = \"{0}/ca.pem\"\ncert = \"{0}/node-{name}.pem\"\nkey = \"{0}/node-{name}.key\"\n",
                certs.display()
            )
        };
        let broker = |id: i32, name: &str| format!("node_id = {id}\n{}", tls(name));
        assert!(
            !from_toml(&broker(1, "broker-1"))
                .unwrap()
                .broker()
                .authorizer
                .allow_if_no_acl,
            "mTLS authenticates: no ACL means no access"
        );
        for (text, error) in [
            (
                broker(2, "broker-1"),
                "names broker 1, but this node is broker 2",
            ),
            (
                broker(1, "controller-1"),
                "names controller 1, but this node is broker 1",
            ),
        ] {
            let e = format!("{:#}", from_toml(&text).unwrap_err());
            assert!(e.contains(error), "{text}: {e}");
        }
        use std::os::unix::fs::PermissionsExt;
        let key = certs.join("node-broker-1.key");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = format!("{:#}", from_toml(&broker(1, "broker-1")).unwrap_err());
        assert!(e.contains("chmod 600"), "{e}");
    }

    #[test]
    fn example_config_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../strata.example.toml");
        let c = ServerConfig::load(Some(&path), std::iter::empty()).unwrap();
        assert_eq!(c.kafka.listen.port(), 9092);
    }

    #[test]
    fn env_overrides_and_errors_are_clear() {
        let env = vec![
            (
                "STRATA__KAFKA__LISTEN".to_string(),
                "127.0.0.1:19092".to_string(),
            ),
            (
                "STRATA__TOPICS__AUTO_CREATE".to_string(),
                "true".to_string(),
            ),
            ("STRATA__KAFKA__IDLE_TIMEOUT".to_string(), "2m".to_string()),
            ("UNRELATED".to_string(), "x".to_string()),
        ];
        let c = ServerConfig::load(None, env.into_iter()).unwrap();
        assert_eq!(c.kafka.listen.port(), 19092);
        assert!(c.topics.auto_create);
        assert_eq!(c.kafka.idle_timeout, Duration::from_secs(120));
        let bad = ServerConfig::load(
            None,
            [(
                "STRATA__KAFKA__IDLE_TIMEOUT".to_string(),
                "soon".to_string(),
            )]
            .into_iter(),
        );
        assert!(format!("{:#}", bad.unwrap_err()).contains("not a duration"));
        let unknown = ServerConfig::load(
            None,
            [("STRATA__NO_SUCH".to_string(), "1".to_string())].into_iter(),
        );
        assert!(format!("{:#}", unknown.unwrap_err()).contains("no_such"));
    }

    fn env(pairs: &[(&str, &str)]) -> impl Iterator<Item = (String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<Vec<_>>()
            .into_iter()
    }

    #[test]
    fn env_values_are_read_as_toml_then_as_text_then_as_a_list() {
        // Each of these failed with "integer, expected a string" or "expected a sequence".
        let c = ServerConfig::load(
            None,
            env(&[
                ("STRATA__TOPICS__DEFAULTS__RETENTION_MS", "3600000"),
                ("STRATA__ROLES", "broker"),
                (
                    "STRATA__CLUSTER__CONTROLLERS",
                    "10.0.0.1:9093, 10.0.0.2:9093",
                ),
                ("STRATA__CLUSTER__RACK", "1"),
                ("STRATA__CLUSTER__CLUSTER_ID", "true"),
                ("STRATA__AUTH__SUPER_USERS", r#"["User:admin", "User:ops"]"#),
                ("STRATA__NODE_ID", "7"),
                (
                    "STRATA__KAFKA__MAX_CONNECTIONS_PER_IP_OVERRIDES__10.0.0.7",
                    "4000",
                ),
            ]),
        )
        .unwrap();
        assert_eq!(c.topics.defaults["retention.ms"], "3600000");
        assert_eq!(c.roles, [Role::Broker]);
        let cluster = c.cluster.unwrap();
        assert_eq!(cluster.controllers, ["10.0.0.1:9093", "10.0.0.2:9093"]);
        assert_eq!(cluster.rack.as_deref(), Some("1"));
        assert_eq!(cluster.cluster_id, "true");
        assert_eq!(c.auth.super_users, ["User:admin", "User:ops"]);
        assert_eq!(c.node_id, 7);
        assert_eq!(c.kafka.max_connections_per_ip_overrides["10.0.0.7"], 4000);
        let c = ServerConfig::load(None, env(&[("STRATA__ROLES", "broker,controller")]));
        // both roles need a [controller] section: the error is validation's, not the reading's
        let e = format!("{:#}", c.unwrap_err());
        assert!(!e.contains("STRATA__ROLES"), "{e}");
        // A value no reading fits is reported with its variable and the first reading's
        // error, or the error inside a reading whose shape fits.
        let e = format!(
            "{:#}",
            ServerConfig::load(None, env(&[("STRATA__KAFKA__MAX_CONNECTIONS", "lots")]))
                .unwrap_err()
        );
        assert!(
            e.contains("STRATA__KAFKA__MAX_CONNECTIONS=lots") && e.contains("invalid type: string"),
            "{e}"
        );
        let e = format!(
            "{:#}",
            ServerConfig::load(None, env(&[("STRATA__ROLES", "broker,brokr")])).unwrap_err()
        );
        assert!(
            e.contains("STRATA__ROLES") && e.contains("unknown variant `brokr`"),
            "{e}"
        );
        let e = format!(
            "{:#}",
            ServerConfig::load(None, env(&[("STRATA__KAFKA__LISTN", "x")])).unwrap_err()
        );
        assert!(
            e.contains("STRATA__KAFKA__LISTN") && e.contains("unknown field"),
            "{e}"
        );
        // A file's mistakes are named by their field.
        let e = format!(
            "{:#}",
            from_toml("[kafka]\nmax_connections = \"many\"\n").unwrap_err()
        );
        assert!(e.contains("kafka.max_connections: invalid type"), "{e}");
        // Kafka configs in a file may be numbers, under either spelling.
        let c = from_toml("[topics.defaults]\nretention_ms = 60000\n\"segment.bytes\" = 1048576\n")
            .unwrap();
        assert_eq!(c.topics.defaults["retention.ms"], "60000");
        assert_eq!(c.topics.defaults["segment.bytes"], "1048576");
    }

    /// strata.example.toml with every commented-out setting (`# key = value`, `# [section]`)
    /// made real.
    fn example_uncommented() -> toml::Table {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../strata.example.toml");
        let text = std::fs::read_to_string(path).unwrap();
        let setting = |l: &str| {
            let key_end = l.find(" = ").unwrap_or(0);
            let code = l.split(" #").next().unwrap_or(l).trim_end();
            let header = code.starts_with('[') && code.ends_with(']');
            let key = &l[..key_end];
            header
                || (key_end > 0
                    && key.chars().all(|c| {
                        c.is_ascii_lowercase() || c.is_ascii_digit() || "_.\"".contains(c)
                    }))
        };
        let lines: Vec<&str> = text
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                Some(rest) if setting(rest) => rest,
                _ => l,
            })
            .collect();
        lines
            .join("\n")
            .parse()
            .expect("the uncommented example is TOML")
    }

    /// The fields serde expects in the section at `path`: it is given an unknown field, and
    /// its refusal lists them. None for a map (which takes any key).
    fn fields_of(example: &toml::Table, path: &[String]) -> Option<Vec<String>> {
        let mut probed = example.clone();
        let mut at = &mut probed;
        for p in path {
            at = match at.get_mut(p).unwrap() {
                toml::Value::Table(t) => t,
                toml::Value::Array(a) => a[0].as_table_mut().unwrap(),
                _ => unreachable!(),
            };
        }
        at.insert("zz_probe".into(), toml::Value::Integer(0));
        let e = format!("{:#}", resolve(probed, Vec::new()).err()?);
        let (_, expected) = e.split_once("unknown field `zz_probe`")?;
        let expected = expected.lines().next().unwrap_or_default();
        Some(
            expected
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect(),
        )
    }

    #[test]
    fn the_example_config_names_every_field() {
        let example = example_uncommented();
        resolve(example.clone(), Vec::new()).expect("every setting in the example is valid");
        let mut sections = vec![Vec::<String>::new()];
        let (mut checked, mut missing) = (0, Vec::new());
        while let Some(path) = sections.pop() {
            let Some(fields) = fields_of(&example, &path) else {
                continue;
            };
            let mut table = &example;
            for p in &path {
                table = match &table[p] {
                    toml::Value::Table(t) => t,
                    toml::Value::Array(a) => a[0].as_table().unwrap(),
                    _ => unreachable!(),
                };
            }
            for f in fields {
                let Some(v) = table.get(&f) else {
                    missing.push(format!("[{}] {f}", path.join(".")));
                    continue;
                };
                let is_section = v.is_table()
                    || v.as_array()
                        .is_some_and(|a| a.first().is_some_and(toml::Value::is_table));
                if is_section {
                    sections.push([path.clone(), vec![f]].concat());
                }
                checked += 1;
            }
        }
        assert!(
            missing.is_empty(),
            "strata.example.toml does not show {missing:?}"
        );
        assert!(checked > 100, "only {checked} fields checked");
    }

    #[test]
    fn dev_cold_settings_without_a_url_keep_the_embedded_store() {
        let env = [
            ("STRATA__COLD__INTERVAL".to_string(), "200ms".to_string()),
            ("STRATA__DATA_DIR".to_string(), "/tmp/strata-x".to_string()),
        ];
        let c = ServerConfig::dev(None, DevFlags::default(), env.into_iter()).unwrap();
        let cold = c.cold.unwrap();
        assert_eq!(cold.url, "file:///tmp/strata-x/cold");
        assert_eq!(cold.interval, Duration::from_millis(200));
    }
}
