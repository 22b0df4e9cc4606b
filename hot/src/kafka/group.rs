//! The consumer group APIs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
//! LeaveGroup, OffsetCommit, OffsetFetch, ListGroups, DescribeGroups and DeleteGroups.
//! They translate between Kafka's messages and the coordinator (`crate::group`). Also
//! KIP-848's ConsumerGroupHeartbeat, whose groups the coordinator assigns itself.

use std::collections::BTreeMap;

use kafka_protocol::messages::consumer_group_heartbeat_response::{
    Assignment, TopicPartitions as HeartbeatTopicPartitions,
};
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::find_coordinator_response::Coordinator as FoundCoordinator;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::{
    BrokerId, DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest,
    DescribeGroupsResponse, FindCoordinatorRequest, FindCoordinatorResponse, GroupId,
    HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest,
    LeaveGroupResponse, ListGroupsRequest, ListGroupsResponse, OffsetCommitRequest,
    OffsetCommitResponse, OffsetDeleteRequest, OffsetDeleteResponse, OffsetFetchRequest,
    OffsetFetchResponse, SyncGroupRequest, SyncGroupResponse, TopicName,
};
use kafka_protocol::messages::{
    ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse, ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
};
use kafka_protocol::messages::{TxnOffsetCommitRequest, TxnOffsetCommitResponse};
use kafka_protocol::protocol::StrBytes;
use strata_controller::metadata::acl::{Operation, ResourceType};

use super::{codes, s, Request};
use crate::group::consumer::{Client as ConsumerClient, ConsumerGroupConfig, Heartbeat, Topics};
use crate::group::coordinator::{Commit, Coordinator, GROUP_ID_NOT_FOUND};
use crate::group::invalid_group_id;
use crate::group::manager::{is_internal, INVALID_GROUP_ID};
use crate::group::state::{codes as group_codes, GroupState, Join};

/// Kafka's OFFSET_METADATA_TOO_LARGE.
const OFFSET_METADATA_TOO_LARGE: i16 = 12;
/// Kafka's `offset.metadata.max.bytes`.
const MAX_METADATA_BYTES: usize = 4096;

/// The group's coordinator here, once the principal may do `operation` on the group.
fn coordinator(
    ctx: &Request,
    group: &str,
    operation: Operation,
) -> Result<std::sync::Arc<Coordinator>, i16> {
    if invalid_group_id(group).is_some() {
        return Err(INVALID_GROUP_ID);
    }
    if !ctx.may_group(operation, group) {
        return Err(codes::GROUP_AUTHORIZATION_FAILED);
    }
    ctx.broker().groups().coordinator(group)
}

/// The broker coordinating transactional id `id`, or why not.
async fn find_txn_coordinator(
    ctx: &Request,
    id: &str,
) -> Result<(i32, String, u16), (i16, String)> {
    use strata_controller::metadata::acl::ResourceType;
    if id.is_empty() {
        return Err((codes::INVALID_REQUEST, "empty transactional id".to_string()));
    }
    if !ctx.permits(Operation::Describe, ResourceType::TransactionalId, id) {
        return Err((
            codes::TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            format!("{} may not describe transactional id {id}", ctx.principal),
        ));
    }
    match ctx.broker().txns().find(id).await {
        Ok(node) => ctx
            .endpoints()
            .into_iter()
            .find(|(n, _, _)| *n == node)
            .ok_or((
                group_codes::COORDINATOR_NOT_AVAILABLE,
                format!("coordinator broker {node} has no live Kafka listener"),
            )),
        Err(code) => Err((
            code,
            "the transaction coordinator is not available yet".to_string(),
        )),
    }
}

