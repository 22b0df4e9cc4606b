//! strata-kafka-load: a fixed-rate load generator on librdkafka (the client most of our
//! users run), for latency figures the client does not distort.
//!
//! It produces `--rate` records per second of `--size` bytes with keys over the topic's
//! partitions, and consumes them in the same process. Each record carries the time it was
//! due to be sent, so:
//! - produce-to-ack latency runs from when a record was *due* to its delivery report (a
//!   generator that falls behind shows it, instead of hiding the wait: no coordinated
//!   omission);
//! - produce-to-consume latency runs from the same point to the consumer's poll.
//!
//! Both go to HDR histograms (p50, p99, p99.9, max). With `--broker-pid`, the CPU seconds
//! each broker process used during the measured window (from /proc) are reported per
//! million records, and the generator's own CPU, to show it was not the bottleneck.
//!
//! librdkafka's own statistics (`statistics.interval.ms`, `--stats-ms`) show where a
//! record's time went on the client's side, per broker: `int_latency` (a record waiting in
//! its partition's queue for a request: linger, and requests that cannot be sent yet),
//! `outbuf_latency` (a built request waiting to be sent: the in-flight limit) and `rtt` (a
//! request's round trip to the broker), with the Produce requests sent and the records each
//! carried.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Parser;
use hdrhistogram::Histogram;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::statistics::{Statistics, Window};
use rdkafka::{Offset, TopicPartitionList};

#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Kafka bootstrap servers.
    #[arg(long, default_value = "127.0.0.1:9092")]
    bootstrap: String,
    /// Topic to write (created with --partitions and --replication if it does not exist).
    #[arg(long, default_value = "kafka-load")]
    topic: String,
    #[arg(long, default_value_t = 12)]
    partitions: i32,
    #[arg(long, default_value_t = 3)]
    replication: i32,
    /// Records offered per second.
    #[arg(long, default_value_t = 10_500)]
    rate: u64,
    /// Measured seconds (after the warm-up).
    #[arg(long, default_value_t = 30.0)]
    seconds: f64,
    /// Seconds of load before measuring starts (connections, leaders, page cache).
    #[arg(long, default_value_t = 3.0)]
    warmup: f64,
    /// Record value size in bytes (at least 16).
    #[arg(long, default_value_t = 800)]
    size: usize,
    /// Distinct keys, spread over the partitions by the client's partitioner.
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// Producer acks: all, 1 or 0.
    #[arg(long, default_value = "all")]
    acks: String,
    /// Producer linger.ms (librdkafka's default is 5).
    #[arg(long, default_value_t = 0)]
    linger_ms: u64,
    /// A broker process whose CPU to report (repeatable).
    #[arg(long = "broker-pid")]
    broker_pids: Vec<u32>,
    /// Extra librdkafka settings for both clients, key=value (repeatable).
    #[arg(long = "set")]
    set: Vec<String>,
    /// Produce only (no produce-to-consume figure).
    #[arg(long)]
    no_consume: bool,
    /// Also write the figures here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// librdkafka's statistics interval (ms) for the per-broker client-side figures; 0 off.
    #[arg(long, default_value_t = 1000)]
    stats_ms: u64,
}

/// What rides with each record to its delivery report: when it was due (ns since `base`).
struct Due(u64);

struct Reports {
    base: Instant,
    measure_from_ns: u64,
    /// Set when the measured window ends: later statistics are not counted.
    measured: AtomicBool,
    acked: Mutex<Histogram<u64>>,
    delivered: AtomicU64,
    failed: AtomicU64,
    first_error: Mutex<Option<String>>,
    /// librdkafka's statistics over the measured window, by broker id.
    client_view: Mutex<HashMap<i32, BrokerView>>,
}

/// One broker's statistics windows (µs) and Produce request counts, as librdkafka saw them.
#[derive(Default)]
struct BrokerView {
    rtt: Vec<(i64, i64)>,
    int_latency: Vec<(i64, i64)>,
    outbuf_latency: Vec<(i64, i64)>,
    /// Produce requests sent, at the first and the last statistics of the window.
    produce_requests: Option<(i64, i64)>,
    /// Records sent to the partitions it leads, at the same two points.
    records_sent: Option<(u64, u64)>,
    /// Records in flight or waiting to be sent, the most seen.
    queued_max: i64,
}

