use std::collections::BTreeMap;

use crate::batch::build::{batch, ProducerIds, Rec};
use crate::batch::{compute_crc, verify, Compression, HEADER_LEN};
use proptest::prelude::*;

use super::*;

const NOW: i64 = 1_000_000;
const KEEP_TOMBSTONES: Policy = Policy {
    now_ms: NOW,
    delete_retention_ms: 1_000_000_000,
};

/// A batch at `base` of (key, value) records, with `codec` and extra attribute bits.
fn make(
    base: i64,
    ts: i64,
    ids: ProducerIds,
    codec: Compression,
    attrs: i16,
    recs: &[(Option<&str>, Option<&str>)],
) -> Vec<u8> {
    let recs: Vec<Rec> = recs
        .iter()
        .map(|(k, v)| Rec {
            key: k.map(str::as_bytes),
            value: v.map(str::as_bytes),
            timestamp_delta: 0,
        })
        .collect();
    let mut plain = batch(ts, ids, &recs);
    let h = BatchHeader::parse(&plain).unwrap();
    plain[0..8].copy_from_slice(&base.to_be_bytes());
    plain[21..23].copy_from_slice(&(h.attributes | attrs).to_be_bytes());
    let body = compress(codec, &plain[HEADER_LEN..]).unwrap();
    rebuilt(&plain, codec, h.record_count, &body).unwrap()
}

fn data(base: i64, recs: &[(Option<&str>, Option<&str>)]) -> Vec<u8> {
    make(base, NOW, ProducerIds::NONE, Compression::None, 0, recs)
}

/// A transaction marker of producer `pid` at `offset`.
fn marker_batch(offset: i64, pid: i64, commit: bool) -> Vec<u8> {
    let key = [0u8, 0, 0, u8::from(commit)];
    let plain = batch(
        NOW,
        ProducerIds {
            producer_id: pid,
            producer_epoch: 0,
            base_sequence: -1,
        },
        &[Rec {
            key: Some(&key),
            value: Some(&[0, 0, 0, 0, 0, 0]),
            timestamp_delta: 0,
        }],
    );
    let mut out = plain;
    out[0..8].copy_from_slice(&offset.to_be_bytes());
    out[21..23].copy_from_slice(&0x30i16.to_be_bytes());
    let crc = compute_crc(&out);
    out[17..21].copy_from_slice(&crc.to_be_bytes());
    out
}

fn txn(base: i64, pid: i64, recs: &[(Option<&str>, Option<&str>)]) -> Vec<u8> {
    let ids = ProducerIds {
        producer_id: pid,
        producer_epoch: 0,
        base_sequence: 0,
    };
    make(base, NOW, ids, Compression::None, 0x10, recs)
}

/// A record as read back: offset, key, value.
type Kv = (i64, String, Option<String>);

/// Runs both passes over `batches` (all dirty, one segment ending with the last batch):
/// the (offset, key, value) records that stay and the batches written.
fn compact(batches: &[Vec<u8>], policy: Policy) -> (Vec<Kv>, Vec<Vec<u8>>) {
    let mut index = Index::default();
    for b in batches {
        index.observe(b, &verify(b).unwrap(), true).unwrap();
    }
    let mut out = Vec::new();
    for (i, b) in batches.iter().enumerate() {
        let h = verify(b).unwrap();
        let d = compact_batch(b, &h, &index, policy, i + 1 == batches.len()).unwrap();
        match d.kept {
            Kept::Whole => out.push(b.clone()),
            Kept::Rewritten(r) => out.push(r),
            Kept::Dropped => {}
        }
    }
    let mut recs = Vec::new();
    for b in &out {
        let h = verify(b).expect("every written batch has a valid CRC");
        if h.is_control() {
            continue;
        }
        let section = records_section(b, &h).unwrap();
        for r in raw_records(&section, h.record_count).unwrap() {
            let text = |v: Option<&[u8]>| v.map(|v| String::from_utf8(v.to_vec()).unwrap());
            recs.push((
                h.base_offset + r.offset_delta,
                text(r.key).unwrap_or_default(),
                text(r.value),
            ));
        }
    }
    (recs, out)
}

