//! Rust clients for Strata over the Kafka protocol: one connection type that frames any
//! Kafka request, and the admin, produce and fetch calls that the `strata` CLI, the tests and
//! the benchmarks use. Leader-aware, batching producers and a group consumer come with the
//! cluster (gRPC) work.

pub mod controller;
pub mod groups;
pub mod native;

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, CreateTopicsRequest, DeleteTopicsRequest, DescribeConfigsRequest, FetchRequest,
    ListOffsetsRequest, MetadataRequest, ProduceRequest, RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, Request, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest response frame this client accepts.
const MAX_RESPONSE_BYTES: usize = 256 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("connection failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The broker answered with a Kafka error code.
    #[error("{message} (kafka error {code})")]
    Kafka { code: i16, message: String },
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The controller answered with a gRPC error.
    #[error("{message} (grpc {code})")]
    Grpc { code: String, message: String },
}

impl ClientError {
    fn kafka(code: i16, message: Option<&StrBytes>) -> Self {
        let message = message.map(|m| m.to_string()).unwrap_or_else(|| {
            kafka_protocol::ResponseError::try_from_code(code)
                .map_or_else(|| "ok".into(), |e| e.to_string())
        });
        ClientError::Kafka { code, message }
    }
}

pub type Result<T> = std::result::Result<T, ClientError>;

static GRPC_TLS: std::sync::OnceLock<strata_proto::tls::GrpcTls> = std::sync::OnceLock::new();

/// Makes every gRPC connection this process opens afterwards use mTLS with `tls` (a CLI's
/// `--tls-ca/--tls-cert/--tls-key`); the first call wins.
pub fn use_grpc_tls(tls: strata_proto::tls::GrpcTls) {
    let _ = GRPC_TLS.set(tls);
}

static GRPC_TOKEN: std::sync::OnceLock<tonic::metadata::MetadataValue<tonic::metadata::Ascii>> =
    std::sync::OnceLock::new();

/// Makes every gRPC call this process makes afterwards carry `authorization: Bearer
/// <token>` (a JWT the brokers check as they check OAUTHBEARER); the first call wins.
pub fn use_grpc_token(token: &str) -> Result<()> {
    let value = format!("Bearer {}", token.trim())
        .parse()
        .map_err(|_| ClientError::Protocol("the token is not printable ASCII".into()))?;
    let _ = GRPC_TOKEN.set(value);
    Ok(())
}

/// Adds the process's bearer token, if any, to every call.
#[derive(Clone, Copy, Default)]
pub struct BearerToken;

impl tonic::service::Interceptor for BearerToken {
    fn call(
        &mut self,
        mut req: tonic::Request<()>,
    ) -> std::result::Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = GRPC_TOKEN.get() {
            req.metadata_mut().insert("authorization", token.clone());
        }
        Ok(req)
    }
}

/// A gRPC channel with this process's TLS and bearer token.
pub type GrpcChannel =
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, BearerToken>;

/// Opens a gRPC channel to `addr` (host:port), with a connect timeout.
pub(crate) async fn grpc_channel(addr: &str) -> Result<GrpcChannel> {
    let channel = strata_proto::tls::endpoint(addr, GRPC_TLS.get())
        .map_err(|e| ClientError::Protocol(e.to_string()))?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| ClientError::Connect {
            addr: addr.to_string(),
            source: std::io::Error::other(e),
        })?;
    Ok(tonic::service::interceptor::InterceptedService::new(
        channel,
        BearerToken,
    ))
}

impl From<tonic::Status> for ClientError {
    fn from(status: tonic::Status) -> Self {
        ClientError::Grpc {
            code: format!("{:?}", status.code()),
            message: status.message().to_string(),
        }
    }
}

/// One Kafka-protocol connection; requests are sent one at a time.
pub struct Connection {
    stream: TcpStream,
    next_correlation_id: i32,
    client_id: String,
}

