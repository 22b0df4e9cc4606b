//! The Kafka-protocol listener: framing, request headers, version negotiation and the
//! in-order response pipeline of each connection.
//!
//! A connection reads frames in order and dispatches each one before reading the next, so
//! appends from one connection happen in request order. Waiting (acks=all, long-poll fetches,
//! topic creation) runs in spawned tasks; responses are written in request order, as Kafka
//! clients require. Malformed input closes the connection with a log line, as Kafka brokers
//! do; it never panics the broker or leaves the connection hanging.

mod acls;
mod admin;
mod client_quotas;
pub(crate) mod codes;
mod configs;
mod elections;
mod fetch;
pub mod fetch_session;
mod frame;
mod group;
pub mod limits;
mod log_dirs;
mod produce;
mod producers;
pub mod quota;
mod reassignments;
mod records;
pub mod sasl;
pub mod tls;
mod txn;
mod users;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{
    api_versions_response::ApiVersion, AddOffsetsToTxnRequest, AddPartitionsToTxnRequest,
    AlterClientQuotasRequest, AlterConfigsRequest, AlterUserScramCredentialsRequest, ApiKey,
    ApiVersionsRequest, ApiVersionsResponse, CreateAclsRequest, CreatePartitionsRequest,
    CreateTopicsRequest, DeleteAclsRequest, DeleteGroupsRequest, DeleteRecordsRequest,
    DeleteTopicsRequest, DescribeAclsRequest, DescribeClientQuotasRequest, DescribeClusterRequest,
    DescribeConfigsRequest, DescribeGroupsRequest, DescribeLogDirsRequest,
    DescribeProducersRequest, DescribeTransactionsRequest, DescribeUserScramCredentialsRequest,
    ElectLeadersRequest, EndTxnRequest, FetchRequest, FindCoordinatorRequest, HeartbeatRequest,
    IncrementalAlterConfigsRequest, InitProducerIdRequest, JoinGroupRequest, LeaveGroupRequest,
    ListGroupsRequest, ListOffsetsRequest, ListTransactionsRequest, MetadataRequest,
    OffsetCommitRequest, OffsetDeleteRequest, OffsetFetchRequest, OffsetForLeaderEpochRequest,
    ProduceRequest, RequestHeader, ResponseHeader, SaslAuthenticateRequest,
    SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse, SyncGroupRequest,
    TxnOffsetCommitRequest,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::broker::Broker;
use strata_controller::metadata::acl;

/// The APIs served and their version ranges. `docs/kafka-compatibility.md` mirrors this table.
pub const SUPPORTED_APIS: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 9),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 7),
    (ApiKey::Metadata, 0, 12),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::AddPartitionsToTxn, 0, 3),
    (ApiKey::AddOffsetsToTxn, 0, 3),
    (ApiKey::TxnOffsetCommit, 0, 3),
    (ApiKey::DescribeTransactions, 0, 0),
    (ApiKey::ListTransactions, 0, 1),
    (ApiKey::EndTxn, 0, 3),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::OffsetForLeaderEpoch, 2, 4),
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::ConsumerGroupHeartbeat, 0, 1),
    (ApiKey::ConsumerGroupDescribe, 0, 1),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::OffsetCommit, 2, 9),
    (ApiKey::OffsetFetch, 1, 9),
    (ApiKey::ListGroups, 0, 5),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::OffsetDelete, 0, 0),
    (ApiKey::DeleteRecords, 0, 2),
    (ApiKey::DescribeLogDirs, 1, 4),
    (ApiKey::DescribeProducers, 0, 0),
    (ApiKey::ElectLeaders, 0, 2),
    (ApiKey::AlterPartitionReassignments, 0, 1),
    (ApiKey::ListPartitionReassignments, 0, 0),
    (ApiKey::DescribeCluster, 0, 1),
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::DescribeAcls, 1, 3),
    (ApiKey::CreateAcls, 1, 3),
    (ApiKey::DeleteAcls, 1, 3),
    (ApiKey::DescribeUserScramCredentials, 0, 0),
    (ApiKey::AlterUserScramCredentials, 0, 0),
    (ApiKey::DescribeClientQuotas, 0, 1),
    (ApiKey::AlterClientQuotas, 0, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
];

/// A protocol string (what every handler builds its answers' names and messages with).
fn s(v: impl Into<String>) -> StrBytes {
    StrBytes::from_string(v.into())
}

/// Largest bare SASL token accepted after a v0 SaslHandshake.
const MAX_RAW_SASL_TOKEN: i32 = 64 << 10;

/// Largest frame a connection may send before SASL authentication (Kafka's
/// `sasl.server.max.receive.size` default).
const MAX_UNAUTHENTICATED_FRAME: i32 = 512 << 10;

/// The longest client id served (it names members, quotas and log lines).
const MAX_CLIENT_ID_BYTES: usize = 1024;

/// Requests read ahead of the response being written, per connection.
const MAX_IN_FLIGHT: usize = 64;

/// How a listener secures its connections (Kafka's `listener.security.protocol.map`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    pub fn tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    pub fn sasl(self) -> bool {
        matches!(
            self,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        )
    }
}

/// The principal of a connection that did not authenticate.
pub const ANONYMOUS: &str = "User:ANONYMOUS";

/// Listener settings.
#[derive(Clone)]
pub struct ListenerConfig {
    /// The listener's name: its endpoint in the metadata, and what Metadata answers with.
    pub name: String,
    pub protocol: SecurityProtocol,
    /// Present for SSL and SASL_SSL.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// Mechanisms offered on SASL_PLAINTEXT and SASL_SSL.
    pub sasl_mechanisms: Vec<sasl::Mechanism>,
    /// How OAUTHBEARER tokens are checked, when it is offered.
    pub oauth: Option<Arc<sasl::oauthbearer::Validator>>,
    pub advertised_host: String,
    pub advertised_port: u16,
    /// Largest request frame accepted (Kafka's `socket.request.max.bytes`).
    pub max_request_bytes: usize,
    /// How long a SASL session lasts before it must re-authenticate (KIP-368).
    pub max_reauth: Option<Duration>,
    /// How long a failed login waits for its answer (`connection.failed.authentication.delay.ms`).
    pub failed_authentication_delay: Duration,
    /// A connection with no request for this long is closed (`connections.max.idle.ms`).
    pub idle_timeout: Duration,
    /// Time allowed for the rest of a frame once its length arrived.
    pub frame_timeout: Duration,
    /// The most record bytes in one fetch response (Kafka's broker `fetch.max.bytes`).
    pub fetch_max_bytes: usize,
    /// The longest a fetch waits for data, whatever it asks.
    pub fetch_max_wait: Duration,
    /// Fetch responses send large record reads from the segment files (`sendfile`) instead
    /// of reading and writing them: plaintext listeners only (`kafka.sendfile`).
    pub sendfile: bool,
}

