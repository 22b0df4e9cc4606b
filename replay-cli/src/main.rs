//! `strata-replay`: archived history straight from the object store, with or without a
//! running cluster.
//!
//! - `ls`: the topics a bucket holds, per partition: offset and time ranges, bytes and
//!   segment counts (from the manifests);
//! - `cat`: records as JSON lines (key and value as UTF-8 text, or `{"base64": ...}` when
//!   they are not text; headers; timestamp; offset; partition);
//! - `export --format parquet`: a range to Parquet files partitioned by topic, partition
//!   and date, in a local directory or under an `s3://` prefix;
//! - `replay`: re-publishes a range to a topic of a running cluster (Kafka protocol), with
//!   keys, timestamps, headers and per-partition order, resumable from a checkpoint.

mod cluster;
mod export;
mod publish;
mod source;

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use base64::Engine;
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use strata_cold::object_store::ObjectStore;

use source::{Range, Record, Source};

#[derive(Parser)]
#[command(
    name = "strata-replay",
    about = "List, print and export archived history straight from the object store"
)]
struct Cli {
    /// The cold tier: s3://bucket[/prefix] or file:///abs/dir (as in the brokers' [cold] url).
    #[arg(long, env = "STRATA_REPLAY_URL")]
    url: String,
    /// S3-compatible servers: the endpoint URL.
    #[arg(long, env = "STRATA_REPLAY_ENDPOINT")]
    endpoint: Option<String>,
    #[arg(long)]
    region: Option<String>,
    /// Path-style S3 requests, as most S3-compatible servers want.
    #[arg(long)]
    path_style: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Topics, partitions, offset and time ranges, sizes and segment counts in the bucket.
    Ls {
        /// Only this cluster's topics (when several share the bucket).
        #[arg(long)]
        cluster: Option<String>,
    },
    /// Records as JSON lines on stdout.
    Cat {
        #[command(flatten)]
        select: Select,
        /// Stop after this many records.
        #[arg(long)]
        limit: Option<u64>,
    },
    /// Re-publishes records to a topic of a running cluster (partition p to partition p).
    Replay {
        #[command(flatten)]
        select: Select,
        /// The target cluster's Kafka listener (HOST:PORT).
        #[arg(long, required_unless_present = "to_grpc", conflicts_with = "to_grpc")]
        to_bootstrap: Option<String>,
        /// Or a broker's gRPC data plane (HOST:PORT, `[grpc] listen`).
        #[arg(long)]
        to_grpc: Option<String>,
        /// The target topic (default: the source's name); it must exist, with at least as
        /// many partitions.
        #[arg(long)]
        to_topic: Option<String>,
        /// all, 1 or 0.
        #[arg(long, default_value = "all")]
        acks: String,
        /// A file recording progress: a rerun resumes where the last one stopped, writing
        /// nothing twice.
        #[arg(long)]
        checkpoint: Option<std::path::PathBuf>,
        /// Cap the rate, records per second.
        #[arg(long)]
        records_per_sec: Option<f64>,
        /// Bytes of records per produced batch (about).
        #[arg(long, default_value_t = 512 * 1024)]
        batch_bytes: usize,
    },
    /// A range to Parquet files (topic=/partition=/date= directories).
    Export {
        #[command(flatten)]
        select: Select,
        /// A local directory or an s3://bucket/prefix (file:// too).
        #[arg(long)]
        out: String,
        /// Only parquet.
        #[arg(long, default_value = "parquet")]
        format: String,
        #[arg(long, default_value_t = 128 * 1024)]
        row_group_rows: usize,
        /// A file is closed and the next part begun past this size.
        #[arg(long, default_value_t = 128)]
        file_mb: u64,
        /// zstd, snappy or none.
        #[arg(long, default_value = "zstd")]
        compression: String,
        /// Also decode JSON-object values into a typed `value_json` struct column (fields
        /// inferred from the first records).
        #[arg(long)]
        decode_json: bool,
    },
}

