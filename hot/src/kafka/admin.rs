//! Metadata, CreateTopics, DeleteTopics and CreatePartitions (the config APIs are in
//! `configs.rs`).

use std::collections::{BTreeMap, HashSet};
use strata_controller::metadata::acl::{Operation, ResourceType, CLUSTER_NAME};

use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult,
};
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{
    BrokerId, CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest,
    CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse, DescribeClusterRequest,
    DescribeClusterResponse, MetadataRequest, MetadataResponse, TopicName,
};
use uuid::Uuid;

use super::{codes, s, Request};
use crate::broker::{validate_topic_name, AdminError, NewTopic, Topic};

/// A topic's Metadata entry. `leader` maps the metadata's leader to the one to name: a
/// broker whose lease lapsed does not name itself.
fn topic_metadata(
    topic: &Topic,
    live: &dyn Fn(i32) -> bool,
    leader: &dyn Fn(Option<i32>) -> Option<i32>,
) -> MetadataResponseTopic {
    let ids = |v: &[i32]| v.iter().map(|b| BrokerId(*b)).collect::<Vec<_>>();
    MetadataResponseTopic::default()
        .with_name(Some(TopicName(s(topic.spec.name.clone()))))
        .with_topic_id(topic.spec.id)
        .with_is_internal(crate::group::manager::is_internal(&topic.spec.name))
        .with_partitions(
            topic
                .layout
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let offline: Vec<i32> =
                        p.replicas.iter().copied().filter(|r| !live(*r)).collect();
                    let named = leader(p.leader);
                    MetadataResponsePartition::default()
                        .with_partition_index(i as i32)
                        // An offline partition says so instead of vanishing.
                        .with_error_code(if named.is_some() {
                            codes::NONE
                        } else {
                            codes::LEADER_NOT_AVAILABLE
                        })
                        .with_leader_id(BrokerId(named.unwrap_or(-1)))
                        .with_leader_epoch(p.leader_epoch)
                        .with_replica_nodes(ids(&p.replicas))
                        .with_isr_nodes(ids(&p.isr))
                        .with_offline_replicas(ids(&offline))
                })
                .collect(),
        )
}

/// What KIP-430's authorized operations are computed over, per resource (as Kafka lists them).
pub(super) const TOPIC_OPERATIONS: [Operation; 8] = [
    Operation::Read,
    Operation::Write,
    Operation::Create,
    Operation::Delete,
    Operation::Alter,
    Operation::Describe,
    Operation::DescribeConfigs,
    Operation::AlterConfigs,
];
pub(super) const CLUSTER_OPERATIONS: [Operation; 7] = [
    Operation::Create,
    Operation::Alter,
    Operation::Describe,
    Operation::ClusterAction,
    Operation::DescribeConfigs,
    Operation::AlterConfigs,
    Operation::IdempotentWrite,
];
/// Kafka's "not asked for" value of an authorized-operations field.
pub(super) const OPERATIONS_NOT_ASKED: i32 = i32::MIN;

/// DescribeCluster (KIP-700): the brokers this listener's clients reach, the cluster id and
/// the broker to send admin requests to (this one: every broker forwards them), and with
/// KIP-430 what the principal may do to the cluster (0 without Describe on it, as Kafka).
pub(super) fn describe_cluster(
    ctx: &Request,
    req: DescribeClusterRequest,
) -> DescribeClusterResponse {
    const BROKERS: i8 = 1;
    if req.endpoint_type != BROKERS {
        return DescribeClusterResponse::default()
            .with_endpoint_type(req.endpoint_type)
            .with_error_code(114) // MISMATCHED_ENDPOINT_TYPE
            .with_error_message(Some(s(
                "this is a broker listener: ask it for brokers (endpoint type 1)",
            )))
            .with_cluster_authorized_operations(OPERATIONS_NOT_ASKED);
    }
    let broker = ctx.broker();
    let operations = if !req.include_cluster_authorized_operations {
        OPERATIONS_NOT_ASKED
    } else if ctx.permits(Operation::Describe, ResourceType::Cluster, CLUSTER_NAME) {
        ctx.authorized_operations(ResourceType::Cluster, CLUSTER_NAME, &CLUSTER_OPERATIONS)
    } else {
        0
    };
    DescribeClusterResponse::default()
        .with_endpoint_type(BROKERS)
        .with_cluster_id(s(broker.cluster_id()))
        .with_controller_id(BrokerId(broker.config().node_id))
        .with_brokers(
            ctx.endpoints()
                .into_iter()
                .map(|(id, host, port)| {
                    DescribeClusterBroker::default()
                        .with_broker_id(BrokerId(id))
                        .with_host(s(host))
                        .with_port(i32::from(port))
                })
                .collect(),
        )
        .with_cluster_authorized_operations(operations)
}

