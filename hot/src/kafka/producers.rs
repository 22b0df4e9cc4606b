//! DescribeProducers (API 61, KIP-664): the idempotent producers a partition's leader
//! remembers, as `kafka-transactions.sh describe-producers` and AdminClient's
//! `describeProducers` show them. Needs Read on the topic, as in Kafka.

use kafka_protocol::messages::describe_producers_response::{
    PartitionResponse, ProducerState, TopicResponse,
};
use kafka_protocol::messages::{DescribeProducersRequest, DescribeProducersResponse};
use strata_controller::metadata::acl::Operation;

use super::{codes, Request};
use crate::broker::Route;

pub(super) fn describe_producers(
    ctx: &Request,
    req: DescribeProducersRequest,
) -> DescribeProducersResponse {
    let broker = ctx.broker();
    let mut seen = std::collections::HashSet::new();
    let topics = req
        .topics
        .into_iter()
        .filter(|t| seen.insert(t.name.clone()))
        .map(|t| {
            let name = t.name.0.to_string();
            let may_read = ctx.may_topic(Operation::Read, &name);
            let mut asked = std::collections::HashSet::new();
            let partitions = t
                .partition_indexes
                .into_iter()
                .filter(|p| asked.insert(*p))
                .map(|index| {
                    let resp = PartitionResponse::default().with_partition_index(index);
                    if !may_read {
                        return resp.with_error_code(codes::TOPIC_AUTHORIZATION_FAILED);
                    }
                    let part = match broker.route(&name, index) {
                        Route::Leader(p) => p,
                        other => {
                            let code = codes::route(&other).expect("not the leader route");
                            return resp.with_error_code(code);
                        }
                    };
                    let active = part.lock().active_producers();
                    resp.with_active_producers(
                        active
                            .into_iter()
                            .map(|p| {
                                ProducerState::default()
                                    .with_producer_id(p.producer_id.into())
                                    .with_producer_epoch(p.epoch.into())
                                    .with_last_sequence(p.last_sequence)
                                    .with_last_timestamp(p.last_ms)
                                    // no transactions: no coordinator, no open transaction
                                    .with_coordinator_epoch(-1)
                                    .with_current_txn_start_offset(-1)
                            })
                            .collect(),
                    )
                })
                .collect();
            TopicResponse::default()
                .with_name(t.name)
                .with_partitions(partitions)
        })
        .collect();
    DescribeProducersResponse::default().with_topics(topics)
}
