use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use strata_core::batch::build::{batch, ProducerIds, Rec};
use strata_core::batch::{self, BatchIter};

use super::super::{AppendError, PartitionLog, ValidBatch};
use super::CLEANED_FILE;
use crate::log::LogConfig;

const NOW: i64 = 10_000_000;

fn compacted_config(extra: &[(&str, &str)]) -> LogConfig {
    let mut m = BTreeMap::new();
    m.insert("segment.bytes".to_string(), "2048".to_string());
    m.insert("index.interval.bytes".to_string(), "256".to_string());
    m.insert("cleanup.policy".to_string(), "compact".to_string());
    for (k, v) in extra {
        m.insert(k.to_string(), v.to_string());
    }
    LogConfig::from_map(&m).unwrap()
}

fn producer(seq: i32) -> ProducerIds {
    ProducerIds {
        producer_id: 9,
        producer_epoch: 0,
        base_sequence: seq,
    }
}

/// One record of `key` (`None` value: a tombstone), from idempotent producer 9.
fn keyed(seq: i32, key: &str, value: Option<&str>, ts: i64) -> ValidBatch {
    let recs = [Rec {
        key: Some(key.as_bytes()),
        value: value.map(str::as_bytes),
        timestamp_delta: 0,
    }];
    ValidBatch::new(Bytes::from(batch(ts, producer(seq), &recs))).unwrap()
}

/// Every record the log serves: (offset, key, value).
fn records(log: &PartitionLog) -> Vec<(u64, String, Option<String>)> {
    let mut out = Vec::new();
    let mut next = log.start_offset();
    while let Some(plan) = log.plan_read(next, u64::MAX).unwrap() {
        let bytes = plan.read(1 << 20).unwrap();
        assert!(!bytes.is_empty(), "read at {next} returned nothing");
        for item in BatchIter::new(&bytes) {
            let (h, range) = item.unwrap();
            batch::verify(&bytes[range.clone()]).unwrap();
            for r in batch::records(&bytes[range]).unwrap() {
                out.push((
                    r.offset as u64,
                    String::from_utf8(r.key.unwrap().to_vec()).unwrap(),
                    r.value.map(|v| String::from_utf8(v.to_vec()).unwrap()),
                ));
            }
            next = h.last_offset() as u64 + 1;
        }
    }
    out
}

/// 120 records over 6 keys, each value naming its offset; returns the log and the last
/// offset written of each key.
fn fill(dir: &std::path::Path, config: LogConfig) -> (PartitionLog, HashMap<String, u64>) {
    let (mut log, _) = PartitionLog::open(dir, config, 0).unwrap();
    let mut last = HashMap::new();
    for i in 0..120 {
        let key = format!("k{}", i % 6);
        let value = format!("v{i}-{}", "x".repeat(60));
        let a = log
            .append(&keyed(i, &key, Some(&value), NOW - 1000), 0)
            .unwrap();
        last.insert(key, a.base_offset);
    }
    assert!(log.segment_count() > 4, "the test needs sealed segments");
    (log, last)
}

fn compact(log: &mut PartitionLog, now: i64) -> Option<super::CompactionReport> {
    let plan = log.plan_compaction(log.end_offset(), now, 1 << 20)?;
    let done = plan.run().unwrap();
    Some(log.install_compaction(done).unwrap())
}

