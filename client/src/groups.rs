//! Consumer group administration over the Kafka protocol, as `strata group` uses it: list
//! the groups of every broker, describe one (members, assignments, committed offsets and lag)
//! and reset a group's committed offsets while it has no members.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition as AssignedTopic;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::{
    BrokerId, ConsumerProtocolAssignment, ConsumerProtocolSubscription, DescribeGroupsRequest,
    FindCoordinatorRequest, GroupId, ListGroupsRequest, MetadataRequest, OffsetCommitRequest,
    OffsetFetchRequest, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

use crate::{list_offset, ClientError, Connection, Result};

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// The partitions a consumer-protocol assignment names, by topic; `None` when the bytes
/// are not one (another protocol type).
pub fn assigned_partitions(bytes: &[u8]) -> Option<Vec<(String, i32)>> {
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    let mut buf = Bytes::copy_from_slice(bytes);
    if buf.len() < 2 {
        return None;
    }
    let version = buf.get_i16();
    // Later versions only add fields: read them as the newest this codec knows.
    let a = ConsumerProtocolAssignment::decode(&mut buf, version.clamp(0, 3)).ok()?;
    Some(
        a.assigned_partitions
            .into_iter()
            .flat_map(|t| {
                let topic = t.topic.to_string();
                t.partitions.into_iter().map(move |p| (topic.clone(), p))
            })
            .collect(),
    )
}

/// The topics a consumer-protocol subscription (a member's JoinGroup metadata) names; `None`
/// when the bytes are not one (another protocol type).
pub fn subscription_topics(bytes: &[u8]) -> Option<BTreeSet<String>> {
    read_subscription(bytes).map(|(topics, _)| topics.into_iter().collect())
}

/// A consumer-protocol subscription's topics and the partitions its member says it owns
/// (v1+); `None` when the bytes are not one.
#[allow(clippy::type_complexity)]
pub fn read_subscription(bytes: &[u8]) -> Option<(Vec<String>, Vec<(String, i32)>)> {
    let mut buf = Bytes::copy_from_slice(bytes);
    if buf.len() < 2 {
        return None;
    }
    let version = buf.get_i16();
    // Later versions only add fields: read them as the newest this codec knows.
    let s = ConsumerProtocolSubscription::decode(&mut buf, version.clamp(0, 3)).ok()?;
    let topics = s.topics.iter().map(|t| t.to_string()).collect();
    let owned = s
        .owned_partitions
        .iter()
        .flat_map(|t| {
            let name = t.topic.to_string();
            t.partitions.iter().map(move |p| (name.clone(), *p))
        })
        .collect();
    Some((topics, owned))
}

