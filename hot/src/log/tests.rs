use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use strata_core::batch::build::{batch, ProducerIds, Rec};

use super::*;

fn small_config(segment_bytes: u64) -> LogConfig {
    let mut m = BTreeMap::new();
    m.insert("segment.bytes".to_string(), segment_bytes.to_string());
    m.insert("index.interval.bytes".to_string(), "256".to_string());
    LogConfig::from_map(&m).unwrap()
}

/// A batch of `n` records whose values name `tag`, at `ts`, `ts+1`, ...
fn make(tag: u64, n: usize, ts: i64, ids: ProducerIds) -> ValidBatch {
    let values: Vec<Vec<u8>> = (0..n)
        .map(|i| format!("v{tag}-{i}-{}", "x".repeat(40)).into_bytes())
        .collect();
    let recs: Vec<Rec<'_>> = values
        .iter()
        .enumerate()
        .map(|(i, v)| Rec {
            key: None,
            value: Some(v),
            timestamp_delta: i as i64,
        })
        .collect();
    ValidBatch::new(Bytes::from(batch(ts, ids, &recs))).unwrap()
}

/// Reads every batch from `from` to the end, returning (base offset, record count) pairs.
fn read_all(log: &PartitionLog, from: u64) -> Vec<(u64, i32)> {
    let mut out = Vec::new();
    let mut next = from;
    while let Some(plan) = log.plan_read(next, u64::MAX).unwrap() {
        let bytes = plan.read(1000).unwrap();
        assert!(!bytes.is_empty(), "read at {next} returned nothing");
        for item in BatchIter::new(&bytes) {
            let (h, range) = item.unwrap();
            batch::verify(&bytes[range]).unwrap();
            if (h.last_offset() as u64) >= next {
                out.push((h.base_offset as u64, h.record_count));
                next = h.last_offset() as u64 + 1;
            }
        }
    }
    out
}

/// Idempotent producer 5 at epoch 0, batch starting at sequence `seq`.
fn producer_5(seq: i32) -> ProducerIds {
    ProducerIds {
        producer_id: 5,
        producer_epoch: 0,
        base_sequence: seq,
    }
}

fn append_many(log: &mut PartitionLog, batches: usize) -> Vec<(u64, i32)> {
    (0..batches)
        .map(|i| {
            let n = 1 + i % 4;
            let a = log
                .append(
                    &make(i as u64, n, 1_000 + i as i64 * 10, ProducerIds::NONE),
                    0,
                )
                .unwrap();
            assert_eq!(a.last_offset - a.base_offset + 1, n as u64);
            (a.base_offset, n as i32)
        })
        .collect()
}

#[test]
fn append_and_read_across_rolls() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(2048), 0).unwrap();
    let written = append_many(&mut log, 100);
    assert!(
        log.segment_count() > 3,
        "expected rolls, got {}",
        log.segment_count()
    );
    assert_eq!(read_all(&log, 0), written);
    // Reading from the middle of a batch returns that whole batch first.
    let (base, n) = written[37];
    assert!(n > 1 || written[38].1 > 1);
    let mid = if n > 1 { base + 1 } else { written[38].0 + 1 };
    let got = read_all(&log, mid);
    assert!(got[0].0 < mid && got[0].0 + got[0].1 as u64 > mid);
    assert_eq!(got.last(), written.last());
}

#[test]
fn reads_stop_at_the_upper_bound_and_out_of_range_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(1 << 20), 0).unwrap();
    let written = append_many(&mut log, 10);
    let upper = written[5].0; // batches 0..5 are below
    let bytes = log
        .plan_read(0, upper)
        .unwrap()
        .unwrap()
        .read(1 << 20)
        .unwrap();
    assert_eq!(BatchIter::new(&bytes).count(), 5);
    assert!(log.plan_read(upper, upper).unwrap().is_none());
    let end = log.end_offset();
    assert!(log.plan_read(end, u64::MAX).unwrap().is_none());
    assert!(matches!(
        log.plan_read(end + 1, u64::MAX),
        Err(ReadError::OffsetOutOfRange { .. })
    ));
}

#[test]
fn first_batch_is_returned_whole_even_when_larger_than_max_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(1 << 20), 0).unwrap();
    append_many(&mut log, 3);
    let bytes = log
        .plan_read(0, u64::MAX)
        .unwrap()
        .unwrap()
        .read(1)
        .unwrap();
    assert_eq!(BatchIter::new(&bytes).count(), 1);
}

#[test]
fn timestamp_lookup_finds_first_record_at_or_after() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(2048), 0).unwrap();
    let written = append_many(&mut log, 50);
    // batch i has records at 1000 + 10 i + j
    let (base, _) = written[20];
    assert_eq!(
        log.offset_for_timestamp(1_200).unwrap(),
        Some((base, 1_200))
    );
    let (base21, n21) = written[21];
    if n21 > 1 {
        assert_eq!(
            log.offset_for_timestamp(1_211).unwrap(),
            Some((base21 + 1, 1_211))
        );
    }
    assert_eq!(log.offset_for_timestamp(0).unwrap(), Some((0, 1_000)));
    assert_eq!(log.offset_for_timestamp(1_000_000).unwrap(), None);
    let (ts, _) = log.max_timestamp().unwrap();
    assert_eq!(ts, 1_000 + 49 * 10 + (written[49].1 as i64 - 1));
}

#[test]
fn trim_before_deletes_only_whole_segments_below_the_offset() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(2048), 0).unwrap();
    append_many(&mut log, 100);
    let bases: Vec<u64> = log.segments.keys().copied().collect();
    assert!(bases.len() >= 4, "{bases:?}");
    // An offset inside the third segment: the first two go, the third stays whole.
    let cut = bases[2] + 1;
    let deleted = log.trim_before(cut).unwrap();
    assert_eq!(deleted, bases[..2].to_vec());
    assert_eq!(log.start_offset(), bases[2]);
    assert!(log.plan_read(bases[2], u64::MAX).unwrap().is_some());
    // Nothing below the start: a no-op. Past the end: every sealed segment goes, never the
    // active one.
    assert!(log.trim_before(bases[2]).unwrap().is_empty());
    let end = log.end_offset();
    log.trim_before(u64::MAX).unwrap();
    assert_eq!(log.segment_count(), 1);
    assert_eq!(log.end_offset(), end);
}

