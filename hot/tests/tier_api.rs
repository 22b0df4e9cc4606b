//! Tiering in process: a standalone broker with a `file://` cold tier uploads the sealed
//! segments of a topic with `remote.storage.enable`, commits them in the manifest, and
//! deletes local segments by `local.retention.bytes` only once they are uploaded.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strata_cold::manifest::{ManifestStore, PartitionPrefix};
use strata_core::batch::build::{batch, ProducerIds, Rec};
use strata_hot::broker::tier::TierConfig;
use strata_hot::broker::{Broker, BrokerConfig, NewTopic, SystemClock};

/// Record `i`'s timestamp: 10 ms apart, from an hour ago (so time retention, 7 days by
/// default, keeps them).
fn ts_of(i: usize) -> i64 {
    static START: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    let start = *START.get_or_init(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        now.as_millis() as i64 - 3_600_000
    });
    start + 10 * i as i64
}

async fn produce(broker: &Broker, topic: &str, from: usize, n: usize) {
    for i in from..from + n {
        let value = format!("record-{i:06}-{}", "x".repeat(200));
        let raw = batch(
            ts_of(i),
            ProducerIds::NONE,
            &[Rec {
                key: None,
                value: Some(value.as_bytes()),
                timestamp_delta: 0,
            }],
        );
        let pending = broker
            .append(topic, 0, Bytes::from(raw), -1, 1_000)
            .unwrap();
        pending
            .durable(Duration::from_secs(5), &broker.metrics().commit_latency)
            .await
            .unwrap();
    }
}

/// Fetches partition 0 of `topic` from `offset` (16 KiB) and decodes the batches.
async fn fetch_sets(
    conn: &mut strata_client::Connection,
    topic: &str,
    offset: i64,
) -> Vec<kafka_protocol::records::RecordSet> {
    let got = strata_client::fetch(conn, topic, 0, offset, 16 << 10, Duration::from_millis(100))
        .await
        .unwrap();
    let mut buf = got.records.clone();
    kafka_protocol::records::RecordBatchDecoder::decode_all(&mut buf).unwrap()
}

/// Creates a one-partition topic with 4 KiB segments and `remote.storage.enable`, plus
/// `configs`.
async fn tiered_topic<const N: usize>(
    broker: &Broker,
    name: &str,
    configs: [(&str, String); N],
) -> strata_hot::broker::TopicSpec {
    let mut all = BTreeMap::from([
        ("segment.bytes".to_string(), "4096".to_string()),
        ("remote.storage.enable".to_string(), "true".to_string()),
    ]);
    all.extend(configs.into_iter().map(|(k, v)| (k.to_string(), v)));
    broker
        .create_topic(
            NewTopic {
                name: name.into(),
                partitions: Some(1),
                configs: all,
                ..NewTopic::default()
            },
            false,
        )
        .await
        .unwrap()
}

