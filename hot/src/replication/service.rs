//! The leader side of replication over gRPC (`strata.v1.Replica`): followers' fetches and
//! their OffsetForLeaderEpoch questions, answered from this broker's partitions.
//!
//! A request is admitted only from the broker it names: with mTLS its certificate must be
//! that broker's (`CN=broker-<replica_id>`), and always its broker epoch must not be older
//! than that broker's newest registration, so neither a stranger nor a dead incarnation of
//! the follower can move the high watermark.

use std::sync::Arc;
use std::time::Duration;

use strata_proto::tls::Peer;
use strata_proto::v1::replica_server::{Replica, ReplicaServer};
use strata_proto::v1::{
    Error, OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse, ReplicaFetchRequest,
    ReplicaFetchResponse, TxnMarkerResult, VerifyTxnRequest, VerifyTxnResponse,
    WriteTxnMarkersRequest, WriteTxnMarkersResponse,
};
use tonic::{Request, Response, Status};

use crate::broker::partition::{FollowerFetch, ReplicaFetchError};
use crate::broker::{Broker, Partition};
use crate::kafka::codes;
use crate::log::ReadError;

/// Longest long poll a follower may ask for.
const MAX_WAIT: Duration = Duration::from_secs(10);
/// Longest a throttled fetch waits before it is served or answered empty.
const MAX_THROTTLE_WAIT: Duration = Duration::from_secs(2);
/// Largest response a follower may ask for.
const MAX_BYTES: u32 = 32 << 20;
/// Fetches one session may have in flight: one per partition the follower follows here.
const MAX_SESSION_FETCHES: usize = 1 << 16;
/// Answers of a session waiting for the connection to take them.
const SESSION_QUEUE: usize = 64;

#[derive(Clone)]
pub struct ReplicaService {
    broker: Arc<Broker>,
    /// Whether the port proves its peers (mTLS).
    authenticated: bool,
    /// Copy-rate limits of replicas a reassignment adds.
    throttles: Arc<super::throttle::Throttles>,
}

impl ReplicaService {
    pub fn server(broker: Arc<Broker>, authenticated: bool) -> ReplicaServer<ReplicaService> {
        ReplicaServer::new(ReplicaService {
            broker,
            authenticated,
            throttles: Arc::new(Default::default()),
        })
        .max_decoding_message_size(1 << 20)
        .max_encoding_message_size(2 * MAX_BYTES as usize)
    }

    /// The local replica of `topic`-`partition`, if the topic id matches (a follower of a
    /// deleted and re-created topic must not fetch the new one's data).
    fn partition(
        &self,
        topic: &str,
        topic_id: &str,
        partition: u32,
    ) -> Result<Arc<Partition>, Error> {
        let unknown = || Error {
            code: i32::from(codes::UNKNOWN_TOPIC_OR_PARTITION),
            message: format!("{topic}-{partition} (topic id {topic_id}) is not on this broker"),
            leader: None,
        };
        let t = self.broker.topic(topic).ok_or_else(unknown)?;
        if t.spec.id.to_string() != topic_id {
            return Err(unknown());
        }
        t.partitions
            .get(partition as usize)
            .cloned()
            .flatten()
            .ok_or_else(unknown)
    }
}

impl ReplicaService {
    /// Refuses a request from anyone but `replica`'s certificate (a gRPC error: the caller
    /// is not a broker at all), or from another incarnation of it (a Kafka error the real
    /// follower handles by retrying once it knows its new epoch).
    fn admit<T>(&self, req: &Request<T>, replica: i32) -> Result<(), Status> {
        self.admit_peer(&Peer::of(req), replica)
    }

    fn admit_peer(&self, peer: &Peer, replica: i32) -> Result<(), Status> {
        if self.authenticated {
            match peer {
                Peer::Broker(id) if *id == replica => {}
                peer => {
                    tracing::warn!(%peer, replica, "replica request refused: not that broker's certificate");
                    return Err(Status::permission_denied(format!(
                        "replica {replica}'s requests need its certificate (CN=broker-{replica}); this one came from {peer}"
                    )));
                }
            }
        }
        Ok(())
    }

