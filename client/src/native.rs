//! The native Rust clients over the brokers' gRPC data plane: a leader-aware cluster view,
//! a batching producer (Kafka's murmur2 key partitioner, so it agrees with Kafka clients;
//! linger; idempotence) and a partition consumer. Both retry on NOT_LEADER_OR_FOLLOWER and
//! unknown-partition answers after refreshing metadata.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use kafka_protocol::records::RecordBatchDecoder;
use strata_core::batch::build::{batch, ProducerIds, Rec};
use strata_proto::v1::broker_client::BrokerClient;
use strata_proto::v1::{
    ClusterMetadataRequest, FetchRequest, InitProducerIdRequest, ListOffsetsRequest, ProduceRequest,
};
use tokio::sync::{mpsc, oneshot, Mutex};

use crate::{ClientError, Result};

mod group;
pub use group::{GroupConsumer, GroupConsumerConfig, OffsetReset};

const NOT_LEADER_OR_FOLLOWER: i32 = 6;
const UNKNOWN_TOPIC_OR_PARTITION: i32 = 3;
const LEADER_NOT_AVAILABLE: i32 = 5;
const REQUEST_TIMED_OUT: i32 = 7;
/// A broker's storage (or its cold tier) cannot answer for now.
const KAFKA_STORAGE_ERROR: i32 = 56;
/// The offset asked for is not known yet (a tiered partition whose manifest is not read).
const OFFSET_NOT_AVAILABLE: i32 = 78;

/// Kafka's murmur2 hash (as in `org.apache.kafka.common.utils.Utils.murmur2`).
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = SEED ^ (len as u32);
    let chunks = data.chunks_exact(4);
    let tail = chunks.remainder();
    for c in chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    match tail.len() {
        3 => {
            h ^= u32::from(tail[2]) << 16;
            h ^= u32::from(tail[1]) << 8;
            h ^= u32::from(tail[0]);
            h = h.wrapping_mul(M);
        }
        2 => {
            h ^= u32::from(tail[1]) << 8;
            h ^= u32::from(tail[0]);
            h = h.wrapping_mul(M);
        }
        1 => {
            h ^= u32::from(tail[0]);
            h = h.wrapping_mul(M);
        }
        _ => {}
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition Kafka's default partitioner picks for a keyed record.
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    ((murmur2(key) & 0x7fff_ffff) as u32) % partitions
}

fn broker_error(code: i32, message: String) -> ClientError {
    ClientError::Kafka {
        code: code as i16,
        message,
    }
}

/// A cluster view from any broker's gRPC endpoint: leaders per partition, refreshed on
/// demand, and one channel per broker.
pub struct Cluster {
    bootstrap: Vec<String>,
    state: Mutex<ClusterState>,
}

#[derive(Default)]
struct ClusterState {
    grpc_addr: HashMap<i32, String>,
    leaders: HashMap<String, Vec<Option<i32>>>,
    channels: HashMap<String, BrokerClient<crate::GrpcChannel>>,
}

async fn connect(addr: &str) -> Result<BrokerClient<crate::GrpcChannel>> {
    let channel = crate::grpc_channel(addr).await?;
    Ok(BrokerClient::new(channel).max_decoding_message_size(64 << 20))
}

impl Cluster {
    /// Connects to the first reachable bootstrap broker and reads the metadata.
    pub async fn connect(bootstrap: &[String]) -> Result<Arc<Cluster>> {
        let cluster = Arc::new(Cluster {
            bootstrap: bootstrap.to_vec(),
            state: Mutex::new(ClusterState::default()),
        });
        cluster.refresh().await?;
        Ok(cluster)
    }

    async fn channel(
        &self,
        state: &mut ClusterState,
        addr: &str,
    ) -> Result<BrokerClient<crate::GrpcChannel>> {
        if let Some(c) = state.channels.get(addr) {
            return Ok(c.clone());
        }
        let c = connect(addr).await?;
        state.channels.insert(addr.to_string(), c.clone());
        Ok(c)
    }

