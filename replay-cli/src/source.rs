//! Reading archived records straight from the bucket: the topic's description and
//! manifests say which remote segments hold a range, the remote reader fetches their batches
//! (CRC-checked), and the Kafka codec decodes them, decompressing whatever codec the
//! producer used.

use std::sync::Arc;

use anyhow::{bail, Context};
use bytes::Bytes;
use strata_cold::catalog::Topic;
use strata_cold::manifest::{AbortedTxn, RemoteSegment};
use strata_cold::object_store::ObjectStore;
use strata_cold::read::{ReadConfig, ReadError, RemoteReader};
use strata_core::batch::{verify, BatchIter, Headers, RecordViews};
use strata_core::codec::records_section;

/// Which records: partitions and an offset and time range (inclusive from, exclusive to).
#[derive(Debug, Clone, Default)]
pub struct Range {
    /// `None`: every partition.
    pub partitions: Option<Vec<u32>>,
    pub from_offset: Option<u64>,
    pub to_offset: Option<u64>,
    pub from_ms: Option<i64>,
    pub to_ms: Option<i64>,
    /// Keep the records of aborted transactions (`--include-aborted`).
    pub include_aborted: bool,
}

/// One record as the tools print or export it.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub partition: u32,
    pub offset: i64,
    pub timestamp: i64,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<(String, Option<Bytes>)>,
}

/// The remote segments of one partition a range needs, in order.
pub struct PartitionPlan {
    pub partition: u32,
    pub segments: Vec<RemoteSegment>,
    /// Where the cold tier ends (the hot tail, if asked for, starts there).
    pub cold_end: u64,
    /// The partition's aborted transactions in the cold tier (every segment's: a marker
    /// may follow its records by segments); empty with `include_aborted`.
    pub aborted: Vec<AbortedTxn>,
}

impl PartitionPlan {
    pub fn bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.size_bytes).sum()
    }
}