/// Which records.
#[derive(Args)]
struct Select {
    topic: String,
    /// When several clusters share the bucket.
    #[arg(long)]
    cluster: Option<String>,
    /// Partitions (comma-separated); all by default.
    #[arg(long, value_delimiter = ',')]
    partitions: Option<Vec<u32>>,
    #[arg(long)]
    from_offset: Option<u64>,
    /// Exclusive.
    #[arg(long)]
    to_offset: Option<u64>,
    /// RFC 3339, a date (UTC) or epoch milliseconds.
    #[arg(long)]
    from_time: Option<String>,
    /// Exclusive.
    #[arg(long)]
    to_time: Option<String>,
    /// Skip (and count) a damaged segment instead of stopping.
    #[arg(long)]
    skip_corrupt: bool,
    /// Add the not-yet-tiered tail from a running cluster (its Kafka listener, HOST:PORT),
    /// so the output is complete up to now.
    #[arg(long, value_name = "BROKER")]
    include_hot: Option<String>,
    /// Also the records of aborted transactions (by default only committed and
    /// non-transactional records, as a read_committed consumer sees them).
    #[arg(long)]
    include_aborted: bool,
}

impl Select {
    /// The running cluster for `--include-hot`, if asked for.
    async fn hot(&self) -> anyhow::Result<Option<cluster::Cluster>> {
        match &self.include_hot {
            None => Ok(None),
            Some(b) => Ok(Some(
                cluster::Cluster::connect(b, &self.topic)
                    .await
                    .context("--include-hot")?,
            )),
        }
    }
}

impl Select {
    fn range(&self) -> anyhow::Result<Range> {
        Ok(Range {
            partitions: self.partitions.clone(),
            from_offset: self.from_offset,
            to_offset: self.to_offset,
            from_ms: self
                .from_time
                .as_deref()
                .map(source::parse_time)
                .transpose()?,
            to_ms: self
                .to_time
                .as_deref()
                .map(source::parse_time)
                .transpose()?,
            include_aborted: self.include_aborted,
        })
    }
}

fn open_store(url: &str, cli: &Cli) -> anyhow::Result<Arc<dyn ObjectStore>> {
    let url = if url.contains("://") {
        url.to_string()
    } else {
        // A local path: a file:// URL of its absolute form.
        let abs = std::env::current_dir()
            .context("reading the current directory")?
            .join(url);
        format!("file://{}", abs.display())
    };
    Ok(strata_cold::store::open(
        &strata_cold::store::StoreConfig {
            url,
            endpoint: cli.endpoint.clone(),
            region: cli.region.clone(),
            path_style: cli.path_style,
            request_timeout: None,
        },
    )?)
}

fn time(ms: i64) -> String {
    if ms < 0 {
        return "?".into();
    }
    humantime::format_rfc3339_millis(
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms as u64),
    )
    .to_string()
}

async fn ls(store: &Arc<dyn ObjectStore>, cluster: Option<&str>) -> anyhow::Result<()> {
    let topics = strata_cold::catalog::topics(store)
        .await
        .context("listing the bucket")?;
    let mut out = std::io::stdout().lock();
    let mut any = false;
    for t in topics
        .iter()
        .filter(|t| cluster.is_none_or(|c| t.cluster == c))
    {
        any = true;
        writeln!(
            out,
            "{} (cluster {}, id {}, {} partitions)",
            t.info.name, t.cluster, t.info.id, t.info.partitions
        )?;
        for (p, m) in t.load_manifests(store).await?.iter().enumerate() {
            let (Some(first), Some(last)) = (m.segments.first(), m.segments.last()) else {
                writeln!(out, "  {p}: empty")?;
                continue;
            };
            let from = m
                .segments
                .iter()
                .map(|s| s.min_timestamp)
                .filter(|t| *t >= 0)
                .min();
            writeln!(
                out,
                "  {p}: offsets {}..{}  time {} .. {}  {:.1} MB in {} segments",
                first.base_offset,
                last.end_offset,
                from.map_or_else(|| "?".into(), time),
                time(
                    m.segments
                        .iter()
                        .map(|s| s.max_timestamp)
                        .max()
                        .unwrap_or(-1)
                ),
                m.size_bytes() as f64 / 1e6,
                m.segments.len()
            )?;
        }
    }
    if !any {
        writeln!(out, "no tiered topics in this bucket")?;
    }
    Ok(())
}

