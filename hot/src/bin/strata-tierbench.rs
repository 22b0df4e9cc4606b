//! `strata-tierbench`: cold-tier figures against an object store (an S3-compatible server or
//! a directory):
//!
//! - upload throughput: sealed segments through the uploader (objects, indexes, manifest
//!   commit), partitions in parallel as the brokers run them;
//! - a plain `object_store` ranged GET of the same bytes in the same chunk size, one GET
//!   at a time then as many at once as the reader may run: the baseline;
//! - cold replay as a consumer does it (whole batches from an offset, `max_bytes` at a
//!   time, segment after segment) through the remote reader with an empty cache, then again
//!   with a warm one: MB/s, records/s, ratios to the baseline, and the cache hit ratio.
//!
//! Figures, not assertions.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use strata_cold::manifest::{PartitionPrefix, RemoteSegment};
use strata_cold::object_store::path::Path;
use strata_cold::read::{ReadConfig, RemoteReader};
use strata_cold::upload::{SealedSegment, UploadConfig, Uploader};
use strata_core::batch::build::{batch, ProducerIds, Rec};
use strata_core::batch::{stamped_prefix, BatchIter, STAMP_LEN};

#[derive(Parser)]
#[command(about = "Cold tier upload and replay figures")]
struct Args {
    /// The store: s3://bucket/prefix or file:///abs/dir.
    #[arg(long)]
    url: String,
    #[arg(long)]
    endpoint: Option<String>,
    #[arg(long)]
    path_style: bool,
    /// Local scratch directory for the segment files.
    #[arg(long)]
    dir: std::path::PathBuf,
    /// Partitions uploaded in parallel, segments each, and segment size.
    #[arg(long, default_value_t = 4)]
    partitions: u32,
    #[arg(long, default_value_t = 8)]
    segments: u64,
    #[arg(long, default_value_t = 8)]
    segment_mib: u64,
    /// Record value size; 10 records per batch.
    #[arg(long, default_value_t = 1000)]
    record_bytes: usize,
    /// The reader's chunk (ranged GET) size and GETs at once.
    #[arg(long, default_value_t = 1 << 20)]
    chunk_bytes: u64,
    #[arg(long, default_value_t = 8)]
    read_concurrency: usize,
    /// Bytes a consumer asks for per fetch.
    #[arg(long, default_value_t = 1 << 20)]
    fetch_bytes: usize,
    /// The chunk cache's memory, in MiB. Default: twice the history, so the second pass
    /// replays from a warm cache; smaller than the history, the first pass recycles memory
    /// as a broker's bounded cache does and the second is cold again.
    #[arg(long)]
    cache_mib: Option<usize>,
    /// Read ahead within each segment only, not on into the next: what reading ahead
    /// across segments gives is the difference.
    #[arg(long)]
    per_segment_read_ahead: bool,
}

/// Resident memory of this process, in MiB: `VmHWM` (the peak so far) or `VmRSS` (now).
fn rss_mib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib >> 10)
}

/// Writes one segment file from `base`, about `bytes` long; returns its end offset.
fn write_segment(path: &std::path::Path, base: u64, bytes: u64, value: &[u8]) -> u64 {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let (mut offset, mut written) = (base, 0u64);
    let recs: Vec<Rec<'_>> = (0..10)
        .map(|_| Rec {
            key: None,
            value: Some(value),
            timestamp_delta: 0,
        })
        .collect();
    while written < bytes {
        let raw = batch(1_700_000_000_000 + offset as i64, ProducerIds::NONE, &recs);
        f.write_all(&stamped_prefix(&raw, offset as i64, 1))
            .unwrap();
        f.write_all(&raw[STAMP_LEN..]).unwrap();
        written += raw.len() as u64;
        offset += 10;
    }
    f.flush().unwrap();
    offset
}