pub(super) async fn find_coordinator(
    ctx: Request,
    req: FindCoordinatorRequest,
) -> FindCoordinatorResponse {
    let keys: Vec<String> = if ctx.version >= 4 {
        req.coordinator_keys.iter().map(|k| k.to_string()).collect()
    } else {
        vec![req.key.to_string()]
    };
    let mut found = Vec::with_capacity(keys.len());
    for key in keys {
        let answer = if req.key_type == 1 {
            find_txn_coordinator(&ctx, &key).await
        } else if req.key_type != 0 {
            Err((
                codes::INVALID_REQUEST,
                format!("unknown coordinator key type {}", req.key_type),
            ))
        } else if let Some(why) = invalid_group_id(&key) {
            Err((INVALID_GROUP_ID, why))
        } else if !ctx.may_group(Operation::Describe, &key) {
            Err((
                codes::GROUP_AUTHORIZATION_FAILED,
                format!("{} may not describe group {key}", ctx.principal),
            ))
        } else {
            match ctx.broker().groups().find(&key).await {
                Ok(node) => ctx
                    .endpoints()
                    .into_iter()
                    .find(|(id, _, _)| *id == node)
                    .ok_or((
                        group_codes::COORDINATOR_NOT_AVAILABLE,
                        format!("coordinator broker {node} has no live Kafka listener"),
                    )),
                Err(code) => Err((code, "the coordinator is not available yet".to_string())),
            }
        };
        let c = match answer {
            Ok((id, host, port)) => FoundCoordinator::default()
                .with_key(s(key))
                .with_node_id(BrokerId(id))
                .with_host(s(host))
                .with_port(i32::from(port)),
            Err((code, message)) => FoundCoordinator::default()
                .with_key(s(key))
                .with_node_id(BrokerId(-1))
                .with_host(s(""))
                .with_port(-1)
                .with_error_code(code)
                .with_error_message(Some(s(message))),
        };
        found.push(c);
    }
    if ctx.version >= 4 {
        return FindCoordinatorResponse::default().with_coordinators(found);
    }
    let c = found.pop().unwrap_or_default();
    FindCoordinatorResponse::default()
        .with_error_code(c.error_code)
        .with_error_message(c.error_message)
        .with_node_id(c.node_id)
        .with_host(c.host)
        .with_port(c.port)
}

pub(super) async fn join(ctx: Request, req: JoinGroupRequest) -> JoinGroupResponse {
    let failed = |code: i16, member: &StrBytes| {
        JoinGroupResponse::default()
            .with_error_code(code)
            .with_generation_id(-1)
            .with_member_id(member.clone())
            .with_leader(s(""))
    };
    let group = req.group_id.0.to_string();
    let c = match coordinator(&ctx, &group, Operation::Read) {
        Ok(c) => c,
        Err(code) => return failed(code, &req.member_id),
    };
    if req.protocols.is_empty() || req.protocol_type.is_empty() {
        return failed(group_codes::INCONSISTENT_GROUP_PROTOCOL, &req.member_id);
    }
    let join = Join {
        member_id: req.member_id.to_string(),
        instance_id: req.group_instance_id.as_ref().map(|i| i.to_string()),
        client_id: ctx.client_id.clone(),
        client_host: format!("/{}", ctx.peer.ip()),
        protocol_type: req.protocol_type.to_string(),
        protocols: req
            .protocols
            .iter()
            .map(|p| (p.name.to_string(), p.metadata.clone()))
            .collect(),
        session_timeout_ms: i64::from(req.session_timeout_ms),
        // v0 has no rebalance timeout: Kafka uses the session timeout.
        rebalance_timeout_ms: i64::from(if ctx.version == 0 {
            req.session_timeout_ms
        } else {
            req.rebalance_timeout_ms
        }),
        require_known_member_id: ctx.version >= 4,
    };
    // what a classic member of a consumer-protocol group may be given: the topics its
    // subscription names (KIP-848 groups take classic members, Kafka 4.0)
    let names: Vec<String> = join
        .protocols
        .first()
        .and_then(|(_, md)| strata_client::groups::subscription_topics(md))
        .map(|t| t.into_iter().collect())
        .unwrap_or_default();
    let topics = assignable_topics(&ctx, Some(&names));
    let config = consumer_group_config(&ctx, &group);
    let r = c.join_with(&group, join, &topics, config).await;
    JoinGroupResponse::default()
        .with_throttle_time_ms(r.throttle_ms.clamp(0, i64::from(i32::MAX)) as i32)
        .with_error_code(r.error)
        .with_generation_id(r.generation)
        .with_protocol_type(Some(req.protocol_type.clone()))
        .with_protocol_name(r.protocol_name.map(s))
        .with_leader(s(r.leader))
        .with_member_id(s(r.member_id))
        .with_members(
            r.members
                .into_iter()
                .map(|m| {
                    JoinGroupResponseMember::default()
                        .with_member_id(s(m.member_id))
                        .with_group_instance_id(m.instance_id.map(s))
                        .with_metadata(m.metadata)
                })
                .collect(),
        )
}

