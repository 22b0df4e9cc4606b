//! The native data plane over gRPC (`strata.v1.Broker`): metadata, produce, fetch, list
//! offsets, producer ids and consumer groups, with the same validation, append path,
//! durability waits and group coordinator as the Kafka listener, and Kafka's error codes in
//! the answers.
//!
//! Every call is authorized with the same ACLs as the Kafka listener. The caller's principal
//! is the subject of a bearer token (`authorization: Bearer <jwt>`, checked as OAUTHBEARER
//! tokens are: `User:<sub>`), else its TLS client certificate's (`User:CN=...`) when the
//! port uses mTLS, else `User:ANONYMOUS`. A bad token is `UNAUTHENTICATED`; a refusal is
//! `PERMISSION_DENIED` naming Kafka's error.

use std::sync::Arc;
use std::time::Duration;

use strata_controller::metadata::acl::{Operation, ResourceType, CLUSTER_NAME};
use strata_proto::tls::Peer;
use strata_proto::v1::broker_server::{Broker as BrokerApi, BrokerServer};
use strata_proto::v1::{
    BrokerEndpoint, ClusterMetadataRequest, ClusterMetadataResponse, CommitOffsetsRequest,
    CommitOffsetsResponse, Error, FetchOffsetsRequest, FetchOffsetsResponse, FetchRequest,
    FetchResponse, FindCoordinatorRequest, FindCoordinatorResponse, GroupHeartbeatRequest,
    GroupHeartbeatResponse, GroupJoinRequest, GroupJoinResponse, GroupLeaveRequest,
    GroupLeaveResponse, InitProducerIdRequest, InitProducerIdResponse, ListOffsetsRequest,
    ListOffsetsResponse, PartitionInfo, PartitionOffset, ProduceRequest, ProduceResponse,
    TopicInfo, TopicPartitions,
};
use tonic::{Request, Response, Status};

use crate::broker::{Broker, ProduceError, Route};
use crate::kafka::codes;
use crate::kafka::sasl::oauthbearer::Validator;

/// Who made a call, as ACLs name them.
struct Caller {
    principal: String,
    host: String,
}

/// Longest long poll a fetch may ask for.
const MAX_WAIT: Duration = Duration::from_secs(30);

pub struct GrpcService {
    broker: Arc<Broker>,
    /// This broker's own endpoint, for single-node metadata.
    me: BrokerEndpoint,
    /// Checks bearer tokens (`[kafka.sasl.oauthbearer]`); `None`: tokens are refused.
    oauth: Option<Arc<Validator>>,
}