impl Connection {
    pub async fn connect(addr: &str) -> Result<Connection> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|source| ClientError::Connect {
                addr: addr.to_string(),
                source,
            })?;
        stream.set_nodelay(true)?;
        Ok(Connection {
            stream,
            next_correlation_id: 1,
            client_id: "strata-client".into(),
        })
    }

    /// The client id sent in request headers (brokers log it; group members are told
    /// apart by it).
    pub fn set_client_id(&mut self, client_id: impl Into<String>) {
        self.client_id = client_id.into();
    }

    fn frame<R: Request>(&mut self, req: &R, version: i16) -> Result<(i32, BytesMut)> {
        let correlation_id = self.next_correlation_id;
        self.next_correlation_id = self.next_correlation_id.wrapping_add(1);
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(StrBytes::from_string(self.client_id.clone())));
        let mut buf = BytesMut::new();
        buf.put_i32(0);
        let proto = |e: anyhow::Error| ClientError::Protocol(e.to_string());
        header
            .encode(&mut buf, R::header_version(version))
            .map_err(proto)?;
        req.encode(&mut buf, version).map_err(proto)?;
        let len = (buf.len() - 4) as i32;
        (&mut buf[..4]).put_i32(len);
        Ok((correlation_id, buf))
    }

    /// Sends `req` at `version` and decodes the response.
    pub async fn send<R: Request>(&mut self, req: &R, version: i16) -> Result<R::Response> {
        let (correlation_id, buf) = self.frame(req, version)?;
        self.stream.write_all(&buf).await?;
        let len = self.stream.read_i32().await?;
        if len < 4 || len as usize > MAX_RESPONSE_BYTES {
            return Err(ClientError::Protocol(format!(
                "response frame of {len} bytes"
            )));
        }
        let mut body = BytesMut::zeroed(len as usize);
        self.stream.read_exact(&mut body).await?;
        let mut body = body.freeze();
        let api_key = ApiKey::try_from(R::KEY)
            .map_err(|_| ClientError::Protocol("unknown api key".into()))?;
        let header = ResponseHeader::decode(&mut body, api_key.response_header_version(version))
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        if header.correlation_id != correlation_id {
            return Err(ClientError::Protocol(format!(
                "correlation id {} does not match request {correlation_id}",
                header.correlation_id
            )));
        }
        let resp = R::Response::decode(&mut body, version)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        if body.has_remaining() {
            return Err(ClientError::Protocol(format!(
                "{} bytes left after the response",
                body.remaining()
            )));
        }
        Ok(resp)
    }

    /// Sends a request that gets no response (a produce with acks=0).
    pub async fn send_only<R: Request>(&mut self, req: &R, version: i16) -> Result<()> {
        let (_, buf) = self.frame(req, version)?;
        self.stream.write_all(&buf).await?;
        Ok(())
    }

    /// Writes raw bytes (for tests of malformed input).
    pub async fn write_raw(&mut self, bytes: &[u8]) -> Result<()> {
        self.stream.write_all(bytes).await?;
        Ok(())
    }

    /// Reads until the peer closes; returns the bytes read (for tests of refusals).
    pub async fn read_to_close(&mut self, within: Duration) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        tokio::time::timeout(within, self.stream.read_to_end(&mut out))
            .await
            .map_err(|_| ClientError::Timeout(within))??;
        Ok(out)
    }
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// A topic as the metadata API lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicInfo {
    pub name: String,
    pub id: String,
    pub partitions: usize,
    pub replication_factor: usize,
    /// Each partition's leader, leader epoch, replicas and in-sync replicas, by index.
    pub layout: Vec<PartitionLayout>,
}

/// Where one partition lives, as the metadata API describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionLayout {
    pub index: i32,
    /// `None` while the partition is offline.
    pub leader: Option<i32>,
    pub leader_epoch: i32,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
}

/// A described topic config: name, value, where it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigEntry {
    pub name: String,
    pub value: String,
    pub source: &'static str,
}

/// Admin calls over one connection.
pub struct Admin {
    conn: Connection,
}

impl Admin {
    pub async fn connect(bootstrap: &str) -> Result<Admin> {
        Ok(Admin {
            conn: Connection::connect(bootstrap).await?,
        })
    }