pub(super) async fn sync(ctx: Request, req: SyncGroupRequest) -> SyncGroupResponse {
    let group = req.group_id.0.to_string();
    let c = match coordinator(&ctx, &group, Operation::Read) {
        Ok(c) => c,
        Err(code) => return SyncGroupResponse::default().with_error_code(code),
    };
    let instance = req.group_instance_id.as_ref().map(|i| i.as_str());
    if c.fenced(&group, &req.member_id, instance) {
        return SyncGroupResponse::default().with_error_code(group_codes::FENCED_INSTANCE_ID);
    }
    let assignments = req
        .assignments
        .into_iter()
        .map(|a| (a.member_id.to_string(), a.assignment))
        .collect();
    let r = c
        .sync(&group, &req.member_id, req.generation_id, assignments)
        .await;
    SyncGroupResponse::default()
        .with_error_code(r.error)
        .with_protocol_type(req.protocol_type)
        .with_protocol_name(r.protocol_name.map(s))
        .with_assignment(r.assignment)
}

pub(super) fn heartbeat(ctx: &Request, req: HeartbeatRequest) -> HeartbeatResponse {
    let group = req.group_id.0.to_string();
    let instance = req.group_instance_id.as_ref().map(|i| i.as_str());
    let code = match coordinator(ctx, &group, Operation::Read) {
        Ok(c) if c.fenced(&group, &req.member_id, instance) => group_codes::FENCED_INSTANCE_ID,
        Ok(c) => c.heartbeat(&group, &req.member_id, req.generation_id),
        Err(code) => code,
    };
    HeartbeatResponse::default().with_error_code(code)
}

/// The consumer protocol's configs of `group` (KIP-848 group configs, else their defaults)
/// and this broker's group size limit.
fn consumer_group_config(ctx: &Request, group: &str) -> ConsumerGroupConfig {
    crate::group::native::consumer_group_config(ctx.broker(), group)
}

/// What a member may be given: the topics it may describe (internal ones only when
/// `names` names them).
fn assignable_topics(ctx: &Request, names: Option<&[String]>) -> Topics {
    ctx.broker()
        .topics()
        .into_iter()
        .filter(|t| ctx.may_topic(Operation::Describe, &t.spec.name))
        .filter(|t| {
            !is_internal(&t.spec.name) || names.iter().copied().flatten().any(|n| *n == t.spec.name)
        })
        .map(|t| (t.spec.name.clone(), (t.spec.id, t.spec.partitions)))
        .collect()
}

/// ConsumerGroupHeartbeat (KIP-848): the coordinator assigns partitions itself; see
/// `crate::group::consumer`. Needs Read on the group, and Describe on every topic named.
pub(super) async fn consumer_group_heartbeat(
    ctx: Request,
    req: ConsumerGroupHeartbeatRequest,
) -> ConsumerGroupHeartbeatResponse {
    let ctx = &ctx;
    let failed = |code: i16, message: String| {
        ConsumerGroupHeartbeatResponse::default()
            .with_error_code(code)
            .with_error_message(Some(s(message)))
            .with_member_id(Some(req.member_id.clone()))
            .with_member_epoch(req.member_epoch)
    };
    let group = req.group_id.0.to_string();
    let c = match coordinator(ctx, &group, Operation::Read) {
        Ok(c) => c,
        Err(code) => return failed(code, format!("cannot coordinate group '{group}' here")),
    };
    let names: Option<Vec<String>> = req
        .subscribed_topic_names
        .as_ref()
        .map(|n| n.iter().map(|t| t.0.to_string()).collect());
    if let Some(denied) = names
        .iter()
        .flatten()
        .find(|t| !ctx.may_topic(Operation::Describe, t))
    {
        return failed(
            codes::TOPIC_AUTHORIZATION_FAILED,
            format!("{} may not describe topic {denied}", ctx.principal),
        );
    }
    let topics = assignable_topics(ctx, names.as_deref());
    let member_id = if req.member_id.is_empty() && req.member_epoch == 0 && ctx.version == 0 {
        // v0: the coordinator names new members (v1: the client does, KIP-1082)
        uuid::Uuid::new_v4().to_string()
    } else {
        req.member_id.to_string()
    };
    let hb = Heartbeat {
        member_id,
        member_epoch: req.member_epoch,
        instance_id: req.instance_id.as_ref().map(|i| i.to_string()),
        rack_id: req.rack_id.as_ref().map(|r| r.to_string()),
        rebalance_timeout_ms: req.rebalance_timeout_ms,
        subscribed_topic_names: names,
        subscribed_topic_regex: req.subscribed_topic_regex.as_ref().map(|r| r.to_string()),
        server_assignor: req.server_assignor.as_ref().map(|a| a.to_string()),
        owned: req.topic_partitions.as_ref().map(|tps| {
            tps.iter()
                .map(|tp| (tp.topic_id, tp.partitions.iter().copied().collect()))
                .collect()
        }),
    };
    let client = ConsumerClient {
        id: ctx.client_id.clone(),
        host: format!("/{}", ctx.peer.ip()),
    };
    let config = consumer_group_config(ctx, &group);
    let r = c
        .consumer_heartbeat(&group, hb, &client, &topics, config)
        .await;
    ConsumerGroupHeartbeatResponse::default()
        .with_error_code(r.error)
        .with_error_message(r.message.map(s))
        .with_member_id(Some(s(r.member_id)))
        .with_member_epoch(r.member_epoch)
        .with_heartbeat_interval_ms(r.heartbeat_interval_ms)
        .with_assignment(r.assignment.map(|a| {
            Assignment::default().with_topic_partitions(
                a.into_iter()
                    .map(|(topic, ps)| {
                        HeartbeatTopicPartitions::default()
                            .with_topic_id(topic)
                            .with_partitions(ps.into_iter().collect())
                    })
                    .collect(),
            )
        }))
}