    /// A fetch must come from the follower's incarnation this leader knows the controllers
    /// registered. An older one is a process that is gone (or a zombie of it). A newer one is
    /// refused too (issue 47: a fetch sent at epoch + 1000 with the follower's certificate
    /// made the leader ignore the real follower's fetches for good): either the leader's
    /// metadata does not show the registration yet, and the follower asks again shortly
    /// (STALE_BROKER_EPOCH is "not ready" to it), or no controller ever gave that epoch.
    fn stale_epoch(&self, replica: i32, broker_epoch: u64) -> Option<Error> {
        let cluster = self.broker.cluster()?;
        let message = match cluster.registered_epoch(replica) {
            Some(registered) if registered == broker_epoch => return None,
            Some(registered) if broker_epoch < registered => format!(
                "broker {replica} fetches at broker epoch {broker_epoch}; it registered again at {registered}"
            ),
            Some(registered) => format!(
                "broker {replica} fetches at broker epoch {broker_epoch}, but its registration this leader knows is {registered}; ask again once the metadata shows the newer one"
            ),
            None => format!(
                "broker {replica} fetches at broker epoch {broker_epoch}, but this leader knows no registration of it"
            ),
        };
        Some(Error {
            code: i32::from(codes::STALE_BROKER_EPOCH),
            message,
            leader: None,
        })
    }
}

fn epoch_error(e: ReplicaFetchError) -> Error {
    let code = match e {
        ReplicaFetchError::NotLeader | ReplicaFetchError::NotReplica(_) => {
            codes::NOT_LEADER_OR_FOLLOWER
        }
        ReplicaFetchError::FencedLeaderEpoch(_) => codes::FENCED_LEADER_EPOCH,
        ReplicaFetchError::UnknownLeaderEpoch(_) => codes::UNKNOWN_LEADER_EPOCH,
    };
    Error {
        code: i32::from(code),
        message: e.to_string(),
        leader: None,
    }
}

#[tonic::async_trait]
impl Replica for ReplicaService {
    /// A transaction coordinator's markers for partitions led here.
    async fn write_txn_markers(
        &self,
        req: Request<WriteTxnMarkersRequest>,
    ) -> Result<Response<WriteTxnMarkersResponse>, Status> {
        self.admit(&req, req.get_ref().coordinator_id)?;
        let r = req.into_inner();
        let mut results = Vec::new();
        for m in r.markers {
            let epoch = i16::try_from(m.producer_epoch)
                .map_err(|_| Status::invalid_argument("producer epoch out of range"))?;
            let marker = strata_core::batch::marker::Marker {
                commit: m.commit,
                coordinator_epoch: m.coordinator_epoch,
            };
            for p in m.partitions {
                let Ok(index) = i32::try_from(p.partition) else {
                    return Err(Status::invalid_argument("partition out of range"));
                };
                let written = self
                    .broker
                    .write_txn_marker(&p.topic, index, m.producer_id, epoch, marker)
                    .await;
                results.push(TxnMarkerResult {
                    producer_id: m.producer_id,
                    topic: p.topic,
                    partition: p.partition,
                    error: written.err().map(|(code, message)| Error {
                        code: i32::from(code),
                        message,
                        leader: None,
                    }),
                });
            }
        }
        Ok(Response::new(WriteTxnMarkersResponse { results }))
    }

    /// KIP-890: whether partitions are in a producer's open transaction, for a partition
    /// leader about to append its first transactional batch there.
    async fn verify_txn(
        &self,
        req: Request<VerifyTxnRequest>,
    ) -> Result<Response<VerifyTxnResponse>, Status> {
        self.admit(&req, req.get_ref().leader_id)?;
        let r = req.into_inner();
        let epoch = i16::try_from(r.producer_epoch)
            .map_err(|_| Status::invalid_argument("producer epoch out of range"))?;
        let mut partitions = Vec::with_capacity(r.partitions.len());
        for p in r.partitions {
            let index = i32::try_from(p.partition)
                .map_err(|_| Status::invalid_argument("partition out of range"))?;
            partitions.push((p.topic, index));
        }
        let error_codes = self
            .broker
            .txns()
            .verify_here(&r.transactional_id, r.producer_id, epoch, &partitions)
            .await
            .into_iter()
            .map(|r| i32::from(r.err().unwrap_or(codes::NONE)))
            .collect();
        Ok(Response::new(VerifyTxnResponse { error_codes }))
    }

    async fn fetch(
        &self,
        req: Request<ReplicaFetchRequest>,
    ) -> Result<Response<ReplicaFetchResponse>, Status> {
        self.admit(&req, req.get_ref().replica_id)?;
        Ok(Response::new(self.fetch_one(req.into_inner()).await))
    }

    type FetchStreamStream =
        tokio_stream::wrappers::ReceiverStream<Result<ReplicaFetchResponse, Status>>;

