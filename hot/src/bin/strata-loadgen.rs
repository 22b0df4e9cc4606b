//! `strata-loadgen`: a fixed-rate producer in Rust (the native gRPC client), printing
//! produce-to-ack latency percentiles. The Python benchmarks drive librdkafka, whose Python
//! callbacks share the machine's cores with the brokers; this one measures the brokers with
//! a client that costs little CPU. Figures, not assertions.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use clap::Parser;
use strata_client::native::{Cluster, Producer, ProducerConfig};

#[derive(Parser)]
#[command(about = "Fixed-rate acks=all producer (native gRPC client); prints ack latency")]
struct Args {
    /// gRPC addresses of brokers (HOST:PORT, comma-separated).
    #[arg(long, value_delimiter = ',')]
    bootstrap: Vec<String>,
    #[arg(long)]
    topic: String,
    /// Records per second.
    #[arg(long, default_value_t = 10_500)]
    rate: u64,
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    #[arg(long, default_value_t = 800)]
    record_bytes: usize,
    /// acks: -1 (all), 1 or 0.
    #[arg(long, default_value_t = -1, allow_hyphen_values = true)]
    acks: i16,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(!args.bootstrap.is_empty(), "give --bootstrap HOST:PORT");
    let cluster = Cluster::connect(&args.bootstrap)
        .await
        .context("connecting to the brokers' gRPC listeners")?;
    let producer = Arc::new(
        Producer::new(
            cluster,
            ProducerConfig {
                acks: args.acks,
                linger: Duration::ZERO,
                idempotent: true,
                ..ProducerConfig::default()
            },
        )
        .await
        .context("starting the producer")?,
    );
    let value = Bytes::from(vec![b'x'; args.record_bytes]);
    // Warm up: metadata and connections to every leader.
    for i in 0..300u64 {
        let key = Bytes::from(format!("key-{}", i % 1000));
        let _ = producer
            .send(&args.topic, Some(key), value.clone())
            .await?
            .await;
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let start = Instant::now();
    let mut sent = 0u64;
    let interval = Duration::from_secs_f64(1.0 / args.rate as f64);
    while start.elapsed().as_secs_f64() < args.seconds {
        let due = (start.elapsed().as_secs_f64() * args.rate as f64) as u64;
        while sent < due {
            let key = Bytes::from(format!("key-{}", sent % 1000));
            let at = Instant::now();
            let ack = producer.send(&args.topic, Some(key), value.clone()).await?;
            let tx = tx.clone();
            tokio::spawn(async move {
                let ok = matches!(ack.await, Ok(Ok(_)));
                let _ = tx.send((ok, at.elapsed()));
            });
            sent += 1;
        }
        tokio::time::sleep(interval.min(Duration::from_micros(200))).await;
    }
    drop(tx);
    let mut latencies = Vec::with_capacity(sent as usize);
    let mut failed = 0u64;
    while let Some((ok, d)) = rx.recv().await {
        if ok {
            latencies.push(d);
        } else {
            failed += 1;
        }
    }
    let total = start.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "native client, {} msgs/s offered, {} B records, acks={}: {:.0} msgs/s acked, ack latency p50 {:.2} ms p99 {:.2} ms p999 {:.2} ms (acked {}/{}, failed {failed})",
        args.rate,
        args.record_bytes,
        args.acks,
        latencies.len() as f64 / total,
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.99)),
        ms(percentile(&latencies, 0.999)),
        latencies.len(),
        sent,
    );
    if failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}
