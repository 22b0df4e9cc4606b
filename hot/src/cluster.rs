//! The broker's link to the controller quorum: registration (a broker epoch per process
//! incarnation), heartbeats within the lease, re-registration when the controller no longer
//! knows this incarnation, the metadata stream into a local cache, and controlled shutdown.
//!
//! Any controller can be asked; they forward writes to the leader. Failures rotate to the
//! next controller with a short backoff, so losing a minority of controllers only delays.

use std::sync::Arc;
use std::time::Duration;

use strata_controller::metadata::{ClusterMetadata, Command};
use strata_proto::tls::GrpcTls;
use strata_proto::v1::controller_client::ControllerClient;
use strata_proto::v1::metadata_update;
use strata_proto::v1::{
    AllocateProducerIdsRequest, AlterClientQuotasRequest, AlterDynamicConfigsRequest,
    AlterIsrRequest, AlterIsrResponse, AlterScramCredentialsRequest, AlterTopicConfigsRequest,
    ControlledShutdownRequest, CreateAclsRequest, CreatePartitionsRequest, CreateTopicRequest,
    CreateTopicResponse, DeleteAclsRequest, DeleteTopicRequest, Endpoint, HeartbeatRequest,
    JoiningReplica, MetadataUpdate, RegisterBrokerRequest, ScramDeletion, ScramUpsertion,
    SessionRequest, WatchRequest,
};
use tokio::sync::watch;
use tonic::transport::Channel;
use tonic::Code;
use uuid::Uuid;

/// How this broker presents itself to the controllers.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    pub broker_id: i32,
    pub controllers: Vec<String>,
    /// Every Kafka listener: (name, advertised host, advertised port).
    pub kafka: Vec<(String, String, u16)>,
    /// The host the gRPC data plane is reached at.
    pub grpc_host: String,
    /// The broker's gRPC data-plane port, when it serves one.
    pub grpc_port: Option<u16>,
    pub rack: Option<String>,
    /// What Kafka clients are told the cluster is called.
    pub cluster_id: String,
    /// This broker's certificate toward the controllers and the leaders it follows (mTLS);
    /// `None`: plaintext.
    pub tls: Option<Arc<GrpcTls>>,
    /// Where the logs live: probed for room after a write failed for want of space.
    pub data_dir: std::path::PathBuf,
}

/// The registration and metadata cache shared with the rest of the broker.
pub struct ClusterLink {
    config: LinkConfig,
    incarnation: Uuid,
    /// The broker epoch of the current registration, once registered.
    epoch: watch::Sender<Option<u64>>,
    /// The newest metadata seen, with its version.
    metadata: watch::Sender<Arc<ClusterMetadata>>,
    /// How long this broker may still act as a leader, by its own clock.
    lease: std::sync::Mutex<Lease>,
    /// The active controller's address, as the last heartbeat's answer named it.
    active: watch::Sender<Option<String>>,
    /// `holds_lease()`, published when it changes (checked every 100 ms).
    leading: watch::Sender<bool>,
    /// A write to the data directory failed for want of space (see `storage_error`): this
    /// broker steps out of the cluster until the directory has room again.
    disk_full: watch::Sender<bool>,
    /// A partition this broker leads failed its storage (an fsync returned an error): the
    /// broker steps out of the cluster, so that its leaderships move and it never leads again
    /// in the epoch that failed, until the broker has restarted the partition (see
    /// `Broker::spawn_storage_recovery`).
    storage_fault: watch::Sender<bool>,
}

/// The broker's own view of its lease (see `holds_lease`).
#[derive(Debug, Default, Clone, Copy)]
struct Lease {
    /// When the lease runs out: the last renewal's send time plus the lease, less a margin
    /// for clock-rate drift.
    until: Option<tokio::time::Instant>,
    /// The metadata version this broker must have seen before it leads again (after an
    /// unfencing: the leaderships it lost meanwhile are in it).
    lead_from_version: u64,
}

const RETRY: Duration = Duration::from_millis(300);
/// What a full data directory must take again before this broker rejoins (written, synced
/// and removed): enough for the writes waiting to be retried not to fill it at once.
const DISK_PROBE_BYTES: usize = 4 << 20;
/// How often a full data directory is probed for room.
const DISK_PROBE_EVERY: Duration = Duration::from_millis(500);
/// How long an admin call keeps trying other controllers.
const CALL_DEADLINE: Duration = Duration::from_secs(15);
/// How long one unary call to a controller may take before another controller is tried.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(3);

/// A client for unary calls and the metadata watch: keepalive notices a silent controller,
/// and every unary call has a deadline.
async fn connect(addr: &str, tls: Option<&GrpcTls>) -> Option<ControllerClient<Channel>> {
    let endpoint = strata_proto::tls::live_endpoint(addr, tls)
        .ok()?
        .timeout(ATTEMPT_TIMEOUT);
    endpoint.connect().await.ok().map(ControllerClient::new)
}

/// A client for the session stream: no keepalive, so this broker never closes a session
/// because its controller is slow. The controllers fence a broker whose session closes, so
/// only the death of this process (or its own deliberate re-registration) may close one.
async fn connect_for_session(
    addr: &str,
    tls: Option<&GrpcTls>,
) -> Option<ControllerClient<Channel>> {
    let endpoint = strata_proto::tls::endpoint(addr, tls)
        .ok()?
        .connect_timeout(Duration::from_secs(2));
    endpoint.connect().await.ok().map(ControllerClient::new)
}

