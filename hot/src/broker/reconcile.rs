//! Cluster mode: makes the broker's topics and local replicas follow the controller's
//! metadata. Each new metadata version is compared with what the broker holds: replicas
//! assigned to this broker are opened (recovering any data from an earlier run), leadership
//! and leader epochs are taken from the metadata, and topics that disappeared (or were
//! re-created with a new id) are stopped and their local data removed.
//!
//! Each partition directory records its topic id (`topic-id`), so data left by a deleted
//! topic is never mistaken for a new topic of the same name.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use strata_controller::metadata::{ClusterMetadata, PartitionRecord, TopicRecord};
use tokio::sync::watch;
use uuid::Uuid;

use super::{Broker, Clock, Partition, PartitionLayout, Topic, TopicSpec};
use crate::cluster::ClusterLink;
use crate::log::config::TOPIC_CONFIG_KEYS;
use crate::log::{ConfigError, LogConfig, PartitionLog};
use crate::replication::follower;
use crate::replication::leader::{Assignment, Policy};
use crate::replication::session::Sessions;

const TOPIC_ID_FILE: &str = "topic-id";

/// Applies every metadata version the link receives until the broker is dropped (and the
/// same version again when a replica that was still opening becomes ready).
pub(super) async fn follow_metadata(
    broker: Weak<Broker>,
    mut rx: watch::Receiver<Arc<ClusterMetadata>>,
    again: Arc<tokio::sync::Notify>,
) {
    // A (re-)registration applies the metadata again: the first check for copies moved
    // away while the broker was down waits for it (see `remove_strays`).
    let mut registered = broker
        .upgrade()
        .and_then(|b| b.cluster.as_ref().map(|l| l.watch_epoch()));
    loop {
        let metadata = rx.borrow_and_update().clone();
        let Some(b) = broker.upgrade() else { return };
        if let Err(e) = b.reconcile(&metadata).await {
            tracing::error!(version = metadata.version, error = %e, "could not apply cluster metadata; will retry on the next version");
        }
        drop(b);
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { return },
            _ = again.notified() => {}
            Some(Ok(())) = async {
                match registered.as_mut() {
                    Some(r) => Some(r.changed().await),
                    None => std::future::pending().await,
                }
            } => {}
        }
    }
}

/// Replica logs opened (created or recovered) at once. A topic of 3,000 partitions used to
/// open its replicas one after another, each a few fsyncs, and reached the brokers' Metadata
/// 5.4 s after its creation was committed.
pub(super) const OPENS_AT_ONCE: usize = 16;

/// A replica log being opened (recovered) on the blocking pool.
pub(super) struct Opening {
    /// When the open got its slot and began (unset while it waits for one).
    pub started: Arc<std::sync::OnceLock<std::time::Instant>>,
    handle: tokio::task::JoinHandle<io::Result<PartitionLog>>,
    /// Whether the stuck alert was logged.
    alerted: bool,
}

/// Opens a partition directory for topic `id`, first removing data of another topic id.
fn open_replica(
    dir: &Path,
    id: Uuid,
    config: crate::log::LogConfig,
    now: i64,
) -> io::Result<PartitionLog> {
    let id_file = dir.join(TOPIC_ID_FILE);
    match fs::read_to_string(&id_file) {
        Ok(found) if found.trim() != id.to_string() => {
            tracing::warn!(dir = %dir.display(), found = found.trim(), expected = %id, "partition data belongs to an older topic of the same name; removing it");
            fs::remove_dir_all(dir)?;
        }
        _ => {}
    }
    let (log, report) = PartitionLog::open(dir, config, now)?;
    if report.truncated.is_some() || report.scanned_segments > 0 {
        tracing::info!(dir = %dir.display(), clean = report.clean, scanned = report.scanned_segments, truncated = report.truncated.is_some(), "recovered partition log");
    }
    if !id_file.exists() {
        crate::log::write_atomically(dir, TOPIC_ID_FILE, id.to_string().as_bytes())?;
    }
    Ok(log)
}