pub(super) fn leave(ctx: &Request, req: LeaveGroupRequest) -> LeaveGroupResponse {
    let group = req.group_id.0.to_string();
    let c = match coordinator(ctx, &group, Operation::Read) {
        Ok(c) => c,
        Err(code) => return LeaveGroupResponse::default().with_error_code(code),
    };
    if ctx.version < 3 {
        return LeaveGroupResponse::default().with_error_code(c.leave(
            &group,
            &req.member_id,
            None,
        ));
    }
    let members = req
        .members
        .iter()
        .map(|m| {
            let code = c.leave(
                &group,
                &m.member_id,
                m.group_instance_id.as_ref().map(|i| i.as_str()),
            );
            MemberResponse::default()
                .with_member_id(m.member_id.clone())
                .with_group_instance_id(m.group_instance_id.clone())
                .with_error_code(code)
        })
        .collect();
    LeaveGroupResponse::default().with_members(members)
}

pub(super) async fn offset_commit(ctx: Request, req: OffsetCommitRequest) -> OffsetCommitResponse {
    let group = req.group_id.0.to_string();
    let (commits, refused) = checked_commits(
        &ctx,
        req.topics.iter().flat_map(|t| {
            t.partitions.iter().map(|p| Commit {
                topic: t.name.0.to_string(),
                partition: p.partition_index,
                offset: p.committed_offset,
                leader_epoch: p.committed_leader_epoch,
                metadata: p
                    .committed_metadata
                    .as_ref()
                    .map(|m| m.to_string())
                    .unwrap_or_default(),
            })
        }),
    );
    let code = match refused {
        Some(code) => code,
        None => match coordinator(&ctx, &group, Operation::Read) {
            Ok(c)
                if c.fenced(
                    &group,
                    &req.member_id,
                    req.group_instance_id.as_ref().map(|i| i.as_str()),
                ) =>
            {
                group_codes::FENCED_INSTANCE_ID
            }
            Ok(c) => {
                let generation = req.generation_id_or_member_epoch;
                c.commit(&group, &req.member_id, generation, commits).await
            }
            Err(code) => code,
        },
    };
    OffsetCommitResponse::default().with_topics(
        req.topics
            .iter()
            .map(|t| {
                OffsetCommitResponseTopic::default()
                    .with_name(t.name.clone())
                    .with_partitions(
                        t.partitions
                            .iter()
                            .map(|p| {
                                OffsetCommitResponsePartition::default()
                                    .with_partition_index(p.partition_index)
                                    .with_error_code(code)
                            })
                            .collect(),
                    )
            })
            .collect(),
    )
}

/// The commits of an OffsetCommit or TxnOffsetCommit, and the first problem found before
/// anything is written: any of them refuses the whole commit, so a commit is never
/// half-applied.
fn checked_commits(
    ctx: &Request,
    commits: impl Iterator<Item = Commit>,
) -> (Vec<Commit>, Option<i16>) {
    let broker = ctx.broker();
    let mut refused: Option<i16> = None;
    let commits: Vec<Commit> = commits.collect();
    for c in &commits {
        let in_range = broker
            .topic(&c.topic)
            .is_some_and(|k| c.partition >= 0 && (c.partition as u32) < k.spec.partitions);
        if !ctx.may_topic(Operation::Read, &c.topic) {
            refused.get_or_insert(codes::TOPIC_AUTHORIZATION_FAILED);
        } else if !in_range {
            refused.get_or_insert(codes::UNKNOWN_TOPIC_OR_PARTITION);
        } else if c.metadata.len() > MAX_METADATA_BYTES {
            refused.get_or_insert(OFFSET_METADATA_TOO_LARGE);
        }
    }
    (commits, refused)
}