    /// Creates a topic; `None` takes the broker default.
    pub async fn create_topic(
        &mut self,
        name: &str,
        partitions: Option<i32>,
        replication_factor: Option<i16>,
        configs: &BTreeMap<String, String>,
    ) -> Result<()> {
        let topic = CreatableTopic::default()
            .with_name(TopicName(s(name)))
            .with_num_partitions(partitions.unwrap_or(-1))
            .with_replication_factor(replication_factor.unwrap_or(-1))
            .with_configs(
                configs
                    .iter()
                    .map(|(k, v)| {
                        CreatableTopicConfig::default()
                            .with_name(s(k))
                            .with_value(Some(s(v)))
                    })
                    .collect(),
            );
        let req = CreateTopicsRequest::default()
            .with_topics(vec![topic])
            .with_timeout_ms(30_000);
        let resp = self.conn.send(&req, 7).await?;
        let r = resp
            .topics
            .first()
            .ok_or_else(|| ClientError::Protocol("empty CreateTopics response".into()))?;
        if r.error_code != 0 {
            return Err(ClientError::kafka(r.error_code, r.error_message.as_ref()));
        }
        Ok(())
    }

    pub async fn delete_topic(&mut self, name: &str) -> Result<()> {
        let req = DeleteTopicsRequest::default()
            .with_topics(vec![
                DeleteTopicState::default().with_name(Some(TopicName(s(name))))
            ])
            .with_timeout_ms(30_000);
        let resp = self.conn.send(&req, 6).await?;
        let r = resp
            .responses
            .first()
            .ok_or_else(|| ClientError::Protocol("empty DeleteTopics response".into()))?;
        if r.error_code != 0 {
            return Err(ClientError::kafka(r.error_code, r.error_message.as_ref()));
        }
        Ok(())
    }

    /// Lists topics (all when `names` is empty).
    pub async fn list_topics(&mut self, names: &[&str]) -> Result<Vec<TopicInfo>> {
        use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
        let topics = (!names.is_empty()).then(|| {
            names
                .iter()
                .map(|n| MetadataRequestTopic::default().with_name(Some(TopicName(s(n)))))
                .collect()
        });
        let resp = self
            .conn
            .send(&MetadataRequest::default().with_topics(topics), 12)
            .await?;
        let mut out = Vec::new();
        for t in resp.topics {
            let name = t.name.map(|n| n.0.to_string()).unwrap_or_default();
            if t.error_code != 0 {
                return Err(ClientError::kafka(
                    t.error_code,
                    Some(&s(&format!("topic '{name}'"))),
                ));
            }
            let mut layout: Vec<PartitionLayout> = t
                .partitions
                .iter()
                .map(|p| PartitionLayout {
                    index: p.partition_index,
                    leader: (p.leader_id.0 >= 0).then_some(p.leader_id.0),
                    leader_epoch: p.leader_epoch,
                    replicas: p.replica_nodes.iter().map(|b| b.0).collect(),
                    isr: p.isr_nodes.iter().map(|b| b.0).collect(),
                })
                .collect();
            layout.sort_by_key(|p| p.index);
            out.push(TopicInfo {
                name,
                id: t.topic_id.to_string(),
                partitions: t.partitions.len(),
                replication_factor: t.partitions.first().map_or(0, |p| p.replica_nodes.len()),
                layout,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    pub async fn describe_configs(&mut self, topic: &str) -> Result<Vec<ConfigEntry>> {
        let req = DescribeConfigsRequest::default().with_resources(vec![
            DescribeConfigsResource::default()
                .with_resource_type(2)
                .with_resource_name(s(topic))
                .with_configuration_keys(None),
        ]);
        let resp = self.conn.send(&req, 4).await?;
        let r = resp
            .results
            .first()
            .ok_or_else(|| ClientError::Protocol("empty DescribeConfigs response".into()))?;
        if r.error_code != 0 {
            return Err(ClientError::kafka(r.error_code, r.error_message.as_ref()));
        }
        Ok(r.configs
            .iter()
            .map(|c| ConfigEntry {
                name: c.name.to_string(),
                value: c.value.as_ref().map(|v| v.to_string()).unwrap_or_default(),
                source: match c.config_source {
                    1 => "topic",
                    4 => "broker",
                    _ => "default",
                },
            })
            .collect())
    }
}

/// Produces one batch (RecordBatch v2 bytes) to a partition and returns its base offset.
pub async fn produce(
    conn: &mut Connection,
    topic: &str,
    partition: i32,
    batch: Bytes,
    acks: i16,
) -> Result<i64> {
    let req = ProduceRequest::default()
        .with_acks(acks)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(s(topic)))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(batch))])]);
    if acks == 0 {
        conn.send_only(&req, 9).await?;
        return Ok(-1);
    }
    let resp = conn.send(&req, 9).await?;
    let p = resp
        .responses
        .first()
        .and_then(|t| t.partition_responses.first())
        .ok_or_else(|| ClientError::Protocol("empty Produce response".into()))?;
    if p.error_code != 0 {
        return Err(ClientError::kafka(p.error_code, p.error_message.as_ref()));
    }
    Ok(p.base_offset)
}

