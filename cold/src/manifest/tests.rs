use std::sync::atomic::Ordering;

use object_store::memory::InMemory;

use super::*;
use crate::testing::Flaky;

fn prefix() -> PartitionPrefix {
    PartitionPrefix::new("c1", "7f3a", 4)
}

fn segment(base: u64, end: u64, key: &str) -> RemoteSegment {
    RemoteSegment {
        base_offset: base,
        end_offset: end,
        min_timestamp: 0,
        max_timestamp: 1_000 + end as i64,
        size_bytes: 100 * (end - base),
        leader_epoch: 3,
        key: key.to_string(),
        compacted: None,
    }
}

/// The uploader's change: append `s` at the manifest's end, unless it is already there
/// (idempotent: a write whose answer was lost is seen on the retry).
fn append(s: RemoteSegment) -> impl Fn(&Manifest) -> Result<Option<Manifest>, String> {
    move |m| {
        if m.segments.iter().any(|x| x.key == s.key) {
            return Ok(None);
        }
        let mut next = m.clone();
        let mut s = s.clone();
        let len = s.end_offset - s.base_offset;
        s.base_offset = m.end_offset();
        s.end_offset = s.base_offset + len;
        next.segments.push(s);
        Ok(Some(next))
    }
}

#[tokio::test]
async fn updates_write_new_versions_and_load_reads_the_newest() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let m = ManifestStore::new(store.clone(), prefix());
    assert_eq!(m.load().await.unwrap().version, 0, "none yet");
    for i in 0..6u64 {
        let got = m
            .update(3, append(segment(0, 10, &format!("s{i}"))))
            .await
            .unwrap();
        assert_eq!(got.version, i + 1);
    }
    let loaded = m.load().await.unwrap();
    assert_eq!(loaded.end_offset(), 60);
    assert_eq!(loaded.leader_epoch, 3);
    assert_eq!(loaded.segment_for(25).map(|s| s.key.as_str()), Some("s2"));
    assert!(loaded.segment_for(60).is_none());
    // Only the newest few versions are kept.
    let listed: Vec<_> = store.list(None).try_collect().await.unwrap();
    assert_eq!(listed.len(), 4, "{listed:?}");
}

#[tokio::test]
async fn concurrent_writers_lose_no_update() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let mut tasks = Vec::new();
    for w in 0..4 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let m = ManifestStore::new(store, prefix());
            for i in 0..10 {
                m.update(1, append(segment(0, 5, &format!("w{w}-{i}"))))
                    .await
                    .unwrap();
                tokio::task::yield_now().await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let m = ManifestStore::new(store, prefix()).load().await.unwrap();
    assert_eq!(m.segments.len(), 40, "every writer's every segment is in");
    assert_eq!(m.version, 40, "one version per update");
    assert_eq!(m.end_offset(), 200);
    m.validate().unwrap();
}

#[tokio::test]
async fn a_deposed_leader_cannot_commit_after_the_new_one_claims() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let old = ManifestStore::new(store.clone(), prefix());
    let new = ManifestStore::new(store.clone(), prefix());
    old.update(4, append(segment(0, 10, "old-1")))
        .await
        .unwrap();
    let claimed = new.claim(5).await.unwrap();
    assert_eq!((claimed.leader_epoch, claimed.segments.len()), (5, 1));
    // The old leader finishes an upload late: refused, the manifest is unchanged.
    let late = old.update(4, append(segment(0, 10, "old-2"))).await;
    assert!(
        matches!(
            late,
            Err(ManifestError::Fenced {
                mine: 4,
                manifest: 5
            })
        ),
        "{late:?}"
    );
    let m = new.load().await.unwrap();
    assert_eq!(m.segments.len(), 1);
    // The new leader continues from the manifest's end.
    let m = new
        .update(5, append(segment(0, 10, "new-1")))
        .await
        .unwrap();
    assert_eq!(m.segments[1].base_offset, 10);
    // Claiming again at the same epoch writes nothing.
    assert_eq!(new.claim(5).await.unwrap().version, m.version);
}

#[tokio::test]
async fn store_failures_change_nothing_and_a_lost_answer_is_not_applied_twice() {
    let flaky = Arc::new(Flaky::default());
    let m = ManifestStore::new(flaky.clone(), prefix());
    m.update(1, append(segment(0, 10, "a"))).await.unwrap();

    flaky.fail_puts.store(1, Ordering::SeqCst);
    let failed = m.update(1, append(segment(0, 10, "b"))).await;
    assert!(matches!(failed, Err(ManifestError::Store(_))), "{failed:?}");
    assert_eq!(
        m.load().await.unwrap().segments.len(),
        1,
        "nothing half-written"
    );

    flaky.fail_reads.store(1, Ordering::SeqCst);
    assert!(
        m.load().await.is_err(),
        "a failed read is an error, not an empty manifest"
    );

    // The put lands but its answer is lost: the retry sees "b" already there.
    flaky.lose_put_answers.store(1, Ordering::SeqCst);
    assert!(m.update(1, append(segment(0, 10, "b"))).await.is_err());
    let again = m.update(1, append(segment(0, 10, "b"))).await.unwrap();
    let keys: Vec<&str> = again.segments.iter().map(|s| s.key.as_str()).collect();
    assert_eq!(keys, ["a", "b"]);
}

