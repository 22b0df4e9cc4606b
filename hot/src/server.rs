//! Starting and stopping a broker process: open the data directory, bind the Kafka listener,
//! run until SIGINT/SIGTERM, then close every partition cleanly.
//!
//! The data directory is its owner's alone (mode 700, files 600; docs/security.md): the
//! metadata log holds every SCRAM user's keys and the segments the records.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

use crate::broker::{Broker, SystemClock};
use crate::cluster::{ClusterLink, LinkConfig};
use crate::config::{Role, ServerConfig};
use crate::grpc::GrpcService;
use crate::health::Health;
use crate::kafka::KafkaServer;

/// Runs the configured roles until a shutdown signal arrives.
pub async fn run(config: ServerConfig) -> anyhow::Result<()> {
    protect_data_dir(&config.data_dir)?;
    let (stop_tx, stop_rx) = watch::channel(false);
    match crate::kafka::limits::raise_fd_limit() {
        Some((before, after)) if after > before => {
            tracing::info!(
                before,
                after,
                "raised the file descriptor limit to its maximum"
            )
        }
        Some((_, limit)) => tracing::info!(limit, "file descriptor limit"),
        None => {}
    }
    let health = Health::new(&config.roles);
    if let Some(m) = &config.metrics {
        // First: probes are answered (not ready, and why) while the roles below recover.
        crate::metrics_endpoint::serve(health.clone(), m, stop_rx.clone()).await?;
    }
    if config.roles.contains(&Role::Controller) {
        let controller =
            strata_controller::Controller::start(config.controller_config()?, stop_rx.clone())
                .await?;
        health.controller_started(controller.clone());
        crate::secure_dev::bootstrap_users(&controller, &config.bootstrap_users).await?;
    }
    if config.roles.contains(&Role::Broker) {
        run_broker(&config, &health, stop_rx).await?;
    } else {
        wait_for_signal().await?;
        health.stopping();
    }
    crate::logging::stopping();
    stop_tx.send_replace(true);
    tracing::info!("stopped");
    Ok(())
}

/// Makes the data directory (mode 700) or closes an existing one that a group or other users
/// may enter (an older version's, or an operator's `mkdir`), with a WARN; closing the top is
/// enough to keep them out of everything below it. Every file this process creates from now
/// on is owner-only: ours are created mode 600 and 700 explicitly, and the umask (narrowed to
/// 077) covers the libraries that create files without a mode (the `file://` object store,
/// the cold tier's disk cache).
fn protect_data_dir(data_dir: &Path) -> anyhow::Result<()> {
    use rustix::fs::Mode;
    let inherited = rustix::process::umask(Mode::from_raw_mode(0o077));
    rustix::process::umask(inherited | Mode::from_raw_mode(0o077));
    strata_core::private_fs::create_dir_all(data_dir)
        .with_context(|| format!("making the data directory {}", data_dir.display()))?;
    match strata_core::private_fs::tighten_dir(data_dir) {
        Ok(None) => {}
        Ok(Some(was)) => tracing::warn!(
            data_dir = %data_dir.display(),
            was = %format_args!("{was:o}"),
            "the data directory was open to other users: changed its mode to 700"
        ),
        // Another user's directory (a volume root): what this process makes in it is still
        // 700 and 600, so a start that worked before keeps working.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => tracing::warn!(
            data_dir = %data_dir.display(),
            error = %e,
            "the data directory is open to other users and not this user's to close: make it mode 700"
        ),
        Err(e) => {
            return Err(e).with_context(|| {
                format!("making the data directory {} private", data_dir.display())
            })
        }
    }
    Ok(())
}

async fn wait_for_signal() -> anyhow::Result<()> {
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
    Ok(())
}