#[test]
fn retention_by_bytes_and_time_deletes_oldest_sealed_segments() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(2048), 0).unwrap();
    append_many(&mut log, 100);
    let segments = log.segment_count();
    let mut config = small_config(2048);
    config.retention_bytes = Some(4096);
    config.retention_ms = None;
    log.set_config(config.clone());
    let deleted = log.apply_retention(0, None).unwrap();
    assert!(!deleted.is_empty());
    assert!(log.size_bytes() >= 4096 - 2048 && log.size_bytes() < 4096 + 2048);
    assert_eq!(
        log.start_offset(),
        log.segments.keys().next().copied().unwrap()
    );
    assert!(matches!(
        log.plan_read(0, u64::MAX),
        Err(ReadError::OffsetOutOfRange { .. })
    ));
    // Time: everything older than 100 ms before `now` goes, except the active segment.
    config.retention_bytes = None;
    config.retention_ms = Some(Duration::from_millis(100));
    log.set_config(config);
    let deleted_by_time = log.apply_retention(1_000_000, None).unwrap();
    assert_eq!(log.segment_count(), 1);
    assert_eq!(deleted.len() + deleted_by_time.len(), segments - 1);
    assert!(!dir.path().join(fmt::file_name(0, LOG_SUFFIX)).exists());
}

#[test]
fn clean_reopen_skips_the_scan_and_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, report) = PartitionLog::open(dir.path(), small_config(2048), 0).unwrap();
    assert!(!report.clean);
    let written = append_many(&mut log, 60);
    log.close().unwrap();
    drop(log);
    let (log, report) = PartitionLog::open(dir.path(), small_config(2048), 0).unwrap();
    assert!(report.clean);
    assert_eq!(report.scanned_segments, 0);
    assert_eq!(read_all(&log, 0), written);
    // The marker is consumed: a crash now must not be mistaken for a clean stop.
    assert!(!dir.path().join(CLEAN_SHUTDOWN_FILE).exists());
}

fn last_segment_path(dir: &Path) -> PathBuf {
    let mut logs: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.ends_with(".log").then(|| dir.join(name))
        })
        .collect();
    logs.sort();
    logs.pop().unwrap()
}

#[test]
fn torn_tail_is_cut_to_the_intact_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(1 << 20), 0).unwrap();
    let written = append_many(&mut log, 20);
    drop(log); // unclean: no close
    let path = last_segment_path(dir.path());
    let len = fs::metadata(&path).unwrap().len();
    let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len - 7).unwrap(); // cut the last batch mid-way
    let (mut log, report) = PartitionLog::open(dir.path(), small_config(1 << 20), 0).unwrap();
    assert!(report.truncated.is_some());
    assert_eq!(read_all(&log, 0), written[..19].to_vec());
    // The log takes appends again right after the intact prefix.
    let a = log
        .append(&make(99, 1, 5_000, ProducerIds::NONE), 0)
        .unwrap();
    assert_eq!(a.base_offset, written[19].0);
}

#[test]
fn flipped_byte_cuts_at_that_batch_and_drops_later_segments() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(2048), 0).unwrap();
    let written = append_many(&mut log, 100);
    // Everything is unsynced: recovery must scan from the first segment.
    let bases: Vec<u64> = log.segments.keys().copied().collect();
    drop(log);
    let victim = bases[2];
    let path = dir.path().join(fmt::file_name(victim, LOG_SUFFIX));
    let mut bytes = fs::read(&path).unwrap();
    // Flip a byte inside the third batch of that segment.
    let mut it = BatchIter::new(&bytes);
    it.next();
    it.next();
    let (h, range) = it.next().unwrap().unwrap();
    bytes[range.start + 70] ^= 0x40;
    fs::write(&path, &bytes).unwrap();
    let (log, report) = PartitionLog::open(dir.path(), small_config(2048), 0).unwrap();
    let (seg, c) = report.truncated.clone().unwrap();
    assert_eq!((seg, c.position), (victim, range.start as u64));
    assert!(matches!(c.reason, BatchError::CrcMismatch { .. }));
    assert_eq!(report.removed_segments, bases[3..].to_vec());
    let expected: Vec<_> = written
        .iter()
        .copied()
        .filter(|(b, _)| *b < h.base_offset as u64)
        .collect();
    assert_eq!(read_all(&log, 0), expected);
    assert_eq!(log.end_offset(), h.base_offset as u64);
}

#[test]
fn synced_segments_below_the_recovery_point_are_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(2048), 0).unwrap();
    let written = append_many(&mut log, 100);
    let work = log.take_sync_work().unwrap();
    work.run(dir.path()).unwrap();
    let segments = log.segment_count();
    drop(log);
    let (log, report) = PartitionLog::open(dir.path(), small_config(2048), 0).unwrap();
    assert!(!report.clean);
    assert_eq!(
        report.scanned_segments, 1,
        "only the active segment is scanned"
    );
    assert_eq!(log.segment_count(), segments);
    assert_eq!(read_all(&log, 0), written);
}

#[test]
fn damaged_index_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(2048), 0).unwrap();
    let written = append_many(&mut log, 60);
    log.close().unwrap();
    fs::write(
        dir.path().join(fmt::file_name(0, fmt::INDEX_SUFFIX)),
        [1, 2, 3],
    )
    .unwrap();
    let (log, _) = PartitionLog::open(dir.path(), small_config(2048), 0).unwrap();
    assert_eq!(read_all(&log, 0), written);
}