/// Finds a topic in the bucket by name (`cluster` when several clusters share a bucket).
pub async fn find_topic(
    store: &Arc<dyn ObjectStore>,
    name: &str,
    cluster: Option<&str>,
) -> anyhow::Result<Topic> {
    let topics = strata_cold::catalog::topics(store)
        .await
        .context("listing the topics in the bucket")?;
    let matching: Vec<_> = topics
        .into_iter()
        .filter(|t| t.info.name == name && cluster.is_none_or(|c| t.cluster == c))
        .collect();
    match matching.len() {
        0 => bail!("no topic '{name}' in this bucket (strata-replay ls lists what is there)"),
        1 => Ok(matching.into_iter().next().expect("one")),
        _ => bail!(
            "topic '{name}' exists in clusters {}: pick one with --cluster",
            matching
                .iter()
                .map(|t| t.cluster.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The segments each selected partition needs for `range`.
pub async fn plan(
    store: &Arc<dyn ObjectStore>,
    topic: &Topic,
    range: &Range,
) -> anyhow::Result<Vec<PartitionPlan>> {
    let partitions: Vec<u32> = match &range.partitions {
        Some(p) => {
            if let Some(bad) = p.iter().find(|p| **p >= topic.info.partitions) {
                bail!(
                    "topic '{}' has partitions 0..{}; there is no partition {bad}",
                    topic.info.name,
                    topic.info.partitions
                );
            }
            p.clone()
        }
        None => (0..topic.info.partitions).collect(),
    };
    let mut out = Vec::new();
    for p in partitions {
        let m = topic
            .manifests(store, p)
            .load()
            .await
            .with_context(|| format!("reading the manifest of partition {p}"))?;
        let cold_end = m.end_offset();
        let aborted = match range.include_aborted {
            true => Vec::new(),
            false => m.aborted_between(0, u64::MAX),
        };
        let segments = m
            .segments
            .into_iter()
            .filter(|s| range.from_offset.is_none_or(|f| s.end_offset > f))
            .filter(|s| range.to_offset.is_none_or(|t| s.base_offset < t))
            .filter(|s| range.from_ms.is_none_or(|f| s.max_timestamp >= f))
            .filter(|s| range.to_ms.is_none_or(|t| s.min_timestamp < t))
            .collect();
        out.push(PartitionPlan {
            partition: p,
            segments,
            cold_end,
            aborted,
        });
    }
    Ok(out)
}

/// A reader of archived records.
pub struct Source {
    reader: Arc<RemoteReader>,
    /// Skip a damaged segment (counted) instead of failing.
    pub skip_corrupt: bool,
    pub skipped: Vec<String>,
}

/// Bytes asked of the reader per step.
const STEP: usize = 4 << 20;

impl Source {
    pub async fn new(store: Arc<dyn ObjectStore>, skip_corrupt: bool) -> anyhow::Result<Self> {
        let reader = RemoteReader::open(
            store,
            ReadConfig {
                cache_bytes: 64 << 20,
                ..ReadConfig::default()
            },
        )
        .await?;
        Ok(Source {
            reader,
            skip_corrupt,
            skipped: Vec::new(),
        })
    }

    /// Where reading `seg` for `range` begins.
    pub fn start(seg: &RemoteSegment, range: &Range) -> u64 {
        range.from_offset.unwrap_or(0).max(seg.base_offset)
    }

    /// The batches of `seg` in `range` from offset `at`, about 4 MiB of them, not yet
    /// decoded (the reader has checked every batch's CRC). A damaged object fails the
    /// read, or with `skip_corrupt` ends the segment there (counted). `next`, the segment
    /// read after this one, is read ahead into as `seg`'s end nears.
    pub async fn read(
        &mut self,
        partition: u32,
        seg: &RemoteSegment,
        next: Option<&RemoteSegment>,
        range: &Range,
        at: u64,
        aborted: &[AbortedTxn],
    ) -> anyhow::Result<Batches> {
        let end = range.to_offset.unwrap_or(u64::MAX).min(seg.end_offset);
        let done = Batches::done(partition);
        if at >= end {
            return Ok(done);
        }
        let next = next.filter(|n| range.to_offset.is_none_or(|to| n.base_offset < to));
        let got = match self.reader.read_then(seg, at, STEP, next).await {
            Ok(b) => b,
            Err(e @ ReadError::Damaged { .. }) if self.skip_corrupt => {
                eprintln!("skipping the rest of partition {partition}'s segment at offset {at}: {e}");
                self.skipped.push(format!("{} (from offset {at})", seg.key));
                return Ok(done);
            }
            Err(e) => {
                return Err(anyhow::Error::new(e).context(format!(
                    "reading partition {partition} at offset {at} (--skip-corrupt skips a damaged segment)"
                )))
            }
        };
        if got.is_empty() {
            return Ok(done);
        }
        let aborted: Vec<(i64, u64)> = aborted
            .iter()
            .filter(|t| t.last_offset >= at && t.first_offset < end)
            .map(|t| (t.producer_id, t.first_offset))
            .collect();
        Batches::new(partition, got, (at, end), aborted, &seg.key, true)
    }
}

/// The offset after the last batch of `got` (read at offset `at`), from the batch headers
/// alone: a compacted batch may hold fewer records than its offsets span, or none.
fn after_batches(got: &[u8], at: u64, what: &str) -> anyhow::Result<u64> {
    let mut next = at;
    for item in BatchIter::new(got) {
        let (h, _) = item
            .map_err(|e| anyhow::anyhow!("decoding the batches of {what} at offset {at}: {e}"))?;
        next = next.max(h.last_offset() as u64 + 1);
    }
    if next <= at {
        bail!("no progress reading {what} at offset {at}");
    }
    Ok(next)
}

/// Batches read from the cold tier or the hot tail, to be decoded (perhaps on another
/// thread than the one that read them).
pub struct Batches {
    pub partition: u32,
    got: Bytes,
    /// Read at this offset; records from `at` up to `end` (exclusive) are in the range.
    at: u64,
    end: u64,
    /// The aborted transactions that meet the range: (producer id, first offset).
    aborted: Vec<(i64, u64)>,
    /// What was read, for errors: the object's key or "the hot tail".
    what: String,
    /// Every batch's CRC already checked (by the cold reader).
    checked: bool,
    /// Where the next read begins (`None`: the segment, or the hot tail, is done).
    pub next: Option<u64>,
}

impl Batches {
    /// The batches `got`, read at offset `at`, for the records below `end`.
    pub fn new(
        partition: u32,
        got: Bytes,
        (at, end): (u64, u64),
        aborted: Vec<(i64, u64)>,
        what: &str,
        checked: bool,
    ) -> anyhow::Result<Batches> {
        let next = after_batches(&got, at, what)?;
        Ok(Batches {
            partition,
            got,
            at,
            end,
            aborted,
            what: what.to_string(),
            checked,
            next: (next < end).then_some(next),
        })
    }

    /// Nothing read, nothing more to read.
    fn done(partition: u32) -> Batches {
        Batches {
            partition,
            got: Bytes::new(),
            at: 0,
            end: 0,
            aborted: Vec::new(),
            what: String::new(),
            checked: true,
            next: None,
        }
    }

    /// Bytes of batches read.
    pub fn bytes(&self) -> u64 {
        self.got.len() as u64
    }

    /// Calls `each` with every record of the range in these batches, in offset order.
    pub fn decode_each(
        &self,
        range: &Range,
        each: impl FnMut(&RecordRef<'_>),
    ) -> anyhow::Result<()> {
        if self.got.is_empty() {
            return Ok(());
        }
        decode_each(
            self.partition,
            &self.got,
            self.at,
            self.end,
            range,
            &self.aborted,
            &self.what,
            self.checked,
            each,
        )
    }

    /// The records decoded, as a step.
    pub fn into_step(self, range: &Range) -> anyhow::Result<Step> {
        let mut records = Vec::new();
        self.decode_each(range, |r| records.push(r.to_record()))?;
        Ok(Step {
            records,
            bytes: self.bytes(),
        })
    }
}

/// One decoded record, borrowing the decompressed records section it lies in.
pub struct RecordRef<'a> {
    pub partition: u32,
    pub offset: i64,
    pub timestamp: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    /// In order (a key may repeat); keys as they were sent, perhaps not UTF-8.
    pub headers: Headers<'a>,
    /// The records section the slices lie in.
    section: &'a Bytes,
}

impl RecordRef<'_> {
    /// An owned record: keys, values and header values are slices of the section (no copy).
    pub fn to_record(&self) -> Record {
        let slice = |b: &[u8]| self.section.slice_ref(b);
        Record {
            partition: self.partition,
            offset: self.offset,
            timestamp: self.timestamp,
            key: self.key.map(slice),
            value: self.value.map(slice),
            headers: self
                .headers
                .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), v.map(slice)))
                .collect(),
        }
    }
}

