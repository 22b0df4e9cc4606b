//! A consumer that costs almost nothing, so that a benchmark measures the broker's fetch
//! path: raw Fetch requests (v12), one in flight on one connection as a Kafka consumer has
//! per broker, counting record batches without decoding their records. Used by
//! `bench/consume_bench.py`; prints one JSON line.
//!
//!     cargo build --release -p strata-hot --example fetch_load
//!     # read every partition of a topic from offset 0 to the end it had at the start
//!     target/release/examples/fetch_load catch-up --bootstrap 127.0.0.1:9092 --topic t \
//!         --partitions 1 [--sessions]
//!     # follow a topic's end for a while (with or without a fetch session, KIP-227)
//!     target/release/examples/fetch_load follow --bootstrap 127.0.0.1:9092 --topic t \
//!         --partitions 600 --seconds 10 [--sessions]
//!     # the same bytes read from the segment files (what the page cache gives)
//!     target/release/examples/fetch_load plain-read --dir <data_dir>/logs/t-0

use std::collections::HashMap;
use std::io::Read;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use clap::{Parser, Subcommand};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic};
use kafka_protocol::messages::{
    ApiKey, FetchRequest, FetchResponse, RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const VERSION: i16 = 12;

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(clap::Args)]
struct Fetching {
    #[arg(long)]
    bootstrap: String,
    #[arg(long)]
    topic: String,
    #[arg(long, default_value_t = 1)]
    partitions: i32,
    /// Use an incremental fetch session (KIP-227): after the first request, only the
    /// partitions whose position moved are sent, and only changed ones answered.
    #[arg(long)]
    sessions: bool,
    #[arg(long, default_value_t = 50 << 20)]
    max_bytes: i32,
    #[arg(long, default_value_t = 8 << 20)]
    partition_max_bytes: i32,
    #[arg(long, default_value_t = 500)]
    max_wait_ms: i32,
}

#[derive(Subcommand)]
enum Mode {
    /// Fetch every partition from offset 0 up to the end it had at the start.
    CatchUp {
        #[command(flatten)]
        fetch: Fetching,
    },
    /// Fetch from each partition's end for `seconds`.
    Follow {
        #[command(flatten)]
        fetch: Fetching,
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
    },
    /// Read the `*.log` files of a directory with 1 MiB reads.
    PlainRead {
        #[arg(long)]
        dir: PathBuf,
    },
}

struct Conn {
    stream: tokio::net::TcpStream,
    correlation: i32,
    sent_bytes: u64,
    received_bytes: u64,
    /// The last response's buffer, read into again once its response is dropped (a consumer
    /// keeps its receive buffer; a fresh 8 MiB one per response faulted in 2,048 new pages
    /// each time, the client's CPU on the broker's two cores).
    last: Option<Bytes>,
}

impl Conn {
    async fn fetch(&mut self, req: &FetchRequest) -> anyhow::Result<FetchResponse> {
        self.correlation += 1;
        let header = RequestHeader::default()
            .with_request_api_key(ApiKey::Fetch as i16)
            .with_request_api_version(VERSION)
            .with_correlation_id(self.correlation)
            .with_client_id(Some(StrBytes::from_static_str("fetch-load")));
        let mut body = BytesMut::new();
        header.encode(&mut body, FetchRequest::header_version(VERSION))?;
        req.encode(&mut body, VERSION)?;
        let mut frame = BytesMut::with_capacity(body.len() + 4);
        frame.put_i32(body.len() as i32);
        frame.put_slice(&body);
        self.stream.write_all(&frame).await?;
        self.sent_bytes += frame.len() as u64;
        let len = self.stream.read_i32().await?;
        if !(4..=256 << 20).contains(&len) {
            bail!("response frame of {len} bytes");
        }
        let mut buf = match self.last.take().map(Bytes::try_into_mut) {
            Some(Ok(mut reused)) => {
                reused.clear();
                reused.reserve(len as usize);
                reused
            }
            _ => BytesMut::with_capacity(len as usize),
        };
        while buf.len() < len as usize {
            if self.stream.read_buf(&mut buf).await? == 0 {
                bail!("the broker closed the connection");
            }
        }
        self.received_bytes += 4 + len as u64;
        let mut buf: Bytes = buf.freeze();
        self.last = Some(buf.clone());
        let h = ResponseHeader::decode(&mut buf, FetchResponse::header_version(VERSION))?;
        if h.correlation_id != self.correlation {
            bail!(
                "answer to request {} for {}",
                h.correlation_id,
                self.correlation
            );
        }
        let r = FetchResponse::decode(&mut buf, VERSION)?;
        if r.error_code != 0 {
            bail!("fetch failed with error {}", r.error_code);
        }
        Ok(r)
    }
}

/// Record batches in `records`: (batches, records, bytes, the offset after the last one).
fn walk(mut records: &[u8]) -> (u64, u64, u64, Option<i64>) {
    let (mut batches, mut count, mut bytes, mut next) = (0, 0, 0, None);
    while records.len() >= 61 {
        let base = (&records[0..8]).get_i64();
        let len = (&records[8..12]).get_i32() as usize + 12;
        if records.len() < len {
            break; // a partial batch at the end of a response
        }
        let last_delta = (&records[23..27]).get_i32();
        count += (&records[57..61]).get_i32() as u64;
        batches += 1;
        bytes += len as u64;
        next = Some(base + i64::from(last_delta) + 1);
        records = &records[len..];
    }
    (batches, count, bytes, next)
}

