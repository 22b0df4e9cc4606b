//! The request path of an authenticating (SASL_PLAINTEXT) listener under random input: a
//! seeded generator sends hundreds of connections' worth of frames (well-formed and broken
//! SaslHandshake / SaslAuthenticate at every version, raw tokens after a v0 handshake,
//! other APIs, random bytes and lengths). The broker holds no credentials, so nothing may
//! authenticate: no request other than ApiVersions and the SASL ones is ever answered,
//! every connection ends, and the listener keeps serving. Set STRATA_SASL_FUZZ_SEED to
//! replay a seed, STRATA_SASL_FUZZ_CONNECTIONS for a longer run.

mod common;

use std::sync::Arc;
use std::time::Duration;

use strata_controller::metadata::ScramMechanism;
use strata_hot::broker::{Broker, SystemClock};
use strata_hot::kafka::sasl::Mechanism;
use strata_hot::kafka::SecurityProtocol;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// xorshift64*: small, seeded, reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

const SASL_HANDSHAKE: i16 = 17;
const SASL_AUTHENTICATE: i16 = 36;
const API_VERSIONS: i16 = 18;

/// A request frame: length, api key, version, correlation id, client id, body.
fn frame(key: i16, version: i16, correlation: i32, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&key.to_be_bytes());
    f.extend_from_slice(&version.to_be_bytes());
    f.extend_from_slice(&correlation.to_be_bytes());
    f.extend_from_slice(&4i16.to_be_bytes());
    f.extend_from_slice(b"fuzz");
    if (key == SASL_AUTHENTICATE && version >= 2) || (key == API_VERSIONS && version >= 3) {
        f.push(0); // flexible header: no tagged fields
    }
    f.extend_from_slice(body);
    let mut out = (f.len() as i32).to_be_bytes().to_vec();
    out.extend(f);
    out
}

fn string(s: &[u8]) -> Vec<u8> {
    let mut b = (s.len() as i16).to_be_bytes().to_vec();
    b.extend_from_slice(s);
    b
}

/// One connection's bytes, and the correlation ids of requests that must never be answered
/// (anything but ApiVersions and SASL, since nobody can log in).
fn connection(rng: &mut Rng) -> (Vec<u8>, Vec<i32>) {
    let mut out = Vec::new();
    let mut forbidden = Vec::new();
    for correlation in 0..(1 + rng.below(6) as i32) {
        match rng.below(8) {
            0 => out.extend(frame(API_VERSIONS, rng.below(4) as i16, correlation, &[])),
            1 | 2 => {
                let mech: &[u8] = match rng.below(5) {
                    0 => b"PLAIN",
                    1 => b"SCRAM-SHA-512",
                    2 => b"SCRAM-SHA-256",
                    3 => b"GSSAPI",
                    _ => b"",
                };
                out.extend(frame(
                    SASL_HANDSHAKE,
                    rng.below(2) as i16,
                    correlation,
                    &string(mech),
                ));
            }
            3 | 4 => {
                // SaslAuthenticate: PLAIN-shaped, SCRAM-shaped or random auth bytes
                let auth = match rng.below(3) {
                    0 => b"\0alice\0guess".to_vec(),
                    1 => format!("n,,n=alice,r={}", rng.next()).into_bytes(),
                    _ => {
                        let n = rng.below(64) as usize;
                        rng.bytes(n)
                    }
                };
                let version = rng.below(3) as i16;
                let body = if version >= 2 {
                    let mut b = vec![(auth.len() + 1) as u8]; // compact bytes (short)
                    b.extend(&auth);
                    b.push(0);
                    b
                } else {
                    let mut b = (auth.len() as i32).to_be_bytes().to_vec();
                    b.extend(&auth);
                    b
                };
                out.extend(frame(SASL_AUTHENTICATE, version, correlation, &body));
            }
            5 => {
                // another API before authentication: well-formed (Metadata of every topic,
                // ListGroups) or random (Produce, CreateTopics, ...)
                let (key, version, body): (i16, i16, Vec<u8>) = match rng.below(4) {
                    0 => (3, 1, vec![0xff; 4]),
                    1 => (3, 4, vec![0xff, 0xff, 0xff, 0xff, 0]),
                    2 => (16, rng.below(3) as i16, Vec::new()),
                    _ => {
                        let key = [0i16, 1, 19, 20, 32, 30][rng.below(6) as usize];
                        let n = rng.below(32) as usize;
                        (key, rng.below(4) as i16, rng.bytes(n))
                    }
                };
                out.extend(frame(key, version, correlation, &body));
                forbidden.push(correlation);
            }
            6 => {
                // a bare token, as after a v0 handshake, or a random length prefix
                let n = rng.below(48) as usize;
                out.extend((n as i32).to_be_bytes());
                out.extend(rng.bytes(n));
            }
            _ => {
                let n = rng.below(24) as usize;
                out.extend(rng.bytes(n));
            }
        }
    }
    (out, forbidden)
}

/// The correlation ids of the responses in `bytes` (responses are length-prefixed, the id
/// first).
fn answered(mut bytes: &[u8]) -> Vec<i32> {
    let mut ids = Vec::new();
    while bytes.len() >= 8 {
        let len = i32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize;
        ids.push(i32::from_be_bytes(bytes[4..8].try_into().unwrap()));
        bytes = &bytes[(4 + len).min(bytes.len())..];
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_input_on_a_sasl_listener_never_gets_past_authentication() {
    let seed: u64 = std::env::var("STRATA_SASL_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    let connections: usize = std::env::var("STRATA_SASL_FUZZ_CONNECTIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    println!("seed {seed} (replay with STRATA_SASL_FUZZ_SEED={seed})");
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::open(
        common::broker_config(dir.path()),
        Arc::new(SystemClock),
        None,
    )
    .await
    .unwrap();
    let (addr, _stop) = common::serve_kafka_as(
        broker,
        SecurityProtocol::SaslPlaintext,
        vec![
            Mechanism::Scram(ScramMechanism::Sha512),
            Mechanism::Scram(ScramMechanism::Sha256),
            Mechanism::Plain,
        ],
    )
    .await;
    let mut rng = Rng(seed);
    let (mut responses, mut refused) = (0usize, 0usize);
    for i in 0..connections {
        let (bytes, forbidden) = connection(&mut rng);
        let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
        // the broker may close mid-write: that is an answer too
        let _ = conn.write_all(&bytes).await;
        let _ = conn.shutdown().await;
        let mut got = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut got)).await;
        assert!(
            read.is_ok(),
            "seed {seed}, connection {i}: still open 5 s after the input ended"
        );
        let ids = answered(&got);
        responses += ids.len();
        refused += forbidden.len();
        for id in ids {
            assert!(
                !forbidden.contains(&id),
                "seed {seed}, connection {i}: request {id} was answered before authentication"
            );
        }
    }
    println!("{connections} connections: {responses} responses, {refused} requests that had to go unanswered");
    // the input reached the SASL code, not only the frame checks
    assert!(
        responses > connections / 4,
        "only {responses} responses: the generator is off"
    );
    assert!(refused > 0);
    // still serving
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    conn.write_all(&frame(API_VERSIONS, 0, 7, &[]))
        .await
        .unwrap();
    let mut len = [0u8; 4];
    conn.read_exact(&mut len).await.unwrap();
    assert!(i32::from_be_bytes(len) > 0);
}
