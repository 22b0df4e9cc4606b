//! Starting and stopping a broker process: open the data directory, bind the Kafka listener,
//! run until SIGINT/SIGTERM, then close every partition cleanly.

use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

use crate::broker::{Broker, SystemClock};
use crate::config::ServerConfig;
use crate::kafka::KafkaServer;

/// Runs the broker until a shutdown signal arrives.
pub async fn run(config: ServerConfig) -> anyhow::Result<()> {
    let broker = Broker::open(config.broker(), Arc::new(SystemClock))
        .await
        .with_context(|| format!("opening data directory {}", config.data_dir.display()))?;
    let listener = TcpListener::bind(config.kafka.listen)
        .await
        .with_context(|| {
            format!(
                "binding the Kafka listener on {} (is another broker running?)",
                config.kafka.listen
            )
        })?;
    let bound = listener.local_addr()?;
    let listener_config = config.listener(bound);
    tracing::info!(
        kafka = %bound,
        advertised = %format!("{}:{}", listener_config.advertised_host, listener_config.advertised_port),
        data_dir = %config.data_dir.display(),
        topics = broker.topics().len(),
        cluster_id = broker.cluster_id(),
        "strata is ready"
    );
    broker.spawn_retention();
    let (stop_tx, stop_rx) = watch::channel(false);
    let server = KafkaServer::new(broker.clone(), listener_config);
    let serving = tokio::spawn(server.serve(listener, stop_rx));
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
    stop_tx.send_replace(true);
    let _ = serving.await;
    tokio::task::spawn_blocking(move || broker.shutdown()).await?;
    tracing::info!("closed cleanly");
    Ok(())
}
