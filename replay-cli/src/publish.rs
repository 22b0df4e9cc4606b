//! Re-publishing archived records to a topic of a running cluster, over the Kafka protocol
//! or the brokers' gRPC data plane: partition p of the source goes to partition p of the
//! target, in offset order, as
//! RecordBatch v2 batches keeping each record's key, value, headers and timestamp
//! (CreateTime), one batch in flight per partition, with the chosen acks.
//!
//! Resumable: after every acknowledged batch a checkpoint file records, per partition, the
//! next source offset and the target's end offset then. On a rerun the target's end is
//! read again; records past the checkpoint's end were written by the run that was cut
//! short after its last checkpoint, so as many source records are skipped. Nothing is
//! lost or written twice, as long as only this replay writes to the target partitions.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::cluster::Cluster;
use crate::source::Record;
use anyhow::{bail, Context};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use strata_core::batch::build::{batch_with_headers, FullRec};

/// Per partition: where the source resumes and the target's end offset at that point.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    pub next_source_offset: u64,
    pub target_end: i64,
}

/// The checkpoint file: which replay it belongs to and each partition's position.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Checkpoint {
    pub source_topic: String,
    pub target_topic: String,
    pub partitions: BTreeMap<u32, Position>,
}

impl Checkpoint {
    pub fn load(path: &Path) -> anyhow::Result<Option<Checkpoint>> {
        match std::fs::read(path) {
            Ok(bytes) => Ok(Some(serde_json::from_slice(&bytes).with_context(|| {
                format!("{} is not a replay checkpoint", path.display())
            })?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(anyhow::Error::new(e).context(format!("reading {}", path.display()))),
        }
    }

    /// Writes it atomically (a temporary file renamed over the old one, synced).
    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        let tmp = path.with_extension("tmp");
        let body = serde_json::to_vec_pretty(self)?;
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)
                .with_context(|| format!("writing {}", tmp.display()))?;
            f.write_all(&body)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))?;
        Ok(())
    }
}

/// How the target cluster is reached.
enum Conn {
    Kafka(Cluster),
    Grpc {
        cluster: std::sync::Arc<strata_client::native::Cluster>,
        topic: String,
    },
}

/// The target topic on a running cluster.
pub struct Target {
    conn: Conn,
    pub partitions: u32,
    acks: i16,
    /// Records per second (`None`: as fast as the target takes them).
    rate: Option<f64>,
    started: std::time::Instant,
    sent: u64,
}

pub fn parse_acks(s: &str) -> anyhow::Result<i16> {
    Ok(match s {
        "all" | "-1" => -1,
        "1" => 1,
        "0" => 0,
        other => bail!("acks must be all, 1 or 0, not '{other}'"),
    })
}

const TARGET_HINT: &str =
    "the target topic (create it first, with at least as many partitions as the source)";

impl Target {
    /// The target through a broker's Kafka listener (`grpc`: false) or gRPC data plane.
    pub async fn connect(
        address: &str,
        grpc: bool,
        topic: &str,
        acks: i16,
        rate: Option<f64>,
    ) -> anyhow::Result<Target> {
        let (conn, partitions) = if grpc {
            let cluster = strata_client::native::Cluster::connect(&[address.to_string()])
                .await
                .with_context(|| format!("connecting to the gRPC data plane at {address}"))?;
            let partitions = cluster.partitions(topic).await.context(TARGET_HINT)?;
            let topic = topic.to_string();
            (Conn::Grpc { cluster, topic }, partitions)
        } else {
            let cluster = Cluster::connect(address, topic)
                .await
                .context(TARGET_HINT)?;
            let partitions = cluster.partitions;
            (Conn::Kafka(cluster), partitions)
        };
        Ok(Target {
            partitions,
            conn,
            acks,
            rate,
            started: std::time::Instant::now(),
            sent: 0,
        })
    }

    /// Records sent so far.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// The target partition's end offset (the next offset it will assign).
    pub async fn end(&mut self, partition: u32) -> anyhow::Result<i64> {
        let end = match &mut self.conn {
            Conn::Kafka(cluster) => {
                let topic = cluster.topic.clone();
                let conn = cluster.conn(partition).await?;
                strata_client::list_offset(conn, &topic, partition as i32, -1).await
            }
            Conn::Grpc { cluster, topic } => cluster.list_offset(topic, partition, -1).await,
        };
        end.with_context(|| format!("reading the end of target partition {partition}"))
    }