#[test]
fn the_latest_record_per_key_stays_at_its_offset_in_every_codec() {
    for codec in [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ] {
        let ids = ProducerIds {
            producer_id: 7,
            producer_epoch: 2,
            base_sequence: 100,
        };
        let batches = vec![
            make(
                0,
                NOW,
                ids,
                codec,
                0,
                &[
                    (Some("a"), Some("a1")),
                    (Some("b"), Some("b1")),
                    (Some("a"), Some("a2")),
                ],
            ),
            make(
                3,
                NOW,
                ProducerIds::NONE,
                codec,
                0,
                &[(Some("b"), Some("b2")), (Some("c"), Some("c1"))],
            ),
        ];
        let (recs, out) = compact(&batches, KEEP_TOMBSTONES);
        assert_eq!(
            recs,
            vec![
                (2, "a".into(), Some("a2".into())),
                (3, "b".into(), Some("b2".into())),
                (4, "c".into(), Some("c1".into())),
            ],
            "{codec:?}"
        );
        // The rewritten batch keeps its header: base offset, last offset, producer id,
        // epoch, base sequence and codec; only the record count changed.
        let (old, new) = (verify(&batches[0]).unwrap(), verify(&out[0]).unwrap());
        assert_eq!(new.base_offset, 0);
        assert_eq!(new.last_offset(), old.last_offset());
        assert_eq!(
            (new.producer_id, new.producer_epoch, new.base_sequence),
            (7, 2, 100)
        );
        assert_eq!(new.compression(), codec);
        assert_eq!(new.record_count, 1);
        assert_eq!(
            out[1], batches[1],
            "a batch that loses nothing is copied as it is"
        );
    }
}

#[test]
fn tombstones_stay_for_the_delete_retention_then_go() {
    let batches = vec![
        data(0, &[(Some("a"), Some("a1")), (Some("b"), Some("b1"))]),
        data(2, &[(Some("a"), None)]),
        data(3, &[(Some("c"), Some("c1"))]),
    ];
    let (recs, _) = compact(&batches, KEEP_TOMBSTONES);
    assert_eq!(
        recs,
        vec![
            (1, "b".into(), Some("b1".into())),
            (2, "a".into(), None),
            (3, "c".into(), Some("c1".into())),
        ]
    );
    let expired = Policy {
        now_ms: NOW + 61_000,
        delete_retention_ms: 60_000,
    };
    let (recs, out) = compact(&batches, expired);
    assert_eq!(
        recs,
        vec![
            (1, "b".into(), Some("b1".into())),
            (3, "c".into(), Some("c1".into()))
        ]
    );
    assert_eq!(out.len(), 2, "the tombstone's emptied batch is dropped");
}

#[test]
fn transactions_aborted_go_committed_count_open_ones_stay_whole() {
    let batches = vec![
        data(0, &[(Some("k"), Some("plain"))]),
        txn(1, 5, &[(Some("k"), Some("aborted"))]),
        marker_batch(2, 5, false),
        txn(3, 6, &[(Some("j"), Some("committed"))]),
        data(4, &[(Some("j"), Some("older-than-commit-but-later"))]),
        marker_batch(5, 6, true),
        txn(6, 7, &[(Some("k"), Some("open"))]),
        data(7, &[(Some("z"), Some("z"))]),
    ];
    let (recs, out) = compact(&batches, KEEP_TOMBSTONES);
    assert_eq!(
        recs,
        vec![
            // The aborted and the open transactions do not hide "plain".
            (0, "k".into(), Some("plain".into())),
            (4, "j".into(), Some("older-than-commit-but-later".into())),
            (6, "k".into(), Some("open".into())),
            (7, "z".into(), Some("z".into())),
        ]
    );
    // Producer 5's aborted batch and producer 6's superseded one are each their producer's
    // last data batch: they stay, emptied, so the producers' last sequences survive (as
    // Kafka's cleaner keeps them).
    let kept: Vec<(i64, i32)> = out
        .iter()
        .map(|b| verify(b).unwrap())
        .map(|h| (h.base_offset, h.record_count))
        .collect();
    assert_eq!(
        kept,
        vec![
            (0, 1),
            (1, 0),
            (2, 1),
            (3, 0),
            (4, 1),
            (5, 1),
            (6, 1),
            (7, 1)
        ]
    );
    let mut index = Index::default();
    for b in &batches {
        index.observe(b, &verify(b).unwrap(), true).unwrap();
    }
    assert_eq!(
        index.first_undecided(),
        Some(6),
        "producer 7's transaction is open"
    );
}

