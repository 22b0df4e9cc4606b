//! A produce load that is cheap to generate: the same prebuilt record batch sent over and
//! over in pipelined Produce requests on one connection, PLAINTEXT or TLS, with or without a
//! SASL/SCRAM login, so that the broker, not the client, is what a benchmark measures.
//! (librdkafka from Python spends four to ten times the broker's CPU per byte; on a 2-core
//! machine it hides what the broker's TLS costs.) Used by `bench/security_bench.py
//! --client rust`; prints one JSON line.
//!
//!     cargo build --release -p strata-hot --example produce_load
//!     target/release/examples/produce_load --bootstrap 127.0.0.1:9092 --topic bench \
//!         [--tls-ca ca.pem --sasl-user U --sasl-password P] [--seconds 8]

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::{BufMut, BytesMut};
use clap::Parser;
use strata_controller::metadata::ScramMechanism;
use strata_core::batch::build::{batch, ProducerIds, Rec};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

#[derive(Parser)]
struct Args {
    #[arg(long)]
    bootstrap: String,
    #[arg(long)]
    topic: String,
    #[arg(long, default_value_t = 0)]
    partition: i32,
    #[arg(long, default_value_t = 8.0)]
    seconds: f64,
    #[arg(long, default_value_t = 800)]
    record_bytes: usize,
    /// Records per batch (one batch per request).
    #[arg(long, default_value_t = 1000)]
    batch_records: usize,
    /// Requests in flight on the connection.
    #[arg(long, default_value_t = 5)]
    in_flight: usize,
    #[arg(long, default_value_t = -1)]
    acks: i16,
    /// The CA that signed the broker's certificate: connect with TLS.
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// Log in with SASL SCRAM-SHA-512 as this user.
    #[arg(long)]
    sasl_user: Option<String>,
    #[arg(long, default_value = "")]
    sasl_password: String,
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

fn header(out: &mut BytesMut, api_key: i16, version: i16, correlation: i32) {
    out.put_i16(api_key);
    out.put_i16(version);
    out.put_i32(correlation);
    out.put_i16(12);
    out.put_slice(b"produce-load");
}

fn framed(body: BytesMut) -> BytesMut {
    let mut f = BytesMut::with_capacity(body.len() + 4);
    f.put_i32(body.len() as i32);
    f.put_slice(&body);
    f
}

async fn read_frame(rd: &mut (impl AsyncRead + Unpin)) -> io::Result<Vec<u8>> {
    let len = rd.read_i32().await?;
    if !(4..=64 << 20).contains(&len) {
        return Err(io::Error::other(format!("response frame of {len} bytes")));
    }
    let mut buf = vec![0u8; len as usize];
    rd.read_exact(&mut buf).await?;
    Ok(buf)
}

/// Reads a big-endian i16 at `at` of a response, or says where it ran out.
fn i16_at(buf: &[u8], at: usize) -> anyhow::Result<i16> {
    let b = buf
        .get(at..at + 2)
        .context("response shorter than its fields")?;
    Ok(i16::from_be_bytes([b[0], b[1]]))
}

/// SaslHandshake v1 and SaslAuthenticate v1 with SCRAM-SHA-512.
async fn login(s: &mut impl Io, user: &str, password: &str) -> anyhow::Result<()> {
    let mechanism = b"SCRAM-SHA-512";
    let mut b = BytesMut::new();
    header(&mut b, 17, 1, 1);
    b.put_i16(mechanism.len() as i16);
    b.put_slice(mechanism);
    s.write_all(&framed(b)).await?;
    let r = read_frame(s).await?;
    if i16_at(&r, 4)? != 0 {
        bail!(
            "SaslHandshake refused SCRAM-SHA-512 (error {})",
            i16_at(&r, 4)?
        );
    }
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let bare = format!("n={user},r={nonce}");
    let server_first = authenticate(s, 2, format!("n,,{bare}").as_bytes()).await?;
    let server_first = String::from_utf8(server_first).context("server-first is not UTF-8")?;
    let m = ScramMechanism::Sha512;
    let client_final =
        strata_hot::kafka::sasl::scram::client_final(m, password.as_bytes(), &bare, &server_first)?;
    authenticate(s, 3, client_final.as_bytes()).await?;
    Ok(())
}

/// One SaslAuthenticate v1 round: the server's bytes.
async fn authenticate(s: &mut impl Io, correlation: i32, bytes: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut b = BytesMut::new();
    header(&mut b, 36, 1, correlation);
    b.put_i32(bytes.len() as i32);
    b.put_slice(bytes);
    s.write_all(&framed(b)).await?;
    let r = read_frame(s).await?;
    // correlation id, error code, error message (nullable string), auth bytes
    let error = i16_at(&r, 4)?;
    let msg_len = i16_at(&r, 6)?.max(0) as usize;
    if error != 0 {
        let msg = r.get(8..8 + msg_len).unwrap_or_default();
        bail!(
            "SaslAuthenticate failed (error {error}): {}",
            String::from_utf8_lossy(msg)
        );
    }
    let at = 8 + msg_len;
    let len = r
        .get(at..at + 4)
        .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        .context("SaslAuthenticate response too short")?;
    Ok(r.get(at + 4..at + 4 + len.max(0) as usize)
        .context("SaslAuthenticate response too short")?
        .to_vec())
}

/// A Produce v7 request carrying `records` to one partition, as its body after the header.
fn produce_body(args: &Args, records: &[u8]) -> BytesMut {
    let mut b = BytesMut::new();
    b.put_i16(-1); // transactional id: null
    b.put_i16(args.acks);
    b.put_i32(30_000);
    b.put_i32(1);
    b.put_i16(args.topic.len() as i16);
    b.put_slice(args.topic.as_bytes());
    b.put_i32(1);
    b.put_i32(args.partition);
    b.put_i32(records.len() as i32);
    b.put_slice(records);
    b
}

/// The error code of the one partition a Produce v7 response answers.
fn produce_error(r: &[u8], topic_len: usize) -> anyhow::Result<i16> {
    // correlation id 4, topics count 4, name 2 + n, partitions count 4, index 4, error 2
    i16_at(r, 4 + 4 + 2 + topic_len + 4 + 4)
}

async fn run(mut s: Box<dyn Io>, args: &Args) -> anyhow::Result<(u64, f64)> {
    if let Some(user) = &args.sasl_user {
        login(&mut s, user, &args.sasl_password).await?;
    }
    let value = vec![b'x'; args.record_bytes];
    let recs: Vec<Rec<'_>> = (0..args.batch_records)
        .map(|i| Rec {
            key: None,
            value: Some(&value),
            timestamp_delta: i as i64,
        })
        .collect();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64;
    let records = batch(now_ms, ProducerIds::NONE, &recs);
    let body = produce_body(args, &records);
    let (mut rd, mut wr) = tokio::io::split(s);
    let slots = Arc::new(tokio::sync::Semaphore::new(args.in_flight));
    let deadline = Instant::now() + Duration::from_secs_f64(args.seconds);
    let started = Instant::now();
    let writer = {
        let slots = slots.clone();
        tokio::spawn(async move {
            let mut correlation = 100i32;
            let mut sent = 0u64;
            while Instant::now() < deadline {
                slots.acquire().await?.forget();
                let mut b = BytesMut::with_capacity(body.len() + 32);
                header(&mut b, 0, 7, correlation);
                b.put_slice(&body);
                wr.write_all(&framed(b)).await?;
                correlation += 1;
                sent += 1;
            }
            anyhow::Ok(sent)
        })
    };
    // Responses are read by a task of their own (a frame read is not cancel-safe).
    let (frames, mut responses) = tokio::sync::mpsc::channel::<io::Result<Vec<u8>>>(64);
    tokio::spawn(async move {
        loop {
            let r = read_frame(&mut rd).await;
            let failed = r.is_err();
            if frames.send(r).await.is_err() || failed {
                return;
            }
        }
    });
    let mut writer = writer;
    let (mut acked, mut sent) = (0u64, None);
    while sent != Some(acked) {
        tokio::select! {
            r = responses.recv() => {
                let r = r.context("the connection closed")??;
                let error = produce_error(&r, args.topic.len())?;
                if error != 0 {
                    bail!("produce failed with error {error}");
                }
                acked += 1;
                slots.add_permits(1);
            }
            w = &mut writer, if sent.is_none() => sent = Some(w??),
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    Ok((acked * args.batch_records as u64, elapsed))
}

async fn connect(args: &Args) -> anyhow::Result<Box<dyn Io>> {
    let tcp = tokio::net::TcpStream::connect(&args.bootstrap)
        .await
        .with_context(|| format!("connecting to {}", args.bootstrap))?;
    tcp.set_nodelay(true)?;
    let Some(ca) = &args.tls_ca else {
        return Ok(Box::new(tcp));
    };
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(ca)
        .with_context(|| format!("reading {}", ca.display()))?
    {
        roots.add(cert?)?;
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let host = args
        .bootstrap
        .rsplit_once(':')
        .map_or("localhost", |(h, _)| h);
    let name = rustls::pki_types::ServerName::try_from(host.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .context("TLS handshake")?;
    Ok(Box::new(tls))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // The broker's TLS provider, so both ends run the same AES-GCM code.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let s = connect(&args).await?;
    let (records, seconds) = run(s, &args).await?;
    println!(
        "{{\"acked\": {records}, \"seconds\": {seconds:.3}, \"msgs_per_s\": {:.0}, \"mb_per_s\": {:.1}}}",
        records as f64 / seconds,
        records as f64 * args.record_bytes as f64 / seconds / 1e6
    );
    Ok(())
}