    /// Produces `records` (one partition's, in order) as one batch.
    pub async fn send(&mut self, partition: u32, records: &[Record]) -> anyhow::Result<()> {
        if let Some(rate) = self.rate {
            let due = self.started + std::time::Duration::from_secs_f64(self.sent as f64 / rate);
            tokio::time::sleep_until(due.into()).await;
        }
        let batch = encode(records)?;
        let acks = self.acks;
        match &mut self.conn {
            Conn::Kafka(cluster) => {
                let topic = cluster.topic.clone();
                let conn = cluster.conn(partition).await?;
                strata_client::produce(conn, topic.as_str(), partition as i32, batch, acks)
                    .await
                    .with_context(|| format!("producing to {topic} partition {partition}"))?;
            }
            Conn::Grpc { cluster, topic } => {
                // No retry: an attempt whose answer was lost may have been written, and
                // the checkpoint's rerun, not a blind retry, decides what to resend.
                let config = strata_client::native::ProducerConfig {
                    acks,
                    retries: 0,
                    ..Default::default()
                };
                strata_client::native::send_batch(cluster, &config, topic, partition, batch)
                    .await
                    .with_context(|| format!("producing to {topic} partition {partition}"))?;
            }
        }
        self.sent += records.len() as u64;
        Ok(())
    }
}

/// One RecordBatch v2 of `records`, with their keys, values, headers (in order, repeated
/// keys kept) and timestamps (CreateTime), uncompressed, without a producer id.
pub fn encode(records: &[Record]) -> anyhow::Result<Bytes> {
    if records.is_empty() {
        anyhow::bail!("no records to encode");
    }
    let recs: Vec<FullRec> = records
        .iter()
        .map(|r| FullRec {
            key: r.key.as_deref(),
            value: r.value.as_deref(),
            timestamp: r.timestamp,
            headers: r
                .headers
                .iter()
                .map(|(k, v)| (k.as_bytes(), v.as_deref()))
                .collect(),
        })
        .collect();
    Ok(Bytes::from(batch_with_headers(&recs)))
}

/// The checkpoint path and what it holds for this replay.
pub fn resume(path: &Option<PathBuf>, source: &str, target: &str) -> anyhow::Result<Checkpoint> {
    let Some(path) = path else {
        return Ok(Checkpoint {
            source_topic: source.into(),
            target_topic: target.into(),
            ..Checkpoint::default()
        });
    };
    match Checkpoint::load(path)? {
        Some(c) if c.source_topic != source || c.target_topic != target => bail!(
            "{} is the checkpoint of a replay of {} to {}, not {source} to {target}",
            path.display(),
            c.source_topic,
            c.target_topic
        ),
        Some(c) => Ok(c),
        None => Ok(Checkpoint {
            source_topic: source.into(),
            target_topic: target.into(),
            ..Checkpoint::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::records::RecordBatchDecoder;

    #[test]
    fn batches_keep_keys_values_headers_and_timestamps() {
        let recs: Vec<Record> = (0..5)
            .map(|i| Record {
                partition: 0,
                offset: 100 + i,
                timestamp: 1_700_000_000_000 + i,
                key: (i != 2).then(|| Bytes::from(format!("k{i}"))),
                value: Some(Bytes::from(vec![0xff, i as u8])),
                // A repeated key: both stay, in order.
                headers: vec![
                    ("h".into(), Some(Bytes::from_static(b"v1"))),
                    ("n".into(), None),
                    ("h".into(), Some(Bytes::from_static(b"v2"))),
                ],
            })
            .collect();
        let mut b = encode(&recs).unwrap();
        strata_core::batch::verify(&b).unwrap();
        let h = strata_core::batch::BatchHeader::parse(&b).unwrap();
        assert_eq!(h.total_len(), b.len(), "one batch");
        assert_eq!(
            (h.record_count, h.base_sequence, h.producer_id),
            (5, -1, -1)
        );
        // Our decoder gives back every field, headers whole.
        let range = crate::source::Range::default();
        let batches =
            crate::source::Batches::new(0, b.clone(), (0, u64::MAX), Vec::new(), "t", false)
                .unwrap();
        assert_eq!(batches.next, Some(5));
        let step = batches.into_step(&range).unwrap();
        for (i, (g, r)) in step.records.iter().zip(&recs).enumerate() {
            assert_eq!(g.offset, i as i64);
            assert_eq!(
                (g.timestamp, &g.key, &g.value, &g.headers),
                (r.timestamp, &r.key, &r.value, &r.headers)
            );
        }
        // The Kafka codec reads the same wire format (it keeps one value per header key).
        let sets = RecordBatchDecoder::decode_all(&mut b).unwrap();
        let got = &sets[0].records;
        assert_eq!(got.len(), 5);
        for (g, r) in got.iter().zip(&recs) {
            assert_eq!(
                (g.timestamp, &g.key, &g.value),
                (r.timestamp, &r.key, &r.value)
            );
            assert_eq!(g.headers.len(), 2);
        }
    }

    #[test]
    fn checkpoints_round_trip_and_belong_to_one_replay() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cp.json");
        let mut c = resume(&Some(path.clone()), "a", "b").unwrap();
        c.partitions.insert(
            1,
            Position {
                next_source_offset: 7,
                target_end: 9,
            },
        );
        c.save(&path).unwrap();
        let again = resume(&Some(path.clone()), "a", "b").unwrap();
        assert_eq!(again.partitions[&1].next_source_offset, 7);
        let e = resume(&Some(path), "a", "c").unwrap_err().to_string();
        assert!(e.contains("not a to c"), "{e}");
    }
}