/// A JSON value for bytes: the text when they are UTF-8, else `{"base64": ...}`.
fn bytes_json(b: &Option<bytes::Bytes>) -> serde_json::Value {
    match b {
        None => serde_json::Value::Null,
        Some(b) => match std::str::from_utf8(b) {
            Ok(s) => serde_json::Value::String(s.to_string()),
            Err(_) => {
                serde_json::json!({ "base64": base64::engine::general_purpose::STANDARD.encode(b) })
            }
        },
    }
}

fn record_json(topic: &str, r: &Record) -> serde_json::Value {
    serde_json::json!({
        "topic": topic,
        "partition": r.partition,
        "offset": r.offset,
        "timestamp": r.timestamp,
        "key": bytes_json(&r.key),
        "value": bytes_json(&r.value),
        "headers": r.headers.iter().map(|(k, v)| serde_json::json!({"key": k, "value": bytes_json(v)})).collect::<Vec<_>>(),
    })
}

fn progress(total: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total), indicatif::ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "{what} {{bar:30}} {{binary_bytes}}/{{binary_total_bytes}} {{binary_bytes_per_sec}} eta {{eta}} {{msg}}"
        ))
        .expect("a valid template"),
    );
    bar
}

/// What a selection reads: the partitions' plans, the range, a progress bar over their
/// bytes, the reader and the running cluster for `--include-hot`.
struct Reading {
    plans: Vec<source::PartitionPlan>,
    range: Range,
    bar: ProgressBar,
    src: Source,
    hot: Option<cluster::Cluster>,
}

impl Reading {
    async fn open(
        store: &Arc<dyn ObjectStore>,
        select: &Select,
        what: &str,
    ) -> anyhow::Result<Reading> {
        let topic = source::find_topic(store, &select.topic, select.cluster.as_deref()).await?;
        let range = select.range()?;
        let plans = source::plan(store, &topic, &range).await?;
        let total: u64 = plans.iter().map(|p| p.bytes()).sum();
        Ok(Reading {
            bar: progress(total, what),
            src: Source::new(store.clone(), select.skip_corrupt).await?,
            hot: select.hot().await?,
            plans,
            range,
        })
    }
}

/// Reads the selected records in partition then offset order, calling `each`.
async fn for_each_record(
    store: &Arc<dyn ObjectStore>,
    select: &Select,
    what: &str,
    mut each: impl AsyncFnMut(Record) -> anyhow::Result<bool>,
) -> anyhow::Result<(u64, u64, Vec<String>)> {
    let Reading {
        plans,
        range,
        bar,
        mut src,
        mut hot,
    } = Reading::open(store, select, what).await?;
    let (mut records, mut bytes) = (0u64, 0u64);
    'all: for plan in &plans {
        let mut reader = source::PartitionReader::new(plan, range.clone());
        while let Some(step) = reader.next(&mut src, hot.as_mut()).await? {
            bytes += step.bytes;
            bar.inc(step.bytes);
            for r in step.records {
                records += 1;
                if !each(r).await? {
                    break 'all;
                }
            }
            bar.set_message(format!("{records} records"));
        }
    }
    bar.finish_and_clear();
    Ok((records, bytes, src.skipped))
}