/// TxnOffsetCommit (v0-3): offsets committed in a transaction, held by the group's
/// coordinator until the transaction's marker (see docs/transactions.md).
pub(super) async fn txn_offset_commit(
    ctx: Request,
    req: TxnOffsetCommitRequest,
) -> TxnOffsetCommitResponse {
    use strata_controller::metadata::acl::ResourceType;
    let group = req.group_id.0.to_string();
    let (commits, refused) = checked_commits(
        &ctx,
        req.topics.iter().flat_map(|t| {
            t.partitions.iter().map(|p| Commit {
                topic: t.name.0.to_string(),
                partition: p.partition_index,
                offset: p.committed_offset,
                leader_epoch: p.committed_leader_epoch,
                metadata: p
                    .committed_metadata
                    .as_ref()
                    .map(|m| m.to_string())
                    .unwrap_or_default(),
            })
        }),
    );
    let id = req.transactional_id.to_string();
    let code = if !ctx.permits(Operation::Write, ResourceType::TransactionalId, &id) {
        codes::TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    } else if let Some(code) = refused {
        code
    } else {
        match coordinator(&ctx, &group, Operation::Read) {
            Ok(c) => {
                let producer = (req.producer_id.0, req.producer_epoch);
                let member = req.member_id.to_string();
                c.txn_commit(&group, producer, &member, req.generation_id, commits)
                    .await
            }
            Err(code) => code,
        }
    };
    TxnOffsetCommitResponse::default().with_topics(
        req.topics
            .iter()
            .map(|t| {
                TxnOffsetCommitResponseTopic::default()
                    .with_name(t.name.clone())
                    .with_partitions(
                        t.partitions
                            .iter()
                            .map(|p| {
                                TxnOffsetCommitResponsePartition::default()
                                    .with_partition_index(p.partition_index)
                                    .with_error_code(code)
                            })
                            .collect(),
                    )
            })
            .collect(),
    )
}

/// One group's committed offsets for OffsetFetch: the partitions asked for (`None`: every
/// partition with a commit), as (topic, [(partition, offset, leader epoch, metadata,
/// error)]).
type FetchedTopic = (String, Vec<(i32, i64, i32, Option<String>, i16)>);

/// Kafka's UNSTABLE_OFFSET_COMMIT: an offset of the partition is pending in an open
/// transaction (KIP-447); a read_committed consumer asks with `require_stable` and retries.
const UNSTABLE_OFFSET_COMMIT: i16 = 88;

/// Topics the principal may not Describe are left out of "every partition", and answered
/// TOPIC_AUTHORIZATION_FAILED when named, as Kafka does: their offsets and names stay hidden.
fn fetch_group(
    c: &Coordinator,
    group: &str,
    asked: Option<Vec<(String, Vec<i32>)>>,
    require_stable: bool,
    visible: impl Fn(&str) -> bool,
) -> Vec<FetchedTopic> {
    let asked = asked.unwrap_or_else(|| {
        let mut by_topic: Vec<(String, Vec<i32>)> = Vec::new();
        for (topic, partition) in c.committed(group).into_keys() {
            if !visible(&topic) {
                continue;
            }
            match by_topic.last_mut() {
                Some((t, ps)) if *t == topic => ps.push(partition),
                _ => by_topic.push((topic, vec![partition])),
            }
        }
        by_topic
    });
    asked
        .into_iter()
        .map(|(topic, partitions)| {
            if !visible(&topic) {
                let refused = partitions
                    .iter()
                    .map(|p| (*p, -1, -1, None, codes::TOPIC_AUTHORIZATION_FAILED))
                    .collect();
                return (topic, refused);
            }
            let keys: Vec<(String, i32)> = partitions.iter().map(|p| (topic.clone(), *p)).collect();
            let found = c.fetch(group, &keys);
            let rows = partitions
                .iter()
                .zip(found)
                .map(|(p, f)| match f {
                    _ if require_stable && c.unstable(group, &topic, *p) => {
                        (*p, -1, -1, None, UNSTABLE_OFFSET_COMMIT)
                    }
                    Some(o) => (*p, o.offset, o.leader_epoch, Some(o.metadata), codes::NONE),
                    None => (*p, -1, -1, Some(String::new()), codes::NONE),
                })
                .collect();
            (topic, rows)
        })
        .collect()
}