pub struct KafkaServer {
    broker: Arc<Broker>,
    config: ListenerConfig,
    limits: Arc<limits::Limits>,
    quotas: Arc<quota::Quotas>,
}

/// What a dispatched request produces.
pub(crate) enum Reply {
    /// A response frame, ready or coming.
    Later(JoinHandle<anyhow::Result<frame::Frame>>),
    Now(BytesMut),
    /// acks=0 produce: Kafka sends nothing back.
    Nothing,
}

/// Why a connection is closed instead of answered.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("unknown api key {0}")]
    UnknownApi(i16),
    #[error("unsupported version {version} of {key:?}")]
    UnsupportedVersion { key: ApiKey, version: i16 },
    #[error("malformed {what}: {error}")]
    Malformed {
        what: &'static str,
        error: anyhow::Error,
    },
}

impl KafkaServer {
    /// A listener; `limits` and `quotas` are shared by all the broker's listeners.
    pub fn new(
        broker: Arc<Broker>,
        config: ListenerConfig,
        limits: Arc<limits::Limits>,
        quotas: Arc<quota::Quotas>,
    ) -> Arc<Self> {
        Arc::new(KafkaServer {
            broker,
            config,
            limits,
            quotas,
        })
    }

    /// Accepts connections until `shutdown` turns true.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut failed_accepts = limits::WarnEvery::default();
        loop {
            tokio::select! {
                _ = async { let _ = shutdown.wait_for(|s| *s).await.is_ok(); } => return,
                accepted = async {
                    self.limits.room().await;
                    listener.accept().await
                } => match accepted {
                    Ok((stream, peer)) => {
                        // over max.connections.per.ip: closed at once, as Kafka does
                        let Some(slot) = self.limits.admit(peer.ip()) else {
                            continue;
                        };
                        let server = self.clone();
                        tokio::spawn(async move {
                            if let Err(e) = server.connection(stream).await {
                                tracing::debug!(%peer, error = %e, "connection ended with an error");
                            }
                            drop(slot);
                        });
                    }
                    Err(e) => {
                        // e.g. EMFILE when something other than client sockets used the
                        // descriptors up: one line per 10 s, with the count
                        if let Some(failed) = failed_accepts.due() {
                            tracing::warn!(error = %e, failed, "accept failed; retrying every 100 ms");
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        }
    }

    async fn connection(self: Arc<Self>, stream: TcpStream) -> anyhow::Result<()> {
        stream.set_nodelay(true)?;
        let peer = stream.peer_addr()?;
        match &self.config.tls {
            None => {
                let (rd, wr) = stream.into_split();
                self.serve_connection(rd, wr, peer, None, None).await
            }
            Some(acceptor) => {
                let hint = tls::FrameHint::default();
                let tls = tokio::time::timeout(
                    self.config.frame_timeout,
                    acceptor.accept(tls::ReadAhead::with_hint(stream, hint.clone())),
                )
                .await;
                let stream = match tls {
                    Err(_) => {
                        tracing::warn!(%peer, listener = %self.config.name, "TLS handshake did not finish in time; closing connection");
                        return Ok(());
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(%peer, listener = %self.config.name, error = %e, "TLS handshake failed; closing connection");
                        return Ok(());
                    }
                    Ok(Ok(s)) => s,
                };
                let certificate = stream
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .and_then(tls::principal);
                let (rd, wr) = tokio::io::split(stream);
                self.serve_connection(rd, wr, peer, certificate, Some(hint))
                    .await
            }
        }
    }

    async fn serve_connection<R, W>(
        self: Arc<Self>,
        mut rd: R,
        mut wr: W,
        peer: std::net::SocketAddr,
        certificate: Option<String>,
        hint: Option<tls::FrameHint>,
    ) -> anyhow::Result<()>
    where
        R: AsyncRead + Unpin,
        W: frame::FrameWrite + 'static,
    {
        let mut sasl = self.config.protocol.sasl().then(|| {
            sasl::SaslSession::new(self.config.sasl_mechanisms.clone())
                .with_reauthentication(self.config.max_reauth.is_some())
                .with_oauth(self.config.oauth.clone())
        });
        // Without SASL: the client certificate's subject, or anonymous; with SASL, its user.
        let mut principal: Option<Arc<str>> = (!self.config.protocol.sasl())
            .then(|| Arc::from(certificate.as_deref().unwrap_or(ANONYMOUS)));
        // The client's address as ACLs name it, once per connection (not per authorization).
        let host: Arc<str> = Arc::from(peer.ip().to_string());
        // SaslHandshake v0 (KIP-43): the SASL tokens that follow are bare frames.
        let mut raw_tokens = false;
        // When the SASL session ends unless re-authenticated (KIP-368).
        let mut session_ends: Option<tokio::time::Instant> = None;
        let mut turns = ConnectionTurns::default();
        // The connection's own request memory: its small requests never wait for others'.
        let floor = limits::Floor::default();
        // Set by a handler whose request took a quota over its limit (KIP-219).
        let mute = Arc::new(quota::Mute::default());
        // Each reply travels with its request's share of the request memory, returned once
        // the response is written.
        // A dispatched request's reply also carries its API and arrival, for the per-API
        // request metrics (counted once the response is written).
        type Queued = (
            Reply,
            Option<limits::MemoryShare>,
            Option<(ApiKey, Instant)>,
        );
        let (tx, mut rx) = mpsc::channel::<Queued>(MAX_IN_FLIGHT);
        let apis = self.broker.metrics().kafka_apis.clone();
        let writer = tokio::spawn(async move {
            while let Some((reply, _share, request)) = rx.recv().await {
                let frame = match reply {
                    Reply::Now(f) => Some(frame::Frame::from(f)),
                    Reply::Later(handle) => {
                        match handle.await.map_err(anyhow::Error::from).and_then(|r| r) {
                            Ok(f) => Some(f),
                            Err(e) => {
                                if let Some((key, _)) = request {
                                    apis.failed(key);
                                }
                                return Err(e);
                            }
                        }
                    }
                    Reply::Nothing => None,
                };
                if let Some(frame) = frame {
                    frame.write(&mut wr).await?;
                }
                if let Some((key, arrived)) = request {
                    apis.answered(key, arrived.elapsed());
                }
            }
            anyhow::Ok(())
        });
        loop {
            // a throttled connection is not read from until its throttle time is over
            mute.wait().await;
            let mut len = [0u8; 4];
            match tokio::time::timeout(self.config.idle_timeout, rd.read_exact(&mut len)).await {
                Err(_) => {
                    tracing::debug!(%peer, "closing idle connection");
                    break;
                }
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                Ok(Err(e)) => return Err(e.into()),
                Ok(Ok(_)) => {}
            }
            let size = i32::from_be_bytes(len);
            if raw_tokens && (1..=MAX_RAW_SASL_TOKEN).contains(&size) {
                // after a v0 SaslHandshake: bare SASL tokens, not requests
            } else if size < 8 || size as usize > self.config.max_request_bytes {
                tracing::warn!(%peer, size, max = self.config.max_request_bytes, "refusing request frame of invalid size; closing connection");
                break;
            } else if principal.is_none() && size > MAX_UNAUTHENTICATED_FRAME {
                // Kafka's sasl.server.max.receive.size: nobody allocates much before logging in.
                tracing::warn!(%peer, size, max = MAX_UNAUTHENTICATED_FRAME, "request frame too large before SASL authentication; closing connection");
                break;
            }
            let budget = match principal {
                Some(_) => limits::Budget::Authenticated,
                None => limits::Budget::PreAuthentication,
            };
            let read =
                self.limits
                    .read_frame(&mut rd, size as usize, budget, &floor, hint.as_ref());
            let (frame, share) = match tokio::time::timeout(self.config.frame_timeout, read).await {
                Err(_) => {
                    tracing::warn!(%peer, size, "request frame incomplete after the frame timeout; closing connection");
                    break;
                }
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    tracing::warn!(%peer, size, "connection closed mid-frame");
                    break;
                }
                Ok(Err(e)) => return Err(e.into()),
                Ok(Ok(read)) => read,
            };
            if raw_tokens {
                let step = sasl
                    .as_mut()
                    .map(|session| session.authenticate(&frame, &self.broker.credentials()));
                match step {
                    Some(Ok(step)) => {
                        let mut reply = BytesMut::with_capacity(4 + step.response.len());
                        reply.put_i32(step.response.len() as i32);
                        reply.put_slice(&step.response);
                        if tx.send((Reply::Now(reply), None, None)).await.is_err() {
                            break;
                        }
                        if let Some(user) = step.authenticated {
                            if principal.is_some() {
                                tracing::info!(%peer, listener = %self.config.name, %user, "SASL re-authentication succeeded");
                            }
                            principal = Some(Arc::from(format!("User:{user}")));
                            session_ends = self
                                .session_length(step.expires_at)
                                .map(|d| tokio::time::Instant::now() + d);
                            raw_tokens = false;
                        }
                        continue;
                    }
                    _ => {
                        tracing::warn!(%peer, listener = %self.config.name, "SASL authentication failed; closing connection");
                        tokio::time::sleep(self.config.failed_authentication_delay).await;
                        break;
                    }
                }
            }
            let mut decoded = match decode_request(frame.freeze()) {
                Ok(d) => d,
                Err(refusal) => {
                    tracing::warn!(%peer, reason = %refusal, "refusing request; closing connection");
                    break;
                }
            };
            let is_sasl = matches!(
                decoded.body,
                Body::SaslHandshake(_)
                    | Body::SaslAuthenticate(_)
                    | Body::ApiVersions(_)
                    | Body::UnsupportedApiVersions
            );
            if !is_sasl && session_ends.is_some_and(|e| tokio::time::Instant::now() >= e) {
                // Kafka closes such a connection; the client reconnects and logs in again.
                tracing::info!(%peer, listener = %self.config.name, principal = ?principal, "SASL session expired without re-authentication; closing connection");
                break;
            }
            // A broker whose lease ran out may hold stale metadata (it cannot hear the
            // controllers): it answers a Metadata request (its own partitions without a
            // leader), then closes the connection, so the client asks another broker next
            // instead of coming back here for the same stale view until the fault heals.
            let stale_metadata =
                matches!(decoded.body, Body::Metadata(_)) && !self.broker.holds_lease();
            let request = (decoded.key, Instant::now());
            // KIP-890: a transactional batch that would open a transaction on a partition
            // led here is checked with the transaction coordinator first; awaited here so
            // the connection's produce requests still append in order
            if let (Body::Produce(req, verified), Some(who)) = (&mut decoded.body, &principal) {
                if let Some(id) = req.transactional_id.as_ref().filter(|t| !t.is_empty()) {
                    let may_write = self.broker.authorize(
                        who,
                        &host,
                        acl::Operation::Write,
                        acl::ResourceType::TransactionalId,
                        id.as_str(),
                    );
                    *verified = produce::verify(&self.broker, req, may_write).await;
                }
            }
            let step = match (&decoded.body, &principal) {
                (Body::SaslHandshake(_) | Body::SaslAuthenticate(_), _) => {
                    let (reply, outcome) = self.sasl_step(decoded, sasl.as_mut(), peer);
                    if matches!(outcome, SaslOutcome::Close) {
                        // Kafka's connection.failed.authentication.delay.ms
                        tokio::time::sleep(self.config.failed_authentication_delay).await;
                    }
                    if let Some(reply) = reply {
                        if tx.send((Reply::Now(reply), None, None)).await.is_err() {
                            break;
                        }
                    }
                    match outcome {
                        SaslOutcome::Continue => continue,
                        SaslOutcome::RawTokens => {
                            raw_tokens = true;
                            continue;
                        }
                        SaslOutcome::Authenticated(user, session) => {
                            if principal.is_some() {
                                tracing::info!(%peer, listener = %self.config.name, %user, "SASL re-authentication succeeded");
                            }
                            principal = Some(Arc::from(format!("User:{user}")));
                            session_ends = session.map(|d| tokio::time::Instant::now() + d);
                            continue;
                        }
                        SaslOutcome::Close => break,
                    }
                }
                (Body::ApiVersions(_) | Body::UnsupportedApiVersions, _) | (_, Some(_)) => self
                    .dispatch(
                        decoded,
                        peer,
                        host.clone(),
                        principal.clone().unwrap_or_else(|| Arc::from(ANONYMOUS)),
                        &mut turns,
                        &mute,
                    ),
                (_, None) => {
                    tracing::warn!(%peer, listener = %self.config.name, api = ?decoded.key, "request before SASL authentication; closing connection");
                    break;
                }
            };
            match step {
                Ok(reply) => {
                    if tx.send((reply, Some(share), Some(request))).await.is_err() {
                        break; // the writer failed; its error is reported below
                    }
                    if stale_metadata {
                        tracing::debug!(%peer, "lease ran out: closing the connection after a Metadata answer, so the client asks another broker");
                        break;
                    }
                }
                Err(refusal) => {
                    self.broker.metrics().kafka_apis.failed(request.0);
                    tracing::warn!(%peer, reason = %refusal, "refusing request; closing connection");
                    break;
                }
            }
        }
        drop(tx);
        writer.await??;
        Ok(())
    }

    /// How long a session just authenticated lasts (KIP-368): `connections_max_reauth`, and
    /// never past its credential's expiry; unbounded when re-authentication is off.
    fn session_length(&self, expires_at: Option<u64>) -> Option<Duration> {
        let max = self.config.max_reauth?;
        let left = expires_at.map(|exp| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            Duration::from_secs(exp).saturating_sub(now)
        });
        Some(left.map_or(max, |l| l.min(max)))
    }

    /// Answers SaslHandshake and SaslAuthenticate (KIP-152) from the connection's session;
    /// a failure is answered, then the connection closes.
    fn sasl_step(
        &self,
        decoded: Decoded,
        session: Option<&mut sasl::SaslSession>,
        peer: std::net::SocketAddr,
    ) -> (Option<BytesMut>, SaslOutcome) {
        let Decoded {
            key,
            version,
            correlation_id,
            body,
            ..
        } = decoded;
        match body {
            Body::SaslHandshake(req) => {
                let (code, mechanisms) = match session {
                    None => (codes::UNSUPPORTED_SASL_MECHANISM, Vec::new()),
                    Some(s) => {
                        let offered = s.offered();
                        match s.handshake(req.mechanism.as_str()) {
                            Ok(()) => (codes::NONE, offered),
                            Err(sasl::SaslFailure::UnsupportedMechanism) => {
                                (codes::UNSUPPORTED_SASL_MECHANISM, offered)
                            }
                            Err(_) => (codes::ILLEGAL_SASL_STATE, offered),
                        }
                    }
                };
                let resp = SaslHandshakeResponse::default()
                    .with_error_code(code)
                    .with_mechanisms(
                        mechanisms
                            .into_iter()
                            .map(StrBytes::from_static_str)
                            .collect(),
                    );
                let reply = encode(key, version, correlation_id, &resp).ok();
                let outcome = if code == codes::NONE && version == 0 {
                    SaslOutcome::RawTokens
                } else if code == codes::NONE {
                    SaslOutcome::Continue
                } else {
                    tracing::warn!(%peer, listener = %self.config.name, mechanism = %req.mechanism.as_str(), "SASL handshake refused; closing connection");
                    SaslOutcome::Close
                };
                (reply, outcome)
            }
            Body::SaslAuthenticate(req) => {
                let result = match session {
                    None => Err(sasl::SaslFailure::IllegalState(
                        "this listener does not use SASL",
                    )),
                    Some(s) => s.authenticate(&req.auth_bytes, &self.broker.credentials()),
                };
                let (resp, outcome) = match result {
                    Ok(step) => {
                        let resp = SaslAuthenticateResponse::default()
                            .with_auth_bytes(Bytes::from(step.response));
                        match step.authenticated {
                            Some(user) => {
                                // v1+ tells the client when to re-authenticate (KIP-368).
                                let session = self.session_length(step.expires_at);
                                let resp = resp.with_session_lifetime_ms(
                                    session
                                        .filter(|_| version >= 1)
                                        .map_or(0, |d| d.as_millis().max(1) as i64),
                                );
                                tracing::debug!(%peer, listener = %self.config.name, %user, "SASL authentication succeeded");
                                (resp, SaslOutcome::Authenticated(user, session))
                            }
                            None => (resp, SaslOutcome::Continue),
                        }
                    }
                    Err(failure) => {
                        let (code, message) = match failure {
                            sasl::SaslFailure::AuthenticationFailed(m) => {
                                (codes::SASL_AUTHENTICATION_FAILED, m)
                            }
                            sasl::SaslFailure::IllegalState(m) => {
                                (codes::ILLEGAL_SASL_STATE, m.to_string())
                            }
                            sasl::SaslFailure::UnsupportedMechanism => (
                                codes::UNSUPPORTED_SASL_MECHANISM,
                                "unsupported mechanism".into(),
                            ),
                        };
                        tracing::warn!(%peer, listener = %self.config.name, reason = %message, "SASL authentication failed; closing connection");
                        let resp = SaslAuthenticateResponse::default()
                            .with_error_code(code)
                            .with_error_message(Some(StrBytes::from_string(message)));
                        (resp, SaslOutcome::Close)
                    }
                };
                (encode(key, version, correlation_id, &resp).ok(), outcome)
            }
            _ => (None, SaslOutcome::Close),
        }
    }

    /// Routes one decoded request. Appends happen here, in request order; offset commits
    /// and fetches take their turns in `turns`.
    fn dispatch(
        self: &Arc<Self>,
        decoded: Decoded,
        peer: std::net::SocketAddr,
        host: Arc<str>,
        principal: Arc<str>,
        turns: &mut ConnectionTurns,
        mute: &Arc<quota::Mute>,
    ) -> Result<Reply, Refusal> {
        let started = std::time::Instant::now();
        let Decoded {
            key,
            version,
            correlation_id,
            client_id,
            body,
        } = decoded;
        let ctx = Request {
            server: self.clone(),
            key,
            version,
            correlation_id,
            client_id,
            peer,
            host,
            principal,
            mute: mute.clone(),
        };
        // request time (KIP-124): this synchronous part here, a spawned handler's polls in
        // `Request::later`
        let timed = self.quotas.active().then(|| ctx.clone());
        let reply = self.handle(ctx, body, turns);
        if let Some(ctx) = timed {
            ctx.record_request_time(started.elapsed());
        }
        reply
    }

    fn handle(
        self: &Arc<Self>,
        ctx: Request,
        body: Body,
        turns: &mut ConnectionTurns,
    ) -> Result<Reply, Refusal> {
        let (key, correlation_id) = (ctx.key, ctx.correlation_id);
        match body {
            Body::UnsupportedApiVersions => {
                // Kafka answers an ApiVersions it cannot parse with a v0 response carrying
                // UNSUPPORTED_VERSION and its ranges, so the client can retry lower.
                let resp = api_versions_response(codes::UNSUPPORTED_VERSION);
                Ok(Reply::Now(encode(key, 0, correlation_id, &resp)?))
            }
            Body::ApiVersions(_) => ctx.respond_now(&api_versions_response(codes::NONE)),
            Body::Metadata(req) => ctx.later(admin::metadata(ctx.clone(), req)),
            Body::Produce(req, verified) => produce::handle(ctx, req, verified, &mut turns.refused),
            // one at a time per connection, as clients send them: a connection reads at most
            // one fetch response (kafka.fetch_max_bytes) at a time
            Body::Fetch(req) => ctx.later_sharing(
                turns.fetches.in_turn(fetch::handle(ctx.clone(), req)),
                fetch::records_of,
            ),
            Body::ListOffsets(req) => ctx.later(fetch::list_offsets(ctx.clone(), req)),
            Body::CreateTopics(req) => ctx.later(admin::create_topics(ctx.clone(), req)),
            Body::DeleteTopics(req) => ctx.later(admin::delete_topics(ctx.clone(), req)),
            Body::DescribeConfigs(req) => ctx.respond_now(&configs::describe_configs(&ctx, req)),
            Body::InitProducerId(req) => {
                match req.transactional_id.as_ref().filter(|t| !t.0.is_empty()) {
                    Some(id) => {
                        let id = id.to_string();
                        ctx.later(txn::init_producer_id(ctx.clone(), id, req))
                    }
                    None => ctx.later(produce::init_producer_id(ctx.clone(), req)),
                }
            }
            Body::AddPartitionsToTxn(req) => ctx.later(txn::add_partitions(ctx.clone(), req)),
            Body::EndTxn(req) => ctx.later(txn::end_txn(ctx.clone(), req)),
            Body::AddOffsetsToTxn(req) => ctx.later(txn::add_offsets(ctx.clone(), req)),
            Body::DescribeTransactions(req) => ctx.later(txn::describe(ctx.clone(), req)),
            Body::ListTransactions(req) => ctx.later(txn::list(ctx.clone(), req)),
            Body::TxnOffsetCommit(req) => ctx.later(
                turns
                    .commits
                    .in_turn(group::txn_offset_commit(ctx.clone(), req)),
            ),
            Body::CreatePartitions(req) => ctx.later(admin::create_partitions(ctx.clone(), req)),
            Body::OffsetForLeaderEpoch(req) => {
                ctx.later(fetch::offsets_for_leader_epoch(ctx.clone(), req))
            }
            Body::AlterConfigs(req) => ctx.later(configs::alter_configs_legacy(ctx.clone(), req)),
            Body::IncrementalAlterConfigs(req) => {
                ctx.later(configs::incremental_alter_configs(ctx.clone(), req))
            }
            Body::FindCoordinator(req) => ctx.later(group::find_coordinator(ctx.clone(), req)),
            Body::JoinGroup(req) => ctx.later(group::join(ctx.clone(), req)),
            Body::SyncGroup(req) => ctx.later(group::sync(ctx.clone(), req)),
            Body::Heartbeat(req) => ctx.respond_now(&group::heartbeat(&ctx, req)),
            Body::ConsumerGroupHeartbeat(req) => {
                ctx.later(group::consumer_group_heartbeat(ctx.clone(), req))
            }
            Body::ConsumerGroupDescribe(req) => {
                ctx.respond_now(&group::consumer_group_describe(&ctx, req))
            }
            Body::LeaveGroup(req) => ctx.respond_now(&group::leave(&ctx, req)),
            Body::OffsetCommit(req) => ctx.later(
                turns
                    .commits
                    .in_turn(group::offset_commit(ctx.clone(), req)),
            ),
            Body::OffsetFetch(req) => ctx.later(group::offset_fetch(ctx.clone(), req)),
            Body::ListGroups(req) => ctx.respond_now(&group::list_groups(&ctx, req)),
            Body::DescribeGroups(req) => ctx.respond_now(&group::describe_groups(&ctx, req)),
            Body::DeleteGroups(req) => ctx.later(group::delete_groups(ctx.clone(), req)),
            Body::OffsetDelete(req) => ctx.later(group::offset_delete(ctx.clone(), req)),
            Body::DeleteRecords(req) => ctx.later(records::delete_records(ctx.clone(), req)),
            Body::DescribeLogDirs(req) => ctx.respond_now(&log_dirs::describe_log_dirs(&ctx, req)),
            Body::DescribeProducers(req) => {
                ctx.respond_now(&producers::describe_producers(&ctx, req))
            }
            Body::ElectLeaders(req) => ctx.later(elections::elect_leaders(ctx.clone(), req)),
            Body::AlterPartitionReassignments(req) => {
                ctx.later(reassignments::alter(ctx.clone(), req))
            }
            Body::ListPartitionReassignments(req) => {
                ctx.respond_now(&reassignments::list(&ctx, req))
            }
            Body::DescribeCluster(req) => ctx.respond_now(&admin::describe_cluster(&ctx, req)),
            Body::DescribeAcls(req) => ctx.respond_now(&acls::describe_acls(&ctx, req)),
            Body::CreateAcls(req) => ctx.later(acls::create_acls(ctx.clone(), req)),
            Body::DeleteAcls(req) => ctx.later(acls::delete_acls(ctx.clone(), req)),
            Body::DescribeUserScramCredentials(req) => ctx.respond_now(&users::describe(&ctx, req)),
            Body::AlterUserScramCredentials(req) => ctx.later(users::alter(ctx.clone(), req)),
            Body::DescribeClientQuotas(req) => ctx.respond_now(&client_quotas::describe(&ctx, req)),
            Body::AlterClientQuotas(req) => ctx.later(client_quotas::alter(ctx.clone(), req)),
            // answered by the connection's SASL session before dispatch
            Body::SaslHandshake(_) | Body::SaslAuthenticate(_) => Err(Refusal::Malformed {
                what: "SASL request",
                error: anyhow::anyhow!("SASL request outside the connection's exchange"),
            }),
        }
    }
}

/// What a connection remembers between requests to keep them in order.
#[derive(Default)]
pub(crate) struct ConnectionTurns {
    commits: Turns,
    fetches: Turns,
    /// Retriable refusals given before append, per partition (see `produce::Refused`).
    refused: produce::Refused,
}

/// Runs a connection's requests of one kind one after another, in request order. Each
/// offset commit runs in its own task and is applied when its write is durable, so two
/// pipelined commits of one partition (librdkafka's async commits) could otherwise be
/// applied in the other order, an older offset overwriting a newer one; fetches take turns
/// so that a connection reads one fetch response at a time. Kafka serves a connection's
/// requests one at a time; Strata keeps other requests pipelined and chains only these.
#[derive(Default)]
pub(crate) struct Turns {
    /// Closed (sent or dropped) when the last request handed out has finished.
    last: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl Turns {
    /// `commit`, started only once the previous request of its kind on this connection has
    /// finished.
    fn in_turn<F: std::future::Future>(
        &mut self,
        commit: F,
    ) -> impl std::future::Future<Output = F::Output> {
        let (done, turn) = tokio::sync::oneshot::channel::<()>();
        let before = self.last.replace(turn);
        async move {
            if let Some(before) = before {
                // an error means the previous commit's task ended without sending: its turn
                // is over all the same
                let _ = before.await;
            }
            let out = commit.await;
            drop(done);
            out
        }
    }
}

/// A request decoded from one frame.
pub struct Decoded {
    pub key: ApiKey,
    pub version: i16,
    pub correlation_id: i32,
    /// The request header's client id (empty when absent).
    pub client_id: String,
    pub body: Body,
}

/// The body of a served request.
pub enum Body {
    /// An ApiVersions request at a version we do not serve: answered, not refused.
    UnsupportedApiVersions,
    ApiVersions(ApiVersionsRequest),
    Metadata(MetadataRequest),
    /// With what KIP-890 verification found (filled in before dispatch).
    Produce(ProduceRequest, produce::Verifications),
    Fetch(FetchRequest),
    ListOffsets(ListOffsetsRequest),
    CreateTopics(CreateTopicsRequest),
    DeleteTopics(DeleteTopicsRequest),
    DescribeConfigs(DescribeConfigsRequest),
    InitProducerId(InitProducerIdRequest),
    AddPartitionsToTxn(AddPartitionsToTxnRequest),
    EndTxn(EndTxnRequest),
    AddOffsetsToTxn(AddOffsetsToTxnRequest),
    TxnOffsetCommit(TxnOffsetCommitRequest),
    DescribeTransactions(DescribeTransactionsRequest),
    ListTransactions(ListTransactionsRequest),
    CreatePartitions(CreatePartitionsRequest),
    AlterConfigs(AlterConfigsRequest),
    IncrementalAlterConfigs(IncrementalAlterConfigsRequest),
    OffsetForLeaderEpoch(OffsetForLeaderEpochRequest),
    FindCoordinator(FindCoordinatorRequest),
    JoinGroup(JoinGroupRequest),
    SyncGroup(SyncGroupRequest),
    Heartbeat(HeartbeatRequest),
    ConsumerGroupHeartbeat(kafka_protocol::messages::ConsumerGroupHeartbeatRequest),
    ConsumerGroupDescribe(kafka_protocol::messages::ConsumerGroupDescribeRequest),
    LeaveGroup(LeaveGroupRequest),
    OffsetCommit(OffsetCommitRequest),
    OffsetFetch(OffsetFetchRequest),
    ListGroups(ListGroupsRequest),
    DescribeGroups(DescribeGroupsRequest),
    DeleteGroups(DeleteGroupsRequest),
    OffsetDelete(OffsetDeleteRequest),
    DeleteRecords(DeleteRecordsRequest),
    DescribeLogDirs(DescribeLogDirsRequest),
    DescribeProducers(DescribeProducersRequest),
    ElectLeaders(ElectLeadersRequest),
    AlterPartitionReassignments(kafka_protocol::messages::AlterPartitionReassignmentsRequest),
    ListPartitionReassignments(kafka_protocol::messages::ListPartitionReassignmentsRequest),
    DescribeCluster(DescribeClusterRequest),
    SaslHandshake(SaslHandshakeRequest),
    SaslAuthenticate(SaslAuthenticateRequest),
    DescribeAcls(DescribeAclsRequest),
    CreateAcls(CreateAclsRequest),
    DescribeUserScramCredentials(DescribeUserScramCredentialsRequest),
    DescribeClientQuotas(DescribeClientQuotasRequest),
    AlterClientQuotas(AlterClientQuotasRequest),
    AlterUserScramCredentials(AlterUserScramCredentialsRequest),
    DeleteAcls(DeleteAclsRequest),
}

/// Where a SASL request leaves the connection.
enum SaslOutcome {
    Continue,
    /// A v0 handshake: bare SASL tokens follow.
    RawTokens,
    /// As this user, for this long (KIP-368) or for the connection's life.
    Authenticated(String, Option<Duration>),
    Close,
}

/// Decodes a request frame (without its length prefix). Never panics on any input; the
/// fuzz target `request_decoder` holds it to that.
pub fn decode_request(mut frame: Bytes) -> Result<Decoded, Refusal> {
    if frame.len() < 8 {
        return Err(Refusal::Malformed {
            what: "request header",
            error: anyhow::anyhow!(
                "frame of {} bytes is shorter than a request header",
                frame.len()
            ),
        });
    }
    let raw_key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
    let key = ApiKey::try_from(raw_key).map_err(|_| Refusal::UnknownApi(raw_key))?;
    let supported = SUPPORTED_APIS
        .iter()
        .find(|(k, _, _)| *k == key)
        .is_some_and(|(_, min, max)| (*min..=*max).contains(&version));
    if !supported {
        if key == ApiKey::ApiVersions {
            return Ok(Decoded {
                key,
                version,
                correlation_id,
                client_id: String::new(),
                body: Body::UnsupportedApiVersions,
            });
        }
        return Err(Refusal::UnsupportedVersion { key, version });
    }
    let header = RequestHeader::decode(&mut frame, key.request_header_version(version)).map_err(
        |error| Refusal::Malformed {
            what: "request header",
            error,
        },
    )?;
    let body = match key {
        ApiKey::ApiVersions => Body::ApiVersions(decode_body(&mut frame, version)?),
        ApiKey::Metadata => Body::Metadata(decode_body(&mut frame, version)?),
        ApiKey::Produce => Body::Produce(decode_body(&mut frame, version)?, Default::default()),
        ApiKey::Fetch => Body::Fetch(decode_body(&mut frame, version)?),
        ApiKey::ListOffsets => Body::ListOffsets(decode_body(&mut frame, version)?),
        ApiKey::CreateTopics => Body::CreateTopics(decode_body(&mut frame, version)?),
        ApiKey::DeleteTopics => Body::DeleteTopics(decode_body(&mut frame, version)?),
        ApiKey::DescribeConfigs => Body::DescribeConfigs(decode_body(&mut frame, version)?),
        ApiKey::InitProducerId => Body::InitProducerId(decode_body(&mut frame, version)?),
        ApiKey::AddPartitionsToTxn => Body::AddPartitionsToTxn(decode_body(&mut frame, version)?),
        ApiKey::EndTxn => Body::EndTxn(decode_body(&mut frame, version)?),
        ApiKey::AddOffsetsToTxn => Body::AddOffsetsToTxn(decode_body(&mut frame, version)?),
        ApiKey::TxnOffsetCommit => Body::TxnOffsetCommit(decode_body(&mut frame, version)?),
        ApiKey::DescribeTransactions => {
            Body::DescribeTransactions(decode_body(&mut frame, version)?)
        }
        ApiKey::ListTransactions => Body::ListTransactions(decode_body(&mut frame, version)?),
        ApiKey::CreatePartitions => Body::CreatePartitions(decode_body(&mut frame, version)?),
        ApiKey::OffsetForLeaderEpoch => {
            Body::OffsetForLeaderEpoch(decode_body(&mut frame, version)?)
        }
        ApiKey::AlterConfigs => Body::AlterConfigs(decode_body(&mut frame, version)?),
        ApiKey::IncrementalAlterConfigs => {
            Body::IncrementalAlterConfigs(decode_body(&mut frame, version)?)
        }
        ApiKey::FindCoordinator => Body::FindCoordinator(decode_body(&mut frame, version)?),
        ApiKey::JoinGroup => Body::JoinGroup(decode_body(&mut frame, version)?),
        ApiKey::SyncGroup => Body::SyncGroup(decode_body(&mut frame, version)?),
        ApiKey::Heartbeat => Body::Heartbeat(decode_body(&mut frame, version)?),
        ApiKey::ConsumerGroupHeartbeat => {
            Body::ConsumerGroupHeartbeat(decode_body(&mut frame, version)?)
        }
        ApiKey::ConsumerGroupDescribe => {
            Body::ConsumerGroupDescribe(decode_body(&mut frame, version)?)
        }
        ApiKey::LeaveGroup => Body::LeaveGroup(decode_body(&mut frame, version)?),
        ApiKey::OffsetCommit => Body::OffsetCommit(decode_body(&mut frame, version)?),
        ApiKey::OffsetFetch => Body::OffsetFetch(decode_body(&mut frame, version)?),
        ApiKey::ListGroups => Body::ListGroups(decode_body(&mut frame, version)?),
        ApiKey::DescribeGroups => Body::DescribeGroups(decode_body(&mut frame, version)?),
        ApiKey::DeleteGroups => Body::DeleteGroups(decode_body(&mut frame, version)?),
        ApiKey::OffsetDelete => Body::OffsetDelete(decode_body(&mut frame, version)?),
        ApiKey::DeleteRecords => Body::DeleteRecords(decode_body(&mut frame, version)?),
        ApiKey::DescribeLogDirs => Body::DescribeLogDirs(decode_body(&mut frame, version)?),
        ApiKey::DescribeProducers => Body::DescribeProducers(decode_body(&mut frame, version)?),
        ApiKey::ElectLeaders => Body::ElectLeaders(decode_body(&mut frame, version)?),
        ApiKey::AlterPartitionReassignments => {
            Body::AlterPartitionReassignments(decode_body(&mut frame, version)?)
        }
        ApiKey::ListPartitionReassignments => {
            Body::ListPartitionReassignments(decode_body(&mut frame, version)?)
        }
        ApiKey::DescribeCluster => Body::DescribeCluster(decode_body(&mut frame, version)?),
        ApiKey::SaslHandshake => Body::SaslHandshake(decode_body(&mut frame, version)?),
        ApiKey::SaslAuthenticate => Body::SaslAuthenticate(decode_body(&mut frame, version)?),
        ApiKey::DescribeAcls => Body::DescribeAcls(decode_body(&mut frame, version)?),
        ApiKey::CreateAcls => Body::CreateAcls(decode_body(&mut frame, version)?),
        ApiKey::DeleteAcls => Body::DeleteAcls(decode_body(&mut frame, version)?),
        ApiKey::DescribeUserScramCredentials => {
            Body::DescribeUserScramCredentials(decode_body(&mut frame, version)?)
        }
        ApiKey::AlterUserScramCredentials => {
            Body::AlterUserScramCredentials(decode_body(&mut frame, version)?)
        }
        ApiKey::DescribeClientQuotas => {
            Body::DescribeClientQuotas(decode_body(&mut frame, version)?)
        }
        ApiKey::AlterClientQuotas => Body::AlterClientQuotas(decode_body(&mut frame, version)?),
        other => {
            return Err(Refusal::UnsupportedVersion {
                key: other,
                version,
            })
        }
    };
    let client_id = header.client_id.map(|c| c.to_string()).unwrap_or_default();
    if client_id.len() > MAX_CLIENT_ID_BYTES || client_id.chars().any(char::is_control) {
        return Err(Refusal::Malformed {
            what: "client id",
            error: anyhow::anyhow!(
                "a client id of {} bytes{}; at most {MAX_CLIENT_ID_BYTES} bytes without control characters are allowed",
                client_id.len(),
                if client_id.chars().any(char::is_control) {
                    " with control characters"
                } else {
                    ""
                }
            ),
        });
    }
    Ok(Decoded {
        key,
        version,
        correlation_id: header.correlation_id,
        client_id,
        body,
    })
}

/// One decoded request's context, shared with its handler.
#[derive(Clone)]
pub(crate) struct Request {
    server: Arc<KafkaServer>,
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    client_id: String,
    peer: std::net::SocketAddr,
    /// The peer's IP address, as ACL hosts name it.
    host: Arc<str>,
    /// Who sent it: `User:<name>` after SASL, else `User:ANONYMOUS`.
    principal: Arc<str>,
    /// Its connection's mute, for a quota's throttle.
    mute: Arc<quota::Mute>,
}

impl Request {
    pub fn broker(&self) -> &Arc<Broker> {
        &self.server.broker
    }

