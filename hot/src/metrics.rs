//! Prometheus metrics of one broker: request counters and latency histograms recorded on the
//! request paths (atomics only, nothing blocks), and partition gauges computed from the
//! broker's state when `/metrics` is scraped.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::broker::Broker;

/// Upper bounds of the latency buckets, in seconds.
const BOUNDS: [f64; 18] = [
    0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.05, 0.1, 0.25,
    0.5, 1.0, 2.5, 5.0,
];

/// A cumulative latency histogram in Prometheus' shape.
#[derive(Default)]
pub struct Histogram {
    buckets: [AtomicU64; BOUNDS.len()],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        for (i, b) in BOUNDS.iter().enumerate() {
            if secs <= *b {
                self.buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (i, b) in BOUNDS.iter().enumerate() {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{b}\"}} {}",
                self.buckets[i].load(Ordering::Relaxed)
            );
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "{name}_sum {}",
            self.sum_us.load(Ordering::Relaxed) as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count {count}");
    }
}

/// Counters and histograms the request paths update.
#[derive(Default)]
pub struct Metrics {
    pub produce_requests: AtomicU64,
    pub produce_errors: AtomicU64,
    pub produced_records: AtomicU64,
    pub produced_bytes: AtomicU64,
    pub fetch_requests: AtomicU64,
    pub fetched_bytes: AtomicU64,
    /// Record bytes sent to followers.
    pub replicated_bytes: AtomicU64,
    pub isr_shrinks: AtomicU64,
    pub isr_expands: AtomicU64,
    /// Cold tier: bytes and segments uploaded and committed, failed uploads, and the bytes
    /// of sealed local segments of tiered topics not in the cold tier yet.
    pub tiered_bytes: AtomicU64,
    pub tiered_segments: AtomicU64,
    pub tier_upload_errors: AtomicU64,
    pub under_tiered_bytes: AtomicU64,
    /// Remote segments deleted by retention.ms / retention.bytes.
    pub remote_segments_deleted: AtomicU64,
    /// Cold-tier objects no manifest named, deleted after the grace period.
    pub orphans_deleted: AtomicU64,
    /// Produce request received -> response ready (includes the acks=all wait).
    pub produce_latency: Histogram,
    /// An acks=all append until the high watermark passed it (replication and fsyncs).
    pub commit_latency: Histogram,
    pub fetch_latency: Histogram,
    /// Idempotent producer ids remembered across this broker's replicas (at the last
    /// retention check), and those forgotten for silence (KIP-854).
    pub producer_ids: AtomicU64,
    pub producer_ids_expired: AtomicU64,
    /// Connections and request memory of the Kafka listeners.
    pub listener: std::sync::Arc<crate::kafka::limits::ListenerStats>,
    /// Throttles given for client quotas.
    pub quotas: std::sync::Arc<crate::kafka::quota::QuotaStats>,
    /// Connections of the gRPC data plane.
    pub grpc: std::sync::Arc<strata_controller::incoming::ConnectionStats>,
}

fn counter(out: &mut String, name: &str, help: &str, v: &AtomicU64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
        v.load(Ordering::Relaxed)
    );
}

fn gauge(out: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
}

