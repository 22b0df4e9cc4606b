//! A running controller: the openraft node, the gRPC services (`Raft` for peers,
//! `Controller` for brokers and admins), and the active controller's lease loop that fences
//! brokers whose heartbeats stopped.
//!
//! Any controller answers; a write or heartbeat that reaches a follower is forwarded to the
//! leader. The metadata stream (`Watch`) is served from the local state machine, with its
//! version so a watcher can tell a stale view.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use openraft::error::{ClientWriteError, InitializeError, RaftError};
use openraft::BasicNode;
use strata_proto::tls::{GrpcTls, Peer};
use strata_proto::v1::controller_client::ControllerClient;
use strata_proto::v1::controller_server::{Controller as ControllerApi, ControllerServer};
use strata_proto::v1::raft_server::RaftServer as RaftGrpcServer;
use strata_proto::v1::*;
use tokio::sync::watch;
use tokio_stream::Stream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use uuid::Uuid;

use crate::metadata::leases::{HeartbeatError, Leases};
use crate::metadata::{
    Applied, ClusterMetadata, Command, Endpoint as EndpointRecord, MetadataError, ScramCredential,
    ScramMechanism,
};
use crate::network::{GrpcNetwork, Raft, RaftServer};
use crate::raft::{LogStore, NodeId, StateMachine};

/// How a controller is started.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    pub node_id: NodeId,
    /// Address the gRPC server binds.
    pub listen: SocketAddr,
    /// Every voter's id and the address peers and brokers reach it at (this node included).
    pub voters: BTreeMap<NodeId, String>,
    pub data_dir: PathBuf,
    /// Brokers that miss heartbeats for this long are fenced.
    pub broker_lease: Duration,
    /// Raft heartbeat interval; elections time out after 3-6 of them.
    pub raft_heartbeat: Duration,
    /// mTLS on the gRPC port and toward peers; `None`: plaintext and open to anyone who can
    /// reach the port (development only).
    pub tls: Option<Arc<GrpcTls>>,
    /// Principals allowed the admin RPCs besides the nodes (`[auth] super_users`).
    pub admins: Vec<String>,
    /// Connections the gRPC port keeps open at most, and how long one may stay silent.
    pub connections: crate::incoming::ConnectionLimits,
}

/// A controller's view of the metadata quorum ([`Controller::raft_status`]).
#[derive(Debug, Clone)]
pub struct RaftStatus {
    pub node_id: NodeId,
    pub leader: Option<NodeId>,
    pub term: u64,
    pub last_log_index: u64,
    pub last_applied: u64,
    pub voters: usize,
    /// Since this controller was last in touch with the quorum (None: never, or no leader).
    pub quorum_contact_age: Option<Duration>,
}

/// A running controller node.
pub struct Controller {
    config: ControllerConfig,
    raft: Raft,
    state: StateMachine,
    leases: Mutex<Leases>,
    /// The channel to the Raft leader that forwarded calls use, kept across calls.
    leader_channel: Mutex<Option<(NodeId, Channel)>>,
    /// Registrations whose session closed from the broker's side: the process is gone (a
    /// live broker never closes its session), so a heartbeat still in flight from it must
    /// not unfence it. Such a heartbeat is told to register again.
    dead: Mutex<BTreeSet<(i32, u64)>>,
    /// When a leader's AppendEntries was last accepted here (see `quorum_contact_age`).
    leader_contact: Arc<crate::network::LeaderContact>,
    /// Proposals waiting to be applied: the controller's request queue.
    pending: AtomicU64,
}

/// One proposal in [`Controller::pending`], for as long as it waits.
struct Pending<'a>(&'a AtomicU64);

