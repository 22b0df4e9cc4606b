//! Fetch (long-poll, many partitions) and ListOffsets.
//!
//! A fetch plans each partition's read under its lock, reads the batches outside it on the
//! blocking pool, and, while it has fewer than `min_bytes`, waits for any of its partitions'
//! high watermarks to move or for `max_wait_ms` to pass. Consumers only ever see offsets
//! below the high watermark.

use super::quota::QuotaKey;
use std::sync::Arc;
use std::time::Duration;
use strata_controller::metadata::acl::Operation;

use bytes::Bytes;
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchableTopicResponse, PartitionData,
};
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use kafka_protocol::messages::{
    FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse,
    OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse, TopicName,
};
use tokio::sync::watch;

use super::fetch_session::{self, Plan, Wanted};
use super::frame::Spanned;
use super::{codes, Request};
use crate::broker::{Partition, Progress, Route};

struct Target {
    index: i32,
    offset: i64,
    max_bytes: usize,
    /// The local replica to read (the leader's, or with KIP-392 a follower's), or the
    /// error code to answer with.
    partition: Result<Arc<Partition>, i16>,
    /// The follower the leader tells the consumer to fetch from instead (KIP-392): the
    /// partition is answered without records.
    preferred: Option<i32>,
    /// The cold tier and the topic's id, for offsets below the local log start.
    remote: Option<(Arc<crate::broker::tier::ColdTier>, uuid::Uuid)>,
}

/// The local replica of a partition to read, or the error to answer with: not here, or
/// the client's `current_leader_epoch` is stale or ahead of this broker's. The leader's,
/// or with `from_follower` (Fetch v11+, KIP-392) a follower's, bounded by its own high
/// watermark.
fn lookup_partition(
    broker: &crate::broker::Broker,
    topic: &str,
    index: i32,
    client_epoch: i32,
    from_follower: bool,
) -> Result<Arc<Partition>, i16> {
    let p = match broker.route(topic, index) {
        Route::Leader(p) => p,
        Route::NotLeader if from_follower => match broker.follower_replica(topic, index) {
            Some(p) => p,
            None => return Err(codes::NOT_LEADER_OR_FOLLOWER),
        },
        other => return Err(codes::route(&other).expect("not the leader route")),
    };
    match codes::epoch(broker.leader_epoch_check(topic, index, client_epoch)) {
        None => Ok(p),
        Some(code) => Err(code),
    }
}

/// A fetch's response, and the segment-file spans its records' stand-ins stand for (sent
/// from the files on a plaintext listener).
pub(super) async fn handle(ctx: Request, req: FetchRequest) -> (FetchResponse, Vec<Spanned>) {
    use std::sync::atomic::Ordering::Relaxed;
    let started = std::time::Instant::now();
    let broker = ctx.broker().clone();
    let quota_ctx = ctx.clone();
    let (resp, spans) = handle_inner(ctx, req).await;
    if resp.throttle_time_ms > 0 {
        return (resp, spans);
    }
    let mut bytes = 0;
    for t in &resp.responses {
        for p in &t.partitions {
            let n = p.records.as_ref().map_or(0, |r| r.len() as u64);
            broker.count_fetched(t.topic.as_str(), p.partition_index, n);
            bytes += n;
        }
    }
    let m = broker.metrics();
    m.fetch_requests.fetch_add(1, Relaxed);
    m.fetch_latency.observe(started.elapsed());
    let throttle_ms = if bytes > 0 {
        quota_ctx.throttle(QuotaKey::ConsumerByteRate, bytes as f64)
    } else {
        0
    };
    (resp.with_throttle_time_ms(throttle_ms), spans)
}

/// The records a fetch response carries (its frame refers to them instead of copying them).
pub(super) fn records_of(resp: &FetchResponse) -> Vec<Bytes> {
    resp.responses
        .iter()
        .flat_map(|t| &t.partitions)
        .filter_map(|p| p.records.clone())
        .collect()
}

