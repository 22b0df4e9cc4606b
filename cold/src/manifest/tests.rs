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
        aborted: Vec::new(),
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

/// Issue 14, defect 5: which remote segments a replica may count as tiered.
mod lineage {
    use std::collections::HashMap;

    use super::*;

    /// A segment [base, end) uploaded at `leader_epoch`, keyed by its range.
    fn seg(base: u64, end: u64, leader_epoch: i32) -> RemoteSegment {
        RemoteSegment {
            leader_epoch,
            ..segment(base, end, &format!("{base}-{end}"))
        }
    }

    fn manifest(log_start: u64, segments: Vec<RemoteSegment>) -> Manifest {
        let m = Manifest {
            format: FORMAT,
            version: 1,
            leader_epoch: 1,
            log_start,
            segments,
            retired: vec![],
        };
        m.validate().unwrap();
        m
    }

    /// The `.epochs` companions, by segment key.
    fn companions(pairs: &[(&RemoteSegment, &[(i32, u64)])]) -> HashMap<String, Vec<(i32, u64)>> {
        pairs
            .iter()
            .map(|(s, e)| (s.key.clone(), e.to_vec()))
            .collect()
    }

    fn lineage(epochs: &[(i32, u64)], log_start: u64, log_end: u64) -> Lineage {
        Lineage {
            epochs: epochs.to_vec(),
            log_start,
            log_end,
        }
    }

    /// The case: the old leader (epoch 1) uploaded [0, 200), written at epoch 0 up
    /// to 100 and at epoch 1 after; the new leader's log has epoch 0 from 0, then epoch 2
    /// from 100: only [0, 100) is the same history.
    #[test]
    fn an_unclean_leader_trusts_only_the_prefix_its_own_history_shares() {
        let (a, b) = (seg(0, 100, 1), seg(100, 200, 1));
        let epochs = companions(&[(&a, &[(0, 0)]), (&b, &[(0, 0), (1, 100)])]);
        let m = manifest(0, vec![a, b]);
        let new_leader = lineage(&[(0, 0), (2, 100)], 0, 150);
        assert_eq!(consistent_end(&m, &epochs, &new_leader), 100);
        // The old leader's own lineage (or a follower's copy of it) trusts all of it.
        let old_leader = lineage(&[(0, 0), (1, 100)], 0, 230);
        assert_eq!(consistent_end(&m, &epochs, &old_leader), 200);
    }

    #[test]
    fn records_past_the_local_log_end_are_not_trusted() {
        let (a, b) = (seg(0, 100, 1), seg(100, 200, 1));
        let epochs = companions(&[(&a, &[(0, 0)]), (&b, &[(0, 0), (1, 100)])]);
        let m = manifest(0, vec![a, b]);
        // Same epochs, but this log ends inside the second segment.
        assert_eq!(
            consistent_end(&m, &epochs, &lineage(&[(0, 0), (1, 100)], 0, 150)),
            100
        );
        assert_eq!(
            consistent_end(&m, &epochs, &lineage(&[(0, 0), (1, 100)], 0, 200)),
            200
        );
    }

    #[test]
    fn an_epoch_change_inside_a_segment_must_be_at_the_same_offset() {
        let a = seg(0, 200, 1);
        let epochs = companions(&[(&a, &[(0, 0), (1, 120)])]);
        let m = manifest(0, vec![a]);
        assert_eq!(
            consistent_end(&m, &epochs, &lineage(&[(0, 0), (1, 100)], 0, 300)),
            0
        );
        assert_eq!(
            consistent_end(&m, &epochs, &lineage(&[(0, 0), (1, 120)], 0, 300)),
            200
        );
        assert_eq!(
            consistent_end(&m, &epochs, &lineage(&[(0, 0), (1, 120), (3, 150)], 0, 300)),
            0,
            "a newer epoch inside the segment's range"
        );
    }

    #[test]
    fn a_divergent_segment_ends_the_prefix_even_if_later_ones_agree() {
        // [100, 200) is the old leader's; [200, 300) was uploaded on top of it by the new
        // leader before this fix.
        let (a, b, c) = (seg(0, 100, 1), seg(100, 200, 1), seg(200, 300, 2));
        let epochs = companions(&[
            (&a, &[(0, 0)]),
            (&b, &[(0, 0), (1, 100)]),
            (&c, &[(0, 0), (2, 100)]),
        ]);
        let m = manifest(0, vec![a, b, c]);
        assert_eq!(
            consistent_end(&m, &epochs, &lineage(&[(0, 0), (2, 100)], 0, 400)),
            100
        );
    }

    #[test]
    fn what_lies_below_the_local_log_start_is_trusted_and_the_rest_checked() {
        // This log was trimmed to 150 (its lineage too): [0, 100) cannot be checked; the
        // straddling [100, 200) is checked from 150 on.
        let (a, b) = (seg(0, 100, 9), seg(100, 200, 1));
        let epochs = companions(&[(&a, &[(9, 0)]), (&b, &[(0, 0), (1, 100)])]);
        let m = manifest(0, vec![a, b]);
        assert_eq!(
            consistent_end(&m, &epochs, &lineage(&[(1, 150)], 150, 250)),
            200
        );
        assert_eq!(
            consistent_end(&m, &epochs, &lineage(&[(2, 150)], 150, 250)),
            100
        );
        // An emptied log (restarted at 250 with no epochs yet) trusts what lies below it.
        assert_eq!(consistent_end(&m, &epochs, &lineage(&[], 250, 250)), 200);
        assert_eq!(consistent_end(&m, &epochs, &lineage(&[], 150, 150)), 100);
    }