    /// Whether this request's principal, from its address, may do `operation` on a resource
    /// (ACLs, docs/security.md).
    pub fn may(
        &self,
        operation: acl::Operation,
        resource_type: acl::ResourceType,
        name: &str,
    ) -> bool {
        let allowed = self.permits(operation, resource_type, name);
        if !allowed {
            tracing::info!(principal = %self.principal, peer = %self.peer, api = ?self.key, ?operation, ?resource_type, resource = name, "denied by ACLs");
        }
        allowed
    }

    /// [`Request::may`] without the log line, for filtering (Metadata's topic list).
    pub fn permits(
        &self,
        operation: acl::Operation,
        resource_type: acl::ResourceType,
        name: &str,
    ) -> bool {
        self.server
            .broker
            .authorize(&self.principal, &self.host, operation, resource_type, name)
    }

    /// KIP-430: which of `candidates` this principal may perform on the resource, as Kafka's
    /// bit field (bit n set: the ACL operation with code n is allowed).
    pub fn authorized_operations(
        &self,
        resource_type: acl::ResourceType,
        name: &str,
        candidates: &[acl::Operation],
    ) -> i32 {
        candidates
            .iter()
            .filter(|op| self.permits(**op, resource_type, name))
            .fold(0, |bits, op| bits | 1 << op.code())
    }

