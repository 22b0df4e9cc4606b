//! Prometheus metrics of one process. The request paths update atomics (a histogram
//! observation is two atomic adds: its bucket and its sum); everything else is computed
//! from the broker's and controller's state at each scrape. The exposition is
//! prometheus-client's OpenMetrics text encoder: every family is written once, as one
//! block with its HELP and TYPE, whatever labels its samples carry.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::ApiKey;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeLabelSet, NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::broker::Broker;
use crate::health::Health;

/// Upper bounds of the latency buckets, in seconds (and +Inf).
const BOUNDS: [f64; 18] = [
    0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.05, 0.1, 0.25,
    0.5, 1.0, 2.5, 5.0,
];

/// A latency histogram: per-bucket counts (made cumulative when encoded) and the sum.
pub struct Histogram {
    buckets: [AtomicU64; BOUNDS.len() + 1],
    sum_us: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_us: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = BOUNDS.partition_point(|b| *b < secs);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    /// (sum in seconds, count, per-bucket counts by upper bound).
    fn snapshot(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let buckets: Vec<(f64, u64)> = BOUNDS
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(&self.buckets)
            .map(|(b, n)| (b, n.load(Ordering::Relaxed)))
            .collect();
        let count = buckets.iter().map(|(_, n)| n).sum();
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        (sum, count, buckets)
    }
}

/// Where acks=all writes spend their time, by stage (see `crate::replication::stages`).
/// Process-wide: every broker of the process adds to them (one per process in a cluster).
#[derive(Default)]
pub struct Stages {
    /// Leader: append until fsynced in the leader's log.
    pub leader_durable: Histogram,
    /// Leader: append until a follower's fetch offset passed it (one per follower).
    pub replica_ack: Histogram,
    /// Any replica: one fsync of a partition's log.
    pub fsync: Histogram,
    /// Follower: a fetch response with records received until the next fetch is sent
    /// (append, then fsync).
    pub follower_turnaround: Histogram,
}

/// Record bytes fetches sent from the segment files (`sendfile`), counted as the kernel
/// sends them (the connection's writer has no broker at hand; one broker per process).
pub static FETCHED_FROM_FILE: AtomicU64 = AtomicU64::new(0);

pub static STAGES: std::sync::LazyLock<Stages> = std::sync::LazyLock::new(Stages::default);

/// Kafka API keys are below this (the protocol has about 80).
const API_SLOTS: usize = 128;

/// Requests of each Kafka API: answered, failed (the connection was closed instead), and
/// the time from a request's arrival to its response being written.
pub struct KafkaApiStats {
    answered: [AtomicU64; API_SLOTS],
    failed: [AtomicU64; API_SLOTS],
    latency: Box<[Histogram; API_SLOTS]>,
}

impl Default for KafkaApiStats {
    fn default() -> Self {
        KafkaApiStats {
            answered: std::array::from_fn(|_| AtomicU64::new(0)),
            failed: std::array::from_fn(|_| AtomicU64::new(0)),
            latency: Box::new(std::array::from_fn(|_| Histogram::default())),
        }
    }
}

impl KafkaApiStats {
    fn slot(key: ApiKey) -> Option<usize> {
        usize::try_from(key as i16).ok().filter(|i| *i < API_SLOTS)
    }

    pub fn answered(&self, key: ApiKey, took: Duration) {
        if let Some(i) = Self::slot(key) {
            self.answered[i].fetch_add(1, Ordering::Relaxed);
            self.latency[i].observe(took);
        }
    }