/// The first heartbeat answer from any controller, all asked at once: an answer, or a
/// refusal that says the registration is gone (NotFound, FailedPrecondition); otherwise the
/// last error.
async fn first_heartbeat(
    beats: &[ControllerClient<Channel>],
    req: HeartbeatRequest,
) -> Result<(usize, tonic::Response<strata_proto::v1::HeartbeatResponse>), tonic::Status> {
    use futures_util::stream::{FuturesUnordered, StreamExt};
    let mut asks: FuturesUnordered<_> = beats
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut c = c.clone();
            async move { (i, c.heartbeat(req).await) }
        })
        .collect();
    let mut last = tonic::Status::unavailable("no controller configured");
    while let Some((i, answer)) = asks.next().await {
        match answer {
            Ok(resp) => return Ok((i, resp)),
            Err(e) if matches!(e.code(), Code::NotFound | Code::FailedPrecondition) => {
                return Err(e)
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Whether a write failed for want of space: ENOSPC or EDQUOT.
fn out_of_space(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

impl ClusterLink {
    /// Starts registering, heartbeating and watching metadata until `shutdown` turns true;
    /// then asks for a controlled shutdown. The returned task ends when that is done.
    pub fn start(
        config: LinkConfig,
        shutdown: watch::Receiver<bool>,
    ) -> (Arc<ClusterLink>, tokio::task::JoinHandle<()>) {
        let link = Arc::new(ClusterLink {
            config,
            incarnation: Uuid::new_v4(),
            epoch: watch::channel(None).0,
            metadata: watch::channel(Arc::new(ClusterMetadata::default())).0,
            lease: std::sync::Mutex::new(Lease::default()),
            active: watch::channel(None).0,
            leading: watch::channel(false).0,
            disk_full: watch::channel(false).0,
            storage_fault: watch::channel(false).0,
        });
        let membership = tokio::spawn(link.clone().membership_loop(shutdown.clone()));
        tokio::spawn(link.clone().session_loop(shutdown.clone()));
        tokio::spawn(link.clone().lease_watch(shutdown.clone()));
        tokio::spawn(link.clone().watch_loop(shutdown));
        (link, membership)
    }

    pub fn metadata(&self) -> watch::Receiver<Arc<ClusterMetadata>> {
        self.metadata.subscribe()
    }

    pub fn epoch(&self) -> Option<u64> {
        *self.epoch.borrow()
    }

    /// Changes of this broker's registration epoch.
    pub fn watch_epoch(&self) -> watch::Receiver<Option<u64>> {
        self.epoch.subscribe()
    }

    /// Whether this broker may act as a leader now: its lease, renewed by heartbeats, has
    /// not run out by its own clock, and after an unfencing it has seen the metadata that
    /// says which leaderships it lost.
    ///
    /// The lease counts from when a heartbeat was *sent*; the active controller counts its
    /// own from when it *received* one, which is later. So a broker cut off from the
    /// controllers stops leading before they can fence it and elect another leader: two
    /// brokers lead one partition at once only if their clocks run at rates more than the
    /// margin (1% of the lease) apart.
    pub fn holds_lease(&self) -> bool {
        let lease = *self.lease.lock().unwrap_or_else(|e| e.into_inner());
        lease
            .until
            .is_some_and(|until| tokio::time::Instant::now() < until)
            && self.metadata.borrow().version >= lease.lead_from_version
    }

    fn renew_lease(&self, sent: tokio::time::Instant, lease: Duration, lead_from_version: u64) {
        let mut l = self.lease.lock().unwrap_or_else(|e| e.into_inner());
        let until = sent + lease - lease / 100;
        if l.until.is_none_or(|u| u < until) {
            l.until = Some(until);
        }
        l.lead_from_version = l.lead_from_version.max(lead_from_version);
        drop(l);
        let now = self.holds_lease();
        self.leading
            .send_if_modified(|held| std::mem::replace(held, now) != now);
    }

    /// Whether this broker holds its lease, as last published (see `holds_lease`).
    pub fn leading(&self) -> watch::Receiver<bool> {
        self.leading.subscribe()
    }

    /// Publishes and logs when this broker stops and starts acting as a leader by its lease.
    async fn lease_watch(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut held = false;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                _ = shutdown.wait_for(|s| *s) => return,
            }
            let now = self.holds_lease();
            if now == held {
                continue;
            }
            held = now;
            self.leading.send_replace(now);
            if now {
                tracing::info!(broker = self.config.broker_id, "lease renewed: acting as the leader of the partitions the metadata gives this broker");
            } else if self.epoch().is_some() {
                tracing::warn!(broker = self.config.broker_id, "lease ran out (no controller renewed it): not acting as a leader until one does; producers and consumers are told NOT_LEADER_OR_FOLLOWER");
            }
        }
    }

    /// Reports a failed write to the data directory. One that failed for want of space
    /// (ENOSPC or a quota) takes this broker out of the cluster, as Kafka takes a failed log
    /// directory offline: it asks the controllers to fence it, which moves its leaderships to
    /// in-sync followers and takes it out of every ISR, so producers go on elsewhere at once
    /// instead of retrying KAFKA_STORAGE_ERROR here until someone frees space. It registers
    /// again, and catches up as a follower, once the directory takes writes again (probed
    /// every 500 ms). With no other live broker to hand over to (a single node, or the last
    /// one standing) it stays: its partitions keep serving reads, and writes fail until
    /// space is freed.
    pub fn storage_error(&self, e: &std::io::Error) {
        if !out_of_space(e) {
            return;
        }
        let me = self.config.broker_id;
        let others = self
            .metadata
            .borrow()
            .brokers
            .values()
            .any(|b| b.id != me && !b.fenced);
        if !others {
            return;
        }
        if !self.disk_full.send_replace(true) {
            tracing::error!(
                broker = self.config.broker_id,
                data_dir = %self.config.data_dir.display(),
                error = %e,
                "the data directory is full: leaving the cluster (leaderships move to in-sync followers) until it has room again; free space there"
            );
        }
    }

    /// Whether the data directory takes a write of `DISK_PROBE_BYTES` again (written,
    /// synced, removed).
    async fn disk_has_room(&self) -> bool {
        let path = self.config.data_dir.join(".space-probe");
        let probe = path.clone();
        let ok = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            use std::io::Write;
            let mut f = strata_core::private_fs::create(&probe)?;
            f.write_all(&vec![0u8; DISK_PROBE_BYTES])?;
            f.sync_all()
        })
        .await
        .is_ok_and(|r| r.is_ok());
        let _ = std::fs::remove_file(&path);
        ok
    }

    /// Takes this broker out of the cluster while `on` (a led partition's storage failed),
    /// and lets it register again when it is turned off.
    pub fn storage_fault(&self, on: bool) {
        let changed = self
            .storage_fault
            .send_if_modified(|f| std::mem::replace(f, on) != on);
        if changed && on {
            tracing::error!(
                broker = self.config.broker_id,
                "a partition this broker leads failed its storage: leaving the cluster (leaderships move to in-sync followers) until the partition is restarted"
            );
        }
    }

    /// Whether this broker is out of the cluster for a storage fault and has left: no
    /// registration is left that the controllers could give leaderships to.
    pub fn out_for_storage_fault(&self) -> bool {
        *self.storage_fault.borrow() && self.epoch().is_none()
    }

    /// While the data directory is full or a led partition's storage failed: leaves the
    /// cluster (a controlled shutdown of this registration), then waits for room and for the
    /// storage fault to be over. Returns once both are.
    async fn sit_out(&self, shutdown: &mut watch::Receiver<bool>) {
        if let Some(epoch) = self.epoch() {
            self.drop_lease();
            self.leading.send_replace(false);
            match self.controlled_shutdown(epoch, CALL_DEADLINE).await {
                Ok(Ok(())) => tracing::warn!(
                    broker = self.config.broker_id,
                    "left the cluster for a storage problem: leaderships moved away"
                ),
                // the lease is dropped: the controllers fence this broker when it runs out
                Ok(Err(e)) => tracing::warn!(error = %e.message(), "leaving the cluster for a storage problem: controlled shutdown refused; the lease will run out instead"),
                Err(_) => tracing::warn!("leaving the cluster for a storage problem: controlled shutdown timed out; the lease will run out instead"),
            }
            self.epoch.send_replace(None);
        }
        let mut fault = self.storage_fault.subscribe();
        loop {
            if *shutdown.borrow() {
                return;
            }
            if *self.disk_full.borrow() && self.disk_has_room().await {
                self.disk_full.send_replace(false);
                tracing::info!(
                    broker = self.config.broker_id,
                    "the data directory has room again"
                );
            }
            if !*self.disk_full.borrow() && !*fault.borrow_and_update() {
                tracing::info!(
                    broker = self.config.broker_id,
                    "storage is usable again: registering with the controllers"
                );
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(DISK_PROBE_EVERY) => {}
                _ = fault.changed() => {}
                _ = shutdown.wait_for(|s| *s) => {}
            }
        }
    }

    /// Where the active controller, as the heartbeats' answers name it, is in this broker's
    /// list of controllers.
    fn active_index(&self) -> Option<usize> {
        let active = self.active.borrow();
        let active = active.as_deref()?;
        self.config.controllers.iter().position(|c| c == active)
    }

    /// Asks the controllers to fence registration `epoch` and move its leaderships away
    /// (any live controller will do: the one heartbeats used may be gone), for up to
    /// `within`.
    async fn controlled_shutdown(
        &self,
        epoch: u64,
        within: Duration,
    ) -> Result<Result<(), tonic::Status>, tokio::time::error::Elapsed> {
        let req = ControlledShutdownRequest {
            broker_id: self.config.broker_id,
            broker_epoch: epoch,
        };
        let call = self.call(|mut c| async move { c.controlled_shutdown(req).await });
        tokio::time::timeout(within, call)
            .await
            .map(|r| r.map(|_| ()))
    }

    fn drop_lease(&self) {
        self.lease.lock().unwrap_or_else(|e| e.into_inner()).until = None;
    }

    pub fn cluster_id(&self) -> &str {
        &self.config.cluster_id
    }

    /// Runs `call` against the controllers, from the active one (as heartbeats name it),
    /// moving to the next one while they are unreachable or leaderless, for up to
    /// `CALL_DEADLINE`. (Starting anywhere else costs a forwarding hop, or, when that
    /// controller is cut off from the others, a whole attempt's deadline.)
    async fn call<T, F, Fut>(&self, call: F) -> Result<T, tonic::Status>
    where
        F: Fn(ControllerClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let deadline = tokio::time::Instant::now() + CALL_DEADLINE;
        let mut which = self.active_index().unwrap_or(0);
        loop {
            let client = tokio::time::timeout_at(deadline, self.any_controller(&mut which))
                .await
                .map_err(|_| tonic::Status::unavailable("no controller reachable"))?;
            match call(client).await {
                Ok(resp) => return Ok(resp.into_inner()),
                // unreachable, leaderless, or silent past the attempt's deadline
                Err(e)
                    if matches!(
                        e.code(),
                        Code::Unavailable | Code::Cancelled | Code::DeadlineExceeded
                    ) && tokio::time::Instant::now() < deadline =>
                {
                    which += 1;
                    tokio::time::sleep(RETRY).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    pub async fn create_topic(
        &self,
        name: &str,
        partitions: u32,
        replication_factor: u16,
        configs: &std::collections::BTreeMap<String, String>,
        assignments: &[Vec<i32>],
    ) -> Result<CreateTopicResponse, tonic::Status> {
        let req = CreateTopicRequest {
            name: name.to_string(),
            partitions,
            replication_factor: u32::from(replication_factor),
            configs: configs.clone().into_iter().collect(),
            assignments: assignments
                .iter()
                .map(|b| strata_proto::v1::ReplicaList { brokers: b.clone() })
                .collect(),
        };
        self.call(|mut c| {
            let req = req.clone();
            async move { c.create_topic(req).await }
        })
        .await
    }

    pub async fn delete_topic(&self, name: &str) -> Result<(), tonic::Status> {
        let req = DeleteTopicRequest {
            name: name.to_string(),
        };
        self.call(|mut c| {
            let req = req.clone();
            async move { c.delete_topic(req).await }
        })
        .await
        .map(|_| ())
    }

    /// Changes a topic's configs; returns a metadata version that includes the change.
    pub async fn alter_topic_configs(
        &self,
        name: &str,
        set: &std::collections::BTreeMap<String, String>,
        remove: &[String],
    ) -> Result<u64, tonic::Status> {
        let req = AlterTopicConfigsRequest {
            name: name.to_string(),
            set: set.clone().into_iter().collect(),
            remove: remove.to_vec(),
        };
        self.call(|mut c| {
            let req = req.clone();
            async move { c.alter_topic_configs(req).await }
        })
        .await
        .map(|r| r.version)
    }

    /// Grows a topic to `total` partitions; returns a metadata version that includes them.
    /// Grows topic `name` to `total` partitions; `assignments`: the new partitions' replicas
    /// (empty: the controllers place them).
    pub async fn create_partitions(
        &self,
        name: &str,
        total: u32,
        assignments: &[Vec<i32>],
    ) -> Result<u64, tonic::Status> {
        let req = CreatePartitionsRequest {
            name: name.to_string(),
            total,
            assignments: assignments
                .iter()
                .map(|b| strata_proto::v1::ReplicaList { brokers: b.clone() })
                .collect(),
        };
        self.call(|mut c| {
            let req = req.clone();
            async move { c.create_partitions(req).await }
        })
        .await
        .map(|r| r.version)
    }

    /// Kafka's ElectLeaders through the controllers: `partitions` `None` for every one.
    /// Returns each partition's (topic, partition, Kafka error code, message) and a
    /// metadata version that includes the elections.
    pub async fn elect_leaders(
        &self,
        unclean: bool,
        partitions: Option<Vec<(String, u32)>>,
    ) -> Result<(Vec<(String, u32, i16, String)>, u64), tonic::Status> {
        let req = strata_proto::v1::ElectLeadersRequest {
            unclean,
            all: partitions.is_none(),
            partitions: partitions
                .unwrap_or_default()
                .into_iter()
                .map(|(topic, partition)| strata_proto::v1::PartitionRef { topic, partition })
                .collect(),
        };
        let resp = self
            .call(|mut c| {
                let req = req.clone();
                async move { c.elect_leaders(req).await }
            })
            .await?;
        let results = resp
            .results
            .into_iter()
            .map(|r| {
                let code = i16::try_from(r.error_code).unwrap_or(-1);
                (r.topic, r.partition, code, r.message)
            })
            .collect();
        Ok((results, resp.version))
    }

    /// Kafka's AlterPartitionReassignments through the controllers. Returns each move's
    /// (topic, partition, Kafka error code, message) and a metadata version that includes
    /// the changes.
    pub async fn reassign_partitions(
        &self,
        moves: Vec<strata_proto::v1::PartitionMove>,
    ) -> Result<(Vec<(String, u32, i16, String)>, u64), tonic::Status> {
        let req = strata_proto::v1::ReassignPartitionsRequest { moves };
        let resp = self
            .call(|mut c| {
                let req = req.clone();
                async move { c.reassign_partitions(req).await }
            })
            .await?;
        let results = resp
            .results
            .into_iter()
            .map(|r| {
                let code = i16::try_from(r.error_code).unwrap_or(-1);
                (r.topic, r.partition, code, r.message)
            })
            .collect();
        Ok((results, resp.version))
    }

    /// Reserves `count` producer ids for this broker; returns the first.
    pub async fn allocate_producer_ids(&self, count: u32) -> Result<i64, tonic::Status> {
        let epoch = self
            .epoch()
            .ok_or_else(|| tonic::Status::unavailable("not registered with the controllers yet"))?;
        let req = AllocateProducerIdsRequest {
            broker_id: self.config.broker_id,
            broker_epoch: epoch,
            count,
        };
        self.call(|mut c| async move { c.allocate_producer_ids(req).await })
            .await
            .map(|r| r.first)
    }

    /// Adds ACL bindings through the controllers; returns a metadata version with them.
    pub async fn create_acls(
        &self,
        acls: &[strata_controller::metadata::acl::AclBinding],
    ) -> Result<u64, tonic::Status> {
        let acls_json =
            serde_json::to_vec(acls).map_err(|e| tonic::Status::internal(e.to_string()))?;
        self.call(|mut c| {
            let req = CreateAclsRequest {
                acls_json: acls_json.clone(),
            };
            async move { c.create_acls(req).await }
        })
        .await
        .map(|r| r.version)
    }

    /// Sets and removes client quotas through the controllers, all or none; returns a
    /// metadata version that includes them.
    pub async fn alter_client_quotas(
        &self,
        alterations: &[strata_controller::metadata::quota::QuotaAlteration],
    ) -> Result<u64, tonic::Status> {
        let alterations_json =
            serde_json::to_vec(alterations).map_err(|e| tonic::Status::internal(e.to_string()))?;
        self.call(|mut c| {
            let req = AlterClientQuotasRequest {
                alterations_json: alterations_json.clone(),
            };
            async move { c.alter_client_quotas(req).await }
        })
        .await
        .map(|r| r.version)
    }

    /// Removes, then sets, dynamic configs at `scope` through the controllers; returns a
    /// metadata version that includes the change.
    pub async fn alter_dynamic_configs(
        &self,
        scope: &strata_controller::metadata::dynamic::ConfigScope,
        set: &std::collections::BTreeMap<String, String>,
        remove: &[String],
    ) -> Result<u64, tonic::Status> {
        use strata_controller::metadata::dynamic::ConfigScope;
        use strata_proto::v1::alter_dynamic_configs_request::Scope;
        let req = AlterDynamicConfigsRequest {
            scope: Some(match scope {
                ConfigScope::ClusterDefault => Scope::ClusterDefault(true),
                ConfigScope::Broker(id) => Scope::Broker(*id),
                ConfigScope::Group(g) => Scope::Group(g.clone()),
            }),
            set: set.clone().into_iter().collect(),
            remove: remove.to_vec(),
        };
        self.call(|mut c| {
            let req = req.clone();
            async move { c.alter_dynamic_configs(req).await }
        })
        .await
        .map(|r| r.version)
    }

    /// Sets and deletes SCRAM credentials through the controllers; returns a metadata
    /// version that includes the change.
    pub async fn alter_scram_credentials(
        &self,
        upsertions: Vec<ScramUpsertion>,
        deletions: Vec<ScramDeletion>,
    ) -> Result<u64, tonic::Status> {
        let req = AlterScramCredentialsRequest {
            upsertions,
            deletions,
        };
        self.call(|mut c| {
            let req = req.clone();
            async move { c.alter_scram_credentials(req).await }
        })
        .await
        .map(|r| r.version)
    }

    /// Removes the bindings any filter matches; returns them.
    pub async fn delete_acls(
        &self,
        filters: &[strata_controller::metadata::acl::AclFilter],
    ) -> Result<Vec<strata_controller::metadata::acl::AclBinding>, tonic::Status> {
        let filters_json =
            serde_json::to_vec(filters).map_err(|e| tonic::Status::internal(e.to_string()))?;
        let resp = self
            .call(|mut c| {
                let req = DeleteAclsRequest {
                    filters_json: filters_json.clone(),
                };
                async move { c.delete_acls(req).await }
            })
            .await?;
        serde_json::from_slice(&resp.deleted_json)
            .map_err(|e| tonic::Status::internal(format!("undecodable deleted ACLs: {e}")))
    }

    /// Proposes a new ISR for a partition this broker leads at `leader_epoch`, based on
    /// `partition_epoch` (the controller refuses it if either is stale), adding the `joining`
    /// members as the registrations that caught up.
    pub async fn alter_isr(
        &self,
        topic: &str,
        partition: u32,
        leader_epoch: i32,
        partition_epoch: i32,
        isr: Vec<i32>,
        joining: &[(i32, u64)],
    ) -> Result<AlterIsrResponse, tonic::Status> {
        let epoch = self
            .epoch()
            .ok_or_else(|| tonic::Status::unavailable("not registered with the controllers yet"))?;
        let req = AlterIsrRequest {
            broker_id: self.config.broker_id,
            broker_epoch: epoch,
            topic: topic.to_string(),
            partition,
            leader_epoch,
            partition_epoch,
            isr,
            joining: joining
                .iter()
                .map(|(id, epoch)| JoiningReplica {
                    broker_id: *id,
                    broker_epoch: *epoch,
                })
                .collect(),
        };
        self.call(|mut c| {
            let req = req.clone();
            async move { c.alter_isr(req).await }
        })
        .await
    }

    /// The gRPC address of a live broker, from the metadata.
    pub fn grpc_address(&self, broker: i32) -> Option<String> {
        let m = self.metadata.borrow();
        let b = m.brokers.get(&broker)?;
        b.endpoints
            .iter()
            .find(|e| e.name == "grpc")
            .map(|e| format!("{}:{}", e.host, e.port))
    }

    pub fn broker_id(&self) -> i32 {
        self.config.broker_id
    }

    /// The epoch of `broker`'s newest registration this broker has seen.
    pub fn registered_epoch(&self, broker: i32) -> Option<u64> {
        self.metadata.borrow().brokers.get(&broker).map(|b| b.epoch)
    }

    pub fn tls(&self) -> Option<&Arc<GrpcTls>> {
        self.config.tls.as_ref()
    }

    /// Any reachable controller, trying them in turn from `start`.
    async fn any_controller(&self, start: &mut usize) -> ControllerClient<Channel> {
        self.any_controller_by(start, connect).await.0
    }

    /// Any reachable controller for a session (no keepalive), with its address.
    async fn any_controller_for_session(
        &self,
        start: &mut usize,
    ) -> (ControllerClient<Channel>, String) {
        self.any_controller_by(start, connect_for_session).await
    }

    /// Any controller `connect` reaches, trying them in turn from `start`, with its address.
    async fn any_controller_by<'a, F, Fut>(
        &'a self,
        start: &mut usize,
        connect: F,
    ) -> (ControllerClient<Channel>, String)
    where
        F: Fn(&'a str, Option<&'a GrpcTls>) -> Fut,
        Fut: std::future::Future<Output = Option<ControllerClient<Channel>>>,
    {
        loop {
            let n = self.config.controllers.len();
            for i in 0..n {
                let addr = &self.config.controllers[(*start + i) % n];
                if let Some(c) = connect(addr, self.config.tls.as_deref()).await {
                    *start = (*start + i) % n;
                    return (c, addr.clone());
                }
            }
            tokio::time::sleep(RETRY).await;
        }
    }

    async fn register(
        &self,
        client: &mut ControllerClient<Channel>,
    ) -> Result<(u64, Duration), tonic::Status> {
        let resp = client
            .register_broker(RegisterBrokerRequest {
                broker_id: self.config.broker_id,
                incarnation: self.incarnation.to_string(),
                endpoints: self
                    .config
                    .kafka
                    .iter()
                    .cloned()
                    .chain(
                        self.config
                            .grpc_port
                            .map(|p| ("grpc".to_string(), self.config.grpc_host.clone(), p)),
                    )
                    .map(|(name, host, port)| Endpoint {
                        name,
                        host,
                        port: u32::from(port),
                    })
                    .collect(),
                rack: self.config.rack.clone(),
            })
            .await?
            .into_inner();
        Ok((resp.broker_epoch, Duration::from_millis(resp.lease_ms)))
    }

    async fn membership_loop(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut which = 0usize;
        let mut client = self.any_controller(&mut which).await;
        let mut lease = Duration::from_secs(6);
        // Heartbeats go to `preferred` (the last controller that answered) over one lazily
        // connected channel per controller.
        let beats: Vec<ControllerClient<Channel>> = self
            .config
            .controllers
            .iter()
            .filter_map(|addr| {
                let endpoint =
                    strata_proto::tls::live_endpoint(addr, self.config.tls.as_deref()).ok()?;
                Some(ControllerClient::new(endpoint.connect_lazy()))
            })
            .collect();
        // `None` after a failed heartbeat: the next one asks every controller at once.
        let mut preferred: Option<usize> = Some(0);
        let mut full = self.disk_full.subscribe();
        let mut fault = self.storage_fault.subscribe();
        loop {
            if *shutdown.borrow() {
                break;
            }
            // A heartbeat that takes longer than this is abandoned for another controller:
            // a paused or cut-off controller (or one forwarding to such a leader) must not
            // cost this broker its lease.
            let patience = (lease / 4).clamp(Duration::from_millis(250), Duration::from_secs(2));
            if *self.disk_full.borrow() || *self.storage_fault.borrow() {
                self.sit_out(&mut shutdown).await;
                continue;
            }
            let Some(epoch) = self.epoch() else {
                let sent = tokio::time::Instant::now();
                match tokio::time::timeout(patience * 2, self.register(&mut client)).await {
                    Ok(Ok((epoch, l))) => {
                        lease = l;
                        self.epoch.send_replace(Some(epoch));
                        self.renew_lease(sent, lease, 0);
                        tracing::info!(
                            broker = self.config.broker_id,
                            epoch,
                            "registered with the controllers"
                        );
                    }
                    failed => {
                        let why = match failed {
                            Ok(Err(e)) => e.message().to_string(),
                            _ => "no answer in time".to_string(),
                        };
                        tracing::warn!(broker = self.config.broker_id, error = %why, "registration failed; retrying");
                        tokio::time::sleep(RETRY).await;
                        which += 1;
                        client = self.any_controller(&mut which).await;
                    }
                }
                continue;
            };
            if self.silent_while_a_test_asks() {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            let req = HeartbeatRequest {
                broker_id: self.config.broker_id,
                broker_epoch: epoch,
            };
            let mut sent = tokio::time::Instant::now();
            let first = match preferred.and_then(|i| beats.get(i).map(|c| (i, c))) {
                Some((i, c)) => Some((
                    i,
                    tokio::time::timeout(patience, c.clone().heartbeat(req)).await,
                )),
                None => None,
            };
            let settled = matches!(&first, Some((_, Ok(Ok(_)))))
                || matches!(&first, Some((_, Ok(Err(e)))) if matches!(e.code(), Code::NotFound | Code::FailedPrecondition));
            let beat = match first {
                Some((i, answer)) if settled => answer.map(|r| r.map(|resp| (i, resp))),
                _ => {
                    // The usual controller is silent, leaderless, or forwards to a silent
                    // leader: ask them all at once and keep the first answer, so a silent
                    // controller costs one patience, not one per controller tried in turn.
                    sent = tokio::time::Instant::now();
                    tokio::time::timeout(patience, first_heartbeat(&beats, req)).await
                }
            };
            match beat {
                Ok(Ok((from, resp))) => {
                    preferred = Some(from);
                    let resp = resp.into_inner();
                    self.renew_lease(sent, lease, resp.lead_from_version);
                    if !resp.leader_addr.is_empty() {
                        self.active.send_if_modified(|a| {
                            let changed = a.as_deref() != Some(resp.leader_addr.as_str());
                            *a = Some(resp.leader_addr.clone());
                            changed
                        });
                    }
                }
                Ok(Err(e)) if matches!(e.code(), Code::NotFound | Code::FailedPrecondition) => {
                    tracing::warn!(broker = self.config.broker_id, epoch, error = %e.message(), "controllers no longer know this registration; registering again");
                    self.drop_lease();
                    self.epoch.send_replace(None);
                    continue;
                }
                failed => {
                    let why = match failed {
                        Ok(Err(e)) => e.message().to_string(),
                        _ => format!("no answer within {} ms", patience.as_millis()),
                    };
                    tracing::debug!(error = %why, "no controller answered the heartbeat; asking them all again");
                    preferred = None;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(lease / 10) => {}
                _ = full.wait_for(|f| *f) => {}
                _ = fault.wait_for(|f| *f) => {}
                _ = shutdown.wait_for(|s| *s) => {}
            }
        }
        if let Some(epoch) = self.epoch() {
            match self
                .controlled_shutdown(epoch, Duration::from_secs(8))
                .await
            {
                Ok(Ok(())) => tracing::info!(
                    broker = self.config.broker_id,
                    "controlled shutdown: leaderships moved away"
                ),
                Ok(Err(e)) => tracing::warn!(error = %e.message(), "controlled shutdown refused"),
                Err(_) => tracing::warn!("controlled shutdown timed out"),
            }
        }
    }

    /// Keeps a session stream open with the active controller while registered, so that the
    /// controllers fence this broker the moment its process dies (the kernel closes the
    /// connection) rather than when its lease runs out.
    ///
    /// This broker never closes a session while it lives and keeps its registration: a
    /// close reads as its death. When the heartbeats name another active controller (the
    /// session's one went silent and lost the leadership), a session is opened with that
    /// one and the old stream is left open until its controller ends it on noticing it no
    /// longer leads.
    async fn session_loop(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut which = 0usize;
        let mut epochs = self.epoch.subscribe();
        let mut active = self.active.subscribe();
        loop {
            if *shutdown.borrow() {
                return;
            }
            let Some(epoch) = *epochs.borrow_and_update() else {
                tokio::select! {
                    _ = epochs.changed() => {}
                    _ = shutdown.wait_for(|s| *s) => return,
                }
                continue;
            };
            let named = active.borrow_and_update().clone();
            let (mut client, addr) = match &named {
                Some(addr) => match connect_for_session(addr, self.config.tls.as_deref()).await {
                    Some(c) => (c, addr.clone()),
                    None => self.any_controller_for_session(&mut which).await,
                },
                None => self.any_controller_for_session(&mut which).await,
            };
            let opened = client
                .session(SessionRequest {
                    broker_id: self.config.broker_id,
                    broker_epoch: epoch,
                })
                .await;
            match opened {
                Ok(stream) => {
                    let mut stream = stream.into_inner();
                    let (ended_tx, ended) = tokio::sync::oneshot::channel::<()>();
                    let holder = tokio::spawn(async move {
                        while let Ok(Some(_)) = stream.message().await {}
                        let _ = ended_tx.send(());
                    });
                    let moved = active.clone();
                    let session_addr = addr.clone();
                    tokio::select! {
                        _ = ended => {
                            tracing::debug!(broker = self.config.broker_id, controller = %addr, "controller session ended; opening another");
                        }
                        _ = epochs.wait_for(|e| *e != Some(epoch)) => {
                            // a new registration: the old one's session may close
                            holder.abort();
                        }
                        _ = async move {
                            let mut moved = moved;
                            let _ = moved.wait_for(|a| a.as_ref().is_some_and(|a| *a != session_addr)).await;
                        } => {
                            tracing::info!(broker = self.config.broker_id, "the active controller moved; opening a session with it");
                        }
                        _ = shutdown.wait_for(|s| *s) => return,
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e.message(), "controller session refused; trying another controller");
                    which += 1;
                    tokio::time::sleep(RETRY / 3).await;
                }
            }
        }
    }

    /// Applies one update of the metadata stream to the cache: a snapshot replaces it; a log
    /// entry must be the next one and goes through the controllers' own state machine.
    fn apply_update(&self, update: MetadataUpdate) -> Result<(), String> {
        match update.update {
            Some(metadata_update::Update::Snapshot(snap)) => {
                let m: ClusterMetadata = serde_json::from_slice(&snap.metadata_json)
                    .map_err(|e| format!("undecodable metadata snapshot: {e}"))?;
                self.metadata.send_replace(Arc::new(m));
                Ok(())
            }
            Some(metadata_update::Update::Entry(entry)) => {
                let current = self.metadata.borrow().clone();
                if entry.index <= current.version {
                    return Ok(()); // already applied
                }
                if entry.index != current.version + 1 {
                    return Err(format!(
                        "entry {} does not follow version {}",
                        entry.index, current.version
                    ));
                }
                let mut next = (*current).clone();
                if entry.command_json.is_empty() {
                    next.version = entry.index;
                } else {
                    let cmd: Command = serde_json::from_slice(&entry.command_json)
                        .map_err(|e| format!("undecodable metadata entry {}: {e}", entry.index))?;
                    // A refused command changes nothing but the version, exactly as on the
                    // controllers.
                    let _ = next.apply(entry.index, &cmd);
                }
                self.metadata.send_replace(Arc::new(next));
                Ok(())
            }
            None => Err("empty metadata update".into()),
        }
    }

    /// Failpoint `broker-<id>-silent-to-controllers`: a test stops this broker's heartbeats
    /// (as when it is cut off from the controllers while clients still reach it).
    fn silent_while_a_test_asks(&self) -> bool {
        strata_controller::failpoint::armed(&format!(
            "broker-{}-silent-to-controllers",
            self.config.broker_id
        ))
    }

    /// Failpoint `broker-<id>-hold-metadata`: a test makes this broker's view of the metadata
    /// lag (as behind a slow or cut-off controller) for as long as it is armed.
    async fn hold_metadata_while_a_test_asks(&self) {
        let name = format!("broker-{}-hold-metadata", self.config.broker_id);
        strata_controller::failpoint::hold_while_armed(&name).await;
    }

    /// Follows the metadata stream of the active controller, as heartbeats name it (any
    /// controller until they do), and moves to another when they name another. A controller
    /// cut off from the others keeps its streams open but has nothing new to send: a broker
    /// that stayed on it would not learn of leaderships the majority gave it meanwhile.
    async fn watch_loop(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut which = 0usize;
        let mut active = self.active.subscribe();
        loop {
            // (when the one named cannot be reached, any other will do until they name
            // another)
            let wanted = active.borrow_and_update().clone();
            let named = match &wanted {
                Some(addr) => connect(addr, self.config.tls.as_deref())
                    .await
                    .map(|c| (c, addr.clone())),
                None => None,
            };
            let (mut client, addr) = match named {
                Some(c) => c,
                None => self.any_controller_by(&mut which, connect).await,
            };
            let from = self.metadata.borrow().version;
            let stream = client.watch(WatchRequest { from_version: from }).await;
            let mut stream = match stream {
                Ok(s) => s.into_inner(),
                Err(e) => {
                    tracing::debug!(error = %e.message(), "metadata watch failed; retrying");
                    which += 1;
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            let moved = loop {
                let next = tokio::select! {
                    n = stream.message() => n,
                    _ = active.wait_for(|a| a.is_some() && *a != wanted) => break true,
                    _ = shutdown.wait_for(|s| *s) => return,
                };
                match next {
                    Ok(Some(update)) => {
                        self.hold_metadata_while_a_test_asks().await;
                        if let Err(e) = self.apply_update(update) {
                            tracing::warn!(error = %e, "metadata stream out of step; resubscribing");
                            break false;
                        }
                    }
                    Ok(None) | Err(_) => break false,
                }
            };
            if moved {
                tracing::debug!(broker = self.config.broker_id, from = %addr, "the active controller moved; watching its metadata");
                continue;
            }
            which += 1;
            tokio::time::sleep(RETRY).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::out_of_space;
    use std::io::Error;

    #[test]
    fn only_a_full_disk_or_quota_counts_as_out_of_space() {
        // ENOSPC, EDQUOT
        assert!(out_of_space(&Error::from_raw_os_error(28)));
        assert!(out_of_space(&Error::from_raw_os_error(122)));
        // EFBIG (a per-file limit), EIO, and an error without an OS code do not
        assert!(!out_of_space(&Error::from_raw_os_error(27)));
        assert!(!out_of_space(&Error::from_raw_os_error(5)));
        assert!(!out_of_space(&Error::other("no space left on device")));
    }
}