/// The metrics of a controller: its view of the quorum, and on the active controller (the
/// Raft leader) the cluster-wide partition gauges, so that summing across nodes counts
/// them once.
pub fn render_controller(out: &mut String, c: &strata_controller::Controller) {
    let s = c.raft_status();
    let active = s.leader == Some(s.node_id);
    gauge(
        out,
        "strata_controller_active",
        "1 on the active controller (the metadata quorum's Raft leader), 0 on the others.",
        u64::from(active),
    );
    gauge(
        out,
        "strata_controller_raft_term",
        "The Raft term this controller is in.",
        s.term,
    );
    gauge(
        out,
        "strata_controller_raft_last_log_index",
        "Index of the last metadata log entry this controller holds.",
        s.last_log_index,
    );
    gauge(
        out,
        "strata_controller_raft_applied_index",
        "Index of the last metadata log entry this controller has applied.",
        s.last_applied,
    );
    gauge(
        out,
        "strata_controller_raft_voters",
        "Voters in the metadata quorum.",
        s.voters as u64,
    );
    let _ = writeln!(
        out,
        "# HELP strata_controller_quorum_contact_age_seconds Since this controller last heard from a quorum (as leader) or its leader (as follower); NaN: never.\n# TYPE strata_controller_quorum_contact_age_seconds gauge\nstrata_controller_quorum_contact_age_seconds {}",
        s.quorum_contact_age.map_or(f64::NAN, |a| a.as_secs_f64())
    );
    if !active {
        return;
    }
    let m = c.metadata().borrow().clone();
    let partitions: Vec<_> = m.topics.values().flat_map(|t| &t.partitions).collect();
    gauge(
        out,
        "strata_offline_partitions",
        "Partitions of the cluster with no leader (reported by the active controller only).",
        partitions.iter().filter(|p| p.leader.is_none()).count() as u64,
    );
    gauge(
        out,
        "strata_cluster_under_replicated_partitions",
        "Partitions of the cluster whose ISR is smaller than their replica set (reported by the active controller only).",
        partitions
            .iter()
            .filter(|p| p.isr.len() < p.replicas.len())
            .count() as u64,
    );
    gauge(
        out,
        "strata_cluster_brokers",
        "Brokers registered with the controllers (reported by the active controller only).",
        m.brokers.len() as u64,
    );
    gauge(
        out,
        "strata_cluster_fenced_brokers",
        "Registered brokers fenced for missing their lease (reported by the active controller only).",
        m.brokers.values().filter(|b| b.fenced).count() as u64,
    );
}