async fn handle_inner(ctx: Request, req: FetchRequest) -> (FetchResponse, Vec<Spanned>) {
    // A partition named twice is read and answered once (its first mention), as Kafka's
    // fetch session keeps one entry per partition: repeats must not multiply the response.
    let mut seen = std::collections::HashSet::new();
    let asked: Vec<Wanted> = req
        .topics
        .into_iter()
        .flat_map(|t| {
            let topic = t.topic;
            t.partitions.into_iter().map(move |p| Wanted {
                topic: topic.clone(),
                partition: p.partition,
                fetch_offset: p.fetch_offset,
                max_bytes: p.partition_max_bytes,
                current_leader_epoch: p.current_leader_epoch,
            })
        })
        .filter(|w| seen.insert((w.topic.clone(), w.partition)))
        .collect();
    let plan = if ctx.version >= 7 {
        let forgotten = req
            .forgotten_topics_data
            .into_iter()
            .flat_map(|t| {
                let topic = t.topic;
                t.partitions.into_iter().map(move |p| (topic.clone(), p))
            })
            .collect();
        ctx.fetch_sessions().plan(
            ctx.principal(),
            req.session_id,
            req.session_epoch,
            asked,
            forgotten,
        )
    } else {
        Plan::Sessionless(asked)
    };
    if let Plan::Refused(code) = plan {
        return (FetchResponse::default().with_error_code(code), Vec::new());
    }
    // A consumer over its consumer_byte_rate is answered at once with its throttle time and
    // no data, as Kafka does, and its connection is not read from until the time is over.
    // An incremental session goes on (its epoch has moved, as the client expects).
    let owed = ctx.throttle_owed(QuotaKey::ConsumerByteRate);
    if owed > 0 {
        let id = match plan {
            Plan::Incremental { id, .. } => id,
            _ => fetch_session::INVALID_SESSION_ID,
        };
        let resp = FetchResponse::default()
            .with_session_id(id)
            .with_throttle_time_ms(owed);
        return (resp, Vec::new());
    }
    let limits = ctx.listener();
    let wait = Duration::from_millis(req.max_wait_ms.max(0) as u64).min(limits.fetch_max_wait);
    // The broker's fetch.max.bytes caps what a request may ask; zero or less asks for
    // nothing beyond the first batch KIP-74 always allows.
    let max_bytes = (req.max_bytes.max(0) as usize).min(limits.fetch_max_bytes);
    let min_bytes = req.min_bytes.max(0) as usize;
    // v11+ may read from a follower, and names the consumer's rack (KIP-392)
    let rack = if ctx.version >= 11 {
        req.rack_id.as_str()
    } else {
        ""
    };
    let topics = targets(&ctx, plan.partitions(), rack);
    // (isolation_level exists from v4; 1 = read_committed)
    let committed = ctx.version >= 4 && req.isolation_level == 1;
    let read = Reading {
        max_bytes,
        committed,
        spans: limits.sendfile,
    };
    let Some((responses, spans)) = long_poll(topics, wait, min_bytes, read).await else {
        return (FetchResponse::default().with_error_code(-1), Vec::new());
    };
    let sessions = ctx.fetch_sessions();
    let resp = match plan {
        Plan::Sessionless(_) | Plan::Refused(_) => {
            FetchResponse::default().with_responses(responses)
        }
        Plan::Full(asked) => {
            let id = sessions.open(ctx.principal(), &asked, &responses);
            FetchResponse::default()
                .with_session_id(id)
                .with_responses(responses)
        }
        Plan::Incremental { id, .. } => FetchResponse::default()
            .with_session_id(id)
            .with_responses(sessions.changed(id, responses)),
    };
    (resp, spans)
}

/// How a fetch reads its partitions.
#[derive(Clone, Copy)]
struct Reading {
    /// The most record bytes in the response (KIP-74's first batch aside).
    max_bytes: usize,
    /// read_committed: only below the last stable offset.
    committed: bool,
    /// Records read on the blocking pool may be answered as spans of their segment files
    /// (a plaintext listener sends them with `sendfile`).
    spans: bool,
}

/// What one read of a fetch's partitions found: the response topics, the bytes read,
/// whether any partition answered with an error, and the spans the records' stand-ins
/// stand for.
type ReadAll = (Vec<FetchableTopicResponse>, usize, bool, Vec<Spanned>);

