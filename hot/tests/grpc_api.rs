//! The native data plane in process: the Rust producer (murmur2 partitioning, batching,
//! idempotence) and consumer against a broker's gRPC service.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strata_client::native::{partition_for_key, Cluster, Consumer, Producer, ProducerConfig};
use strata_client::ClientError;
use strata_hot::broker::{Broker, BrokerConfig, NewTopic, SystemClock};
use strata_hot::grpc::GrpcService;
use strata_proto::v1::BrokerEndpoint;
use tokio::net::TcpListener;

async fn start() -> (String, Arc<Broker>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::open(
        BrokerConfig {
            data_dir: dir.path().to_path_buf(),
            node_id: 0,
            topic_defaults: BTreeMap::new(),
            default_partitions: 1,
            retention_check_interval: Duration::from_secs(3600),
            replica_lag_time_max: Duration::from_secs(30),
            replica_open_timeout: Duration::from_secs(30),
            groups: Default::default(),
            auto_create_topics: false,
        },
        Arc::new(SystemClock),
        None,
    )
    .await
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let me = BrokerEndpoint {
        id: 0,
        host: "127.0.0.1".into(),
        kafka_port: 0,
        grpc_port: u32::from(addr.port()),
    };
    let service = GrpcService::server(broker.clone(), me);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (addr.to_string(), broker, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_client_round_trips_through_grpc() {
    let (addr, broker, _dir) = start().await;
    broker
        .create_topic(
            NewTopic {
                name: "orders".into(),
                partitions: Some(6),
                ..NewTopic::default()
            },
            false,
        )
        .await
        .unwrap();
    let cluster = Cluster::connect(std::slice::from_ref(&addr)).await.unwrap();
    let producer = Producer::new(cluster.clone(), ProducerConfig::default())
        .await
        .unwrap();
    let n = 3_000;
    let mut acks = Vec::new();
    for i in 0..n {
        let key = Bytes::from(format!("key-{}", i % 100));
        acks.push((
            key.clone(),
            producer
                .send("orders", Some(key), Bytes::from(format!("{i}")))
                .await
                .unwrap(),
        ));
    }
    let mut delivered = BTreeMap::new();
    for (i, (key, ack)) in acks.into_iter().enumerate() {
        let d = ack.await.unwrap().unwrap();
        assert_eq!(
            d.partition,
            partition_for_key(&key, 6),
            "keyed records follow Kafka's partitioner"
        );
        delivered.insert(i, d);
    }
    let mut consumer = Consumer::from_offset(cluster.clone(), "orders", 0)
        .await
        .unwrap();
    let mut seen = Vec::new();
    for _ in 0..50 {
        seen.extend(consumer.poll(Duration::from_millis(100)).await.unwrap());
        if seen.len() >= n {
            break;
        }
    }
    assert_eq!(seen.len(), n);
    let mut last_per_partition: BTreeMap<u32, i64> = BTreeMap::new();
    for r in &seen {
        let i: usize = std::str::from_utf8(r.value.as_ref().unwrap())
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(
            (delivered[&i].partition, delivered[&i].offset),
            (r.partition, r.offset)
        );
        let last = last_per_partition.entry(r.partition).or_insert(-1);
        assert_eq!(r.offset, *last + 1, "offsets are contiguous per partition");
        *last = r.offset;
    }

    // Unknown topics are a clear error, not a hang.
    match producer.send("nope", None, Bytes::from_static(b"x")).await {
        Err(ClientError::Kafka { code: 3, .. }) => {}
        other => panic!("expected UNKNOWN_TOPIC_OR_PARTITION, got {other:?}"),
    }
}