pub(super) async fn metadata(ctx: Request, req: MetadataRequest) -> MetadataResponse {
    let with_topic_operations = req.include_topic_authorized_operations;
    let with_cluster_operations = req.include_cluster_authorized_operations;
    let mut resp = metadata_of(&ctx, req).await;
    // KIP-430 (Metadata v8+): what the principal may do to each topic it can see, and
    // (v8-v10) to the cluster
    for t in &mut resp.topics {
        t.topic_authorized_operations = match &t.name {
            Some(name) if with_topic_operations && t.error_code == codes::NONE => {
                ctx.authorized_operations(ResourceType::Topic, &name.0, &TOPIC_OPERATIONS)
            }
            _ => OPERATIONS_NOT_ASKED,
        };
    }
    resp.cluster_authorized_operations = if with_cluster_operations {
        ctx.authorized_operations(ResourceType::Cluster, CLUSTER_NAME, &CLUSTER_OPERATIONS)
    } else {
        OPERATIONS_NOT_ASKED
    };
    resp
}

async fn metadata_of(ctx: &Request, req: MetadataRequest) -> MetadataResponse {
    let broker = ctx.broker();
    let node = broker.config().node_id;
    let endpoints = ctx.endpoints();
    let live_ids: Vec<i32> = endpoints.iter().map(|(id, _, _)| *id).collect();
    let live = move |id: i32| live_ids.contains(&id);
    let leads = broker.holds_lease();
    let leader = move |l: Option<i32>| l.filter(|l| *l != node || leads);
    // Kafka clients use the controller id only for admin requests, which every broker
    // serves (forwarding to the controllers in cluster mode): name this broker.
    let mut resp = MetadataResponse::default()
        .with_brokers(
            endpoints
                .iter()
                .map(|(id, host, port)| {
                    MetadataResponseBroker::default()
                        .with_node_id(BrokerId(*id))
                        .with_host(s(host.clone()))
                        .with_port(i32::from(*port))
                })
                .collect(),
        )
        .with_cluster_id(Some(s(broker.cluster_id())))
        .with_controller_id(BrokerId(node));
    // v0: an empty list means all topics; v1+: null means all, empty means none.
    let requested = match req.topics {
        None => None,
        Some(t) if t.is_empty() && ctx.version == 0 => None,
        Some(t) => Some(t),
    };
    let Some(requested) = requested else {
        // Topics the principal may not Describe are left out, as Kafka does.
        resp.topics = broker
            .topics()
            .iter()
            .filter(|t| ctx.permits(Operation::Describe, ResourceType::Topic, &t.spec.name))
            .map(|t| topic_metadata(t, &live, &leader))
            .collect();
        return resp;
    };
    let auto_create = req.allow_auto_topic_creation && broker.config().auto_create_topics;
    // A topic named (or identified) twice is answered once, as Kafka does: repeats must not
    // multiply the response.
    let mut seen = std::collections::HashSet::new();
    for t in requested {
        if !seen.insert((t.name.clone(), t.topic_id)) {
            continue;
        }
        let by_id = (t.topic_id != Uuid::nil()).then(|| {
            broker
                .topics()
                .into_iter()
                .find(|x| x.spec.id == t.topic_id)
        });
        let name = t.name.map(|n| n.0.to_string());
        // A topic the principal may not Describe is answered alike whether it exists or
        // not, as Kafka does (issue 47: the difference told which settlement topics exist);
        // asked for by id, its name stays hidden.
        let hidden =
            MetadataResponseTopic::default().with_error_code(codes::TOPIC_AUTHORIZATION_FAILED);
        if by_id.is_none() {
            if let Some(n) = name
                .as_ref()
                .filter(|n| !ctx.may_topic(Operation::Describe, n))
            {
                resp.topics
                    .push(hidden.with_name(Some(TopicName(s(n.clone())))));
                continue;
            }
        }
        let found = match (&by_id, &name) {
            (Some(found), _) => found.clone(),
            (None, Some(n)) => broker.topic(n),
            (None, None) => None,
        };
        if let Some(topic) = found {
            if ctx.may_topic(Operation::Describe, &topic.spec.name) {
                resp.topics.push(topic_metadata(&topic, &live, &leader));
            } else {
                resp.topics.push(hidden.with_topic_id(t.topic_id));
            }
            continue;
        }
        let unknown = MetadataResponseTopic::default()
            .with_name(name.clone().map(|n| TopicName(s(n))))
            .with_topic_id(t.topic_id)
            .with_error_code(codes::UNKNOWN_TOPIC_OR_PARTITION);
        let Some(n) = name else {
            resp.topics.push(unknown);
            continue;
        };
        if validate_topic_name(&n).is_err() {
            resp.topics
                .push(unknown.with_error_code(codes::INVALID_TOPIC));
            continue;
        }
        if !auto_create {
            resp.topics.push(unknown);
            continue;
        }
        if !(ctx.permits(Operation::Create, ResourceType::Cluster, CLUSTER_NAME)
            || ctx.may_topic(Operation::Create, &n))
        {
            resp.topics
                .push(unknown.with_error_code(codes::TOPIC_AUTHORIZATION_FAILED));
            continue;
        }
        let created = broker
            .create_topic(
                NewTopic {
                    name: n.clone(),
                    ..NewTopic::default()
                },
                false,
            )
            .await;
        match created.ok().and_then(|_| broker.topic(&n)) {
            Some(topic) => resp.topics.push(topic_metadata(&topic, &live, &leader)),
            None => resp.topics.push(unknown),
        }
    }
    resp
}