/// What to read for `wanted`, grouped by topic (consecutive partitions of one topic share
/// an entry, as a response lists them): the local replica, or the error to answer; and for
/// a consumer in `rack` (Fetch v11+), the follower to send it to instead, if any.
fn targets(ctx: &Request, wanted: &[Wanted], rack: &str) -> Arc<Vec<(TopicName, Vec<Target>)>> {
    let from_follower = ctx.version >= 11;
    let broker = ctx.broker();
    let mut topics: Vec<(TopicName, Vec<Target>)> = Vec::new();
    let mut access = None;
    for w in wanted {
        if topics.last().is_none_or(|(t, _)| *t != w.topic) {
            let name = w.topic.0.to_string();
            let may_read = ctx.may_topic(Operation::Read, &name);
            let remote = broker.cold().and_then(|cold| {
                let topic = broker.topic(&name)?;
                Some((cold.clone(), topic.spec.id))
            });
            access = Some((name, may_read, remote));
            topics.push((w.topic.clone(), Vec::new()));
        }
        let (name, may_read, remote) = access.as_ref().expect("set with the topic");
        let partition = if *may_read {
            lookup_partition(
                broker,
                name,
                w.partition,
                w.current_leader_epoch,
                from_follower,
            )
        } else {
            Err(codes::TOPIC_AUTHORIZATION_FAILED)
        };
        // (the selector and the rack are checked first: a leader-only cluster pays nothing)
        let preferred = match &partition {
            Ok(p) => broker
                .preferred_read_replica(name, w.partition, rack)
                .filter(|_| p.is_leader()),
            Err(_) => None,
        };
        topics.last_mut().expect("just pushed").1.push(Target {
            index: w.partition,
            offset: w.fetch_offset,
            max_bytes: w.max_bytes.max(0) as usize,
            partition,
            preferred,
            remote: remote.clone(),
        });
    }
    Arc::new(topics)
}

/// Reads `topics` until they hold `min_bytes`, one of them answers an error, or `wait` has
/// passed, waking whenever one of their high watermarks moves. `None` if a read failed.
async fn long_poll(
    topics: Arc<Vec<(TopicName, Vec<Target>)>>,
    wait: Duration,
    min_bytes: usize,
    read: Reading,
) -> Option<(Vec<FetchableTopicResponse>, Vec<Spanned>)> {
    let mut watchers: Vec<watch::Receiver<Progress>> = topics
        .iter()
        .flat_map(|(_, ts)| {
            ts.iter()
                .filter_map(|t| t.partition.as_ref().ok().map(|p| p.subscribe()))
        })
        .collect();
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        for w in &mut watchers {
            w.borrow_and_update();
        }
        let (responses, total, any_error, spans) = read_now(&topics, read).await?;
        if total >= min_bytes
            || any_error
            || tokio::time::Instant::now() >= deadline
            || watchers.is_empty()
        {
            return Some((responses, spans));
        }
        let changed = any_changed(&mut watchers);
        if tokio::time::timeout_at(deadline, changed).await.is_err() {
            // Deadline: answer with what there is (usually nothing) without another wait.
            return read_now(&topics, read)
                .await
                .map(|(responses, _, _, spans)| (responses, spans));
        }
    }
}

/// Resolves when any watched partition publishes new progress. `watchers` is not empty.
async fn any_changed(watchers: &mut [watch::Receiver<Progress>]) {
    let changes = watchers.iter_mut().map(|w| Box::pin(w.changed()));
    let _ = futures_util::future::select_all(changes).await;
}

/// Reads every target once: from the page cache on this thread when all of it is there,
/// else on a blocking thread (it may wait for the disk or the cold tier). `None` if that
/// thread failed.
async fn read_now(topics: &Arc<Vec<(TopicName, Vec<Target>)>>, read: Reading) -> Option<ReadAll> {
    if let Some(read) = read_all(topics, read, true) {
        return Some(read);
    }
    let topics = topics.clone();
    match tokio::task::spawn_blocking(move || read_all(&topics, read, false)).await {
        Ok(read) => read,
        Err(e) => {
            tracing::error!(error = %e, "fetch read task failed");
            None
        }
    }
}

