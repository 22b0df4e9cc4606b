//! `strata-bench log`: the log engine's append throughput with fsync per append and with
//! group commit, printed as ratios to a plain sequential write + fsync of the same bytes on
//! the same disk. Figures, not assertions: see docs/benchmarks.md.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use clap::Parser;
use strata_core::batch::build::{batch, ProducerIds, Rec};
use strata_hot::broker::Partition;
use strata_hot::log::{LogConfig, PartitionLog, ValidBatch};

#[derive(Parser)]
#[command(about = "Log engine benchmark (prints figures)")]
struct Args {
    /// Directory on the disk to measure (a temporary directory inside it is used).
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// Record value size in bytes.
    #[arg(long, default_value_t = 800)]
    record_bytes: usize,
    /// Records per batch.
    #[arg(long, default_value_t = 1)]
    batch_records: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Concurrent producers for the group-commit run.
    #[arg(long, default_value_t = 64)]
    producers: usize,
}

fn make_batch(records: usize, record_bytes: usize) -> Bytes {
    let value = vec![b'x'; record_bytes];
    let recs: Vec<Rec<'_>> = (0..records)
        .map(|i| Rec {
            key: Some(b"key-0000"),
            value: Some(&value),
            timestamp_delta: i as i64,
        })
        .collect();
    Bytes::from(batch(1_700_000_000_000, ProducerIds::NONE, &recs))
}

struct Rate {
    batches: u64,
    bytes: u64,
    elapsed: Duration,
}

impl Rate {
    fn per_sec(&self) -> f64 {
        self.batches as f64 / self.elapsed.as_secs_f64()
    }
    fn mb_per_sec(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64() / 1e6
    }
}

/// Writes `chunk` over and over to a plain file, fdatasync after each write when `sync`.
fn plain_file(dir: &Path, chunk: &[u8], seconds: f64, sync: bool) -> anyhow::Result<Rate> {
    let path = dir.join("plain.bin");
    let mut f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&path)?;
    let start = Instant::now();
    let mut batches = 0u64;
    while start.elapsed().as_secs_f64() < seconds {
        f.write_all(chunk)?;
        if sync {
            f.sync_data()?;
        }
        batches += 1;
    }
    f.sync_data()?;
    let elapsed = start.elapsed();
    std::fs::remove_file(&path)?;
    Ok(Rate {
        batches,
        bytes: batches * chunk.len() as u64,
        elapsed,
    })
}

/// One writer: append, then fsync, for each batch.
fn engine_fsync_each(dir: &Path, batch: &ValidBatch, seconds: f64) -> anyhow::Result<Rate> {
    let log_dir = dir.join("engine-fsync");
    let (mut log, _) = PartitionLog::open(&log_dir, LogConfig::default(), 0)?;
    let start = Instant::now();
    let mut batches = 0u64;
    while start.elapsed().as_secs_f64() < seconds {
        log.append(batch, 0)?;
        if let Some(work) = log.take_sync_work() {
            work.run(&log_dir)?;
        }
        batches += 1;
    }
    let elapsed = start.elapsed();
    drop(log);
    std::fs::remove_dir_all(&log_dir)?;
    Ok(Rate {
        batches,
        bytes: batches * batch.len() as u64,
        elapsed,
    })
}

/// Many producers appending through the partition runtime, each waiting for durability:
/// the flusher's fsyncs are shared (group commit).
async fn engine_group_commit(
    dir: &Path,
    batch: ValidBatch,
    producers: usize,
    seconds: f64,
) -> anyhow::Result<(Rate, Vec<Duration>)> {
    let log_dir = dir.join("engine-group");
    let (log, _) = PartitionLog::open(&log_dir, LogConfig::default(), 0)?;
    let partition = Partition::start_standalone(Arc::from("bench"), 0, log, 0);
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for _ in 0..producers {
        let p = partition.clone();
        let b = batch.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let t = Instant::now();
                let (a, epoch) = p.append(&b, -1, 0).expect("append");
                p.wait_durable(a.last_offset + 1, epoch, Duration::from_secs(30))
                    .await
                    .expect("durable");
                latencies.push(t.elapsed());
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await?);
    }
    let elapsed = start.elapsed();
    let batches = latencies.len() as u64;
    partition.close()?;
    std::fs::remove_dir_all(&log_dir)?;
    Ok((
        Rate {
            batches,
            bytes: batches * batch.len() as u64,
            elapsed,
        },
        latencies,
    ))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let tmp = tempfile::Builder::new()
        .prefix("strata-bench-")
        .tempdir_in(&args.dir)
        .with_context(|| format!("creating a temporary directory in {}", args.dir.display()))?;
    let dir = tmp.path();
    let bytes = make_batch(args.batch_records, args.record_bytes);
    let batch = ValidBatch::new(bytes.clone()).context("building the benchmark batch")?;
    println!(
        "log engine benchmark: {} records of {} B per batch ({} B on disk), {} s per run, dir {}",
        args.batch_records,
        args.record_bytes,
        bytes.len(),
        args.seconds,
        args.dir.display()
    );
    let seq = plain_file(dir, &bytes, args.seconds, false)?;
    println!(
        "plain sequential write (one fsync at end): {:>10.0} batches/s {:>8.1} MB/s",
        seq.per_sec(),
        seq.mb_per_sec()
    );
    let plain = plain_file(dir, &bytes, args.seconds, true)?;
    println!(
        "plain write + fdatasync per write:         {:>10.0} batches/s {:>8.1} MB/s",
        plain.per_sec(),
        plain.mb_per_sec()
    );
    let each = engine_fsync_each(dir, &batch, args.seconds)?;
    println!(
        "engine append + fsync per append:          {:>10.0} batches/s {:>8.1} MB/s  ratio to plain write+fsync: {:.2}",
        each.per_sec(),
        each.mb_per_sec(),
        each.per_sec() / plain.per_sec()
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let (group, mut lat) = runtime.block_on(engine_group_commit(
        dir,
        batch,
        args.producers,
        args.seconds,
    ))?;
    lat.sort_unstable();
    println!(
        "engine group commit, {:>3} producers:       {:>10.0} batches/s {:>8.1} MB/s  ratio to plain write+fsync: {:.2}  ratio to plain sequential: {:.2}  ack p50 {:?} p99 {:?}",
        args.producers,
        group.per_sec(),
        group.mb_per_sec(),
        group.per_sec() / plain.per_sec(),
        group.mb_per_sec() / seq.mb_per_sec(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.99)
    );
    Ok(())
}
