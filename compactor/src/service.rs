//! Rounds over every partition the bucket describes, a few at once, with their metrics.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use futures_util::StreamExt;
use strata_cold::catalog::{self, Topic};
use strata_cold::object_store::ObjectStore;

use crate::job::{self, JobConfig, Report};

/// Which partitions a round visits, and how.
#[derive(Debug, Clone)]
pub struct RoundConfig {
    pub job: JobConfig,
    /// Partitions worked on at once.
    pub concurrency: usize,
    /// Only this cluster's topics (several clusters may share a bucket).
    pub cluster: Option<String>,
    /// Only these topics (empty: all).
    pub topics: Vec<String>,
}

/// One partition's result in a round.
#[derive(Debug)]
pub struct Outcome {
    pub cluster: String,
    pub topic: String,
    pub partition: u32,
    pub result: Result<Report, String>,
    /// Orphaned objects deleted after the job.
    pub orphans_deleted: usize,
}

/// Counters since start, rendered as Prometheus text.
#[derive(Debug, Default)]
pub struct Metrics {
    pub rounds: AtomicU64,
    pub partitions_compacted: AtomicU64,
    pub partitions_failed: AtomicU64,
    pub swap_conflicts: AtomicU64,
    pub segments_in: AtomicU64,
    pub segments_out: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub records_removed: AtomicU64,
    pub orphans_deleted: AtomicU64,
    pub last_round_ms: AtomicU64,
}

impl Metrics {
    fn record(&self, o: &Outcome) {
        self.orphans_deleted
            .fetch_add(o.orphans_deleted as u64, Relaxed);
        match &o.result {
            Err(_) => {
                self.partitions_failed.fetch_add(1, Relaxed);
            }
            Ok(r) => {
                if r.swapped {
                    self.partitions_compacted.fetch_add(1, Relaxed);
                    self.segments_in.fetch_add(r.segments_in, Relaxed);
                    self.segments_out.fetch_add(r.segments_out, Relaxed);
                    self.bytes_in.fetch_add(r.bytes_in, Relaxed);
                    self.bytes_out.fetch_add(r.bytes_out, Relaxed);
                    self.records_removed.fetch_add(r.records_removed, Relaxed);
                }
                if r.conflict {
                    self.swap_conflicts.fetch_add(1, Relaxed);
                }
            }
        }
    }

    /// The OpenMetrics text exposition (prometheus-client's encoder: one block per family,
    /// HELP and TYPE, `# EOF`), what `GET /metrics` answers.
    pub fn render(self: &Arc<Self>) -> String {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(Exposition(self.clone())));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// The metrics as a prometheus-client collector, read at scrape time.
#[derive(Debug)]
struct Exposition(Arc<Metrics>);

impl prometheus_client::collector::Collector for Exposition {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> std::fmt::Result {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        let m = &self.0;
        // (family names without `_total`: the encoder adds it to a counter's sample)
        let counters: [(&str, &str, &AtomicU64); 10] = [
            ("strata_compactor_rounds", "Rounds over the bucket finished.", &m.rounds),
            ("strata_compactor_partitions_compacted", "Partition jobs that swapped in a new manifest.", &m.partitions_compacted),
            ("strata_compactor_partitions_failed", "Partition jobs that failed (retried next round).", &m.partitions_failed),
            ("strata_compactor_swap_conflicts", "Jobs whose manifest changed under them (nothing swapped; their objects become orphans).", &m.swap_conflicts),
            ("strata_compactor_segments_read", "Remote segments rewritten.", &m.segments_in),
            ("strata_compactor_segments_written", "Remote segments they became.", &m.segments_out),
            ("strata_compactor_bytes_read", "Bytes of the segments rewritten.", &m.bytes_in),
            ("strata_compactor_bytes_written", "Bytes of the segments written.", &m.bytes_out),
            ("strata_compactor_records_removed", "Records removed (superseded, expired tombstones, aborted).", &m.records_removed),
            ("strata_compactor_orphans_deleted", "Objects no manifest named, deleted after the grace period.", &m.orphans_deleted),
        ];
        for (name, help, v) in counters {
            let counter = ConstCounter::new(v.load(Relaxed));
            counter.encode(encoder.encode_descriptor(
                name,
                help,
                None,
                counter.metric_type(),
            )?)?;
        }
        let last = ConstGauge::new(m.last_round_ms.load(Relaxed) as f64 / 1000.0);
        last.encode(encoder.encode_descriptor(
            "strata_compactor_last_round_seconds",
            "How long the last round took.",
            None,
            last.metric_type(),
        )?)
    }
}

/// The partitions a round visits.
pub async fn partitions(
    store: &Arc<dyn ObjectStore>,
    cfg: &RoundConfig,
) -> Result<Vec<(Topic, u32)>, catalog::CatalogError> {
    let topics = catalog::topics(store).await?;
    Ok(topics
        .into_iter()
        .filter(|t| cfg.cluster.as_ref().is_none_or(|c| *c == t.cluster))
        .filter(|t| cfg.topics.is_empty() || cfg.topics.contains(&t.info.name))
        .flat_map(|t| (0..t.info.partitions).map(move |p| (t.clone(), p)))
        .collect())
}

/// Runs every job of `work`, `concurrency` at once, then each partition's orphan sweep;
/// `done` is told after each.
pub async fn round(
    store: &Arc<dyn ObjectStore>,
    cfg: &RoundConfig,
    work: Vec<(Topic, u32)>,
    metrics: &Metrics,
    done: impl Fn(&Outcome),
) -> Vec<Outcome> {
    let started = Instant::now();
    let done = &done;
    let outcomes: Vec<Outcome> = futures_util::stream::iter(work)
        .map(|(topic, partition)| async move {
            let result = job::run(store, &topic, partition, &cfg.job).await;
            let mut orphans_deleted = 0;
            if !cfg.job.dry_run {
                let manifests = topic.manifests(store, partition);
                let swept = match manifests.load().await {
                    Ok(m) => strata_cold::orphans::sweep(
                        store,
                        manifests.prefix(),
                        &m,
                        cfg.job.orphan_grace,
                    )
                    .await
                    .map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                match swept {
                    Ok(s) => orphans_deleted = s.deleted.len(),
                    Err(e) => {
                        tracing::warn!(topic = %topic.info.name, partition, error = %e, "orphan sweep failed; next round retries")
                    }
                }
            }
            let outcome = Outcome {
                cluster: topic.cluster.clone(),
                topic: topic.info.name.clone(),
                partition,
                result: result.map_err(|e| e.to_string()),
                orphans_deleted,
            };
            if let Err(e) = &outcome.result {
                tracing::warn!(topic = %outcome.topic, partition, error = %e, "compaction failed; next round retries");
            }
            metrics.record(&outcome);
            done(&outcome);
            outcome
        })
        .buffer_unordered(cfg.concurrency.max(1))
        .collect()
        .await;
    metrics.rounds.fetch_add(1, Relaxed);
    metrics
        .last_round_ms
        .store(started.elapsed().as_millis() as u64, Relaxed);
    outcomes
}
