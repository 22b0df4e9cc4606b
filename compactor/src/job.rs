//! One partition's job: plan what to rewrite, rewrite it, swap the manifest.
//!
//! For a `compact` topic the remote segments split into a clean part (rewritten by an
//! earlier run, `compacted` set in the manifest) followed by a dirty part (as uploaded).
//! Pass 1 reads the whole range and learns the latest offset of every key of the dirty part
//! (bounded by `max_map_bytes`: past it, the dirty part ends early and the rest waits for
//! the next run), transaction outcomes and producers' last batches. Pass 2 reads it again,
//! in groups of consecutive segments whose sizes add up to at most the merge target (the
//! topic's `segment.bytes`), and writes one new object per group with only the records
//! that stay. A topic that is not compacted only has runs of small segments merged, batches
//! copied unchanged.
//!
//! New objects are written under new keys, never over old ones, and become visible in one
//! create-only manifest write that replaces exactly the segments read, if they are still
//! there (a leader's upload meanwhile only appends; retention meanwhile makes the swap give
//! up). A job killed at any point leaves the old manifest valid and its new objects as
//! orphans, which the grace period then removes. Replaced objects are listed as retired in
//! the manifest and kept for the grace period, so a reader holding the older manifest can
//! finish with them.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use strata_cold::catalog::Topic;
use strata_cold::manifest::{Compacted, Manifest, ManifestError, RemoteSegment, Retired};
use strata_cold::object_store::path::Path;
use strata_cold::object_store::ObjectStore;
use strata_cold::upload::{SegmentIndex, UploadConfig, UploadError, Uploader};
use strata_core::batch::{verify, BatchHeader, HEADER_LEN};

use strata_core::compact::{compact_batch, Decided, Index, Kept, Policy};

/// How the compactor works, whatever the topic.
#[derive(Debug, Clone)]
pub struct JobConfig {
    /// The merge target; `None`: the topic's `segment.bytes`.
    pub merge_bytes: Option<u64>,
    /// Memory for pass 1's key table.
    pub max_map_bytes: usize,
    /// Objects no manifest names (and replaced ones) are deleted once this old.
    pub orphan_grace: Duration,
    /// Plan and count, write nothing.
    pub dry_run: bool,
    /// Where groups are written before they are uploaded.
    pub work_dir: PathBuf,
    /// Index entry spacing of the objects written.
    pub index_interval: u32,
}

impl Default for JobConfig {
    fn default() -> Self {
        JobConfig {
            merge_bytes: None,
            max_map_bytes: 256 << 20,
            orphan_grace: Duration::from_secs(3600),
            dry_run: false,
            work_dir: std::env::temp_dir(),
            index_interval: 64 << 10,
        }
    }
}

/// A topic's settings the compactor follows (Kafka's names and defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct TopicPolicy {
    /// `cleanup.policy` contains `compact`.
    pub compact: bool,
    pub delete_retention_ms: i64,
    pub segment_bytes: u64,
    pub min_cleanable_dirty_ratio: f64,
    pub min_compaction_lag_ms: i64,
    /// `max.compaction.lag.ms`: a partition whose oldest uncompacted segment is older than
    /// this is compacted whatever its dirty ratio (Kafka's rule).
    pub max_compaction_lag_ms: i64,
}

