//! `strata-compactor`: key compaction, segment merging and orphan clean-up in the cold
//! tier, as a service (`run`) or once (`once`). See docs/compaction.md.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use strata_cold::object_store::ObjectStore;
use strata_compactor::job::JobConfig;
use strata_compactor::service::{self, Metrics, Outcome, RoundConfig};

#[derive(Parser)]
#[command(
    name = "strata-compactor",
    about = "Key compaction, segment merging and orphan clean-up in the cold tier"
)]
struct Cli {
    /// The cold tier: s3://bucket[/prefix] or file:///abs/dir (as in the brokers' [cold] url).
    #[arg(long, env = "STRATA_COMPACTOR_URL")]
    url: String,
    /// S3-compatible servers: the endpoint URL.
    #[arg(long, env = "STRATA_COMPACTOR_ENDPOINT")]
    endpoint: Option<String>,
    #[arg(long)]
    region: Option<String>,
    /// Path-style S3 requests, as most S3-compatible servers want.
    #[arg(long)]
    path_style: bool,
    /// Log lines as text, or as JSON objects for a log shipper.
    #[arg(long, value_enum, env = "STRATA_LOG_FORMAT", default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Args, Clone)]
struct Common {
    /// Only this cluster's topics (when several share the bucket).
    #[arg(long)]
    cluster: Option<String>,
    /// Only this topic (repeat for more; default: every topic in the bucket).
    #[arg(long = "topic")]
    topics: Vec<String>,
    /// Plan and count, write and delete nothing.
    #[arg(long)]
    dry_run: bool,
    /// Partitions worked on at once.
    #[arg(long, default_value_t = 2)]
    concurrency: usize,
    /// Objects no manifest names (and those replaced by compaction) are deleted once this
    /// old; keep it above the longest upload and remote read.
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    orphan_grace: Duration,
    /// Merge segments up to this many MiB (default: each topic's segment.bytes).
    #[arg(long)]
    merge_mb: Option<u64>,
    /// Memory for the key table of one job, in MiB; past it a job compacts what it has
    /// read so far and leaves the rest for the next round.
    #[arg(long, default_value_t = 256)]
    max_map_mb: usize,
    /// Where new segments are written before upload (default: the system temp dir).
    #[arg(long)]
    work_dir: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// One round over every partition, then exit (non-zero if a partition failed).
    Once {
        #[command(flatten)]
        common: Common,
    },
    /// Rounds every --interval, with Prometheus metrics on --metrics-addr.
    Run {
        #[command(flatten)]
        common: Common,
        #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
        interval: Duration,
        /// Serve /metrics here (e.g. 127.0.0.1:9650).
        #[arg(long)]
        metrics_addr: Option<std::net::SocketAddr>,
    },
}

fn round_config(c: &Common) -> anyhow::Result<RoundConfig> {
    let work_dir = c.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    strata_core::private_fs::create_dir_all(&work_dir)
        .with_context(|| format!("creating the work dir {}", work_dir.display()))?;
    let stale = strata_compactor::job::clean_work_dir(&work_dir)
        .with_context(|| format!("cleaning the work dir {}", work_dir.display()))?;
    if stale > 0 {
        tracing::info!(dir = %work_dir.display(), files = stale, "removed work files a killed compactor left");
    }
    Ok(RoundConfig {
        job: JobConfig {
            merge_bytes: c.merge_mb.map(|mb| mb << 20),
            max_map_bytes: c.max_map_mb << 20,
            orphan_grace: c.orphan_grace,
            dry_run: c.dry_run,
            work_dir,
            ..JobConfig::default()
        },
        concurrency: c.concurrency,
        cluster: c.cluster.clone(),
        topics: c.topics.clone(),
    })
}

fn open_store(cli: &Cli) -> anyhow::Result<Arc<dyn ObjectStore>> {
    Ok(strata_cold::store::open(
        &strata_cold::store::StoreConfig {
            url: cli.url.clone(),
            endpoint: cli.endpoint.clone(),
            region: cli.region.clone(),
            path_style: cli.path_style,
            request_timeout: Some(Duration::from_secs(30)),
        },
    )?)
}

fn line(o: &Outcome) -> String {
    let what = format!("{}/{}[{}]", o.cluster, o.topic, o.partition);
    match &o.result {
        Err(e) => format!("{what}: FAILED: {e}"),
        Ok(r) => {
            match &r.skipped {
                Some(why) => format!("{what}: skipped ({why})"),
                None => {
                    format!(
                "{what}: {} -> {} segments, {} -> {} bytes, {} records removed, {} keys{}{}",
                r.segments_in,
                r.segments_out,
                r.bytes_in,
                r.bytes_out,
                r.records_removed,
                r.keys,
                if r.conflict { ", manifest changed meanwhile: not swapped" } else { "" },
                if !r.swapped && !r.conflict { " (dry run)" } else { "" },
            )
                }
            }
        }
    }
}

async fn once(store: Arc<dyn ObjectStore>, common: &Common) -> anyhow::Result<bool> {
    let cfg = round_config(common)?;
    let work = service::partitions(&store, &cfg)
        .await
        .context("listing the topics in the bucket")?;
    if work.is_empty() {
        anyhow::bail!(
            "no topic found in the bucket (is --url right? has a broker tiered anything yet?)"
        );
    }
    let bar = ProgressBar::new(work.len() as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} partitions, ETA {eta}",
        )
        .expect("a valid template"),
    );
    if !std::io::stderr().is_terminal() {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let started = Instant::now();
    let metrics = Metrics::default();
    let outcomes = service::round(&store, &cfg, work, &metrics, |_| bar.inc(1)).await;
    bar.finish_and_clear();
    let mut sorted: Vec<&Outcome> = outcomes.iter().collect();
    sorted.sort_by(|a, b| {
        (&a.cluster, &a.topic, a.partition).cmp(&(&b.cluster, &b.topic, b.partition))
    });
    for o in &sorted {
        println!("{}", line(o));
    }
    let failed = outcomes.iter().filter(|o| o.result.is_err()).count();
    let (mut read, mut written, mut removed, mut bytes_in) = (0, 0, 0, 0);
    for r in outcomes.iter().filter_map(|o| o.result.as_ref().ok()) {
        read += r.segments_in;
        written += r.segments_out;
        removed += r.records_removed;
        bytes_in += r.bytes_in;
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "{} partitions in {secs:.1} s: {read} segments ({:.1} MB, {:.1} MB/s) rewritten into {written}, {removed} records removed, {} orphans deleted, {failed} failed{}",
        outcomes.len(),
        bytes_in as f64 / 1e6,
        bytes_in as f64 / 1e6 / secs.max(1e-9),
        outcomes.iter().map(|o| o.orphans_deleted).sum::<usize>(),
        if common.dry_run { " (dry run: nothing written)" } else { "" },
    );
    Ok(failed == 0)
}

