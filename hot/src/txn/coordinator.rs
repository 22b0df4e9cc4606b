//! The transaction coordinator of one `__transaction_state` partition: the metadata of the
//! transactional ids that hash to it, rebuilt by replay when this broker becomes the
//! partition's leader, and every change written there (acks=all) before it takes effect.
//!
//! Requests of one partition are serialised by one lock held across the write. Ending a
//! transaction writes its Prepare record, answers, then has every partition's leader append
//! the marker ([`MarkerSink`]), retrying until all have it, and writes the Complete record.
//! A coordinator that loads a Prepare record (its predecessor died mid-way) finishes the
//! markers itself. Open transactions past their timeout are aborted at a bumped epoch.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::broker::Clock;
use crate::group::coordinator::{OffsetsLog, NOT_COORDINATOR};
use crate::internal::COORDINATOR_NOT_AVAILABLE;

use super::state::{self, codes, End, Init, TxnMeta};

/// Writes a transaction's markers to the leaders of its partitions.
#[tonic::async_trait]
pub trait MarkerSink: Send + Sync + 'static {
    /// Returns the partitions that do not have the marker yet (to retry).
    async fn write(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
        partitions: Vec<(String, i32)>,
    ) -> Vec<(String, i32)>;
}

/// Where new producer ids come from (the controllers' blocks).
#[tonic::async_trait]
pub trait ProducerIdSource: Send + Sync + 'static {
    async fn allocate(&self) -> Result<i64, String>;
}

/// Longest wait between two rounds of markers for partitions that did not take them.
const MAX_MARKER_BACKOFF: Duration = Duration::from_secs(2);

pub struct TxnCoordinator {
    /// The leader epoch of the state partition when this coordinator loaded it: markers
    /// carry it as the coordinator epoch.
    epoch: i32,
    log: Arc<dyn OffsetsLog>,
    clock: Arc<dyn Clock>,
    markers: Arc<dyn MarkerSink>,
    ids: Arc<dyn ProducerIdSource>,
    txns: tokio::sync::Mutex<HashMap<String, TxnMeta>>,
    closed: AtomicBool,
    /// The longest transaction timeout a producer may ask for.
    max_timeout_ms: i32,
    /// Idle transactional ids are forgotten after this long.
    id_expiration_ms: i64,
}

impl TxnCoordinator {
    /// A coordinator over the replayed metadata; finishes the transactions it finds
    /// half-ended.
    pub fn load(
        epoch: i32,
        log: Arc<dyn OffsetsLog>,
        clock: Arc<dyn Clock>,
        markers: Arc<dyn MarkerSink>,
        ids: Arc<dyn ProducerIdSource>,
        replayed: HashMap<String, TxnMeta>,
        config: &super::TxnConfig,
    ) -> Arc<Self> {
        let preparing: Vec<(String, TxnMeta)> = replayed
            .iter()
            .filter(|(_, m)| m.status.preparing().is_some())
            .map(|(id, m)| (id.clone(), m.clone()))
            .collect();
        let c = Arc::new(TxnCoordinator {
            epoch,
            log,
            clock,
            markers,
            ids,
            txns: tokio::sync::Mutex::new(replayed),
            closed: AtomicBool::new(false),
            max_timeout_ms: config.max_timeout_ms,
            id_expiration_ms: config.id_expiration.as_millis().min(i64::MAX as u128) as i64,
        });
        for (id, m) in preparing {
            c.spawn_completion(id, m);
        }
        c
    }

    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    fn closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    async fn write(&self, id: &str, m: &TxnMeta) -> Result<(), i16> {
        if self.closed() {
            return Err(NOT_COORDINATOR);
        }
        let record = (state::encode_key(id), Some(state::encode_value(m)));
        self.log.append(vec![record]).await.map_err(|e| {
            tracing::warn!(transactional_id = id, error = %e, "could not write transaction state");
            // the client finds the coordinator again and retries
            NOT_COORDINATOR
        })
    }

    /// InitProducerId with a transactional id: the producer id and epoch to use.
    pub async fn init_producer_id(
        self: &Arc<Self>,
        id: &str,
        timeout_ms: i32,
        hint: Option<(i64, i16)>,
    ) -> Result<(i64, i16), i16> {
        if timeout_ms <= 0 || timeout_ms > self.max_timeout_ms {
            return Err(codes::INVALID_TRANSACTION_TIMEOUT);
        }
        let now = self.clock.now_ms();
        let mut txns = self.txns.lock().await;
        let next = match state::init(txns.get(id), timeout_ms, hint, now) {
            Init::Error(code) => return Err(code),
            Init::Write(m) => m,
            Init::NewProducerId => {
                let pid = self.ids.allocate().await.map_err(|e| {
                    tracing::error!(error = %e, "cannot reserve producer ids");
                    COORDINATOR_NOT_AVAILABLE
                })?;
                state::fresh(pid, timeout_ms, now)
            }
            Init::AbortFirst(m) => {
                self.write(id, &m).await?;
                txns.insert(id.to_string(), m.clone());
                drop(txns);
                tracing::info!(
                    transactional_id = id,
                    producer_id = m.producer_id,
                    epoch = m.epoch,
                    "aborting the open transaction of a restarted producer"
                );
                self.spawn_completion(id.to_string(), m);
                return Err(codes::CONCURRENT_TRANSACTIONS);
            }
        };
        self.write(id, &next).await?;
        let answer = (next.producer_id, next.epoch);
        txns.insert(id.to_string(), next);
        Ok(answer)
    }

