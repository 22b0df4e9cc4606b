//! Raft traffic between controllers over gRPC (`strata.v1.Raft`), carrying openraft's
//! request and response types as JSON. The client side is openraft's `RaftNetwork`; the
//! server side hands requests to the local `Raft`.
//!
//! With mTLS (`GrpcNetwork::tls`), a controller accepts Raft only from the certificate of a
//! configured voter, and only for that voter's own vote: a message whose vote names another
//! node than the certificate is refused before Raft sees it.

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;
use strata_proto::v1::raft_client::RaftClient;
use strata_proto::v1::raft_server::Raft as RaftService;
use strata_proto::v1::RaftPayload;

use strata_proto::tls::{GrpcTls, Peer};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::raft::{NodeId, TypeConfig};

pub type Raft = openraft::Raft<TypeConfig>;

/// Makes a client per peer; connections are opened lazily and reopened after failures.
#[derive(Clone, Default)]
pub struct GrpcNetwork {
    /// This controller's certificate, presented to its peers (`https://`); `None`: plaintext.
    pub tls: Option<Arc<GrpcTls>>,
    /// Which peers answer, shared by every client openraft makes.
    pub health: Arc<PeerHealth>,
}

pub struct PeerClient {
    target: NodeId,
    addr: String,
    tls: Option<Arc<GrpcTls>>,
    client: Option<RaftClient<Channel>>,
    health: Arc<PeerHealth>,
}

/// Whether each peer controller answers Raft messages. openraft reports every failed call
/// (one per heartbeat, read and vote while a peer is down); what an operator needs is one
/// warning when a peer stops answering and one line when it answers again, so the controller
/// logs those transitions here; the `strata` binary drops openraft's per-call errors
/// (`strata_hot::logging`).
#[derive(Default)]
pub struct PeerHealth(std::sync::Mutex<HashMap<NodeId, PeerDown>>);

/// A peer that stopped answering: since when, and how many calls failed.
struct PeerDown {
    since: Instant,
    failed_calls: u64,
}

impl PeerHealth {
    fn failed(&self, target: NodeId, addr: &str, error: &dyn std::fmt::Display) {
        let mut down = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match down.get_mut(&target) {
            Some(d) => d.failed_calls += 1,
            None => {
                tracing::warn!(
                    peer = target,
                    addr,
                    %error,
                    "controller peer is not answering raft messages; retrying until it does"
                );
                down.insert(
                    target,
                    PeerDown {
                        since: Instant::now(),
                        failed_calls: 1,
                    },
                );
            }
        }
    }