pub(super) async fn create_topics(ctx: Request, req: CreateTopicsRequest) -> CreateTopicsResponse {
    let broker = ctx.broker().clone();
    let with_configs = ctx.version >= 5;
    let mut seen = HashSet::new();
    let duplicates: HashSet<String> = req
        .topics
        .iter()
        .filter(|t| !seen.insert(t.name.0.to_string()))
        .map(|t| t.name.0.to_string())
        .collect();
    let mut results = Vec::with_capacity(req.topics.len());
    for t in req.topics {
        let name = t.name.0.to_string();
        let result = CreatableTopicResult::default().with_name(t.name.clone());
        let fail = |code: i16, msg: String| {
            CreatableTopicResult::default()
                .with_name(t.name.clone())
                .with_error_code(code)
                .with_error_message(Some(s(msg)))
        };
        if duplicates.contains(&name) {
            results.push(fail(
                codes::INVALID_REQUEST,
                format!("topic '{name}' appears more than once in the request"),
            ));
            continue;
        }
        if !(ctx.permits(Operation::Create, ResourceType::Cluster, CLUSTER_NAME)
            || ctx.may_topic(Operation::Create, &name))
        {
            results.push(fail(
                codes::TOPIC_AUTHORIZATION_FAILED,
                format!("{} may not create topic {name}", ctx.principal),
            ));
            continue;
        }
        if crate::group::manager::is_internal(&name) {
            results.push(fail(
                codes::INVALID_REQUEST,
                format!("creation of internal topic {name} is prohibited; the broker creates it"),
            ));
            continue;
        }
        // A manual assignment sizes the topic itself: Kafka refuses one beside a partition
        // count or replication factor, and one that skips or repeats a partition.
        let mut assignments: Vec<(i32, Vec<i32>)> = t
            .assignments
            .iter()
            .map(|a| {
                (
                    a.partition_index,
                    a.broker_ids.iter().map(|b| b.0).collect(),
                )
            })
            .collect();
        assignments.sort_by_key(|(p, _)| *p);
        if !assignments.is_empty() {
            if t.num_partitions != -1 || t.replication_factor != -1 {
                results.push(fail(
                    codes::INVALID_REQUEST,
                    "a replica assignment cannot come with a partition count or replication \
                     factor (set both to -1)"
                        .into(),
                ));
                continue;
            }
            let numbered = assignments
                .iter()
                .enumerate()
                .all(|(i, (p, _))| *p == i as i32);
            let sized = assignments
                .iter()
                .all(|(_, r)| r.len() == assignments[0].1.len());
            if !numbered || !sized {
                results.push(fail(
                    codes::INVALID_REPLICA_ASSIGNMENT,
                    "a replica assignment names partitions 0, 1, ... once each, every one with \
                     as many replicas"
                        .into(),
                ));
                continue;
            }
        }
        let partitions = if !assignments.is_empty() {
            Some(assignments.len() as u32)
        } else if t.num_partitions == -1 {
            None
        } else if t.num_partitions <= 0 {
            results.push(fail(
                codes::admin(&AdminError::InvalidPartitions(String::new())).0,
                format!(
                    "partition count {} is invalid; it must be at least 1",
                    t.num_partitions
                ),
            ));
            continue;
        } else {
            Some(t.num_partitions as u32)
        };
        let replication_factor = match t.replication_factor {
            -1 if !assignments.is_empty() => Some(assignments[0].1.len() as u16),
            -1 => None,
            rf if rf <= 0 => {
                results.push(fail(
                    codes::admin(&AdminError::InvalidReplicationFactor(String::new())).0,
                    format!("replication factor {rf} is invalid; it must be at least 1"),
                ));
                continue;
            }
            rf => Some(rf as u16),
        };
        let configs: BTreeMap<String, String> = t
            .configs
            .iter()
            .filter_map(|c| {
                c.value
                    .as_ref()
                    .map(|v| (c.name.to_string(), v.to_string()))
            })
            .collect();
        let new = NewTopic {
            name: name.clone(),
            partitions,
            replication_factor,
            configs,
            assignments: assignments.into_iter().map(|(_, r)| r).collect(),
        };
        match broker.create_topic(new, req.validate_only).await {
            Ok(spec) => {
                let configs = broker
                    .describe_configs(&spec)
                    .into_iter()
                    .map(|(k, v, source)| {
                        CreatableTopicConfigs::default()
                            .with_name(s(k))
                            .with_value(Some(s(v)))
                            .with_config_source(super::configs::source_code(source))
                    })
                    .collect();
                results.push(
                    result
                        .with_topic_id(spec.id)
                        .with_num_partitions(spec.partitions as i32)
                        .with_replication_factor(spec.replication_factor as i16)
                        .with_configs(with_configs.then_some(configs)),
                );
            }
            Err(e) => {
                if matches!(e, AdminError::Io(_)) {
                    tracing::error!(topic = %name, error = %e, "topic creation failed");
                }
                let (code, msg) = codes::admin(&e);
                results.push(fail(code, msg));
            }
        }
    }
    CreateTopicsResponse::default().with_topics(results)
}