impl GrpcService {
    pub fn server(
        broker: Arc<Broker>,
        me: BrokerEndpoint,
        oauth: Option<Arc<Validator>>,
    ) -> BrokerServer<GrpcService> {
        BrokerServer::new(GrpcService { broker, me, oauth })
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20)
    }

    fn route_error(&self, topic: &str, partition: u32, route: &Route) -> Error {
        let code = codes::route(route).expect("not the leader route");
        let leader = self
            .broker
            .topic(topic)
            .and_then(|t| t.layout.get(partition as usize).and_then(|l| l.leader));
        Error {
            code: i32::from(code),
            message: if code == codes::NOT_LEADER_OR_FOLLOWER {
                format!(
                    "broker {} does not lead {topic}-{partition}",
                    self.broker.config().node_id
                )
            } else {
                format!("{topic}-{partition} does not exist")
            },
            leader,
        }
    }

    /// Who makes a call: a bearer token's subject, else the client certificate's, else
    /// anonymous.
    fn caller<T>(&self, req: &Request<T>) -> Result<Caller, Status> {
        let host = req
            .remote_addr()
            .map_or_else(String::new, |a| a.ip().to_string());
        let Some(auth) = req.metadata().get("authorization") else {
            let principal = Peer::of(req)
                .principal()
                .unwrap_or_else(|| crate::kafka::ANONYMOUS.to_string());
            return Ok(Caller { principal, host });
        };
        let token = auth
            .to_str()
            .ok()
            .and_then(|a| a.strip_prefix("Bearer "))
            .ok_or_else(|| Status::unauthenticated("authorization is not 'Bearer <token>'"))?;
        let validator = self.oauth.as_ref().ok_or_else(|| {
            Status::unauthenticated(
                "this broker takes no bearer tokens ([kafka.sasl.oauthbearer] is not configured)",
            )
        })?;
        let (user, _) = validator.validate(token.trim()).map_err(|e| {
            tracing::info!(%host, reason = %e, "gRPC bearer token refused");
            Status::unauthenticated(format!("invalid token: {e}"))
        })?;
        Ok(Caller {
            principal: format!("User:{user}"),
            host,
        })
    }

    /// The caller, if it may do `op` on the resource.
    fn require<T>(
        &self,
        req: &Request<T>,
        op: Operation,
        rt: ResourceType,
        name: &str,
    ) -> Result<Caller, Status> {
        let caller = self.caller(req)?;
        self.allow(&caller, op, rt, name)?;
        Ok(caller)
    }

    fn permits(&self, c: &Caller, op: Operation, rt: ResourceType, name: &str) -> bool {
        self.broker.authorize(&c.principal, &c.host, op, rt, name)
    }

    /// Refuses the call unless `c` may do `op` on the resource.
    fn allow(&self, c: &Caller, op: Operation, rt: ResourceType, name: &str) -> Result<(), Status> {
        if self.permits(c, op, rt, name) {
            return Ok(());
        }
        let kafka_error = match rt {
            ResourceType::Topic => "TOPIC_AUTHORIZATION_FAILED",
            ResourceType::Group => "GROUP_AUTHORIZATION_FAILED",
            ResourceType::TransactionalId => "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
            _ => "CLUSTER_AUTHORIZATION_FAILED",
        };
        tracing::info!(principal = %c.principal, host = %c.host, ?op, ?rt, resource = name, "gRPC call denied by ACLs");
        Err(Status::permission_denied(format!(
            "{kafka_error}: {} may not {op:?} {rt:?} '{name}'",
            c.principal
        )))
    }
}

impl GrpcService {
    async fn produce_inner(&self, r: ProduceRequest) -> Result<Response<ProduceResponse>, Status> {
        let acks = i16::try_from(r.acks).ok().filter(|a| matches!(a, -1..=1));
        let Some(acks) = acks else {
            return Ok(Response::new(ProduceResponse {
                error: error(
                    codes::INVALID_REQUIRED_ACKS,
                    format!("acks={} is not one of -1, 0, 1", r.acks),
                ),
                ..Default::default()
            }));
        };
        let index = r.partition as i32;
        let now = self.broker.now_ms();
        let pending = match self
            .broker
            .append(&r.topic, index, r.records.into(), acks, now)
        {
            Ok(p) => p,
            Err(e) => {
                let (code, message) = codes::produce(&e);
                let leader = match &e {
                    ProduceError::NotLeader { leader, .. } => *leader,
                    _ => None,
                };
                return Ok(Response::new(ProduceResponse {
                    error: Some(Error {
                        code: i32::from(code),
                        message,
                        leader,
                    }),
                    base_offset: -1,
                    log_start_offset: -1,
                }));
            }
        };
        let timeout = Duration::from_millis(u64::from(r.timeout_ms.max(1)));
        let error = match pending
            .durable(timeout, &self.broker.metrics().commit_latency)
            .await
        {
            Ok(()) => None,
            Err(e) => {
                let (code, message) = codes::wait(&e);
                error(code, message)
            }
        };
        Ok(Response::new(ProduceResponse {
            base_offset: if error.is_none() {
                pending.base_offset() as i64
            } else {
                -1
            },
            log_start_offset: pending.log_start() as i64,
            error,
        }))
    }

