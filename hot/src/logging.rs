//! The process's log output: `RUST_LOG` (default `info,openraft=warn`) to stderr, as text or
//! JSON lines (`--log-format`), without
//! openraft's per-call errors about an unreachable peer controller.
//!
//! openraft 0.9 logs an ERROR for every failed call to a peer: each heartbeat, each read
//! confirmation and each vote while a controller is paused, partitioned or restarting, about
//! twenty lines a second for an ordinary fault that Raft is built to ride out. The controller's
//! network layer logs the same fact once instead (a WARN when a peer stops answering, an
//! INFO when it answers again, `strata_controller::network::PeerHealth`), so those events
//! are dropped here. So are openraft's errors once the process is stopping (`stopping`):
//! calls in flight when its core stops each report that it stopped. Every other openraft
//! error still reaches the log.

use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

/// openraft 0.9's events for one failed call to a peer: (target, message).
const PEER_CALL_ERRORS: &[(&str, &str)] = &[
    ("openraft::replication", "RPCError"),
    (
        "openraft::core::raft_core",
        "timeout while confirming leadership for read request",
    ),
    ("openraft::core::raft_core", "timeout"),
    ("openraft::core::raft_core", "while requesting vote"),
];

/// Set once the process is shutting down.
static STOPPING: AtomicBool = AtomicBool::new(false);

/// The process is shutting down: openraft's errors about its stopped core are expected now.
pub fn stopping() {
    STOPPING.store(true, Ordering::Relaxed);
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// For people: `2026-12-02T10:00:00Z  INFO strata_hot::server: ...`, coloured on a terminal.
    #[default]
    Text,
    /// For log shippers: one JSON object a line with `timestamp`, `level`, `target`,
    /// `fields` (`message` among them) and the enclosing `spans`.
    Json,
}

/// Installs the process-wide subscriber.
pub fn init(format: LogFormat) {
    let registry = tracing_subscriber::registry()
        .with(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,openraft=warn".into()))
        .with(QuietPeerCallErrors);
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    match format {
        LogFormat::Text => registry
            .with(lines.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())))
            .init(),
        LogFormat::Json => registry
            .with(lines.json().with_current_span(false).with_span_list(true))
            .init(),
    }
}

/// Drops the events in `PEER_CALL_ERRORS`.
pub struct QuietPeerCallErrors;

impl<S: Subscriber> Layer<S> for QuietPeerCallErrors {
    fn event_enabled(&self, event: &Event<'_>, _: Context<'_, S>) -> bool {
        let meta = event.metadata();
        if *meta.level() != Level::ERROR || !meta.target().starts_with("openraft") {
            return true;
        }
        if STOPPING.load(Ordering::Relaxed) {
            return false;
        }
        let mut message = Message(None);
        event.record(&mut message);
        !PEER_CALL_ERRORS
            .iter()
            .any(|&(target, m)| meta.target() == target && message.0.as_deref() == Some(m))
    }
}

struct Message(Option<String>);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        if field.name() == "message" {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Records the message of every event that reaches it.
    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<String>>>);

    impl<S: Subscriber> Layer<S> for Seen {
        fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
            let mut m = Message(None);
            event.record(&mut m);
            self.0.lock().unwrap().push(m.0.unwrap_or_default());
        }
    }

    #[test]
    fn per_call_peer_errors_and_errors_at_shutdown_are_dropped_and_every_other_error_is_kept() {
        let seen = Seen::default();
        let subscriber = tracing_subscriber::registry()
            .with(QuietPeerCallErrors)
            .with(seen.clone());
        tracing::subscriber::with_default(subscriber, || {
            tracing::error!(target: "openraft::replication", err = "timeout after 100ms", "RPCError");
            tracing::error!(target: "openraft::core::raft_core", target = 3, "timeout while confirming leadership for read request");
            tracing::error!(target: "openraft::core::raft_core", error = "x", "timeout");
            tracing::error!(target: "openraft::core::raft_core", error = "x", "while requesting vote");
            // Kept: other openraft errors, the same message at another level or target.
            tracing::error!(target: "openraft::core::raft_core", error = "x", "quit RaftCore::main on error");
            tracing::error!(target: "openraft::storage::callback", "LogFlush error: disk");
            tracing::warn!(target: "openraft::replication", "RPCError");
            tracing::error!(target: "strata_hot::cluster", "RPCError");
        });
        assert_eq!(
            *seen.0.lock().unwrap(),
            [
                "quit RaftCore::main on error",
                "LogFlush error: disk",
                "RPCError",
                "RPCError"
            ]
        );
        // Once the process stops, openraft's errors about its stopped core are dropped too.
        seen.0.lock().unwrap().clear();
        stopping();
        let subscriber = tracing_subscriber::registry()
            .with(QuietPeerCallErrors)
            .with(seen.clone());
        tracing::subscriber::with_default(subscriber, || {
            tracing::error!(target: "openraft::raft::raft_inner", error = "Stopped", "core_call fatal error");
            tracing::error!(target: "strata_hot::server", "still reported");
        });
        assert_eq!(*seen.0.lock().unwrap(), ["still reported"]);
    }
}
