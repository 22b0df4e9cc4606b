//! AlterPartitionReassignments (API 45) and ListPartitionReassignments (API 46), as
//! `kafka-reassign-partitions.sh` and AdminClient's `alterPartitionReassignments` /
//! `listPartitionReassignments` use them. The controllers decide each move (see
//! `strata_controller::metadata::Reassignment`); the lists come from this broker's
//! metadata. Altering needs Alter on the cluster, listing Describe, as in Kafka.

use kafka_protocol::messages::alter_partition_reassignments_response::{
    ReassignablePartitionResponse, ReassignableTopicResponse,
};
use kafka_protocol::messages::list_partition_reassignments_response::{
    OngoingPartitionReassignment, OngoingTopicReassignment,
};
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse,
    ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse, TopicName,
};
use kafka_protocol::ResponseError as E;
use strata_controller::metadata::acl::{Operation, ResourceType, CLUSTER_NAME};

use super::{codes, s, Request};

pub(super) async fn alter(
    ctx: Request,
    req: AlterPartitionReassignmentsRequest,
) -> AlterPartitionReassignmentsResponse {
    let resp = AlterPartitionReassignmentsResponse::default()
        .with_allow_replication_factor_change(req.allow_replication_factor_change);
    if !ctx.permits(Operation::Alter, ResourceType::Cluster, CLUSTER_NAME) {
        return resp
            .with_error_code(codes::CLUSTER_AUTHORIZATION_FAILED)
            .with_error_message(Some(s(format!(
                "{} may not alter the cluster",
                ctx.principal
            ))));
    }
    // v1 (KIP-860): a move that changes a partition's replica count only when allowed.
    let check_count = ctx.version >= 1 && !req.allow_replication_factor_change;
    let broker = ctx.broker().clone();
    let mut refused: Vec<(String, u32, i16, String)> = Vec::new();
    let mut moves = Vec::new();
    for t in &req.topics {
        let name = t.name.0.to_string();
        for p in &t.partitions {
            let Ok(index) = u32::try_from(p.partition_index) else {
                refused.push((
                    name.clone(),
                    0,
                    codes::UNKNOWN_TOPIC_OR_PARTITION,
                    format!("partition {} does not exist", p.partition_index),
                ));
                continue;
            };
            if let (true, Some(target)) = (check_count, &p.replicas) {
                let current = broker
                    .topic(&name)
                    .and_then(|t| t.layout.get(index as usize).cloned());
                if let Some(l) = current {
                    let original = l.replicas.len() - l.adding.len();
                    if target.len() != original {
                        refused.push((
                            name.clone(),
                            index,
                            E::InvalidReplicationFactor.code(),
                            format!(
                                "{name}-{index} has {original} replicas; moving it to {} needs allow_replication_factor_change",
                                target.len()
                            ),
                        ));
                        continue;
                    }
                }
            }
            moves.push(strata_proto::v1::PartitionMove {
                topic: name.clone(),
                partition: index,
                replicas: p.replicas.iter().flatten().map(|b| b.0).collect(),
                cancel: p.replicas.is_none(),
                throttle_bytes_per_second: 0,
            });
        }
    }
    let mut results = if moves.is_empty() {
        Vec::new()
    } else {
        match broker.reassign_partitions(moves).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e.message(), "partition reassignment failed");
                return resp
                    .with_error_code(E::NotController.code())
                    .with_error_message(Some(s(format!(
                        "the controllers could not take the reassignment (retry): {}",
                        e.message()
                    ))));
            }
        }
    };
    results.extend(refused);
    let mut by_topic: Vec<ReassignableTopicResponse> = Vec::new();
    for (topic, partition, code, message) in results {
        let r = ReassignablePartitionResponse::default()
            .with_partition_index(partition as i32)
            .with_error_code(code)
            .with_error_message((code != codes::NONE).then(|| s(message)));
        match by_topic.iter_mut().find(|t| t.name.0.as_str() == topic) {
            Some(t) => t.partitions.push(r),
            None => by_topic.push(
                ReassignableTopicResponse::default()
                    .with_name(TopicName(s(topic)))
                    .with_partitions(vec![r]),
            ),
        }
    }
    resp.with_responses(by_topic)
}

pub(super) fn list(
    ctx: &Request,
    req: ListPartitionReassignmentsRequest,
) -> ListPartitionReassignmentsResponse {
    if !ctx.permits(Operation::Describe, ResourceType::Cluster, CLUSTER_NAME) {
        return ListPartitionReassignmentsResponse::default()
            .with_error_code(codes::CLUSTER_AUTHORIZATION_FAILED)
            .with_error_message(Some(s(format!(
                "{} may not describe the cluster",
                ctx.principal
            ))));
    }
    let broker = ctx.broker();
    let wanted: Option<std::collections::HashMap<String, Vec<i32>>> = req.topics.map(|ts| {
        ts.into_iter()
            .map(|t| (t.name.0.to_string(), t.partition_indexes))
            .collect()
    });
    let mut topics = Vec::new();
    for t in broker.topics() {
        let asked = match &wanted {
            None => None,
            Some(w) => match w.get(&t.spec.name) {
                Some(parts) => Some(parts),
                None => continue,
            },
        };
        let partitions: Vec<OngoingPartitionReassignment> = t
            .layout
            .iter()
            .enumerate()
            .filter(|(i, l)| {
                (!l.adding.is_empty() || !l.removing.is_empty())
                    && asked.is_none_or(|a| a.contains(&(*i as i32)))
            })
            .map(|(i, l)| {
                OngoingPartitionReassignment::default()
                    .with_partition_index(i as i32)
                    .with_replicas(l.replicas.iter().map(|b| (*b).into()).collect())
                    .with_adding_replicas(l.adding.iter().map(|b| (*b).into()).collect())
                    .with_removing_replicas(l.removing.iter().map(|b| (*b).into()).collect())
            })
            .collect();
        if !partitions.is_empty() {
            topics.push(
                OngoingTopicReassignment::default()
                    .with_name(TopicName(s(t.spec.name.clone())))
                    .with_partitions(partitions),
            );
        }
    }
    ListPartitionReassignmentsResponse::default().with_topics(topics)
}