    async fn fetch_inner(&self, r: FetchRequest) -> Result<Response<FetchResponse>, Status> {
        let partition = match self.broker.route(&r.topic, r.partition as i32) {
            Route::Leader(p) => p,
            other => {
                return Ok(Response::new(FetchResponse {
                    error: Some(self.route_error(&r.topic, r.partition, &other)),
                    ..Default::default()
                }))
            }
        };
        if r.offset < 0 {
            return Ok(Response::new(FetchResponse {
                error: error(
                    codes::OFFSET_OUT_OF_RANGE,
                    format!("offset {} is negative", r.offset),
                ),
                ..Default::default()
            }));
        }
        let wait = Duration::from_millis(u64::from(r.max_wait_ms)).min(MAX_WAIT);
        let max_bytes = (r.max_bytes as usize).clamp(1, 64 << 20);
        let progress = partition.progress();
        if (r.offset as u64) < progress.deleted_below {
            return Ok(Response::new(FetchResponse {
                error: error(
                    codes::OFFSET_OUT_OF_RANGE,
                    format!(
                        "offset {} was deleted (records below {} are)",
                        r.offset, progress.deleted_below
                    ),
                ),
                high_watermark: progress.high_watermark as i64,
                log_start_offset: progress.deleted_below as i64,
                records: Default::default(),
            }));
        }
        if (r.offset as u64) < progress.log_start {
            // Below the local log: from the cold tier, when it holds the offset.
            let cold = self.broker.cold().zip(self.broker.topic(&r.topic));
            if cold.is_some() && crate::broker::tier::cold_tier_unknown(&partition) {
                return Ok(Response::new(FetchResponse {
                    error: error(
                        codes::KAFKA_STORAGE_ERROR,
                        format!(
                            "offset {} is below the local log and the cold tier's manifest is not read yet (retry)",
                            r.offset
                        ),
                    ),
                    high_watermark: progress.high_watermark as i64,
                    log_start_offset: progress.log_start as i64,
                    records: Default::default(),
                }));
            }
            if let Some((cold, topic)) = cold {
                let read = cold
                    .read(
                        topic.spec.id,
                        r.partition as i32,
                        r.offset as u64,
                        max_bytes,
                    )
                    .await;
                match read {
                    Some(Ok(records)) => {
                        return Ok(Response::new(FetchResponse {
                            error: None,
                            high_watermark: progress.high_watermark as i64,
                            log_start_offset: cold
                                .earliest(topic.spec.id, r.partition as i32)
                                .map_or(progress.log_start, |e| e.min(progress.log_start))
                                .max(progress.deleted_below)
                                as i64,
                            records: records.into(),
                        }))
                    }
                    Some(Err(e)) => {
                        return Ok(Response::new(FetchResponse {
                            error: error(
                                codes::KAFKA_STORAGE_ERROR,
                                format!("cold tier read failed (retry): {e}"),
                            ),
                            high_watermark: progress.high_watermark as i64,
                            log_start_offset: progress.log_start as i64,
                            records: Default::default(),
                        }))
                    }
                    None => {}
                }
            }
        }
        match partition
            .read_waiting(r.offset as u64, max_bytes, wait)
            .await
        {
            Ok((records, progress)) => Ok(Response::new(FetchResponse {
                error: None,
                high_watermark: progress.high_watermark as i64,
                log_start_offset: progress.log_start as i64,
                records: records.into(),
            })),
            Err(e) => {
                let progress = partition.progress();
                Ok(Response::new(FetchResponse {
                    error: error(codes::read(&e), e.to_string()),
                    high_watermark: progress.high_watermark as i64,
                    log_start_offset: progress.log_start as i64,
                    records: Default::default(),
                }))
            }
        }
    }
}

/// An error for an answer; `None` for code 0 (no error).
fn error(code: i16, message: impl Into<String>) -> Option<Error> {
    (code != codes::NONE).then(|| Error {
        code: i32::from(code),
        message: message.into(),
        leader: None,
    })
}