    /// Re-reads the metadata from any known or bootstrap broker.
    pub async fn refresh(&self) -> Result<()> {
        let mut state = self.state.lock().await;
        let mut candidates: Vec<String> = state.grpc_addr.values().cloned().collect();
        candidates.extend(self.bootstrap.iter().cloned());
        let mut last = ClientError::Protocol("no bootstrap brokers given".into());
        for addr in candidates {
            let mut client = match self.channel(&mut state, &addr).await {
                Ok(c) => c,
                Err(e) => {
                    last = e;
                    continue;
                }
            };
            match client
                .metadata(ClusterMetadataRequest { topics: vec![] })
                .await
            {
                Ok(resp) => {
                    let m = resp.into_inner();
                    state.grpc_addr = m
                        .brokers
                        .iter()
                        .filter(|b| b.grpc_port != 0)
                        .map(|b| (b.id, format!("{}:{}", b.host, b.grpc_port)))
                        .collect();
                    state.leaders = m
                        .topics
                        .into_iter()
                        .map(|t| (t.name, t.partitions.into_iter().map(|p| p.leader).collect()))
                        .collect();
                    return Ok(());
                }
                Err(status) => {
                    state.channels.remove(&addr);
                    last = status.into();
                }
            }
        }
        Err(last)
    }

    /// Number of partitions of `topic`.
    pub async fn partitions(&self, topic: &str) -> Result<u32> {
        if let Some(p) = self.state.lock().await.leaders.get(topic) {
            return Ok(p.len() as u32);
        }
        self.refresh().await?;
        self.state
            .lock()
            .await
            .leaders
            .get(topic)
            .map(|p| p.len() as u32)
            .ok_or_else(|| {
                broker_error(
                    UNKNOWN_TOPIC_OR_PARTITION,
                    format!("topic '{topic}' does not exist"),
                )
            })
    }

    /// The offset ListOffsets answers for a partition: `timestamp` -1 for its end, -2 for
    /// its start, or a time in ms.
    pub async fn list_offset(&self, topic: &str, partition: u32, timestamp: i64) -> Result<i64> {
        let r = self
            .leader(topic, partition)
            .await?
            .list_offsets(ListOffsetsRequest {
                topic: topic.to_string(),
                partition,
                timestamp,
            })
            .await?
            .into_inner();
        match r.error {
            Some(e) => Err(broker_error(e.code, e.message)),
            None => Ok(r.offset),
        }
    }

    /// A client for the current leader of a partition.
    async fn leader(
        &self,
        topic: &str,
        partition: u32,
    ) -> Result<BrokerClient<crate::GrpcChannel>> {
        let mut state = self.state.lock().await;
        let leader = state
            .leaders
            .get(topic)
            .and_then(|p| p.get(partition as usize).copied().flatten())
            .ok_or_else(|| {
                broker_error(
                    LEADER_NOT_AVAILABLE,
                    format!("no leader known for {topic}-{partition}"),
                )
            })?;
        let addr = state
            .grpc_addr
            .get(&leader)
            .cloned()
            .ok_or_else(|| ClientError::Protocol(format!("broker {leader} serves no gRPC")))?;
        self.channel(&mut state, &addr).await
    }

    /// A client for broker `id` (by its gRPC address in the metadata).
    pub(crate) async fn broker(&self, id: i32) -> Result<BrokerClient<crate::GrpcChannel>> {
        let known = self.state.lock().await.grpc_addr.get(&id).cloned();
        let addr = match known {
            Some(a) => a,
            None => {
                self.refresh().await?;
                self.state
                    .lock()
                    .await
                    .grpc_addr
                    .get(&id)
                    .cloned()
                    .ok_or_else(|| ClientError::Protocol(format!("broker {id} serves no gRPC")))?
            }
        };
        let mut state = self.state.lock().await;
        self.channel(&mut state, &addr).await
    }