impl<'a> Pending<'a> {
    fn count(n: &'a AtomicU64) -> Self {
        n.fetch_add(1, Ordering::Relaxed);
        Pending(n)
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How long a call forwarded to the Raft leader may take: a paused or cut-off leader must
/// not hold a broker's heartbeat (the broker gives up sooner and asks another controller).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(5);

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Requests one gRPC connection may have in progress; more wait (HTTP/2 flow control holds
/// the client back).
pub const GRPC_CONCURRENCY_PER_CONNECTION: usize = 256;
/// HTTP/2 streams one connection may open at once.
pub const GRPC_MAX_STREAMS: u32 = 512;
/// The longest any unary gRPC call (or a stream's opening) may take on a server, long
/// polls included (they wait at most 30 s); a client's shorter `grpc-timeout` wins.
pub const GRPC_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest request message the controller's services decode (tonic's default, stated).
pub const GRPC_MAX_CONTROLLER_MESSAGE: usize = 4 << 20;
/// A gRPC server pings a connection silent this long, and drops it when the ping is not
/// answered within as long again.
pub const GRPC_KEEPALIVE: Duration = Duration::from_secs(5);
/// Largest request header block a gRPC server takes.
pub const GRPC_MAX_HEADER_LIST: u32 = 64 << 10;

/// A tonic server with the limits every Strata gRPC port applies: requests in progress and
/// streams per connection, a deadline on every call, HTTP/2 keepalive (a peer that stops
/// answering pings is dropped after 10 s, not when TCP gives up), a bound on header size
/// and on streams a client resets before they are served (the HTTP/2 rapid-reset attack).
pub fn server_builder() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .concurrency_limit_per_connection(GRPC_CONCURRENCY_PER_CONNECTION)
        .max_concurrent_streams(GRPC_MAX_STREAMS)
        .timeout(GRPC_REQUEST_TIMEOUT)
        .http2_keepalive_interval(Some(GRPC_KEEPALIVE))
        .http2_keepalive_timeout(Some(GRPC_KEEPALIVE))
        .http2_max_header_list_size(GRPC_MAX_HEADER_LIST)
        .http2_max_pending_accept_reset_streams(Some(64))
}

/// The most partitions one ElectLeaders may name (Kafka's own cap is the cluster's size).
const MAX_ELECTIONS: usize = 100_000;

/// Kafka's error code for a refused election of one partition.
fn election_error_code(e: &MetadataError) -> i32 {
    match e {
        MetadataError::UnknownTopic(_) | MetadataError::UnknownPartition { .. } => 3,
        MetadataError::PreferredLeaderNotAvailable { .. } => 80,
        MetadataError::EligibleLeadersNotAvailable { .. } => 83,
        MetadataError::ElectionNotNeeded { .. } => 84,
        MetadataError::InvalidRequest(_) => 42,
        _ => -1,
    }
}

fn status(e: &MetadataError) -> Status {
    let msg = e.to_string();
    match e {
        MetadataError::TopicExists { .. } => Status::already_exists(msg),
        MetadataError::UnknownTopic(_)
        | MetadataError::UnknownPartition { .. }
        | MetadataError::UnknownBroker(_)
        | MetadataError::UnknownScramCredential { .. } => Status::not_found(msg),
        MetadataError::InvalidPartitions(_)
        | MetadataError::InvalidReplicationFactor(_)
        | MetadataError::InvalidReplicaAssignment(_)
        | MetadataError::InvalidIsr { .. }
        | MetadataError::InvalidScramCredential(_)
        | MetadataError::InvalidAcl(_)
        | MetadataError::InvalidQuota(_)
        | MetadataError::InvalidConfig(_)
        | MetadataError::InvalidRequest(_) => Status::invalid_argument(msg),
        MetadataError::StaleBrokerEpoch { .. }
        | MetadataError::StalePartitionEpoch { .. }
        | MetadataError::NotLeader { .. }
        | MetadataError::ElectionNotNeeded { .. }
        | MetadataError::PreferredLeaderNotAvailable { .. }
        | MetadataError::EligibleLeadersNotAvailable { .. }
        | MetadataError::NoReassignmentInProgress { .. } => Status::failed_precondition(msg),
    }
}

/// Kafka's error code for a refused reassignment.
fn reassignment_error_code(e: &MetadataError) -> i32 {
    match e {
        MetadataError::UnknownTopic(_) | MetadataError::UnknownPartition { .. } => 3,
        MetadataError::InvalidReplicaAssignment(_) => 39,
        MetadataError::NoReassignmentInProgress { .. } => 85,
        MetadataError::InvalidRequest(_) => 42,
        _ => -1,
    }
}

impl Controller {
    /// Opens the controller's storage, starts Raft and the gRPC server; initializes the
    /// quorum on first start (lowest voter id only). Runs until `shutdown` turns true.
    pub async fn start(
        config: ControllerConfig,
        shutdown: watch::Receiver<bool>,
    ) -> anyhow::Result<Arc<Controller>> {
        anyhow::ensure!(
            config.voters.contains_key(&config.node_id),
            "controller {} is not among the voters {:?}",
            config.node_id,
            config.voters.keys().collect::<Vec<_>>()
        );
        let log = LogStore::open(&config.data_dir.join("raft")).with_context(|| {
            format!("opening the metadata log in {}", config.data_dir.display())
        })?;
        let state = StateMachine::open(&config.data_dir.join("state")).with_context(|| {
            format!(
                "opening the metadata state in {}",
                config.data_dir.display()
            )
        })?;
        let hb = config.raft_heartbeat.as_millis() as u64;
        let raft_config = openraft::Config {
            cluster_name: "strata-metadata".into(),
            heartbeat_interval: hb,
            election_timeout_min: hb * 3,
            election_timeout_max: hb * 6,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(1000),
            max_in_snapshot_log_to_keep: 100,
            ..Default::default()
        }
        .validate()
        .context("invalid raft timing")?;
        let raft = Raft::new(
            config.node_id,
            Arc::new(raft_config),
            GrpcNetwork {
                tls: config.tls.clone(),
                health: Default::default(),
            },
            log,
            state.clone(),
        )
        .await
        .context("starting raft")?;
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("binding the controller listener on {}", config.listen))?;
        let controller = Arc::new(Controller {
            leases: Mutex::new(Leases::new(config.broker_lease.as_millis() as i64)),
            leader_channel: Mutex::new(None),
            dead: Mutex::new(BTreeSet::new()),
            leader_contact: Arc::new(crate::network::LeaderContact::default()),
            pending: AtomicU64::new(0),
            config,
            raft,
            state,
        });
        let (health, health_service) = crate::health::service();
        let mut builder = server_builder();
        if let Some(tls) = &controller.config.tls {
            builder = builder
                .tls_config(tls.server().context("controller TLS")?)
                .context("controller TLS")?;
        }
        let server = builder
            .add_service(
                RaftGrpcServer::new(RaftServer {
                    raft: controller.raft.clone(),
                    leader_contact: controller.leader_contact.clone(),
                    authenticated: controller.config.tls.is_some(),
                    voters: controller.config.voters.keys().copied().collect(),
                })
                .max_decoding_message_size(GRPC_MAX_CONTROLLER_MESSAGE),
            )
            .add_service(
                ControllerServer::new(ControllerService(controller.clone()))
                    .max_decoding_message_size(GRPC_MAX_CONTROLLER_MESSAGE),
            )
            .add_service(health_service);
        let me = Arc::downgrade(&controller);
        tokio::spawn(crate::health::report(
            health,
            move || me.upgrade().is_some_and(|c| c.readiness().is_ok()),
            shutdown.clone(),
        ));
        let incoming = crate::incoming::incoming(
            listener,
            controller.config.connections,
            Default::default(),
            "controller",
        );
        let mut stop = shutdown.clone();
        tokio::spawn(async move {
            let stopped = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            if let Err(e) = server.serve_with_incoming_shutdown(incoming, stopped).await {
                tracing::error!(error = %e, "controller gRPC server failed");
            }
        });
        controller.initialize_if_first().await?;
        tokio::spawn(controller.clone().lease_loop(shutdown.clone()));
        let raft = controller.raft.clone();
        let mut stop = shutdown;
        tokio::spawn(async move {
            let _ = stop.wait_for(|s| *s).await;
            if let Err(e) = raft.shutdown().await {
                tracing::warn!(error = %e, "raft shutdown");
            }
        });
        tracing::info!(node = controller.config.node_id, listen = %controller.config.listen, voters = controller.config.voters.len(), "controller started");
        Ok(controller)
    }

    async fn initialize_if_first(&self) -> anyhow::Result<()> {
        let lowest = *self
            .config
            .voters
            .keys()
            .next()
            .expect("voters checked non-empty");
        if lowest != self.config.node_id {
            return Ok(());
        }
        let members: BTreeMap<NodeId, BasicNode> = self
            .config
            .voters
            .iter()
            .map(|(id, addr)| (*id, BasicNode { addr: addr.clone() }))
            .collect();
        match self.raft.initialize(members).await {
            Ok(()) => {
                tracing::info!(
                    voters = self.config.voters.len(),
                    "initialized the metadata quorum"
                );
                Ok(())
            }
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
            Err(e) => Err(anyhow::anyhow!("initializing the metadata quorum: {e}")),
        }
    }

    /// The applied metadata and its changes.
    pub fn metadata(&self) -> watch::Receiver<Arc<ClusterMetadata>> {
        self.state.subscribe()
    }

    pub fn leader(&self) -> Option<NodeId> {
        self.raft.metrics().borrow().current_leader
    }

    /// Metadata changes proposed here and not applied yet.
    pub fn pending_proposals(&self) -> u64 {
        self.pending.load(Ordering::Relaxed)
    }