#[tonic::async_trait]
impl BrokerApi for GrpcService {
    async fn metadata(
        &self,
        req: Request<ClusterMetadataRequest>,
    ) -> Result<Response<ClusterMetadataResponse>, Status> {
        let caller = self.caller(&req)?;
        let req = req.into_inner();
        let brokers = match self.broker.cluster() {
            Some(link) => {
                let m = link.metadata().borrow().clone();
                m.brokers
                    .values()
                    .filter(|b| !b.fenced)
                    .map(|b| {
                        let port = |name: &str| {
                            b.endpoints
                                .iter()
                                .find(|e| e.name == name)
                                .map(|e| (e.host.clone(), e.port))
                        };
                        let grpc = port("grpc");
                        // the first Kafka listener
                        let kafka = b.endpoints.iter().find(|e| e.name != "grpc");
                        BrokerEndpoint {
                            id: b.id,
                            host: grpc.as_ref().map(|(h, _)| h.clone()).unwrap_or_default(),
                            kafka_port: kafka.map_or(0, |e| u32::from(e.port)),
                            grpc_port: grpc.map_or(0, |(_, p)| u32::from(p)),
                        }
                    })
                    .collect()
            }
            None => vec![self.me.clone()],
        };
        let all = self.broker.topics();
        let mut unknown = Vec::new();
        let wanted: Vec<_> = if req.topics.is_empty() {
            all
        } else {
            // A topic asked for by name that the caller may not Describe is refused, as
            // Kafka answers it TOPIC_AUTHORIZATION_FAILED (existing or not, so the refusal
            // does not tell a stranger which topics exist).
            for n in &req.topics {
                self.allow(&caller, Operation::Describe, ResourceType::Topic, n)?;
            }
            req.topics
                .iter()
                .filter_map(|n| {
                    let t = self.broker.topic(n);
                    if t.is_none() {
                        unknown.push(n.clone());
                    }
                    t
                })
                .collect()
        };
        // Topics the caller may not Describe are left out, as Kafka's Metadata does.
        let topics = wanted
            .iter()
            .filter(|t| {
                self.permits(
                    &caller,
                    Operation::Describe,
                    ResourceType::Topic,
                    &t.spec.name,
                )
            })
            .map(|t| TopicInfo {
                name: t.spec.name.clone(),
                id: t.spec.id.to_string(),
                partitions: t
                    .layout
                    .iter()
                    .enumerate()
                    .map(|(i, l)| PartitionInfo {
                        index: i as u32,
                        leader: l.leader,
                        leader_epoch: l.leader_epoch,
                        replicas: l.replicas.clone(),
                        isr: l.isr.clone(),
                    })
                    .collect(),
            })
            .collect();
        let version = self
            .broker
            .cluster()
            .map_or(0, |l| l.metadata().borrow().version);
        Ok(Response::new(ClusterMetadataResponse {
            version,
            brokers,
            topics,
            unknown_topics: unknown,
        }))
    }

    async fn produce(
        &self,
        req: Request<ProduceRequest>,
    ) -> Result<Response<ProduceResponse>, Status> {
        let started = std::time::Instant::now();
        self.require(
            &req,
            Operation::Write,
            ResourceType::Topic,
            &req.get_ref().topic,
        )?;
        let resp = self.produce_inner(req.into_inner()).await;
        self.broker
            .metrics()
            .produce_latency
            .observe(started.elapsed());
        resp
    }

    async fn fetch(&self, req: Request<FetchRequest>) -> Result<Response<FetchResponse>, Status> {
        use std::sync::atomic::Ordering::Relaxed;
        let started = std::time::Instant::now();
        self.require(
            &req,
            Operation::Read,
            ResourceType::Topic,
            &req.get_ref().topic,
        )?;
        let (topic, partition) = (req.get_ref().topic.clone(), req.get_ref().partition);
        let resp = self.fetch_inner(req.into_inner()).await;
        let m = self.broker.metrics();
        m.fetch_requests.fetch_add(1, Relaxed);
        if let Ok(r) = &resp {
            let bytes = r.get_ref().records.len() as u64;
            self.broker
                .count_fetched(&topic, i32::try_from(partition).unwrap_or(-1), bytes);
        }
        m.fetch_latency.observe(started.elapsed());
        resp
    }

    async fn list_offsets(
        &self,
        req: Request<ListOffsetsRequest>,
    ) -> Result<Response<ListOffsetsResponse>, Status> {
        self.require(
            &req,
            Operation::Describe,
            ResourceType::Topic,
            &req.get_ref().topic,
        )?;
        let r = req.into_inner();
        let partition = match self.broker.route(&r.topic, r.partition as i32) {
            Route::Leader(p) => p,
            other => {
                return Ok(Response::new(ListOffsetsResponse {
                    error: Some(self.route_error(&r.topic, r.partition, &other)),
                    offset: -1,
                }))
            }
        };
        let ts = r.timestamp;
        let found = crate::broker::tier::list_offset(&self.broker, partition, ts).await;
        Ok(Response::new(match found {
            Ok((_, offset)) => ListOffsetsResponse {
                error: None,
                offset,
            },
            Err(e @ crate::broker::tier::ListOffsetError::ColdTierUnknown) => ListOffsetsResponse {
                error: error(codes::OFFSET_NOT_AVAILABLE, e.to_string()),
                offset: -1,
            },
            Err(e) => ListOffsetsResponse {
                error: error(codes::KAFKA_STORAGE_ERROR, e.to_string()),
                offset: -1,
            },
        }))
    }