/// Runs the broker role until a shutdown signal arrives, then closes it cleanly.
async fn run_broker(
    config: &ServerConfig,
    health: &Arc<Health>,
    stop_rx: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let tls = config.grpc_tls()?;
    let oauth = config.oauth_validator()?;
    let mut listeners = Vec::new();
    for l in config.kafka_listeners() {
        let bound_listener = bind_client_listener(l.listen).with_context(|| {
            format!(
                "binding Kafka listener '{}' on {} (is another broker running?)",
                l.name, l.listen
            )
        })?;
        let bound = bound_listener.local_addr()?;
        listeners.push((
            bound_listener,
            bound,
            config.listener(&l, bound, oauth.clone())?,
        ));
    }
    let (bound, listener_config) = listeners
        .first()
        .map(|(_, b, c)| (*b, c.clone()))
        .context("no Kafka listener configured")?;
    // In a cluster, followers replicate over gRPC: without a [grpc] section it listens on
    // a free port of the Kafka listener's address (registered with the controllers).
    let grpc_listen = match (&config.grpc, &config.cluster) {
        (Some(g), _) => Some(g.listen),
        (None, Some(_)) => Some(std::net::SocketAddr::new(bound.ip(), 0)),
        (None, None) => None,
    };
    let grpc_listener = match grpc_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding the gRPC listener on {addr}"))?,
        ),
        None => None,
    };
    let grpc_port = grpc_listener
        .as_ref()
        .map(|l| l.local_addr().map(|a| a.port()))
        .transpose()?;
    let (link_stop, link_stop_rx) = watch::channel(false);
    let link = config.cluster.as_ref().map(|c| {
        ClusterLink::start(
            LinkConfig {
                broker_id: config.node_id,
                controllers: c.controllers.clone(),
                kafka: listeners
                    .iter()
                    .map(|(_, _, c)| (c.name.clone(), c.advertised_host.clone(), c.advertised_port))
                    .collect(),
                grpc_host: listener_config.advertised_host.clone(),
                grpc_port,
                rack: c.rack.clone(),
                cluster_id: c.cluster_id.clone(),
                tls: tls.clone(),
                data_dir: config.data_dir.clone(),
            },
            link_stop_rx,
        )
    });
    let broker = Broker::open(
        config.broker(),
        Arc::new(SystemClock),
        link.as_ref().map(|(l, _)| l.clone()),
    )
    .await
    .with_context(|| format!("opening data directory {}", config.data_dir.display()))?;
    health.broker_opened(broker.clone());
    broker
        .wait_until_registered(std::time::Duration::from_secs(60))
        .await
        .context("joining the cluster")?;
    for (_, bound, c) in &listeners {
        tracing::info!(listener = %c.name, protocol = ?c.protocol, address = %bound, advertised = %format!("{}:{}", c.advertised_host, c.advertised_port), "Kafka listener");
    }
    tracing::info!(
        kafka = %bound,
        advertised = %format!("{}:{}", listener_config.advertised_host, listener_config.advertised_port),
        data_dir = %config.data_dir.display(),
        topics = broker.topics().len(),
        cluster_id = broker.cluster_id(),
        "strata is ready"
    );
    broker.spawn_retention();
    broker.spawn_compaction();
    let (listener_stop_tx, listener_stop_rx) = watch::channel(false);
    if let Some(grpc) = grpc_listener {
        let me = strata_proto::v1::BrokerEndpoint {
            id: config.node_id,
            host: listener_config.advertised_host.clone(),
            kafka_port: u32::from(listener_config.advertised_port),
            grpc_port: u32::from(grpc_port.unwrap_or(0)),
        };
        tracing::info!(grpc = %grpc.local_addr()?, "serving the gRPC data plane");
        let service = GrpcService::server(broker.clone(), me, oauth.clone());
        let replica_broker = broker.clone();
        let mut stop = listener_stop_rx.clone();
        let incoming = strata_controller::incoming::incoming(
            grpc,
            config.grpc_connection_limits()?,
            broker.metrics().grpc.clone(),
            "grpc",
        );
        let mut builder = strata_controller::service::server_builder();
        if let Some(tls) = &tls {
            builder = builder
                .tls_config(tls.server()?)
                .context("setting up TLS on the gRPC port")?;
        }
        let authenticated = tls.is_some();
        let (reporter, health_service) = strata_controller::health::service();
        let ready = Arc::downgrade(&broker);
        tokio::spawn(strata_controller::health::report(
            reporter,
            move || ready.upgrade().is_some_and(|b| b.readiness().is_ok()),
            listener_stop_rx.clone(),
        ));
        tokio::spawn(async move {
            let stopped = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            let serving = builder
                .add_service(service)
                .add_service(crate::replication::service::ReplicaService::server(
                    replica_broker,
                    authenticated,
                ))
                .add_service(health_service)
                .serve_with_incoming_shutdown(incoming, stopped);
            if let Err(e) = serving.await {
                tracing::error!(error = %e, "gRPC data plane failed");
            }
        });
    }
    let mut serving = Vec::new();
    let limits = crate::kafka::limits::Limits::new(
        &config.kafka.limits()?,
        broker.metrics().listener.clone(),
    );
    tokio::spawn(limits.clone().watch_fds(listener_stop_rx.clone()));
    let quotas = crate::kafka::quota::Quotas::new(
        broker.cluster().map(|l| l.metadata()),
        broker.metrics().quotas.clone(),
    );
    for (listener, _, c) in listeners {
        let server = KafkaServer::new(broker.clone(), c, limits.clone(), quotas.clone());
        serving.push(tokio::spawn(
            server.serve(listener, listener_stop_rx.clone()),
        ));
    }
    let mut stop_rx = stop_rx;
    tokio::select! {
        r = wait_for_signal() => r?,
        _ = stop_rx.wait_for(|s| *s) => {}
    }
    health.stopping();
    listener_stop_tx.send_replace(true);
    for s in serving {
        let _ = s.await;
    }
    if let Some((_, membership)) = link {
        // Stopping the link asks the controllers to move this broker's leaderships first.
        link_stop.send_replace(true);
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), membership).await;
    }
    tokio::task::spawn_blocking(move || broker.shutdown()).await?;
    tracing::info!("closed cleanly");
    Ok(())
}

/// The listen backlog of the Kafka listeners. std's (and so tokio's `bind`) is 128: when more
/// clients connect at once (every client of a failed broker reconnecting) the kernel drops
/// the rest of their SYNs, and they come back after 1, 3, 7, 15... seconds. The kernel caps
/// it at `net.core.somaxconn` (4096 on current Linux).
const LISTEN_BACKLOG: u32 = 1024;

fn bind_client_listener(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // as std's bind does on Unix: a restarted broker binds while old connections linger
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}