impl TopicPolicy {
    pub fn from_configs(configs: &BTreeMap<String, String>) -> Result<Self, String> {
        fn num<T: std::str::FromStr>(
            c: &BTreeMap<String, String>,
            name: &str,
            default: T,
        ) -> Result<T, String> {
            c.get(name).map_or(Ok(default), |v| {
                v.trim()
                    .parse()
                    .map_err(|_| format!("{name}={v:?} is not a number"))
            })
        }
        let policy = configs
            .get("cleanup.policy")
            .map_or("delete", String::as_str);
        let mut compact = false;
        for p in policy.split(',').map(str::trim) {
            match p {
                "compact" => compact = true,
                "delete" => {}
                other => return Err(format!("cleanup.policy {other:?} is not delete or compact")),
            }
        }
        let ratio: f64 = num(configs, "min.cleanable.dirty.ratio", 0.5)?;
        if !(0.0..=1.0).contains(&ratio) {
            return Err(format!(
                "min.cleanable.dirty.ratio={ratio} is not between 0 and 1"
            ));
        }
        Ok(TopicPolicy {
            compact,
            delete_retention_ms: num(configs, "delete.retention.ms", 86_400_000)?,
            segment_bytes: num(configs, "segment.bytes", 1 << 30)?,
            min_cleanable_dirty_ratio: ratio,
            min_compaction_lag_ms: num(configs, "min.compaction.lag.ms", 0)?,
            max_compaction_lag_ms: num(configs, "max.compaction.lag.ms", i64::MAX)?,
        })
    }
}