/// What a broker does with the configs the controllers give a topic.
#[derive(Debug, PartialEq)]
enum ConfigChoice {
    Use(LogConfig),
    /// Invalid: keep running with the configs the topic already has here.
    Keep(LogConfig, ConfigError),
    /// Invalid, and the topic is not open here: leave it closed.
    Close(ConfigError),
}

/// The controllers check configs with the same rules, so an invalid one comes from a log
/// entry written before they did. Never the defaults instead: they could serve a settlement
/// topic with `min.insync.replicas=1`. `running` (read only for an invalid config) gives
/// the configs the topic runs with here, if it is open.
fn choose_config(
    wanted: Result<LogConfig, ConfigError>,
    running: impl FnOnce() -> Option<LogConfig>,
) -> ConfigChoice {
    match wanted {
        Ok(c) => ConfigChoice::Use(c),
        Err(e) => match running() {
            Some(kept) => ConfigChoice::Keep(kept, e),
            None => ConfigChoice::Close(e),
        },
    }
}

/// The topic configs a broker reads, of those the controllers hold for `t`.
fn known_configs(t: &TopicRecord) -> BTreeMap<String, String> {
    t.configs
        .iter()
        .filter(|(k, _)| TOPIC_CONFIG_KEYS.iter().any(|(known, _)| known == k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn remove_replica_dirs(dirs: Vec<PathBuf>) {
    for dir in dirs {
        if let Err(e) = fs::remove_dir_all(&dir) {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::warn!(dir = %dir.display(), error = %e, "could not remove deleted partition data");
            }
        }
    }
}

impl Broker {
    async fn reconcile(&self, m: &ClusterMetadata) -> io::Result<()> {
        let node = self.config.node_id;
        let current: HashMap<String, Arc<Topic>> = self
            .topics()
            .into_iter()
            .map(|t| (t.spec.name.clone(), t))
            .collect();

        // Topics gone (or re-created with another id): stop them and remove their data first.
        let mut doomed = Vec::new();
        for (name, old) in &current {
            if m.topics.get(name).map(|t| t.id) != Some(old.spec.id) {
                for p in old.local() {
                    p.stop();
                    doomed.push(self.partition_dir(name, p.index as u32));
                }
                tracing::info!(topic = %name, "topic removed from the cluster; deleting local replicas");
            }
        }
        if !doomed.is_empty() {
            tokio::task::spawn_blocking(move || remove_replica_dirs(doomed))
                .await
                .map_err(io::Error::other)?;
        }

        self.remove_strays(m).await?;
        let now = self.clock.now_ms();
        let deadline = tokio::time::Instant::now() + self.config.replica_open_timeout;
        self.start_opens(m, &current, now);
        let mut next = HashMap::with_capacity(m.topics.len());
        let mut moved_away = Vec::new();
        for t in m.topics.values() {
            let prev = current.get(&t.name).filter(|p| p.spec.id == t.id);
            let known = known_configs(t);
            let running = || prev.and_then(|p| p.local().next().map(|p| p.log_config()));
            let config = match choose_config(self.log_config(&known), running) {
                ConfigChoice::Use(c) => c,
                ConfigChoice::Keep(kept, e) => {
                    tracing::error!(topic = %t.name, error = %e, "refusing the topic's configs from the controllers; keeping the ones it had (fix them with IncrementalAlterConfigs, e.g. kafka-configs --alter)");
                    kept
                }
                ConfigChoice::Close(e) => {
                    tracing::error!(topic = %t.name, error = %e, "refusing the topic's configs from the controllers; not serving it on this broker until they are fixed (IncrementalAlterConfigs, e.g. kafka-configs --alter)");
                    continue;
                }
            };
            let topic_name: Arc<str> = Arc::from(t.name.as_str());
            let mut partitions = Vec::with_capacity(t.partitions.len());
            for (i, pr) in t.partitions.iter().enumerate() {
                if !pr.replicas.contains(&node) {
                    // Moved away (a completed reassignment): stop and delete the copy.
                    if let Some(p) = prev.and_then(|p| p.partitions.get(i).cloned().flatten()) {
                        p.stop();
                        moved_away.push(self.partition_dir(&t.name, i as u32));
                        tracing::info!(topic = %t.name, partition = i, "replica moved to other brokers; deleting the local copy");
                    }
                    partitions.push(None);
                    continue;
                }
                let existing = prev.and_then(|p| p.partitions.get(i).cloned().flatten());
                let partition = match existing {
                    Some(p) => {
                        p.set_config(config.clone(), self.replica_lag_ms());
                        p
                    }
                    None => {
                        let dir = self.partition_dir(&t.name, i as u32);
                        let Some(log) = self.open_log(dir, t, i, &config, now, deadline).await?
                        else {
                            // Still opening: unavailable here until it is done.
                            partitions.push(None);
                            continue;
                        };
                        // What is committed is learned again from the leader (or, leading,
                        // from the ISR's fetches), so nothing uncommitted becomes visible.
                        let start = log.start_offset();
                        Partition::start(topic_name.clone(), i as i32, log, start)
                    }
                };
                self.apply_role(&partition, t, pr, &config, now);
                partitions.push(Some(partition));
            }
            let layout = t
                .partitions
                .iter()
                .map(|p| PartitionLayout {
                    leader: p.leader,
                    leader_epoch: p.leader_epoch,
                    replicas: p.replicas.clone(),
                    isr: p.isr.clone(),
                    adding: p
                        .reassignment
                        .as_ref()
                        .map_or_else(Vec::new, |r| r.adding()),
                    removing: p
                        .reassignment
                        .as_ref()
                        .map_or_else(Vec::new, |r| r.removing()),
                    throttle: p.reassignment.as_ref().and_then(|r| r.throttle),
                })
                .collect();
            let spec = TopicSpec {
                name: t.name.clone(),
                id: t.id,
                partitions: t.partitions.len() as u32,
                replication_factor: t.replication_factor,
                configs: t.configs.clone(),
            };
            next.insert(
                t.name.clone(),
                Arc::new(Topic {
                    spec,
                    partitions,
                    layout,
                }),
            );
        }
        // Background opens of replicas no longer assigned here are forgotten.
        self.opening
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|dir, _| {
                m.topics.values().any(|t| {
                    t.partitions.iter().enumerate().any(|(i, p)| {
                        p.replicas.contains(&node) && self.partition_dir(&t.name, i as u32) == *dir
                    })
                })
            });
        self.hold_layout_while_a_test_asks().await;
        *self.topics_write() = next;
        if !moved_away.is_empty() {
            tokio::task::spawn_blocking(move || remove_replica_dirs(moved_away))
                .await
                .map_err(io::Error::other)?;
        }
        self.layout_changed();
        self.metadata_version.send_replace(m.version);
        Ok(())
    }

    /// Once per start: deletes the copies of replicas that were moved to other brokers while
    /// this one was down (a reassignment completed without it). Only at metadata at least as
    /// new as this broker's own registration, which every move finished before it includes,
    /// and only a directory that holds the same topic id: never a replica the broker should
    /// hold.
    async fn remove_strays(&self, m: &ClusterMetadata) -> io::Result<()> {
        use std::sync::atomic::Ordering::Relaxed;
        if self.strays_checked.load(Relaxed) {
            return Ok(());
        }
        let Some(registered) = self.cluster.as_ref().and_then(|l| l.epoch()) else {
            return Ok(());
        };
        if m.version < registered {
            return Ok(());
        }
        self.strays_checked.store(true, Relaxed);
        let node = self.config.node_id;
        let candidates: Vec<(PathBuf, Uuid)> = m
            .topics
            .values()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| !p.replicas.contains(&node))
                    .map(|(i, _)| (self.partition_dir(&t.name, i as u32), t.id))
            })
            .collect();
        tokio::task::spawn_blocking(move || {
            let strays: Vec<PathBuf> = candidates
                .into_iter()
                .filter(|(dir, id)| {
                    fs::read_to_string(dir.join(TOPIC_ID_FILE))
                        .is_ok_and(|found| found.trim() == id.to_string())
                })
                .map(|(dir, _)| dir)
                .collect();
            for dir in &strays {
                tracing::info!(dir = %dir.display(), "replica moved to other brokers while this one was down; deleting the local copy");
            }
            remove_replica_dirs(strays);
        })
        .await
        .map_err(io::Error::other)
    }

    /// Starts opening (or recovering) a replica's log on the blocking pool, once one of the
    /// [`OPENS_AT_ONCE`] slots is free.
    fn open_replica_log(&self, dir: PathBuf, id: Uuid, config: &LogConfig, now: i64) -> Opening {
        let (slots, again, config) = (
            self.open_slots.clone(),
            self.reconcile_again.clone(),
            config.clone(),
        );
        let stuck_after = self.config.replica_open_timeout;
        let started = Arc::new(std::sync::OnceLock::new());
        let began = started.clone();
        let handle = tokio::spawn(async move {
            let slot = slots.acquire_owned().await.map_err(io::Error::other)?;
            let _ = began.set(std::time::Instant::now());
            let mut opening =
                tokio::task::spawn_blocking(move || open_replica(&dir, id, config, now));
            let opened = match tokio::time::timeout(stuck_after, &mut opening).await {
                Ok(joined) => joined,
                Err(_) => {
                    // Stuck (a hung disk, a FIFO in the way): it gives its slot back, so the
                    // replicas queued behind it open; it keeps its blocking thread.
                    drop(slot);
                    opening.await
                }
            };
            again.notify_one();
            opened.map_err(io::Error::other)?
        });
        Opening {
            started,
            handle,
            alerted: false,
        }
    }

    /// Starts opening, side by side, every replica log `m` assigns here that is neither open
    /// nor opening, so that the loop applying `m`, which waits for each in turn, waits about
    /// as long as for the slowest rather than for their sum. A topic whose configs are
    /// invalid is left to that loop (which logs why, and may keep the running configs).
    fn start_opens(&self, m: &ClusterMetadata, current: &HashMap<String, Arc<Topic>>, now: i64) {
        let node = self.config.node_id;
        let mut opening = self.opening.lock().unwrap_or_else(|e| e.into_inner());
        for t in m.topics.values() {
            let prev = current.get(&t.name).filter(|p| p.spec.id == t.id);
            let mut to_open = t
                .partitions
                .iter()
                .enumerate()
                .filter(|(i, pr)| {
                    pr.replicas.contains(&node)
                        && !prev.is_some_and(|p| matches!(p.partitions.get(*i), Some(Some(_))))
                })
                .peekable();
            // (most metadata changes open nothing: the configs are merged only when needed)
            if to_open.peek().is_none() {
                continue;
            }
            let Ok(config) = self.log_config(&known_configs(t)) else {
                continue;
            };
            for (i, _) in to_open {
                let dir = self.partition_dir(&t.name, i as u32);
                if let std::collections::hash_map::Entry::Vacant(slot) = opening.entry(dir) {
                    let dir = slot.key().clone();
                    slot.insert(self.open_replica_log(dir, t.id, &config, now));
                }
            }
        }
    }

    /// Opens (recovering) a replica's log on the blocking pool, waiting until `deadline`.
    /// `Ok(None)` when it is not done by then: the open goes on in the background, an
    /// alert is logged once it has taken longer than `replica_open_timeout`, and the
    /// metadata is applied again when it finishes.
    async fn open_log(
        &self,
        dir: PathBuf,
        t: &TopicRecord,
        index: usize,
        config: &LogConfig,
        now: i64,
        deadline: tokio::time::Instant,
    ) -> io::Result<Option<PartitionLog>> {
        let existing = self
            .opening
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&dir);
        let mut opening =
            existing.unwrap_or_else(|| self.open_replica_log(dir.clone(), t.id, config, now));
        match tokio::time::timeout_at(deadline, &mut opening.handle).await {
            Ok(joined) => joined.map_err(io::Error::other)?.map(Some),
            Err(_) => {
                let limit = self.config.replica_open_timeout;
                let running = opening.started.get().map(|s| s.elapsed());
                if running.is_some_and(|r| r >= limit) && !opening.alerted {
                    opening.alerted = true;
                    tracing::error!(topic = %t.name, partition = index, dir = %dir.display(), waited = ?running, "replica log still opening (recovery stuck?); the partition is unavailable on this broker until it finishes");
                }
                self.opening
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(dir, opening);
                Ok(None)
            }
        }
    }

    /// Failpoint `broker-<id>-hold-layout`: while armed, a test holds this broker between
    /// taking on its partitions' new roles and installing the topics' new layouts (as a
    /// reconcile descheduled on a busy machine would be).
    async fn hold_layout_while_a_test_asks(&self) {
        if strata_controller::failpoint::enabled() {
            let name = format!("broker-{}-hold-layout", self.config.node_id);
            strata_controller::failpoint::hold_while_armed(&name).await;
        }
    }

    /// Makes a local replica lead, follow or idle as the metadata says.
    fn apply_role(
        &self,
        partition: &Arc<Partition>,
        t: &TopicRecord,
        pr: &PartitionRecord,
        config: &LogConfig,
        now: i64,
    ) {
        let node = self.config.node_id;
        match pr.leader {
            Some(leader) if leader == node => partition.become_leader(
                pr.leader_epoch,
                Assignment {
                    me: node,
                    replicas: pr.replicas.clone(),
                    isr: pr.isr.clone(),
                    partition_epoch: pr.partition_epoch,
                },
                Policy {
                    min_insync_replicas: usize::from(config.min_insync_replicas),
                    replica_lag_max_ms: self.replica_lag_ms(),
                },
                now,
            ),
            Some(leader) => {
                let Some(link) = self.cluster.clone() else {
                    return;
                };
                if let Some(stop) = partition.become_follower(leader, pr.leader_epoch) {
                    let target = follower::Target {
                        me: node,
                        topic: t.name.clone(),
                        topic_id: t.id.to_string(),
                        leader,
                        leader_epoch: pr.leader_epoch,
                    };
                    let directory = Arc::new(LinkDirectory {
                        link,
                        clock: self.clock.clone(),
                        sessions: self.sessions.clone(),
                    });
                    tokio::spawn(follower::run(partition.clone(), target, directory, stop));
                }
            }
            None => partition.become_idle(),
        }
    }
}