pub(super) async fn delete_topics(ctx: Request, req: DeleteTopicsRequest) -> DeleteTopicsResponse {
    let broker = ctx.broker().clone();
    tracing::info!(principal = %ctx.principal, peer = %ctx.peer, topics = req.topic_names.len() + req.topics.len(), "DeleteTopics");
    // v6 names topics in `topics` (by name or id); earlier versions in `topic_names`.
    let mut wanted: Vec<(Option<String>, Uuid)> = req
        .topic_names
        .iter()
        .map(|n| (Some(n.0.to_string()), Uuid::nil()))
        .collect();
    wanted.extend(
        req.topics
            .iter()
            .map(|t| (t.name.as_ref().map(|n| n.0.to_string()), t.topic_id)),
    );
    let mut responses = Vec::with_capacity(wanted.len());
    for (name, id) in wanted {
        let by_id = name.is_none();
        let name = name.or_else(|| {
            broker
                .topics()
                .iter()
                .find(|t| t.spec.id == id)
                .map(|t| t.spec.name.clone())
        });
        // named by id: the name of a topic the principal may not Describe stays hidden
        let hidden = by_id
            && name
                .as_ref()
                .is_some_and(|n| !ctx.may_topic(Operation::Describe, n));
        let result = DeletableTopicResult::default()
            .with_name(name.clone().filter(|_| !hidden).map(|n| TopicName(s(n))))
            .with_topic_id(id);
        let Some(name) = name else {
            responses.push(
                result
                    .with_error_code(kafka_protocol::ResponseError::UnknownTopicId.code())
                    .with_error_message(Some(s(format!("no topic has id {id}")))),
            );
            continue;
        };
        if hidden || !ctx.may_topic(Operation::Delete, &name) {
            let named = if hidden { id.to_string() } else { name };
            responses.push(
                result
                    .with_error_code(codes::TOPIC_AUTHORIZATION_FAILED)
                    .with_error_message(Some(s(format!(
                        "{} may not delete topic {named}",
                        ctx.principal
                    )))),
            );
            continue;
        }
        match broker.delete_topic(&name).await {
            Ok(()) => responses.push(result),
            Err(e) => {
                let (code, msg) = codes::admin(&e);
                responses.push(
                    result
                        .with_error_code(code)
                        .with_error_message(Some(s(msg))),
                );
            }
        }
    }
    DeleteTopicsResponse::default().with_responses(responses)
}

pub(super) async fn create_partitions(
    ctx: Request,
    req: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let broker = ctx.broker().clone();
    let mut results = Vec::with_capacity(req.topics.len());
    for t in req.topics {
        let name = t.name.0.to_string();
        let result = CreatePartitionsTopicResult::default().with_name(t.name.clone());
        if !ctx.may_topic(Operation::Alter, &name) {
            results.push(
                result
                    .with_error_code(codes::TOPIC_AUTHORIZATION_FAILED)
                    .with_error_message(Some(s(format!(
                        "{} may not alter topic {name}",
                        ctx.principal
                    )))),
            );
            continue;
        }
        let total = u32::try_from(t.count).unwrap_or(0);
        let assignments: Vec<Vec<i32>> = t
            .assignments
            .unwrap_or_default()
            .into_iter()
            .map(|a| a.broker_ids.into_iter().map(|b| b.0).collect())
            .collect();
        match broker
            .create_partitions(&name, total, &assignments, req.validate_only)
            .await
        {
            Ok(()) => results.push(result),
            Err(e) => {
                let (code, msg) = codes::admin(&e);
                results.push(
                    result
                        .with_error_code(code)
                        .with_error_message(Some(s(msg))),
                );
            }
        }
    }
    CreatePartitionsResponse::default().with_results(results)
}