    async fn find_coordinator(
        &self,
        req: Request<FindCoordinatorRequest>,
    ) -> Result<Response<FindCoordinatorResponse>, Status> {
        self.require(
            &req,
            Operation::Describe,
            ResourceType::Group,
            &req.get_ref().group,
        )?;
        let group = req.into_inner().group;
        Ok(Response::new(
            match self.broker.groups().find(&group).await {
                Ok(broker) => FindCoordinatorResponse {
                    error: None,
                    broker,
                },
                Err(code) => FindCoordinatorResponse {
                    error: error(code, format!("no coordinator for group '{group}' yet")),
                    broker: -1,
                },
            },
        ))
    }

    async fn group_join(
        &self,
        req: Request<GroupJoinRequest>,
    ) -> Result<Response<GroupJoinResponse>, Status> {
        let caller = self.require(
            &req,
            Operation::Read,
            ResourceType::Group,
            &req.get_ref().group,
        )?;
        // Subscribing to a topic the caller may not Describe is refused before the join
        // looks the topics up, so that an existing hidden topic and a missing one are
        // answered alike (issue 47) and no hidden topic's partitions are assigned.
        for topic in &req.get_ref().topics {
            self.allow(&caller, Operation::Describe, ResourceType::Topic, topic)?;
        }
        let host = req
            .remote_addr()
            .map_or_else(String::new, |a| format!("/{}", a.ip()));
        let r = req.into_inner();
        let join = crate::group::native::NativeJoin {
            group: r.group,
            member_id: r.member_id.clone(),
            instance_id: r.instance_id,
            topics: r.topics,
            assignor: r.assignor,
            session_timeout_ms: i64::from(r.session_timeout_ms),
            rebalance_timeout_ms: i64::from(r.rebalance_timeout_ms),
            client_id: r.client_id,
            client_host: host,
        };
        Ok(Response::new(
            match crate::group::native::join(&self.broker, join).await {
                Ok(j) => {
                    let mut by_topic: std::collections::BTreeMap<String, Vec<i32>> =
                        Default::default();
                    for (t, p) in j.assignment {
                        by_topic.entry(t).or_default().push(p);
                    }
                    GroupJoinResponse {
                        error: None,
                        member_id: j.member_id,
                        generation: j.generation,
                        assignment: by_topic
                            .into_iter()
                            .map(|(topic, partitions)| TopicPartitions { topic, partitions })
                            .collect(),
                    }
                }
                Err((code, message)) => GroupJoinResponse {
                    error: error(code, message),
                    member_id: r.member_id,
                    generation: -1,
                    assignment: Vec::new(),
                },
            },
        ))
    }

    async fn group_heartbeat(
        &self,
        req: Request<GroupHeartbeatRequest>,
    ) -> Result<Response<GroupHeartbeatResponse>, Status> {
        self.require(
            &req,
            Operation::Read,
            ResourceType::Group,
            &req.get_ref().group,
        )?;
        let r = req.into_inner();
        let code = match self.broker.groups().coordinator(&r.group) {
            Ok(c) => c.heartbeat(&r.group, &r.member_id, r.generation),
            Err(code) => code,
        };
        Ok(Response::new(GroupHeartbeatResponse {
            error: error(code, "heartbeat refused"),
        }))
    }

    async fn group_leave(
        &self,
        req: Request<GroupLeaveRequest>,
    ) -> Result<Response<GroupLeaveResponse>, Status> {
        self.require(
            &req,
            Operation::Read,
            ResourceType::Group,
            &req.get_ref().group,
        )?;
        let r = req.into_inner();
        let code = match self.broker.groups().coordinator(&r.group) {
            Ok(c) => c.leave(&r.group, &r.member_id, None),
            Err(code) => code,
        };
        Ok(Response::new(GroupLeaveResponse {
            error: error(code, "leave refused"),
        }))
    }