struct Fetcher<'a> {
    args: &'a Fetching,
    conn: Conn,
    offsets: Vec<i64>,
    /// Positions the broker's session already has (incremental fetches send only changes).
    sent: HashMap<i32, i64>,
    session: (i32, i32),
    requests: u64,
    records: u64,
    bytes: u64,
}

impl Fetcher<'_> {
    async fn round(&mut self) -> anyhow::Result<FetchResponse> {
        let a = self.args;
        let partitions = (0..a.partitions)
            .filter(|p| !a.sessions || self.sent.get(p) != Some(&self.offsets[*p as usize]))
            .map(|p| {
                FetchPartition::default()
                    .with_partition(p)
                    .with_fetch_offset(self.offsets[p as usize])
                    .with_partition_max_bytes(a.partition_max_bytes)
            })
            .collect::<Vec<_>>();
        let (session_id, epoch) = if a.sessions { self.session } else { (0, -1) };
        let req = FetchRequest::default()
            .with_replica_id((-1).into())
            .with_max_wait_ms(a.max_wait_ms)
            .with_min_bytes(1)
            .with_max_bytes(a.max_bytes)
            .with_session_id(session_id)
            .with_session_epoch(epoch)
            .with_forgotten_topics_data(Vec::<ForgottenTopic>::new())
            .with_topics(if partitions.is_empty() {
                vec![]
            } else {
                vec![FetchTopic::default()
                    .with_topic(TopicName(StrBytes::from_string(a.topic.clone())))
                    .with_partitions(partitions)]
            });
        let r = self.conn.fetch(&req).await?;
        self.requests += 1;
        if a.sessions {
            for p in 0..a.partitions {
                self.sent.insert(p, self.offsets[p as usize]);
            }
            self.session = (r.session_id, self.session.1 + 1);
        }
        for t in &r.responses {
            for p in &t.partitions {
                if p.error_code != 0 {
                    bail!(
                        "partition {} answered error {}",
                        p.partition_index,
                        p.error_code
                    );
                }
                let Some(records) = &p.records else { continue };
                let (_, n, bytes, next) = walk(records);
                self.records += n;
                self.bytes += bytes;
                if let Some(next) = next {
                    self.offsets[p.partition_index as usize] = next;
                }
            }
        }
        Ok(r)
    }
}

fn high_watermarks(r: &FetchResponse, ends: &mut [i64]) {
    for t in &r.responses {
        for p in &t.partitions {
            ends[p.partition_index as usize] = p.high_watermark;
        }
    }
}

impl<'a> Fetcher<'a> {
    async fn connect(args: &'a Fetching) -> anyhow::Result<Fetcher<'a>> {
        let stream = tokio::net::TcpStream::connect(&args.bootstrap)
            .await
            .with_context(|| format!("connecting to {}", args.bootstrap))?;
        stream.set_nodelay(true)?;
        Ok(Fetcher {
            args,
            conn: Conn {
                stream,
                correlation: 0,
                sent_bytes: 0,
                received_bytes: 0,
                last: None,
            },
            offsets: vec![0; args.partitions as usize],
            sent: HashMap::new(),
            session: (0, 0),
            requests: 0,
            records: 0,
            bytes: 0,
        })
    }
}

async fn fetching(a: &Fetching, follow: Option<f64>) -> anyhow::Result<()> {
    let mut f = Fetcher::connect(a).await?;
    // The ends: a fetch past every end answers OFFSET_OUT_OF_RANGE, so ask at 0 for nothing.
    let mut ends = vec![0i64; a.partitions as usize];
    {
        let probe = Fetching {
            sessions: false,
            max_wait_ms: 0,
            partition_max_bytes: 1,
            bootstrap: a.bootstrap.clone(),
            topic: a.topic.clone(),
            ..*a
        };
        let r = Fetcher::connect(&probe).await?.round().await?;
        high_watermarks(&r, &mut ends);
    }
    let started = Instant::now();
    match follow {
        None => {
            while f.offsets.iter().zip(&ends).any(|(o, e)| o < e) {
                f.round().await?;
            }
        }
        Some(seconds) => {
            f.offsets.copy_from_slice(&ends);
            let until = started + Duration::from_secs_f64(seconds);
            while Instant::now() < until {
                f.round().await?;
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{{\"records\": {}, \"bytes\": {}, \"seconds\": {seconds:.3}, \"requests\": {}, \"request_bytes\": {}, \"response_bytes\": {}, \"mb_per_s\": {:.1}}}",
        f.records,
        f.bytes,
        f.requests,
        f.conn.sent_bytes,
        f.conn.received_bytes,
        f.bytes as f64 / seconds / 1e6
    );
    Ok(())
}

fn plain_read(dir: &PathBuf) -> anyhow::Result<()> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    files.sort();
    let mut buf = vec![0u8; 1 << 20];
    let started = Instant::now();
    let mut bytes = 0u64;
    for path in &files {
        let mut f = std::fs::File::open(path)?;
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            bytes += n as u64;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{{\"bytes\": {bytes}, \"seconds\": {seconds:.3}, \"files\": {}, \"mb_per_s\": {:.1}}}",
        files.len(),
        bytes as f64 / seconds / 1e6
    );
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    match Args::parse().mode {
        Mode::CatchUp { fetch } => fetching(&fetch, None).await,
        Mode::Follow { fetch, seconds } => fetching(&fetch, Some(seconds)).await,
        Mode::PlainRead { dir } => plain_read(&dir),
    }
}