    pub fn failed(&self, key: ApiKey) {
        if let Some(i) = Self::slot(key) {
            self.failed[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The APIs seen so far, by name.
    fn seen(&self) -> Vec<(String, usize)> {
        (0..API_SLOTS)
            .filter(|&i| {
                self.answered[i].load(Ordering::Relaxed) + self.failed[i].load(Ordering::Relaxed)
                    > 0
            })
            .filter_map(|i| {
                let key = ApiKey::try_from(i as i16).ok()?;
                Some((format!("{key:?}"), i))
            })
            .collect()
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
    /// Compaction of compacted topics' local logs: rounds swapped in, records and bytes
    /// they removed, rounds that failed.
    pub compactions: AtomicU64,
    pub compaction_records_removed: AtomicU64,
    pub compaction_bytes_removed: AtomicU64,
    pub compaction_errors: AtomicU64,
    /// Requests of each Kafka API, all listeners.
    pub kafka_apis: Arc<KafkaApiStats>,
    /// Connections and request memory of the Kafka listeners.
    pub listener: Arc<crate::kafka::limits::ListenerStats>,
    /// Throttles given for client quotas.
    pub quotas: Arc<crate::kafka::quota::QuotaStats>,
    /// Connections of the gRPC data plane.
    pub grpc: Arc<strata_controller::incoming::ConnectionStats>,
}

/// The label set of a family's only, unlabelled sample.
const NO_LABELS: [(&str, &str); 0] = [];

/// Writes families through prometheus-client's encoder. A counter is named with its
/// `_total` sample name (the family is the name without it, as OpenMetrics has it).
struct Out<'a>(DescriptorEncoder<'a>);

impl Out<'_> {
    fn counter<V: EncodeCounterValue>(&mut self, name: &str, help: &str, v: V) -> fmt::Result {
        self.counters(name, help, [(NO_LABELS, v)])
    }

    fn counters<L: EncodeLabelSet, V: EncodeCounterValue>(
        &mut self,
        name: &str,
        help: &str,
        rows: impl IntoIterator<Item = (L, V)>,
    ) -> fmt::Result {
        let name = name.strip_suffix("_total").unwrap_or(name);
        let mut rows = rows.into_iter().peekable();
        if rows.peek().is_none() {
            return Ok(());
        }
        let mut family = self
            .0
            .encode_descriptor(name, help, None, MetricType::Counter)?;
        for (labels, v) in rows {
            family
                .encode_family(&labels)?
                .encode_counter::<NoLabelSet, V, f64>(&v, None)?;
        }
        Ok(())
    }

    fn gauge<V: EncodeGaugeValue>(&mut self, name: &str, help: &str, v: V) -> fmt::Result {
        self.gauges(name, help, [(NO_LABELS, v)])
    }

    fn gauges<L: EncodeLabelSet, V: EncodeGaugeValue>(
        &mut self,
        name: &str,
        help: &str,
        rows: impl IntoIterator<Item = (L, V)>,
    ) -> fmt::Result {
        let mut rows = rows.into_iter().peekable();
        if rows.peek().is_none() {
            return Ok(());
        }
        let mut family = self
            .0
            .encode_descriptor(name, help, None, MetricType::Gauge)?;
        for (labels, v) in rows {
            family.encode_family(&labels)?.encode_gauge(&v)?;
        }
        Ok(())
    }

    fn histogram(&mut self, name: &str, help: &str, h: &Histogram) -> fmt::Result {
        self.histograms(name, help, [(NO_LABELS, h)])
    }

    fn histograms<'h, L: EncodeLabelSet>(
        &mut self,
        name: &str,
        help: &str,
        rows: impl IntoIterator<Item = (L, &'h Histogram)>,
    ) -> fmt::Result {
        let mut rows = rows.into_iter().peekable();
        if rows.peek().is_none() {
            return Ok(());
        }
        let mut family = self
            .0
            .encode_descriptor(name, help, None, MetricType::Histogram)?;
        for (labels, h) in rows {
            let (sum, count, buckets) = h.snapshot();
            family
                .encode_family(&labels)?
                .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
        }
        Ok(())
    }
}

/// The registry of one process: its own metrics, and those of each role once it is up.
pub fn registry(health: Arc<Health>) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(ProcessCollector));
    registry.register_collector(Box::new(RolesCollector(health)));
    registry
}

/// The OpenMetrics text of `registry` (what `GET /metrics` answers).
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)
        .expect("writing to a String cannot fail");
    out
}