pub(super) async fn offset_fetch(ctx: Request, req: OffsetFetchRequest) -> OffsetFetchResponse {
    if ctx.version >= 8 {
        let groups = req
            .groups
            .into_iter()
            .map(|g| {
                let id = g.group_id.0.to_string();
                let asked = g.topics.map(|ts| {
                    ts.into_iter()
                        .map(|t| (t.name.0.to_string(), t.partition_indexes))
                        .collect()
                });
                match coordinator(&ctx, &id, Operation::Describe) {
                    Ok(c) => OffsetFetchResponseGroup::default()
                        .with_group_id(g.group_id)
                        .with_topics(build_topics(
                            fetch_group(&c, &id, asked, req.require_stable, |t| {
                                ctx.may_topic(Operation::Describe, t)
                            }),
                            |name, parts| {
                                OffsetFetchResponseTopics::default()
                                    .with_name(name)
                                    .with_partitions(parts)
                            },
                            |p, o, e, m, err| {
                                OffsetFetchResponsePartitions::default()
                                    .with_partition_index(p)
                                    .with_committed_offset(o)
                                    .with_committed_leader_epoch(e)
                                    .with_metadata(m)
                                    .with_error_code(err)
                            },
                        )),
                    Err(code) => OffsetFetchResponseGroup::default()
                        .with_group_id(g.group_id)
                        .with_error_code(code),
                }
            })
            .collect();
        return OffsetFetchResponse::default().with_groups(groups);
    }
    let id = req.group_id.0.to_string();
    let c = match coordinator(&ctx, &id, Operation::Describe) {
        Ok(c) => c,
        Err(code) => {
            // v1 has no top-level error: the code goes on every partition asked for.
            return OffsetFetchResponse::default()
                .with_error_code(code)
                .with_topics(
                    req.topics
                        .unwrap_or_default()
                        .into_iter()
                        .map(|t| {
                            OffsetFetchResponseTopic::default()
                                .with_name(t.name)
                                .with_partitions(
                                    t.partition_indexes
                                        .into_iter()
                                        .map(|p| {
                                            OffsetFetchResponsePartition::default()
                                                .with_partition_index(p)
                                                .with_committed_offset(-1)
                                                .with_error_code(code)
                                        })
                                        .collect(),
                                )
                        })
                        .collect(),
                );
        }
    };
    let asked = req.topics.map(|ts| {
        ts.into_iter()
            .map(|t| (t.name.0.to_string(), t.partition_indexes))
            .collect()
    });
    OffsetFetchResponse::default().with_topics(build_topics(
        fetch_group(
            &c,
            &id,
            asked,
            ctx.version >= 7 && req.require_stable,
            |t| ctx.may_topic(Operation::Describe, t),
        ),
        |name, parts| {
            OffsetFetchResponseTopic::default()
                .with_name(name)
                .with_partitions(parts)
        },
        |p, o, e, m, err| {
            OffsetFetchResponsePartition::default()
                .with_partition_index(p)
                .with_committed_offset(o)
                .with_committed_leader_epoch(e)
                .with_metadata(m)
                .with_error_code(err)
        },
    ))
}

/// OffsetFetch answers in either layout (v8's per group, or v1-7's): one topic and one
/// partition constructor, the rows from [`fetch_group`].
fn build_topics<T, P>(
    fetched: Vec<FetchedTopic>,
    topic: impl Fn(TopicName, Vec<P>) -> T,
    partition: impl Fn(i32, i64, i32, Option<StrBytes>, i16) -> P,
) -> Vec<T> {
    fetched
        .into_iter()
        .map(|(name, rows)| {
            let parts = rows
                .into_iter()
                .map(|(p, o, e, m, err)| partition(p, o, e, m.map(s), err))
                .collect();
            topic(TopicName(s(name)), parts)
        })
        .collect()
}

pub(super) fn list_groups(ctx: &Request, req: ListGroupsRequest) -> ListGroupsResponse {
    let wanted: Vec<String> = req
        .states_filter
        .iter()
        .map(|s| s.to_ascii_lowercase())
        .collect();
    // v5 (KIP-848): "classic" or "consumer" (the protocol its members speak)
    let types: Vec<String> = req
        .types_filter
        .iter()
        .map(|t| t.to_ascii_lowercase())
        .collect();
    let mut groups = Vec::new();
    for c in ctx.broker().groups().coordinators() {
        // id -> (protocol type, state, group type)
        let mut found: BTreeMap<String, (String, String, &str)> = c
            .list()
            .into_iter()
            .map(|(id, t, state)| (id, (t, state.name().to_string(), "classic")))
            .collect();
        for (id, state) in c.list_consumer_groups() {
            found.insert(id, ("consumer".into(), state.to_string(), "consumer"));
        }
        for (id, (protocol_type, state, group_type)) in found {
            if !wanted.is_empty() && !wanted.contains(&state.to_ascii_lowercase()) {
                continue;
            }
            if !types.is_empty() && !types.iter().any(|t| t == group_type) {
                continue;
            }
            if !ctx.permits(Operation::Describe, ResourceType::Group, &id) {
                continue; // as Kafka: a principal lists the groups it may describe
            }
            groups.push(
                ListedGroup::default()
                    .with_group_id(GroupId(s(id)))
                    .with_protocol_type(s(protocol_type))
                    .with_group_state(s(state))
                    .with_group_type(s(group_type)),
            );
        }
    }
    ListGroupsResponse::default().with_groups(groups)
}

