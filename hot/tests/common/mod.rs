//! What the in-process integration tests share.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use strata_hot::broker::{Broker, BrokerConfig};
use strata_hot::kafka::{KafkaServer, ListenerConfig};
use tokio::sync::watch;

/// A single-node broker's config over `dir`, for tests to adjust with `..`.
pub fn broker_config(dir: &Path) -> BrokerConfig {
    BrokerConfig {
        authorizer: strata_controller::metadata::acl::AuthorizerConfig::open(),
        data_dir: dir.to_path_buf(),
        node_id: 0,
        topic_defaults: BTreeMap::new(),
        default_partitions: 1,
        retention_check_interval: Duration::from_secs(3600),
        producer_id_expiration: Duration::from_secs(86_400),
        compaction_check_interval: Duration::from_secs(15),
        compaction_map_bytes: 128 << 20,
        replica_lag_time_max: Duration::from_secs(30),
        replica_open_timeout: Duration::from_secs(30),
        replica_selector: strata_hot::config::ReplicaSelector::Leader,
        // Groups form at once (the initial rebalance delay has its own tests), so the
        // sweeps over every version of every group API do not wait 3 s a join.
        groups: strata_hot::group::manager::GroupsConfig {
            group: strata_hot::group::state::GroupConfig {
                initial_rebalance_delay_ms: 0,
                ..Default::default()
            },
            ..Default::default()
        },
        tier: None,
        transactions: strata_hot::txn::TxnConfig::default(),
        auto_create_topics: false,
    }
}

/// Serves the Kafka protocol for `broker` on a free port: its address, and the switch that
/// stops it (dropping it stops it too).
#[allow(dead_code)] // not every test file serves Kafka
pub async fn serve_kafka(broker: Arc<Broker>) -> (String, watch::Sender<bool>) {
    serve_kafka_as(
        broker,
        strata_hot::kafka::SecurityProtocol::Plaintext,
        Vec::new(),
    )
    .await
}

/// [`serve_kafka`] with another protocol and SASL mechanisms.
#[allow(dead_code)]
pub async fn serve_kafka_as(
    broker: Arc<Broker>,
    protocol: strata_hot::kafka::SecurityProtocol,
    sasl_mechanisms: Vec<strata_hot::kafka::sasl::Mechanism>,
) -> (String, watch::Sender<bool>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let limits = strata_hot::kafka::limits::Limits::new(
        &strata_hot::config::KafkaSection::default()
            .limits()
            .unwrap(),
        broker.metrics().listener.clone(),
    );
    let server = KafkaServer::new(
        broker,
        ListenerConfig {
            name: "kafka".into(),
            protocol,
            tls: None,
            sasl_mechanisms,
            oauth: None,
            advertised_host: "127.0.0.1".into(),
            advertised_port: addr.port(),
            max_request_bytes: 1 << 20,
            max_reauth: None,
            failed_authentication_delay: Duration::ZERO,
            idle_timeout: Duration::from_secs(60),
            frame_timeout: Duration::from_millis(300),
            fetch_max_bytes: 55 << 20,
            fetch_max_wait: Duration::from_secs(30),
            sendfile: true,
        },
        limits,
        strata_hot::kafka::quota::Quotas::new(None, Default::default()),
    );
    let (stop, stop_rx) = watch::channel(false);
    tokio::spawn(server.serve(listener, stop_rx));
    (addr.to_string(), stop)
}