#[tokio::test]
async fn damaged_manifests_and_invalid_changes_are_refused_with_the_reason() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let m = ManifestStore::new(store.clone(), prefix());
    m.update(1, append(segment(0, 10, "a"))).await.unwrap();
    // A change that leaves a gap is refused before anything is written.
    let gap = m
        .update(1, |cur| {
            let mut next = cur.clone();
            next.segments.push(segment(15, 20, "gap"));
            Ok(Some(next))
        })
        .await;
    assert!(
        matches!(&gap, Err(ManifestError::Rejected(why)) if why.contains("does not follow")),
        "{gap:?}"
    );
    // A truncated manifest object is named in the error.
    store
        .put(
            &prefix().manifest(2),
            Bytes::from_static(b"{\"format\":1,\"ver").into(),
        )
        .await
        .unwrap();
    let e = m.load().await.unwrap_err().to_string();
    assert!(e.contains("manifest/00000000000000000002.json"), "{e}");
}

#[tokio::test]
async fn the_file_store_linearizes_writers_too() {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::store::open(&crate::store::StoreConfig {
        url: format!("file://{}", dir.path().display()),
        ..Default::default()
    })
    .unwrap();
    let a = ManifestStore::new(store.clone(), prefix());
    let b = ManifestStore::new(store, prefix());
    let (x, y) = tokio::join!(
        a.update(2, append(segment(0, 10, "x"))),
        b.update(2, append(segment(0, 10, "y")))
    );
    x.unwrap();
    y.unwrap();
    let m = a.load().await.unwrap();
    assert_eq!(m.segments.len(), 2);
    assert_eq!(m.version, 2);
}

#[tokio::test]
async fn an_unfenced_writer_keeps_the_leaders_epoch_and_races_it_safely() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let m = ManifestStore::new(store, prefix());
    m.claim(5).await.unwrap();
    m.update(5, append(segment(0, 10, "a"))).await.unwrap();
    // The compactor replaces "a" only if it is still there.
    let replace = |m: &Manifest| {
        let Some(i) = m.segments.iter().position(|s| s.key == "a") else {
            return Ok(None);
        };
        let mut next = m.clone();
        next.segments[i].key = "a2".into();
        Ok(Some(next))
    };
    let swapped = m.update_unfenced(replace).await.unwrap();
    assert_eq!(
        swapped.leader_epoch, 5,
        "the leader's epoch is kept, not raised"
    );
    assert_eq!(swapped.segments[0].key, "a2");
    // The leader goes on appending at its epoch: the compactor did not fence it.
    let after = m.update(5, append(segment(10, 20, "b"))).await.unwrap();
    assert_eq!(after.segments.len(), 2);
    // A newer leader claims; the compactor is not fenced by it either, and its change,
    // finding nothing to replace, writes nothing.
    m.claim(6).await.unwrap();
    let again = m.update_unfenced(replace).await.unwrap();
    assert_eq!(again.leader_epoch, 6);
    assert_eq!(
        again.version,
        after.version + 1,
        "no new version was written"
    );
}

/// Issue 14, defect 7: a writer several versions behind (it read version 1; versions 2 to 6
/// were written meanwhile and 2 was deleted as old) re-creates the deleted version 2. The
/// create-only put succeeds, but version 6 is still the newest: the update must not be
/// reported as done while it is lost, so the writer retries on top of the newest.
#[tokio::test]
async fn a_writer_far_behind_cannot_recreate_a_deleted_version_and_lose_its_update() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let late = ManifestStore::new(store.clone(), prefix());
    late.update(3, append(segment(0, 10, "first")))
        .await
        .unwrap();
    let stalled = std::sync::atomic::AtomicBool::new(true);
    let got = late
        .update(3, |current| {
            if stalled.swap(false, Ordering::SeqCst) {
                // While this writer holds version 1, others write versions 2 to 6.
                let store = store.clone();
                std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .build()
                        .unwrap();
                    rt.block_on(async {
                        let others = ManifestStore::new(store, prefix());
                        for i in 0..5 {
                            others
                                .update(3, append(segment(0, 10, &format!("other-{i}"))))
                                .await
                                .unwrap();
                        }
                    })
                })
                .join()
                .unwrap();
            }
            append(segment(0, 10, "late"))(current)
        })
        .await
        .unwrap();
    let newest = late.load().await.unwrap();
    assert!(
        newest.segments.iter().any(|s| s.key == "late"),
        "the update was reported done (version {}) but the newest manifest (version {}) lacks it",
        got.version,
        newest.version
    );
    assert_eq!(got, newest, "the update's answer is the newest manifest");
    assert_eq!(newest.segments.len(), 7);
    assert_eq!(newest.version, 7);
}