#[allow(clippy::too_many_arguments)]
async fn replay(
    store: &Arc<dyn ObjectStore>,
    select: &Select,
    (to, grpc): (&str, bool),
    to_topic: Option<&str>,
    acks: &str,
    checkpoint: &Option<std::path::PathBuf>,
    records_per_sec: Option<f64>,
    batch_bytes: usize,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let Reading {
        plans,
        range,
        bar,
        mut src,
        mut hot,
    } = Reading::open(store, select, "replaying").await?;
    let target_name = to_topic.unwrap_or(&select.topic).to_string();
    let mut target = publish::Target::connect(
        to,
        grpc,
        &target_name,
        publish::parse_acks(acks)?,
        records_per_sec,
    )
    .await?;
    if let Some(p) = plans.iter().find(|p| p.partition >= target.partitions) {
        anyhow::bail!(
            "target topic '{target_name}' has {} partitions; source partition {} has nowhere to go (per-partition order needs partition p -> p)",
            target.partitions,
            p.partition
        );
    }
    let mut cp = publish::resume(checkpoint, &select.topic, &target_name)?;
    let (mut skipped_written, mut bytes) = (0u64, 0u64);
    for plan in &plans {
        let p = plan.partition;
        let end_now = target.end(p).await?;
        // Resume: records the cut-short run wrote after its last checkpoint are skipped.
        let (mut part_range, mut skip, mut target_end) = (range.clone(), 0u64, end_now);
        if let Some(pos) = cp.partitions.get(&p) {
            part_range.from_offset = Some(pos.next_source_offset);
            skip = (end_now - pos.target_end).max(0) as u64;
        }
        skipped_written += skip;
        let mut batch: Vec<Record> = Vec::new();
        let mut batch_size = 0usize;
        let mut reader = source::PartitionReader::new(plan, part_range);
        while let Some(step) = reader.next(&mut src, hot.as_mut()).await? {
            bytes += step.bytes;
            bar.inc(step.bytes);
            for r in step.records {
                if skip > 0 {
                    skip -= 1;
                    continue;
                }
                batch_size += r.key.as_ref().map_or(0, |k| k.len())
                    + r.value.as_ref().map_or(0, |v| v.len())
                    + 32;
                batch.push(r);
                if batch_size >= batch_bytes {
                    target_end =
                        publish_batch(&mut target, &mut cp, checkpoint, p, &mut batch, target_end)
                            .await?;
                    batch_size = 0;
                }
            }
            bar.set_message(format!("partition {p}"));
        }
        if !batch.is_empty() {
            publish_batch(&mut target, &mut cp, checkpoint, p, &mut batch, target_end).await?;
        }
    }
    let sent = target.sent();
    bar.finish_and_clear();
    eprintln!(
        "replayed {sent} records ({:.1} MB of batches read) of {} to {target_name} at {to}{} in {:.1} s{}{}",
        bytes as f64 / 1e6,
        select.topic,
        if grpc { " (gRPC)" } else { "" },
        started.elapsed().as_secs_f64(),
        if skipped_written > 0 {
            format!("; resumed, {skipped_written} records already written were skipped")
        } else {
            String::new()
        },
        skipped_note(&src.skipped)
    );
    Ok(())
}

