//! A topic on a running cluster, over the Kafka protocol: where each partition's leader is,
//! and a connection to it (the replay target, and the hot tail for `--include-hot`).

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{bail, Context};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{MetadataRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use strata_client::Connection;

pub struct Cluster {
    pub topic: String,
    pub partitions: u32,
    leaders: HashMap<u32, String>,
    conns: HashMap<String, Connection>,
}

impl Cluster {
    pub async fn connect(bootstrap: &str, topic: &str) -> anyhow::Result<Cluster> {
        let mut conn = Connection::connect(bootstrap)
            .await
            .with_context(|| format!("connecting to {bootstrap}"))?;
        let req =
            MetadataRequest::default().with_topics(Some(vec![MetadataRequestTopic::default()
                .with_name(Some(TopicName(StrBytes::from_string(topic.to_string()))))]));
        let meta = conn.send(&req, 9).await.context("asking for metadata")?;
        let brokers: HashMap<i32, String> = meta
            .brokers
            .iter()
            .map(|b| (b.node_id.0, format!("{}:{}", b.host, b.port)))
            .collect();
        let t = meta
            .topics
            .iter()
            .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))
            .context("the metadata answer lacks the topic")?;
        if t.error_code != 0 {
            bail!(
                "topic '{topic}' at {bootstrap}: Kafka error {}",
                t.error_code
            );
        }
        let leaders = t
            .partitions
            .iter()
            .filter_map(|p| {
                Some((
                    p.partition_index as u32,
                    brokers.get(&p.leader_id.0)?.clone(),
                ))
            })
            .collect();
        Ok(Cluster {
            topic: topic.to_string(),
            partitions: t.partitions.len() as u32,
            leaders,
            conns: HashMap::from([(bootstrap.to_string(), conn)]),
        })
    }

    /// A connection to the partition's leader.
    pub async fn conn(&mut self, partition: u32) -> anyhow::Result<&mut Connection> {
        let addr = self
            .leaders
            .get(&partition)
            .with_context(|| {
                format!(
                    "partition {partition} of '{}' has no leader now",
                    self.topic
                )
            })?
            .clone();
        if !self.conns.contains_key(&addr) {
            let c = Connection::connect(&addr)
                .await
                .with_context(|| format!("connecting to {addr}"))?;
            self.conns.insert(addr.clone(), c);
        }
        Ok(self.conns.get_mut(&addr).expect("inserted"))
    }

    /// Batches of the partition from `offset`, about `max_bytes`, and its high watermark.
    pub async fn fetch(
        &mut self,
        partition: u32,
        offset: u64,
        max_bytes: i32,
        committed: bool,
    ) -> anyhow::Result<strata_client::Fetched> {
        let topic = self.topic.clone();
        let conn = self.conn(partition).await?;
        let wait = Duration::from_millis(10);
        let (p, at) = (partition as i32, offset as i64);
        let got = match committed {
            true => strata_client::fetch_committed(conn, &topic, p, at, max_bytes, wait).await,
            false => strata_client::fetch(conn, &topic, p, at, max_bytes, wait).await,
        };
        got.with_context(|| format!("fetching {topic} partition {partition} at {offset}"))
    }
}