    /// This controller's view of the quorum, for its metrics.
    pub fn raft_status(&self) -> RaftStatus {
        let m = self.raft.metrics().borrow().clone();
        RaftStatus {
            node_id: self.config.node_id,
            leader: m.current_leader,
            term: m.current_term,
            last_log_index: m.last_log_index.unwrap_or(0),
            last_applied: m.last_applied.map_or(0, |l| l.index),
            voters: m.membership_config.membership().voter_ids().count(),
            quorum_contact_age: self.quorum_contact_age(),
        }
    }

    /// Whether this controller serves current metadata (`/readyz`, gRPC health): it knows
    /// the quorum's leader and has heard from the quorum within an election timeout;
    /// otherwise why not.
    pub fn readiness(&self) -> Result<(), String> {
        if self.leader().is_none() {
            return Err("the controller knows no quorum leader (an election is under way, or a majority of the voters is unreachable)".into());
        }
        match self.quorum_contact_age() {
            Some(age) if age <= self.stale_after() => Ok(()),
            Some(age) => Err(format!(
                "the controller has not heard from the quorum for {} ms",
                age.as_millis()
            )),
            None => Err("the controller has not heard from the quorum yet".into()),
        }
    }

    fn is_leader(&self) -> bool {
        self.leader() == Some(self.config.node_id)
    }

    /// How long ago this controller was last in touch with the rest of the quorum: as the
    /// Raft leader, since a quorum last acknowledged it; as a follower, since it last
    /// accepted its leader's AppendEntries. `None`: never (or no leader known).
    fn quorum_contact_age(&self) -> Option<Duration> {
        let m = self.raft.metrics().borrow().clone();
        if m.current_leader == Some(self.config.node_id) {
            m.millis_since_quorum_ack.map(Duration::from_millis)
        } else if m.current_leader.is_some() {
            self.leader_contact.age()
        } else {
            None
        }
    }

    /// Past this without contact (the longest election timeout), what this controller
    /// holds may be behind the cluster's.
    fn stale_after(&self) -> Duration {
        self.config.raft_heartbeat * 6
    }

    /// Proposes a command and waits for it to be applied; a refusal comes back as an error.
    pub async fn propose(&self, cmd: Command) -> Result<Applied, Status> {
        self.propose_at(cmd).await.map(|(applied, _)| applied)
    }

    /// `propose`, with the state machine's refusal kept apart from a failure to commit: a
    /// refusal is an answer (`Ok(Err(..))`), a failed write a gRPC error.
    async fn propose_or_refusal(
        &self,
        cmd: Command,
    ) -> Result<Result<Applied, MetadataError>, Status> {
        Ok(self.write(cmd).await?.map(|(applied, _)| applied))
    }

    /// `propose`, also giving the metadata version (log index) the command was applied at.
    async fn propose_at(&self, cmd: Command) -> Result<(Applied, u64), Status> {
        self.write(cmd).await?.map_err(|e| status(&e))
    }

    /// Checks `cmd` and commits it: the state machine's answer (a refusal included) with
    /// the log index it was applied at, or why it could not be written.
    async fn write(&self, cmd: Command) -> Result<Result<(Applied, u64), MetadataError>, Status> {
        // Refused here with the reason; `apply` checks again for entries that got in anyway.
        if let Err(e) = cmd.validate() {
            return Ok(Err(e));
        }
        let _pending = Pending::count(&self.pending);
        match self.raft.client_write(cmd).await {
            Ok(resp) => {
                let index = resp.log_id.index;
                Ok(resp.data.0.map(|a| (a, index)))
            }
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Err(Status::unavailable(format!(
                    "controller {} is not the leader (leader: {:?}); retry",
                    self.config.node_id,
                    f.leader_node.map(|n| n.addr)
                )))
            }
            Err(e) => Err(Status::unavailable(format!("metadata write failed: {e}"))),
        }
    }

    /// A client for the leader when it is another node; `None` when this node leads.
    async fn forward(&self) -> Result<Option<ControllerClient<Channel>>, Status> {
        let leader = self
            .leader()
            .ok_or_else(|| Status::unavailable("no controller leader elected yet; retry"))?;
        if leader == self.config.node_id {
            return Ok(None);
        }
        let addr =
            self.config.voters.get(&leader).ok_or_else(|| {
                Status::unavailable(format!("leader {leader} is not a known voter"))
            })?;
        let cached = {
            let kept = self
                .leader_channel
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            kept.as_ref()
                .filter(|(id, _)| *id == leader)
                .map(|(_, c)| c.clone())
        };
        let channel = match cached {
            Some(c) => c,
            None => {
                // Keepalive drops the connection to a leader that went silent, and every
                // call has a deadline, so a paused leader cannot hold a forwarded call.
                let c = strata_proto::tls::live_endpoint(addr, self.config.tls.as_deref())
                    .map_err(|e| Status::internal(e.to_string()))?
                    .timeout(FORWARD_TIMEOUT)
                    .connect()
                    .await
                    .map_err(|e| {
                        Status::unavailable(format!(
                            "cannot reach the controller leader at {addr}: {e}"
                        ))
                    })?;
                *self
                    .leader_channel
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = Some((leader, c.clone()));
                c
            }
        };
        Ok(Some(ControllerClient::new(channel)))
    }

    /// This controller's address as the voters list (and so the brokers' config) gives it.
    fn own_addr(&self) -> String {
        self.config
            .voters
            .get(&self.config.node_id)
            .cloned()
            .unwrap_or_default()
    }

    /// On the leader: grants leases on taking over, then fences brokers whose lease ran out.
    ///
    /// Brokers are fenced only for their own silence. A leader that was itself unable to
    /// listen (paused or starved for half a lease: its ticks came late) grants every lease afresh, as on
    /// taking over, because the heartbeats it missed say nothing about the brokers; and a
    /// fencing is a Raft write, so a leader that lost its quorum cannot fence at all.
    async fn lease_loop(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        // Fencing comes at most a tick after a lease runs out.
        let period = self.config.broker_lease / 20;
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut leading = false;
        let mut last = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.wait_for(|s| *s) => return,
            }
            let now_instant = tokio::time::Instant::now();
            let gap = now_instant - last;
            last = now_instant;
            if gap > self.config.broker_lease / 2 {
                tracing::warn!(gap_ms = gap.as_millis() as u64, "controller was not running for a while (paused or starved); renewing every broker's lease before judging any");
                leading = false;
            }
            if !self.is_leader() {
                leading = false;
                continue;
            }
            let now = now_ms();
            let metadata = self.state.current();
            let expired = {
                let mut leases = self.leases.lock().unwrap_or_else(|e| e.into_inner());
                if !leading {
                    leases.grant_all(&metadata, now);
                    leading = true;
                }
                leases.expired(&metadata, now)
            };
            for (id, epoch) in expired {
                tracing::warn!(broker = id, epoch, "broker lease expired; fencing");
                if let Err(e) = self.propose(Command::FenceBroker { id, epoch }).await {
                    tracing::warn!(broker = id, error = %e.message(), "fencing failed; will retry");
                }
            }
        }
    }
}