/// Calls `each` with the records of `range` in the batches `got` (read at offset `at`, for
/// offsets below `end`), in offset order. Each batch is CRC-checked unless `checked`
/// already; keys, values and header values are slices of the decompressed records,
/// headers kept in order (a key may repeat); control batches (transaction markers) are
/// skipped. `aborted` (producer id, first offset) are the aborted transactions that meet
/// the range: as a read_committed consumer does, a producer's transactional batches are
/// dropped from its aborted transaction's first offset until its abort marker. Records are
/// read in place, nothing allocated per record; a malformed batch fails the decode after
/// `each` has seen the records before its malformed one.
#[allow(clippy::too_many_arguments)]
fn decode_each(
    partition: u32,
    got: &Bytes,
    at: u64,
    end: u64,
    range: &Range,
    aborted: &[(i64, u64)],
    what: &str,
    checked: bool,
    mut each: impl FnMut(&RecordRef<'_>),
) -> anyhow::Result<()> {
    let mut waiting: Vec<(i64, u64)> = aborted.to_vec();
    waiting.sort_by_key(|(_, first)| std::cmp::Reverse(*first));
    let mut aborting = std::collections::HashSet::new();
    for item in BatchIter::new(got) {
        let (h, span) = item
            .map_err(|e| anyhow::anyhow!("decoding the batches of {what} at offset {at}: {e}"))?;
        let batch = &got[span];
        if !checked {
            verify(batch).map_err(|e| {
                anyhow::anyhow!(
                    "the batch at offset {} of {what} is damaged: {e}",
                    h.base_offset
                )
            })?;
        }
        while waiting
            .last()
            .is_some_and(|(_, first)| *first <= h.base_offset.max(0) as u64)
        {
            aborting.insert(waiting.pop().expect("just seen").0);
        }
        if h.is_control() {
            if strata_core::batch::marker::parse(batch).is_some_and(|m| !m.commit) {
                aborting.remove(&h.producer_id);
            }
            continue;
        }
        if h.is_transactional() && aborting.contains(&h.producer_id) {
            continue;
        }
        let section = records_section(batch, &h).map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
        let malformed = || {
            anyhow::anyhow!(
                "malformed records in the batch at offset {} of {what}",
                h.base_offset
            )
        };
        for r in RecordViews::new(&section, h.record_count).ok_or_else(malformed)? {
            let r = r.map_err(|_| malformed())?;
            let offset = h.base_offset + r.offset_delta;
            let timestamp = match h.log_append_time() {
                true => h.max_timestamp,
                false => h.base_timestamp + r.timestamp_delta,
            };
            if offset < 0 || (offset as u64) < at || offset as u64 >= end {
                continue;
            }
            if range.from_ms.is_some_and(|f| timestamp < f)
                || range.to_ms.is_some_and(|t| timestamp >= t)
            {
                continue;
            }
            each(&RecordRef {
                partition,
                offset,
                timestamp,
                key: r.key,
                value: r.value,
                headers: r.headers,
                section: &section,
            });
        }
    }
    Ok(())
}

/// The not-yet-tiered tail of a partition from a running cluster (`--include-hot`): the
/// batches of `range` from `at`, up to the high watermark as the broker answers.
pub async fn hot_read(
    cluster: &mut crate::cluster::Cluster,
    partition: u32,
    range: &Range,
    at: u64,
) -> anyhow::Result<Batches> {
    let end = range.to_offset.unwrap_or(u64::MAX);
    let done = Batches::done(partition);
    if at >= end {
        return Ok(done);
    }
    let committed = !range.include_aborted;
    let got = cluster.fetch(partition, at, STEP as i32, committed).await?;
    // read_committed: up to the last stable offset
    let hw = match committed {
        true => got.last_stable_offset.max(0) as u64,
        false => got.high_watermark.max(0) as u64,
    };
    let aborted: Vec<(i64, u64)> = got
        .aborted
        .iter()
        .map(|(pid, first)| (*pid, (*first).max(0) as u64))
        .collect();
    if got.records.is_empty() || at >= hw {
        return Ok(done);
    }
    Batches::new(
        partition,
        got.records,
        (at, end.min(hw)),
        aborted,
        "the hot tail",
        false,
    )
}

/// Steps through one partition's records: its remote segments in order, then, when a
/// cluster is given, the hot tail past the cold tier's end.
pub struct PartitionReader<'a> {
    plan: &'a PartitionPlan,
    range: Range,
    segment: usize,
    at: Option<u64>,
    hot_done: bool,
}