    async fn fetch_stream(
        &self,
        req: Request<tonic::Streaming<ReplicaFetchRequest>>,
    ) -> Result<Response<Self::FetchStreamStream>, Status> {
        let peer = Peer::of(&req);
        let mut inbound = req.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let service = self.clone();
        tokio::spawn(async move {
            // one response per request, in order, until the follower ends the stream
            while let Ok(Some(r)) = inbound.message().await {
                let answer = match service.admit_peer(&peer, r.replica_id) {
                    Ok(()) => Ok(service.fetch_one(r).await),
                    Err(refused) => Err(refused),
                };
                let last = answer.is_err();
                if tx.send(answer).await.is_err() || last {
                    return;
                }
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
    }

    type FetchSessionStream =
        tokio_stream::wrappers::ReceiverStream<Result<ReplicaFetchResponse, Status>>;

    async fn fetch_session(
        &self,
        req: Request<tonic::Streaming<ReplicaFetchRequest>>,
    ) -> Result<Response<Self::FetchSessionStream>, Status> {
        if strata_controller::failpoint::armed("fetch-session-unimplemented") {
            // a test stands in for a leader of the version before FetchSession
            return Err(Status::unimplemented("FetchSession (failpoint)"));
        }
        let peer = Peer::of(&req);
        let inbound = req.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(SESSION_QUEUE);
        tokio::spawn(self.clone().serve_session(peer, inbound, tx));
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
    }

    async fn offset_for_leader_epoch(
        &self,
        req: Request<OffsetForLeaderEpochRequest>,
    ) -> Result<Response<OffsetForLeaderEpochResponse>, Status> {
        self.admit(&req, req.get_ref().replica_id)?;
        let r = req.into_inner();
        if let Some(e) = self.stale_epoch(r.replica_id, r.broker_epoch) {
            return Ok(Response::new(OffsetForLeaderEpochResponse {
                error: Some(e),
                ..Default::default()
            }));
        }
        let partition = match self.partition(&r.topic, &r.topic_id, r.partition) {
            Ok(p) => p,
            Err(e) => {
                return Ok(Response::new(OffsetForLeaderEpochResponse {
                    error: Some(e),
                    ..Default::default()
                }))
            }
        };
        if let Err(e) = partition.check_leader(r.current_leader_epoch) {
            return Ok(Response::new(OffsetForLeaderEpochResponse {
                error: Some(epoch_error(e)),
                ..Default::default()
            }));
        }
        let found = partition.lock().epoch_end_offset(r.leader_epoch);
        Ok(Response::new(OffsetForLeaderEpochResponse {
            error: None,
            leader_epoch: found.map(|(e, _)| e),
            end_offset: found.map_or(0, |(_, o)| o),
        }))
    }
}

impl ReplicaService {
    /// A follower's fetch session: every request is served as it comes, each partition's
    /// long poll on its own, and answered tagged as soon as it is done. One task serves the
    /// whole session (its fetches are futures it polls, not tasks). The session ends when the
    /// follower goes away, at a request not from the follower's certificate, or when the
    /// follower has closed its side and every request it sent is answered.
    async fn serve_session(
        self,
        peer: Peer,
        mut inbound: tonic::Streaming<ReplicaFetchRequest>,
        tx: tokio::sync::mpsc::Sender<Result<ReplicaFetchResponse, Status>>,
    ) {
        use futures_util::stream::{FuturesUnordered, StreamExt};
        let mut fetches = FuturesUnordered::new();
        // The follower closed its side: no more requests, but the ones in flight are still
        // answered (it may be waiting for them).
        let mut closed = false;
        loop {
            if closed && fetches.is_empty() {
                return;
            }
            tokio::select! {
                // A follower has one fetch per partition in flight (and a few abandoned
                // ones); past the cap, answers are sent before more requests are read.
                message = inbound.message(), if !closed && fetches.len() < MAX_SESSION_FETCHES => {
                    let r = match message {
                        Ok(Some(r)) => r,
                        Ok(None) => {
                            closed = true;
                            continue;
                        }
                        // the connection is gone
                        Err(_) => return,
                    };
                    if let Err(refused) = self.admit_peer(&peer, r.replica_id) {
                        let _ = tx.send(Err(refused)).await;
                        return;
                    }
                    let tag = r.tag;
                    let service = &self;
                    fetches.push(async move {
                        let mut resp = service.fetch_one(r).await;
                        resp.tag = tag;
                        resp
                    });
                }
                Some(resp) = fetches.next() => {
                    if tx.send(Ok(resp)).await.is_err() {
                        return;
                    }
                }
            }
        }
    }

    /// One follower fetch (unary or on a stream), its sender admitted already.
    async fn fetch_one(&self, r: ReplicaFetchRequest) -> ReplicaFetchResponse {
        if let Some(e) = self.stale_epoch(r.replica_id, r.broker_epoch) {
            return ReplicaFetchResponse {
                error: Some(e),
                ..Default::default()
            };
        }
        let partition = match self.partition(&r.topic, &r.topic_id, r.partition) {
            Ok(p) => p,
            Err(e) => {
                return ReplicaFetchResponse {
                    error: Some(e),
                    ..Default::default()
                }
            }
        };
        let max_wait = Duration::from_millis(u64::from(r.max_wait_ms)).min(MAX_WAIT);
        let mut max_bytes = r.max_bytes.clamp(1, MAX_BYTES) as usize;
        // A replica a reassignment adds copies at the move's rate, if it has one. The rate
        // comes from the topic's layout, which the broker installs only after it has taken
        // on the partition's new role: a fetch at a leader epoch the layout does not know yet
        // (a move that has just started) is asked to come again, never served unthrottled.
        let (layout_epoch, throttle) = self
            .broker
            .topic(&r.topic)
            .and_then(|t| {
                let layout = t.layout.get(r.partition as usize)?;
                let rate = layout
                    .throttle
                    .filter(|_| layout.adding.contains(&r.replica_id));
                Some((layout.leader_epoch, rate))
            })
            .unwrap_or((r.leader_epoch, None));
        if layout_epoch < r.leader_epoch {
            return ReplicaFetchResponse {
                error: Some(epoch_error(ReplicaFetchError::UnknownLeaderEpoch(
                    r.leader_epoch,
                ))),
                ..Default::default()
            };
        }
        let throttle_key = (r.topic.clone(), r.partition, r.replica_id);
        if let Some(rate) = throttle {
            let (wait, most) =
                self.throttles
                    .admit(&throttle_key, rate, max_bytes, std::time::Instant::now());
            if wait > MAX_THROTTLE_WAIT {
                // Deep in debt (a rate below a fetch's smallest size): answer nothing after
                // a pause, well inside the follower's call timeout, and let it ask again.
                tokio::time::sleep(MAX_THROTTLE_WAIT).await;
                let progress = partition.progress();
                return ReplicaFetchResponse {
                    error: None,
                    high_watermark: progress.high_watermark,
                    log_start_offset: progress.log_start,
                    log_end_offset: progress.log_end,
                    records: Default::default(),
                    deleted_below: progress.deleted_below,
                    tag: 0,
                };
            }
            tokio::time::sleep(wait).await;
            max_bytes = most;
        }
        let answer = partition
            .replica_fetch(
                FollowerFetch {
                    replica: r.replica_id,
                    broker_epoch: r.broker_epoch,
                    epoch: r.leader_epoch,
                    offset: r.fetch_offset,
                    deleted_below: r.deleted_below,
                    // only when consumers may read from followers: otherwise a follower
                    // need not learn the high watermark before the next records
                    wake_past_hw: r.high_watermark.filter(|_| {
                        self.broker.config().replica_selector
                            == crate::config::ReplicaSelector::RackAware
                    }),
                },
                max_bytes,
                max_wait,
                self.broker.now_ms(),
            )
            .await;
        let progress = partition.progress();
        let mut resp = ReplicaFetchResponse {
            error: None,
            high_watermark: progress.high_watermark,
            log_start_offset: progress.log_start,
            log_end_offset: progress.log_end,
            records: Default::default(),
            deleted_below: progress.deleted_below,
            tag: 0,
        };
        match answer {
            Err(e) => resp.error = Some(epoch_error(e)),
            Ok(Err(e @ ReadError::OffsetOutOfRange { .. })) => {
                resp.error = Some(Error {
                    code: i32::from(codes::OFFSET_OUT_OF_RANGE),
                    message: e.to_string(),
                    leader: None,
                })
            }
            Ok(Err(e)) => {
                tracing::error!(topic = %r.topic, partition = r.partition, error = %e, "replica fetch read failed");
                resp.error = Some(Error {
                    code: i32::from(codes::KAFKA_STORAGE_ERROR),
                    message: e.to_string(),
                    leader: None,
                })
            }
            Ok(Ok(a)) => {
                if throttle.is_some() {
                    self.throttles.charge(&throttle_key, a.records.len());
                }
                self.broker
                    .metrics()
                    .replicated_bytes
                    .fetch_add(a.records.len() as u64, std::sync::atomic::Ordering::Relaxed);
                resp.high_watermark = a.progress.high_watermark;
                resp.records = a.records;
            }
        }
        resp
    }
}