struct ControllerService(Arc<Controller>);

/// Who may call an RPC when the port proves its peers (mTLS). Without mTLS every call is
/// admitted: a development cluster on 127.0.0.1.
#[derive(Debug, Clone, Copy)]
enum Caller {
    /// The broker the request names (its registration, lease, ISR, shutdown, producer ids),
    /// or a controller forwarding such a request after checking it.
    Broker(i32),
    /// A node (broker or controller) or an admin: reading the metadata, which holds the
    /// SCRAM stored keys and the ACLs.
    Node,
    /// An admin principal (`[auth] super_users`), a controller forwarding, or a broker acting
    /// for a Kafka client it has authorized: topics, configs, credentials, ACLs.
    Admin,
}

/// Whether `peer` may make a call that needs `caller` (on a port with mTLS).
fn admitted(
    peer: &Peer,
    caller: Caller,
    voters: &BTreeMap<NodeId, String>,
    admins: &[String],
) -> bool {
    match (peer, caller) {
        (Peer::Controller(id), _) => voters.contains_key(id),
        (Peer::Broker(id), Caller::Broker(named)) => *id == named,
        (Peer::Broker(_), Caller::Node | Caller::Admin) => true,
        (Peer::User(p), Caller::Node | Caller::Admin) => admins.contains(p),
        (Peer::User(_) | Peer::Unauthenticated, Caller::Broker(_)) | (Peer::Unauthenticated, _) => {
            false
        }
    }
}