    pub fn may_topic(&self, operation: acl::Operation, topic: &str) -> bool {
        self.may(operation, acl::ResourceType::Topic, topic)
    }

    pub fn may_group(&self, operation: acl::Operation, group: &str) -> bool {
        self.may(operation, acl::ResourceType::Group, group)
    }

    pub fn may_cluster(&self, operation: acl::Operation) -> bool {
        self.may(operation, acl::ResourceType::Cluster, acl::CLUSTER_NAME)
    }

    /// The brokers a Metadata answer lists, as (id, host, port): the unfenced ones, and
    /// always this one. A client is talking to it, so it is reachable; were every broker
    /// fenced (the controllers silent), an empty list would leave the client nowhere to go,
    /// and librdkafka forgets the brokers a Metadata answer leaves out.
    pub fn endpoints(&self) -> Vec<(i32, String, u16)> {
        let broker = self.broker();
        let me = broker.config().node_id;
        let mut all = broker
            .kafka_endpoints(&self.listener().name)
            .unwrap_or_default();
        if !all.iter().any(|(id, _, _)| *id == me) {
            all.push((
                me,
                self.listener().advertised_host.clone(),
                self.listener().advertised_port,
            ));
            all.sort_by_key(|(id, _, _)| *id);
        }
        all
    }