#[test]
fn compaction_keeps_each_keys_latest_record_at_its_offset_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, last) = fill(dir.path(), compacted_config(&[]));
    let before = records(&log);
    let size_before = log.size_bytes();
    let active = log.active().base;
    let report = compact(&mut log, NOW).expect("a compaction is due");
    assert!(report.records_removed > 50, "{report:?}");
    assert!(log.size_bytes() < size_before / 2, "{report:?}");
    assert_eq!(report.dirty_end, active);
    let check = |log: &PartitionLog| {
        let after = records(log);
        // what stays is what was there, at the same offset
        for r in &after {
            assert!(before.contains(r), "{r:?} was not in the log before");
        }
        // below the active segment a key appears once, as its latest record there; every
        // key's latest record stays
        let mut seen = HashMap::new();
        for (offset, key, _) in after.iter().filter(|(o, ..)| *o < active) {
            assert!(seen.insert(key.clone(), *offset).is_none(), "{key} twice");
        }
        for (key, offset) in &last {
            assert!(
                after.iter().any(|(o, k, _)| o == offset && k == key),
                "{key}@{offset} lost"
            );
        }
        assert_eq!(log.end_offset(), 120);
    };
    check(&log);
    assert!(dir.path().join(CLEANED_FILE).exists());
    // nothing dirty is left: no new round
    assert!(log
        .plan_compaction(log.end_offset(), NOW, 1 << 20)
        .is_none());
    // an unclean stop (no close) and a clean one both reopen to the same log
    drop(log);
    let (mut log, _) = PartitionLog::open(dir.path(), compacted_config(&[]), 0).unwrap();
    check(&log);
    // the producer's sequence survives: a retry of its last batch is a duplicate, the next
    // sequence is accepted
    let retry = log
        .append(&keyed(119, "k5", Some("again"), NOW), 0)
        .unwrap();
    assert!(retry.duplicate);
    log.append(&keyed(120, "k0", Some("next"), NOW), 0).unwrap();
    log.close().unwrap();
    drop(log);
    let (log, _) = PartitionLog::open(dir.path(), compacted_config(&[]), 0).unwrap();
    assert_eq!(log.end_offset(), 121);
    assert!(!std::fs::read_dir(dir.path()).unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .ends_with(".tmp")));
}

#[test]
fn a_follower_copies_a_compacted_log_with_its_gaps() {
    let dir = tempfile::tempdir().unwrap();
    let (mut leader, _) = fill(dir.path(), compacted_config(&[]));
    compact(&mut leader, NOW).unwrap();
    let fdir = tempfile::tempdir().unwrap();
    let (mut follower, _) = PartitionLog::open(fdir.path(), compacted_config(&[]), 0).unwrap();
    super::super::tests::replicate(&leader, &mut follower);
    assert_eq!(records(&follower), records(&leader));
    // a batch below the end is still refused
    let first = leader
        .plan_read(0, u64::MAX)
        .unwrap()
        .unwrap()
        .read(1)
        .unwrap();
    let again = ValidBatch::replicated(first).unwrap();
    assert!(matches!(
        follower.append_replicated(&again, 0),
        Err(AppendError::NotContiguous { .. })
    ));
}

#[test]
fn tombstones_stay_for_delete_retention_then_go() {
    let dir = tempfile::tempdir().unwrap();
    let config = compacted_config(&[("delete.retention.ms", "5000")]);
    let (mut log, _) = fill(dir.path(), config.clone());
    // k0 deleted, then enough writes of other keys to seal the tombstone's segment
    let mut seq = 120;
    log.append(&keyed(seq, "k0", None, NOW - 1000), 0).unwrap();
    for i in 0..40 {
        seq += 1;
        let key = format!("k{}", 1 + i % 5);
        log.append(&keyed(seq, &key, Some(&"y".repeat(60)), NOW - 1000), 0)
            .unwrap();
    }
    compact(&mut log, NOW).unwrap();
    let k0: Vec<_> = records(&log)
        .into_iter()
        .filter(|(_, k, _)| k == "k0")
        .collect();
    assert_eq!(k0.len(), 1, "only the tombstone is left of k0: {k0:?}");
    assert_eq!(k0[0].2, None);
    // more writes make the log dirty again; past delete.retention.ms the tombstone goes
    for i in 0..60 {
        seq += 1;
        let key = format!("k{}", 1 + i % 5);
        log.append(&keyed(seq, &key, Some(&"z".repeat(60)), NOW + 10_000), 0)
            .unwrap();
    }
    compact(&mut log, NOW + 20_000).expect("due again");
    assert!(
        records(&log).iter().all(|(_, k, _)| k != "k0"),
        "the tombstone stayed"
    );
}