    /// A client for any reachable broker.
    pub(crate) async fn any(&self) -> Result<BrokerClient<crate::GrpcChannel>> {
        let mut state = self.state.lock().await;
        let mut candidates: Vec<String> = state.grpc_addr.values().cloned().collect();
        candidates.extend(self.bootstrap.iter().cloned());
        let mut last = ClientError::Protocol("no bootstrap brokers given".into());
        for addr in candidates {
            match self.channel(&mut state, &addr).await {
                Ok(c) => return Ok(c),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Forgets a channel that failed, so the next call reconnects.
    pub(crate) async fn forget(&self) {
        self.state.lock().await.channels.clear();
    }

    /// Whether an error means "refresh metadata and try again".
    fn retriable(e: &ClientError) -> bool {
        matches!(e, ClientError::Kafka { code, .. } if [NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE, REQUEST_TIMED_OUT, KAFKA_STORAGE_ERROR, OFFSET_NOT_AVAILABLE].contains(&i32::from(*code)))
            || matches!(
                e,
                ClientError::Grpc { .. } | ClientError::Connect { .. } | ClientError::Io(_)
            )
    }
}

/// How a [`Producer`] batches and acknowledges.
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    pub acks: i16,
    pub linger: Duration,
    pub batch_records: usize,
    pub idempotent: bool,
    pub retries: usize,
    pub request_timeout: Duration,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        ProducerConfig {
            acks: -1,
            linger: Duration::from_millis(5),
            batch_records: 500,
            idempotent: true,
            retries: 20,
            request_timeout: Duration::from_secs(30),
        }
    }
}

/// Where a produced record landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    pub partition: u32,
    pub offset: i64,
}

struct Pending {
    key: Option<Bytes>,
    value: Bytes,
    done: oneshot::Sender<Result<Delivered>>,
}

/// A batching, leader-aware producer. Records of one partition are sent in order, one batch
/// in flight at a time; with idempotence a retried batch is deduplicated by the broker.
pub struct Producer {
    cluster: Arc<Cluster>,
    config: ProducerConfig,
    producer_id: (i64, i16),
    workers: Mutex<HashMap<(String, u32), mpsc::UnboundedSender<Pending>>>,
    round_robin: AtomicUsize,
}

impl Producer {
    pub async fn new(cluster: Arc<Cluster>, config: ProducerConfig) -> Result<Producer> {
        let producer_id = if config.idempotent {
            let addr = cluster.bootstrap.first().cloned().unwrap_or_default();
            let resp = connect(&addr)
                .await?
                .init_producer_id(InitProducerIdRequest {})
                .await
                .map_err(ClientError::from)?
                .into_inner();
            if let Some(e) = resp.error {
                return Err(broker_error(e.code, e.message));
            }
            (resp.producer_id, resp.producer_epoch as i16)
        } else {
            (-1, -1)
        };
        Ok(Producer {
            cluster,
            config,
            producer_id,
            workers: Mutex::new(HashMap::new()),
            round_robin: AtomicUsize::new(0),
        })
    }

