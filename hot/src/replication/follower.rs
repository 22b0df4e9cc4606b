//! The follower side: one fetcher task per followed partition. It first truncates the local
//! log to where its leader-epoch history agrees with the leader's (OffsetForLeaderEpoch,
//! KIP-101/279), then pulls with long-poll fetches from its log end: append the batches as
//! they are, fsync them (when the topic acknowledges only fsynced writes), and fetch again
//! from the new durable end, which tells the leader what this replica holds. The fetches of
//! all partitions led by one broker share one connection and stream (`session`).
//!
//! The task ends when the partition stops following this leader at this epoch (the
//! reconciler turns `stop` true). Network errors back off and retry; a leader at another
//! epoch makes it start over with a new truncation.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strata_core::batch::BatchIter;
use strata_proto::v1::replica_client::ReplicaClient;
use strata_proto::v1::{OffsetForLeaderEpochRequest, ReplicaFetchRequest};
use tokio::sync::watch;
use tonic::transport::Channel;

use crate::broker::partition::{Following, ReplicaWriteError};
use crate::broker::Partition;
use crate::kafka::codes;
use crate::log::{AppendError, ValidBatch};
use crate::replication::epochs::truncation_round;
use crate::replication::session::{Session, Sessions};

/// How long the leader holds a fetch that finds nothing new.
const FETCH_WAIT: Duration = Duration::from_millis(500);
/// Bytes per fetch response.
const FETCH_MAX_BYTES: u32 = 8 << 20;
/// A call that takes longer than this (beyond the long poll) is abandoned and retried.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a fetcher waits for its own log to be fsynced before it reports its position.
const SYNC_TIMEOUT: Duration = Duration::from_secs(10);
const MIN_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// OffsetForLeaderEpoch rounds in one truncation before starting over after a backoff.
const MAX_TRUNCATION_ROUNDS: usize = 64;

/// What a fetcher needs to know about the partition it follows.
#[derive(Debug, Clone)]
pub struct Target {
    pub me: i32,
    pub topic: String,
    pub topic_id: String,
    pub leader: i32,
    pub leader_epoch: i32,
}

impl Target {
    fn following(&self) -> Following {
        Following {
            leader: self.leader,
            epoch: self.leader_epoch,
        }
    }
}

/// Where to reach a broker's gRPC listener (looked up again at every reconnect).
pub trait Directory: Send + Sync + 'static {
    fn grpc_address(&self, broker: i32) -> Option<String>;
    /// This broker's certificate toward leaders (mTLS); `None`: plaintext.
    fn tls(&self) -> Option<Arc<strata_proto::tls::GrpcTls>>;
    /// This broker's registration epoch, which leaders check (a restarted broker's old
    /// fetchers are refused, KIP-380).
    fn broker_epoch(&self) -> Option<u64>;
    fn now_ms(&self) -> i64;
    /// A write to this broker's data directory failed (see `ClusterLink::storage_error`).
    fn storage_error(&self, _error: &std::io::Error) {}
    /// This broker's fetch sessions, one per leader broker.
    fn sessions(&self) -> &Sessions;
}

/// Why a round of fetching stopped.
enum Restart {
    /// Transport trouble: back off, then fetch again from where the log ends.
    Backoff(String),
    /// The leader's epoch or log disagrees: truncate again first.
    Truncate(String),
    /// The leader has not caught up with the metadata yet (it does not hold the partition or
    /// know the epoch yet, as right after a topic is created or leadership moved): truncate
    /// again after a short wait, without an INFO line each time.
    NotReady(String),
}

/// How to go on after the leader refused a request with `code`.
fn refused(code: i32, why: String) -> Restart {
    let code = code as i16;
    if [
        codes::UNKNOWN_TOPIC_OR_PARTITION,
        codes::UNKNOWN_LEADER_EPOCH,
        codes::NOT_LEADER_OR_FOLLOWER,
        // the leader has not seen this broker's newest registration yet
        codes::STALE_BROKER_EPOCH,
    ]
    .contains(&code)
    {
        Restart::NotReady(why)
    } else {
        Restart::Truncate(why)
    }
}