/// Reads every target once: the response topics, the bytes read, and whether any partition
/// answered with an error (which ends a long poll at once, as in Kafka). With `cached`, only
/// from the page cache (so on a runtime thread): `None` as soon as a read would wait for the
/// disk or the cold tier. Without, always `Some`, and with `read.spans` large reads in the
/// page cache are answered as spans of their segment files.
fn read_all(topics: &[(TopicName, Vec<Target>)], read: Reading, cached: bool) -> Option<ReadAll> {
    let Reading {
        max_bytes,
        committed,
        ..
    } = read;
    let mut spans = Vec::new();
    let mut total = 0usize;
    let mut any_error = false;
    let mut would_block = false;
    let responses = topics
        .iter()
        .map(|(name, targets)| {
            let partitions = targets
                .iter()
                .map(|t| {
                    let data = PartitionData::default().with_partition_index(t.index);
                    if would_block {
                        // (answered again, whole, on a blocking thread)
                        return data;
                    }
                    let p = match &t.partition {
                        Ok(p) => p,
                        Err(code) => {
                            any_error = true;
                            return data.with_error_code(*code);
                        }
                    };
                    if let Some(id) = t.preferred {
                        // Sent to a follower in its rack: where the log stands, no records.
                        let progress = p.progress();
                        return data
                            .with_high_watermark(progress.high_watermark as i64)
                            .with_last_stable_offset(p.last_stable_offset() as i64)
                            .with_log_start_offset(log_start(&progress, t.remote.as_ref(), t.index))
                            .with_preferred_read_replica(kafka_protocol::messages::BrokerId(id))
                            .with_records(Some(Bytes::new()));
                    }
                    let budget = t.max_bytes.min(max_bytes.saturating_sub(total));
                    let first = total == 0;
                    let read = read_one(
                        p,
                        t.offset,
                        budget,
                        first,
                        t.remote.as_ref(),
                        committed,
                        match (cached, read.spans) {
                            (true, _) => Source::PageCache,
                            (false, true) => Source::Anywhere(Some(&mut spans)),
                            (false, false) => Source::Anywhere(None),
                        },
                    );
                    let Some(Read {
                        records,
                        progress,
                        error,
                        last_stable,
                        spanned,
                    }) = read
                    else {
                        would_block = true;
                        return data;
                    };
                    // Only the first non-empty partition may exceed the budget, by its
                    // first batch (KIP-74); any other keeps to it, even if that leaves it
                    // empty this time.
                    let records = if first {
                        records
                    } else {
                        within(records, budget)
                    };
                    total += records.len();
                    any_error |= error != codes::NONE;
                    // read_committed: the aborted transactions among the records answered,
                    // which the consumer drops (Kafka answers null for read_uncommitted)
                    let aborted = committed.then(|| {
                        // (a span's bytes are not read: its last offset came with it)
                        let end = spanned
                            .map(|last| last as i64)
                            .or_else(|| last_offset(&records));
                        aborted_among(p, t.offset, end, t.remote.as_ref())
                    });
                    data.with_error_code(error)
                        .with_high_watermark(progress.high_watermark as i64)
                        .with_last_stable_offset(last_stable as i64)
                        .with_aborted_transactions(aborted)
                        .with_log_start_offset(log_start(&progress, t.remote.as_ref(), t.index))
                        .with_records(Some(records))
                })
                .collect();
            FetchableTopicResponse::default()
                .with_topic(name.clone())
                .with_partitions(partitions)
        })
        .collect();
    (!would_block).then_some((responses, total, any_error, spans))
}

/// The offset of the last record in `records`, whole batches.
fn last_offset(records: &Bytes) -> Option<i64> {
    strata_core::batch::BatchIter::new(records)
        .map_while(|b| b.ok().map(|(h, _)| h.last_offset()))
        .last()
}