    /// Queues a record; the returned receiver resolves once it is acknowledged (or failed).
    pub async fn send(
        &self,
        topic: &str,
        key: Option<Bytes>,
        value: Bytes,
    ) -> Result<oneshot::Receiver<Result<Delivered>>> {
        let partitions = self.cluster.partitions(topic).await?;
        let partition = match &key {
            Some(k) => partition_for_key(k, partitions),
            None => (self.round_robin.fetch_add(1, Ordering::Relaxed) % partitions as usize) as u32,
        };
        let (done, rx) = oneshot::channel();
        let mut workers = self.workers.lock().await;
        let worker = workers
            .entry((topic.to_string(), partition))
            .or_insert_with(|| {
                let (tx, queue) = mpsc::unbounded_channel();
                tokio::spawn(partition_worker(
                    self.cluster.clone(),
                    self.config.clone(),
                    self.producer_id,
                    topic.to_string(),
                    partition,
                    queue,
                ));
                tx
            });
        worker
            .send(Pending { key, value, done })
            .map_err(|_| ClientError::Protocol("the producer is shut down".into()))?;
        Ok(rx)
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

async fn partition_worker(
    cluster: Arc<Cluster>,
    config: ProducerConfig,
    (producer_id, producer_epoch): (i64, i16),
    topic: String,
    partition: u32,
    mut queue: mpsc::UnboundedReceiver<Pending>,
) {
    let mut sequence: i32 = 0;
    while let Some(first) = queue.recv().await {
        let mut pending = vec![first];
        let deadline = tokio::time::Instant::now() + config.linger;
        while pending.len() < config.batch_records {
            match tokio::time::timeout_at(deadline, queue.recv()).await {
                Ok(Some(p)) => pending.push(p),
                _ => break,
            }
        }
        let ids = if producer_id >= 0 {
            ProducerIds {
                producer_id,
                producer_epoch,
                base_sequence: sequence,
            }
        } else {
            ProducerIds::NONE
        };
        let recs: Vec<Rec<'_>> = pending
            .iter()
            .map(|p| Rec {
                key: p.key.as_deref(),
                value: Some(&p.value),
                timestamp_delta: 0,
            })
            .collect();
        let records = Bytes::from(batch(now_ms(), ids, &recs));
        let result = send_batch(&cluster, &config, &topic, partition, records).await;
        if result.is_ok() {
            sequence = strata_core::batch::wrapping_seq_add(sequence, pending.len() as i32);
        }
        for (i, p) in pending.into_iter().enumerate() {
            let _ = p.done.send(match &result {
                Ok(base) => Ok(Delivered {
                    partition,
                    offset: base + i as i64,
                }),
                Err(e) => Err(ClientError::Protocol(format!(
                    "batch to {topic}-{partition} failed: {e}"
                ))),
            });
        }
    }
}

/// Produces one RecordBatch v2 to a partition's leader with `config.acks`, retrying
/// retriable errors (a moved leader) up to `config.retries` times; returns its base offset.
/// With retries, an attempt whose answer was lost may have been written: pass 0 when a
/// duplicate is worse than a failure.
pub async fn send_batch(
    cluster: &Cluster,
    config: &ProducerConfig,
    topic: &str,
    partition: u32,
    records: Bytes,
) -> Result<i64> {
    let mut attempt = 0;
    loop {
        let result = async {
            let mut client = cluster.leader(topic, partition).await?;
            let resp = client
                .produce(ProduceRequest {
                    topic: topic.to_string(),
                    partition,
                    acks: i32::from(config.acks),
                    timeout_ms: config.request_timeout.as_millis() as u32,
                    records: records.to_vec(),
                })
                .await
                .map_err(ClientError::from)?
                .into_inner();
            match resp.error {
                Some(e) => Err(broker_error(e.code, e.message)),
                None => Ok(resp.base_offset),
            }
        }
        .await;
        match result {
            Err(e) if Cluster::retriable(&e) && attempt < config.retries => {
                attempt += 1;
                tokio::time::sleep(
                    Duration::from_millis(100 * attempt as u64).min(Duration::from_secs(1)),
                )
                .await;
                let _ = cluster.refresh().await;
            }
            other => return other,
        }
    }
}

/// A consumed record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumed {
    pub partition: u32,
    pub offset: i64,
    pub timestamp: i64,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
}

/// Reads assigned partitions from given offsets, following leaders.
pub struct Consumer {
    cluster: Arc<Cluster>,
    topic: String,
    positions: Vec<(u32, i64)>,
}

impl Consumer {
    /// Reads every partition of `topic` from `offset` (0 for the beginning).
    pub async fn from_offset(cluster: Arc<Cluster>, topic: &str, offset: i64) -> Result<Consumer> {
        let n = cluster.partitions(topic).await?;
        Ok(Consumer {
            cluster,
            topic: topic.to_string(),
            positions: (0..n).map(|p| (p, offset)).collect(),
        })
    }

    /// The next position of each partition.
    pub fn positions(&self) -> &[(u32, i64)] {
        &self.positions
    }

