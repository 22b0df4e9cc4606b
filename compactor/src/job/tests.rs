use std::collections::BTreeMap;

use strata_cold::catalog::{write_topic, TopicInfo};
use strata_cold::manifest::PartitionPrefix;
use strata_cold::object_store::memory::InMemory;
use strata_cold::upload::SealedSegment;
use strata_core::batch::build::{batch, ProducerIds, Rec};
use strata_core::batch::raw_records;

use super::*;
use strata_core::compact::records_section;

type Write = (String, Option<String>);
/// A batch to write: attributes, producer, writes.
type Batch = (i16, ProducerIds, Vec<Write>);

struct Fixture {
    store: Arc<dyn ObjectStore>,
    topic: Topic,
    dir: tempfile::TempDir,
    uploader: Uploader,
    next: u64,
    /// Every write, as produced: offset -> (key, value).
    log: BTreeMap<u64, Write>,
}

impl Fixture {
    async fn new(configs: &[(&str, &str)]) -> Self {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let info = TopicInfo {
            name: "ledger".into(),
            id: "t1".into(),
            partitions: 1,
            configs: configs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        write_topic(&store, "c1", &info).await.unwrap();
        let uploader = Uploader::new(
            store.clone(),
            PartitionPrefix::new("c1", "t1", 0),
            UploadConfig::default(),
        );
        uploader.manifest().claim(1).await.unwrap();
        Fixture {
            store,
            topic: Topic {
                cluster: "c1".into(),
                info,
            },
            dir: tempfile::tempdir().unwrap(),
            uploader,
            next: 0,
            log: BTreeMap::new(),
        }
    }

    async fn set_configs(&mut self, configs: &[(&str, &str)]) {
        for (k, v) in configs {
            self.topic.info.configs.insert(k.to_string(), v.to_string());
        }
        write_topic(&self.store, "c1", &self.topic.info)
            .await
            .unwrap();
    }

    /// Uploads one segment of batches of `per_batch` writes each, as the leader would.
    async fn segment(&mut self, writes: &[Write], per_batch: usize) {
        let batches: Vec<Batch> = writes
            .chunks(per_batch)
            .map(|c| (0, ProducerIds::NONE, c.to_vec()))
            .collect();
        self.segment_of(&batches).await;
    }

    /// Uploads one segment of these batches: (attributes, producer, writes). A control
    /// batch's writes are its marker record and stay out of the log of writes.
    async fn segment_of(&mut self, batches: &[Batch]) {
        let base = self.next;
        let path = self.dir.path().join(format!("{base}.log"));
        let mut bytes = Vec::new();
        for (attrs, ids, chunk) in batches {
            let recs: Vec<Rec> = chunk
                .iter()
                .map(|(k, v)| Rec {
                    key: Some(k.as_bytes()),
                    value: v.as_deref().map(str::as_bytes),
                    timestamp_delta: 0,
                })
                .collect();
            let mut b = batch(now_ms(), *ids, &recs);
            b[0..8].copy_from_slice(&(self.next as i64).to_be_bytes());
            b[21..23].copy_from_slice(&attrs.to_be_bytes());
            let crc = strata_core::batch::compute_crc(&b);
            b[17..21].copy_from_slice(&crc.to_be_bytes());
            for w in chunk {
                if attrs & 0x20 == 0 {
                    self.log.insert(self.next, w.clone());
                }
                self.next += 1;
            }
            bytes.extend_from_slice(&b);
        }
        std::fs::write(&path, bytes).unwrap();
        let seg = SealedSegment {
            base_offset: base,
            end_offset: self.next,
            log: path,
            producer_snapshot: None,
            epochs: vec![(1, 0)],
            aborted: Vec::new(),
        };
        self.uploader.upload(1, &seg).await.unwrap();
    }

    async fn manifest(&self) -> Manifest {
        self.uploader.manifest().load().await.unwrap()
    }

    /// Every record the manifest's segments hold, in order.
    async fn records(&self) -> Vec<(u64, Write)> {
        let mut out = Vec::new();
        for seg in self.manifest().await.segments {
            let mut batches = ObjectBatches::open(&self.store, &seg).await.unwrap();
            while let Some((h, b)) = batches.next().await.unwrap() {
                if h.is_control() {
                    continue;
                }
                let section = records_section(&b, &h).unwrap();
                for r in raw_records(&section, h.record_count).unwrap() {
                    let text = |v: &[u8]| String::from_utf8(v.to_vec()).unwrap();
                    out.push((
                        (h.base_offset + r.offset_delta) as u64,
                        (text(r.key.unwrap()), r.value.map(text)),
                    ));
                }
            }
        }
        out
    }

    /// The latest write of each key, at its offset.
    fn latest(&self) -> Vec<(u64, Write)> {
        let mut by_key: BTreeMap<&str, (u64, &Write)> = BTreeMap::new();
        for (o, w) in &self.log {
            by_key.insert(&w.0, (*o, w));
        }
        let mut out: Vec<(u64, Write)> =
            by_key.into_values().map(|(o, w)| (o, w.clone())).collect();
        out.sort();
        out
    }

    async fn compact(&self, cfg: &JobConfig) -> Report {
        run(&self.store, &self.topic, 0, cfg).await.unwrap()
    }

    async fn objects(&self) -> usize {
        self.store.list(None).count().await
    }
}

fn updates(keys: usize, rounds: usize, tag: &str) -> Vec<Write> {
    (0..rounds)
        .flat_map(|r| (0..keys).map(move |k| (format!("k{k}"), Some(format!("{tag}{r}")))))
        .collect()
}

#[tokio::test]
async fn compaction_keeps_each_keys_latest_at_its_offset_and_merges_segments() {
    let mut f = Fixture::new(&[("cleanup.policy", "compact")]).await;
    for i in 0..4 {
        f.segment(&updates(20, 5, &format!("s{i}-")), 7).await;
    }
    let before = f.manifest().await;
    let r = f.compact(&JobConfig::default()).await;
    assert!(r.swapped, "{r:?}");
    assert_eq!((r.segments_in, r.segments_out), (4, 1), "merged into one");
    assert_eq!(r.records_removed, 400 - 20);
    assert_eq!(r.keys, 20);
    assert_eq!(f.records().await, f.latest());
    let m = f.manifest().await;
    assert_eq!(m.segments.len(), 1);
    assert_eq!(
        (m.segments[0].base_offset, m.segments[0].end_offset),
        (0, 400)
    );
    assert!(m.segments[0].compacted.is_some());
    assert_eq!(
        m.leader_epoch, 1,
        "the compactor does not touch the leader's epoch"
    );
    // The replaced objects are retired, not deleted: a reader holding the old manifest
    // can still finish with them.
    let retired: Vec<&str> = m.retired.iter().map(|r| r.key.as_str()).collect();
    let old: Vec<&str> = before.segments.iter().map(|s| s.key.as_str()).collect();
    assert_eq!(retired, old);
    for key in old {
        f.store.head(&Path::from(key)).await.unwrap();
    }

    // Nothing new: nothing to do.
    let again = f.compact(&JobConfig::default()).await;
    assert!(again.skipped.is_some() && !again.swapped, "{again:?}");

    // New updates of some keys: below the default dirty ratio nothing happens; with it
    // lowered, the clean part is rewritten with them.
    f.segment(&updates(5, 1, "new-"), 3).await;
    let below = f.compact(&JobConfig::default()).await;
    assert!(
        below.skipped.as_deref().unwrap().contains("dirty ratio"),
        "{below:?}"
    );
    // max.compaction.lag.ms not yet passed: still below the ratio
    f.set_configs(&[("max.compaction.lag.ms", &i64::MAX.to_string())])
        .await;
    let below = f.compact(&JobConfig::default()).await;
    assert!(below.skipped.is_some(), "{below:?}");
    f.set_configs(&[("min.cleanable.dirty.ratio", "0.01")])
        .await;
    let r = f.compact(&JobConfig::default()).await;
    assert!(r.swapped, "{r:?}");
    assert_eq!(f.records().await, f.latest());
    assert_eq!(f.manifest().await.end_offset(), 405);
    // a dirty segment older than max.compaction.lag.ms is compacted below the ratio
    f.set_configs(&[("min.cleanable.dirty.ratio", "0.5")]).await;
    f.segment(&updates(5, 1, "newer-"), 3).await;
    let below = f.compact(&JobConfig::default()).await;
    assert!(below.skipped.is_some(), "{below:?}");
    f.set_configs(&[("max.compaction.lag.ms", "1")]).await;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let r = f.compact(&JobConfig::default()).await;
    assert!(r.swapped, "{r:?}");
    assert_eq!(f.records().await, f.latest());
}

#[tokio::test]
async fn tombstones_stay_until_the_delete_retention_then_go() {
    let mut f = Fixture::new(&[("cleanup.policy", "compact,delete")]).await;
    f.segment(&updates(4, 3, "v"), 4).await;
    f.segment(&[("k1".into(), None), ("k2".into(), None)], 2)
        .await;
    let r = f.compact(&JobConfig::default()).await;
    assert!(r.swapped);
    let got = f.records().await;
    assert_eq!(
        got,
        f.latest(),
        "the tombstones are the latest of k1 and k2"
    );
    assert_eq!(
        f.manifest().await.segments[0].compacted.unwrap().tombstones,
        2
    );

    f.set_configs(&[("delete.retention.ms", "1")]).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let r = f.compact(&JobConfig::default()).await;
    assert!(
        r.swapped,
        "tombstones past their retention make the clean part due: {r:?}"
    );
    let keys: Vec<String> = f.records().await.into_iter().map(|(_, (k, _))| k).collect();
    assert_eq!(
        keys,
        vec!["k0", "k3"],
        "k1 and k2 are gone with their tombstones"
    );
    let m = f.manifest().await;
    assert_eq!(m.segments[0].compacted.unwrap().tombstones, 0);
    assert_eq!(
        m.end_offset(),
        14,
        "offsets past the last record still end the segment"
    );
}

#[tokio::test]
async fn a_delete_topic_only_has_runs_of_small_segments_merged_byte_for_byte() {
    let mut f = Fixture::new(&[("cleanup.policy", "delete")]).await;
    for i in 0..5 {
        f.segment(&updates(3, 2, &format!("s{i}-")), 2).await;
    }
    let before = f.manifest().await;
    let size = before.segments[0].size_bytes;
    f.set_configs(&[("segment.bytes", &(size * 2 + size / 2).to_string())])
        .await;
    let r = f.compact(&JobConfig::default()).await;
    assert!(r.swapped, "{r:?}");
    assert_eq!(r.records_removed, 0);
    let m = f.manifest().await;
    let ranges: Vec<(u64, u64)> = m
        .segments
        .iter()
        .map(|s| (s.base_offset, s.end_offset))
        .collect();
    assert_eq!(
        ranges,
        vec![(0, 12), (12, 24), (24, 30)],
        "pairs merged, the last one left"
    );
    assert!(m.segments.iter().all(|s| s.compacted.is_none()));
    // The merged object is its sources, concatenated.
    let get = |k: String| {
        let store = f.store.clone();
        async move {
            store
                .get(&Path::from(k))
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap()
        }
    };
    let mut want = get(before.segments[0].key.clone()).await.to_vec();
    want.extend_from_slice(&get(before.segments[1].key.clone()).await);
    assert_eq!(get(m.segments[0].key.clone()).await.to_vec(), want);
    assert_eq!(m.segments[2].key, before.segments[4].key, "left alone");
    assert_eq!(f.records().await.len(), 30);
}

#[tokio::test]
async fn a_dry_run_counts_but_writes_nothing() {
    let mut f = Fixture::new(&[("cleanup.policy", "compact")]).await;
    f.segment(&updates(10, 4, "v"), 5).await;
    let (objects, version) = (f.objects().await, f.manifest().await.version);
    let cfg = JobConfig {
        dry_run: true,
        ..JobConfig::default()
    };
    let r = f.compact(&cfg).await;
    assert_eq!(r.records_removed, 30);
    assert!(!r.swapped);
    assert_eq!(f.objects().await, objects);
    assert_eq!(f.manifest().await.version, version);
}

#[tokio::test]
async fn a_small_key_table_compacts_a_prefix_and_the_next_run_the_rest() {
    let mut f = Fixture::new(&[
        ("cleanup.policy", "compact"),
        ("min.cleanable.dirty.ratio", "0"),
    ])
    .await;
    for i in 0..4 {
        f.segment(&updates(50, 2, &format!("s{i}-")), 10).await;
    }
    let cfg = JobConfig {
        max_map_bytes: 1,
        merge_bytes: Some(1),
        ..JobConfig::default()
    };
    let r = f.compact(&cfg).await;
    assert!(r.swapped);
    assert_eq!(
        r.segments_in, 1,
        "only the first segment fitted the key table"
    );
    let m = f.manifest().await;
    assert!(m.segments[0].compacted.is_some() && m.segments[1].compacted.is_none());
    for _ in 0..3 {
        f.compact(&cfg).await;
    }
    // Each run's table covers one more segment: the whole range is compact at last.
    let m = f.manifest().await;
    assert!(m.segments.iter().all(|s| s.compacted.is_some()));
    let f_latest = f.latest();
    let got = f.records().await;
    assert!(
        f_latest.iter().all(|w| got.contains(w)),
        "every key's latest stays"
    );
    let within_last: Vec<_> = got.iter().filter(|(o, _)| *o >= 300).collect();
    assert_eq!(
        within_last.len(),
        50,
        "the last segment's own duplicates are gone"
    );
}

#[test]
fn topic_configs_are_read_with_kafkas_defaults_and_checked() {
    let c = |pairs: &[(&str, &str)]| {
        TopicPolicy::from_configs(
            &pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    };
    let d = c(&[]).unwrap();
    assert!(!d.compact);
    assert_eq!(d.delete_retention_ms, 86_400_000);
    assert!(c(&[("cleanup.policy", "compact, delete")]).unwrap().compact);
    assert!(c(&[("cleanup.policy", "shred")])
        .unwrap_err()
        .contains("shred"));
    assert!(c(&[("delete.retention.ms", "soon")])
        .unwrap_err()
        .contains("delete.retention.ms"));
    assert!(c(&[("min.cleanable.dirty.ratio", "2")]).is_err());
    assert_eq!(d.max_compaction_lag_ms, i64::MAX);
    assert_eq!(
        c(&[("max.compaction.lag.ms", "60000")])
            .unwrap()
            .max_compaction_lag_ms,
        60000
    );
}

#[tokio::test]
async fn a_damaged_object_fails_the_job_by_name_and_changes_nothing() {
    let mut f = Fixture::new(&[("cleanup.policy", "compact")]).await;
    f.segment(&updates(5, 4, "v"), 5).await;
    f.segment(&updates(5, 4, "w"), 5).await;
    let before = f.manifest().await;
    let key = Path::from(before.segments[1].key.as_str());
    let mut bytes = f
        .store
        .get(&key)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec();
    let at = bytes.len() - 3;
    bytes[at] ^= 0x10;
    f.store.put(&key, bytes.into()).await.unwrap();
    let err = run(&f.store, &f.topic, 0, &JobConfig::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(before.segments[1].key.as_str()) && err.contains("crc"),
        "{err}"
    );
    assert_eq!(f.manifest().await, before, "nothing swapped");
}

#[tokio::test]
async fn a_transaction_still_open_keeps_its_segment_dirty_until_it_is_decided() {
    let mut f = Fixture::new(&[
        ("cleanup.policy", "compact"),
        ("min.cleanable.dirty.ratio", "0"),
    ])
    .await;
    let txn = ProducerIds {
        producer_id: 7,
        producer_epoch: 0,
        base_sequence: 0,
    };
    let w = |k: &str, v: &str| (k.to_string(), Some(v.to_string()));
    // K@0 plain, K@1 in a transaction whose marker is not uploaded yet.
    f.segment_of(&[
        (0, ProducerIds::NONE, vec![w("K", "plain")]),
        (0x10, txn, vec![w("K", "in-txn")]),
    ])
    .await;
    let r = f.compact(&JobConfig::default()).await;
    assert_eq!(r.records_removed, 0, "the open transaction hides nothing");
    assert!(
        f.manifest().await.segments[0].compacted.is_none(),
        "a segment holding an undecided transaction is not clean"
    );
    // The commit arrives: K@1 is K's latest, K@0 goes.
    let commit = ("\0\0\0\u{1}".to_string(), Some("\0\0\0\0\0\0".to_string()));
    f.segment_of(&[
        (0x30, txn, vec![commit]),
        (0, ProducerIds::NONE, vec![w("X", "x")]),
    ])
    .await;
    let r = f.compact(&JobConfig::default()).await;
    assert!(r.swapped, "{r:?}");
    let got = f.records().await;
    assert_eq!(got, vec![(1, w("K", "in-txn")), (3, w("X", "x"))]);
    assert!(f
        .manifest()
        .await
        .segments
        .iter()
        .all(|s| s.compacted.is_some()));
}

#[test]
fn work_files_of_dead_processes_are_removed_live_ones_kept() {
    let dir = tempfile::tempdir().unwrap();
    let mine = dir
        .path()
        .join(format!("{WORK_PREFIX}{}-abc", std::process::id()));
    // A pid far above any pid_max: no such process.
    let dead = dir.path().join(format!("{WORK_PREFIX}4294967294-abc"));
    let other = dir.path().join("unrelated.log");
    for p in [&mine, &dead, &other] {
        std::fs::write(p, b"x").unwrap();
    }
    assert_eq!(clean_work_dir(dir.path()).unwrap(), 1);
    assert!(mine.exists() && other.exists() && !dead.exists());
}
