//! Tiering: the broker's side of the cold tier. For every local replica of a topic with
//! `remote.storage.enable=true`:
//!
//! - as leader, it claims the partition's manifest with its leader epoch (fencing earlier
//!   leaders), then uploads, in offset order, each sealed segment whose end is at or below
//!   the high watermark and past the manifest's end;
//! - as follower, it reads where the manifest ends now and then;
//!
//! and records that end in the partition (`Progress::tiered_end`), so local retention
//! (`local.retention.*`) deletes only what the cold tier holds. Either way it counts only
//! the remote segments its own leader-epoch history shares (KIP-405): after an unclean
//! election the cold tier may hold a deposed leader's records where this log holds others,
//! and a claiming leader cuts those from the manifest to upload its own in their place.
//! When the object store fails, uploads stop for the round and are retried on the next;
//! local data stays, and the backlog shows in `strata_under_tiered_bytes`.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use strata_cold::catalog::TopicInfo;
use strata_cold::manifest::{Lineage, Manifest, ManifestError, PartitionPrefix};
use strata_cold::object_store::ObjectStore;
use strata_cold::retention::{self, Retention};
use strata_cold::upload::{UploadConfig, UploadError, Uploaded, Uploader};
use uuid::Uuid;

use super::Broker;

/// The cold tier as a broker uses it.
#[derive(Debug, Clone)]
pub struct TierConfig {
    pub store: strata_cold::store::StoreConfig,
    pub upload: UploadConfig,
    pub read: strata_cold::read::ReadConfig,
    /// How often sealed segments are looked for.
    pub interval: Duration,
    /// Segment objects no manifest names are deleted once this old (an upload in progress
    /// is younger); leaders look for them every `min(orphan_grace, 10 min)`.
    pub orphan_grace: Duration,
}

/// Segments one partition uploads per round. A leader that inherits a long backlog (its
/// predecessors kept being deposed) works through it in steps, so that remote retention
/// and the orphan sweep are not held up until the whole backlog is up, and the round ends
/// for the partitions waiting for an upload slot.
const UPLOADS_PER_ROUND: usize = 8;

/// How often a replica re-reads the manifest (a follower, to learn where it ends; a
/// leader, to see the compactor's swaps).
const FOLLOWER_CHECK: Duration = Duration::from_secs(10);

/// What the fetch path needs of the cold tier: the reader and each tiered partition's
/// latest known manifest (kept current by the tiering task).
pub struct ColdTier {
    pub reader: Arc<strata_cold::read::RemoteReader>,
    manifests: std::sync::RwLock<HashMap<(Uuid, i32), Arc<Manifest>>>,
}

impl ColdTier {
    pub fn new(reader: Arc<strata_cold::read::RemoteReader>) -> Self {
        ColdTier {
            reader,
            manifests: std::sync::RwLock::new(HashMap::new()),
        }
    }

