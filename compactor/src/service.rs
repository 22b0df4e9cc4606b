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

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let rows: [(&str, &str, &AtomicU64); 10] = [
            ("strata_compactor_rounds_total", "Rounds over the bucket finished.", &self.rounds),
            ("strata_compactor_partitions_compacted_total", "Partition jobs that swapped in a new manifest.", &self.partitions_compacted),
            ("strata_compactor_partitions_failed_total", "Partition jobs that failed (retried next round).", &self.partitions_failed),
            ("strata_compactor_swap_conflicts_total", "Jobs whose manifest changed under them (nothing swapped; their objects become orphans).", &self.swap_conflicts),
            ("strata_compactor_segments_read_total", "Remote segments rewritten.", &self.segments_in),
            ("strata_compactor_segments_written_total", "Remote segments they became.", &self.segments_out),
            ("strata_compactor_bytes_read_total", "Bytes of the segments rewritten.", &self.bytes_in),
            ("strata_compactor_bytes_written_total", "Bytes of the segments written.", &self.bytes_out),
            ("strata_compactor_records_removed_total", "Records removed (superseded, expired tombstones, aborted).", &self.records_removed),
            ("strata_compactor_orphans_deleted_total", "Objects no manifest named, deleted after the grace period.", &self.orphans_deleted),
        ];
        let mut out = String::new();
        for (name, help, v) in rows {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}\n",
                v.load(Relaxed)
            ));
        }
        let name = "strata_compactor_last_round_seconds";
        out.push_str(&format!(
            "# HELP {name} How long the last round took.\n# TYPE {name} gauge\n{name} {}\n",
            self.last_round_ms.load(Relaxed) as f64 / 1000.0
        ));
        out
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