#[test]
fn rounds_are_due_by_dirty_ratio_or_lag_and_never_pass_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    // not a compacted topic: never
    let (log, _) = fill(dir.path(), {
        let mut c = compacted_config(&[]);
        c.cleanup_policy = "delete".into();
        c
    });
    assert!(log
        .plan_compaction(log.end_offset(), NOW, 1 << 20)
        .is_none());
    drop(log);
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = fill(dir.path(), compacted_config(&[]));
    // nothing sealed below the bound
    assert!(log.plan_compaction(0, NOW, 1 << 20).is_none());
    // a bound inside the log: only the segments wholly below it
    let plan = log.plan_compaction(60, NOW, 1 << 20).unwrap();
    let bases = plan.bases();
    assert!(!bases.is_empty() && bases.iter().all(|b| *b < 60));
    // records younger than min.compaction.lag.ms are not compacted
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = fill(
        dir.path(),
        compacted_config(&[("min.compaction.lag.ms", "5000")]),
    );
    assert!(log
        .plan_compaction(log.end_offset(), NOW, 1 << 20)
        .is_none());
    assert!(log
        .plan_compaction(log.end_offset(), NOW + 5000, 1 << 20)
        .is_some());
    // a high dirty ratio waits for more dirt, unless max.compaction.lag.ms has passed
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = fill(
        dir.path(),
        compacted_config(&[("min.cleanable.dirty.ratio", "0.99")]),
    );
    compact(&mut log, NOW).expect("everything is dirty at first");
    for i in 0..12 {
        log.append(&keyed(120 + i, "k1", Some(&"w".repeat(60)), NOW), 0)
            .unwrap();
    }
    log.roll(0).unwrap();
    assert!(log
        .plan_compaction(log.end_offset(), NOW, 1 << 20)
        .is_none());
    log.set_config(compacted_config(&[
        ("min.cleanable.dirty.ratio", "0.99"),
        ("max.compaction.lag.ms", "1000"),
    ]));
    assert!(log
        .plan_compaction(log.end_offset(), NOW + 2000, 1 << 20)
        .is_some());
}

#[test]
fn a_segment_deleted_while_it_was_rewritten_is_given_up() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = fill(dir.path(), compacted_config(&[]));
    let plan = log.plan_compaction(log.end_offset(), NOW, 1 << 20).unwrap();
    let done = plan.run().unwrap();
    let first_next = log.segments.keys().nth(1).copied().unwrap();
    log.trim_before(first_next).unwrap();
    let report = log.install_compaction(done).unwrap();
    assert_eq!(report.given_up, 1, "{report:?}");
    assert!(
        !dir.path().join(CLEANED_FILE).exists(),
        "a partial round must not count as done"
    );
    assert!(!std::fs::read_dir(dir.path()).unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .ends_with(".tmp")));
    // the rest was swapped in and reads back whole
    assert!(records(&log).len() < 120 - 10);
    // the next round finishes the job
    compact(&mut log, NOW).expect("still dirty");
    assert!(dir.path().join(CLEANED_FILE).exists());
}

#[test]
fn a_small_key_table_compacts_in_several_rounds() {
    let dir = tempfile::tempdir().unwrap();
    // due whenever anything is dirty, so the rounds go on until everything is compacted
    let config = compacted_config(&[("min.cleanable.dirty.ratio", "0")]);
    let (mut log, _) = PartitionLog::open(dir.path(), config, 0).unwrap();
    for i in 0..200 {
        let key = format!("key-{i:04}");
        log.append(&keyed(i, &key, Some(&"q".repeat(60)), NOW - 1000), 0)
            .unwrap();
    }
    for i in 0..200 {
        let key = format!("key-{i:04}");
        log.append(&keyed(200 + i, &key, Some(&"r".repeat(60)), NOW - 1000), 0)
            .unwrap();
    }
    let end = log.end_offset();
    let mut rounds = 0;
    while let Some(plan) = log.plan_compaction(end, NOW, 2000) {
        let done = plan.run().unwrap();
        let r = log.install_compaction(done).unwrap();
        rounds += 1;
        assert!(rounds < 100, "never finished: {r:?}");
    }
    assert!(rounds > 1, "a 2 KB table should not hold every key");
    let after = records(&log);
    let active = log.active().base;
    let below: Vec<_> = after.iter().filter(|(o, ..)| *o < active).collect();
    let mut keys: Vec<_> = below.iter().map(|(_, k, _)| k.clone()).collect();
    keys.sort();
    keys.dedup();
    assert_eq!(
        keys.len(),
        below.len(),
        "a key twice below the active segment"
    );
}