impl ControllerService {
    fn admit<T>(&self, req: &Request<T>, caller: Caller) -> Result<(), Status> {
        let config = &self.0.config;
        if config.tls.is_none() {
            return Ok(());
        }
        let peer = Peer::of(req);
        if admitted(&peer, caller, &config.voters, &config.admins) {
            return Ok(());
        }
        let needed = match caller {
            Caller::Broker(id) => format!("the certificate of broker {id} (CN=broker-{id})"),
            Caller::Node => "a node certificate or an admin principal".into(),
            Caller::Admin => "an admin principal ([auth] super_users) or a node".into(),
        };
        tracing::warn!(%peer, ?caller, "controller request refused");
        Err(Status::permission_denied(format!(
            "this request needs {needed}; it came from {peer}"
        )))
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<MetadataUpdate, Status>> + Send>>;
type SessionStream = Pin<Box<dyn Stream<Item = Result<SessionEvent, Status>> + Send>>;

fn snapshot_update(
    m: &ClusterMetadata,
    contact: Option<Duration>,
    stale_after: Duration,
) -> Result<MetadataUpdate, Status> {
    Ok(MetadataUpdate {
        update: Some(metadata_update::Update::Snapshot(MetadataSnapshot {
            version: m.version,
            metadata_json: serde_json::to_vec(m).map_err(|e| Status::internal(e.to_string()))?,
            possibly_stale: contact.is_none_or(|age| age > stale_after),
            quorum_contact_age_ms: contact.map(|age| age.as_millis() as u64),
        })),
    })
}

fn entry_update(index: u64, command: &Option<Command>) -> Result<MetadataUpdate, Status> {
    let command_json = match command {
        Some(c) => serde_json::to_vec(c).map_err(|e| Status::internal(e.to_string()))?,
        None => Vec::new(),
    };
    Ok(MetadataUpdate {
        update: Some(metadata_update::Update::Entry(MetadataEntry {
            index,
            command_json,
        })),
    })
}

#[tonic::async_trait]
impl ControllerApi for ControllerService {
    async fn register_broker(
        &self,
        req: Request<RegisterBrokerRequest>,
    ) -> Result<Response<RegisterBrokerResponse>, Status> {
        self.admit(&req, Caller::Broker(req.get_ref().broker_id))?;
        if let Some(mut leader) = self.0.forward().await? {
            return leader.register_broker(req.into_inner()).await;
        }
        let r = req.into_inner();
        let incarnation = Uuid::parse_str(&r.incarnation).map_err(|e| {
            Status::invalid_argument(format!(
                "incarnation '{}' is not a UUID: {e}",
                r.incarnation
            ))
        })?;
        let endpoints = r
            .endpoints
            .into_iter()
            .map(|e| {
                Ok(EndpointRecord {
                    name: e.name,
                    host: e.host,
                    port: u16::try_from(e.port).map_err(|_| {
                        Status::invalid_argument(format!("port {} is out of range", e.port))
                    })?,
                })
            })
            .collect::<Result<Vec<_>, Status>>()?;
        let cmd = Command::RegisterBroker {
            id: r.broker_id,
            incarnation,
            endpoints,
            rack: r.rack,
        };
        let Applied::BrokerRegistered { epoch } = self.0.propose(cmd).await? else {
            return Err(Status::internal("unexpected answer to a registration"));
        };
        self.0
            .leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .registered(r.broker_id, epoch, now_ms());
        tracing::info!(broker = r.broker_id, epoch, "broker registered");
        Ok(Response::new(RegisterBrokerResponse {
            broker_epoch: epoch,
            lease_ms: self.0.config.broker_lease.as_millis() as u64,
        }))
    }

    async fn heartbeat(
        &self,
        req: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        self.admit(&req, Caller::Broker(req.get_ref().broker_id))?;
        if let Some(mut leader) = self.0.forward().await? {
            return leader.heartbeat(req.into_inner()).await;
        }
        let r = req.into_inner();
        if self
            .0
            .dead
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&(r.broker_id, r.broker_epoch))
        {
            return Err(Status::not_found(format!(
                "broker {} at epoch {} closed its session (its process ended); register again",
                r.broker_id, r.broker_epoch
            )));
        }
        // Only a leader a quorum still follows may renew a lease: a leader cut off from the
        // other controllers (but not from this broker) would otherwise keep the broker
        // leading while the majority, which hears nothing from it, fences it and elects
        // other leaders. This asks the quorum (one heartbeat round).
        self.0.raft.ensure_linearizable().await.map_err(|e| {
            Status::unavailable(format!(
                "controller {} cannot confirm it still leads ({e}); ask another",
                self.0.config.node_id
            ))
        })?;
        let metadata = self.0.state.current();
        let fenced = self
            .0
            .leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .heartbeat(&metadata, r.broker_id, r.broker_epoch, now_ms())
            .map_err(|e| match e {
                HeartbeatError::UnknownBroker(_) => Status::not_found(e.to_string()),
                HeartbeatError::StaleEpoch { .. } => Status::failed_precondition(e.to_string()),
            })?;
        let mut lead_from_version = 0;
        if fenced {
            tracing::info!(
                broker = r.broker_id,
                "fenced broker is heartbeating again; unfencing"
            );
            let (_, index) = self
                .0
                .propose_at(Command::UnfenceBroker {
                    id: r.broker_id,
                    epoch: r.broker_epoch,
                })
                .await?;
            // Its leaderships moved while it was fenced: it must see that before leading.
            lead_from_version = index;
        }
        Ok(Response::new(HeartbeatResponse {
            fenced: false,
            leader_addr: self.0.own_addr(),
            lead_from_version,
        }))
    }

    async fn controlled_shutdown(
        &self,
        req: Request<ControlledShutdownRequest>,
    ) -> Result<Response<ControlledShutdownResponse>, Status> {
        self.admit(&req, Caller::Broker(req.get_ref().broker_id))?;
        if let Some(mut leader) = self.0.forward().await? {
            return leader.controlled_shutdown(req.into_inner()).await;
        }
        let r = req.into_inner();
        self.0
            .propose(Command::FenceBroker {
                id: r.broker_id,
                epoch: r.broker_epoch,
            })
            .await?;
        tracing::info!(
            broker = r.broker_id,
            "controlled shutdown: leaderships moved"
        );
        Ok(Response::new(ControlledShutdownResponse {}))
    }

    type WatchStream = WatchStream;
    type SessionStream = SessionStream;

    async fn session(
        &self,
        req: Request<SessionRequest>,
    ) -> Result<Response<SessionStream>, Status> {
        self.admit(&req, Caller::Broker(req.get_ref().broker_id))?;
        let controller = self.0.clone();
        if !controller.is_leader() {
            return Err(Status::unavailable(format!(
                "controller {} is not the leader (leader: {:?}); open the session with the leader",
                controller.config.node_id,
                controller.leader()
            )));
        }
        let SessionRequest {
            broker_id: id,
            broker_epoch: epoch,
        } = req.into_inner();
        let live = move |m: &ClusterMetadata| {
            m.brokers
                .get(&id)
                .is_some_and(|b| b.epoch == epoch && !b.fenced)
        };
        if !live(&controller.state.current()) {
            return Err(Status::failed_precondition(format!(
                "broker {id} at epoch {epoch} is not a live registration"
            )));
        }
        let (tx, out) = tokio::sync::mpsc::channel::<Result<SessionEvent, Status>>(1);
        tokio::spawn(async move {
            let mut raft = controller.raft.metrics();
            let lost_leadership = async {
                while controller.is_leader() {
                    if raft.changed().await.is_err() {
                        return;
                    }
                }
            };
            tokio::select! {
                _ = tx.closed() => {
                    // The broker's end of the connection closed: its process is gone.
                    if controller.is_leader() && live(&controller.state.current()) {
                        controller.dead.lock().unwrap_or_else(|e| e.into_inner()).insert((id, epoch));
                        tracing::warn!(broker = id, epoch, "broker connection closed; fencing it now rather than at lease expiry");
                        if let Err(e) = controller.propose(Command::FenceBroker { id, epoch }).await {
                            tracing::warn!(broker = id, error = %e.message(), "fencing failed; the lease will");
                        }
                    }
                }
                // Dropping `tx` ends the stream: the broker reconnects to the new leader.
                _ = lost_leadership => {}
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(out),
        )))
    }

    async fn watch(&self, req: Request<WatchRequest>) -> Result<Response<WatchStream>, Status> {
        self.admit(&req, Caller::Node)?;
        let from = req.into_inner().from_version;
        let controller = self.0.clone();
        let mut rx = controller.metadata();
        let (tx, out) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            // `sent`: the version the watcher holds. From 0 it gets a snapshot (even of an empty
            // state); afterwards the log entries after it, or a snapshot when they are gone.
            let mut sent: Option<u64> = (from > 0).then_some(from);
            loop {
                let current = rx.borrow_and_update().clone();
                let updates: Vec<Result<MetadataUpdate, Status>> = match sent {
                    Some(v) if v >= current.version => Vec::new(),
                    Some(v) => match controller.state.entries_since(v) {
                        Some(entries) => entries.iter().map(|(i, c)| entry_update(*i, c)).collect(),
                        None => vec![snapshot_update(
                            &current,
                            controller.quorum_contact_age(),
                            controller.stale_after(),
                        )],
                    },
                    None => vec![snapshot_update(
                        &current,
                        controller.quorum_contact_age(),
                        controller.stale_after(),
                    )],
                };
                for u in updates {
                    if let Ok(MetadataUpdate {
                        update: Some(metadata_update::Update::Entry(e)),
                    }) = &u
                    {
                        sent = Some(e.index);
                    } else {
                        sent = Some(current.version);
                    }
                    if tx.send(u).await.is_err() {
                        return;
                    }
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(out),
        )))
    }

    async fn create_topic(
        &self,
        req: Request<CreateTopicRequest>,
    ) -> Result<Response<CreateTopicResponse>, Status> {
        self.admit(&req, Caller::Admin)?;
        if let Some(mut leader) = self.0.forward().await? {
            return leader.create_topic(req.into_inner()).await;
        }
        let r = req.into_inner();
        strata_core::topic::validate_topic_name(&r.name).map_err(Status::invalid_argument)?;
        let rf = u16::try_from(r.replication_factor).map_err(|_| {
            Status::invalid_argument(format!(
                "replication factor {} is too large",
                r.replication_factor
            ))
        })?;
        let cmd = Command::CreateTopic {
            name: r.name.clone(),
            id: Uuid::new_v4(),
            partitions: r.partitions,
            replication_factor: rf,
            configs: r.configs.into_iter().collect(),
            assignments: r.assignments.into_iter().map(|a| a.brokers).collect(),
        };
        match self.0.propose(cmd).await? {
            Applied::TopicCreated { id, created } => {
                if created {
                    tracing::info!(topic = %r.name, partitions = r.partitions, rf, "created topic");
                }
                // The state machine has applied the entry, so its version includes the topic.
                let version = self.0.state.current().version;
                Ok(Response::new(CreateTopicResponse {
                    topic_id: id.to_string(),
                    created,
                    version,
                }))
            }
            other => Err(Status::internal(format!(
                "unexpected answer to a topic creation: {other:?}"
            ))),
        }
    }

