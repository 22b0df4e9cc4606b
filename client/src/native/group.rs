//! A consumer group member over gRPC: joins through the group's coordinator, which assigns
//! the partitions (range, round-robin or sticky), reads them from the committed offsets
//! (or the earliest / latest when none), heartbeats from `poll`, rejoins when the group
//! rebalances, and commits its positions. It shares groups, coordinators and committed
//! offsets with Kafka clients.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_proto::v1::broker_client::BrokerClient;
use strata_proto::v1::{
    CommitOffsetsRequest, FetchOffsetsRequest, FindCoordinatorRequest, GroupHeartbeatRequest,
    GroupJoinRequest, GroupLeaveRequest, ListOffsetsRequest, PartitionOffset, TopicPartitions,
};

use super::{broker_error, fetch_records, Cluster, Consumed};
use crate::{ClientError, Result};

const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
const COORDINATOR_NOT_AVAILABLE: i16 = 15;
const NOT_COORDINATOR: i16 = 16;
const ILLEGAL_GENERATION: i16 = 22;
const UNKNOWN_MEMBER_ID: i16 = 25;
const REBALANCE_IN_PROGRESS: i16 = 27;

/// Where a member starts on a partition its group never committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetReset {
    Earliest,
    Latest,
}

#[derive(Debug, Clone)]
pub struct GroupConsumerConfig {
    pub group: String,
    pub topics: Vec<String>,
    /// "range", "roundrobin" or "sticky", run by the coordinator.
    pub assignor: String,
    pub session_timeout: Duration,
    pub heartbeat_interval: Duration,
    pub reset: OffsetReset,
    /// Static membership (`group.instance.id`).
    pub instance_id: Option<String>,
    pub client_id: String,
}

impl Default for GroupConsumerConfig {
    fn default() -> Self {
        GroupConsumerConfig {
            group: String::new(),
            topics: Vec::new(),
            assignor: "range".into(),
            session_timeout: Duration::from_secs(10),
            heartbeat_interval: Duration::from_secs(1),
            reset: OffsetReset::Earliest,
            instance_id: None,
            client_id: "strata-native".into(),
        }
    }
}

pub struct GroupConsumer {
    cluster: Arc<Cluster>,
    config: GroupConsumerConfig,
    coordinator: Option<BrokerClient<crate::GrpcChannel>>,
    member_id: String,
    generation: i32,
    /// Next offset to read of each assigned partition.
    positions: BTreeMap<(String, u32), i64>,
    last_heartbeat: Instant,
    rejoin: bool,
}

fn code_of(e: &Option<strata_proto::v1::Error>) -> i16 {
    e.as_ref().map_or(0, |e| e.code as i16)
}

fn failed(e: Option<strata_proto::v1::Error>) -> ClientError {
    let e = e.unwrap_or_default();
    broker_error(e.code, e.message)
}

impl GroupConsumer {
    /// Joins the group (waiting for the rebalance to complete) and positions every
    /// assigned partition.
    pub async fn join(cluster: Arc<Cluster>, config: GroupConsumerConfig) -> Result<GroupConsumer> {
        let mut c = GroupConsumer {
            cluster,
            config,
            coordinator: None,
            member_id: String::new(),
            generation: -1,
            positions: BTreeMap::new(),
            last_heartbeat: Instant::now(),
            rejoin: true,
        };
        c.rejoin().await?;
        Ok(c)
    }

    /// The partitions this member reads, in order.
    pub fn assignment(&self) -> Vec<(String, u32)> {
        self.positions.keys().cloned().collect()
    }

    pub fn generation(&self) -> i32 {
        self.generation
    }

    pub fn member_id(&self) -> &str {
        &self.member_id
    }