    pub fn listener(&self) -> &ListenerConfig {
        &self.server.config
    }

    /// The broker's fetch sessions (KIP-227).
    pub fn fetch_sessions(&self) -> &fetch_session::Cache {
        self.server.limits.fetch_sessions()
    }

    pub fn principal(&self) -> &str {
        &self.principal
    }

    /// Who this request is, as client quotas name it.
    fn quota_client(&self) -> quota::Client<'_> {
        quota::Client {
            user: self
                .principal
                .strip_prefix("User:")
                .unwrap_or(&self.principal),
            client_id: &self.client_id,
        }
    }

    /// Records `amount` against the client's quota of `key`; a throttle it earned mutes
    /// the connection. Returns the throttle in milliseconds, for `throttle_time_ms`.
    pub fn throttle(&self, key: quota::QuotaKey, amount: f64) -> i32 {
        let d = self.server.quotas.record(&self.quota_client(), key, amount);
        self.mute.extend(d);
        d.as_millis().min(i32::MAX as u128) as i32
    }

    /// The throttle the client owes on `key` now (recording nothing); mutes the connection
    /// for it.
    pub fn throttle_owed(&self, key: quota::QuotaKey) -> i32 {
        let d = self.server.quotas.owed(&self.quota_client(), key);
        self.mute.extend(d);
        d.as_millis().min(i32::MAX as u128) as i32
    }