    async fn delete_topic(
        &self,
        req: Request<DeleteTopicRequest>,
    ) -> Result<Response<DeleteTopicResponse>, Status> {
        self.admit(&req, Caller::Admin)?;
        if let Some(mut leader) = self.0.forward().await? {
            return leader.delete_topic(req.into_inner()).await;
        }
        self.0
            .propose(Command::DeleteTopic {
                name: req.into_inner().name,
            })
            .await?;
        Ok(Response::new(DeleteTopicResponse {}))
    }

    async fn alter_topic_configs(
        &self,
        req: Request<AlterTopicConfigsRequest>,
    ) -> Result<Response<AlterTopicConfigsResponse>, Status> {
        self.admit(&req, Caller::Admin)?;
        if let Some(mut leader) = self.0.forward().await? {
            return leader.alter_topic_configs(req.into_inner()).await;
        }
        let r = req.into_inner();
        let cmd = Command::AlterTopicConfigs {
            name: r.name.clone(),
            set: r.set.into_iter().collect(),
            remove: r.remove,
        };
        self.0.propose(cmd).await?;
        tracing::info!(topic = %r.name, "altered topic configs");
        Ok(Response::new(AlterTopicConfigsResponse {
            version: self.0.state.current().version,
        }))
    }

    async fn create_partitions(
        &self,
        req: Request<CreatePartitionsRequest>,
    ) -> Result<Response<CreatePartitionsResponse>, Status> {
        self.admit(&req, Caller::Admin)?;
        if let Some(mut leader) = self.0.forward().await? {
            return leader.create_partitions(req.into_inner()).await;
        }
        let r = req.into_inner();
        self.0
            .propose(Command::CreatePartitions {
                name: r.name.clone(),
                total: r.total,
                assignments: r.assignments.into_iter().map(|a| a.brokers).collect(),
            })
            .await?;
        tracing::info!(topic = %r.name, total = r.total, "added partitions");
        Ok(Response::new(CreatePartitionsResponse {
            version: self.0.state.current().version,
        }))
    }

    async fn elect_leaders(
        &self,
        req: Request<ElectLeadersRequest>,
    ) -> Result<Response<ElectLeadersResponse>, Status> {
        self.admit(&req, Caller::Admin)?;
        if let Some(mut leader) = self.0.forward().await? {
            return leader.elect_leaders(req.into_inner()).await;
        }
        let r = req.into_inner();
        let current = self.0.state.current();
        let asked: Vec<(String, u32)> = if r.all {
            current
                .topics
                .values()
                .flat_map(|t| (0..t.partitions.len() as u32).map(|i| (t.name.clone(), i)))
                .collect()
        } else {
            r.partitions
                .into_iter()
                .map(|p| (p.topic, p.partition))
                .collect()
        };
        if asked.len() > MAX_ELECTIONS {
            return Err(Status::invalid_argument(format!(
                "{} partitions in one ElectLeaders; at most {MAX_ELECTIONS}",
                asked.len()
            )));
        }
        let mut results = Vec::with_capacity(asked.len());
        for (topic, partition) in asked {
            let cmd = Command::ElectLeader {
                topic: topic.clone(),
                partition,
                unclean: r.unclean,
            };
            let (error_code, message) = match self.0.propose_or_refusal(cmd).await? {
                Ok(_) => {
                    tracing::info!(%topic, partition, unclean = r.unclean, "leader elected on request");
                    (0, String::new())
                }
                // With every partition asked for, those already led as asked are left out.
                Err(MetadataError::ElectionNotNeeded { .. }) if r.all => continue,
                Err(e) => (election_error_code(&e), e.to_string()),
            };
            let leader = self
                .0
                .state
                .current()
                .topics
                .get(&topic)
                .and_then(|t| t.partitions.get(partition as usize))
                .and_then(|p| p.leader)
                .unwrap_or(-1);
            results.push(ElectLeaderResult {
                topic,
                partition,
                error_code,
                message,
                leader,
            });
        }
        Ok(Response::new(ElectLeadersResponse {
            results,
            version: self.0.state.current().version,
        }))
    }

    async fn reassign_partitions(
        &self,
        req: Request<ReassignPartitionsRequest>,
    ) -> Result<Response<ReassignPartitionsResponse>, Status> {
        self.admit(&req, Caller::Admin)?;
        if let Some(mut leader) = self.0.forward().await? {
            return leader.reassign_partitions(req.into_inner()).await;
        }
        let r = req.into_inner();
        if r.moves.len() > MAX_ELECTIONS {
            return Err(Status::invalid_argument(format!(
                "{} partitions in one reassignment; at most {MAX_ELECTIONS}",
                r.moves.len()
            )));
        }
        let mut results = Vec::with_capacity(r.moves.len());
        for m in r.moves {
            let target = (!m.cancel).then_some(m.replicas);
            let cmd = Command::ReassignPartition {
                topic: m.topic.clone(),
                partition: m.partition,
                target: target.clone(),
                throttle: (m.throttle_bytes_per_second > 0).then_some(m.throttle_bytes_per_second),
            };
            let (error_code, message) = match self.0.propose_or_refusal(cmd).await? {
                Ok(_) => {
                    tracing::info!(topic = %m.topic, partition = m.partition, ?target, "partition reassignment changed");
                    (0, String::new())
                }
                Err(e) => (reassignment_error_code(&e), e.to_string()),
            };
            results.push(ReassignPartitionResult {
                topic: m.topic,
                partition: m.partition,
                error_code,
                message,
            });
        }
        Ok(Response::new(ReassignPartitionsResponse {
            results,
            version: self.0.state.current().version,
        }))
    }

    async fn alter_isr(
        &self,
        req: Request<AlterIsrRequest>,
    ) -> Result<Response<AlterIsrResponse>, Status> {
        self.admit(&req, Caller::Broker(req.get_ref().broker_id))?;
        if let Some(mut leader) = self.0.forward().await? {
            return leader.alter_isr(req.into_inner()).await;
        }
        let r = req.into_inner();
        let current = self.0.state.current();
        match current.brokers.get(&r.broker_id) {
            Some(b) if b.epoch == r.broker_epoch && !b.fenced => {}
            _ => {
                return Err(Status::failed_precondition(format!(
                    "broker {} at epoch {} is not a live registration",
                    r.broker_id, r.broker_epoch
                )))
            }
        }
        let applied = self
            .0
            .propose(Command::AlterIsr {
                topic: r.topic.clone(),
                partition: r.partition,
                leader: r.broker_id,
                leader_epoch: r.leader_epoch,
                partition_epoch: r.partition_epoch,
                isr: r.isr.clone(),
                joining: r
                    .joining
                    .iter()
                    .map(|j| (j.broker_id, j.broker_epoch))
                    .collect(),
            })
            .await?;
        match applied {
            Applied::PartitionUpdated {
                leader_epoch,
                partition_epoch,
            } => {
                tracing::info!(topic = %r.topic, partition = r.partition, isr = ?r.isr, partition_epoch, "ISR changed");
                if crate::failpoint::take("controller-exit-after-alter-isr") {
                    // A test stages a controller that committed a change and died before
                    // answering it (the broker must learn the outcome from the metadata).
                    tracing::error!(
                        "failpoint controller-exit-after-alter-isr: exiting before the answer"
                    );
                    std::process::exit(86);
                }
                Ok(Response::new(AlterIsrResponse {
                    leader_epoch,
                    partition_epoch,
                    isr: r.isr,
                    version: self.0.state.current().version,
                }))
            }
            other => Err(Status::internal(format!(
                "unexpected answer to AlterIsr: {other:?}"
            ))),
        }
    }