/// `process_*` (the names Prometheus's own client libraries use) and `strata_build_info`.
#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, encoder: DescriptorEncoder) -> fmt::Result {
        let mut out = Out(encoder);
        let info = [
            ("version", env!("CARGO_PKG_VERSION")),
            ("rustc", option_env!("STRATA_RUSTC").unwrap_or("unknown")),
        ];
        out.0
            .encode_descriptor(
                "strata_build",
                "The running build: 1, labelled by version.",
                None,
                MetricType::Info,
            )?
            .encode_info(&info)?;
        if let Some(p) = ProcessStat::read() {
            out.counter(
                "process_cpu_seconds_total",
                "User and system CPU time spent, in seconds.",
                p.cpu_seconds,
            )?;
            out.gauge(
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                p.resident_bytes,
            )?;
            out.gauge(
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                p.virtual_bytes,
            )?;
            out.gauge(
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch, in seconds.",
                p.start_time_seconds,
            )?;
            out.gauge("process_threads", "OS threads of the process.", p.threads)?;
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            out.gauge(
                "process_open_fds",
                "Open file descriptors.",
                fds.count() as u64,
            )?;
        }
        if let Some(limit) = crate::kafka::limits::fd_limit() {
            out.gauge(
                "process_max_fds",
                "The file descriptor limit (RLIMIT_NOFILE).",
                limit,
            )?;
        }
        Ok(())
    }
}

/// What /proc/self/stat says of this process.
struct ProcessStat {
    cpu_seconds: f64,
    resident_bytes: u64,
    virtual_bytes: u64,
    start_time_seconds: f64,
    threads: u64,
}

impl ProcessStat {
    fn read() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // fields after the command name (which may hold spaces and parentheses)
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        // field n of proc(5) is fields[n - 3]
        let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        let ticks = rustix::param::clock_ticks_per_second() as f64;
        let boot = std::fs::read_to_string("/proc/stat").ok()?;
        let btime: u64 = boot
            .lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse()
            .ok()?;
        Some(ProcessStat {
            cpu_seconds: (field(14)? + field(15)?) as f64 / ticks,
            threads: field(20)?,
            start_time_seconds: btime as f64 + field(22)? as f64 / ticks,
            virtual_bytes: field(23)?,
            resident_bytes: field(24)? * rustix::param::page_size() as u64,
        })
    }
}

/// The metrics of the roles this process runs, as far as they are up.
struct RolesCollector(Arc<Health>);

impl fmt::Debug for RolesCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RolesCollector")
    }
}

impl Collector for RolesCollector {
    fn encode(&self, encoder: DescriptorEncoder) -> fmt::Result {
        let mut out = Out(encoder);
        out.gauge(
            "strata_ready",
            "1 when every role of this process is ready (what /readyz answers), 0 otherwise.",
            u64::from(self.0.readiness().is_ok()),
        )?;
        if let Some(c) = self.0.controller() {
            controller(&mut out, c)?;
        }
        if let Some(b) = self.0.broker() {
            broker(&mut out, b)?;
        }
        Ok(())
    }
}

/// A controller's view of the quorum; on the active controller (the Raft leader) also the
/// cluster-wide partition gauges, so that summing across nodes counts them once.
fn controller(out: &mut Out<'_>, c: &strata_controller::Controller) -> fmt::Result {
    let s = c.raft_status();
    let active = s.leader == Some(s.node_id);
    out.gauge(
        "strata_controller_active",
        "1 on the active controller (the metadata quorum's Raft leader), 0 on the others.",
        u64::from(active),
    )?;
    out.gauge(
        "strata_controller_raft_term",
        "The Raft term this controller is in.",
        s.term,
    )?;
    out.gauge(
        "strata_controller_raft_last_log_index",
        "Index of the last metadata log entry this controller holds.",
        s.last_log_index,
    )?;
    out.gauge(
        "strata_controller_raft_applied_index",
        "Index of the last metadata log entry this controller has applied.",
        s.last_applied,
    )?;
    out.gauge(
        "strata_controller_raft_voters",
        "Voters in the metadata quorum.",
        s.voters as u64,
    )?;
    out.gauge(
        "strata_controller_quorum_contact_age_seconds",
        "Since this controller last heard from a quorum (as leader) or its leader (as follower); NaN: never.",
        s.quorum_contact_age.map_or(f64::NAN, |a| a.as_secs_f64()),
    )?;
    out.gauge(
        "strata_controller_pending_proposals",
        "Metadata changes this controller has proposed that are not applied yet (its request queue).",
        c.pending_proposals(),
    )?;
    if !active {
        return Ok(());
    }
    let m = c.metadata().borrow().clone();
    let partitions: Vec<_> = m.topics.values().flat_map(|t| &t.partitions).collect();
    out.gauge(
        "strata_offline_partitions",
        "Partitions of the cluster with no leader (reported by the active controller only).",
        partitions.iter().filter(|p| p.leader.is_none()).count() as u64,
    )?;
    out.gauge(
        "strata_cluster_under_replicated_partitions",
        "Partitions of the cluster whose ISR is smaller than their replica set (reported by the active controller only).",
        partitions
            .iter()
            .filter(|p| p.isr.len() < p.replicas.len())
            .count() as u64,
    )?;
    out.gauge(
        "strata_cluster_brokers",
        "Brokers registered with the controllers (reported by the active controller only).",
        m.brokers.len() as u64,
    )?;
    out.gauge(
        "strata_cluster_fenced_brokers",
        "Registered brokers fenced for missing their lease (reported by the active controller only).",
        m.brokers.values().filter(|b| b.fenced).count() as u64,
    )
}