/// Follows `target.leader` for `partition` until `stop` turns true.
pub async fn run(
    partition: Arc<Partition>,
    target: Target,
    directory: Arc<dyn Directory>,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff = MIN_BACKOFF;
    let mut truncated = false;
    let mut session: Option<Arc<Session>> = None;
    loop {
        if *stop.borrow() || !partition.follows(target.leader, target.leader_epoch) {
            return;
        }
        let c = match &session {
            Some(s) => s.clone(),
            None => match directory.grpc_address(target.leader) {
                Some(addr) => match directory.sessions().get(
                    target.leader,
                    &addr,
                    directory.tls().as_deref(),
                    2 * FETCH_MAX_BYTES as usize,
                ) {
                    Ok(s) => {
                        session = Some(s.clone());
                        s
                    }
                    Err(e) => {
                        tracing::error!(leader = target.leader, addr, error = %e, "cannot reach the leader");
                        sleep_or_stop(&mut stop, MAX_BACKOFF).await;
                        continue;
                    }
                },
                None => {
                    tracing::warn!(topic = %target.topic, partition = partition.index, leader = target.leader, "leader has no gRPC endpoint in the metadata yet; waiting");
                    sleep_or_stop(&mut stop, MAX_BACKOFF).await;
                    continue;
                }
            },
        };
        let round = async {
            if !truncated {
                if let Err(restart) = truncate(&partition, &target, c.client(), &*directory).await {
                    return restart;
                }
                truncated = true;
            }
            fetch_loop(&partition, &target, &c, &*directory, &mut backoff).await
        };
        let outcome = tokio::select! {
            r = round => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        match outcome {
            Restart::Backoff(why) => {
                tracing::debug!(topic = %target.topic, partition = partition.index, leader = target.leader, why, "replica fetch failed; retrying");
                session = None;
            }
            Restart::Truncate(why) => {
                tracing::info!(topic = %target.topic, partition = partition.index, leader = target.leader, why, "starting over with a new truncation");
                truncated = false;
            }
            Restart::NotReady(why) => {
                tracing::debug!(topic = %target.topic, partition = partition.index, leader = target.leader, why, "leader not ready yet; starting over");
                truncated = false;
            }
        }
        sleep_or_stop(&mut stop, backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

async fn sleep_or_stop(stop: &mut watch::Receiver<bool>, d: Duration) {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = stop.wait_for(|s| *s) => {}
    }
}

/// Asks the leader where this replica's latest epoch ends there and cuts the local log to
/// what both agree on, round after round until the leader answers the epoch asked (KIP-279:
/// a replica whose history holds an epoch the leader never had must look further back).
async fn truncate(
    partition: &Partition,
    target: &Target,
    mut client: ReplicaClient<Channel>,
    directory: &dyn Directory,
) -> Result<(), Restart> {
    // Each round drops this replica's latest epoch, so the rounds are bounded by its history;
    // the cap only guards against a leader whose answers make no sense.
    for _ in 0..MAX_TRUNCATION_ROUNDS {
        let latest = partition.lock().epochs().latest();
        let Some(latest) = latest else {
            // An empty history: nothing this replica holds can disagree.
            return Ok(());
        };
        let answer = tokio::time::timeout(
            CALL_TIMEOUT,
            client.offset_for_leader_epoch(OffsetForLeaderEpochRequest {
                replica_id: target.me,
                topic: target.topic.clone(),
                topic_id: target.topic_id.clone(),
                partition: partition.index as u32,
                current_leader_epoch: target.leader_epoch,
                leader_epoch: latest.epoch,
                broker_epoch: directory.broker_epoch().unwrap_or(0),
            }),
        )
        .await
        .map_err(|_| Restart::Backoff("OffsetForLeaderEpoch timed out".into()))?
        .map_err(|e| Restart::Backoff(format!("OffsetForLeaderEpoch failed: {}", e.message())))?
        .into_inner();
        if let Some(e) = answer.error {
            return Err(refused(
                e.code,
                format!(
                    "leader refused OffsetForLeaderEpoch: {} ({})",
                    e.message, e.code
                ),
            ));
        }
        let leader_answer = answer.leader_epoch.map(|e| (e, answer.end_offset));
        let (round, end) = {
            let log = partition.lock();
            let hw = partition.progress().high_watermark;
            let end = log.end_offset();
            (truncation_round(log.epochs(), end, hw, leader_answer), end)
        };
        if round.truncate_to < end || round.again {
            tracing::info!(topic = %target.topic, partition = partition.index, leader = target.leader, epoch = target.leader_epoch, asked = latest.epoch, answer = ?leader_answer, from = end, to = round.truncate_to, "truncating to where the leader's log agrees");
            partition
                .truncate_to(target.following(), round.truncate_to, directory.now_ms())
                .map_err(|e| Restart::Backoff(format!("truncation failed: {e}")))?;
        }
        if !round.again {
            return Ok(());
        }
    }
    Err(Restart::Truncate(format!(
        "no agreement with the leader after {MAX_TRUNCATION_ROUNDS} OffsetForLeaderEpoch rounds"
    )))
}

async fn fetch_loop(
    partition: &Partition,
    target: &Target,
    session: &Session,
    directory: &dyn Directory,
    backoff: &mut Duration,
) -> Restart {
    // when the last response with records came (for the turnaround histogram)
    let mut received: Option<std::time::Instant> = None;
    loop {
        // The fetch offset tells the leader what this replica holds durably: what an earlier
        // role or fetcher appended must be fsynced first.
        if partition.lock().config().acks_wait_for_fsync() {
            match tokio::time::timeout(SYNC_TIMEOUT, partition.wait_synced()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Restart::Backoff("local storage failed".into()),
                Err(_) => {
                    let p = partition.progress();
                    tracing::warn!(topic = %target.topic, partition = partition.index, log_end = p.log_end, durable_end = p.durable_end, "the local fsync did not complete in time; fetching again after a backoff");
                    return Restart::Backoff("local fsync timed out".into());
                }
            }
        }
        let offset = partition.progress().log_end;
        if let Some(at) = received.take() {
            crate::metrics::STAGES
                .follower_turnaround
                .observe(at.elapsed());
        }
        let request = ReplicaFetchRequest {
            replica_id: target.me,
            topic: target.topic.clone(),
            topic_id: target.topic_id.clone(),
            partition: partition.index as u32,
            leader_epoch: target.leader_epoch,
            fetch_offset: offset,
            max_bytes: FETCH_MAX_BYTES,
            max_wait_ms: FETCH_WAIT.as_millis() as u32,
            broker_epoch: directory.broker_epoch().unwrap_or(0),
            deleted_below: partition.progress().deleted_below,
            high_watermark: Some(partition.progress().high_watermark),
            tag: 0,
        };
        let resp =
            match tokio::time::timeout(FETCH_WAIT + CALL_TIMEOUT, session.fetch(request)).await {
                Ok(Ok(r)) => r,
                Ok(Err(why)) => return Restart::Backoff(why),
                Err(_) => return Restart::Backoff("fetch timed out".into()),
            };
        if let Some(e) = resp.error {
            let code = e.code as i16;
            if code == codes::OFFSET_OUT_OF_RANGE && offset < resp.log_start_offset {
                // The leader's retention removed what comes next here: start over at its start.
                if let Err(err) = partition.reset_to(
                    target.following(),
                    resp.log_start_offset,
                    directory.now_ms(),
                ) {
                    return Restart::Backoff(format!("could not reset the log: {err}"));
                }
                continue;
            }
            if code == codes::OFFSET_OUT_OF_RANGE && offset > resp.log_end_offset {
                // This replica holds more than the leader: cut to the leader's end, then
                // check the epochs again below it.
                if let Err(err) = partition.truncate_to(
                    target.following(),
                    resp.log_end_offset,
                    directory.now_ms(),
                ) {
                    return Restart::Backoff(format!("could not truncate the log: {err}"));
                }
                return Restart::Truncate(format!(
                    "fetch offset {offset} is past the leader's log end {}",
                    resp.log_end_offset
                ));
            }
            return refused(e.code, format!("leader answered {} ({code})", e.message));
        }
        *backoff = MIN_BACKOFF;
        if resp.log_start_offset > partition.progress().log_start {
            // The leader deleted its oldest segments (retention, or a superseded prefix of
            // an offsets partition): so do we, whole segments below its start only.
            if let Err(err) = partition.trim_before(resp.log_start_offset) {
                tracing::warn!(topic = %target.topic, partition = partition.index, error = %err, "could not delete segments below the leader's log start");
            }
        }
        if !resp.records.is_empty() {
            received = Some(std::time::Instant::now());
            // (The next round fsyncs what this appended before fetching on.)
            if let Err(why) = append(partition, target.following(), resp.records, directory) {
                return Restart::Truncate(why);
            }
        }
        if resp.deleted_below > partition.progress().deleted_below {
            // The leader answered a DeleteRecords: the records below its point go here too
            // (up to this log's end; a point past it is reached as the records arrive).
            if let Err(err) = partition.follow_deleted_below(resp.deleted_below) {
                tracing::warn!(topic = %target.topic, partition = partition.index, error = %err, "could not delete the records below the leader's DeleteRecords point");
            }
        }
        if !partition.set_follower_hw(target.following(), resp.high_watermark) {
            return Restart::Backoff("no longer following this leader".into());
        }
    }
}

/// Checks and appends the fetched batches; returns the new log end.
fn append(
    partition: &Partition,
    at: Following,
    records: Bytes,
    directory: &dyn Directory,
) -> Result<u64, String> {
    let mut batches = Vec::new();
    for item in BatchIter::new(&records) {
        let (_, range) = item.map_err(|e| format!("leader sent a bad batch: {e}"))?;
        let batch = ValidBatch::replicated(records.slice(range))
            .map_err(|e| format!("leader sent a bad batch: {e}"))?;
        batches.push(batch);
    }
    partition
        .append_replicated(at, &batches, directory.now_ms())
        .map_err(|e| {
            if let ReplicaWriteError::Io(io) | ReplicaWriteError::Append(AppendError::Io(io)) = &e {
                directory.storage_error(io);
            }
            format!("could not append replicated batches: {e}")
        })
}