    async fn allocate_producer_ids(
        &self,
        req: Request<AllocateProducerIdsRequest>,
    ) -> Result<Response<AllocateProducerIdsResponse>, Status> {
        self.admit(&req, Caller::Broker(req.get_ref().broker_id))?;
        if let Some(mut leader) = self.0.forward().await? {
            return leader.allocate_producer_ids(req.into_inner()).await;
        }
        let r = req.into_inner();
        match self
            .0
            .propose(Command::AllocateProducerIds {
                broker: r.broker_id,
                epoch: r.broker_epoch,
                count: r.count,
            })
            .await?
        {
            Applied::ProducerIds { first, count } => {
                Ok(Response::new(AllocateProducerIdsResponse { first, count }))
            }
            other => Err(Status::internal(format!(
                "unexpected answer to a producer-id request: {other:?}"
            ))),
        }
    }

    async fn describe_quorum(
        &self,
        req: Request<DescribeQuorumRequest>,
    ) -> Result<Response<DescribeQuorumResponse>, Status> {
        self.admit(&req, Caller::Node)?;
        let m = self.0.raft.metrics().borrow().clone();
        let voters: BTreeSet<NodeId> = m.membership_config.membership().voter_ids().collect();
        Ok(Response::new(DescribeQuorumResponse {
            node_id: self.0.config.node_id,
            leader_id: m.current_leader,
            term: m.current_term,
            last_applied: m.last_applied.map_or(0, |l| l.index),
            voters: voters.into_iter().collect(),
        }))
    }

    async fn alter_scram_credentials(
        &self,
        req: Request<AlterScramCredentialsRequest>,
    ) -> Result<Response<AlterScramCredentialsResponse>, Status> {
        self.admit(&req, Caller::Admin)?;
        if let Some(mut leader) = self.0.forward().await? {
            return leader.alter_scram_credentials(req.into_inner()).await;
        }
        let r = req.into_inner();
        let mechanism = |name: &str| {
            ScramMechanism::from_name(name).ok_or_else(|| {
                Status::invalid_argument(format!(
                    "unknown SCRAM mechanism '{name}' (SCRAM-SHA-256 or SCRAM-SHA-512)"
                ))
            })
        };
        let mut changes = Vec::new();
        for u in r.upsertions {
            let m = mechanism(&u.mechanism)?;
            let credential = ScramCredential {
                salt: u.salt,
                iterations: u.iterations,
                stored_key: u.stored_key,
                server_key: u.server_key,
            };
            let (user, mechanism) = (u.user.clone(), m);
            changes.push((
                "set",
                user,
                mechanism,
                Command::UpsertScramCredential {
                    user: u.user,
                    mechanism: m,
                    credential,
                },
            ));
        }
        for d in r.deletions {
            let m = mechanism(&d.mechanism)?;
            changes.push((
                "deleted",
                d.user.clone(),
                m,
                Command::DeleteScramCredential {
                    user: d.user,
                    mechanism: m,
                },
            ));
        }
        for (what, user, m, command) in changes {
            self.0.propose(command).await?;
            tracing::info!(%user, mechanism = m.name(), "SCRAM credential {what}");
        }
        Ok(Response::new(AlterScramCredentialsResponse {
            version: self.0.state.current().version,
        }))
    }

    async fn alter_client_quotas(
        &self,
        req: Request<AlterClientQuotasRequest>,
    ) -> Result<Response<AlterClientQuotasResponse>, Status> {
        self.admit(&req, Caller::Admin)?;
        if let Some(mut leader) = self.0.forward().await? {
            return leader.alter_client_quotas(req.into_inner()).await;
        }
        let alterations: Vec<crate::metadata::quota::QuotaAlteration> =
            serde_json::from_slice(&req.into_inner().alterations_json).map_err(|e| {
                Status::invalid_argument(format!("undecodable quota alterations: {e}"))
            })?;
        let n = alterations.len();
        self.0
            .propose(Command::AlterClientQuotas { alterations })
            .await?;
        tracing::info!(entities = n, "client quotas altered");
        Ok(Response::new(AlterClientQuotasResponse {
            version: self.0.state.current().version,
        }))
    }

    async fn alter_dynamic_configs(
        &self,
        req: Request<AlterDynamicConfigsRequest>,
    ) -> Result<Response<AlterDynamicConfigsResponse>, Status> {
        use crate::metadata::dynamic::ConfigScope;
        use strata_proto::v1::alter_dynamic_configs_request::Scope;
        self.admit(&req, Caller::Admin)?;
        if let Some(mut leader) = self.0.forward().await? {
            return leader.alter_dynamic_configs(req.into_inner()).await;
        }
        let r = req.into_inner();
        let scope = match r.scope {
            Some(Scope::ClusterDefault(_)) => ConfigScope::ClusterDefault,
            Some(Scope::Broker(id)) => ConfigScope::Broker(id),
            Some(Scope::Group(g)) => ConfigScope::Group(g),
            None => {
                return Err(Status::invalid_argument(
                    "a dynamic config change names its scope",
                ))
            }
        };
        let (set, remove) = (r.set.len(), r.remove.len());
        self.0
            .propose(Command::AlterDynamicConfigs {
                scope: scope.clone(),
                set: r.set.into_iter().collect(),
                remove: r.remove,
            })
            .await?;
        tracing::info!(scope = %scope.core(), set, remove, "dynamic configs altered");
        Ok(Response::new(AlterDynamicConfigsResponse {
            version: self.0.state.current().version,
        }))
    }