/// The aborted transactions that meet the records answered from `offset` up to `end` (the
/// last record's offset, `None` when there are none): from the local log's list, and for a
/// tiered topic from the cold tier's manifest too (records read from the cold tier, whose
/// local segments retention has deleted).
fn aborted_among(
    p: &Partition,
    offset: i64,
    end: Option<i64>,
    remote: Option<&(Arc<crate::broker::tier::ColdTier>, uuid::Uuid)>,
) -> Vec<AbortedTransaction> {
    let Some(end) = end else {
        return Vec::new();
    };
    let (from, to) = (offset.max(0) as u64, end as u64 + 1);
    let mut all = p.aborted_between(from, to);
    if let Some(m) = remote.and_then(|(cold, id)| cold.manifest(*id, p.index)) {
        all.extend(m.aborted_between(from, to));
        all.sort_by_key(|t| (t.first_offset, t.producer_id));
        all.dedup();
    }
    all.into_iter()
        .map(|t| {
            AbortedTransaction::default()
                .with_producer_id(kafka_protocol::messages::ProducerId(t.producer_id))
                .with_first_offset(t.first_offset as i64)
        })
        .collect()
}

/// The longest run of whole batches at the front of `records` that fits in `budget` bytes.
fn within(records: Bytes, budget: usize) -> Bytes {
    if records.len() <= budget {
        return records;
    }
    let end = strata_core::batch::BatchIter::new(&records)
        .map_while(|b| b.ok().map(|(_, range)| range.end))
        .take_while(|&end| end <= budget)
        .last()
        .unwrap_or(0);
    records.slice(..end)
}

/// The partition's first offset across both tiers.
fn log_start(
    progress: &Progress,
    remote: Option<&(Arc<crate::broker::tier::ColdTier>, uuid::Uuid)>,
    index: i32,
) -> i64 {
    let cold = remote.and_then(|(cold, id)| cold.earliest(*id, index));
    let start = cold.map_or(progress.log_start, |c| c.min(progress.log_start));
    start.max(progress.deleted_below) as i64
}

/// Where a partition's read may take its records from.
enum Source<'a> {
    /// The page cache only (on a runtime thread).
    PageCache,
    /// The page cache, the disk or the cold tier (on the blocking pool). With spans, a local
    /// read that is all in the page cache may be answered with a stand-in for its span of
    /// the segment file, pushed there and sent from the file when the response is written.
    Anywhere(Option<&'a mut Vec<Spanned>>),
}

/// What one partition's read found.
struct Read {
    records: Bytes,
    progress: Progress,
    error: i16,
    last_stable: u64,
    /// When `records` is a span's stand-in: the span's last offset.
    spanned: Option<u64>,
}

