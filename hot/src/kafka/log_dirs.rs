//! DescribeLogDirs (API 35): the broker's log directory and the replicas in it, as
//! `kafka-log-dirs.sh --describe` and AdminClient's `describeLogDirs` show them. Strata
//! keeps every replica in one directory (`<data_dir>/logs`).

use kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kafka_protocol::messages::{DescribeLogDirsRequest, DescribeLogDirsResponse, TopicName};
use strata_controller::metadata::acl::{Operation, ResourceType, CLUSTER_NAME};

use super::{codes, s, Request};

pub(super) fn describe_log_dirs(
    ctx: &Request,
    req: DescribeLogDirsRequest,
) -> DescribeLogDirsResponse {
    if !ctx.permits(Operation::Describe, ResourceType::Cluster, CLUSTER_NAME) {
        // As Kafka: v3+ says why; older versions just list nothing.
        return DescribeLogDirsResponse::default().with_error_code(if ctx.version >= 3 {
            codes::CLUSTER_AUTHORIZATION_FAILED
        } else {
            codes::NONE
        });
    }
    let broker = ctx.broker();
    let dir = broker.config().data_dir.join("logs");
    // null: every replica; otherwise the partitions named (those not here are left out).
    let wanted = req.topics.map(|topics| {
        topics
            .into_iter()
            .map(|t| (t.topic.0.to_string(), t.partitions))
            .collect::<std::collections::HashMap<_, _>>()
    });
    let mut topics = Vec::new();
    for topic in broker.topics() {
        let name = &topic.spec.name;
        let asked = match &wanted {
            None => None,
            Some(w) => match w.get(name.as_str()) {
                Some(parts) => Some(parts),
                None => continue,
            },
        };
        let partitions: Vec<_> = topic
            .local()
            .filter(|p| asked.is_none_or(|parts| parts.contains(&p.index)))
            .map(|p| {
                let progress = p.progress();
                DescribeLogDirsPartition::default()
                        .with_partition_index(p.index)
                        .with_partition_size(p.size_bytes() as i64)
                        // (Kafka: how far the replica's log end is behind the high watermark.)
                        .with_offset_lag(
                            progress.high_watermark.saturating_sub(progress.log_end) as i64
                        )
                        .with_is_future_key(false)
            })
            .collect();
        if !partitions.is_empty() {
            topics.push(
                DescribeLogDirsTopic::default()
                    .with_name(TopicName(s(name.clone())))
                    .with_partitions(partitions),
            );
        }
    }
    let (total, usable) = match rustix::fs::statvfs(&dir) {
        Ok(st) => (
            (st.f_blocks.saturating_mul(st.f_frsize)) as i64,
            (st.f_bavail.saturating_mul(st.f_frsize)) as i64,
        ),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "could not read the log directory's file system size");
            (-1, -1)
        }
    };
    DescribeLogDirsResponse::default().with_results(vec![DescribeLogDirsResult::default()
        .with_error_code(codes::NONE)
        .with_log_dir(s(dir.display().to_string()))
        .with_topics(topics)
        .with_total_bytes(total)
        .with_usable_bytes(usable)])
}