    async fn create_acls(
        &self,
        req: Request<CreateAclsRequest>,
    ) -> Result<Response<CreateAclsResponse>, Status> {
        self.admit(&req, Caller::Admin)?;
        if let Some(mut leader) = self.0.forward().await? {
            return leader.create_acls(req.into_inner()).await;
        }
        let acls: Vec<crate::metadata::acl::AclBinding> =
            serde_json::from_slice(&req.into_inner().acls_json)
                .map_err(|e| Status::invalid_argument(format!("undecodable ACL bindings: {e}")))?;
        let n = acls.len();
        self.0.propose(Command::CreateAcls { acls }).await?;
        tracing::info!(bindings = n, "ACLs created");
        Ok(Response::new(CreateAclsResponse {
            version: self.0.state.current().version,
        }))
    }

    async fn delete_acls(
        &self,
        req: Request<DeleteAclsRequest>,
    ) -> Result<Response<DeleteAclsResponse>, Status> {
        self.admit(&req, Caller::Admin)?;
        if let Some(mut leader) = self.0.forward().await? {
            return leader.delete_acls(req.into_inner()).await;
        }
        let filters: Vec<crate::metadata::acl::AclFilter> =
            serde_json::from_slice(&req.into_inner().filters_json)
                .map_err(|e| Status::invalid_argument(format!("undecodable ACL filters: {e}")))?;
        let deleted = match self.0.propose(Command::DeleteAcls { filters }).await? {
            Applied::AclsDeleted(d) => d,
            other => {
                return Err(Status::internal(format!(
                    "unexpected answer to DeleteAcls: {other:?}"
                )))
            }
        };
        tracing::info!(bindings = deleted.len(), "ACLs deleted");
        Ok(Response::new(DeleteAclsResponse {
            version: self.0.state.current().version,
            deleted_json: serde_json::to_vec(&deleted)
                .map_err(|e| Status::internal(e.to_string()))?,
        }))
    }

    async fn describe_scram_credentials(
        &self,
        req: Request<DescribeScramCredentialsRequest>,
    ) -> Result<Response<DescribeScramCredentialsResponse>, Status> {
        self.admit(&req, Caller::Node)?;
        let current = self.0.state.current();
        let credentials = current
            .scram_credentials
            .iter()
            .flat_map(|(user, of_user)| {
                of_user.iter().map(|(m, c)| ScramCredentialInfo {
                    user: user.clone(),
                    mechanism: m.name().to_string(),
                    iterations: c.iterations,
                })
            })
            .collect();
        Ok(Response::new(DescribeScramCredentialsResponse {
            credentials,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn start_single(
        dir: &std::path::Path,
        port: u16,
    ) -> (Arc<Controller>, watch::Sender<bool>) {
        let config = ControllerConfig {
            node_id: 1,
            listen: SocketAddr::from(([127, 0, 0, 1], port)),
            voters: [(1, format!("127.0.0.1:{port}"))].into(),
            data_dir: dir.to_path_buf(),
            broker_lease: Duration::from_secs(6),
            raft_heartbeat: Duration::from_millis(50),
            tls: None,
            admins: vec![],
            connections: Default::default(),
        };
        let (stop, stopped) = watch::channel(false);
        let c = Controller::start(config, stopped)
            .await
            .expect("controller starts");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !c.is_leader() {
            assert!(tokio::time::Instant::now() < deadline, "no leader elected");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (c, stop)
    }

    /// Issue 17: a CreatePartitions for 4,000,000,000 partitions aborted every controller,
    /// and since the entry was in the Raft log, aborted them again at every restart. Here the
    /// entry goes straight into the log (past the check `propose` makes, as a log written by
    /// an older version would hold it); it is refused when applied, and a restart that
    /// replays the log comes up with the topic as it was.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_log_holding_a_huge_partition_count_replays_and_the_controller_stays_up() {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let (c, stop) = start_single(dir.path(), port).await;
        c.propose(Command::RegisterBroker {
            id: 1,
            incarnation: Uuid::new_v4(),
            endpoints: vec![],
            rack: None,
        })
        .await
        .unwrap();
        c.propose(Command::CreateTopic {
            name: "settlements".into(),
            id: Uuid::new_v4(),
            partitions: 2,
            replication_factor: 1,
            configs: BTreeMap::new(),
            assignments: vec![],
        })
        .await
        .unwrap();
        let huge = Command::CreatePartitions {
            name: "settlements".into(),
            total: 4_000_000_000,
            assignments: vec![],
        };
        let refused = c.propose(huge.clone()).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
        let written = c
            .raft
            .client_write(huge)
            .await
            .expect("committed to the log");
        assert!(
            matches!(written.data.0, Err(MetadataError::InvalidPartitions(_))),
            "{:?}",
            written.data.0
        );
        let partitions = |c: &Controller| c.state.current().topics["settlements"].partitions.len();
        assert_eq!(partitions(&c), 2);
        stop.send_replace(true);
        let raft = c.raft.clone();
        drop(c);
        raft.shutdown().await.ok();
        drop(raft);
        // The port is free again once the server has stopped.
        let mut restarted = None;
        for _ in 0..100 {
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                restarted = Some(start_single(dir.path(), port).await);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (c, stop) = restarted.expect("the controller port was never released");
        assert_eq!(
            partitions(&c),
            2,
            "the replayed log left the topic as it was"
        );
        c.propose(Command::CreatePartitions {
            name: "settlements".into(),
            total: 3,
            assignments: vec![],
        })
        .await
        .expect("the restarted controller serves metadata writes");
        assert_eq!(partitions(&c), 3);
        stop.send_replace(true);
    }

    #[test]
    fn only_a_brokers_own_certificate_speaks_for_it() {
        let voters: BTreeMap<NodeId, String> = [(1, "a".into()), (2, "b".into())].into();
        let admins = vec!["User:CN=ops".to_string()];
        let ok = |peer: Peer, caller| admitted(&peer, caller, &voters, &admins);
        // a broker for itself, never for another (the RegisterBroker / ControlledShutdown attack)
        assert!(ok(Peer::Broker(1), Caller::Broker(1)));
        assert!(!ok(Peer::Broker(2), Caller::Broker(1)));
        assert!(!ok(Peer::User("User:CN=ops".into()), Caller::Broker(1)));
        // controllers forward after checking; a controller that is not a voter is nobody
        assert!(ok(Peer::Controller(2), Caller::Broker(1)));
        assert!(!ok(Peer::Controller(3), Caller::Admin));
        // admin calls: nodes and the configured admins only
        assert!(ok(Peer::Broker(2), Caller::Admin));
        assert!(ok(Peer::User("User:CN=ops".into()), Caller::Admin));
        assert!(!ok(Peer::User("User:CN=alice".into()), Caller::Admin));
        assert!(!ok(Peer::User("User:CN=alice".into()), Caller::Node));
        assert!(!ok(Peer::Unauthenticated, Caller::Node));
    }
}