    /// One round of fetches over the assigned partitions, each waiting up to `max_wait`
    /// when empty. Returns the records (possibly none).
    pub async fn poll(&mut self, max_wait: Duration) -> Result<Vec<Consumed>> {
        let mut out = Vec::new();
        for i in 0..self.positions.len() {
            let (partition, offset) = self.positions[i];
            let (records, next) = match fetch_records(
                &self.cluster,
                &self.topic,
                partition,
                offset,
                max_wait,
            )
            .await
            {
                Ok(r) => r,
                Err(e) if Cluster::retriable(&e) => {
                    let _ = self.cluster.refresh().await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            self.positions[i].1 = next;
            out.extend(records);
        }
        Ok(out)
    }
}

/// Fetches the records of one partition from `offset` on its leader, and the offset to
/// fetch next, waiting up to `max_wait` when there are none yet.
pub(crate) async fn fetch_records(
    cluster: &Cluster,
    topic: &str,
    partition: u32,
    offset: i64,
    max_wait: Duration,
) -> Result<(Vec<Consumed>, i64)> {
    let mut client = cluster.leader(topic, partition).await?;
    let resp = client
        .fetch(FetchRequest {
            topic: topic.to_string(),
            partition,
            offset,
            max_bytes: 1 << 20,
            max_wait_ms: max_wait.as_millis() as u32,
        })
        .await
        .map_err(ClientError::from)?
        .into_inner();
    if let Some(e) = resp.error {
        return Err(broker_error(e.code, e.message));
    }
    let mut buf = Bytes::from(resp.records);
    // The next position, from the batch headers: a compacted batch may hold fewer records
    // than its offsets span, or none.
    let next = strata_core::batch::BatchIter::new(&buf)
        .filter_map(|r| r.ok())
        .map(|(h, _)| h.last_offset() + 1)
        .fold(offset, i64::max);
    let sets = decode_batches(&mut buf).map_err(|e| {
        ClientError::Protocol(format!("undecodable records from {topic}-{partition}: {e}"))
    })?;
    let mut out = Vec::new();
    for set in sets {
        for r in set.records {
            if r.offset < offset {
                continue;
            }
            out.push(Consumed {
                partition,
                offset: r.offset,
                timestamp: r.timestamp,
                key: r.key,
                value: r.value,
            });
        }
    }
    Ok((out, next))
}

/// Every record batch in `buf`, decoded by kafka-protocol but decompressed with
/// strata-core's bounded codecs: a batch is untrusted input (a bucket or a broker may hold
/// one written before brokers checked them), and kafka-protocol's own decompressors
/// allocate whatever a batch claims. At most [`strata_core::codec::MAX_DECOMPRESSED_BATCH`]
/// bytes per batch.
pub fn decode_batches(buf: &mut Bytes) -> anyhow::Result<Vec<kafka_protocol::records::RecordSet>> {
    use kafka_protocol::records::Compression as Wire;
    use strata_core::batch::Compression;
    let bounded = |body: &mut Bytes, codec: Wire| -> anyhow::Result<Bytes> {
        let codec = match codec {
            Wire::None => Compression::None,
            Wire::Gzip => Compression::Gzip,
            Wire::Snappy => Compression::Snappy,
            Wire::Lz4 => Compression::Lz4,
            Wire::Zstd => Compression::Zstd,
        };
        strata_core::codec::decompress_within(
            codec,
            body,
            strata_core::codec::MAX_DECOMPRESSED_BATCH,
        )
        .map(Bytes::from)
        .map_err(anyhow::Error::msg)
    };
    let mut sets = Vec::new();
    while bytes::Buf::has_remaining(buf) {
        sets.push(RecordBatchDecoder::decode_with_custom_compression(
            buf,
            Some(bounded),
        )?);
    }
    Ok(sets)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kafka's own test vectors for `Utils.murmur2`.
    #[test]
    fn murmur2_matches_kafka() {
        let cases: &[(&[u8], i32)] = &[
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ];
        for (input, expected) in cases {
            assert_eq!(
                murmur2(input),
                *expected,
                "{}",
                String::from_utf8_lossy(input)
            );
        }
    }
}