    /// Time spent handling this request, against the client's `request_percentage`: one
    /// percent of a thread is 10 ms per second.
    fn record_request_time(&self, busy: Duration) {
        let percent_seconds = busy.as_secs_f64() * 100.0;
        self.throttle(quota::QuotaKey::RequestPercentage, percent_seconds);
    }

    fn respond_now<R: Encodable + HeaderVersion>(&self, resp: &R) -> Result<Reply, Refusal> {
        Ok(Reply::Now(encode(
            self.key,
            self.version,
            self.correlation_id,
            resp,
        )?))
    }

    /// Runs `handler` in its own task; its response is written when its turn comes.
    fn later<R, F>(&self, handler: F) -> Result<Reply, Refusal>
    where
        R: Encodable + HeaderVersion + Send + 'static,
        F: std::future::Future<Output = R> + Send + 'static,
    {
        self.later_sharing(async move { (handler.await, Vec::new()) }, |_| Vec::new())
    }

    /// As `later`, with the large byte fields `shared` names (a fetch response's records)
    /// kept out of the frame's buffer: the frame refers to them and they are written from
    /// where they are. The handler also gives the segment-file spans its response's
    /// stand-ins stand for (`frame::stand_in`), which the frame sends from their files.
    fn later_sharing<R, F>(
        &self,
        handler: F,
        shared: fn(&R) -> Vec<Bytes>,
    ) -> Result<Reply, Refusal>
    where
        R: Encodable + HeaderVersion + Send + 'static,
        F: std::future::Future<Output = (R, Vec<frame::Spanned>)> + Send + 'static,
    {
        let (key, version, correlation_id) = (self.key, self.version, self.correlation_id);
        let timed = self.server.quotas.active().then(|| self.clone());
        Ok(Reply::Later(tokio::spawn(async move {
            let (resp, spans) = match timed {
                Some(ctx) => {
                    let (resp, busy) = quota::Busy::new(handler).await;
                    ctx.record_request_time(busy);
                    resp
                }
                None => handler.await,
            };
            let shared = shared(&resp);
            let encoded = if shared.is_empty() && spans.is_empty() {
                encode(key, version, correlation_id, &resp).map(frame::Frame::from)
            } else {
                encode_sharing(key, version, correlation_id, &resp, &shared, &spans)
            };
            encoded.map_err(|e| {
                tracing::error!(api = ?key, version, error = %e, "cannot encode response; closing connection");
                anyhow::Error::from(e)
            })
        })))
    }
}

fn decode_body<T: Decodable>(frame: &mut Bytes, version: i16) -> Result<T, Refusal> {
    T::decode(frame, version).map_err(|error| Refusal::Malformed {
        what: "request body",
        error,
    })
}

/// Encodes a response frame: length, response header, body.
fn encode<R: Encodable + HeaderVersion>(
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    resp: &R,
) -> Result<BytesMut, Refusal> {
    let fail = |error| Refusal::Malformed {
        what: "response",
        error,
    };
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    let mut buf = BytesMut::with_capacity(64);
    buf.put_i32(0);
    header
        .encode(&mut buf, key.response_header_version(version))
        .map_err(fail)?;
    resp.encode(&mut buf, version).map_err(fail)?;
    let len = (buf.len() - 4) as i32;
    (&mut buf[..4]).put_i32(len);
    Ok(buf)
}

/// As `encode`, the slices of `shared` the response holds kept as parts of the frame.
fn encode_sharing<R: Encodable + HeaderVersion>(
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    resp: &R,
    shared: &[Bytes],
    spans: &[frame::Spanned],
) -> Result<frame::Frame, Refusal> {
    let fail = |error| Refusal::Malformed {
        what: "response",
        error,
    };
    let mut buf = frame::SharingBuf::new(shared, spans);
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(&mut buf, key.response_header_version(version))
        .map_err(fail)?;
    resp.encode(&mut buf, version).map_err(fail)?;
    let parts = buf.finish().map_err(|e| fail(e.into()))?;
    Ok(frame::Frame::Parts(parts))
}

fn api_versions_response(error_code: i16) -> ApiVersionsResponse {
    ApiVersionsResponse::default()
        .with_error_code(error_code)
        .with_api_keys(
            SUPPORTED_APIS
                .iter()
                .map(|(k, min, max)| {
                    ApiVersion::default()
                        .with_api_key(*k as i16)
                        .with_min_version(*min)
                        .with_max_version(*max)
                })
                .collect(),
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Any frame whose header names a served API and version decodes or is refused; the
        /// `request_decoder` fuzz target explores the same property with coverage guidance.
        #[test]
        fn served_api_frames_never_panic(
            api in 0..SUPPORTED_APIS.len(),
            version_pick in any::<prop::sample::Index>(),
            rest in proptest::collection::vec(any::<u8>(), 0..256),
        ) {
            let (key, min, max) = SUPPORTED_APIS[api];
            let version = min + version_pick.index((max - min + 1) as usize) as i16;
            let mut frame = Vec::with_capacity(8 + rest.len());
            frame.extend_from_slice(&(key as i16).to_be_bytes());
            frame.extend_from_slice(&version.to_be_bytes());
            frame.extend_from_slice(&1i32.to_be_bytes());
            frame.extend_from_slice(&rest);
            let _ = decode_request(Bytes::from(frame));
        }
    }

    #[test]
    fn huge_array_counts_are_refused_not_allocated() {
        let frame = Bytes::from_static(&[0, 3, 0, 0, 0xe1, 0, 0, 0x45, 0, 0, 0x2a, 0, 0xff, 0xff]);
        assert!(matches!(
            decode_request(frame),
            Err(Refusal::Malformed { .. })
        ));
    }
}