/// What one partition fetch returned.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub high_watermark: i64,
    pub log_start_offset: i64,
    pub records: Bytes,
    /// The partition's last stable offset (see [`fetch_committed`]).
    pub last_stable_offset: i64,
    /// read_committed only: the aborted transactions among the records, (producer id,
    /// first offset); the reader drops their batches up to each one's abort marker.
    pub aborted: Vec<(i64, i64)>,
}

/// Fetches from one partition, long-polling up to `max_wait`.
pub async fn fetch(
    conn: &mut Connection,
    topic: &str,
    partition: i32,
    offset: i64,
    max_bytes: i32,
    max_wait: Duration,
) -> Result<Fetched> {
    fetch_isolated(conn, topic, partition, offset, max_bytes, max_wait, false).await
}

/// [`fetch`] with `isolation_level=read_committed`: records below the last stable offset
/// only, with the aborted transactions among them.
pub async fn fetch_committed(
    conn: &mut Connection,
    topic: &str,
    partition: i32,
    offset: i64,
    max_bytes: i32,
    max_wait: Duration,
) -> Result<Fetched> {
    fetch_isolated(conn, topic, partition, offset, max_bytes, max_wait, true).await
}

async fn fetch_isolated(
    conn: &mut Connection,
    topic: &str,
    partition: i32,
    offset: i64,
    max_bytes: i32,
    max_wait: Duration,
    committed: bool,
) -> Result<Fetched> {
    let req = FetchRequest::default()
        .with_isolation_level(i8::from(committed))
        .with_max_wait_ms(max_wait.as_millis() as i32)
        .with_min_bytes(1)
        .with_max_bytes(max_bytes)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(s(topic)))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(partition)
                .with_fetch_offset(offset)
                .with_partition_max_bytes(max_bytes)])]);
    let resp = conn.send(&req, 12).await?;
    if resp.error_code != 0 {
        return Err(ClientError::kafka(resp.error_code, None));
    }
    let p = resp
        .responses
        .first()
        .and_then(|t| t.partitions.first())
        .ok_or_else(|| ClientError::Protocol("empty Fetch response".into()))?;
    if p.error_code != 0 {
        return Err(ClientError::kafka(p.error_code, None));
    }
    Ok(Fetched {
        high_watermark: p.high_watermark,
        log_start_offset: p.log_start_offset,
        records: p.records.clone().unwrap_or_default(),
        last_stable_offset: p.last_stable_offset,
        aborted: p
            .aborted_transactions
            .iter()
            .flatten()
            .map(|t| (t.producer_id.0, t.first_offset))
            .collect(),
    })
}

/// ListOffsets for one partition: `-1` latest, `-2` earliest, or a timestamp.
pub async fn list_offset(
    conn: &mut Connection,
    topic: &str,
    partition: i32,
    timestamp: i64,
) -> Result<i64> {
    let req = ListOffsetsRequest::default()
        .with_replica_id((-1).into())
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(TopicName(s(topic)))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(partition)
                .with_timestamp(timestamp)])]);
    let resp = conn.send(&req, 7).await?;
    let p = resp
        .topics
        .first()
        .and_then(|t| t.partitions.first())
        .ok_or_else(|| ClientError::Protocol("empty ListOffsets response".into()))?;
    if p.error_code != 0 {
        return Err(ClientError::kafka(p.error_code, None));
    }
    Ok(p.offset)
}