type PartitionLabels = [(&'static str, String); 2];
type ReplicaLabels = [(&'static str, String); 3];

fn broker(out: &mut Out<'_>, broker: &Broker) -> fmt::Result {
    let m = broker.metrics();
    let load = |v: &AtomicU64| v.load(Ordering::Relaxed);
    out.counter(
        "strata_produce_requests_total",
        "Partition produce requests received.",
        load(&m.produce_requests),
    )?;
    out.counter(
        "strata_produce_errors_total",
        "Partition produce requests answered with an error.",
        load(&m.produce_errors),
    )?;
    out.counter(
        "strata_produced_records_total",
        "Records appended by this broker as leader.",
        load(&m.produced_records),
    )?;
    out.counter(
        "strata_produced_bytes_total",
        "Batch bytes appended by this broker as leader.",
        load(&m.produced_bytes),
    )?;
    out.counter(
        "strata_fetch_requests_total",
        "Fetch requests served.",
        load(&m.fetch_requests),
    )?;
    out.counter(
        "strata_fetched_bytes_total",
        "Record bytes returned by fetches.",
        load(&m.fetched_bytes),
    )?;
    out.counter(
        "strata_fetched_from_file_bytes_total",
        "Of the record bytes fetches returned, those sent from the segment files (sendfile) without being read.",
        load(&FETCHED_FROM_FILE),
    )?;
    out.histogram(
        "strata_produce_latency_seconds",
        "Produce request to response, acks wait included.",
        &m.produce_latency,
    )?;
    out.histogram(
        "strata_commit_latency_seconds",
        "acks=all append until committed (fsynced on every in-sync replica).",
        &m.commit_latency,
    )?;
    let st = &*STAGES;
    out.histogram(
        "strata_stage_leader_durable_seconds",
        "Leader: acks=all append until fsynced in the leader's log.",
        &st.leader_durable,
    )?;
    out.histogram(
        "strata_stage_replica_ack_seconds",
        "Leader: append until a follower's fetch offset passed it (one per follower).",
        &st.replica_ack,
    )?;
    out.histogram(
        "strata_stage_fsync_seconds",
        "Any replica: one fsync of a partition's log.",
        &st.fsync,
    )?;
    out.histogram(
        "strata_stage_follower_turnaround_seconds",
        "Follower: fetch response with records received until the next fetch is sent (append and fsync).",
        &st.follower_turnaround,
    )?;
    out.histogram(
        "strata_fetch_latency_seconds",
        "Fetch request to response, long-poll wait included.",
        &m.fetch_latency,
    )?;
    let apis = m.kafka_apis.seen();
    let api = |name: &String| [("api", name.clone())];
    out.counters(
        "strata_kafka_requests_total",
        "Kafka requests answered, by API.",
        apis.iter()
            .map(|(name, i)| (api(name), load(&m.kafka_apis.answered[*i]))),
    )?;
    out.counters(
        "strata_kafka_request_errors_total",
        "Kafka requests that failed (the connection was closed instead of answered), by API.",
        apis.iter()
            .map(|(name, i)| (api(name), load(&m.kafka_apis.failed[*i]))),
    )?;
    out.histograms(
        "strata_kafka_request_latency_seconds",
        "Kafka request arrival until its response is written, by API (long polls and acks waits included).",
        apis.iter()
            .map(|(name, i)| (api(name), &m.kafka_apis.latency[*i])),
    )?;
    out.gauge(
        "strata_producer_ids",
        "Idempotent producer ids remembered, summed over this broker's replicas (at the last retention check).",
        load(&m.producer_ids),
    )?;
    out.counter(
        "strata_producer_ids_expired_total",
        "Producer ids forgotten after producer_id_expiration without a batch (KIP-854).",
        load(&m.producer_ids_expired),
    )?;
    out.counter(
        "strata_log_compactions_total",
        "Compaction rounds of compacted topics' local logs that were swapped in.",
        load(&m.compactions),
    )?;
    out.counter(
        "strata_log_compaction_records_removed_total",
        "Records compaction removed from local logs (superseded, expired tombstones).",
        load(&m.compaction_records_removed),
    )?;
    out.counter(
        "strata_log_compaction_bytes_removed_total",
        "Bytes compaction removed from local logs.",
        load(&m.compaction_bytes_removed),
    )?;
    out.counter(
        "strata_log_compaction_errors_total",
        "Compaction rounds that failed (a damaged segment, an I/O error); retried next check.",
        load(&m.compaction_errors),
    )?;
    let quotas = [
        "producer_byte_rate",
        "consumer_byte_rate",
        "request_percentage",
    ];
    let q = &m.quotas;
    out.counters(
        "strata_quota_throttled_total",
        "Kafka responses that carried a throttle time, by client quota.",
        quotas
            .iter()
            .enumerate()
            .map(|(i, name)| ([("quota", *name)], load(&q.throttled[i]))),
    )?;
    out.counters(
        "strata_quota_throttle_seconds_total",
        "Throttle time given to Kafka clients, by client quota.",
        quotas
            .iter()
            .enumerate()
            .map(|(i, name)| ([("quota", *name)], load(&q.throttle_ms[i]) as f64 / 1000.0)),
    )?;
    let l = &m.listener;
    out.gauge(
        "strata_kafka_connections",
        "Open Kafka client connections, all listeners (kafka.max_connections).",
        load(&l.connections),
    )?;
    out.counter(
        "strata_kafka_connections_refused_total",
        "Connections closed at accept: their address held kafka.max_connections_per_ip.",
        load(&l.refused_per_ip),
    )?;
    out.counter(
        "strata_kafka_accept_paused_total",
        "Times accepting paused because kafka.max_connections were open.",
        load(&l.accept_paused),
    )?;
    let g = &m.grpc;
    out.gauge(
        "strata_grpc_connections",
        "Open connections of the gRPC data plane (grpc.max_connections).",
        load(&g.open),
    )?;
    out.counter(
        "strata_grpc_accept_paused_total",
        "Times the gRPC port paused accepting because grpc.max_connections were open.",
        load(&g.accept_paused),
    )?;
    out.counter(
        "strata_grpc_idle_closed_total",
        "gRPC connections closed for sending nothing for grpc.idle_timeout.",
        load(&g.idle_closed),
    )?;
    out.gauge(
        "strata_kafka_request_memory_bytes",
        "Request bytes read and not yet answered (kafka.queued_max_request_bytes).",
        load(&l.request_memory),
    )?;
    out.gauge(
        "strata_kafka_pre_auth_memory_bytes",
        "Request bytes read before SASL authentication and not yet answered (their own budget, a sixteenth of kafka.queued_max_request_bytes).",
        load(&l.pre_auth_memory),
    )?;
    out.counter(
        "strata_kafka_request_floor_reads_total",
        "Small request frames read on their connection's own 64 KiB because the shared request memory was in use.",
        load(&l.floor_reads),
    )?;
    out.counter(
        "strata_kafka_stalled_frames_closed_total",
        "Request frames closed for receiving nothing for 5 s while another frame waited for request memory.",
        load(&l.stalled_frames_closed),
    )?;
    out.gauge(
        "strata_open_fds",
        "Open file descriptors of the process, counted every second.",
        load(&l.open_fds),
    )?;
    out.gauge(
        "strata_fd_limit",
        "The process's file descriptor limit (RLIMIT_NOFILE, raised to its maximum at start).",
        load(&l.fd_limit),
    )?;
    out.counter(
        "strata_kafka_request_memory_waits_total",
        "Reads that paused because kafka.queued_max_request_bytes was in use.",
        load(&l.request_memory_waits),
    )?;
    out.gauge(
        "strata_kafka_fetch_sessions",
        "Fetch sessions (KIP-227) the broker keeps (kafka.fetch_session_cache_slots).",
        load(&l.fetch_sessions),
    )?;
    out.gauge(
        "strata_kafka_fetch_session_partitions",
        "Partitions held by all fetch sessions (kafka.fetch_session_cache_partitions).",
        load(&l.fetch_session_partitions),
    )?;
    out.counter(
        "strata_kafka_fetch_incremental_total",
        "Incremental fetch requests (KIP-227) served.",
        load(&l.fetch_incremental),
    )?;
    out.counter(
        "strata_kafka_fetch_sessions_evicted_total",
        "Idle fetch sessions evicted to make room for new ones.",
        load(&l.fetch_sessions_evicted),
    )?;
    out.counter(
        "strata_kafka_fetch_sessions_refused_total",
        "Full fetches answered without a session because the session cache was full.",
        load(&l.fetch_sessions_refused),
    )?;
    partitions(out, broker)?;
    out.counter(
        "strata_isr_shrinks_total",
        "ISR shrinks this broker proposed and the controllers committed.",
        load(&m.isr_shrinks),
    )?;
    out.counter(
        "strata_isr_expands_total",
        "ISR expansions this broker proposed and the controllers committed.",
        load(&m.isr_expands),
    )?;
    out.counter(
        "strata_replicated_bytes_total",
        "Record bytes sent to followers.",
        load(&m.replicated_bytes),
    )?;
    out.counter(
        "strata_tiered_bytes_total",
        "Segment bytes uploaded to the cold tier and committed in its manifests.",
        load(&m.tiered_bytes),
    )?;
    out.counter(
        "strata_tiered_segments_total",
        "Segments uploaded to the cold tier and committed.",
        load(&m.tiered_segments),
    )?;
    out.counter(
        "strata_tier_upload_errors_total",
        "Failed uploads and manifest claims (retried; local data is kept).",
        load(&m.tier_upload_errors),
    )?;
    out.counter(
        "strata_remote_segments_deleted_total",
        "Remote segments deleted by retention.ms / retention.bytes.",
        load(&m.remote_segments_deleted),
    )?;
    out.counter(
        "strata_cold_orphans_deleted_total",
        "Cold-tier objects no manifest named (killed or deposed uploads), deleted after the grace period.",
        load(&m.orphans_deleted),
    )?;
    out.gauge(
        "strata_under_tiered_bytes",
        "Bytes of sealed local segments of tiered topics not yet in the cold tier.",
        load(&m.under_tiered_bytes),
    )?;
    groups(out, broker)?;
    if let Some(cold) = broker.cold() {
        let s = &cold.reader.stats;
        out.counter(
            "strata_cold_read_bytes_total",
            "Bytes read from the cold tier (ranged GETs).",
            load(&s.bytes_fetched),
        )?;
        out.counter(
            "strata_cold_cache_hits_total",
            "Cold chunks served from the cache's memory.",
            load(&s.hits),
        )?;
        out.counter(
            "strata_cold_cache_disk_hits_total",
            "Cold chunks served from the cache's local disk.",
            load(&s.disk_hits),
        )?;
        out.counter(
            "strata_cold_cache_misses_total",
            "Cold chunks fetched from the object store.",
            load(&s.misses),
        )?;
        out.counter(
            "strata_cold_reads_throttled_total",
            "Cold GETs that waited for the cold-read budget.",
            load(&s.throttled),
        )?;
        out.gauge(
            "strata_cold_reads_in_flight",
            "Cold GETs running now.",
            load(&s.in_flight),
        )?;
    }
    Ok(())
}

/// The partition and replica families, and the per-topic byte counters.
fn partitions(out: &mut Out<'_>, broker: &Broker) -> fmt::Result {
    let node = broker.config().node_id;
    let (mut local, mut leading, mut offline, mut under_replicated, mut under_min_isr) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut high_watermark: Vec<(PartitionLabels, u64)> = Vec::new();
    let mut log_end = Vec::new();
    let mut log_start = Vec::new();
    let mut size = Vec::new();
    let mut lag_records: Vec<(ReplicaLabels, i64)> = Vec::new();
    let mut lag_seconds: Vec<(ReplicaLabels, f64)> = Vec::new();
    let mut in_sync: Vec<(ReplicaLabels, u64)> = Vec::new();
    let mut topic_in = Vec::new();
    let mut topic_out = Vec::new();
    for t in broker.topics() {
        let (mut bytes_in, mut bytes_out, mut held) = (0, 0, false);
        for (i, layout) in t.layout.iter().enumerate() {
            if layout.leader.is_none() {
                offline += 1;
            }
            let Some(p) = t.partitions.get(i).and_then(|p| p.as_ref()) else {
                continue;
            };
            local += 1;
            held = true;
            bytes_in += p.bytes_in.load(Ordering::Relaxed);
            bytes_out += p.bytes_out.load(Ordering::Relaxed);
            let labels = || [("topic", t.spec.name.clone()), ("partition", i.to_string())];
            size.push((labels(), p.size_bytes()));
            if layout.leader != Some(node) {
                continue;
            }
            leading += 1;
            if layout.isr.len() < layout.replicas.len() {
                under_replicated += 1;
            }
            let pr = p.progress();
            high_watermark.push((labels(), pr.high_watermark));
            log_end.push((labels(), pr.log_end));
            log_start.push((labels(), pr.log_start));
            if pr.under_min_isr {
                under_min_isr += 1;
            }
            if let Some((_, _, followers)) = p.leader_view(broker.now_ms()) {
                for f in followers {
                    let [topic, partition] = labels();
                    let replica: ReplicaLabels = [topic, partition, ("replica", f.id.to_string())];
                    lag_records.push((replica.clone(), f.lag_records as i64));
                    lag_seconds.push((replica.clone(), f.lag_ms.max(0) as f64 / 1000.0));
                    in_sync.push((replica, u64::from(f.in_sync)));
                }
            }
        }
        if held {
            topic_in.push(([("topic", t.spec.name.clone())], bytes_in));
            topic_out.push(([("topic", t.spec.name.clone())], bytes_out));
        }
    }
    out.gauge(
        "strata_local_partitions",
        "Partition replicas held by this broker.",
        local,
    )?;
    out.gauge(
        "strata_leader_partitions",
        "Partitions this broker leads.",
        leading,
    )?;
    if broker.cluster().is_none() {
        // In a cluster the active controller reports it, once for the cluster.
        out.gauge(
            "strata_offline_partitions",
            "Partitions of the cluster with no leader.",
            offline,
        )?;
    }
    out.gauge(
        "strata_under_replicated_partitions",
        "Partitions this broker leads whose ISR is smaller than their replica set.",
        under_replicated,
    )?;
    out.gauge(
        "strata_partitions_stuck_opening",
        "Replicas whose log has been opening (recovering) longer than replica_open_timeout: unavailable here (alert on > 0).",
        broker.stuck_opening() as u64,
    )?;
    out.gauge(
        "strata_under_min_isr_partitions",
        "Partitions this broker leads whose ISR is below min.insync.replicas (acks=all refused).",
        under_min_isr,
    )?;
    out.gauges(
        "strata_partition_high_watermark",
        "Offsets below it are durable and visible (partitions this broker leads).",
        high_watermark,
    )?;
    out.gauges(
        "strata_partition_log_end_offset",
        "The offset the next record appended gets (partitions this broker leads).",
        log_end,
    )?;
    out.gauges(
        "strata_partition_log_start_offset",
        "The first offset still held locally (partitions this broker leads).",
        log_start,
    )?;
    out.gauges(
        "strata_partition_size_bytes",
        "Bytes of the local log segments of each replica this broker holds.",
        size,
    )?;
    out.counters(
        "strata_topic_bytes_in_total",
        "Batch bytes appended as leader, by topic (replicas held here).",
        topic_in,
    )?;
    out.counters(
        "strata_topic_bytes_out_total",
        "Record bytes returned to consumers, by topic (replicas held here).",
        topic_out,
    )?;
    out.gauges(
        "strata_replica_lag_records",
        "Records a follower is behind this leader's log end.",
        lag_records,
    )?;
    out.gauges(
        "strata_replica_lag_seconds",
        "Time since a follower was last caught up.",
        lag_seconds,
    )?;
    out.gauges(
        "strata_replica_in_sync",
        "1 when the follower is in the committed ISR.",
        in_sync,
    )
}

/// Groups whose series /metrics carries (the first by name); the rest are counted only, so
/// that clients creating groups cannot grow every scrape without bound.
pub const MAX_GROUPS_IN_METRICS: usize = 1000;

/// The groups this broker coordinates: members, committed offsets, and the lag behind the
/// high watermark of each partition this broker holds a replica of.
fn groups(out: &mut Out<'_>, broker: &Broker) -> fmt::Result {
    let mut groups: Vec<(String, Arc<crate::group::coordinator::Coordinator>)> = broker
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
    out.gauge(
        "strata_groups",
        "Consumer groups this broker coordinates.",
        total as u64,
    )?;
    out.gauge(
        "strata_groups_not_in_metrics",
        "Groups coordinated here whose series are left out (past the first 1000 by name).",
        total.saturating_sub(MAX_GROUPS_IN_METRICS) as u64,
    )?;
    let mut members = Vec::new();
    let mut committed = Vec::new();
    let mut lag = Vec::new();
    for (group, c) in groups {
        if let Some(view) = c.describe(&group) {
            members.push((
                [
                    ("group", group.clone()),
                    ("state", view.state.name().to_string()),
                ],
                view.members.len() as u64,
            ));
        }
        for ((topic, partition), o) in c.committed(&group) {
            let labels = [
                ("group", group.clone()),
                ("topic", topic.clone()),
                ("partition", partition.to_string()),
            ];
            let local = broker.topic(&topic).and_then(|t| {
                usize::try_from(partition)
                    .ok()
                    .and_then(|i| t.partitions.get(i).cloned().flatten())
            });
            if let Some(p) = local {
                let hw = p.progress().high_watermark as i64;
                lag.push((labels.clone(), (hw - o.offset).max(0)));
            }
            committed.push((labels, o.offset));
        }
    }
    out.gauges(
        "strata_group_members",
        "Members of each group this broker coordinates, by state.",
        members,
    )?;
    out.gauges(
        "strata_group_committed_offset",
        "Committed offset of each group partition this broker coordinates.",
        committed,
    )?;
    out.gauges(
        "strata_group_lag_records",
        "High watermark minus committed offset, for partitions with a replica on this broker.",
        lag,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Sample;

    impl Collector for Sample {
        fn encode(&self, encoder: DescriptorEncoder) -> fmt::Result {
            let mut out = Out(encoder);
            let h = Histogram::default();
            h.observe(Duration::from_micros(300));
            h.observe(Duration::from_millis(3));
            h.observe(Duration::from_secs(10));
            out.histogram("x_seconds", "test", &h)?;
            out.gauges(
                "y",
                "labelled",
                [([("topic", "a\"b\\c\nd".to_string())], 1u64)],
            )?;
            out.counter("z_total", "a counter", 5u64)?;
            out.gauges("empty", "no rows", Vec::<([(&str, &str); 0], u64)>::new())
        }
    }

    #[test]
    fn histograms_are_cumulative_labels_escaped_and_counters_named_by_their_samples() {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Sample));
        let out = encode(&registry);
        assert!(out.contains("x_seconds_bucket{le=\"0.0005\"} 1\n"), "{out}");
        assert!(out.contains("x_seconds_bucket{le=\"0.005\"} 2\n"), "{out}");
        assert!(out.contains("x_seconds_bucket{le=\"5.0\"} 2\n"), "{out}");
        assert!(out.contains("x_seconds_bucket{le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.contains("x_seconds_count 3\n"), "{out}");
        assert!(out.contains(r#"y{topic="a\"b\\c\nd"} 1"#), "{out}");
        assert!(out.contains("# TYPE z counter\n"), "{out}");
        assert!(out.contains("z_total 5\n"), "{out}");
        assert!(!out.contains("empty"), "{out}");
        assert!(out.ends_with("# EOF\n"), "{out}");
    }
}