/// ConsumerGroupDescribe (KIP-848): the consumer-protocol groups, with each member's
/// subscription, current and target assignment. A classic or unknown group is
/// GROUP_ID_NOT_FOUND (clients then ask DescribeGroups, as with Kafka).
pub(super) fn consumer_group_describe(
    ctx: &Request,
    req: ConsumerGroupDescribeRequest,
) -> ConsumerGroupDescribeResponse {
    use kafka_protocol::messages::consumer_group_describe_response as cgd;
    let names: BTreeMap<uuid::Uuid, String> = ctx
        .broker()
        .topics()
        .into_iter()
        .map(|t| (t.spec.id, t.spec.name.clone()))
        .collect();
    let assignment = |a: &crate::group::consumer::Assignment| {
        cgd::Assignment::default().with_topic_partitions(
            a.iter()
                .map(|(id, ps)| {
                    cgd::TopicPartitions::default()
                        .with_topic_id(*id)
                        .with_topic_name(TopicName(s(names.get(id).map_or("", String::as_str))))
                        .with_partitions(ps.iter().copied().collect())
                })
                .collect(),
        )
    };
    let groups = req
        .group_ids
        .into_iter()
        .map(|id| {
            let name = id.0.to_string();
            let failed = |code: i16, message: String| {
                cgd::DescribedGroup::default()
                    .with_group_id(id.clone())
                    .with_error_code(code)
                    .with_error_message(Some(s(message)))
            };
            let c = match coordinator(ctx, &name, Operation::Describe) {
                Ok(c) => c,
                Err(code) => return failed(code, format!("cannot describe group '{name}' here")),
            };
            let Some(view) = c.describe_consumer_group(&name) else {
                return failed(
                    GROUP_ID_NOT_FOUND,
                    format!("group {name} is not a consumer-protocol group with members"),
                );
            };
            cgd::DescribedGroup::default()
                .with_group_id(id.clone())
                .with_group_state(s(view.state))
                .with_group_epoch(view.epoch)
                .with_assignment_epoch(view.assignment_epoch)
                .with_assignor_name(s(view.assignor))
                .with_authorized_operations(if req.include_authorized_operations {
                    ctx.authorized_operations(ResourceType::Group, &name, &GROUP_OPERATIONS)
                } else {
                    i32::MIN
                })
                .with_members(
                    view.members
                        .iter()
                        .map(|(m, target)| {
                            cgd::Member::default()
                                .with_member_id(s(&m.id))
                                .with_instance_id(m.instance_id.as_deref().map(s))
                                .with_rack_id(m.rack_id.as_deref().map(s))
                                .with_member_epoch(m.epoch)
                                .with_client_id(s(&m.client_id))
                                .with_client_host(s(&m.client_host))
                                .with_subscribed_topic_names(
                                    m.topic_names.iter().map(|t| TopicName(s(t))).collect(),
                                )
                                .with_subscribed_topic_regex(m.regex.as_deref().map(s))
                                .with_assignment(assignment(&m.assigned))
                                .with_target_assignment(assignment(target))
                                .with_member_type(1) // KIP-1099: the consumer protocol
                        })
                        .collect(),
                )
        })
        .collect();
    ConsumerGroupDescribeResponse::default().with_groups(groups)
}

/// KIP-430: the operations a group's authorized operations are computed over.
const GROUP_OPERATIONS: [Operation; 5] = [
    Operation::Read,
    Operation::Describe,
    Operation::Delete,
    Operation::DescribeConfigs,
    Operation::AlterConfigs,
];