    #[test]
    fn without_its_epochs_a_segment_is_checked_against_the_epoch_that_uploaded_it() {
        // No `.epochs` companion (or an empty one): every record in a segment was written
        // at or below the epoch that uploaded it.
        let (a, b) = (seg(0, 100, 1), seg(100, 200, 1));
        let m = manifest(0, vec![a.clone(), b]);
        let none = HashMap::new();
        assert_eq!(
            consistent_end(&m, &none, &lineage(&[(0, 0), (2, 100)], 0, 150)),
            100
        );
        assert_eq!(
            consistent_end(&m, &none, &lineage(&[(0, 0), (1, 100)], 0, 200)),
            200
        );
        let empty = companions(&[(&a, &[])]);
        assert_eq!(consistent_end(&m, &empty, &lineage(&[(2, 0)], 0, 200)), 0);
    }

    #[test]
    fn an_empty_manifest_ends_at_its_log_start() {
        let m = manifest(70, vec![]);
        assert_eq!(
            consistent_end(&m, &HashMap::new(), &lineage(&[(4, 0)], 0, 10)),
            70
        );
        let m = manifest(70, vec![seg(70, 80, 4)]);
        assert_eq!(
            consistent_end(&m, &HashMap::new(), &lineage(&[(5, 0)], 0, 100)),
            70
        );
    }

    /// Every history of up to 6 offsets over epochs 0..3, every local log (start, end,
    /// history) and every way of cutting the remote range into segments: the answer is the
    /// last segment boundary at or below the first offset, from the local log start, where
    /// the two histories differ or the local log ends.
    #[test]
    fn exhaustively_the_last_boundary_before_the_histories_part() {
        const N: usize = 6;
        // Non-decreasing epoch sequences of length `len`.
        fn histories(len: usize) -> Vec<Vec<i32>> {
            let mut out = vec![vec![]];
            for _ in 0..len {
                out = out
                    .into_iter()
                    .flat_map(|h: Vec<i32>| {
                        let low = h.last().copied().unwrap_or(0);
                        (low..3).map(move |e| {
                            let mut h = h.clone();
                            h.push(e);
                            h
                        })
                    })
                    .collect();
            }
            out
        }
        // (epoch, start) entries of `h` from offset `from`.
        fn entries(h: &[i32], from: usize) -> Vec<(i32, u64)> {
            let mut out: Vec<(i32, u64)> = Vec::new();
            for (o, &e) in h.iter().enumerate().skip(from) {
                if out.last().is_none_or(|l| l.0 != e) {
                    out.push((e, o as u64));
                }
            }
            out
        }
        let mut checked = 0u64;
        for remote in histories(N) {
            for cuts in 0u32..(1 << (N - 1)) {
                let mut bounds = vec![0u64];
                bounds.extend((1..N as u64).filter(|b| cuts & (1 << (b - 1)) != 0));
                bounds.push(N as u64);
                let segments: Vec<RemoteSegment> =
                    bounds.windows(2).map(|w| seg(w[0], w[1], 3)).collect();
                let epochs: HashMap<String, Vec<(i32, u64)>> = segments
                    .iter()
                    .map(|s| {
                        let upto = &remote[..s.end_offset as usize];
                        (s.key.clone(), entries(upto, 0))
                    })
                    .collect();
                let m = manifest(0, segments);
                for log_end in 0..=N {
                    for local in histories(log_end) {
                        for log_start in 0..=log_end {
                            let l = lineage(
                                &entries(&local, log_start),
                                log_start as u64,
                                log_end as u64,
                            );
                            let parted = (log_start..N)
                                .find(|&o| o >= log_end || local[o] != remote[o])
                                .unwrap_or(N) as u64;
                            let want = bounds
                                .iter()
                                .copied()
                                .filter(|&b| b <= parted)
                                .max()
                                .unwrap_or(0);
                            assert_eq!(
                                consistent_end(&m, &epochs, &l),
                                want,
                                "remote {remote:?} cut at {bounds:?}, local {local:?} from {log_start}"
                            );
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert!(checked > 100_000, "{checked}");
    }
}

#[tokio::test]
async fn cut_back_drops_the_segments_from_a_boundary_fenced_by_epoch() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let m = ManifestStore::new(store, prefix());
    for k in ["a", "b", "c"] {
        m.update(1, append(segment(0, 10, k))).await.unwrap();
    }
    let spans = m.cut_back(2, 15).await;
    assert!(
        matches!(&spans, Err(ManifestError::Rejected(why)) if why.contains("[10, 20) spans it")),
        "{spans:?}"
    );
    let cut = m.cut_back(2, 10).await.unwrap();
    assert_eq!((cut.leader_epoch, cut.end_offset()), (2, 10));
    assert_eq!(cut.segments[0].key, "a");
    // Cutting again writes nothing; a deposed leader cannot cut.
    assert_eq!(m.cut_back(2, 10).await.unwrap().version, cut.version);
    assert!(matches!(
        m.cut_back(1, 0).await,
        Err(ManifestError::Fenced {
            mine: 1,
            manifest: 2
        })
    ));
}