fn mb_per_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs / 1e6
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let store = strata_cold::store::open(&strata_cold::store::StoreConfig {
        url: args.url.clone(),
        endpoint: args.endpoint.clone(),
        path_style: args.path_style,
        ..Default::default()
    })?;
    std::fs::create_dir_all(&args.dir).context("creating --dir")?;
    let value = vec![b'v'; args.record_bytes];
    let run = uuid::Uuid::new_v4().simple().to_string();

    // Segment files, then their upload: partitions in parallel, segments in order.
    let mut files = Vec::new();
    for p in 0..args.partitions {
        let mut base = 0;
        let mut segs = Vec::new();
        for s in 0..args.segments {
            let log = args.dir.join(format!("{run}-{p}-{s}.log"));
            let end = write_segment(&log, base, args.segment_mib << 20, &value);
            segs.push(SealedSegment {
                base_offset: base,
                end_offset: end,
                log,
                producer_snapshot: None,
                epochs: vec![(1, base)],
                aborted: Vec::new(),
            });
            base = end;
        }
        files.push(segs);
    }
    let started = Instant::now();
    let uploads = files.iter().enumerate().map(|(p, segs)| {
        let up = Uploader::new(
            store.clone(),
            PartitionPrefix::new("bench", &run, p as u32),
            UploadConfig::default(),
        );
        async move {
            up.manifest().claim(1).await?;
            let mut bytes = 0u64;
            for s in segs {
                bytes += std::fs::metadata(&s.log)?.len();
                up.upload(1, s).await?;
            }
            let m = up.manifest().load().await?;
            anyhow::Ok((bytes, m.segments))
        }
    });
    let uploaded = futures_util::future::try_join_all(uploads).await?;
    let took = started.elapsed().as_secs_f64();
    let total: u64 = uploaded.iter().map(|(b, _)| b).sum();
    let segments: Vec<RemoteSegment> = uploaded.into_iter().flat_map(|(_, s)| s).collect();
    println!(
        "upload: {} segments, {:.1} MB in {took:.2} s: {:.1} MB/s ({} partitions in parallel)",
        segments.len(),
        total as f64 / 1e6,
        mb_per_s(total, took),
        args.partitions
    );
    println!(
        "memory after the upload: peak (VmHWM) {} MiB",
        rss_mib("VmHWM:").map_or("unknown".into(), |m| m.to_string())
    );
    for segs in &files {
        for s in segs {
            let _ = std::fs::remove_file(&s.log);
        }
    }

    // The baseline: the same bytes by plain ranged GETs of the chunk size.
    let ranges: Vec<(Path, std::ops::Range<u64>)> = segments
        .iter()
        .flat_map(|s| {
            let path = Path::from(s.key.as_str());
            (0..s.size_bytes)
                .step_by(args.chunk_bytes as usize)
                .map(move |at| (path.clone(), at..(at + args.chunk_bytes).min(s.size_bytes)))
        })
        .collect();
    let started = Instant::now();
    for (path, r) in &ranges {
        store.get_range(path, r.clone()).await?;
    }
    let serial = started.elapsed().as_secs_f64();
    use futures_util::StreamExt;
    let started = Instant::now();
    // Each GET's bytes dropped as it lands, as the serial loop does: collecting them would
    // hold the whole history in memory and make it this binary's peak.
    let mut fetched = futures_util::stream::iter(ranges.iter())
        .map(|(path, r)| store.get_range(path, r.clone()))
        .buffered(args.read_concurrency);
    while let Some(f) = fetched.next().await {
        f?;
    }
    let parallel = started.elapsed().as_secs_f64();
    println!(
        "plain ranged GET, {} KiB chunks: one at a time {:.1} MB/s; {} at once {:.1} MB/s",
        args.chunk_bytes >> 10,
        mb_per_s(total, serial),
        args.read_concurrency,
        mb_per_s(total, parallel)
    );

    // What the replay starts from: memory the upload and the baseline left resident.
    println!(
        "memory before the replay: now (VmRSS) {} MiB",
        rss_mib("VmRSS:").map_or("unknown".into(), |m| m.to_string())
    );

    // Replay through the reader, as a consumer: fetch after fetch, segment after segment.
    let cache_bytes = args
        .cache_mib
        .map_or((total as usize).max(64 << 20) * 2, |m| m << 20);
    let reader = RemoteReader::open(
        store.clone(),
        ReadConfig {
            chunk_size: args.chunk_bytes,
            cache_bytes,
            max_concurrent_reads: args.read_concurrency,
            ..ReadConfig::default()
        },
    )
    .await?;
    for pass in ["empty cache", "warm cache"] {
        let (h0, m0, f0, c0, b0) = (
            reader.stats.hits.load(Relaxed),
            reader.stats.misses.load(Relaxed),
            reader.stats.bytes_fetched.load(Relaxed),
            reader.stats.copied_replies.load(Relaxed),
            reader.buffers_allocated(),
        );
        let (k0, r0) = (
            reader.stats.checked_on_fetch.load(Relaxed),
            reader.stats.checked_on_read.load(Relaxed),
        );
        let mut replies = 0u64;
        let started = Instant::now();
        let (mut bytes, mut records) = (0u64, 0u64);
        for (i, seg) in segments.iter().enumerate() {
            // The partition's next segment, as a broker's fetch or the replay passes it.
            let next = segments
                .get(i + 1)
                .filter(|n| n.base_offset == seg.end_offset && !args.per_segment_read_ahead);
            let mut at = seg.base_offset;
            while at < seg.end_offset {
                let got = reader.read_then(seg, at, args.fetch_bytes, next).await?;
                anyhow::ensure!(!got.is_empty(), "nothing at offset {at} of {}", seg.key);
                bytes += got.len() as u64;
                replies += 1;
                for b in BatchIter::new(&got) {
                    let (h, _) = b?;
                    records += h.record_count as u64;
                    at = h.last_offset() as u64 + 1;
                }
            }
        }
        let took = started.elapsed().as_secs_f64();
        let hits = reader.stats.hits.load(Relaxed) - h0;
        let misses = reader.stats.misses.load(Relaxed) - m0;
        let fetched = reader.stats.bytes_fetched.load(Relaxed) - f0;
        let copied = reader.stats.copied_replies.load(Relaxed) - c0;
        let allocated = reader.buffers_allocated() - b0;
        let on_fetch = reader.stats.checked_on_fetch.load(Relaxed) - k0;
        let on_read = reader.stats.checked_on_read.load(Relaxed) - r0;
        println!(
            "cold replay, {pass}: {records} records, {:.1} MB/s, {:.0} records/s = {:.2}x one-at-a-time GET, {:.2}x {} at once; \
             chunk cache hit ratio {:.1}% ({hits} hits, {misses} fetched or waited for; {:.1} MB fetched)",
            mb_per_s(bytes, took),
            records as f64 / took,
            serial / took,
            parallel / took,
            args.read_concurrency,
            100.0 * hits as f64 / (hits + misses).max(1) as f64,
            fetched as f64 / 1e6,
        );
        println!(
            "  {replies} replies, {copied} of them copied out of two chunks (a first batch across a boundary); \
             {allocated} chunk buffers allocated (other GETs read into recycled ones)"
        );
        println!(
            "  CRC-checked: {:.1} MB right after the GET (blocking pool), {:.1} MB by the consumer's read",
            on_fetch as f64 / 1e6,
            on_read as f64 / 1e6
        );
        println!(
            "memory after the pass: now (VmRSS) {} MiB (of it file pages mapped, RssFile: {} MiB), peak (VmHWM) {} MiB",
            rss_mib("VmRSS:").map_or("unknown".into(), |m| m.to_string()),
            rss_mib("RssFile:").map_or("unknown".into(), |m| m.to_string()),
            rss_mib("VmHWM:").map_or("unknown".into(), |m| m.to_string())
        );
    }
    println!(
        "peak memory (VmHWM): {} MiB; chunk cache {} MiB",
        rss_mib("VmHWM:").map_or("unknown".into(), |m| m.to_string()),
        cache_bytes >> 20
    );
    Ok(())
}