    async fn commit_offsets(
        &self,
        req: Request<CommitOffsetsRequest>,
    ) -> Result<Response<CommitOffsetsResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        self.allow(&caller, Operation::Read, ResourceType::Group, &r.group)?;
        for o in &r.offsets {
            self.allow(&caller, Operation::Read, ResourceType::Topic, &o.topic)?;
        }
        let unknown = r.offsets.iter().find(|o| {
            self.broker
                .topic(&o.topic)
                .is_none_or(|t| o.partition < 0 || o.partition as u32 >= t.spec.partitions)
        });
        if let Some(o) = unknown {
            return Ok(Response::new(CommitOffsetsResponse {
                error: error(
                    codes::UNKNOWN_TOPIC_OR_PARTITION,
                    format!(
                        "{}-{} does not exist; nothing committed",
                        o.topic, o.partition
                    ),
                ),
            }));
        }
        let commits = r
            .offsets
            .into_iter()
            .map(|o| crate::group::coordinator::Commit {
                topic: o.topic,
                partition: o.partition,
                offset: o.offset,
                leader_epoch: -1,
                metadata: String::new(),
            })
            .collect();
        let code = match self.broker.groups().coordinator(&r.group) {
            Ok(c) => {
                c.commit(&r.group, &r.member_id, r.generation, commits)
                    .await
            }
            Err(code) => code,
        };
        Ok(Response::new(CommitOffsetsResponse {
            error: error(code, "commit refused; nothing committed"),
        }))
    }

    async fn fetch_offsets(
        &self,
        req: Request<FetchOffsetsRequest>,
    ) -> Result<Response<FetchOffsetsResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        self.allow(&caller, Operation::Describe, ResourceType::Group, &r.group)?;
        for t in &r.partitions {
            self.allow(&caller, Operation::Describe, ResourceType::Topic, &t.topic)?;
        }
        let c = match self.broker.groups().coordinator(&r.group) {
            Ok(c) => c,
            Err(code) => {
                return Ok(Response::new(FetchOffsetsResponse {
                    error: error(
                        code,
                        format!("this broker does not coordinate '{}'", r.group),
                    ),
                    offsets: Vec::new(),
                }))
            }
        };
        let asked: Vec<(String, i32)> = r
            .partitions
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| (t.topic.clone(), *p)))
            .collect();
        let found = c.fetch(&r.group, &asked);
        Ok(Response::new(FetchOffsetsResponse {
            error: None,
            offsets: asked
                .into_iter()
                .zip(found)
                .map(|((topic, partition), o)| PartitionOffset {
                    topic,
                    partition,
                    offset: o.map_or(-1, |o| o.offset),
                })
                .collect(),
        }))
    }

    async fn init_producer_id(
        &self,
        req: Request<InitProducerIdRequest>,
    ) -> Result<Response<InitProducerIdResponse>, Status> {
        // Kafka (KIP-679): IdempotentWrite on the cluster, or Write on any topic.
        let caller = self.caller(&req)?;
        let may_write =
            self.permits(
                &caller,
                Operation::IdempotentWrite,
                ResourceType::Cluster,
                CLUSTER_NAME,
            ) || self.broker.topics().iter().any(|t| {
                self.permits(&caller, Operation::Write, ResourceType::Topic, &t.spec.name)
            });
        if !may_write {
            self.allow(
                &caller,
                Operation::IdempotentWrite,
                ResourceType::Cluster,
                CLUSTER_NAME,
            )?;
        }
        Ok(Response::new(
            match self.broker.allocate_producer_id().await {
                Ok(id) => InitProducerIdResponse {
                    error: None,
                    producer_id: id,
                    producer_epoch: 0,
                },
                Err(e) => InitProducerIdResponse {
                    error: error(codes::KAFKA_STORAGE_ERROR, e.to_string()),
                    producer_id: -1,
                    producer_epoch: -1,
                },
            },
        ))
    }
}