#[test]
fn idempotent_retries_get_original_offsets_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let ids = producer_5;
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(2048), 0).unwrap();
    let mut seq = 0;
    let mut offsets = Vec::new();
    for i in 0..40 {
        let a = log.append(&make(i, 3, 0, ids(seq)), 0).unwrap();
        offsets.push(a.base_offset);
        seq += 3;
    }
    let retry = log.append(&make(39, 3, 0, ids(seq - 3)), 0).unwrap();
    assert!(retry.duplicate);
    assert_eq!(retry.base_offset, offsets[39]);
    assert!(matches!(
        log.append(&make(0, 1, 0, ids(seq + 1)), 0),
        Err(AppendError::OutOfOrderSequence { .. })
    ));
    // Unclean restart: state comes from the newest roll snapshot plus replay.
    drop(log);
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(2048), 0).unwrap();
    let retry = log.append(&make(39, 3, 0, ids(seq - 3)), 0).unwrap();
    assert_eq!((retry.duplicate, retry.base_offset), (true, offsets[39]));
    // Clean restart: state comes from the close snapshot.
    log.close().unwrap();
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(2048), 0).unwrap();
    let retry = log.append(&make(38, 3, 0, ids(seq - 6)), 0).unwrap();
    assert_eq!((retry.duplicate, retry.base_offset), (true, offsets[38]));
    let next = log.append(&make(40, 1, 0, ids(seq)), 0).unwrap();
    assert!(!next.duplicate);
}

#[test]
fn oversized_batches_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = small_config(1 << 20);
    config.max_message_bytes = 100;
    let (mut log, _) = PartitionLog::open(dir.path(), config, 0).unwrap();
    assert!(matches!(
        log.append(&make(0, 5, 0, ProducerIds::NONE), 0),
        Err(AppendError::TooLarge { .. })
    ));
    assert_eq!(log.end_offset(), 0);
}

#[test]
fn segment_ms_rolls_by_age() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = small_config(1 << 20);
    config.segment_ms = Duration::from_millis(1_000);
    let (mut log, _) = PartitionLog::open(dir.path(), config, 0).unwrap();
    log.append(&make(0, 1, 0, ProducerIds::NONE), 10).unwrap();
    log.append(&make(1, 1, 0, ProducerIds::NONE), 500).unwrap();
    assert_eq!(log.segment_count(), 1);
    log.append(&make(2, 1, 0, ProducerIds::NONE), 1_500)
        .unwrap();
    assert_eq!(log.segment_count(), 2);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn any_sequence_of_appends_reads_back_and_survives_reopen(
        sizes in proptest::collection::vec(1usize..6, 1..80),
        segment_bytes in 300u64..5000,
        crash in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = PartitionLog::open(dir.path(), small_config(segment_bytes), 0).unwrap();
        let written: Vec<_> = sizes.iter().enumerate().map(|(i, &n)| {
            let a = log.append(&make(i as u64, n, i as i64, ProducerIds::NONE), 0).unwrap();
            (a.base_offset, n as i32)
        }).collect();
        prop_assert_eq!(read_all(&log, 0), written.clone());
        if crash { drop(log) } else { log.close().unwrap() }
        let (log, _) = PartitionLog::open(dir.path(), small_config(segment_bytes), 0).unwrap();
        prop_assert_eq!(read_all(&log, 0), written);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever bytes a segment holds after a crash or disk damage, recovery serves only
    /// intact batches and the log stays usable.
    #[test]
    fn recovery_of_damaged_segments_serves_only_intact_batches(
        n in 1usize..20,
        cut in any::<prop::sample::Index>(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 0..4),
        garbage in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut seg = Vec::new();
        for i in 0..n {
            let mut b = make(i as u64, 1 + i % 3, 0, ProducerIds::NONE).bytes.to_vec();
            b[..8].copy_from_slice(&(seg_offset(&seg) as i64).to_be_bytes());
            seg.extend_from_slice(&b);
        }
        let intact = n;
        for (at, x) in &flips {
            let i = at.index(seg.len());
            seg[i] ^= x;
        }
        seg.truncate(cut.index(seg.len() + 1));
        seg.extend_from_slice(&garbage);
        let dir = tempfile::tempdir().unwrap();
        let served = fuzzing::recover_arbitrary_segment(dir.path(), &seg);
        prop_assert!(served <= intact);
        if flips.is_empty() && garbage.is_empty() && cut.index(seg.len() + 1) == seg.len() {
            prop_assert_eq!(served, intact);
        }
    }
}

/// Offset the next batch appended to `seg` (concatenated batches) would get.
fn seg_offset(seg: &[u8]) -> u64 {
    BatchIter::new(seg)
        .map(|i| i.unwrap().0.record_count as u64)
        .sum()
}