    /// AddPartitionsToTxn / AddOffsetsToTxn.
    pub async fn add_partitions(
        &self,
        id: &str,
        producer_id: i64,
        epoch: i16,
        partitions: &[(String, i32)],
    ) -> Result<(), i16> {
        let now = self.clock.now_ms();
        let mut txns = self.txns.lock().await;
        if let Some(next) =
            state::add_partitions(txns.get(id), producer_id, epoch, partitions, now)?
        {
            self.write(id, &next).await?;
            txns.insert(id.to_string(), next);
        }
        Ok(())
    }

    /// KIP-890 verification for partition leaders: per partition, whether it is in the
    /// open transaction of `producer_id` at `epoch` ([`state::verify`]).
    pub async fn verify(
        &self,
        id: &str,
        producer_id: i64,
        epoch: i16,
        partitions: &[(String, i32)],
    ) -> Vec<Result<(), i16>> {
        if self.closed() {
            return vec![Err(NOT_COORDINATOR); partitions.len()];
        }
        let txns = self.txns.lock().await;
        partitions
            .iter()
            .map(|p| state::verify(txns.get(id), producer_id, epoch, p))
            .collect()
    }

    /// EndTxn: answered once the decision is written; the markers follow.
    pub async fn end_txn(
        self: &Arc<Self>,
        id: &str,
        producer_id: i64,
        epoch: i16,
        commit: bool,
    ) -> Result<(), i16> {
        let now = self.clock.now_ms();
        let mut txns = self.txns.lock().await;
        match state::end(txns.get(id), producer_id, epoch, commit, now) {
            End::Error(code) => Err(code),
            End::Done => Ok(()),
            End::Prepare(m) => {
                self.write(id, &m).await?;
                txns.insert(id.to_string(), m.clone());
                drop(txns);
                self.spawn_completion(id.to_string(), m);
                Ok(())
            }
        }
    }

    /// The metadata of transactional id `id`, if this coordinator knows it.
    pub async fn get(&self, id: &str) -> Option<TxnMeta> {
        self.txns.lock().await.get(id).cloned()
    }

    /// The metadata of every transactional id here (DescribeTransactions, ListTransactions).
    pub async fn describe(&self) -> Vec<(String, TxnMeta)> {
        let txns = self.txns.lock().await;
        let mut out: Vec<_> = txns.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Writes the markers of `m` (a Prepare record) until every partition has them, then
    /// the Complete record, unless the coordinator closed or the id moved on meanwhile.
    fn spawn_completion(self: &Arc<Self>, id: String, m: TxnMeta) {
        let me = self.clone();
        tokio::spawn(async move {
            let Some(commit) = m.status.preparing() else {
                return;
            };
            let mut left: Vec<(String, i32)> = m.partitions.iter().cloned().collect();
            let mut backoff = Duration::from_millis(50);
            while !left.is_empty() {
                if me.closed() {
                    return;
                }
                left = me
                    .markers
                    .write(m.producer_id, m.epoch, commit, me.epoch, left)
                    .await;
                if !left.is_empty() {
                    tracing::debug!(transactional_id = %id, waiting = left.len(), "transaction markers not all written; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_MARKER_BACKOFF);
                }
            }
            let mut txns = me.txns.lock().await;
            if txns.get(&id) != Some(&m) {
                return;
            }
            let done = state::complete(&m, me.clock.now_ms());
            if me.write(&id, &done).await.is_ok() {
                txns.insert(id, done);
            }
        });
    }

    /// Aborts the open transactions past their timeout.
    pub async fn abort_expired(self: &Arc<Self>) {
        let now = self.clock.now_ms();
        let mut txns = self.txns.lock().await;
        let expired: Vec<(String, TxnMeta)> = txns
            .iter()
            .filter_map(|(id, m)| state::expire(m, now).map(|a| (id.clone(), a)))
            .collect();
        for (id, m) in expired {
            if self.write(&id, &m).await.is_err() {
                return;
            }
            tracing::info!(transactional_id = %id, producer_id = m.producer_id, timeout_ms = m.timeout_ms, "aborting a transaction past its timeout");
            txns.insert(id.clone(), m.clone());
            self.spawn_completion(id, m);
        }
    }

    /// Forgets the transactional ids idle past their expiration: a tombstone first, so a
    /// coordinator replaying the partition forgets them too. A producer that comes back
    /// later starts over with a new producer id.
    pub async fn forget_idle(&self) {
        let now = self.clock.now_ms();
        let mut txns = self.txns.lock().await;
        let idle: Vec<String> = txns
            .iter()
            .filter(|(_, m)| state::forgettable(m, now, self.id_expiration_ms))
            .map(|(id, _)| id.clone())
            .collect();
        if idle.is_empty() || self.closed() {
            return;
        }
        let tombstones = idle
            .iter()
            .map(|id| (state::encode_key(id), None))
            .collect();
        if let Err(e) = self.log.append(tombstones).await {
            tracing::warn!(error = %e, "could not write tombstones of idle transactional ids; will try again");
            return;
        }
        for id in &idle {
            txns.remove(id);
        }
        tracing::info!(
            forgotten = idle.len(),
            expiration_ms = self.id_expiration_ms,
            "forgot idle transactional ids"
        );
    }

    /// Checks for expired transactions and idle ids every `tick` until closed.
    pub fn spawn_timer(self: &Arc<Self>, tick: Duration) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(tick).await;
                match weak.upgrade() {
                    Some(c) if !c.closed() => {
                        c.abort_expired().await;
                        c.forget_idle().await;
                    }
                    _ => return,
                }
            }
        });
    }
}
