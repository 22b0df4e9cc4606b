//! DeleteRecords (API 21): moves partitions' log start forward, as `kafka-delete-records.sh`
//! and AdminClient's `deleteRecords` do. Served by each partition's leader: it makes the new
//! start durable in its own log, then answers once every follower in the ISR has deleted the
//! records too (they learn the point from their fetches and say so in the next), so that no
//! replica that could lead next still serves them. The cold tier stops serving them at once
//! and drops its segments wholly below the point with its next retention round.

use std::time::Duration;

use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::{DeleteRecordsRequest, DeleteRecordsResponse};
use kafka_protocol::ResponseError as E;
use strata_controller::metadata::acl::Operation;

use super::{codes, Request};
use crate::broker::partition::DeleteRecordsError;
use crate::broker::Route;

/// The longest a DeleteRecords waits for its ISR (its `timeout_ms` is capped to this).
const MAX_WAIT: Duration = Duration::from_secs(60);

pub(super) async fn delete_records(
    ctx: Request,
    req: DeleteRecordsRequest,
) -> DeleteRecordsResponse {
    let broker = ctx.broker().clone();
    let timeout = Duration::from_millis(req.timeout_ms.max(0) as u64).min(MAX_WAIT);
    // First every partition's point, then one wait: the followers of all of them learn
    // their points from the same fetches.
    let mut topics = Vec::with_capacity(req.topics.len());
    let mut waits = Vec::new();
    for t in req.topics {
        let name = t.name.0.to_string();
        let allowed = ctx.may_topic(Operation::Delete, &name);
        let internal = crate::group::manager::is_internal(&name);
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for p in t.partitions {
            let result = DeleteRecordsPartitionResult::default()
                .with_partition_index(p.partition_index)
                .with_low_watermark(-1);
            let code = if !allowed {
                Some(codes::TOPIC_AUTHORIZATION_FAILED)
            } else if internal {
                // (Kafka: "Cannot delete records of internal topic".)
                Some(codes::INVALID_TOPIC)
            } else {
                None
            };
            if let Some(code) = code {
                partitions.push(result.with_error_code(code));
                continue;
            }
            let part = match broker.route(&name, p.partition_index) {
                Route::Leader(part) => part,
                other => {
                    let code = codes::route(&other).expect("not the leader route");
                    partitions.push(result.with_error_code(code));
                    continue;
                }
            };
            if !part
                .log_config()
                .cleanup_policy
                .split(',')
                .any(|c| c == "delete")
            {
                partitions.push(result.with_error_code(E::PolicyViolation.code()));
                continue;
            }
            let (offset, deleting) = (p.offset, part.clone());
            let done = tokio::task::spawn_blocking(move || deleting.delete_records(offset)).await;
            match done {
                Ok(Ok(point)) => {
                    waits.push((topics.len(), partitions.len(), part, point));
                    partitions.push(result);
                }
                Ok(Err(e)) => {
                    partitions.push(result.with_error_code(code_of(&e, &name, p.partition_index)))
                }
                Err(e) => {
                    tracing::error!(topic = %name, partition = p.partition_index, error = %e, "delete records task failed");
                    partitions.push(result.with_error_code(codes::UNKNOWN_SERVER_ERROR));
                }
            }
        }
        topics.push(
            DeleteRecordsTopicResult::default()
                .with_name(t.name)
                .with_partitions(partitions),
        );
    }
    let answers =
        futures_util::future::join_all(waits.into_iter().map(|(t, i, part, point)| async move {
            (t, i, part.deleted_on_isr(point, timeout).await)
        }))
        .await;
    for (t, i, answer) in answers {
        let name = topics[t].name.0.to_string();
        let result = &mut topics[t].partitions[i];
        match answer {
            Ok(low) => result.low_watermark = low as i64,
            Err(e) => result.error_code = code_of(&e, &name, result.partition_index),
        }
    }
    DeleteRecordsResponse::default().with_topics(topics)
}

fn code_of(e: &DeleteRecordsError, topic: &str, partition: i32) -> i16 {
    match e {
        DeleteRecordsError::NotLeader => codes::NOT_LEADER_OR_FOLLOWER,
        DeleteRecordsError::OutOfRange { .. } => codes::OFFSET_OUT_OF_RANGE,
        DeleteRecordsError::Timeout { .. } => E::RequestTimedOut.code(),
        DeleteRecordsError::Storage(err) => {
            tracing::error!(topic, partition, error = %err, "delete records failed");
            codes::KAFKA_STORAGE_ERROR
        }
    }
}