#[test]
fn leader_epoch_history_is_kept_rebuilt_and_trimmed() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(1 << 20), 0).unwrap();
    append_many(&mut log, 5);
    let first_end = log.end_offset();
    log.begin_leader_epoch(3).unwrap();
    append_many(&mut log, 5);
    let end = log.end_offset();
    assert_eq!(log.epoch_end_offset(0), Some((0, first_end)));
    assert_eq!(log.epoch_end_offset(2), Some((0, first_end)));
    assert_eq!(log.epoch_end_offset(3), Some((3, end)));
    // stamped into the batches too
    let bytes = log
        .plan_read(first_end, u64::MAX)
        .unwrap()
        .unwrap()
        .read(1 << 20)
        .unwrap();
    assert_eq!(
        BatchIter::new(&bytes)
            .next()
            .unwrap()
            .unwrap()
            .0
            .leader_epoch,
        3
    );
    drop(log);
    let (log, _) = PartitionLog::open(dir.path(), small_config(1 << 20), 0).unwrap();
    assert_eq!(log.epoch_end_offset(0), Some((0, first_end)));
    drop(log);
    // a lost checkpoint is rebuilt from the batch headers
    fs::remove_file(dir.path().join(EPOCH_CHECKPOINT_FILE)).unwrap();
    let (log, _) = PartitionLog::open(dir.path(), small_config(1 << 20), 0).unwrap();
    assert_eq!(log.epochs().entries().len(), 2);
    assert_eq!(log.epoch_end_offset(3), Some((3, end)));
    drop(log);
    // a torn tail that removes all of epoch 3 removes it from the history
    let path = last_segment_path(dir.path());
    let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
    let pos = {
        let (log, _) = PartitionLog::open(dir.path(), small_config(1 << 20), 0).unwrap();
        let p = log
            .segments
            .values()
            .next()
            .unwrap()
            .position_of(first_end)
            .unwrap()
            .unwrap();
        p
    };
    f.set_len(pos + 10).unwrap();
    let (log, _) = PartitionLog::open(dir.path(), small_config(1 << 20), 0).unwrap();
    assert_eq!(log.end_offset(), first_end);
    assert_eq!(log.epochs().latest().unwrap().epoch, 0);
    assert_eq!(log.epoch_end_offset(3), Some((0, first_end)));
}

/// Splits concatenated batches into validated single batches, as a follower receives them
/// (checked as a follower checks them: a compacted batch may hold fewer records).
fn batches_of(bytes: &Bytes) -> Vec<ValidBatch> {
    BatchIter::new(bytes)
        .map(|i| ValidBatch::replicated(bytes.slice(i.unwrap().1)).unwrap())
        .collect()
}

/// Copies the leader's batches to the follower until it has the whole log, as a fetcher does.
pub(super) fn replicate(leader: &PartitionLog, follower: &mut PartitionLog) {
    while follower.end_offset() < leader.end_offset() {
        let bytes = leader
            .plan_read(follower.end_offset(), u64::MAX)
            .unwrap()
            .unwrap()
            .read(1 << 20)
            .unwrap();
        for b in batches_of(&bytes) {
            follower.append_replicated(&b, 0).unwrap();
        }
    }
}

#[test]
fn a_follower_copy_is_byte_identical_and_keeps_epochs() {
    let leader_dir = tempfile::tempdir().unwrap();
    let follower_dir = tempfile::tempdir().unwrap();
    let (mut leader, _) = PartitionLog::open(leader_dir.path(), small_config(2048), 0).unwrap();
    append_many(&mut leader, 20);
    leader.begin_leader_epoch(4).unwrap();
    append_many(&mut leader, 20);
    let (mut follower, _) = PartitionLog::open(follower_dir.path(), small_config(2048), 0).unwrap();
    replicate(&leader, &mut follower);
    assert_eq!(read_all(&follower, 0), read_all(&leader, 0));
    assert_eq!(follower.epochs(), leader.epochs());
    let a = leader
        .plan_read(0, u64::MAX)
        .unwrap()
        .unwrap()
        .read(1 << 20)
        .unwrap();
    let b = follower
        .plan_read(0, u64::MAX)
        .unwrap()
        .unwrap()
        .read(1 << 20)
        .unwrap();
    assert_eq!(a, b, "the same bytes, not re-encoded");
    // a batch that does not start at the follower's end is refused
    let again = batches_of(&a).remove(0);
    assert!(matches!(
        follower.append_replicated(&again, 0),
        Err(AppendError::NotContiguous { .. })
    ));
}

#[test]
fn truncation_cuts_the_log_at_an_offset_and_appends_continue_there() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(2048), 0).unwrap();
    let written = append_many(&mut log, 60);
    log.begin_leader_epoch(2).unwrap();
    let later = append_many(&mut log, 10);
    let cut = written[30].0;
    let segments_before = log.segment_count();
    log.truncate_to(cut, 0).unwrap();
    assert_eq!(log.end_offset(), cut);
    assert!(log.segment_count() < segments_before);
    assert_eq!(read_all(&log, 0), written[..30].to_vec());
    assert_eq!(
        log.epochs().latest().unwrap().epoch,
        0,
        "epoch 2 started after the cut"
    );
    assert!(log
        .epoch_end_offset(2)
        .is_some_and(|(e, end)| e == 0 && end == cut));
    let _ = later;
    let a = log.append(&make(99, 2, 0, ProducerIds::NONE), 0).unwrap();
    assert_eq!(a.base_offset, cut);
    drop(log);
    let (log, _) = PartitionLog::open(dir.path(), small_config(2048), 0).unwrap();
    assert_eq!(log.end_offset(), cut + 2);
    assert_eq!(read_all(&log, 0).len(), 31);
}

#[test]
fn truncating_below_the_log_start_empties_the_log_at_that_offset() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(2048), 0).unwrap();
    append_many(&mut log, 30);
    let mut config = small_config(2048);
    config.retention_bytes = Some(2048);
    log.set_config(config);
    log.apply_retention(0, None).unwrap();
    let start = log.start_offset();
    assert!(start > 0);
    log.truncate_to(start - 1, 0).unwrap();
    assert_eq!(
        (log.start_offset(), log.end_offset()),
        (start - 1, start - 1)
    );
    assert!(log.plan_read(start - 1, u64::MAX).unwrap().is_none());
}