impl Metrics {
    /// The Prometheus text exposition of this broker.
    pub fn render(&self, broker: &Broker) -> String {
        let mut out = String::new();
        counter(
            &mut out,
            "strata_produce_requests_total",
            "Partition produce requests received.",
            &self.produce_requests,
        );
        counter(
            &mut out,
            "strata_produce_errors_total",
            "Partition produce requests answered with an error.",
            &self.produce_errors,
        );
        counter(
            &mut out,
            "strata_produced_records_total",
            "Records appended by this broker as leader.",
            &self.produced_records,
        );
        counter(
            &mut out,
            "strata_produced_bytes_total",
            "Batch bytes appended by this broker as leader.",
            &self.produced_bytes,
        );
        counter(
            &mut out,
            "strata_fetch_requests_total",
            "Fetch requests served.",
            &self.fetch_requests,
        );
        counter(
            &mut out,
            "strata_fetched_bytes_total",
            "Record bytes returned by fetches.",
            &self.fetched_bytes,
        );
        self.produce_latency.render(
            &mut out,
            "strata_produce_latency_seconds",
            "Produce request to response, acks wait included.",
        );
        self.commit_latency.render(
            &mut out,
            "strata_commit_latency_seconds",
            "acks=all append until committed (fsynced on every in-sync replica).",
        );
        self.fetch_latency.render(
            &mut out,
            "strata_fetch_latency_seconds",
            "Fetch request to response, long-poll wait included.",
        );
        gauge(
            &mut out,
            "strata_producer_ids",
            "Idempotent producer ids remembered, summed over this broker's replicas (at the last retention check).",
            self.producer_ids.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "strata_producer_ids_expired_total",
            "Producer ids forgotten after producer_id_expiration without a batch (KIP-854).",
            &self.producer_ids_expired,
        );
        let q = &self.quotas;
        let quotas = [
            "producer_byte_rate",
            "consumer_byte_rate",
            "request_percentage",
        ];
        let _ = writeln!(
            out,
            "# HELP strata_quota_throttled_total Kafka responses that carried a throttle time, by client quota.\n\
             # TYPE strata_quota_throttled_total counter"
        );
        for (i, name) in quotas.iter().enumerate() {
            let v = q.throttled[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "strata_quota_throttled_total{{quota=\"{name}\"}} {v}");
        }
        let _ = writeln!(
            out,
            "# HELP strata_quota_throttle_seconds_total Throttle time given to Kafka clients, by client quota.\n\
             # TYPE strata_quota_throttle_seconds_total counter"
        );
        for (i, name) in quotas.iter().enumerate() {
            let v = q.throttle_ms[i].load(Ordering::Relaxed) as f64 / 1000.0;
            let _ = writeln!(
                out,
                "strata_quota_throttle_seconds_total{{quota=\"{name}\"}} {v}"
            );
        }
        let l = &self.listener;
        gauge(
            &mut out,
            "strata_kafka_connections",
            "Open Kafka client connections, all listeners (kafka.max_connections).",
            l.connections.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "strata_kafka_connections_refused_total",
            "Connections closed at accept: their address held kafka.max_connections_per_ip.",
            &l.refused_per_ip,
        );
        counter(
            &mut out,
            "strata_kafka_accept_paused_total",
            "Times accepting paused because kafka.max_connections were open.",
            &l.accept_paused,
        );
        let g = &self.grpc;
        gauge(
            &mut out,
            "strata_grpc_connections",
            "Open connections of the gRPC data plane (grpc.max_connections).",
            g.open.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "strata_grpc_accept_paused_total",
            "Times the gRPC port paused accepting because grpc.max_connections were open.",
            &g.accept_paused,
        );
        counter(
            &mut out,
            "strata_grpc_idle_closed_total",
            "gRPC connections closed for sending nothing for grpc.idle_timeout.",
            &g.idle_closed,
        );
        gauge(
            &mut out,
            "strata_kafka_request_memory_bytes",
            "Request bytes read and not yet answered (kafka.queued_max_request_bytes).",
            l.request_memory.load(Ordering::Relaxed),
        );
        gauge(
            &mut out,
            "strata_open_fds",
            "Open file descriptors of the process, counted every second.",
            l.open_fds.load(Ordering::Relaxed),
        );
        gauge(
            &mut out,
            "strata_fd_limit",
            "The process's file descriptor limit (RLIMIT_NOFILE, raised to its maximum at start).",
            l.fd_limit.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "strata_kafka_request_memory_waits_total",
            "Reads that paused because kafka.queued_max_request_bytes was in use.",
            &l.request_memory_waits,
        );

        let node = broker.config().node_id;
        let (mut local, mut leading, mut offline, mut under_replicated) = (0, 0, 0, 0);
        let mut partitions = String::new();
        let mut replicas = String::new();
        let mut under_min_isr = 0;
        for t in broker.topics() {
            for (i, layout) in t.layout.iter().enumerate() {
                if layout.leader.is_none() {
                    offline += 1;
                }
                let Some(p) = t.partitions.get(i).and_then(|p| p.as_ref()) else {
                    continue;
                };
                local += 1;
                if layout.leader != Some(node) {
                    continue;
                }
                leading += 1;
                if layout.isr.len() < layout.replicas.len() {
                    under_replicated += 1;
                }
                let pr = p.progress();
                let labels = format!("topic=\"{}\",partition=\"{i}\"", t.spec.name);
                let _ = writeln!(
                    partitions,
                    "strata_partition_high_watermark{{{labels}}} {}",
                    pr.high_watermark
                );
                let _ = writeln!(
                    partitions,
                    "strata_partition_log_end_offset{{{labels}}} {}",
                    pr.log_end
                );
                let _ = writeln!(
                    partitions,
                    "strata_partition_log_start_offset{{{labels}}} {}",
                    pr.log_start
                );
                if pr.under_min_isr {
                    under_min_isr += 1;
                }
                if let Some((_, _, followers)) = p.leader_view(broker.now_ms()) {
                    for f in followers {
                        let _ = writeln!(
                            replicas,
                            "strata_replica_lag_records{{{labels},replica=\"{}\"}} {}\nstrata_replica_lag_seconds{{{labels},replica=\"{}\"}} {:.3}\nstrata_replica_in_sync{{{labels},replica=\"{}\"}} {}",
                            f.id,
                            f.lag_records,
                            f.id,
                            f.lag_ms.max(0) as f64 / 1000.0,
                            f.id,
                            u8::from(f.in_sync),
                        );
                    }
                }
            }
        }
        gauge(
            &mut out,
            "strata_local_partitions",
            "Partition replicas held by this broker.",
            local,
        );
        gauge(
            &mut out,
            "strata_leader_partitions",
            "Partitions this broker leads.",
            leading,
        );
        if broker.cluster().is_none() {
            // In a cluster the active controller reports it, once for the cluster.
            gauge(
                &mut out,
                "strata_offline_partitions",
                "Partitions of the cluster with no leader.",
                offline,
            );
        }
        gauge(
            &mut out,
            "strata_under_replicated_partitions",
            "Partitions this broker leads whose ISR is smaller than their replica set.",
            under_replicated,
        );
        gauge(
            &mut out,
            "strata_partitions_stuck_opening",
            "Replicas whose log has been opening (recovering) longer than replica_open_timeout: unavailable here (alert on > 0).",
            broker.stuck_opening() as u64,
        );
        gauge(
            &mut out,
            "strata_under_min_isr_partitions",
            "Partitions this broker leads whose ISR is below min.insync.replicas (acks=all refused).",
            under_min_isr,
        );
        counter(
            &mut out,
            "strata_isr_shrinks_total",
            "ISR shrinks this broker proposed and the controllers committed.",
            &self.isr_shrinks,
        );
        counter(
            &mut out,
            "strata_isr_expands_total",
            "ISR expansions this broker proposed and the controllers committed.",
            &self.isr_expands,
        );
        counter(
            &mut out,
            "strata_replicated_bytes_total",
            "Record bytes sent to followers.",
            &self.replicated_bytes,
        );
        counter(
            &mut out,
            "strata_tiered_bytes_total",
            "Segment bytes uploaded to the cold tier and committed in its manifests.",
            &self.tiered_bytes,
        );
        counter(
            &mut out,
            "strata_tiered_segments_total",
            "Segments uploaded to the cold tier and committed.",
            &self.tiered_segments,
        );
        counter(
            &mut out,
            "strata_tier_upload_errors_total",
            "Failed uploads and manifest claims (retried; local data is kept).",
            &self.tier_upload_errors,
        );
        counter(
            &mut out,
            "strata_remote_segments_deleted_total",
            "Remote segments deleted by retention.ms / retention.bytes.",
            &self.remote_segments_deleted,
        );
        counter(
            &mut out,
            "strata_cold_orphans_deleted_total",
            "Cold-tier objects no manifest named (killed or deposed uploads), deleted after the grace period.",
            &self.orphans_deleted,
        );
        gauge(
            &mut out,
            "strata_under_tiered_bytes",
            "Bytes of sealed local segments of tiered topics not yet in the cold tier.",
            self.under_tiered_bytes.load(Ordering::Relaxed),
        );
        let _ = writeln!(out, "# HELP strata_replica_lag_records Records a follower is behind this leader's log end.\n# TYPE strata_replica_lag_records gauge");
        let _ = writeln!(out, "# HELP strata_replica_lag_seconds Time since a follower was last caught up.\n# TYPE strata_replica_lag_seconds gauge");
        let _ = writeln!(out, "# HELP strata_replica_in_sync 1 when the follower is in the committed ISR.\n# TYPE strata_replica_in_sync gauge");
        out.push_str(&replicas);
        let _ = writeln!(out, "# HELP strata_partition_high_watermark Offsets below it are durable and visible.\n# TYPE strata_partition_high_watermark gauge");
        let _ = writeln!(out, "# TYPE strata_partition_log_end_offset gauge\n# TYPE strata_partition_log_start_offset gauge");
        out.push_str(&partitions);
        render_groups(&mut out, broker);
        if let Some(cold) = broker.cold() {
            let s = &cold.reader.stats;
            counter(
                &mut out,
                "strata_cold_read_bytes_total",
                "Bytes read from the cold tier (ranged GETs).",
                &s.bytes_fetched,
            );
            counter(
                &mut out,
                "strata_cold_cache_hits_total",
                "Cold chunks served from the cache's memory.",
                &s.hits,
            );
            counter(
                &mut out,
                "strata_cold_cache_disk_hits_total",
                "Cold chunks served from the cache's local disk.",
                &s.disk_hits,
            );
            counter(
                &mut out,
                "strata_cold_cache_misses_total",
                "Cold chunks fetched from the object store.",
                &s.misses,
            );
            counter(
                &mut out,
                "strata_cold_reads_throttled_total",
                "Cold GETs that waited for the cold-read budget.",
                &s.throttled,
            );
            gauge(
                &mut out,
                "strata_cold_reads_in_flight",
                "Cold GETs running now.",
                s.in_flight.load(Ordering::Relaxed),
            );
        }
        out
    }
}