impl<'a> PartitionReader<'a> {
    pub fn new(plan: &'a PartitionPlan, range: Range) -> Self {
        PartitionReader {
            plan,
            range,
            segment: 0,
            at: None,
            hot_done: false,
        }
    }

    /// The next step, `None` at the end.
    pub async fn next(
        &mut self,
        src: &mut Source,
        hot: Option<&mut crate::cluster::Cluster>,
    ) -> anyhow::Result<Option<Step>> {
        match self.next_batches(src, hot).await? {
            Some(b) => Ok(Some(b.into_step(&self.range)?)),
            None => Ok(None),
        }
    }

    /// The next batches read, not yet decoded; `None` at the end.
    pub async fn next_batches(
        &mut self,
        src: &mut Source,
        hot: Option<&mut crate::cluster::Cluster>,
    ) -> anyhow::Result<Option<Batches>> {
        let p = self.plan.partition;
        if let Some(seg) = self.plan.segments.get(self.segment) {
            let from = self.at.unwrap_or_else(|| Source::start(seg, &self.range));
            let next = self.plan.segments.get(self.segment + 1);
            let got = src
                .read(p, seg, next, &self.range, from, &self.plan.aborted)
                .await?;
            self.at = got.next;
            if got.next.is_none() {
                self.segment += 1;
            }
            return Ok(Some(got));
        }
        let Some(cluster) = hot else {
            return Ok(None);
        };
        if self.hot_done {
            return Ok(None);
        }
        let from = self
            .at
            .unwrap_or_else(|| self.plan.cold_end.max(self.range.from_offset.unwrap_or(0)));
        let got = hot_read(cluster, p, &self.range, from).await?;
        self.at = got.next;
        self.hot_done = got.next.is_none();
        Ok(Some(got))
    }
}

/// What one step read.
pub struct Step {
    pub records: Vec<Record>,
    /// Bytes of batches read.
    pub bytes: u64,
}

/// Milliseconds since the epoch from RFC 3339 (`2026-11-01T00:00:00Z`, or a date alone) or
/// a number of milliseconds.
pub fn parse_time(s: &str) -> anyhow::Result<i64> {
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    let full = if s.len() == 10 {
        format!("{s}T00:00:00Z")
    } else {
        s.to_string()
    };
    let t = humantime::parse_rfc3339_weak(&full).with_context(|| {
        format!("'{s}' is not a time: use RFC 3339 (2026-11-01T09:30:00Z), a date (2026-11-01) or epoch milliseconds")
    })?;
    Ok(t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_from_rfc3339_dates_and_milliseconds() {
        assert_eq!(parse_time("1700000000000").unwrap(), 1_700_000_000_000);
        assert_eq!(parse_time("1970-01-02").unwrap(), 86_400_000);
        assert_eq!(parse_time("1970-01-01T00:00:01Z").unwrap(), 1_000);
        let e = parse_time("yesterday").unwrap_err().to_string();
        assert!(e.contains("RFC 3339"), "{e}");
    }
}