#[test]
fn deleted_records_are_gone_inside_a_segment_and_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(2048), 0).unwrap();
    let batches = append_many(&mut log, 30);
    let end = log.end_offset();
    // A point inside the third segment's batches: whole segments below it go, the one
    // holding it stays but reads start there.
    let (base, n) = batches[20];
    let point = base + n as u64 - 1;
    let segments = log.segment_count();
    assert_eq!(log.delete_records_before(point).unwrap(), point);
    assert_eq!(log.start_offset(), point);
    assert_eq!(log.deleted_below(), point);
    assert!(
        log.segment_count() < segments,
        "segments wholly below were deleted"
    );
    assert!(matches!(
        log.plan_read(point - 1, u64::MAX),
        Err(ReadError::OffsetOutOfRange { .. })
    ));
    // The batch holding the point is served whole (the reader skips what lies below).
    assert_eq!(read_all(&log, point).first().map(|b| b.0), Some(base));
    // Moving it back changes nothing.
    assert_eq!(log.delete_records_before(3).unwrap(), point);
    drop(log);
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(2048), 0).unwrap();
    assert_eq!((log.start_offset(), log.end_offset()), (point, end));
    // Up to the end: empty, and the next append lands at the end.
    assert_eq!(log.delete_records_before(u64::MAX).unwrap(), end);
    assert!(log.plan_read(end, u64::MAX).unwrap().is_none());
    let a = log
        .append(&make(99, 1, 5_000, ProducerIds::NONE), 0)
        .unwrap();
    assert_eq!(a.base_offset, end);
    assert_eq!(read_all(&log, end), vec![(end, 1)]);
}

/// A follower far behind a tiered leader restarts its log at the leader's local log start;
/// the records below are in the cold tier, not deleted. (The fault suite caught the first
/// version of DeleteRecords taking that start for a deletion point: the follower, once
/// leader, answered ListOffsets earliest with it and refused the cold tier's history.)
#[test]
fn restarting_at_the_leaders_log_start_deletes_no_records() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(1 << 20), 0).unwrap();
    append_many(&mut log, 4);
    log.reset_to(1890, 0).unwrap();
    assert_eq!((log.start_offset(), log.deleted_below()), (1890, 0));
    drop(log);
    let (log, _) = PartitionLog::open(dir.path(), small_config(1 << 20), 0).unwrap();
    assert_eq!((log.start_offset(), log.deleted_below()), (1890, 0));
}

#[test]
fn a_cut_below_the_deletion_point_lowers_it() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(1 << 20), 0).unwrap();
    let batches = append_many(&mut log, 10);
    log.delete_records_before(12).unwrap();
    // (A follower cuts at a batch boundary: where its epochs agree with the leader's.)
    let cut = batches[3].0;
    assert!(cut < 12);
    log.truncate_to(cut, 0).unwrap();
    assert_eq!((log.start_offset(), log.end_offset()), (cut, cut));
    drop(log);
    let (log, _) = PartitionLog::open(dir.path(), small_config(1 << 20), 0).unwrap();
    assert_eq!((log.start_offset(), log.deleted_below()), (cut, cut));
}

#[test]
fn a_follower_promoted_to_leader_deduplicates_the_old_leaders_producers() {
    let leader_dir = tempfile::tempdir().unwrap();
    let follower_dir = tempfile::tempdir().unwrap();
    let ids = |seq| ProducerIds {
        producer_id: 9,
        producer_epoch: 0,
        base_sequence: seq,
    };
    let (mut leader, _) = PartitionLog::open(leader_dir.path(), small_config(2048), 0).unwrap();
    let mut offsets = Vec::new();
    for i in 0..30 {
        offsets.push(leader.append(&make(i, 2, 0, ids(i as i32 * 2)), 0).unwrap());
    }
    let (mut follower, _) = PartitionLog::open(follower_dir.path(), small_config(2048), 0).unwrap();
    replicate(&leader, &mut follower);
    // The follower crashes and restarts, then becomes leader at a new epoch: its producer
    // state comes from the replicated batches it recovered.
    drop(follower);
    let (mut promoted, _) = PartitionLog::open(follower_dir.path(), small_config(2048), 0).unwrap();
    promoted.begin_leader_epoch(1).unwrap();
    // The producer's retry of its last batch (its ack was lost in the failover)...
    let retry = promoted.append(&make(29, 2, 0, ids(58)), 0).unwrap();
    assert!(
        retry.duplicate,
        "a retry after failover is not written twice"
    );
    assert_eq!(retry.base_offset, offsets[29].base_offset);
    // ...a gap is refused, and the next sequence is appended.
    assert!(matches!(
        promoted.append(&make(31, 1, 0, ids(62)), 0),
        Err(AppendError::OutOfOrderSequence { .. })
    ));
    let next = promoted.append(&make(30, 2, 0, ids(60)), 0).unwrap();
    assert!(!next.duplicate);
    assert_eq!(next.base_offset, leader.end_offset());
}

#[test]
fn reset_empties_the_log_and_restarts_it_at_the_leaders_start() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(2048), 0).unwrap();
    append_many(&mut log, 10);
    let end = log.end_offset();
    log.reset_to(end + 500, 0).unwrap();
    assert_eq!(
        (log.start_offset(), log.end_offset()),
        (end + 500, end + 500)
    );
    assert!(log.epochs().latest().is_none());
    // the leader's batch at that offset is taken as it is
    let leader_dir = tempfile::tempdir().unwrap();
    let (mut leader, _) = PartitionLog::open(leader_dir.path(), small_config(2048), 0).unwrap();
    leader.reset_to(end + 500, 0).unwrap();
    leader.begin_leader_epoch(3).unwrap();
    leader.append(&make(1, 2, 0, ProducerIds::NONE), 0).unwrap();
    let bytes = leader
        .plan_read(end + 500, u64::MAX)
        .unwrap()
        .unwrap()
        .read(1 << 20)
        .unwrap();
    for b in batches_of(&bytes) {
        log.append_replicated(&b, 0).unwrap();
    }
    assert_eq!(log.end_offset(), end + 502);
    assert_eq!(log.epochs().latest().map(|e| e.epoch), Some(3));
    drop(log);
    let (log, _) = PartitionLog::open(dir.path(), small_config(2048), 0).unwrap();
    assert_eq!(
        (log.start_offset(), log.end_offset()),
        (end + 500, end + 502)
    );
}