/// What one job did (or, in a dry run, would do).
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    /// Why nothing was rewritten, when nothing was.
    pub skipped: Option<String>,
    pub segments_in: u64,
    pub segments_out: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub batches_in: u64,
    pub records_removed: u64,
    /// Distinct keys of the dirty part.
    pub keys: u64,
    /// The manifest was swapped (false in a dry run or when it changed under us).
    pub swapped: bool,
    /// The segments read were no longer all there at the swap (retention, another
    /// compactor): nothing changed; the objects written are orphans now.
    pub conflict: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("manifest: {0}")]
    Manifest(#[from] ManifestError),
    #[error("object store: {0}")]
    Store(#[from] strata_cold::object_store::Error),
    #[error("upload: {0}")]
    Upload(#[from] UploadError),
    #[error("remote object {key} is damaged at byte {position}: {why}")]
    Damaged {
        key: String,
        position: u64,
        why: String,
    },
    #[error("topic {topic}: {why}")]
    Config { topic: String, why: String },
    #[error("work file {path}: {source}")]
    Work {
        path: String,
        source: std::io::Error,
    },
}

/// The batches of one remote segment, streamed, CRC-checked and checked to lie in the
/// segment's offset range.
struct ObjectBatches {
    key: String,
    range: std::ops::Range<u64>,
    stream: BoxStream<'static, strata_cold::object_store::Result<Bytes>>,
    buf: BytesMut,
    position: u64,
}

impl ObjectBatches {
    async fn open(store: &Arc<dyn ObjectStore>, seg: &RemoteSegment) -> Result<Self, JobError> {
        let got = store.get(&Path::from(seg.key.as_str())).await?;
        Ok(ObjectBatches {
            key: seg.key.clone(),
            range: seg.base_offset..seg.end_offset,
            stream: got.into_stream(),
            buf: BytesMut::new(),
            position: 0,
        })
    }

    fn damaged(&self, why: String) -> JobError {
        JobError::Damaged {
            key: self.key.clone(),
            position: self.position,
            why,
        }
    }

    async fn next(&mut self) -> Result<Option<(BatchHeader, Bytes)>, JobError> {
        loop {
            if self.buf.len() >= HEADER_LEN {
                let h = BatchHeader::parse(&self.buf).map_err(|e| self.damaged(e.to_string()))?;
                if self.buf.len() >= h.total_len() {
                    let batch = self.buf.split_to(h.total_len()).freeze();
                    verify(&batch).map_err(|e| self.damaged(e.to_string()))?;
                    let last = h.base_offset.checked_add(i64::from(h.last_offset_delta));
                    let inside = u64::try_from(h.base_offset)
                        .is_ok_and(|b| self.range.contains(&b))
                        && h.last_offset_delta >= 0
                        && last.is_some_and(|l| self.range.contains(&(l as u64)));
                    if !inside {
                        return Err(self.damaged(format!(
                            "batch at offset {} (last delta {}) lies outside the segment's range [{}, {})",
                            h.base_offset, h.last_offset_delta, self.range.start, self.range.end
                        )));
                    }
                    self.position += batch.len() as u64;
                    return Ok(Some((h, batch)));
                }
            }
            match self.stream.next().await {
                Some(chunk) => self.buf.extend_from_slice(&chunk?),
                None if self.buf.is_empty() => return Ok(None),
                None => return Err(self.damaged("object ends inside a batch".into())),
            }
        }
    }
}

/// Work files are named `strata-compact-{pid}-...`.
const WORK_PREFIX: &str = "strata-compact-";

/// Removes work files a killed compactor left in `dir` (their process is gone); returns
/// how many.
pub fn clean_work_dir(dir: &std::path::Path) -> std::io::Result<usize> {
    let mut removed = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(WORK_PREFIX)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let alive = pid == std::process::id()
            || !std::path::Path::new("/proc/self").exists()
            || std::path::Path::new(&format!("/proc/{pid}")).exists();
        if !alive {
            std::fs::remove_file(entry.path())?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// One group's new object, written to a work file before it is uploaded.
struct GroupWriter {
    file: std::io::BufWriter<tempfile::NamedTempFile>,
    base: u64,
    position: u64,
    index: SegmentIndex,
    tombstones: u64,
    oldest_tombstone: i64,
    /// A batch was rewritten or dropped, or sources were merged: a new object is needed.
    changed: bool,
    /// The emptied last batch of the last segment read, written if nothing follows it.
    pending_tail: Option<Vec<u8>>,
}

impl GroupWriter {
    fn new(cfg: &JobConfig, base: u64) -> Result<Self, JobError> {
        let prefix = format!("{WORK_PREFIX}{}-", std::process::id());
        let tmp = tempfile::Builder::new()
            .prefix(&prefix)
            .tempfile_in(&cfg.work_dir)
            .map_err(|source| JobError::Work {
                path: cfg.work_dir.display().to_string(),
                source,
            })?;
        Ok(GroupWriter {
            file: std::io::BufWriter::with_capacity(1 << 20, tmp),
            base,
            position: 0,
            index: SegmentIndex::new(cfg.index_interval),
            tombstones: 0,
            oldest_tombstone: -1,
            changed: false,
            pending_tail: None,
        })
    }

    fn work_error(&self, source: std::io::Error) -> JobError {
        JobError::Work {
            path: self.file.get_ref().path().display().to_string(),
            source,
        }
    }

    fn push(&mut self, h: &BatchHeader, batch: &[u8]) -> Result<(), JobError> {
        let relative = (h.base_offset as u64)
            .checked_sub(self.base)
            .and_then(|r| u32::try_from(r).ok())
            .ok_or_else(|| {
                self.work_error(std::io::Error::other(
                    "a batch below the group's base or more than 2^32 offsets in one group",
                ))
            })?;
        let position = u32::try_from(self.position)
            .map_err(|_| self.work_error(std::io::Error::other("group larger than 4 GiB")))?;
        self.index.push(h, relative, position);
        self.file.write_all(batch).map_err(|e| self.work_error(e))?;
        self.position += batch.len() as u64;
        self.pending_tail = None;
        Ok(())
    }

    fn count_tombstones(&mut self, d: &Decided) {
        self.tombstones += d.tombstones;
        if d.tombstones > 0
            && (self.oldest_tombstone < 0 || d.oldest_tombstone < self.oldest_tombstone)
        {
            self.oldest_tombstone = d.oldest_tombstone;
        }
    }
}

/// What every group of one job shares.
struct Ctx<'a> {
    store: &'a Arc<dyn ObjectStore>,
    uploader: &'a Uploader,
    manifests: &'a strata_cold::manifest::ManifestStore,
    cfg: &'a JobConfig,
    policy: &'a TopicPolicy,
    now: i64,
    segs: &'a [RemoteSegment],
    /// Where the first transaction not decided yet starts: segments from there on are
    /// not marked clean, so the next run reads their keys again once it is decided.
    clean_until: Option<i64>,
}

/// What pass 2 wrote so far.
struct Output {
    /// One segment per group, in order.
    replacement: Vec<RemoteSegment>,
    /// The groups of segment indexes they replace.
    groups: Vec<std::ops::Range<usize>>,
    /// Bytes written.
    written: u64,
    /// When the first object was uploaded (the orphan sweep counts its age from then).
    first_upload: Option<std::time::Instant>,
}

impl Output {
    /// Ends the group of `ctx.segs[range]` written by `w`: uploads its object (unless
    /// nothing changed, or in a dry run) and notes the segment that replaces the group.
    async fn finish(
        &mut self,
        ctx: &Ctx<'_>,
        range: std::ops::Range<usize>,
        mut w: GroupWriter,
    ) -> Result<(), JobError> {
        if let Some(tail) = w.pending_tail.take() {
            let h = BatchHeader::parse(&tail).expect("a batch just built");
            w.push(&h, &tail)?;
        }
        let sources = &ctx.segs[range.clone()];
        let last = sources.last().expect("groups are not empty");
        let clean = ctx.clean_until.is_none_or(|o| last.end_offset as i64 <= o);
        let compacted = (ctx.policy.compact && clean).then_some(Compacted {
            at: ctx.now,
            tombstones: w.tombstones,
            oldest_tombstone: w.oldest_tombstone,
        });
        self.written += w.position;
        self.groups.push(range);
        if !w.changed {
            // One segment, nothing removed: it stays as it is, now known to be clean.
            self.replacement.push(RemoteSegment {
                compacted,
                ..sources[0].clone()
            });
            return Ok(());
        }
        let first = &sources[0];
        let epoch = sources.iter().map(|s| s.leader_epoch).max().unwrap_or(0);
        let key =
            ctx.manifests
                .prefix()
                .segment_key(first.base_offset, epoch, uuid::Uuid::new_v4());
        let written = RemoteSegment {
            base_offset: first.base_offset,
            end_offset: last.end_offset,
            min_timestamp: w.index.min_timestamp,
            max_timestamp: w.index.max_timestamp,
            size_bytes: w.position,
            leader_epoch: epoch,
            key: key.clone(),
            compacted,
            // the markers stay (compaction keeps control batches), so do their aborts
            aborted: sources
                .iter()
                .flat_map(|s| s.aborted.iter().copied())
                .collect(),
        };
        if !ctx.cfg.dry_run {
            self.first_upload
                .get_or_insert_with(std::time::Instant::now);
            upload_group(ctx.store, ctx.uploader, w, sources, &key).await?;
        }
        self.replacement.push(written);
        Ok(())
    }
}

/// What the plan rewrites.
struct Plan {
    /// Segments `[0, end)` of the manifest are read.
    end: usize,
    /// Segments below this are the clean part (compact topics).
    clean: usize,
    /// Groups of segment indexes, each becoming one object.
    groups: Vec<std::ops::Range<usize>>,
}

/// Consecutive segments of `segs` in groups whose sizes add up to at most `target`.
fn group_by_size(segs: &[RemoteSegment], target: u64) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut size) = (0, 0u64);
    for (i, s) in segs.iter().enumerate() {
        if i > start && size + s.size_bytes > target {
            out.push(start..i);
            start = i;
            size = 0;
        }
        size += s.size_bytes;
    }
    if start < segs.len() {
        out.push(start..segs.len());
    }
    out
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Compacts (or merges) one partition of `topic`.
pub async fn run(
    store: &Arc<dyn ObjectStore>,
    topic: &Topic,
    partition: u32,
    cfg: &JobConfig,
) -> Result<Report, JobError> {
    let policy =
        TopicPolicy::from_configs(&topic.info.configs).map_err(|why| JobError::Config {
            topic: topic.info.name.clone(),
            why,
        })?;
    let manifests = topic.manifests(store, partition);
    let manifest = manifests.load().await?;
    let now = now_ms();
    let target = cfg.merge_bytes.unwrap_or(policy.segment_bytes).max(1);
    let segs = &manifest.segments;
    let mut report = Report::default();
    let Some(mut plan) = plan(&manifest, &policy, target, now, &mut report) else {
        return Ok(report);
    };

    // Pass 1: what the range holds.
    let mut index = Index::default();
    if policy.compact {
        for (i, seg) in segs[..plan.end].iter().enumerate() {
            let dirty = i >= plan.clean;
            let mut batches = ObjectBatches::open(store, seg).await?;
            while let Some((h, batch)) = batches.next().await? {
                index
                    .observe(&batch, &h, dirty)
                    .map_err(|why| batches.damaged(why))?;
            }
            if dirty && index.memory() > cfg.max_map_bytes && i + 1 < plan.end {
                tracing::info!(topic = %topic.info.name, partition, keys = index.keys(), up_to = seg.end_offset, "key table full: compacting up to here, the rest next run");
                plan.end = i + 1;
                break;
            }
        }
        report.keys = index.keys() as u64;
    }

    // Pass 2: one new object per group (or the old one, when nothing changed).
    let tombstone_policy = Policy {
        now_ms: now,
        delete_retention_ms: policy.delete_retention_ms,
    };
    let uploader = Uploader::new(
        store.clone(),
        manifests.prefix().clone(),
        UploadConfig::default(),
    );
    let ctx = Ctx {
        store,
        uploader: &uploader,
        manifests: &manifests,
        cfg,
        policy: &policy,
        now,
        segs,
        clean_until: index.first_undecided(),
    };
    let mut out = Output {
        first_upload: None,
        replacement: Vec::new(),
        groups: Vec::new(),
        written: 0,
    };
    // Compaction forms its groups as it goes: a segment joins the group being written while
    // the group's output so far plus the segment's expected output (its size times this
    // run's output/input ratio so far) stays within the target, so segments that compact
    // to little merge in the same run. Merging alone (ratio 1) follows the plan's groups.
    let spans: Vec<std::ops::Range<usize>> = match policy.compact {
        true => std::iter::once(0..plan.end).collect(),
        false => plan.groups.clone(),
    };
    let mut read = 0u64;
    for span in spans {
        let mut current: Option<(GroupWriter, usize)> = None;
        for i in span.clone() {
            let seg = &segs[i];
            if let Some((w, start)) = current.take() {
                let ratio = (out.written + w.position + 1) as f64 / (read + 1) as f64;
                let expected = w.position as f64 + seg.size_bytes as f64 * ratio;
                // An object's index addresses 4 GiB: never risk passing it.
                let too_big = w.position + seg.size_bytes > u64::from(u32::MAX) / 2;
                if expected > target as f64 || too_big {
                    out.finish(&ctx, start..i, w).await?;
                } else {
                    current = Some((w, start));
                }
            }
            let (w, start) = match current.as_mut() {
                Some(c) => c,
                None => current.insert((GroupWriter::new(cfg, seg.base_offset)?, i)),
            };
            w.changed |= i > *start;
            report.segments_in += 1;
            report.bytes_in += seg.size_bytes;
            read += seg.size_bytes;
            let mut batches = ObjectBatches::open(store, seg).await?;
            while let Some((h, batch)) = batches.next().await? {
                report.batches_in += 1;
                let decided = if policy.compact {
                    compact_batch(&batch, &h, &index, tombstone_policy, false)
                        .map_err(|why| batches.damaged(why))?
                } else {
                    Decided {
                        kept: Kept::Whole,
                        records_removed: 0,
                        tombstones: 0,
                        oldest_tombstone: -1,
                    }
                };
                report.records_removed += decided.records_removed;
                w.count_tombstones(&decided);
                match &decided.kept {
                    Kept::Whole => w.push(&h, &batch)?,
                    Kept::Rewritten(b) => {
                        w.changed = true;
                        let h = BatchHeader::parse(b).expect("a batch just built");
                        w.push(&h, b)?;
                    }
                    Kept::Dropped => {
                        w.changed = true;
                        if h.last_offset() as u64 + 1 >= seg.end_offset {
                            // The segment's last batch, emptied: written if the group
                            // ends here, so a reader finds where the segment ends.
                            let empty = compact_batch(&batch, &h, &index, tombstone_policy, true)
                                .map_err(|why| batches.damaged(why))?;
                            if let Kept::Rewritten(b) = empty.kept {
                                w.pending_tail = Some(b);
                            }
                        }
                    }
                }
            }
        }
        if let Some((w, start)) = current {
            out.finish(&ctx, start..span.end, w).await?;
        }
    }
    report.segments_out = out.replacement.len() as u64;
    report.bytes_out = out.written;
    plan.groups = out.groups;
    let replacement = out.replacement;
    if cfg.dry_run {
        return Ok(report);
    }

    // The swap: the segments read, replaced by what was written, in one manifest write.
    let mut next: Vec<RemoteSegment> = Vec::with_capacity(plan.end);
    let mut written = replacement.into_iter();
    let mut at = 0;
    for group in &plan.groups {
        next.extend_from_slice(&segs[at..group.start]);
        next.push(written.next().expect("one per group"));
        at = group.end;
    }
    next.extend_from_slice(&segs[at..plan.end]);
    let read = &segs[..plan.end];
    if next == read {
        report.skipped = Some("nothing changed".into());
        return Ok(report);
    }
    // An orphan sweep deletes unnamed objects older than the grace period: objects uploaded
    // too long ago may be gone already, and must not be named.
    if out
        .first_upload
        .is_some_and(|t| t.elapsed() > cfg.orphan_grace / 2)
    {
        tracing::warn!(topic = %topic.info.name, partition, grace = %humantime::format_duration(cfg.orphan_grace), "the job took longer than half the orphan grace period; nothing swapped (raise --orphan-grace and the brokers' orphan_grace, or lower --max-map-mb)");
        report.conflict = true;
        return Ok(report);
    }
    let kept: std::collections::HashSet<&str> = next.iter().map(|s| s.key.as_str()).collect();
    let grace = cfg.orphan_grace.as_millis() as i64;
    let swapped = manifests
        .update_unfenced(|m| {
            let unchanged = m.segments.len() >= read.len() && m.segments[..read.len()] == *read;
            if !unchanged {
                return Ok(None); // retention or another compactor got there first
            }
            let mut out = m.clone();
            out.segments.splice(..read.len(), next.iter().cloned());
            // Retired as of this write: kept for the grace period from now on.
            let at = now_ms();
            out.retired.retain(|r| at - r.at < grace);
            out.retired.extend(
                read.iter()
                    .filter(|s| !kept.contains(s.key.as_str()))
                    .map(|s| Retired {
                        key: s.key.clone(),
                        at,
                    }),
            );
            Ok(Some(out))
        })
        .await?;
    report.swapped =
        swapped.segments.len() >= next.len() && swapped.segments[..next.len()] == *next;
    report.conflict = !report.swapped;
    if report.swapped {
        tracing::info!(topic = %topic.info.name, partition, version = swapped.version, segments_in = report.segments_in, segments_out = report.segments_out, bytes_in = report.bytes_in, bytes_out = report.bytes_out, records_removed = report.records_removed, "compacted");
    } else {
        tracing::warn!(topic = %topic.info.name, partition, "the manifest changed under the compaction (retention?); nothing swapped, the new objects are orphans");
    }
    Ok(report)
}

/// Uploads a group's object and its companions: the indexes built while writing it, the
/// leader epochs of its sources, and the producer snapshot at its base (its first
/// source's).
async fn upload_group(
    store: &Arc<dyn ObjectStore>,
    uploader: &Uploader,
    w: GroupWriter,
    sources: &[RemoteSegment],
    key: &str,
) -> Result<(), JobError> {
    let work = w.file.into_inner().map_err(|e| JobError::Work {
        path: "group file".into(),
        source: e.into_error(),
    })?;
    uploader
        .put_file(&Path::from(key), work.path(), 0, w.position)
        .await?;
    uploader
        .put(
            &Path::from(format!("{key}.index")),
            w.index.encoded_offsets(),
        )
        .await?;
    uploader
        .put(
            &Path::from(format!("{key}.timeindex")),
            w.index.encoded_times(),
        )
        .await?;
    let mut epochs: BTreeMap<i32, u64> = BTreeMap::new();
    for s in sources {
        let companion = format!("{}.epochs", s.key);
        let bytes = match store.get(&Path::from(companion.as_str())).await {
            Ok(got) => got.bytes().await?,
            Err(strata_cold::object_store::Error::NotFound { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        let pairs: Vec<(i32, u64)> =
            serde_json::from_slice(&bytes).map_err(|e| JobError::Damaged {
                key: companion.clone(),
                position: 0,
                why: e.to_string(),
            })?;
        for (epoch, start) in pairs {
            let e = epochs.entry(epoch).or_insert(start);
            *e = (*e).min(start);
        }
    }
    let epochs: Vec<(i32, u64)> = epochs.into_iter().collect();
    uploader
        .put(
            &Path::from(format!("{key}.epochs")),
            Bytes::from(serde_json::to_vec(&epochs).expect("pairs serialize")),
        )
        .await?;
    let snapshot = Path::from(format!("{}.snapshot", sources[0].key));
    match store
        .copy(&snapshot, &Path::from(format!("{key}.snapshot")))
        .await
    {
        Ok(()) | Err(strata_cold::object_store::Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Decides what to rewrite, or why nothing (in `report.skipped`).
fn plan(
    m: &Manifest,
    policy: &TopicPolicy,
    target: u64,
    now: i64,
    report: &mut Report,
) -> Option<Plan> {
    let segs = &m.segments;
    let skip = |report: &mut Report, why: &str| {
        report.skipped = Some(why.to_string());
        None
    };
    if segs.is_empty() {
        return skip(report, "no remote segments");
    }
    if !policy.compact {
        // Merge runs of small segments; leave the rest.
        let groups: Vec<_> = group_by_size(segs, target)
            .into_iter()
            .filter(|g| g.len() > 1)
            .collect();
        let Some(last) = groups.last() else {
            return skip(report, "no small segments to merge");
        };
        return Some(Plan {
            end: last.end,
            clean: 0,
            groups,
        });
    }
    let clean = segs.iter().take_while(|s| s.compacted.is_some()).count();
    let lag_horizon = now.saturating_sub(policy.min_compaction_lag_ms);
    let dirty = segs[clean..]
        .iter()
        .take_while(|s| s.max_timestamp <= lag_horizon)
        .count();
    let end = clean + dirty;
    let (clean_bytes, dirty_bytes): (u64, u64) = (
        segs[..clean].iter().map(|s| s.size_bytes).sum(),
        segs[clean..end].iter().map(|s| s.size_bytes).sum(),
    );
    let tombstones_due = segs[..clean].iter().any(|s| {
        s.compacted.is_some_and(|c| {
            c.tombstones > 0 && now.saturating_sub(c.oldest_tombstone) > policy.delete_retention_ms
        })
    });
    let groups = group_by_size(&segs[..end], target);
    let mergeable = group_by_size(&segs[..clean], target).len() < clean;
    let ratio = dirty_bytes as f64 / (clean_bytes + dirty_bytes).max(1) as f64;
    if dirty == 0 && !tombstones_due && !mergeable {
        return skip(report, "nothing dirty, no tombstone due, nothing to merge");
    }
    // the oldest dirty segment's newest record: past max.compaction.lag.ms, the partition is
    // due whatever its dirty ratio
    let overdue =
        dirty > 0 && now.saturating_sub(segs[clean].max_timestamp) > policy.max_compaction_lag_ms;
    if dirty > 0
        && ratio < policy.min_cleanable_dirty_ratio
        && !tombstones_due
        && !mergeable
        && !overdue
    {
        return skip(
            report,
            &format!(
                "dirty ratio {ratio:.2} is below min.cleanable.dirty.ratio {}",
                policy.min_cleanable_dirty_ratio
            ),
        );
    }
    Some(Plan { end, clean, groups })
}

#[cfg(test)]
mod tests;