async fn serve(
    store: Arc<dyn ObjectStore>,
    common: &Common,
    interval: Duration,
    metrics_addr: Option<std::net::SocketAddr>,
) -> anyhow::Result<()> {
    let cfg = round_config(common)?;
    let metrics = Arc::new(Metrics::default());
    if let Some(addr) = metrics_addr {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the metrics listener on {addr}"))?;
        let m = metrics.clone();
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let m = m.clone();
                async move {
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        m.render(),
                    )
                }
            }),
        );
        tracing::info!(%addr, "serving Prometheus metrics on /metrics");
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "metrics endpoint failed");
            }
        });
    }
    tracing::info!(interval = %humantime::format_duration(interval), dry_run = cfg.job.dry_run, "compactor started");
    // SIGINT or SIGTERM, whenever it comes: between rounds, or in one, which then stops
    // where it is (as a kill would: manifests stay valid, work files are removed).
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt()).context("listening for SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
    let stop = async move {
        tokio::select! {
            _ = interrupt.recv() => "SIGINT",
            _ = terminate.recv() => "SIGTERM",
        }
    };
    tokio::pin!(stop);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            signal = &mut stop => {
                tracing::info!(signal, "stopping");
                return Ok(());
            }
        }
        let round = async {
            let work = match service::partitions(&store, &cfg).await {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list the topics in the bucket; next round retries");
                    return Vec::new();
                }
            };
            service::round(&store, &cfg, work, &metrics, |o| {
                if let Ok(r) = &o.result {
                    if r.skipped.is_none() {
                        tracing::debug!("{}", line(o));
                    }
                }
            })
            .await
        };
        let outcomes = tokio::select! {
            outcomes = round => outcomes,
            signal = &mut stop => {
                tracing::info!(signal, "stopping in the middle of a round; what it wrote and did not swap is left to the orphan sweep");
                return Ok(());
            }
        };
        let swapped = outcomes
            .iter()
            .filter(|o| o.result.as_ref().is_ok_and(|r| r.swapped))
            .count();
        let failed = outcomes.iter().filter(|o| o.result.is_err()).count();
        tracing::info!(partitions = outcomes.len(), swapped, failed, "round done");
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,aws_runtime=error,aws_config=error".into()),
        )
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => logs.json().init(),
    }
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        let store = open_store(&cli)?;
        match &cli.command {
            Command::Once { common } => once(store, common).await,
            Command::Run {
                common,
                interval,
                metrics_addr,
            } => serve(store, common, *interval, *metrics_addr)
                .await
                .map(|()| true),
        }
    });
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(2),
        Err(e) => {
            eprintln!("error: {}", strata_cold::store::error_line(e.chain()));
            ExitCode::FAILURE
        }
    }
}