/// Finds leaders' gRPC addresses in the cluster metadata.
struct LinkDirectory {
    link: Arc<ClusterLink>,
    clock: Arc<dyn Clock>,
    sessions: Arc<Sessions>,
}

impl follower::Directory for LinkDirectory {
    fn grpc_address(&self, broker: i32) -> Option<String> {
        self.link.grpc_address(broker)
    }

    fn tls(&self) -> Option<Arc<strata_proto::tls::GrpcTls>> {
        self.link.tls().cloned()
    }

    fn broker_epoch(&self) -> Option<u64> {
        self.link.epoch()
    }

    fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    fn storage_error(&self, error: &std::io::Error) {
        self.link.storage_error(error);
    }

    fn sessions(&self) -> &Sessions {
        &self.sessions
    }
}

/// Live brokers' Kafka endpoints from the metadata: (id, host, port).
pub fn kafka_endpoints(m: &ClusterMetadata, listener: &str) -> Vec<(i32, String, u16)> {
    m.brokers
        .values()
        .filter(|b| !b.fenced)
        .filter_map(|b| {
            b.endpoints
                .iter()
                .find(|e| e.name == listener)
                .map(|e| (b.id, e.host.clone(), e.port))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 17: a topic config a broker could not use made it silently run the topic with
    /// every default (for a settlement topic: min.insync.replicas=1, acks=all acknowledged
    /// by one replica).
    #[test]
    fn an_invalid_topic_config_never_falls_back_to_the_defaults() {
        let strict: BTreeMap<String, String> =
            [("min.insync.replicas".to_string(), "2".to_string())].into();
        let strict = LogConfig::from_map(&strict).unwrap();
        let bad: BTreeMap<String, String> =
            [("min.insync.replicas".to_string(), "two".to_string())].into();
        let wanted = || LogConfig::from_map(&bad);
        let error = wanted().unwrap_err();
        assert_eq!(
            choose_config(wanted(), || Some(strict.clone())),
            ConfigChoice::Keep(strict.clone(), error.clone())
        );
        assert_eq!(choose_config(wanted(), || None), ConfigChoice::Close(error));
        let good = LogConfig::default();
        assert_eq!(
            choose_config(Ok(good.clone()), || Some(strict)),
            ConfigChoice::Use(good)
        );
    }
}