/// Reads one partition. `first` lets the first non-empty partition exceed the request's byte
/// budget by one batch, so a large batch never blocks a consumer (KIP-74); the caller cuts
/// any other partition's answer to its budget. `committed` (read_committed) reads only
/// below the last stable offset. `None` if `source` is the page cache and the read would
/// wait for the disk or the cold tier.
fn read_one(
    p: &Partition,
    offset: i64,
    budget: usize,
    first: bool,
    remote: Option<&(Arc<crate::broker::tier::ColdTier>, uuid::Uuid)>,
    committed: bool,
    source: Source<'_>,
) -> Option<Read> {
    let cached = matches!(source, Source::PageCache);
    let progress = p.progress();
    // (the local read below learns the last stable offset with its plan; these rarer
    // answers ask for it)
    let answer = |records: Bytes, error: i16| {
        Some(Read {
            records,
            progress,
            error,
            last_stable: p.last_stable_offset(),
            spanned: None,
        })
    };
    if offset < 0 {
        return answer(Bytes::new(), codes::OFFSET_OUT_OF_RANGE);
    }
    if (offset as u64) < progress.deleted_below {
        // Deleted (DeleteRecords), though the cold tier may still hold it.
        return answer(Bytes::new(), codes::OFFSET_OUT_OF_RANGE);
    }
    if (offset as u64) < progress.log_start {
        // Below the local log: the cold tier serves it if it holds it. This runs on the
        // blocking pool, so it may wait for the object store here.
        if let Some((cold, topic_id)) = remote {
            if cached {
                return None;
            }
            if crate::broker::tier::cold_tier_unknown(p) {
                // Whether the cold tier holds it is not known yet: neither served nor
                // out of range (a consumer would reset past the cold tier's history).
                return answer(Bytes::new(), codes::KAFKA_STORAGE_ERROR);
            }
            if budget == 0 && !first {
                return answer(Bytes::new(), codes::NONE);
            }
            let read = tokio::runtime::Handle::current().block_on(cold.read(
                *topic_id,
                p.index,
                offset as u64,
                budget.max(1),
            ));
            match read {
                Some(Ok(bytes)) if committed => {
                    return answer(below(bytes, p.last_stable_offset()), codes::NONE)
                }
                Some(Ok(bytes)) => return answer(bytes, codes::NONE),
                Some(Err(e)) => {
                    tracing::warn!(topic = %p.topic, partition = p.index, offset, error = %e, "cold tier read failed");
                    return answer(Bytes::new(), codes::KAFKA_STORAGE_ERROR);
                }
                None => {}
            }
        }
    }
    match p.plan_read(offset as u64, committed) {
        Ok((None, progress, last_stable)) => Some(Read {
            records: Bytes::new(),
            progress,
            error: codes::NONE,
            last_stable,
            spanned: None,
        }),
        Ok((Some(plan), progress, last_stable)) => {
            let answer = |records, error| {
                Some(Read {
                    records,
                    progress,
                    error,
                    last_stable,
                    spanned: None,
                })
            };
            if budget == 0 && !first {
                return answer(Bytes::new(), codes::NONE);
            }
            if let Source::Anywhere(Some(spans)) = source {
                match span_of(&plan, budget, first, spans) {
                    Ok(Some((records, last))) => {
                        return Some(Read {
                            records,
                            progress,
                            error: codes::NONE,
                            last_stable,
                            spanned: Some(last),
                        })
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::error!(topic = %p.topic, partition = p.index, error = %e, "segment read failed");
                        return answer(Bytes::new(), codes::KAFKA_STORAGE_ERROR);
                    }
                }
            }
            let read = match cached {
                true => plan.read_cached(budget).transpose()?,
                false => plan.read(budget),
            };
            match read {
                Ok(bytes) => answer(bytes, codes::NONE),
                Err(e) => {
                    tracing::error!(topic = %p.topic, partition = p.index, error = %e, "segment read failed");
                    answer(Bytes::new(), codes::KAFKA_STORAGE_ERROR)
                }
            }
        }
        Err(e) => {
            if matches!(e, crate::log::ReadError::Io(_)) {
                tracing::error!(topic = %p.topic, partition = p.index, error = %e, "planning a read failed");
            }
            answer(Bytes::new(), codes::read(&e))
        }
    }
}

/// `plan`'s read as a span of its segment file, when it is worth one (see
/// `ReadPlan::span`): a stand-in for the records (placed after the response's earlier
/// stand-ins) and the span's last offset. `Ok(None)`: read the records instead.
fn span_of(
    plan: &crate::log::ReadPlan,
    budget: usize,
    first: bool,
    spans: &mut Vec<Spanned>,
) -> std::io::Result<Option<(Bytes, u64)>> {
    let Some(span) = plan.span(budget)? else {
        return Ok(None);
    };
    if !first && span.len > budget {
        // (only a first batch larger than the budget: the caller answers none)
        return Ok(None);
    }
    let at = spans.iter().map(|s| s.bytes.len()).sum();
    let Some(bytes) = super::frame::stand_in(at, span.len) else {
        return Ok(None);
    };
    let last = span.last_offset;
    spans.push(Spanned {
        bytes: bytes.clone(),
        span,
    });
    Ok(Some((bytes, last)))
}

/// The whole batches at the front of `records` that end below `bound`.
fn below(records: Bytes, bound: u64) -> Bytes {
    let end = strata_core::batch::BatchIter::new(&records)
        .map_while(|b| b.ok())
        .take_while(|(h, _)| (h.last_offset() as u64) < bound)
        .last()
        .map_or(0, |(_, range)| range.end);
    records.slice(..end)
}

