//! ElectLeaders (API 43): preferred-leader election (each partition's first replica leads
//! again, if it is alive and in the ISR) and unclean election (a partition without a leader
//! takes any live replica), as `kafka-leader-election.sh` and AdminClient's
//! `electLeaders` ask for them. Decided by the controllers; answered once this broker's
//! metadata shows the new leaders.

use kafka_protocol::messages::elect_leaders_response::{PartitionResult, ReplicaElectionResult};
use kafka_protocol::messages::{ElectLeadersRequest, ElectLeadersResponse, TopicName};
use kafka_protocol::ResponseError as E;
use strata_controller::metadata::acl::{Operation, ResourceType, CLUSTER_NAME};

use super::{codes, s, Request};

/// Kafka's election types.
const PREFERRED: i8 = 0;
const UNCLEAN: i8 = 1;

pub(super) async fn elect_leaders(ctx: Request, req: ElectLeadersRequest) -> ElectLeadersResponse {
    let asked: Option<Vec<(String, u32)>> = req.topic_partitions.as_ref().map(|topics| {
        topics
            .iter()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .map(move |p| (t.topic.0.to_string(), *p))
            })
            .filter_map(|(t, p)| u32::try_from(p).ok().map(|p| (t, p)))
            .collect()
    });
    // Every partition answered with one code (authorization, a bad election type).
    let all_fail = |code: i16, message: String| {
        let results = req
            .topic_partitions
            .iter()
            .flatten()
            .map(|t| {
                ReplicaElectionResult::default()
                    .with_topic(t.topic.clone())
                    .with_partition_result(
                        t.partitions
                            .iter()
                            .map(|p| {
                                PartitionResult::default()
                                    .with_partition_id(*p)
                                    .with_error_code(code)
                                    .with_error_message(Some(s(message.clone())))
                            })
                            .collect(),
                    )
            })
            .collect();
        ElectLeadersResponse::default()
            .with_error_code(if ctx.version >= 1 { code } else { codes::NONE })
            .with_replica_election_results(results)
    };
    if !ctx.permits(Operation::Alter, ResourceType::Cluster, CLUSTER_NAME) {
        return all_fail(
            codes::CLUSTER_AUTHORIZATION_FAILED,
            format!("{} may not alter the cluster", ctx.principal),
        );
    }
    let unclean = match req.election_type {
        PREFERRED => false,
        UNCLEAN => true,
        other => {
            return all_fail(
                codes::INVALID_REQUEST,
                format!("election type {other} is neither preferred (0) nor unclean (1)"),
            )
        }
    };
    let results = match ctx.broker().elect_leaders(unclean, asked).await {
        Ok(results) => results,
        Err(e) => {
            tracing::warn!(error = %e.message(), "leader elections failed");
            return all_fail(
                E::NotController.code(),
                format!(
                    "the controllers could not run the elections (retry): {}",
                    e.message()
                ),
            );
        }
    };
    let mut by_topic: Vec<ReplicaElectionResult> = Vec::new();
    for (topic, partition, code, message) in results {
        let result = PartitionResult::default()
            .with_partition_id(partition as i32)
            .with_error_code(code)
            .with_error_message((code != codes::NONE).then(|| s(message)));
        match by_topic.iter_mut().find(|t| t.topic.0.as_str() == topic) {
            Some(t) => t.partition_result.push(result),
            None => by_topic.push(
                ReplicaElectionResult::default()
                    .with_topic(TopicName(s(topic)))
                    .with_partition_result(vec![result]),
            ),
        }
    }
    ElectLeadersResponse::default().with_replica_election_results(by_topic)
}