/// Issue 14, defect 2: a producer whose five retained batches all lie past a truncation was
/// forgotten, so a retry of its last batch below the cut (its answer lost) was appended again.
#[test]
fn truncation_rebuilds_producer_state_so_a_retry_below_the_cut_is_a_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let ids = producer_5;
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(1 << 20), 0).unwrap();
    for seq in 0..10 {
        let a = log.append(&make(seq as u64, 1, 0, ids(seq)), 0).unwrap();
        assert_eq!(a.base_offset, seq as u64);
    }
    // a new leader never had offsets 5..: cut there
    log.truncate_to(5, 0).unwrap();
    let retry = log.append(&make(4, 1, 0, ids(4)), 0).unwrap();
    assert!(
        retry.duplicate,
        "seq 4 is at offset 4: a retry must not be written again (got {retry:?})"
    );
    assert_eq!(retry.base_offset, 4);
    let next = log.append(&make(5, 1, 0, ids(5)), 0).unwrap();
    assert_eq!((next.duplicate, next.base_offset), (false, 5));
}

/// Issue 14, defect 2: producer snapshots written past a truncation survived it; once the
/// log grew back past them, a restart loaded one, and a healthy producer got
/// OUT_OF_ORDER_SEQUENCE for its next batch.
#[test]
fn snapshots_past_a_truncation_are_not_loaded_after_the_log_grows_back() {
    let dir = tempfile::tempdir().unwrap();
    let ids = producer_5;
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(2048), 0).unwrap();
    let mut bases = Vec::new();
    for i in 0..40 {
        bases.push(
            log.append(&make(i, 3, 0, ids(i as i32 * 3)), 0)
                .unwrap()
                .base_offset,
        );
    }
    assert!(log.segment_count() > 3, "rolls wrote snapshots");
    let old_end = log.end_offset();
    // The new leader had this producer's first ten batches only (seqs 0..30).
    let cut = bases[10];
    log.truncate_to(cut, 0).unwrap();
    // Its history then grows past the old end in one big batch of another writer.
    let big = make(99, 200, 0, ProducerIds::NONE);
    log.append(&big, 0).unwrap();
    assert!(log.end_offset() > old_end);
    drop(log); // unclean stop
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(2048), 0).unwrap();
    let next = log.append(&make(41, 3, 0, ids(30)), 0);
    assert!(
        matches!(next, Ok(ref a) if !a.duplicate),
        "the producer's next batch (seq 30) must append, got {next:?}"
    );
}

/// Issue 16, full disk: recording the recovery point after an fsync failed (ENOSPC on the
/// small file), and the whole sync was reported failed, which stops the partition for good
/// although its data was synced. Now the old point stays (lower, so still true) and the
/// sync counts.
#[test]
fn a_recovery_point_that_cannot_be_written_does_not_fail_the_sync() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(2048), 0).unwrap();
    append_many(&mut log, 20);
    while let Some(work) = log.take_sync_work() {
        work.run(dir.path()).unwrap();
    }
    let before = read_number(&dir.path().join(RECOVERY_POINT_FILE)).expect("a recovery point");
    // the temporary file cannot be created: a directory is in the way
    std::fs::create_dir(dir.path().join(format!("{RECOVERY_POINT_FILE}.tmp"))).unwrap();
    append_many(&mut log, 40);
    let mut synced = 0;
    while let Some(work) = log.take_sync_work() {
        let end = work.end;
        work.run(dir.path())
            .expect("the data was synced; only the recovery point could not be recorded");
        synced = end;
    }
    assert_eq!(synced, log.end_offset());
    let after = read_number(&dir.path().join(RECOVERY_POINT_FILE)).expect("the old point");
    assert_eq!(
        after, before,
        "the recovery point file must be left as it was"
    );
}

/// Issue 14, defect 6: a truncation left the `recovery-point` past the cut, so after the cut
/// segment was rewritten and rolled, a crash skipped its CRC scan and served a damaged batch.
#[test]
fn truncation_lowers_the_recovery_point_so_a_rewritten_segment_is_scanned() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(2048), 0).unwrap();
    let written = append_many(&mut log, 60);
    while let Some(work) = log.take_sync_work() {
        work.run(dir.path()).unwrap();
    }
    let rp = read_number(&dir.path().join(RECOVERY_POINT_FILE)).expect("a recovery point");
    let cut = written[5].0;
    assert!(
        rp > cut + 20,
        "the test needs a recovery point well past the cut"
    );
    log.truncate_to(cut, 0).unwrap();
    let holder = log.active().base;
    // rewrite past the cut and roll, without syncing
    append_many(&mut log, 30);
    assert!(log.segment_count() > 1);
    drop(log);
    // damage the last batch of the rewritten segment (its next segment starts below the
    // stale recovery point)
    let path = dir.path().join(fmt::file_name(holder, LOG_SUFFIX));
    let len = fs::metadata(&path).unwrap().len();
    let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(b"garbage!", len - 8).unwrap();
    drop(f);
    let (log, report) = PartitionLog::open(dir.path(), small_config(2048), 0).unwrap();
    assert!(
        report
            .truncated
            .as_ref()
            .is_some_and(|(base, _)| *base == holder),
        "the rewritten segment must be scanned and cut: {report:?}"
    );
    // everything served is intact
    read_all(&log, 0);
}

/// `make`, as a transactional batch of producer `pid` at epoch 0 from sequence `seq`.
fn txn_batch(tag: u64, n: usize, pid: i64, seq: i32) -> ValidBatch {
    let ids = ProducerIds {
        producer_id: pid,
        producer_epoch: 0,
        base_sequence: seq,
    };
    let bytes = batch::build::transactional(make(tag, n, 0, ids).bytes.to_vec());
    ValidBatch::new(Bytes::from(bytes)).unwrap()
}

fn marker(commit: bool) -> Marker {
    Marker {
        commit,
        coordinator_epoch: 0,
    }
}