    fn set(&self, key: (Uuid, i32), m: Manifest) {
        self.manifests
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, Arc::new(m));
    }

    pub fn manifest(&self, topic: Uuid, partition: i32) -> Option<Arc<Manifest>> {
        self.manifests
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(topic, partition))
            .cloned()
    }

    /// Whole batches from `offset` out of the cold tier, when it holds `offset`: `None`
    /// when it does not (or nothing is known of the partition).
    pub async fn read(
        &self,
        topic: Uuid,
        partition: i32,
        offset: u64,
        max_bytes: usize,
    ) -> Option<Result<bytes::Bytes, strata_cold::read::ReadError>> {
        let m = self.manifest(topic, partition)?;
        let mut offset = offset;
        let mut parts: Vec<bytes::Bytes> = Vec::new();
        let mut size = 0;
        // A compacted segment may hold no record from `offset` to its end (nothing, or
        // only empty batches that carry its last offset): go on into the next segment, so
        // a response never holds empty batches alone (librdkafka takes that for a record
        // too large to fetch).
        while let Some(seg) = m.segment_for(offset) {
            let next = m.segment_for(seg.end_offset);
            let got = match self
                .reader
                .read_then(seg, offset, max_bytes - size, next)
                .await
            {
                Ok(got) => got,
                Err(e) if parts.is_empty() => return Some(Err(e)),
                Err(_) => break, // serve what was read; the next fetch sees the error
            };
            let records = strata_core::batch::BatchIter::new(&got)
                .any(|b| b.is_ok_and(|(h, _)| h.record_count > 0));
            size += got.len();
            parts.push(got);
            if records || size >= max_bytes || seg.end_offset >= m.end_offset() {
                break;
            }
            offset = seg.end_offset;
        }
        match parts.len() {
            0 => None,
            1 => parts.pop().map(Ok),
            _ => Some(Ok(parts.concat().into())),
        }
    }

    /// The first offset the cold tier holds with a record timestamp at or after `ts`, and
    /// that timestamp: `None` when it holds none (or nothing is known of the partition).
    pub async fn offset_for_timestamp(
        &self,
        topic: Uuid,
        partition: i32,
        ts: i64,
    ) -> Result<Option<(u64, i64)>, strata_cold::read::ReadError> {
        let Some(m) = self.manifest(topic, partition) else {
            return Ok(None);
        };
        for seg in m.segments.iter().filter(|s| s.max_timestamp >= ts) {
            if let Some(found) = self.reader.offset_for_timestamp(seg, ts).await? {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// The first offset the cold tier holds, if it holds any.
    pub fn earliest(&self, topic: Uuid, partition: i32) -> Option<u64> {
        let m = self.manifest(topic, partition)?;
        m.segments.first().map(|s| s.base_offset)
    }
}

/// Whether `p` is tiered but this broker has not read its manifest yet (just after the
/// replica started, or while the object store cannot be reached): what the cold tier holds
/// is unknown, so an offset below the local log can be neither served nor refused, and the
/// earliest offset is not known. Answers are retriable errors until it is read. A local
/// log that starts at 0 has nothing below it to ask the cold tier about (a topic that has
/// just turned tiering on, say).
pub fn cold_tier_unknown(p: &super::partition::Partition) -> bool {
    let progress = p.progress();
    progress.tiered_end.is_none() && progress.log_start > 0 && p.lock().config().remote_storage
}

/// Why ListOffsets over both tiers has no answer.
#[derive(Debug, thiserror::Error)]
pub enum ListOffsetError {
    #[error("the cold tier's manifest of this partition is not read yet (the broker just started, or the object store cannot be reached); retry")]
    ColdTierUnknown,
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// ListOffsets over both tiers, as (timestamp, offset): by time, the cold tier holds the
/// oldest records, so its answer, when it has one, comes first; the earliest offset is the
/// cold tier's start when it holds any.
pub async fn list_offset(
    broker: &Broker,
    p: Arc<super::partition::Partition>,
    ts: i64,
) -> Result<(i64, i64), ListOffsetError> {
    let cold = broker
        .cold()
        .zip(broker.topic(&p.topic))
        .map(|(c, t)| (c.clone(), t.spec.id));
    let by_cold = ts >= 0 || ts == super::partition::EARLIEST;
    if cold.is_some() && by_cold && cold_tier_unknown(&p) {
        return Err(ListOffsetError::ColdTierUnknown);
    }
    if let (true, Some((cold, id))) = (ts >= 0, &cold) {
        let found = cold
            .offset_for_timestamp(*id, p.index, ts)
            .await
            .map_err(std::io::Error::other)?;
        if let Some((offset, found)) = found {
            // (Records below a DeleteRecords point are gone: the first after it stands in.)
            return Ok((found, offset.max(p.progress().deleted_below) as i64));
        }
    }
    let index = p.index;
    let deleted_below = p.progress().deleted_below;
    let local = tokio::task::spawn_blocking(move || p.offset_for(ts))
        .await
        .map_err(std::io::Error::other)??;
    let earliest = (ts == super::partition::EARLIEST)
        .then_some(cold)
        .flatten()
        .and_then(|(c, id)| c.earliest(id, index));
    Ok(match earliest {
        Some(r) => (local.0, r.max(deleted_below).min(local.1 as u64) as i64),
        None => local,
    })
}

struct PartitionTier {
    uploader: Uploader,
    /// The leader epoch the manifest was claimed with (`None`: not claimed yet).
    claimed: Option<i32>,
    checked: Option<Instant>,
    swept: Option<Instant>,
    /// The `.epochs` companions read so far, by segment key (objects never change; empty:
    /// the segment has none).
    epochs: HashMap<String, Vec<(i32, u64)>>,
}

impl PartitionTier {
    /// The end of the part of `m` that `lineage` shares (see
    /// [`strata_cold::manifest::consistent_end`]), reading the epochs of the segments it
    /// must check, each once.
    async fn consistent_end(
        &mut self,
        m: &Manifest,
        lineage: &Lineage,
    ) -> Result<u64, ManifestError> {
        let named: std::collections::HashSet<&str> =
            m.segments.iter().map(|s| s.key.as_str()).collect();
        self.epochs.retain(|k, _| named.contains(k.as_str()));
        for s in &m.segments {
            // Below the local log start nothing is checked; past its end, nothing held.
            let checked = s.end_offset > lineage.log_start && s.base_offset < lineage.log_end;
            if checked && !self.epochs.contains_key(&s.key) {
                let epochs = self.uploader.manifest().segment_epochs(s).await?;
                self.epochs
                    .insert(s.key.clone(), epochs.unwrap_or_default());
            }
        }
        Ok(strata_cold::manifest::consistent_end(
            m,
            &self.epochs,
            lineage,
        ))
    }
}

/// The replica's leader-epoch history and log range, to check remote segments against.
fn lineage_of(p: &super::Partition) -> Lineage {
    let log = p.lock();
    Lineage {
        epochs: log
            .epochs()
            .entries()
            .iter()
            .map(|e| (e.epoch, e.start_offset))
            .collect(),
        log_start: log.start_offset(),
        log_end: log.end_offset(),
    }
}

pub(super) async fn run(
    broker: Weak<Broker>,
    store: Arc<dyn ObjectStore>,
    cold: Arc<ColdTier>,
    config: TierConfig,
) {
    let mut tick = tokio::time::interval(config.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut state: HashMap<(Uuid, i32), PartitionTier> = HashMap::new();
    let mut described: HashMap<Uuid, TopicInfo> = HashMap::new();
    loop {
        tick.tick().await;
        let Some(b) = broker.upgrade() else { return };
        b.tier_round(&store, &cold, &config, &mut state).await;
        b.describe_topics(&store, &mut described).await;
    }
}

impl Broker {
    /// As leader of partition 0 of a tiered topic: keeps its description in the bucket
    /// (name, partitions, configs) current, for tools that read the bucket alone.
    async fn describe_topics(
        &self,
        store: &Arc<dyn ObjectStore>,
        described: &mut HashMap<Uuid, TopicInfo>,
    ) {
        for topic in self.topics() {
            let leads_first = topic
                .local()
                .any(|p| p.index == 0 && p.progress().leader_epoch.is_some());
            let Some(first) = topic.local().find(|p| p.index == 0) else {
                continue;
            };
            if !leads_first || !first.lock().config().remote_storage {
                continue;
            }
            let info = TopicInfo {
                name: topic.spec.name.clone(),
                id: topic.spec.id.simple().to_string(),
                partitions: topic.spec.partitions,
                configs: topic.spec.configs.clone(),
            };
            if described.get(&topic.spec.id) == Some(&info) {
                continue;
            }
            match strata_cold::catalog::write_topic(store, self.cluster_id(), &info).await {
                Ok(()) => {
                    described.insert(topic.spec.id, info);
                }
                Err(e) => {
                    tracing::warn!(topic = %topic.spec.name, error = %e, "could not describe the topic in the cold tier; will retry")
                }
            }
        }
    }

    async fn tier_round(
        &self,
        store: &Arc<dyn ObjectStore>,
        cold: &ColdTier,
        config: &TierConfig,
        state: &mut HashMap<(Uuid, i32), PartitionTier>,
    ) {
        let mut local = HashMap::new();
        for topic in self.topics() {
            for p in topic.local() {
                if !p.lock().config().remote_storage {
                    continue;
                }
                let key = (topic.spec.id, p.index);
                state.entry(key).or_insert_with(|| PartitionTier {
                    uploader: Uploader::new(
                        store.clone(),
                        PartitionPrefix::new(
                            self.cluster_id(),
                            &topic.spec.id.simple().to_string(),
                            p.index as u32,
                        ),
                        config.upload.clone(),
                    ),
                    claimed: None,
                    checked: None,
                    swept: None,
                    epochs: HashMap::new(),
                });
                local.insert(key, p.clone());
            }
        }
        state.retain(|k, _| local.contains_key(k));
        // Partitions tier independently, `upload.concurrency` of them at once; within one,
        // segments go up in order.
        use futures_util::StreamExt;
        let jobs: Vec<_> = state
            .iter_mut()
            .filter_map(|(key, tier)| Some((*key, tier, local.get(key)?.clone())))
            .collect();
        futures_util::stream::iter(jobs)
            .for_each_concurrent(config.upload.concurrency.max(1), |(key, tier, p)| {
                self.tier_partition(store, cold, tier, p, key, config.orphan_grace)
            })
            .await;
        let under_tiered: u64 = local
            .values()
            .map(|p| {
                let tiered_end = p.progress().tiered_end.unwrap_or(0);
                p.sealed_segments()
                    .iter()
                    .filter(|s| s.end_offset > tiered_end)
                    .map(|s| std::fs::metadata(&s.log).map_or(0, |m| m.len()))
                    .sum::<u64>()
            })
            .sum();
        self.metrics()
            .under_tiered_bytes
            .store(under_tiered, Relaxed);
    }

    /// One partition's round: as leader, upload and apply remote retention; as follower,
    /// now and then learn where the manifest ends.
    async fn tier_partition(
        &self,
        store: &Arc<dyn ObjectStore>,
        cold: &ColdTier,
        tier: &mut PartitionTier,
        p: Arc<super::Partition>,
        key: (Uuid, i32),
        orphan_grace: Duration,
    ) {
        match p.progress().leader_epoch {
            Some(epoch) => {
                self.tier_leader(&p, tier, epoch, cold, key).await;
                if tier.checked.is_none_or(|t| t.elapsed() >= FOLLOWER_CHECK) {
                    tier.checked = Some(Instant::now());
                    // The compactor swaps manifests behind the leader's back.
                    if let Ok(m) = tier.uploader.manifest().load().await {
                        let newer = cold
                            .manifest(key.0, key.1)
                            .is_none_or(|known| known.version < m.version);
                        if newer {
                            cold.set(key, m);
                        }
                    }
                }
                if tier.claimed == Some(epoch) {
                    self.expire_remote(store, &p, tier, epoch, cold, key).await;
                    let every = orphan_grace.min(Duration::from_secs(600));
                    if tier.swept.is_none_or(|t| t.elapsed() >= every) {
                        tier.swept = Some(Instant::now());
                        self.sweep_orphans(store, &p, tier, orphan_grace).await;
                    }
                }
            }
            None => {
                tier.claimed = None;
                if tier.checked.is_none_or(|t| t.elapsed() >= FOLLOWER_CHECK) {
                    tier.checked = Some(Instant::now());
                    match follow_manifest(tier, &p).await {
                        Ok(m) => cold.set(key, m),
                        Err(e) => {
                            tracing::debug!(topic = %p.topic, partition = p.index, error = %e, "could not read the cold tier's manifest")
                        }
                    }
                }
            }
        }
    }

    /// As leader at `epoch`: claims the manifest if not yet, then uploads what is sealed,
    /// committed and not tiered yet, in order, stopping at the first failure.
    async fn tier_leader(
        &self,
        p: &Arc<super::Partition>,
        tier: &mut PartitionTier,
        epoch: i32,
        cold: &ColdTier,
        key: (Uuid, i32),
    ) {
        let m = self.metrics();
        if tier.claimed != Some(epoch) {
            match claim_manifest(tier, p, epoch).await {
                Ok(manifest) => {
                    tier.claimed = Some(epoch);
                    cold.set(key, manifest);
                }
                Err(e) => {
                    m.tier_upload_errors.fetch_add(1, Relaxed);
                    tracing::warn!(topic = %p.topic, partition = p.index, epoch, error = %e, "could not claim the cold tier's manifest; will retry");
                    return;
                }
            }
        }
        let mut uploaded = 0;
        for seg in p.sealed_segments() {
            let progress = p.progress();
            if seg.end_offset <= progress.tiered_end.unwrap_or(0) {
                continue;
            }
            if uploaded == UPLOADS_PER_ROUND {
                // The rest next round: remote retention and the orphan sweep run between.
                return;
            }
            uploaded += 1;
            if seg.end_offset > progress.high_watermark || progress.leader_epoch != Some(epoch) {
                return;
            }
            match tier.uploader.upload(epoch, &seg).await {
                Ok(Uploaded::Committed {
                    bytes, manifest, ..
                }) => {
                    m.tiered_bytes.fetch_add(bytes, Relaxed);
                    m.tiered_segments.fetch_add(1, Relaxed);
                    p.set_tiered_end(seg.end_offset);
                    cold.set(key, *manifest);
                }
                Ok(Uploaded::AlreadyThere) => p.set_tiered_end(seg.end_offset),
                Err(UploadError::Manifest(ManifestError::Fenced { manifest, .. })) => {
                    tracing::info!(topic = %p.topic, partition = p.index, epoch, manifest, "a newer leader claimed the cold tier; not uploading");
                    tier.claimed = None;
                    return;
                }
                Err(e) => {
                    m.tier_upload_errors.fetch_add(1, Relaxed);
                    tracing::warn!(topic = %p.topic, partition = p.index, base = seg.base_offset, error = %e, "segment upload failed; local data is kept and the upload retried");
                    return;
                }
            }
        }
    }

    /// As leader: deletes the partition's objects no manifest names, once past the grace
    /// period (what killed or deposed uploads left).
    async fn sweep_orphans(
        &self,
        store: &Arc<dyn ObjectStore>,
        p: &Arc<super::Partition>,
        tier: &PartitionTier,
        grace: Duration,
    ) {
        let manifests = tier.uploader.manifest();
        let swept = match manifests.load().await {
            Ok(m) => strata_cold::orphans::sweep(store, manifests.prefix(), &m, grace).await,
            Err(e) => {
                tracing::debug!(topic = %p.topic, partition = p.index, error = %e, "orphan sweep: could not read the manifest");
                return;
            }
        };
        match swept {
            Ok(s) if !s.deleted.is_empty() => {
                tracing::info!(topic = %p.topic, partition = p.index, deleted = s.deleted.len(), young = s.young, "deleted orphaned cold-tier objects");
                self.metrics()
                    .orphans_deleted
                    .fetch_add(s.deleted.len() as u64, Relaxed);
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(topic = %p.topic, partition = p.index, error = %e, "orphan sweep failed; will retry")
            }
        }
    }

    /// As leader at `epoch`: applies the topic's total retention (`retention.ms`,
    /// `retention.bytes`) to the cold tier, manifest first, then objects.
    async fn expire_remote(
        &self,
        store: &Arc<dyn ObjectStore>,
        p: &Arc<super::Partition>,
        tier: &PartitionTier,
        epoch: i32,
        cold: &ColdTier,
        key: (Uuid, i32),
    ) {
        let (policy, local_only) = {
            let log = p.lock();
            let c = log.config();
            let policy = Retention {
                ms: c.retention_ms.map(|d| d.as_millis() as u64),
                bytes: c.retention_bytes,
                deleted_below: p.progress().deleted_below,
            };
            let end = cold.manifest(key.0, key.1).map_or(0, |m| m.end_offset());
            (policy, log.size_from(end))
        };
        let now = self.clock.now_ms();
        // The cached manifest tells whether anything expired, without a request.
        let known = cold.manifest(key.0, key.1);
        if known.is_none_or(|m| retention::expired(&m, now, policy, local_only) == 0) {
            return;
        }
        let manifests = tier.uploader.manifest();
        match retention::apply(store, manifests, epoch, now, policy, local_only).await {
            Ok(gone) => {
                if let Some(last) = gone.segments.last() {
                    tracing::info!(topic = %p.topic, partition = p.index, segments = gone.segments.len(), remote_log_start = last.end_offset, orphaned = gone.orphaned, "retention deleted remote segments");
                    self.metrics()
                        .remote_segments_deleted
                        .fetch_add(gone.segments.len() as u64, Relaxed);
                }
                if let Ok(m) = manifests.load().await {
                    cold.set(key, m);
                }
            }
            Err(e) => {
                tracing::warn!(topic = %p.topic, partition = p.index, epoch, error = %e, "remote retention failed; will retry")
            }
        }
    }
}

/// A new leader's claim on the manifest at `epoch` (fencing older leaders); records in `p`
/// how far the cold tier holds its log. Only the part of the cold tier this leader's epoch
/// history shares counts: the rest (a deposed leader's records, after an unclean election)
/// is cut from the manifest, epoch-fenced, so this leader uploads its own records in their
/// place; the cut objects become orphans for the sweep. Until then local retention keeps
/// them, as `tiered_end` stops where the shared part does.
async fn claim_manifest(
    tier: &mut PartitionTier,
    p: &super::Partition,
    epoch: i32,
) -> Result<Manifest, ManifestError> {
    let claimed = tier.uploader.manifest().claim(epoch).await?;
    let lineage = lineage_of(p);
    let shared_end = tier.consistent_end(&claimed, &lineage).await?;
    let manifest = if shared_end < claimed.end_offset() && shared_end < lineage.log_start {
        // The divergence reaches below what this leader still holds: cutting would drop
        // records from the cold tier that it cannot upload again. Keep the manifest (the old
        // history stays readable there) and stop counting it as this log's.
        tracing::error!(
            topic = %p.topic,
            partition = p.index,
            epoch,
            remote_end = claimed.end_offset(),
            shared_end,
            log_start = lineage.log_start,
            "the cold tier diverges from this leader's history below its local log start; not cutting it (after an unclean election, check the cold tier by hand)"
        );
        p.set_tiered_end(shared_end);
        return Ok(claimed);
    } else if shared_end < claimed.end_offset() {
        tracing::warn!(
            topic = %p.topic,
            partition = p.index,
            epoch,
            remote_end = claimed.end_offset(),
            shared_end,
            log_start = lineage.log_start,
            "the cold tier holds records this leader's epoch history does not; cutting its manifest back to upload this log's own"
        );
        tier.uploader.manifest().cut_back(epoch, shared_end).await?
    } else {
        claimed
    };
    p.set_tiered_end(manifest.end_offset());
    Ok(manifest)
}

/// As follower: reads the manifest and records in `p` how far it holds this replica's log
/// (the part its epoch history shares, as for a leader).
async fn follow_manifest(
    tier: &mut PartitionTier,
    p: &super::Partition,
) -> Result<Manifest, ManifestError> {
    let m = tier.uploader.manifest().load().await?;
    let shared_end = tier.consistent_end(&m, &lineage_of(p)).await?;
    p.set_tiered_end(shared_end);
    Ok(m)
}

#[cfg(test)]
mod tests {
    use strata_cold::manifest::{ManifestStore, RemoteSegment};
    use strata_cold::object_store::memory::InMemory;
    use strata_cold::object_store::path::Path;
    use strata_core::batch::build::{batch, ProducerIds, Rec};

    use super::*;
    use crate::broker::Partition;
    use crate::log::{PartitionLog, ValidBatch};

    /// Appends `batches` batches of 10 records at the log's current leader epoch.
    fn append(log: &mut PartitionLog, batches: usize) {
        for _ in 0..batches {
            let recs: Vec<Rec<'_>> = (0..10)
                .map(|i| Rec {
                    key: None,
                    value: Some(b"record"),
                    timestamp_delta: i,
                })
                .collect();
            let b = ValidBatch::new(bytes::Bytes::from(batch(1_000, ProducerIds::NONE, &recs)))
                .expect("a built batch is valid");
            log.append(&b, 0).expect("append");
        }
    }

    /// Issue 14, defect 5. The old leader (epoch 1) tiered [0, 200): written at epoch 0 up
    /// to 100, at epoch 1 after. The new leader, elected uncleanly, wrote epoch 2 from 100:
    /// it must not count [100, 200) as tiered, and it cuts the manifest back to 100 so that
    /// its own records go up in their place.
    /// What an old leader left in the cold tier: segments [0, 100) of epoch 0 and [100, 200)
    /// of epochs 0 then 1, uploaded at epoch 1.
    async fn old_leaders_manifest(
        store: &Arc<dyn ObjectStore>,
        prefix: &PartitionPrefix,
    ) -> ManifestStore {
        let old = ManifestStore::new(store.clone(), prefix.clone());
        for (base, end, epochs) in [
            (0u64, 100u64, vec![(0, 0)]),
            (100, 200, vec![(0, 0), (1, 100)]),
        ] {
            let key = prefix.segment_key(base, 1, Uuid::new_v4());
            let companion = serde_json::to_vec(&epochs).expect("pairs serialize");
            store
                .put(&Path::from(format!("{key}.epochs")), companion.into())
                .await
                .expect("in-memory put");
            let s = RemoteSegment {
                base_offset: base,
                end_offset: end,
                min_timestamp: 0,
                max_timestamp: 0,
                size_bytes: 1,
                leader_epoch: 1,
                key,
                compacted: None,
                aborted: Vec::new(),
            };
            old.update(1, move |m| {
                let mut next = m.clone();
                next.segments.push(s.clone());
                Ok(Some(next))
            })
            .await
            .expect("old leader's upload");
        }
        old
    }

    fn tier_of(store: &Arc<dyn ObjectStore>, prefix: &PartitionPrefix) -> PartitionTier {
        PartitionTier {
            uploader: Uploader::new(store.clone(), prefix.clone(), UploadConfig::default()),
            claimed: None,
            checked: None,
            swept: None,
            epochs: HashMap::new(),
        }
    }

    #[tokio::test]
    async fn a_new_leader_claims_only_the_part_of_the_cold_tier_its_history_shares() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let prefix = PartitionPrefix::new("c", "t", 0);
        let old = old_leaders_manifest(&store, &prefix).await;

        let dir = tempfile::tempdir().expect("temp dir");
        let (mut log, _) =
            PartitionLog::open(dir.path(), crate::log::LogConfig::default(), 0).expect("open log");
        append(&mut log, 10);
        log.begin_leader_epoch(2).expect("epoch recorded");
        append(&mut log, 5);
        let lineage: Vec<(i32, u64)> = log
            .epochs()
            .entries()
            .iter()
            .map(|e| (e.epoch, e.start_offset))
            .collect();
        assert_eq!(lineage, [(0, 0), (2, 100)]);
        let p = Partition::start(Arc::from("t"), 0, log, 150);

        let mut tier = tier_of(&store, &prefix);
        let claimed = claim_manifest(&mut tier, &p, 2).await.expect("claim");
        assert_eq!(
            p.progress().tiered_end,
            Some(100),
            "tiered_end counts only what the new leader's history shares"
        );
        let m = old.load().await.expect("load");
        assert_eq!(m, claimed);
        assert_eq!(
            (m.leader_epoch, m.end_offset(), m.segments.len()),
            (2, 100, 1)
        );
    }

    /// Review finding: when the divergence starts below this leader's local log start,
    /// cutting the manifest would drop records from the cold tier that nobody can upload
    /// again. The manifest is kept, and none of it counts as this log's (local retention
    /// keeps everything).
    #[tokio::test]
    async fn a_divergence_below_the_local_log_start_is_not_cut() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let prefix = PartitionPrefix::new("c", "t", 0);
        let old = old_leaders_manifest(&store, &prefix).await;

        let dir = tempfile::tempdir().expect("temp dir");
        let (mut log, _) =
            PartitionLog::open(dir.path(), crate::log::LogConfig::default(), 0).expect("open log");
        log.reset_to(120, 0).expect("reset");
        log.begin_leader_epoch(2).expect("epoch recorded");
        append(&mut log, 5);
        let p = Partition::start(Arc::from("t"), 0, log, 170);

        let mut tier = tier_of(&store, &prefix);
        let claimed = claim_manifest(&mut tier, &p, 2).await.expect("claim");
        assert_eq!(claimed.end_offset(), 200, "nothing cut");
        assert_eq!(old.load().await.expect("load").end_offset(), 200);
        assert_eq!(p.progress().tiered_end, Some(100));
    }
}