/// Encodes a consumer-protocol assignment (version 0), as a group leader sends it.
pub fn encode_assignment(partitions: &[(String, i32)]) -> Bytes {
    let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for (t, p) in partitions {
        by_topic.entry(t).or_default().push(*p);
    }
    let a = ConsumerProtocolAssignment::default().with_assigned_partitions(
        by_topic
            .into_iter()
            .map(|(t, ps)| {
                AssignedTopic::default()
                    .with_topic(TopicName(s(t)))
                    .with_partitions(ps)
            })
            .collect(),
    );
    let mut buf = BytesMut::new();
    buf.put_i16(0);
    a.encode(&mut buf, 0).expect("version 0 encodes");
    buf.freeze()
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedGroup {
    pub group: String,
    pub protocol_type: String,
    pub state: String,
    pub coordinator: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMember {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub partitions: Vec<(String, i32)>,
}

/// One partition's committed offset and lag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionPosition {
    pub topic: String,
    pub partition: i32,
    /// `None`: nothing committed.
    pub committed: Option<i64>,
    pub log_end: Option<i64>,
    /// The member consuming it, if any.
    pub owner: Option<String>,
}

impl PartitionPosition {
    pub fn lag(&self) -> Option<i64> {
        Some((self.log_end? - self.committed?).max(0))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDescription {
    pub group: String,
    pub state: String,
    pub protocol_type: String,
    pub protocol: String,
    pub coordinator: i32,
    pub members: Vec<GroupMember>,
    pub positions: Vec<PartitionPosition>,
}

/// Where to move a group's offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetTarget {
    Earliest,
    Latest,
    /// The first offset whose record timestamp is at or after this (ms); the log end when
    /// every record is older.
    Timestamp(i64),
    /// This offset, clamped into the partition's [earliest, latest].
    Offset(i64),
}

/// Group administration through any broker of the cluster.
pub struct GroupAdmin {
    bootstrap: Connection,
    /// Broker id -> host:port, from the metadata.
    brokers: BTreeMap<i32, String>,
    conns: HashMap<i32, Connection>,
}

impl GroupAdmin {
    /// Connects to the first reachable broker of `bootstrap` (`host:port[,host:port...]`).
    pub async fn connect(bootstrap: &str) -> Result<GroupAdmin> {
        let mut conn = None;
        let mut last = None;
        for addr in bootstrap
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
        {
            match Connection::connect(addr).await {
                Ok(c) => {
                    conn = Some(c);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let mut conn = match (conn, last) {
            (Some(c), _) => c,
            (None, Some(e)) => return Err(e),
            (None, None) => return Err(ClientError::Protocol("no bootstrap address given".into())),
        };
        let meta = conn
            .send(
                &MetadataRequest::default().with_topics(Some(Vec::new())),
                12,
            )
            .await?;
        let brokers = meta
            .brokers
            .iter()
            .map(|b| (b.node_id.0, format!("{}:{}", b.host, b.port)))
            .collect();
        Ok(GroupAdmin {
            bootstrap: conn,
            brokers,
            conns: HashMap::new(),
        })
    }

    async fn broker(&mut self, id: i32) -> Result<&mut Connection> {
        if !self.conns.contains_key(&id) {
            let addr = self
                .brokers
                .get(&id)
                .ok_or_else(|| {
                    ClientError::Protocol(format!("broker {id} is not in the metadata"))
                })?
                .clone();
            self.conns.insert(id, Connection::connect(&addr).await?);
        }
        Ok(self.conns.get_mut(&id).expect("inserted"))
    }

    /// The broker coordinating `group`.
    pub async fn coordinator(&mut self, group: &str) -> Result<i32> {
        let mut last = None;
        for _ in 0..20 {
            let r = self
                .bootstrap
                .send(&FindCoordinatorRequest::default().with_key(s(group)), 3)
                .await?;
            if r.error_code == 0 {
                return Ok(r.node_id.0);
            }
            last = Some(ClientError::kafka(r.error_code, r.error_message.as_ref()));
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
        Err(last.expect("looped"))
    }

    /// Every group of the cluster, sorted by name.
    pub async fn list(&mut self) -> Result<Vec<ListedGroup>> {
        let ids: Vec<i32> = self.brokers.keys().copied().collect();
        let mut out = Vec::new();
        for id in ids {
            let r = self
                .broker(id)
                .await?
                .send(&ListGroupsRequest::default(), 4)
                .await?;
            if r.error_code != 0 {
                return Err(ClientError::kafka(r.error_code, None));
            }
            out.extend(r.groups.into_iter().map(|g| ListedGroup {
                group: g.group_id.to_string(),
                protocol_type: g.protocol_type.to_string(),
                state: g.group_state.to_string(),
                coordinator: id,
            }));
        }
        out.sort_by(|a, b| a.group.cmp(&b.group));
        Ok(out)
    }

    /// Partition leaders of `topics` (all partitions, by topic).
    async fn leaders(&mut self, topics: &[String]) -> Result<BTreeMap<String, Vec<Option<i32>>>> {
        use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
        let req = MetadataRequest::default().with_topics(Some(
            topics
                .iter()
                .map(|t| MetadataRequestTopic::default().with_name(Some(TopicName(s(t)))))
                .collect(),
        ));
        let r = self.bootstrap.send(&req, 12).await?;
        let mut out = BTreeMap::new();
        for t in r.topics {
            let name = t.name.map(|n| n.to_string()).unwrap_or_default();
            if t.error_code != 0 {
                return Err(ClientError::kafka(
                    t.error_code,
                    Some(&s(&format!("topic '{name}'"))),
                ));
            }
            let mut leaders = vec![None; t.partitions.len()];
            for p in t.partitions {
                if let Some(slot) = leaders.get_mut(p.partition_index as usize) {
                    *slot = (p.leader_id != BrokerId(-1)).then_some(p.leader_id.0);
                }
            }
            out.insert(name, leaders);
        }
        Ok(out)
    }

    /// ListOffsets at `timestamp` (-1 latest, -2 earliest) on the partition's leader.
    async fn offset_at(
        &mut self,
        leader: Option<i32>,
        topic: &str,
        partition: i32,
        timestamp: i64,
    ) -> Result<i64> {
        let leader = leader.ok_or_else(|| {
            ClientError::Protocol(format!("{topic}-{partition} has no leader (offline)"))
        })?;
        list_offset(self.broker(leader).await?, topic, partition, timestamp).await
    }

    /// A group's committed offsets (every partition with a commit).
    async fn committed(
        &mut self,
        coordinator: i32,
        group: &str,
    ) -> Result<BTreeMap<(String, i32), i64>> {
        let r = self
            .broker(coordinator)
            .await?
            .send(
                &OffsetFetchRequest::default()
                    .with_group_id(GroupId(s(group)))
                    .with_topics(None),
                7,
            )
            .await?;
        if r.error_code != 0 {
            return Err(ClientError::kafka(r.error_code, None));
        }
        let mut out = BTreeMap::new();
        for t in r.topics {
            for p in t.partitions {
                if p.error_code != 0 {
                    return Err(ClientError::kafka(p.error_code, None));
                }
                if p.committed_offset >= 0 {
                    out.insert((t.name.to_string(), p.partition_index), p.committed_offset);
                }
            }
        }
        Ok(out)
    }

    /// A group's state, members, and for every partition of the topics it consumes (or
    /// committed), the committed offset, the log end and the lag.
    pub async fn describe(&mut self, group: &str) -> Result<GroupDescription> {
        let coordinator = self.coordinator(group).await?;
        let r = self
            .broker(coordinator)
            .await?
            .send(
                &DescribeGroupsRequest::default().with_groups(vec![GroupId(s(group))]),
                5,
            )
            .await?;
        let d = r
            .groups
            .into_iter()
            .next()
            .ok_or_else(|| ClientError::Protocol("empty DescribeGroups response".into()))?;
        if d.error_code != 0 {
            return Err(ClientError::kafka(d.error_code, d.error_message.as_ref()));
        }
        let members: Vec<GroupMember> = d
            .members
            .iter()
            .map(|m| GroupMember {
                member_id: m.member_id.to_string(),
                instance_id: m.group_instance_id.as_ref().map(|i| i.to_string()),
                client_id: m.client_id.to_string(),
                client_host: m.client_host.to_string(),
                partitions: assigned_partitions(&m.member_assignment).unwrap_or_default(),
            })
            .collect();
        let committed = self.committed(coordinator, group).await?;
        let mut owners: BTreeMap<(String, i32), String> = BTreeMap::new();
        for m in &members {
            for p in &m.partitions {
                owners.insert(p.clone(), m.member_id.clone());
            }
        }
        let mut topics: Vec<String> = committed
            .keys()
            .chain(owners.keys())
            .map(|(t, _)| t.clone())
            .collect();
        topics.sort();
        topics.dedup();
        let leaders = if topics.is_empty() {
            BTreeMap::new()
        } else {
            self.leaders(&topics).await?
        };
        let mut positions = Vec::new();
        for (topic, parts) in &leaders {
            for (i, leader) in parts.iter().enumerate() {
                let key = (topic.clone(), i as i32);
                let log_end = self.offset_at(*leader, topic, i as i32, -1).await.ok();
                positions.push(PartitionPosition {
                    topic: topic.clone(),
                    partition: i as i32,
                    committed: committed.get(&key).copied(),
                    log_end,
                    owner: owners.get(&key).cloned(),
                });
            }
        }
        Ok(GroupDescription {
            group: group.to_string(),
            state: d.group_state.to_string(),
            protocol_type: d.protocol_type.to_string(),
            protocol: d.protocol_data.to_string(),
            coordinator,
            members,
            positions,
        })
    }

    /// The offsets a reset would commit for every partition of `topic`:
    /// (partition, current committed, new).
    pub async fn plan_reset(
        &mut self,
        group: &str,
        topic: &str,
        target: ResetTarget,
    ) -> Result<Vec<(i32, Option<i64>, i64)>> {
        let coordinator = self.coordinator(group).await?;
        let committed = self.committed(coordinator, group).await?;
        let leaders = self.leaders(&[topic.to_string()]).await?;
        let parts = leaders.get(topic).cloned().unwrap_or_default();
        let mut plan = Vec::with_capacity(parts.len());
        for (i, leader) in parts.into_iter().enumerate() {
            let p = i as i32;
            let new = match target {
                ResetTarget::Earliest => self.offset_at(leader, topic, p, -2).await?,
                ResetTarget::Latest => self.offset_at(leader, topic, p, -1).await?,
                ResetTarget::Timestamp(ts) => match self.offset_at(leader, topic, p, ts).await? {
                    -1 => self.offset_at(leader, topic, p, -1).await?,
                    o => o,
                },
                ResetTarget::Offset(o) => {
                    let lo = self.offset_at(leader, topic, p, -2).await?;
                    let hi = self.offset_at(leader, topic, p, -1).await?;
                    o.clamp(lo, hi)
                }
            };
            plan.push((p, committed.get(&(topic.to_string(), p)).copied(), new));
        }
        Ok(plan)
    }

    /// Commits `plan` for the group, which must have no members (as Kafka requires).
    pub async fn execute_reset(
        &mut self,
        group: &str,
        topic: &str,
        plan: &[(i32, Option<i64>, i64)],
    ) -> Result<()> {
        let coordinator = self.coordinator(group).await?;
        let req = OffsetCommitRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_generation_id_or_member_epoch(-1)
            .with_member_id(s(""))
            .with_retention_time_ms(-1)
            .with_topics(vec![OffsetCommitRequestTopic::default()
                .with_name(TopicName(s(topic)))
                .with_partitions(
                    plan.iter()
                        .map(|(p, _, o)| {
                            OffsetCommitRequestPartition::default()
                                .with_partition_index(*p)
                                .with_committed_offset(*o)
                                .with_committed_leader_epoch(-1)
                        })
                        .collect(),
                )]);
        let r = self.broker(coordinator).await?.send(&req, 7).await?;
        for t in r.topics {
            for p in t.partitions {
                if p.error_code != 0 {
                    let mut e = ClientError::kafka(p.error_code, None);
                    if p.error_code == 25 || p.error_code == 22 || p.error_code == 27 {
                        e = ClientError::Kafka {
                            code: p.error_code,
                            message: format!(
                                "group '{group}' has active members; stop its consumers before resetting offsets"
                            ),
                        };
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }
}