fn aborted(log: &PartitionLog) -> Vec<(i64, u64, u64)> {
    log.aborted_between(0, u64::MAX)
        .iter()
        .map(|t| (t.producer_id, t.first_offset, t.last_offset))
        .collect()
}

#[test]
fn a_verified_transactional_batch_opens_a_transaction_only_while_its_guard_stands() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(1 << 20), 0).unwrap();
    // nobody verified it: it may not open a transaction
    assert!(matches!(
        log.append_verified(&txn_batch(0, 1, 5, 0), TxnVerified::AlreadyOpen, 0),
        Err(AppendError::TxnNotVerified)
    ));
    // verified; one guard per producer until the transaction opens
    let g = log.txn_guard(5, 0).expect("a guard: no transaction open");
    assert_eq!(log.txn_guard(5, 0), Some(g));
    log.append_verified(&txn_batch(0, 1, 5, 0), TxnVerified::Guard(g), 0)
        .unwrap();
    assert_eq!(log.txn_guard(5, 0), None, "open here: no question needed");
    log.append_verified(&txn_batch(1, 1, 5, 1), TxnVerified::AlreadyOpen, 0)
        .unwrap();
    // the transaction ends; a late batch verified before the marker landed stays out
    let late = log.txn_guard(6, 0).expect("producer 6 has none open");
    log.append_marker(6, 0, marker(false), 0).unwrap();
    assert!(matches!(
        log.append_verified(&txn_batch(2, 1, 6, 0), TxnVerified::Guard(late), 0),
        Err(AppendError::TxnNotVerified)
    ));
    log.append_marker(5, 0, marker(true), 0).unwrap();
    assert!(matches!(
        log.append_verified(&txn_batch(3, 1, 5, 2), TxnVerified::AlreadyOpen, 0),
        Err(AppendError::TxnNotVerified)
    ));
    assert_eq!(log.last_stable_offset(log.end_offset()), log.end_offset());
}

#[test]
fn transactions_bound_the_last_stable_offset_and_aborts_are_listed_on_every_replica() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(1 << 20), 0).unwrap();
    log.append(&txn_batch(0, 3, 5, 0), 0).unwrap(); // 0..=2
    log.append(&txn_batch(1, 2, 6, 0), 0).unwrap(); // 3..=4
    log.append(&make(2, 1, 0, ProducerIds::NONE), 0).unwrap(); // 5
    assert_eq!(log.last_stable_offset(6), 0);
    assert!(
        matches!(
            log.append(&make(3, 1, 0, producer_5(3)), 0),
            Err(AppendError::InvalidTxnState)
        ),
        "a plain batch inside producer 5's open transaction"
    );
    assert_eq!(
        log.append_marker(5, 0, marker(false), 0)
            .unwrap()
            .base_offset,
        6
    );
    assert_eq!(
        log.last_stable_offset(7),
        3,
        "producer 6's transaction is open"
    );
    assert_eq!(
        log.append_marker(6, 0, marker(true), 0)
            .unwrap()
            .base_offset,
        7
    );
    assert_eq!(
        log.last_stable_offset(7),
        3,
        "the commit marker is not below the hw"
    );
    assert_eq!(log.last_stable_offset(8), 8);
    assert!(matches!(
        log.append_marker(5, -1, marker(true), 0),
        Err(AppendError::InvalidProducerEpoch { current: 0 })
    ));
    assert_eq!(aborted(&log), vec![(5, 0, 6)]);
    assert!(log.aborted_between(7, 8).is_empty());
    // a follower learns the same from the replicated batches
    let fdir = tempfile::tempdir().unwrap();
    let (mut follower, _) = PartitionLog::open(fdir.path(), small_config(1 << 20), 0).unwrap();
    replicate(&log, &mut follower);
    assert_eq!(aborted(&follower), vec![(5, 0, 6)]);
    assert_eq!(follower.last_stable_offset(8), 8);
    // a crash (no close) keeps them; the replay rebuilds the open transaction too
    log.append(&txn_batch(4, 1, 7, 0), 0).unwrap(); // 8
    drop(log);
    let (mut log, report) = PartitionLog::open(dir.path(), small_config(1 << 20), 0).unwrap();
    assert!(!report.clean);
    assert_eq!(aborted(&log), vec![(5, 0, 6)]);
    assert_eq!(log.last_stable_offset(9), 8);
    // past a roll (a snapshot) and a clean close too
    log.roll(0).unwrap();
    log.append_marker(7, 0, marker(false), 0).unwrap(); // 9
    log.close().unwrap();
    let (mut log, report) = PartitionLog::open(dir.path(), small_config(1 << 20), 0).unwrap();
    assert!(report.clean);
    assert_eq!(aborted(&log), vec![(5, 0, 6), (7, 8, 9)]);
    assert_eq!(log.last_stable_offset(10), 10);
    // a truncation below the markers reopens the transactions they ended
    log.truncate_to(6, 0).unwrap();
    assert_eq!(aborted(&log), vec![]);
    assert_eq!(log.last_stable_offset(6), 0);
}

#[test]
fn a_read_into_a_fresh_buffer_returns_exactly_the_bytes_asked() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::File::create(&path)
        .unwrap()
        .write_all(&data)
        .unwrap();
    let f = std::fs::File::open(&path).unwrap();
    assert_eq!(
        super::read_new_at(&f, 70_000, 123).unwrap(),
        &data[123..70_123]
    );
    assert_eq!(super::read_new_at(&f, 0, 5).unwrap(), Vec::<u8>::new());
    let past = super::read_new_at(&f, 10, 99_995).unwrap_err();
    assert_eq!(past.kind(), std::io::ErrorKind::UnexpectedEof);
}

/// Drops the segment files in `dir` from the page cache (synced first, else the kernel
/// keeps their dirty pages): their bytes are then on the disk only.
fn drop_from_page_cache(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "log") {
            let f = File::open(&path).unwrap();
            rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
        }
    }
}

