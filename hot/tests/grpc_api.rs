//! The native data plane in process: the Rust producer (murmur2 partitioning, batching,
//! idempotence) and consumer against a broker's gRPC service.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strata_client::native::{partition_for_key, Cluster, Consumer, Producer, ProducerConfig};
use strata_client::ClientError;
use strata_hot::broker::{Broker, NewTopic, SystemClock};
use strata_hot::grpc::GrpcService;
use strata_proto::v1::BrokerEndpoint;
use tokio::net::TcpListener;

async fn start() -> (String, Arc<Broker>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::open(
        common::broker_config(dir.path()),
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
    let service = GrpcService::server(broker.clone(), me, None);
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

/// Polls until `pred` holds for the consumers' records, or panics after 20 s.
async fn poll_until(
    consumers: &mut [strata_client::native::GroupConsumer],
    seen: &mut Vec<(usize, String, i64)>,
    pred: impl Fn(&[(usize, String, i64)]) -> bool,
) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !pred(seen) {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out; seen {}",
            seen.len()
        );
        for (i, c) in consumers.iter_mut().enumerate() {
            for (_, r) in c.poll(Duration::from_millis(50)).await.unwrap() {
                let v = String::from_utf8(r.value.unwrap().to_vec()).unwrap();
                seen.push((i, v, r.offset));
            }
            let _ = c.commit().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_group_members_share_partitions_assigned_by_the_coordinator() {
    use strata_client::native::{GroupConsumer, GroupConsumerConfig};
    let (addr, broker, _dir) = start().await;
    broker
        .create_topic(
            NewTopic {
                name: "ledger".into(),
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
    let produce = |from: usize, to: usize| {
        let producer = &producer;
        async move {
            let mut acks = Vec::new();
            for i in from..to {
                acks.push(
                    producer
                        .send(
                            "ledger",
                            Some(Bytes::from(format!("k{i}"))),
                            Bytes::from(format!("{i}")),
                        )
                        .await
                        .unwrap(),
                );
            }
            for a in acks {
                a.await.unwrap().unwrap();
            }
        }
    };
    produce(0, 600).await;
    let config = |assignor: &str| GroupConsumerConfig {
        group: "treasury".into(),
        topics: vec!["ledger".into()],
        assignor: assignor.into(),
        session_timeout: Duration::from_secs(6),
        heartbeat_interval: Duration::from_millis(100),
        ..GroupConsumerConfig::default()
    };
    // Unknown assignors and topics are refused with a clear error.
    let bad = GroupConsumer::join(cluster.clone(), config("cooperative-magic")).await;
    assert!(
        matches!(bad, Err(ClientError::Kafka { code: 42, .. })),
        "{:?}",
        bad.err()
    );

    let a = GroupConsumer::join(cluster.clone(), config("sticky"))
        .await
        .unwrap();
    assert_eq!(a.assignment().len(), 6, "alone, it gets every partition");
    let b_join = tokio::spawn({
        let cluster = cluster.clone();
        let c = config("sticky");
        async move { GroupConsumer::join(cluster, c).await.unwrap() }
    });
    // a learns of the rebalance from its heartbeat and rejoins; b's join completes then.
    let mut members = vec![a];
    let mut seen = Vec::new();
    while !b_join.is_finished() {
        for (_, r) in members[0].poll(Duration::from_millis(50)).await.unwrap() {
            seen.push((
                0,
                String::from_utf8(r.value.unwrap().to_vec()).unwrap(),
                r.offset,
            ));
        }
    }
    members.push(b_join.await.unwrap());
    poll_until(&mut members, &mut seen, |s| {
        s.iter()
            .map(|(_, v, _)| v.clone())
            .collect::<std::collections::HashSet<_>>()
            .len()
            == 600
    })
    .await;
    let (pa, pb) = (members[0].assignment(), members[1].assignment());
    assert_eq!((pa.len(), pb.len()), (3, 3), "{pa:?} {pb:?}");
    assert!(pa.iter().all(|p| !pb.contains(p)));
    assert_eq!(members[0].generation(), members[1].generation());

    // The committed offsets are the group's, in the same coordinator Kafka clients use:
    // they reach the end of every partition (partitions that moved are read again from the
    // last commit, at least once).
    let coordinator = broker.groups().coordinator("treasury").unwrap();
    let committed = || -> i64 {
        (0..6)
            .map(|p| {
                coordinator.fetch("treasury", &[("ledger".to_string(), p)])[0]
                    .as_ref()
                    .map_or(0, |o| o.offset)
            })
            .sum()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while committed() < 600 {
        assert!(
            std::time::Instant::now() < deadline,
            "committed {}",
            committed()
        );
        for c in members.iter_mut() {
            c.poll(Duration::from_millis(50)).await.unwrap();
            c.commit().await.unwrap();
        }
    }
    assert_eq!(committed(), 600);

    // Both leave; a new member resumes from the commits: it reads only what came after.
    for c in members.drain(..) {
        c.close().await.unwrap();
    }
    produce(600, 660).await;
    let mut fresh = vec![GroupConsumer::join(cluster.clone(), config("range"))
        .await
        .unwrap()];
    let mut after = Vec::new();
    poll_until(&mut fresh, &mut after, |s| s.len() >= 60).await;
    let values: std::collections::HashSet<usize> =
        after.iter().map(|(_, v, _)| v.parse().unwrap()).collect();
    assert_eq!(
        values,
        (600..660).collect(),
        "resumed exactly at the committed offsets"
    );
}