impl ClientContext for Reports {
    fn stats(&self, stats: Statistics) {
        let now = self.base.elapsed().as_nanos() as u64;
        if now < self.measure_from_ns || self.measured.load(Ordering::Relaxed) {
            return;
        }
        let mut sent_to = HashMap::<i32, u64>::new();
        for p in stats.topics.values().flat_map(|t| t.partitions.values()) {
            *sent_to.entry(p.leader).or_default() += p.txmsgs;
        }
        let mut view = self.client_view.lock().unwrap_or_else(|e| e.into_inner());
        for b in stats.brokers.values().filter(|b| b.nodeid >= 0) {
            let v = view.entry(b.nodeid).or_default();
            let push = |into: &mut Vec<(i64, i64)>, w: &Option<Window>| {
                if let Some(w) = w.as_ref().filter(|w| w.cnt > 0) {
                    into.push((w.p50, w.p99));
                }
            };
            push(&mut v.rtt, &b.rtt);
            push(&mut v.int_latency, &b.int_latency);
            push(&mut v.outbuf_latency, &b.outbuf_latency);
            let produced = b.req.get("Produce").copied().unwrap_or(0);
            let first = v.produce_requests.map_or(produced, |(first, _)| first);
            v.produce_requests = Some((first, produced));
            let records = sent_to.get(&b.nodeid).copied().unwrap_or(0);
            let first = v.records_sent.map_or(records, |(first, _)| first);
            v.records_sent = Some((first, records));
            v.queued_max = v.queued_max.max(b.outbuf_msg_cnt + b.waitresp_msg_cnt);
        }
    }
}

/// The median of the windows' p50s and the largest p99, in ms.
fn windows_ms(windows: &[(i64, i64)]) -> (f64, f64) {
    if windows.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let mut p50: Vec<i64> = windows.iter().map(|w| w.0).collect();
    p50.sort_unstable();
    let p99 = windows.iter().map(|w| w.1).max().unwrap_or(0);
    (p50[p50.len() / 2] as f64 / 1000.0, p99 as f64 / 1000.0)
}

impl ProducerContext for Reports {
    type DeliveryOpaque = Box<Due>;

    fn delivery(&self, result: &DeliveryResult<'_>, due: Box<Due>) {
        match result {
            Ok(_) => {
                self.delivered.fetch_add(1, Ordering::Relaxed);
                if due.0 >= self.measure_from_ns {
                    let now = self.base.elapsed().as_nanos() as u64;
                    let us = now.saturating_sub(due.0) / 1_000;
                    let mut h = self.acked.lock().unwrap_or_else(|e| e.into_inner());
                    h.saturating_record(us.max(1));
                }
            }
            Err((e, _)) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                let mut first = self.first_error.lock().unwrap_or_else(|e| e.into_inner());
                first.get_or_insert_with(|| e.to_string());
            }
        }
    }
}

fn histogram() -> Histogram<u64> {
    // 1 µs .. 1 h at 3 significant digits
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

/// (user + system) CPU seconds a process used so far, from /proc/<pid>/stat.
fn cpu_seconds(pid: &str) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat (is process {pid} running?)"))?;
    // the command name (field 2) may hold spaces: count fields after its closing parenthesis
    let after = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("unexpected /proc stat format")?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // fields 14 and 15 of the file (utime, stime) are 11 and 12 after the name
    let ticks: f64 = fields
        .get(11..13)
        .context("unexpected /proc stat format")?
        .iter()
        .map(|f| f.parse::<f64>().unwrap_or(0.0))
        .sum();
    // USER_HZ: 100 on every Linux architecture we run on
    Ok(ticks / 100.0)
}

fn config(args: &Args) -> anyhow::Result<ClientConfig> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &args.bootstrap);
    for kv in &args.set {
        let (k, v) = kv
            .split_once('=')
            .with_context(|| format!("--set {kv}: expected key=value"))?;
        c.set(k, v);
    }
    Ok(c)
}