/// Sends one partition's batch and records the progress; returns the target's new end.
async fn publish_batch(
    target: &mut publish::Target,
    cp: &mut publish::Checkpoint,
    checkpoint: &Option<std::path::PathBuf>,
    partition: u32,
    batch: &mut Vec<Record>,
    target_end: i64,
) -> anyhow::Result<i64> {
    target.send(partition, batch).await?;
    let end = target_end + batch.len() as i64;
    let next = batch.last().expect("non-empty").offset as u64 + 1;
    cp.partitions.insert(
        partition,
        publish::Position {
            next_source_offset: next,
            target_end: end,
        },
    );
    if let Some(path) = checkpoint {
        cp.save(path)?;
    }
    batch.clear();
    Ok(end)
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let store = open_store(&cli.url, &cli)?;
    match &cli.command {
        Command::Replay {
            select,
            to_bootstrap,
            to_grpc,
            to_topic,
            acks,
            checkpoint,
            records_per_sec,
            batch_bytes,
        } => {
            let to = match (to_bootstrap, to_grpc) {
                (Some(kafka), _) => (kafka.as_str(), false),
                (None, Some(grpc)) => (grpc.as_str(), true),
                (None, None) => anyhow::bail!("give --to-bootstrap or --to-grpc"),
            };
            replay(
                &store,
                select,
                to,
                to_topic.as_deref(),
                acks,
                checkpoint,
                *records_per_sec,
                *batch_bytes,
            )
            .await
        }
        Command::Ls { cluster } => ls(&store, cluster.as_deref()).await,
        Command::Cat { select, limit } => {
            let started = Instant::now();
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            let limit = limit.unwrap_or(u64::MAX);
            let mut n = 0u64;
            let topic = select.topic.clone();
            let (records, bytes, skipped) =
                for_each_record(&store, select, "reading", async |r: Record| {
                    serde_json::to_writer(&mut out, &record_json(&topic, &r))?;
                    out.write_all(b"\n")?;
                    n += 1;
                    Ok(n < limit)
                })
                .await?;
            out.flush()?;
            eprintln!(
                "{records} records ({:.1} MB of batches) in {:.1} s{}",
                bytes as f64 / 1e6,
                started.elapsed().as_secs_f64(),
                skipped_note(&skipped)
            );
            Ok(())
        }
        Command::Export {
            select,
            out,
            format,
            row_group_rows,
            file_mb,
            compression,
            decode_json,
        } => {
            anyhow::ensure!(
                format == "parquet",
                "unknown format '{format}': only parquet"
            );
            let started = Instant::now();
            let target = open_store(out, &cli).with_context(|| format!("opening --out {out}"))?;
            let config = export::ExportConfig {
                row_group_rows: *row_group_rows,
                file_bytes: file_mb << 20,
                compression: export::parse_compression(compression)?,
                decode_json: *decode_json,
            };
            let Reading {
                plans,
                range,
                bar,
                mut src,
                mut hot,
            } = Reading::open(&store, select, "exporting").await?;
            let done = export::export(
                &mut src,
                hot.as_mut(),
                &plans,
                &range,
                export::Batcher::new(&select.topic, &config),
                export::Files::new(target, "", &select.topic, config),
                &bar,
            )
            .await?;
            bar.finish_and_clear();
            let (records, bytes, files, written, skipped) = (
                done.records,
                done.bytes,
                done.files,
                done.written,
                src.skipped,
            );
            eprintln!(
                "exported {records} records ({:.1} MB of batches) to {} Parquet files ({:.1} MB) under {out} in {:.1} s{}",
                bytes as f64 / 1e6,
                files.len(),
                written as f64 / 1e6,
                started.elapsed().as_secs_f64(),
                skipped_note(&skipped)
            );
            Ok(())
        }
    }
}

fn skipped_note(skipped: &[String]) -> String {
    if skipped.is_empty() {
        String::new()
    } else {
        format!(
            "; skipped {} damaged segment(s): {}",
            skipped.len(),
            skipped.join(", ")
        )
    }
}

/// glibc's malloc serves blocks past its mmap threshold with fresh mappings and gives the top
/// of a heap back to the kernel once 2x that threshold lies free there. The Parquet writer
/// allocates and frees buffers of about a MiB for every page of every column (the zstd output
/// reservation among them), so with the defaults each one faulted its pages in again (6% of
/// an export's CPU, in the kernel). Keeping up to 64 MiB of freed memory per heap stops that.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_memory() {
    // SAFETY: mallopt only sets allocator parameters; it is called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_freed_memory() {}

fn main() -> ExitCode {
    keep_freed_memory();
    let cli = Cli::parse();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", strata_cold::store::error_line(e.chain()));
            ExitCode::FAILURE
        }
    }
}
