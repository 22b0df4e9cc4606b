use std::sync::Mutex;

use openraft::testing::{StoreBuilder, Suite};
use openraft::StorageError;

use super::*;

/// Builds a fresh log store and state machine in a new temporary directory; keeps the
/// directories alive for the suite's duration.
struct DiskStoreBuilder {
    dirs: Mutex<Vec<tempfile::TempDir>>,
}

impl StoreBuilder<TypeConfig, LogStore, StateMachine, ()> for DiskStoreBuilder {
    async fn build(&self) -> Result<((), LogStore, StateMachine), StorageError<NodeId>> {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = LogStore::open(&dir.path().join("log")).expect("open log");
        let sm = StateMachine::open(&dir.path().join("sm")).expect("open state machine");
        self.dirs.lock().unwrap().push(dir);
        Ok(((), log, sm))
    }
}

#[test]
fn openraft_storage_conformance_suite() {
    let builder = DiskStoreBuilder {
        dirs: Mutex::new(Vec::new()),
    };
    if let Err(e) = Suite::test_all(builder) {
        panic!("storage conformance failed: {e}");
    }
}

mod durability {
    use std::fs::OpenOptions;
    use std::io::Write;

    use openraft::storage::{RaftLogStorage, RaftStateMachine};
    use openraft::{CommittedLeaderId, EntryPayload, LogId, RaftLogReader, RaftSnapshotBuilder};
    use uuid::Uuid;

    use super::*;
    use crate::metadata::Command;

    fn entry(index: u64, payload: EntryPayload<TypeConfig>) -> Entry {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload,
        }
    }

    fn register(id: i32) -> EntryPayload<TypeConfig> {
        EntryPayload::Normal(Command::RegisterBroker {
            id,
            incarnation: Uuid::new_v4(),
            endpoints: vec![],
            rack: None,
        })
    }

    /// Appends directly through the inner writer (the callback path is covered by the suite).
    async fn append(log: &mut LogStore, entries: Vec<Entry>) {
        log.blocking_append_for_tests(entries).await.unwrap();
    }

    #[tokio::test]
    async fn log_survives_reopen_and_a_torn_tail_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = LogStore::open(dir.path()).unwrap();
        append(
            &mut log,
            (1..=5).map(|i| entry(i, register(i as i32))).collect(),
        )
        .await;
        drop(log);
        // a crash mid-append leaves half a record
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.path().join("raft-log"))
            .unwrap();
        f.write_all(&[0, 0, 0, 200, 1, 2, 3]).unwrap();
        let mut log = LogStore::open(dir.path()).unwrap();
        let entries = log.try_get_log_entries(0..100).await.unwrap();
        assert_eq!(
            entries.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
            vec![1, 2, 3, 4, 5]
        );
        // appends continue after the cut
        append(&mut log, vec![entry(6, EntryPayload::Blank)]).await;
        drop(log);
        let mut log = LogStore::open(dir.path()).unwrap();
        assert_eq!(log.try_get_log_entries(0..100).await.unwrap().len(), 6);
        // truncate and purge survive a reopen too
        log.truncate(LogId::new(CommittedLeaderId::new(1, 1), 5))
            .await
            .unwrap();
        log.purge(LogId::new(CommittedLeaderId::new(1, 1), 2))
            .await
            .unwrap();
        drop(log);
        let mut log = LogStore::open(dir.path()).unwrap();
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id.map(|l| l.index), Some(2));
        assert_eq!(state.last_log_id.map(|l| l.index), Some(4));
        let entries = log.try_get_log_entries(0..100).await.unwrap();
        assert_eq!(
            entries.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
            vec![3, 4]
        );
    }

    #[tokio::test]
    async fn watchers_get_entries_after_their_version_or_need_a_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let mut sm = StateMachine::open(dir.path()).unwrap();
        sm.apply(vec![
            entry(1, EntryPayload::Blank),
            entry(2, register(1)),
            entry(3, register(2)),
        ])
        .await
        .unwrap();
        assert_eq!(sm.current().version, 3);
        let since1 = sm.entries_since(1).unwrap();
        assert_eq!(
            since1.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            vec![2, 3]
        );
        assert!(since1.iter().all(|(_, c)| c.is_some()));
        assert_eq!(sm.entries_since(0).unwrap().len(), 3);
        assert!(sm.entries_since(3).unwrap().is_empty());
        // Replaying the entries on a copy gives the controller's state (what brokers do).
        let mut replica = crate::metadata::ClusterMetadata::default();
        for (i, c) in sm.entries_since(0).unwrap() {
            match c {
                Some(c) => {
                    let _ = replica.apply(i, &c);
                }
                None => replica.version = i,
            }
        }
        assert_eq!(replica, *sm.current());
        // After a restart the old entries are gone: a watcher needs a snapshot.
        sm.build_snapshot().await.unwrap();
        drop(sm);
        let sm = StateMachine::open(dir.path()).unwrap();
        assert!(sm.entries_since(1).is_none());
    }

    #[tokio::test]
    async fn state_machine_restarts_from_its_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let mut sm = StateMachine::open(dir.path()).unwrap();
        let replies = sm
            .apply((1..=3).map(|i| entry(i, register(i as i32))))
            .await
            .unwrap();
        assert!(replies.iter().all(|r| r.0.is_ok()));
        assert_eq!(sm.current().brokers.len(), 3);
        let snap = sm.build_snapshot().await.unwrap();
        assert_eq!(snap.meta.last_log_id.map(|l| l.index), Some(3));
        drop(sm);
        let mut sm = StateMachine::open(dir.path()).unwrap();
        let (applied, _) = sm.applied_state().await.unwrap();
        assert_eq!(applied.map(|l| l.index), Some(3));
        assert_eq!(sm.current().brokers.len(), 3);
        assert_eq!(sm.current().version, 3);
    }
}