pub(super) async fn list_offsets(ctx: Request, req: ListOffsetsRequest) -> ListOffsetsResponse {
    let broker = ctx.broker().clone();
    // The leader epoch field exists from v4 on; older versions must leave it unset.
    let epoch = if ctx.version >= 4 { 0 } else { -1 };
    let mut topics = Vec::with_capacity(req.topics.len());
    for t in req.topics {
        let name = t.name.0.to_string();
        let may_describe = ctx.may_topic(Operation::Describe, &name);
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for p in t.partitions {
            let resp =
                ListOffsetsPartitionResponse::default().with_partition_index(p.partition_index);
            if !may_describe {
                partitions.push(resp.with_error_code(codes::TOPIC_AUTHORIZATION_FAILED));
                continue;
            }
            let part = match lookup_partition(
                &broker,
                &name,
                p.partition_index,
                p.current_leader_epoch,
                false,
            ) {
                Ok(part) => part,
                Err(code) => {
                    partitions.push(resp.with_error_code(code));
                    continue;
                }
            };
            // read_committed consumers' latest is the last stable offset
            if req.isolation_level == 1 && p.timestamp == -1 {
                let lso = part.last_stable_offset() as i64;
                partitions.push(
                    resp.with_timestamp(-1)
                        .with_offset(lso)
                        .with_leader_epoch(epoch),
                );
                continue;
            }
            partitions.push(match crate::broker::tier::list_offset(&broker, part, p.timestamp).await {
                Ok((ts, offset)) => resp.with_timestamp(ts).with_offset(offset).with_leader_epoch(epoch),
                // (Kafka's "not available yet"; clients retry it.)
                Err(crate::broker::tier::ListOffsetError::ColdTierUnknown) => {
                    resp.with_error_code(codes::OFFSET_NOT_AVAILABLE)
                }
                Err(e) => {
                    tracing::warn!(topic = %name, partition = p.partition_index, error = %e, "offset lookup failed");
                    resp.with_error_code(codes::KAFKA_STORAGE_ERROR)
                }
            });
        }
        topics.push(
            ListOffsetsTopicResponse::default()
                .with_name(t.name)
                .with_partitions(partitions),
        );
    }
    ListOffsetsResponse::default().with_topics(topics)
}

/// OffsetForLeaderEpoch: for each partition, the largest leader epoch not above the one asked
/// about and the offset where it ended in this log (the next epoch's start, or the log end
/// for the current epoch). Consumers (KIP-320) compare it with their position to detect a
/// truncation, so it is never cut to the high watermark: just after a failover the new
/// leader's high watermark may still lag records a consumer read from the old leader, and
/// an answer below its position would make it drop them as truncated (Kafka's
/// `Partition.lastOffsetForLeaderEpoch` answers from the log alone too).
pub(super) async fn offsets_for_leader_epoch(
    ctx: Request,
    req: OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    let broker = ctx.broker().clone();
    let topics = req
        .topics
        .into_iter()
        .map(|t| {
            let name = t.topic.0.to_string();
            let may_describe = ctx.may_topic(Operation::Describe, &name);
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| {
                    let resp = EpochEndOffset::default()
                        .with_partition(p.partition)
                        .with_leader_epoch(-1)
                        .with_end_offset(-1);
                    if !may_describe {
                        return resp.with_error_code(codes::TOPIC_AUTHORIZATION_FAILED);
                    }
                    let part = match lookup_partition(
                        &broker,
                        &name,
                        p.partition,
                        p.current_leader_epoch,
                        false,
                    ) {
                        Ok(part) => part,
                        Err(code) => return resp.with_error_code(code),
                    };
                    let found = part.lock().epoch_end_offset(p.leader_epoch);
                    match found {
                        Some((epoch, end)) => {
                            resp.with_leader_epoch(epoch).with_end_offset(end as i64)
                        }
                        None => resp,
                    }
                })
                .collect();
            OffsetForLeaderTopicResult::default()
                .with_topic(t.topic)
                .with_partitions(partitions)
        })
        .collect();
    OffsetForLeaderEpochResponse::default().with_topics(topics)
}
