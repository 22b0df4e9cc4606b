//! The cluster metadata as openraft's `RaftStateMachine`: applies committed metadata-log
//! entries to [`ClusterMetadata`], builds and installs snapshots (persisted as `snapshot` in
//! the controller directory), and publishes every new state on a watch channel for the
//! controller's services and the brokers' metadata streams.
//!
//! The applied state itself is not persisted: after a restart it is the snapshot plus the
//! committed log entries openraft re-applies.

use std::collections::VecDeque;
use std::io::{self, Cursor};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, EntryPayload, LogId, RaftSnapshotBuilder, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::log_store::write_json;
use super::{Entry, NodeId, Reply, TypeConfig};
use crate::metadata::{Applied, ClusterMetadata, Command};

const SNAPSHOT_FILE: &str = "snapshot";

#[derive(Clone, Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<NodeId, BasicNode>,
    /// JSON of the `ClusterMetadata` at `meta.last_log_id`.
    data: Vec<u8>,
}

/// Applied entries kept for watchers that are only a little behind.
const RECENT_ENTRIES: usize = 10_000;

struct SmInner {
    metadata: ClusterMetadata,
    /// The most recent applied entries, oldest first: (index, command; `None` for Raft's own
    /// entries). Continuous up to `metadata.version`.
    recent: VecDeque<(u64, Option<Command>)>,
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, BasicNode>,
    snapshot: Option<StoredSnapshot>,
    snapshots_built: u64,
}

/// The metadata state machine. Cloning shares it (the clone is also the snapshot builder).
#[derive(Clone)]
pub struct StateMachine {
    dir: PathBuf,
    inner: Arc<Mutex<SmInner>>,
    published: watch::Sender<Arc<ClusterMetadata>>,
}

fn sm_err(e: impl std::fmt::Display) -> StorageError<NodeId> {
    StorageIOError::write_state_machine(&io::Error::other(e.to_string())).into()
}