fn ensure_topic(args: &Args) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = config(args)?
        .create()
        .context("creating the admin client")?;
    let topic = NewTopic::new(
        &args.topic,
        args.partitions,
        TopicReplication::Fixed(args.replication),
    );
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results =
        futures_executor::block_on(admin.create_topics([&topic], &opts)).context("CreateTopics")?;
    for r in results {
        match r {
            Ok(_) => {}
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, e)) => bail!("creating topic {t}: {e}"),
        }
    }
    Ok(())
}

struct Percentiles {
    count: u64,
    p50: f64,
    p99: f64,
    p999: f64,
    max: f64,
}

fn percentiles(h: &Histogram<u64>) -> Percentiles {
    let ms = |us: u64| us as f64 / 1000.0;
    Percentiles {
        count: h.len(),
        p50: ms(h.value_at_quantile(0.50)),
        p99: ms(h.value_at_quantile(0.99)),
        p999: ms(h.value_at_quantile(0.999)),
        max: ms(h.max()),
    }
}

fn bar(done: f64, total: f64) -> String {
    let width = 30;
    let filled = ((done / total).clamp(0.0, 1.0) * width as f64) as usize;
    format!("[{}{}]", "=".repeat(filled), " ".repeat(width - filled))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.size < 16 {
        bail!("--size must be at least 16 (the record carries its due time and sequence)");
    }
    if args.rate == 0 || args.seconds <= 0.0 {
        bail!("--rate and --seconds must be above zero");
    }
    ensure_topic(&args)?;

    let base = Instant::now();
    let warmup = Duration::from_secs_f64(args.warmup);
    let measure = Duration::from_secs_f64(args.seconds);
    // the producer starts a second after `base` (the consumer is assigned by then)
    let start = base + Duration::from_secs(1);
    let measure_from = start + warmup;
    let end = measure_from + measure;
    let measure_from_ns = (measure_from - base).as_nanos() as u64;

    // the consumer: every partition, from its current end, no group
    let stop = Arc::new(AtomicBool::new(false));
    let consumed = Arc::new(Mutex::new(histogram()));
    let received = Arc::new(AtomicU64::new(0));
    let consumer_thread = if args.no_consume {
        None
    } else {
        let consumer: BaseConsumer = config(&args)?
            .set("group.id", "strata-kafka-load")
            .set("enable.auto.commit", "false")
            .set("fetch.wait.max.ms", "500")
            .create()
            .context("creating the consumer")?;
        // from each partition's end (librdkafka looks them up in one ListOffsets per
        // leader; one watermark query per partition took minutes at 3,000 partitions)
        let mut tpl = TopicPartitionList::new();
        for p in 0..args.partitions {
            tpl.add_partition_offset(&args.topic, p, Offset::End)?;
        }
        consumer.assign(&tpl).context("assigning the partitions")?;
        let (stop, consumed, received) = (stop.clone(), consumed.clone(), received.clone());
        Some(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match consumer.poll(Duration::from_millis(100)) {
                    Some(Ok(m)) => {
                        let now = base.elapsed().as_nanos() as u64;
                        received.fetch_add(1, Ordering::Relaxed);
                        let Some(v) = m.payload().filter(|v| v.len() >= 16) else {
                            continue;
                        };
                        let due = u64::from_be_bytes(v[..8].try_into().expect("8 bytes"));
                        if due >= measure_from_ns {
                            let us = now.saturating_sub(due) / 1_000;
                            consumed
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .saturating_record(us.max(1));
                        }
                    }
                    Some(Err(e)) => eprintln!("consumer: {e}"),
                    None => {}
                }
            }
        }))
    };

    let reports = Reports {
        base,
        measure_from_ns,
        measured: AtomicBool::new(false),
        acked: Mutex::new(histogram()),
        delivered: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        first_error: Mutex::new(None),
        client_view: Mutex::default(),
    };
    let producer: BaseProducer<Reports> = config(&args)?
        .set("acks", &args.acks)
        .set("enable.idempotence", "true")
        .set("linger.ms", args.linger_ms.to_string())
        .set("statistics.interval.ms", args.stats_ms.to_string())
        .create_with_context(reports)
        .context("creating the producer")?;

    let filler: Vec<u8> = (0..args.size)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761) as u8)
        .collect();
    let keys: Vec<String> = (0..args.keys).map(|k| format!("key-{k}")).collect();
    let interval = Duration::from_secs_f64(1.0 / args.rate as f64);
    while Instant::now() < start {
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut cpu0 = HashMap::<u32, f64>::new();
    let mut self_cpu0 = 0.0;
    let mut measuring = false;
    let mut sent: u64 = 0;
    let mut queue_full: u64 = 0;
    let mut last_progress = Instant::now();
    let mut value = filler.clone();
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        if !measuring && now >= measure_from {
            measuring = true;
            for &pid in &args.broker_pids {
                cpu0.insert(pid, cpu_seconds(&pid.to_string())?);
            }
            self_cpu0 = cpu_seconds("self")?;
        }
        let due = start + interval.mul_f64(sent as f64);
        if due > now {
            // serve delivery reports while waiting; librdkafka's poll counts whole
            // milliseconds, so the last one is slept (a spinning poll(0) would take a core)
            let wait = due - now;
            if wait >= Duration::from_millis(2) {
                producer.poll(wait - Duration::from_millis(1));
            } else {
                std::thread::sleep(wait);
            }
            continue;
        }
        let due_ns = (due - base).as_nanos() as u64;
        value[..8].copy_from_slice(&due_ns.to_be_bytes());
        value[8..16].copy_from_slice(&sent.to_be_bytes());
        let key = &keys[(sent % args.keys) as usize];
        let record = BaseRecord::with_opaque_to(&args.topic, Box::new(Due(due_ns)))
            .key(key.as_str())
            .payload(&value[..]);
        match producer.send(record) {
            Ok(()) => sent += 1,
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                queue_full += 1;
                producer.poll(Duration::from_millis(1));
            }
            Err((e, _)) => bail!("produce: {e}"),
        }
        producer.poll(Duration::ZERO);
        if last_progress.elapsed() >= Duration::from_secs(1) {
            last_progress = Instant::now();
            let t = now.saturating_duration_since(start).as_secs_f64();
            let total = (end - start).as_secs_f64();
            eprint!(
                "\r{} {:>5.1}/{:.0} s  sent {:>9}  acked {:>9}  consumed {:>9}{}",
                bar(t, total),
                t,
                total,
                sent,
                producer.context().delivered.load(Ordering::Relaxed),
                received.load(Ordering::Relaxed),
                if now < measure_from {
                    "  (warming up)"
                } else {
                    ""
                },
            );
        }
    }
    producer.context().measured.store(true, Ordering::Relaxed);
    let mut cpu = Vec::new();
    for &pid in &args.broker_pids {
        cpu.push((pid, cpu_seconds(&pid.to_string())? - cpu0[&pid]));
    }
    let self_cpu = cpu_seconds("self")? - self_cpu0;
    // the records still in flight get their reports; the consumer gets a moment to catch up
    let _ = producer.flush(Duration::from_secs(30));
    if let Some(t) = consumer_thread {
        let deadline = Instant::now() + Duration::from_secs(10);
        while received.load(Ordering::Relaxed) < sent && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.store(true, Ordering::Relaxed);
        let _ = t.join();
    }
    eprintln!();

    let r = producer.context();
    let acked = percentiles(&r.acked.lock().unwrap_or_else(|e| e.into_inner()));
    let e2e = percentiles(&consumed.lock().unwrap_or_else(|e| e.into_inner()));
    let measured_records = acked.count.max(1) as f64;
    let failed = r.failed.load(Ordering::Relaxed);
    let achieved = acked.count as f64 / args.seconds;

    println!(
        "offered {} msgs/s of {} B to {} ({} partitions), acks={}, linger.ms={}; measured {:.0} s after {:.0} s warm-up",
        args.rate, args.size, args.topic, args.partitions, args.acks, args.linger_ms, args.seconds, args.warmup
    );
    println!(
        "acked {:.0} msgs/s in the window; {} failed{}; {} sends waited for a full queue",
        achieved,
        failed,
        r.first_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|e| format!(" (first: {e})"))
            .unwrap_or_default(),
        queue_full
    );
    println!(
        "{:<22} {:>9} {:>9} {:>9} {:>9}",
        "latency (ms)", "p50", "p99", "p99.9", "max"
    );
    println!(
        "{:<22} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
        "produce-to-ack", acked.p50, acked.p99, acked.p999, acked.max
    );
    if !args.no_consume {
        println!(
            "{:<22} {:>9.2} {:>9.2} {:>9.2} {:>9.2}  ({} records)",
            "produce-to-consume", e2e.p50, e2e.p99, e2e.p999, e2e.max, e2e.count
        );
    }
    for (pid, s) in &cpu {
        println!(
            "broker pid {pid}: {s:.2} CPU s, {:.1} CPU s per million records",
            s / measured_records * 1e6
        );
    }
    println!(
        "this generator: {self_cpu:.2} CPU s ({:.1} per million records)",
        self_cpu / measured_records * 1e6
    );
    let view = r.client_view.lock().unwrap_or_else(|e| e.into_inner());
    let mut brokers: Vec<_> = view.iter().collect();
    brokers.sort_by_key(|(id, _)| **id);
    let mut client_json = Vec::new();
    if !brokers.is_empty() {
        println!(
            "librdkafka's view (ms; median of the {} ms windows' p50 / their worst p99):",
            args.stats_ms
        );
        println!(
            "{:<8} {:>17} {:>17} {:>17} {:>13} {:>12} {:>11}",
            "broker",
            "queued (int)",
            "to send (outbuf)",
            "round trip (rtt)",
            "Produce/s",
            "records/req",
            "queued max"
        );
    }
    for (id, v) in brokers {
        let (int50, int99) = windows_ms(&v.int_latency);
        let (out50, out99) = windows_ms(&v.outbuf_latency);
        let (rtt50, rtt99) = windows_ms(&v.rtt);
        let requests = v.produce_requests.map_or(0, |(a, b)| b - a);
        let per_s = requests as f64 / args.seconds;
        let records = v.records_sent.map_or(0, |(a, b)| b - a);
        let records_per_request = records as f64 / requests.max(1) as f64;
        println!(
            "{id:<8} {int50:>8.2} /{int99:>7.2} {out50:>8.2} /{out99:>7.2} {rtt50:>8.2} /{rtt99:>7.2} {per_s:>13.0} {records_per_request:>12.2} {:>11}",
            v.queued_max
        );
        client_json.push(format!(
            "{{\"broker\":{id},\"int_latency_ms\":[{int50:.3},{int99:.3}],\"outbuf_latency_ms\":[{out50:.3},{out99:.3}],\"rtt_ms\":[{rtt50:.3},{rtt99:.3}],\"produce_per_s\":{per_s:.1},\"records_per_request\":{records_per_request:.3}}}"
        ));
    }
    drop(view);
    if let Some(path) = &args.json {
        let brokers: Vec<String> = cpu
            .iter()
            .map(|(pid, s)| format!("{{\"pid\":{pid},\"cpu_s\":{s:.3}}}"))
            .collect();
        let json = format!(
            "{{\"rate\":{},\"size\":{},\"partitions\":{},\"acks\":\"{}\",\"seconds\":{},\"acked_per_s\":{achieved:.1},\"failed\":{failed},\
             \"ack_ms\":{{\"p50\":{:.3},\"p99\":{:.3},\"p999\":{:.3},\"max\":{:.3},\"count\":{}}},\
             \"e2e_ms\":{{\"p50\":{:.3},\"p99\":{:.3},\"p999\":{:.3},\"max\":{:.3},\"count\":{}}},\
             \"brokers\":[{}],\"generator_cpu_s\":{self_cpu:.3},\"client_view\":[{}]}}\n",
            args.rate, args.size, args.partitions, args.acks, args.seconds,
            acked.p50, acked.p99, acked.p999, acked.max, acked.count,
            e2e.p50, e2e.p99, e2e.p999, e2e.max, e2e.count,
            brokers.join(","),
            client_json.join(",")
        );
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
    }
    if failed > 0 {
        bail!("{failed} records were not acknowledged");
    }
    Ok(())
}