pub(super) fn describe_groups(ctx: &Request, req: DescribeGroupsRequest) -> DescribeGroupsResponse {
    let with_operations = req.include_authorized_operations;
    let groups = req
        .groups
        .into_iter()
        .map(|id| {
            let name = id.0.to_string();
            let c = match coordinator(ctx, &name, Operation::Describe) {
                Ok(c) => c,
                Err(code) => {
                    return DescribedGroup::default()
                        .with_group_id(id)
                        .with_error_code(code)
                }
            };
            if c.describe_consumer_group(&name).is_some() {
                // Kafka 4.0: not a classic group (ConsumerGroupDescribe describes it)
                return DescribedGroup::default()
                    .with_group_id(id)
                    .with_error_code(GROUP_ID_NOT_FOUND);
            }
            let Some(view) = c.describe(&name) else {
                // Kafka describes an unknown group as Dead with no members.
                return DescribedGroup::default()
                    .with_group_id(id)
                    .with_group_state(s(GroupState::Dead.name()));
            };
            DescribedGroup::default()
                .with_group_id(id)
                .with_group_state(s(view.state.name()))
                .with_protocol_type(s(view.protocol_type))
                .with_protocol_data(s(view.protocol))
                .with_authorized_operations(if with_operations {
                    ctx.authorized_operations(ResourceType::Group, &name, &GROUP_OPERATIONS)
                } else {
                    i32::MIN
                })
                .with_members(
                    view.members
                        .into_iter()
                        .map(|m| {
                            DescribedGroupMember::default()
                                .with_member_id(s(m.member_id))
                                .with_group_instance_id(m.instance_id.map(s))
                                .with_client_id(s(m.client_id))
                                .with_client_host(s(m.client_host))
                                .with_member_metadata(m.metadata)
                                .with_member_assignment(m.assignment)
                        })
                        .collect(),
                )
        })
        .collect();
    DescribeGroupsResponse::default().with_groups(groups)
}

pub(super) async fn delete_groups(ctx: Request, req: DeleteGroupsRequest) -> DeleteGroupsResponse {
    let mut results = Vec::with_capacity(req.groups_names.len());
    for id in req.groups_names {
        let name = id.0.to_string();
        let code = match coordinator(&ctx, &name, Operation::Delete) {
            Ok(c) => c.delete(&name).await,
            Err(code) if code == INVALID_GROUP_ID => GROUP_ID_NOT_FOUND,
            Err(code) => code,
        };
        results.push(
            DeletableGroupResult::default()
                .with_group_id(id)
                .with_error_code(code),
        );
    }
    DeleteGroupsResponse::default().with_results(results)
}

/// OffsetDelete (KIP-496): Delete on the group, and Read on each topic whose offsets go
/// (TOPIC_AUTHORIZATION_FAILED for the partitions of a topic it may not read, which stay).
pub(super) async fn offset_delete(ctx: Request, req: OffsetDeleteRequest) -> OffsetDeleteResponse {
    let group = req.group_id.0.to_string();
    let refused = |code| OffsetDeleteResponse::default().with_error_code(code);
    let c = match coordinator(&ctx, &group, Operation::Delete) {
        Ok(c) => c,
        Err(code) if code == INVALID_GROUP_ID => return refused(GROUP_ID_NOT_FOUND),
        Err(code) => return refused(code),
    };
    let mut allowed = Vec::new();
    let mut answers: Vec<(String, Vec<(i32, i16)>)> = Vec::with_capacity(req.topics.len());
    for t in &req.topics {
        let name = t.name.0.to_string();
        let readable = ctx.may_topic(Operation::Read, &name);
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for p in &t.partitions {
            if readable {
                allowed.push((name.clone(), p.partition_index));
            }
            partitions.push((p.partition_index, codes::TOPIC_AUTHORIZATION_FAILED));
        }
        answers.push((name, partitions));
    }
    let results = match c.delete_offsets(&group, allowed).await {
        Ok(r) => r,
        Err(code) => return refused(code),
    };
    for ((topic, partition), code) in results {
        if let Some((_, partitions)) = answers.iter_mut().find(|(t, _)| *t == topic) {
            if let Some(slot) = partitions.iter_mut().find(|(p, _)| *p == partition) {
                slot.1 = code;
            }
        }
    }
    OffsetDeleteResponse::default().with_topics(
        answers
            .into_iter()
            .map(|(name, partitions)| {
                OffsetDeleteResponseTopic::default()
                    .with_name(s(name).into())
                    .with_partitions(
                        partitions
                            .into_iter()
                            .map(|(partition, code)| {
                                OffsetDeleteResponsePartition::default()
                                    .with_partition_index(partition)
                                    .with_error_code(code)
                            })
                            .collect(),
                    )
            })
            .collect(),
    )
}