impl StateMachine {
    /// Opens the state machine in `dir`, starting from the stored snapshot if there is one.
    pub fn open(dir: &Path) -> io::Result<StateMachine> {
        strata_core::private_fs::create_dir_all(dir)?;
        let stored: Option<StoredSnapshot> = match std::fs::read(dir.join(SNAPSHOT_FILE)) {
            Ok(bytes) => Some(serde_json::from_slice(&bytes).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("controller snapshot is unreadable: {e}"),
                )
            })?),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let (metadata, last_applied, membership) = match &stored {
            Some(s) => (
                serde_json::from_slice(&s.data)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?,
                s.meta.last_log_id,
                s.meta.last_membership.clone(),
            ),
            None => (
                ClusterMetadata::default(),
                None,
                StoredMembership::default(),
            ),
        };
        let (published, _) = watch::channel(Arc::new(metadata.clone()));
        Ok(StateMachine {
            dir: dir.to_path_buf(),
            inner: Arc::new(Mutex::new(SmInner {
                metadata,
                recent: VecDeque::new(),
                last_applied,
                membership,
                snapshot: stored,
                snapshots_built: 0,
            })),
            published,
        })
    }

    fn lock(&self) -> MutexGuard<'_, SmInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The applied metadata, updated after every applied batch of entries.
    pub fn subscribe(&self) -> watch::Receiver<Arc<ClusterMetadata>> {
        self.published.subscribe()
    }

    pub fn current(&self) -> Arc<ClusterMetadata> {
        self.published.borrow().clone()
    }

    /// The applied entries after `version`, if they are all still retained; `None` when the
    /// watcher must start from a snapshot instead.
    pub fn entries_since(&self, version: u64) -> Option<Vec<(u64, Option<Command>)>> {
        let inner = self.lock();
        if version >= inner.metadata.version {
            return Some(Vec::new());
        }
        let oldest = inner.recent.front()?.0;
        if version + 1 < oldest {
            return None;
        }
        Some(
            inner
                .recent
                .iter()
                .filter(|(i, _)| *i > version)
                .cloned()
                .collect(),
        )
    }

    /// Writes a snapshot to disk (on the blocking pool) before it becomes the current one.
    async fn persist_snapshot(&self, stored: &StoredSnapshot) -> Result<(), StorageError<NodeId>> {
        let dir = self.dir.clone();
        let to_write = stored.clone();
        tokio::task::spawn_blocking(move || write_json(&dir, SNAPSHOT_FILE, &to_write))
            .await
            .map_err(sm_err)?
            .map_err(|e| StorageIOError::write_snapshot(Some(stored.meta.signature()), &e).into())
    }

    fn publish(&self, metadata: ClusterMetadata) {
        self.published.send_replace(Arc::new(metadata));
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let stored = {
            let mut inner = self.lock();
            inner.snapshots_built += 1;
            let data = serde_json::to_vec(&inner.metadata).map_err(sm_err)?;
            let snapshot_id = match inner.last_applied {
                Some(l) => format!("{}-{}-{}", l.leader_id, l.index, inner.snapshots_built),
                None => format!("empty-{}", inner.snapshots_built),
            };
            StoredSnapshot {
                meta: SnapshotMeta {
                    last_log_id: inner.last_applied,
                    last_membership: inner.membership.clone(),
                    snapshot_id,
                },
                data,
            }
        };
        self.persist_snapshot(&stored).await?;
        self.lock().snapshot = Some(stored.clone());
        Ok(Snapshot {
            meta: stored.meta,
            snapshot: Box::new(Cursor::new(stored.data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>), StorageError<NodeId>>
    {
        let inner = self.lock();
        Ok((inner.last_applied, inner.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Reply>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry> + openraft::OptionalSend,
        I::IntoIter: openraft::OptionalSend,
    {
        let (replies, snapshot) = {
            let mut inner = self.lock();
            let mut replies = Vec::new();
            for entry in entries {
                inner.last_applied = Some(entry.log_id);
                let index = entry.log_id.index;
                let command = match &entry.payload {
                    EntryPayload::Normal(cmd) => Some(cmd.clone()),
                    _ => None,
                };
                if inner.recent.len() == RECENT_ENTRIES {
                    inner.recent.pop_front();
                }
                inner.recent.push_back((index, command));
                let reply = match entry.payload {
                    EntryPayload::Blank => {
                        inner.metadata.version = index;
                        Ok(Applied::Done)
                    }
                    EntryPayload::Normal(cmd) => {
                        let result = inner.metadata.apply(entry.log_id.index, &cmd);
                        if let Err(e) = &result {
                            tracing::debug!(index = entry.log_id.index, error = %e, "metadata command refused");
                        }
                        result
                    }
                    EntryPayload::Membership(m) => {
                        inner.membership = StoredMembership::new(Some(entry.log_id), m);
                        inner.metadata.version = index;
                        Ok(Applied::Done)
                    }
                };
                replies.push(Reply(reply));
            }
            (replies, inner.metadata.clone())
        };
        self.publish(snapshot);
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<NodeId>> {
        let data = snapshot.into_inner();
        let metadata: ClusterMetadata = serde_json::from_slice(&data).map_err(|e| {
            StorageIOError::read_snapshot(Some(meta.signature()), &io::Error::other(e.to_string()))
        })?;
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data,
        };
        self.persist_snapshot(&stored).await?;
        {
            let mut inner = self.lock();
            inner.metadata = metadata.clone();
            inner.recent.clear();
            inner.last_applied = meta.last_log_id;
            inner.membership = meta.last_membership.clone();
            inner.snapshot = Some(stored);
        }
        self.publish(metadata);
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        Ok(self.lock().snapshot.clone().map(|s| Snapshot {
            meta: s.meta,
            snapshot: Box::new(Cursor::new(s.data)),
        }))
    }
}