/// A standalone broker under `dir/data` tiering to `file://dir/cold`, checking every 50 ms.
async fn open_tiered(
    dir: &std::path::Path,
    upload: strata_cold::upload::UploadConfig,
) -> (Arc<Broker>, TierConfig) {
    let tier = TierConfig {
        store: strata_cold::store::StoreConfig {
            url: format!("file://{}", dir.join("cold").display()),
            ..Default::default()
        },
        upload,
        read: Default::default(),
        interval: Duration::from_millis(50),
        orphan_grace: Duration::from_secs(3600),
    };
    let broker = Broker::open(
        BrokerConfig {
            retention_check_interval: Duration::from_millis(50),
            tier: Some(tier.clone()),
            ..common::broker_config(&dir.join("data"))
        },
        Arc::new(SystemClock),
        None,
    )
    .await
    .unwrap();
    (broker, tier)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_segments_go_to_the_cold_tier_and_local_retention_waits_for_them() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, tier) =
        open_tiered(dir.path(), strata_cold::upload::UploadConfig::default()).await;
    broker.spawn_retention();
    let spec = tiered_topic(
        &broker,
        "ledger",
        [("local.retention.bytes", "8192".to_string())],
    )
    .await;
    produce(&broker, "ledger", 0, 300).await;

    let store = strata_cold::store::open(&tier.store).unwrap();
    let manifest = ManifestStore::new(
        store,
        PartitionPrefix::new(broker.cluster_id(), &spec.id.simple().to_string(), 0),
    );
    let partition = broker.topic("ledger").unwrap().partitions[0]
        .clone()
        .unwrap();
    let local_bytes = || -> u64 {
        std::fs::read_dir(dir.path().join("data/logs/ledger-0"))
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
            .map(|e| e.metadata().unwrap().len())
            .sum()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let m = manifest.load().await.unwrap();
        let p = partition.progress();
        let sealed_end = partition
            .sealed_segments()
            .last()
            .map_or(0, |s| s.end_offset);
        // (As in Kafka, a segment goes while what remains is at least the limit.)
        if m.end_offset() >= sealed_end && p.log_start > 0 && local_bytes() <= 8192 + 4096 {
            // Everything sealed is tiered; local retention deleted only tiered segments.
            assert!(p.log_start <= m.end_offset(), "{p:?} {m:?}");
            assert_eq!(p.tiered_end, Some(m.end_offset()));
            assert_eq!(m.segments[0].base_offset, 0, "from the very start");
            m.validate().unwrap();
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not tiered: manifest {m:?}, progress {p:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        broker
            .metrics()
            .tiered_segments
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 2
    );
    // Each remote object is the local segment's bytes: the first record of the second
    // segment is where the first ended.
    let m = manifest.load().await.unwrap();
    assert_eq!(m.segments[1].base_offset, m.segments[0].end_offset);

    // A consumer from offset 0 gets every record, in order: the cold tier serves what
    // local disk no longer has, the local log the rest. ListOffsets(earliest) says 0.
    let (addr, _stop) = common::serve_kafka(broker.clone()).await;
    let mut conn = strata_client::Connection::connect(&addr).await.unwrap();
    assert_eq!(
        strata_client::list_offset(&mut conn, "ledger", 0, -2)
            .await
            .unwrap(),
        0
    );
    let log_start = partition.progress().log_start;
    assert!(log_start > 50, "{log_start}");
    // ListOffsets by time sees the whole history: the cold tier's records first (a
    // timestamp between two records gives the later one), then the local log's.
    for (ts, want) in [
        (0, 0),
        (ts_of(0), 0),
        (ts_of(50), 50),
        (ts_of(45) + 5, 46),
        (ts_of(log_start as usize), log_start as i64),
        (ts_of(299), 299),
        (ts_of(300), -1),
    ] {
        let got = strata_client::list_offset(&mut conn, "ledger", 0, ts)
            .await
            .unwrap();
        assert_eq!(got, want, "offset for timestamp {ts}");
    }
    let mut next = 0i64;
    while next < 300 {
        let sets = fetch_sets(&mut conn, "ledger", next).await;
        assert!(!sets.is_empty(), "nothing at offset {next}");
        for set in sets {
            for r in set.records {
                assert_eq!(r.offset, next, "in order, nothing skipped");
                let value = String::from_utf8(r.value.unwrap().to_vec()).unwrap();
                assert!(value.starts_with(&format!("record-{next:06}-")), "{value}");
                next += 1;
            }
        }
    }
    let stats = &broker.cold().unwrap().reader.stats;
    assert!(
        stats
            .bytes_fetched
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0,
        "read from the cold tier"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_store_fails_nothing_local_is_deleted_and_the_backlog_shows() {
    let dir = tempfile::tempdir().unwrap();
    let cold = dir.path().join("cold");
    let (broker, _) = open_tiered(
        dir.path(),
        strata_cold::upload::UploadConfig {
            attempts: 1,
            ..Default::default()
        },
    )
    .await;
    broker.spawn_retention();
    // The store breaks: its directory becomes a file, so every write fails.
    std::fs::remove_dir_all(&cold).unwrap();
    std::fs::write(&cold, b"not a directory").unwrap();
    tiered_topic(
        &broker,
        "ledger",
        [("local.retention.bytes", "4096".to_string())],
    )
    .await;
    produce(&broker, "ledger", 0, 100).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let p = broker.topic("ledger").unwrap().partitions[0]
        .clone()
        .unwrap();
    // Expired by local.retention.bytes, yet not uploaded: kept.
    assert_eq!(p.progress().log_start, 0);
    let m = broker.metrics();
    assert!(
        m.tier_upload_errors
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );
    assert!(
        m.under_tiered_bytes
            .load(std::sync::atomic::Ordering::Relaxed)
            > 4096
    );
    // The store comes back: the backlog goes up and local retention catches up.
    std::fs::remove_file(&cold).unwrap();
    std::fs::create_dir_all(&cold).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while p.progress().log_start == 0
        || m.under_tiered_bytes
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    {
        assert!(std::time::Instant::now() < deadline, "{:?}", p.progress());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn total_retention_deletes_remote_segments_manifest_first_then_objects() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, tier) =
        open_tiered(dir.path(), strata_cold::upload::UploadConfig::default()).await;
    broker.spawn_retention();
    let limit = 6 * 4096u64;
    let spec = tiered_topic(
        &broker,
        "ledger",
        [
            ("local.retention.bytes", "8192".to_string()),
            ("retention.bytes", limit.to_string()),
        ],
    )
    .await;
    produce(&broker, "ledger", 0, 300).await;
    let store = strata_cold::store::open(&tier.store).unwrap();
    let prefix = PartitionPrefix::new(broker.cluster_id(), &spec.id.simple().to_string(), 0);
    let manifest = ManifestStore::new(store.clone(), prefix);
    let partition = broker.topic("ledger").unwrap().partitions[0]
        .clone()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let m = loop {
        let m = manifest.load().await.unwrap();
        let sealed_end = partition
            .sealed_segments()
            .last()
            .map_or(0, |s| s.end_offset);
        if m.end_offset() >= sealed_end && m.log_start > 0 && partition.progress().log_start > 0 {
            break m;
        }
        assert!(std::time::Instant::now() < deadline, "{m:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The manifest moved its start; what it holds with the local tail keeps within the
    // limit plus a segment.
    m.validate().unwrap();
    assert_eq!(m.segments[0].base_offset, m.log_start);
    let local_tail = partition
        .sealed_segments()
        .iter()
        .filter(|s| s.base_offset >= m.end_offset())
        .count() as u64
        * 4096;
    assert!(m.size_bytes() <= limit + 4096 + local_tail, "{m:?}");
    // The dropped segments' objects are gone; the manifest's are all there.
    use futures_util::TryStreamExt;
    let listed: Vec<String> = store
        .list(None)
        .map_ok(|o| o.location.to_string())
        .try_collect()
        .await
        .unwrap();
    let logs: Vec<_> = listed.iter().filter(|k| k.ends_with(".log")).collect();
    assert_eq!(logs.len(), m.segments.len(), "{logs:?}");
    for s in &m.segments {
        assert!(listed.contains(&s.key), "{} missing", s.key);
    }
    assert!(
        broker
            .metrics()
            .remote_segments_deleted
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );
    // Consumers start at the new earliest offset and read on from there.
    let (addr, _stop) = common::serve_kafka(broker.clone()).await;
    let mut conn = strata_client::Connection::connect(&addr).await.unwrap();
    let earliest = strata_client::list_offset(&mut conn, "ledger", 0, -2)
        .await
        .unwrap();
    let now = manifest.load().await.unwrap();
    assert_eq!(earliest, now.log_start as i64);
    let sets = fetch_sets(&mut conn, "ledger", earliest).await;
    assert_eq!(sets[0].records[0].offset, earliest);

    // retention.ms: records from an hour ago under a 30-minute retention all go, remote
    // and local, but for the active segment.
    let spec = tiered_topic(&broker, "old", [("retention.ms", "1800000".to_string())]).await;
    produce(&broker, "old", 0, 100).await;
    let prefix = PartitionPrefix::new(broker.cluster_id(), &spec.id.simple().to_string(), 0);
    let manifest = ManifestStore::new(store.clone(), prefix);
    let old = broker.topic("old").unwrap().partitions[0].clone().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let m = manifest.load().await.unwrap();
        let sealed = old.sealed_segments();
        let log_start = old.progress().log_start;
        if m.segments.is_empty() && m.log_start > 0 && sealed.is_empty() && log_start > 0 {
            assert_eq!(log_start, m.log_start, "local and remote agree");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{m:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