/// A Prometheus label value: backslash, quote and newline escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The groups this broker coordinates: members, committed offsets, and the lag behind the
/// high watermark of each partition this broker holds a replica of.
/// Groups whose series /metrics carries (the first by name); the rest are counted only, so
/// that clients creating groups cannot grow every scrape without bound.
pub const MAX_GROUPS_IN_METRICS: usize = 1000;

fn render_groups(out: &mut String, broker: &Broker) {
    let mut members = String::new();
    let mut committed = String::new();
    let mut lag = String::new();
    let mut groups: Vec<(
        String,
        std::sync::Arc<crate::group::coordinator::Coordinator>,
    )> = broker
        .groups()
        .coordinators()
        .into_iter()
        .flat_map(|c| {
            c.list()
                .into_iter()
                .map(move |(group, _, _)| (group, c.clone()))
        })
        .collect();
    groups.sort_by(|a, b| a.0.cmp(&b.0));
    let total = groups.len();
    groups.truncate(MAX_GROUPS_IN_METRICS);
    gauge(
        out,
        "strata_groups",
        "Consumer groups this broker coordinates.",
        total as u64,
    );
    gauge(
        out,
        "strata_groups_not_in_metrics",
        "Groups coordinated here whose series are left out (past the first 1000 by name).",
        total.saturating_sub(MAX_GROUPS_IN_METRICS) as u64,
    );
    for (group, c) in groups {
        let g = label(&group);
        if let Some(view) = c.describe(&group) {
            let _ = writeln!(
                members,
                "strata_group_members{{group=\"{g}\",state=\"{}\"}} {}",
                view.state.name(),
                view.members.len()
            );
        }
        for ((topic, partition), o) in c.committed(&group) {
            let labels = format!(
                "group=\"{g}\",topic=\"{}\",partition=\"{partition}\"",
                label(&topic)
            );
            let _ = writeln!(
                committed,
                "strata_group_committed_offset{{{labels}}} {}",
                o.offset
            );
            let local = broker.topic(&topic).and_then(|t| {
                usize::try_from(partition)
                    .ok()
                    .and_then(|i| t.partitions.get(i).cloned().flatten())
            });
            if let Some(p) = local {
                let hw = p.progress().high_watermark as i64;
                let _ = writeln!(
                    lag,
                    "strata_group_lag_records{{{labels}}} {}",
                    (hw - o.offset).max(0)
                );
            }
        }
    }
    let _ = writeln!(out, "# HELP strata_group_members Members of each group this broker coordinates, by state.\n# TYPE strata_group_members gauge");
    out.push_str(&members);
    let _ = writeln!(out, "# HELP strata_group_committed_offset Committed offset of each group partition this broker coordinates.\n# TYPE strata_group_committed_offset gauge");
    out.push_str(&committed);
    let _ = writeln!(out, "# HELP strata_group_lag_records High watermark minus committed offset, for partitions with a replica on this broker.\n# TYPE strata_group_lag_records gauge");
    out.push_str(&lag);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(
            label(
                r#"a"b\c
d"#
            ),
            r#"a\"b\\c\nd"#
        );
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(300));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(10));
        let mut out = String::new();
        h.render(&mut out, "x", "test");
        assert!(out.contains("x_bucket{le=\"0.0005\"} 1\n"));
        assert!(out.contains("x_bucket{le=\"0.005\"} 2\n"));
        assert!(out.contains("x_bucket{le=\"5\"} 2\n"));
        assert!(out.contains("x_bucket{le=\"+Inf\"} 3\n"));
        assert!(out.contains("x_count 3\n"));
    }
}