    fn answered(&self, target: NodeId) {
        let mut down = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = down.remove(&target) {
            tracing::info!(
                peer = target,
                down_for = ?d.since.elapsed(),
                failed_calls = d.failed_calls,
                "controller peer answers raft messages again"
            );
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for GrpcNetwork {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerClient {
        PeerClient {
            target,
            addr: node.addr.clone(),
            tls: self.tls.clone(),
            client: None,
            health: self.health.clone(),
        }
    }
}

fn to_json<T: Serialize>(v: &T) -> Result<RaftPayload, NetworkError> {
    serde_json::to_vec(v)
        .map(|json| RaftPayload { json })
        .map_err(|e| NetworkError::new(&e))
}

fn from_json<T: DeserializeOwned>(p: &RaftPayload) -> Result<T, NetworkError> {
    serde_json::from_slice(&p.json).map_err(|e| NetworkError::new(&e))
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, BasicNode, E>>;

impl PeerClient {
    async fn client(&mut self) -> Result<RaftClient<Channel>, Unreachable> {
        if let Some(c) = &self.client {
            return Ok(c.clone());
        }
        let endpoint = strata_proto::tls::live_endpoint(&self.addr, self.tls.as_deref())
            .map_err(|e| Unreachable::new(&e))?;
        let channel = endpoint.connect().await.map_err(|e| Unreachable::new(&e))?;
        let client = RaftClient::new(channel);
        self.client = Some(client.clone());
        Ok(client)
    }

    /// Sends `req` with `call`, decoding the remote `Result<Resp, E>`.
    async fn call<Req, Resp, E, F, Fut>(
        &mut self,
        req: &Req,
        option: &RPCOption,
        call: F,
    ) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
        F: FnOnce(RaftClient<Channel>, Request<RaftPayload>) -> Fut,
        Fut: std::future::Future<Output = Result<Response<RaftPayload>, Status>>,
    {
        let payload = to_json(req).map_err(RPCError::Network)?;
        // Give up at the soft deadline, before openraft drops the call at the hard one, so
        // that a silent peer is seen (and logged once) here.
        let deadline = option.soft_ttl();
        let sent = tokio::time::timeout(deadline, async {
            let client = self.client().await?;
            let mut request = Request::new(payload);
            request.set_timeout(deadline);
            call(client, request)
                .await
                .map_err(|s| Unreachable::new(&s))
        })
        .await
        .unwrap_or_else(|_| {
            Err(Unreachable::new(&std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {deadline:?}"),
            )))
        });
        match sent {
            Ok(resp) => {
                self.health.answered(self.target);
                let result: Result<Resp, E> =
                    from_json(resp.get_ref()).map_err(RPCError::Network)?;
                result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Err(unreachable) => {
                // Drop the connection so the next call reconnects.
                self.client = None;
                self.health.failed(self.target, &self.addr, &unreachable);
                Err(RPCError::Unreachable(unreachable))
            }
        }
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, RaftError<NodeId>> {
        self.call(&rpc, &option, |mut c, r| async move {
            c.append_entries(r).await
        })
        .await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>> {
        self.call(&rpc, &option, |mut c, r| async move {
            c.install_snapshot(r).await
        })
        .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, RaftError<NodeId>> {
        self.call(&rpc, &option, |mut c, r| async move { c.vote(r).await })
            .await
    }
}

/// When this controller, as a follower, last accepted a leader's AppendEntries (a heartbeat
/// or entries): how it tells that it may be cut off from the leader.
#[derive(Default)]
pub struct LeaderContact(std::sync::Mutex<Option<std::time::Instant>>);

impl LeaderContact {
    pub fn touch(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::time::Instant::now());
    }

    pub fn age(&self) -> Option<std::time::Duration> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map(|t| t.elapsed())
    }
}

/// The server side: decodes a request, hands it to the local Raft, encodes its result.
pub struct RaftServer {
    pub raft: Raft,
    /// When a leader's AppendEntries was last accepted here.
    pub leader_contact: Arc<LeaderContact>,
    /// Whether the port proves its peers (mTLS): then only voters may speak Raft.
    pub authenticated: bool,
    pub voters: BTreeSet<NodeId>,
}

impl RaftServer {
    /// The voter a message comes from (`None` on a port without mTLS); anyone else is
    /// refused before the message is even decoded.
    fn sender<T>(&self, req: &Request<T>) -> Result<Option<NodeId>, Status> {
        if !self.authenticated {
            return Ok(None);
        }
        match Peer::of(req) {
            Peer::Controller(id) if self.voters.contains(&id) => Ok(Some(id)),
            peer => Err(Status::permission_denied(format!(
                "raft messages are accepted only from the voters {:?}, not from {peer}",
                self.voters
            ))),
        }
    }
}

/// A voter speaks only for itself: the vote a message carries must name its sender.
fn bind(sender: Option<NodeId>, claimed: Option<NodeId>) -> Result<(), Status> {
    match sender {
        Some(id) if claimed != Some(id) => Err(Status::permission_denied(format!(
            "controller {id} sent a raft message in the name of {claimed:?}; refused"
        ))),
        _ => Ok(()),
    }
}

fn decode<T: DeserializeOwned>(req: &Request<RaftPayload>) -> Result<T, Status> {
    serde_json::from_slice(&req.get_ref().json)
        .map_err(|e| Status::invalid_argument(format!("undecodable raft message: {e}")))
}

fn encode<T: Serialize>(v: &T) -> Result<Response<RaftPayload>, Status> {
    serde_json::to_vec(v)
        .map(|json| Response::new(RaftPayload { json }))
        .map_err(|e| Status::internal(format!("cannot encode raft response: {e}")))
}

#[tonic::async_trait]
impl RaftService for RaftServer {
    async fn append_entries(
        &self,
        req: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let sender = self.sender(&req)?;
        let rpc: AppendEntriesRequest<TypeConfig> = decode(&req)?;
        bind(sender, rpc.vote.leader_id.voted_for())?;
        let result = self.raft.append_entries(rpc).await;
        if matches!(&result, Ok(r) if !matches!(r, AppendEntriesResponse::HigherVote(_))) {
            self.leader_contact.touch();
        }
        encode(&result)
    }

    async fn vote(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let sender = self.sender(&req)?;
        let rpc: VoteRequest<NodeId> = decode(&req)?;
        bind(sender, rpc.vote.leader_id.voted_for())?;
        encode(&self.raft.vote(rpc).await)
    }

    async fn install_snapshot(
        &self,
        req: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let sender = self.sender(&req)?;
        let rpc: InstallSnapshotRequest<TypeConfig> = decode(&req)?;
        bind(sender, rpc.vote.leader_id.voted_for())?;
        encode(&self.raft.install_snapshot(rpc).await)
    }
}

#[cfg(test)]
mod tests {
    use super::bind;

    #[test]
    fn a_voter_speaks_only_for_itself() {
        assert!(bind(Some(2), Some(2)).is_ok());
        assert!(
            bind(Some(2), Some(1)).is_err(),
            "a vote in another voter's name"
        );
        assert!(bind(Some(2), None).is_err());
        assert!(bind(None, Some(7)).is_ok(), "no mTLS: nothing to bind");
    }
}