#[test]
fn a_cached_read_returns_what_a_blocking_read_does() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(4096), 0).unwrap();
    let written = append_many(&mut log, 60);
    let end = log.end_offset();
    for from in [0, 1, 7, 40, end - 1] {
        for upper in [from + 1, end - 1, u64::MAX] {
            let Some(plan) = log.plan_read(from, upper).unwrap() else {
                continue;
            };
            for max in [0, 100, 1000, 1 << 20] {
                let cached = plan.read_cached(max).unwrap();
                assert_eq!(
                    cached,
                    Some(plan.read(max).unwrap()),
                    "from {from}, upper {upper}, max {max}"
                );
            }
        }
    }
    assert_eq!(read_all(&log, 0), written);
}

#[test]
fn a_cached_read_declines_bytes_not_in_memory_and_long_reads() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = PartitionLog::open(dir.path(), small_config(64 << 20), 0).unwrap();
    // ~400 KiB of batches, more than a cached read takes
    for i in 0..400 {
        log.append(&make(i, 20, 1_000, ProducerIds::NONE), 0)
            .unwrap();
    }
    let plan = log.plan_read(0, u64::MAX).unwrap().unwrap();
    let long = plan.read(CACHED_READ_MAX + (64 << 10)).unwrap();
    assert!(long.len() > CACHED_READ_MAX);
    assert_eq!(
        plan.read_cached(CACHED_READ_MAX + (64 << 10)).unwrap(),
        None
    );
    assert!(plan.read_cached(4096).unwrap().is_some());

    // Synced, then dropped from the page cache: the bytes are on the disk only.
    log.take_sync_work().unwrap().run(dir.path()).unwrap();
    drop_from_page_cache(dir.path());
    assert_eq!(plan.read_cached(4096).unwrap(), None);
    // the blocking read brings them back, and then a cached read finds them
    let blocking = plan.read(4096).unwrap();
    assert_eq!(plan.read_cached(4096).unwrap(), Some(blocking));
}

/// A log of `batches` batches of 20 records of ~1 KiB each (~20 KiB a batch).
fn big_batches(dir: &Path, batches: u64) -> PartitionLog {
    let (mut log, _) = PartitionLog::open(dir, small_config(64 << 20), 0).unwrap();
    for i in 0..batches {
        let values: Vec<Vec<u8>> = (0..20).map(|r| vec![(i + r) as u8; 1_000]).collect();
        let recs: Vec<Rec<'_>> = values
            .iter()
            .map(|v| Rec {
                key: None,
                value: Some(v),
                timestamp_delta: 0,
            })
            .collect();
        let b = ValidBatch::new(Bytes::from(batch(0, ProducerIds::NONE, &recs))).unwrap();
        log.append(&b, 0).unwrap();
    }
    log
}

#[test]
fn a_span_holds_exactly_what_a_read_returns() {
    let dir = tempfile::tempdir().unwrap();
    let log = big_batches(dir.path(), 40);
    let end = log.end_offset();
    let mut spans = 0;
    for from in [0, 1, 19, 20, 401, end - 100] {
        for upper in [from + 1, from + 100, from + 200, end - 1, u64::MAX] {
            let Some(plan) = log.plan_read(from, upper).unwrap() else {
                continue;
            };
            for max in [0, 1000, 64 << 10, 100_000, 300_000, 1 << 20] {
                let read = plan.read(max).unwrap();
                let Some(span) = plan.span(max).unwrap() else {
                    // declined: only when the read is short
                    assert!(
                        read.len() < SPAN_MIN,
                        "from {from}, upper {upper}, max {max}: {} bytes read, no span",
                        read.len()
                    );
                    continue;
                };
                spans += 1;
                let at = format!("from {from}, upper {upper}, max {max}");
                assert_eq!(span.read_from(0).unwrap(), read, "{at}");
                let last = BatchIter::new(&read).last().unwrap().unwrap().0;
                assert_eq!(span.last_offset, last.last_offset() as u64, "{at}");
                assert_eq!(span.read_from(100).unwrap(), read[100..], "{at}");
            }
        }
    }
    assert!(spans > 20, "only {spans} spans");
}

#[test]
fn a_span_is_declined_for_bytes_not_in_memory_and_for_many_small_batches() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = big_batches(dir.path(), 20);
    let plan = log.plan_read(0, u64::MAX).unwrap().unwrap();
    assert!(plan.span(1 << 20).unwrap().is_some());
    // Synced, then dropped from the page cache: sending it would wait for the disk.
    log.take_sync_work().unwrap().run(dir.path()).unwrap();
    drop_from_page_cache(dir.path());
    assert!(plan.span(1 << 20).unwrap().is_none());
    // the read brings the bytes back, and then they may be sent from the file
    let read = plan.read(1 << 20).unwrap();
    let span = plan.span(1 << 20).unwrap().expect("cached again");
    assert_eq!(span.read_from(0).unwrap(), read);

    // more small batches than the walk takes: read instead
    let small = tempfile::tempdir().unwrap();
    let (mut log, _) = PartitionLog::open(small.path(), small_config(64 << 20), 0).unwrap();
    for i in 0..(SPAN_MAX_BATCHES as u64 + 100) {
        log.append(&make(i, 10, 0, ProducerIds::NONE), 0).unwrap();
    }
    let plan = log.plan_read(0, u64::MAX).unwrap().unwrap();
    assert!(plan.read(1 << 20).unwrap().len() > SPAN_MIN);
    assert!(plan.span(1 << 20).unwrap().is_none());
    // (a read bounded to fewer batches than that is a span)
    let bounded = log
        .plan_read(0, SPAN_MAX_BATCHES as u64 * 10 - 50)
        .unwrap()
        .unwrap();
    let read = bounded.read(1 << 20).unwrap();
    let span = bounded.span(1 << 20).unwrap().expect("within the walk");
    assert_eq!(span.read_from(0).unwrap(), read);
}