    async fn coordinator(&mut self) -> Result<BrokerClient<crate::GrpcChannel>> {
        if let Some(c) = &self.coordinator {
            return Ok(c.clone());
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut any = self.cluster.any().await?;
            let r = any
                .find_coordinator(FindCoordinatorRequest {
                    group: self.config.group.clone(),
                })
                .await?
                .into_inner();
            if r.error.is_none() {
                let c = self.cluster.broker(r.broker).await?;
                self.coordinator = Some(c.clone());
                return Ok(c);
            }
            if Instant::now() > deadline {
                return Err(failed(r.error));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// An answer from a coordinator that moved or is loading: find it again shortly.
    async fn lost_coordinator(&mut self) {
        self.coordinator = None;
        self.cluster.forget().await;
        let _ = self.cluster.refresh().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    async fn rejoin(&mut self) -> Result<()> {
        let deadline = Instant::now() + self.config.session_timeout * 6;
        loop {
            let mut coordinator = match self.coordinator().await {
                Ok(c) => c,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    self.lost_coordinator().await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let answer = coordinator
                .group_join(GroupJoinRequest {
                    group: self.config.group.clone(),
                    member_id: self.member_id.clone(),
                    instance_id: self.config.instance_id.clone(),
                    topics: self.config.topics.clone(),
                    assignor: self.config.assignor.clone(),
                    session_timeout_ms: self.config.session_timeout.as_millis() as u32,
                    rebalance_timeout_ms: (self.config.session_timeout * 3).as_millis() as u32,
                    client_id: self.config.client_id.clone(),
                })
                .await;
            let r = match answer {
                Ok(r) => r.into_inner(),
                Err(_) if Instant::now() < deadline => {
                    self.lost_coordinator().await;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            match code_of(&r.error) {
                0 => {}
                COORDINATOR_LOAD_IN_PROGRESS | COORDINATOR_NOT_AVAILABLE | NOT_COORDINATOR
                    if Instant::now() < deadline =>
                {
                    self.lost_coordinator().await;
                    continue;
                }
                UNKNOWN_MEMBER_ID if Instant::now() < deadline => {
                    self.member_id.clear();
                    continue;
                }
                REBALANCE_IN_PROGRESS | ILLEGAL_GENERATION if Instant::now() < deadline => {
                    self.member_id = r.member_id;
                    continue;
                }
                _ => return Err(failed(r.error)),
            }
            self.member_id = r.member_id;
            self.generation = r.generation;
            let assigned: Vec<(String, u32)> = r
                .assignment
                .iter()
                .flat_map(|t| t.partitions.iter().map(|p| (t.topic.clone(), *p as u32)))
                .collect();
            self.positions = self
                .starting_positions(&mut coordinator, &r.assignment, &assigned)
                .await?;
            self.rejoin = false;
            self.last_heartbeat = Instant::now();
            return Ok(());
        }
    }

    /// Committed offsets of the assignment, or the reset position where none.
    async fn starting_positions(
        &mut self,
        coordinator: &mut BrokerClient<crate::GrpcChannel>,
        asked: &[TopicPartitions],
        assigned: &[(String, u32)],
    ) -> Result<BTreeMap<(String, u32), i64>> {
        let r = coordinator
            .fetch_offsets(FetchOffsetsRequest {
                group: self.config.group.clone(),
                partitions: asked.to_vec(),
            })
            .await?
            .into_inner();
        if r.error.is_some() {
            return Err(failed(r.error));
        }
        let committed: BTreeMap<(String, u32), i64> = r
            .offsets
            .into_iter()
            .filter(|o| o.offset >= 0)
            .map(|o| ((o.topic, o.partition as u32), o.offset))
            .collect();
        let mut out = BTreeMap::new();
        for (topic, p) in assigned {
            let at = match committed.get(&(topic.clone(), *p)) {
                Some(o) => *o,
                None => {
                    let ts = match self.config.reset {
                        OffsetReset::Earliest => -2,
                        OffsetReset::Latest => -1,
                    };
                    let mut leader = self.cluster.leader(topic, *p).await?;
                    let r = leader
                        .list_offsets(ListOffsetsRequest {
                            topic: topic.clone(),
                            partition: *p,
                            timestamp: ts,
                        })
                        .await?
                        .into_inner();
                    if r.error.is_some() {
                        return Err(failed(r.error));
                    }
                    r.offset
                }
            };
            out.insert((topic.clone(), *p), at);
        }
        Ok(out)
    }

    async fn heartbeat(&mut self) -> Result<()> {
        let mut coordinator = self.coordinator().await?;
        let r = coordinator
            .group_heartbeat(GroupHeartbeatRequest {
                group: self.config.group.clone(),
                member_id: self.member_id.clone(),
                generation: self.generation,
            })
            .await;
        self.last_heartbeat = Instant::now();
        let code = match r {
            Ok(r) => code_of(&r.into_inner().error),
            Err(_) => NOT_COORDINATOR,
        };
        match code {
            0 => {}
            REBALANCE_IN_PROGRESS | ILLEGAL_GENERATION => self.rejoin = true,
            UNKNOWN_MEMBER_ID => {
                self.member_id.clear();
                self.rejoin = true;
            }
            // The coordinator moved: find it; the group keeps its generation.
            _ => self.lost_coordinator().await,
        }
        Ok(())
    }

    /// Heartbeats when due (rejoining if the group rebalances), then reads every assigned
    /// partition, waiting up to `max_wait` when none has records. Returns (topic, record).
    pub async fn poll(&mut self, max_wait: Duration) -> Result<Vec<(String, Consumed)>> {
        if self.last_heartbeat.elapsed() >= self.config.heartbeat_interval {
            self.heartbeat().await?;
        }
        if self.rejoin {
            self.rejoin().await?;
        }
        let wait = max_wait.min(self.config.heartbeat_interval);
        let fetches = self.positions.iter().map(|((topic, p), offset)| {
            let cluster = self.cluster.clone();
            let (topic, p, offset) = (topic.clone(), *p, *offset);
            async move {
                let r = fetch_records(&cluster, &topic, p, offset, wait).await;
                (topic, p, r)
            }
        });
        let results = futures_util::future::join_all(fetches).await;
        let mut out = Vec::new();
        let mut stale = false;
        for (topic, p, r) in results {
            match r {
                Ok((records, next)) => {
                    self.positions.insert((topic.clone(), p), next);
                    out.extend(records.into_iter().map(|r| (topic.clone(), r)));
                }
                Err(e) if Cluster::retriable(&e) => stale = true,
                Err(e) => return Err(e),
            }
        }
        if stale {
            let _ = self.cluster.refresh().await;
        }
        Ok(out)
    }

    /// Commits the position of every assigned partition (what `poll` returned so far).
    /// A rebalance under way fails the commit; the member rejoins at the next `poll`.
    pub async fn commit(&mut self) -> Result<()> {
        let mut coordinator = self.coordinator().await?;
        let r = coordinator
            .commit_offsets(CommitOffsetsRequest {
                group: self.config.group.clone(),
                member_id: self.member_id.clone(),
                generation: self.generation,
                offsets: self
                    .positions
                    .iter()
                    .map(|((topic, p), o)| PartitionOffset {
                        topic: topic.clone(),
                        partition: *p as i32,
                        offset: *o,
                    })
                    .collect(),
            })
            .await?
            .into_inner();
        match code_of(&r.error) {
            0 => Ok(()),
            REBALANCE_IN_PROGRESS | ILLEGAL_GENERATION | UNKNOWN_MEMBER_ID => {
                self.rejoin = true;
                Err(failed(r.error))
            }
            NOT_COORDINATOR | COORDINATOR_NOT_AVAILABLE | COORDINATOR_LOAD_IN_PROGRESS => {
                self.lost_coordinator().await;
                Err(failed(r.error))
            }
            _ => Err(failed(r.error)),
        }
    }

    /// Leaves the group, so its partitions move at once instead of after the session
    /// timeout.
    pub async fn close(mut self) -> Result<()> {
        let mut coordinator = self.coordinator().await?;
        let r = coordinator
            .group_leave(GroupLeaveRequest {
                group: self.config.group.clone(),
                member_id: self.member_id.clone(),
            })
            .await?
            .into_inner();
        match code_of(&r.error) {
            0 | UNKNOWN_MEMBER_ID => Ok(()),
            _ => Err(failed(r.error)),
        }
    }
}