#[test]
fn an_emptied_batch_stays_when_it_ends_the_segment_or_its_producer() {
    let ids = ProducerIds {
        producer_id: 9,
        producer_epoch: 0,
        base_sequence: 0,
    };
    let batches = vec![
        make(0, NOW, ids, Compression::Zstd, 0, &[(Some("a"), Some("1"))]),
        data(1, &[(Some("a"), Some("2")), (Some("b"), Some("1"))]),
        data(3, &[(Some("b"), Some("2"))]),
        data(4, &[(Some("b"), Some("3"))]),
        data(5, &[(Some("c"), Some("1")), (Some("c"), Some("2"))]),
        data(7, &[(Some("c"), Some("3"))]),
    ];
    let (recs, out) = compact(&batches, KEEP_TOMBSTONES);
    assert_eq!(recs.len(), 3);
    let heads: Vec<_> = out.iter().map(|b| verify(b).unwrap()).collect();
    let kept: Vec<(i64, i64, i32)> = heads
        .iter()
        .map(|h| (h.base_offset, h.last_offset(), h.record_count))
        .collect();
    // Producer 9's only batch lost its record but stays, empty and uncompressed; the
    // batches at 3 and 5 go; the last batch of the segment has its record.
    assert_eq!(kept, vec![(0, 0, 0), (1, 2, 1), (4, 4, 1), (7, 7, 1)]);
    assert_eq!(heads[0].compression(), Compression::None);
    assert_eq!((heads[0].producer_id, heads[0].base_sequence), (9, 0));
}

#[test]
fn the_clean_part_counts_for_markers_not_keys() {
    let clean = data(0, &[(Some("a"), Some("clean"))]);
    let dirty = data(1, &[(Some("b"), Some("dirty"))]);
    let mut index = Index::default();
    index
        .observe(&clean, &verify(&clean).unwrap(), false)
        .unwrap();
    index
        .observe(&dirty, &verify(&dirty).unwrap(), true)
        .unwrap();
    assert_eq!(index.keys(), 1);
    let d = compact_batch(
        &clean,
        &verify(&clean).unwrap(),
        &index,
        KEEP_TOMBSTONES,
        false,
    )
    .unwrap();
    assert_eq!(d.kept, Kept::Whole);
}

proptest! {
    /// Any history of writes and deletes compacts to the model: per key, its latest write
    /// at its own offset, tombstones included while young.
    #[test]
    fn compaction_matches_the_latest_per_key_model(
        writes in prop::collection::vec((0u8..12, prop::option::weighted(0.8, 0u16..1000)), 1..120),
        batch_size in 1usize..7,
        codec in prop::sample::select(vec![Compression::None, Compression::Lz4, Compression::Zstd]),
    ) {
        let mut batches = Vec::new();
        let mut model: BTreeMap<String, (i64, Option<String>)> = BTreeMap::new();
        let owned: Vec<(String, Option<String>)> = writes
            .iter()
            .map(|(k, v)| (format!("k{k}"), v.map(|v| format!("v{v}"))))
            .collect();
        for (i, chunk) in owned.chunks(batch_size).enumerate() {
            let base = (i * batch_size) as i64;
            let recs: Vec<(Option<&str>, Option<&str>)> =
                chunk.iter().map(|(k, v)| (Some(k.as_str()), v.as_deref())).collect();
            batches.push(make(base, NOW, ProducerIds::NONE, codec, 0, &recs));
            for (j, (k, v)) in chunk.iter().enumerate() {
                model.insert(k.clone(), (base + j as i64, v.clone()));
            }
        }
        let (recs, out) = compact(&batches, KEEP_TOMBSTONES);
        let mut want: Vec<(i64, String, Option<String>)> =
            model.into_iter().map(|(k, (o, v))| (o, k, v)).collect();
        want.sort();
        prop_assert_eq!(recs, want);
        // Offsets only grow, and the last batch still ends where the input did.
        let last = verify(out.last().unwrap()).unwrap().last_offset();
        prop_assert_eq!(last, writes.len() as i64 - 1);
    }
}

#[test]
fn a_record_claiming_an_offset_outside_its_batch_is_damage_not_a_key() {
    // A CRC-valid batch whose header says one offset while it holds two records: the
    // second would claim an offset of the next batch and hide its key there.
    let mut b = data(10, &[(Some("a"), Some("1")), (Some("a"), Some("2"))]);
    b[23..27].copy_from_slice(&0i32.to_be_bytes());
    let crc = compute_crc(&b);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    let h = verify(&b).unwrap();
    let err = Index::default().observe(&b, &h, true).unwrap_err();
    assert!(err.contains("outside the batch"), "{err}");
    assert!(compact_batch(&b, &h, &Index::default(), KEEP_TOMBSTONES, false).is_err());
}
