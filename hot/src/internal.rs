//! What the coordinators of internal topics (`__consumer_offsets` for groups,
//! `__transaction_state` for transactions) share: which of the topic's partitions this
//! broker leads, each with the coordinator loaded for it ([`Leaderships`]); finding a key's
//! coordinator; creating the topic on first use; reading a partition back; and writing
//! to it as its leader ([`PartitionOffsets`]).
//!
//! A coordinator is bound to one leadership (topic id, leader epoch, partition object): it
//! is closed as soon as that leadership ends, and its writes are refused after.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use strata_core::batch::build::{self, ProducerIds, Rec};
use strata_core::batch::{BatchHeader, BatchIter};
use uuid::Uuid;

use crate::broker::partition::LeaderAppendError;
use crate::broker::{Broker, Clock, Partition};
use crate::group::coordinator::{OffsetsLog, NOT_COORDINATOR};
use crate::group::records::partition_for_group;

/// Kafka's COORDINATOR_LOAD_IN_PROGRESS.
pub const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
/// Kafka's COORDINATOR_NOT_AVAILABLE.
pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
/// The longest a FindCoordinator waits for the topic to be created or a new coordinator to
/// load. A Kafka connection answers in request order, so a slow FindCoordinator would hold
/// up the fetches behind it; clients retry COORDINATOR_NOT_AVAILABLE.
const FIND_WAIT: Duration = Duration::from_millis(500);

/// A coordinator of one led partition.
pub trait Closable: Send + Sync + 'static {
    /// The leadership it was loaded for has ended.
    fn close(&self);
}

/// A partition this broker started leading: replay it, then [`Leaderships::install`].
pub struct Gained {
    pub index: u32,
    pub topic_id: Uuid,
    pub epoch: i32,
    pub partition: Arc<Partition>,
}

struct Slot<C> {
    topic_id: Uuid,
    epoch: i32,
    partition: Arc<Partition>,
    /// `None` while the partition is being replayed.
    coordinator: Option<Arc<C>>,
}

impl<C> Slot<C> {
    fn of(&self, g: &Gained) -> bool {
        self.topic_id == g.topic_id
            && self.epoch == g.epoch
            && Arc::ptr_eq(&self.partition, &g.partition)
    }
}

/// What runs for one partition here.
pub enum At<C> {
    Loaded(Arc<C>),
    Loading,
    NotLed,
}

/// The led partitions of internal topic `topic`, each with its coordinator once loaded.
pub struct Leaderships<C> {
    topic: &'static str,
    slots: Mutex<HashMap<u32, Slot<C>>>,
    /// Bumped each time a coordinator finished loading.
    loaded: tokio::sync::watch::Sender<u64>,
    /// Set while the topic is being created (in the background).
    creating: AtomicBool,
}

impl<C: Closable> Leaderships<C> {
    pub fn new(topic: &'static str) -> Self {
        Leaderships {
            topic,
            slots: Mutex::new(HashMap::new()),
            loaded: tokio::sync::watch::channel(0).0,
            creating: AtomicBool::new(false),
        }
    }

    pub fn topic(&self) -> &'static str {
        self.topic
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Slot<C>>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Compares with the partitions of the topic `broker` leads now: closes the
    /// coordinators of the leaderships that ended (returning their partitions) and returns
    /// the ones gained, to load.
    pub fn refresh(&self, broker: &Broker) -> (Vec<u32>, Vec<Gained>) {
        let mut led = HashMap::new();
        if let Some(topic) = broker.topic(self.topic) {
            for p in topic.local() {
                if let Some(epoch) = p.progress().leader_epoch {
                    led.insert(
                        p.index as u32,
                        Gained {
                            index: p.index as u32,
                            topic_id: topic.spec.id,
                            epoch,
                            partition: p.clone(),
                        },
                    );
                }
            }
        }
        let mut slots = self.slots();
        let mut lost = Vec::new();
        slots.retain(|index, slot| {
            let keep = led.get(index).is_some_and(|g| slot.of(g));
            if !keep {
                if let Some(c) = &slot.coordinator {
                    c.close();
                }
                lost.push(*index);
            }
            keep
        });
        let gained: Vec<Gained> = led
            .into_values()
            .filter(|g| !slots.contains_key(&g.index))
            .collect();
        for g in &gained {
            slots.insert(
                g.index,
                Slot {
                    topic_id: g.topic_id,
                    epoch: g.epoch,
                    partition: g.partition.clone(),
                    coordinator: None,
                },
            );
        }
        (lost, gained)
    }

    /// Whether `g` is still led here (a load in progress goes on).
    pub fn still_led(&self, g: &Gained) -> bool {
        self.slots().get(&g.index).is_some_and(|s| s.of(g))
    }

    /// Installs the coordinator loaded for `g`; false (and `c` is closed) when the
    /// leadership moved on while it loaded.
    pub fn install(&self, g: &Gained, c: Arc<C>) -> bool {
        let mut slots = self.slots();
        match slots.get_mut(&g.index) {
            Some(slot) if slot.of(g) => {
                slot.coordinator = Some(c);
                drop(slots);
                self.loaded.send_modify(|v| *v += 1);
                true
            }
            _ => {
                c.close();
                false
            }
        }
    }

    /// Gives up loading `g`: the next refresh tries again.
    pub fn forget(&self, g: &Gained) {
        let mut slots = self.slots();
        if slots.get(&g.index).is_some_and(|s| s.of(g)) {
            slots.remove(&g.index);
        }
    }

    /// The coordinator of the partition `key` hashes to, if this broker is it; otherwise
    /// Kafka's error: NOT_COORDINATOR, or COORDINATOR_LOAD_IN_PROGRESS while the
    /// partition is replayed (or elected here and not applied yet).
    pub fn coordinator(&self, broker: &Broker, key: &str) -> Result<Arc<C>, i16> {
        let topic = broker.topic(self.topic).ok_or(NOT_COORDINATOR)?;
        let index = partition_for_group(key, topic.spec.partitions);
        match self.slots().get(&index) {
            Some(Slot {
                coordinator: Some(c),
                ..
            }) => Ok(c.clone()),
            Some(_) => Err(COORDINATOR_LOAD_IN_PROGRESS),
            // Elected here but the role is not applied yet: the same broker will answer soon.
            None if topic.layout.get(index as usize).and_then(|l| l.leader)
                == Some(broker.config().node_id) =>
            {
                Err(COORDINATOR_LOAD_IN_PROGRESS)
            }
            None => Err(NOT_COORDINATOR),
        }
    }

    /// The coordinator of partition `index`, if led here.
    pub fn at(&self, index: u32) -> At<C> {
        match self.slots().get(&index) {
            Some(Slot {
                coordinator: Some(c),
                ..
            }) => At::Loaded(c.clone()),
            Some(_) => At::Loading,
            None => At::NotLed,
        }
    }

    /// Every coordinator running here.
    pub fn all(&self) -> Vec<Arc<C>> {
        self.slots()
            .values()
            .filter_map(|s| s.coordinator.clone())
            .collect()
    }

    /// FindCoordinator: the broker that coordinates `key`, having `create` create the
    /// topic first (in the background, once at a time) if it does not exist. Answers
    /// within `FIND_WAIT`, even when the controllers are unreachable; Err:
    /// COORDINATOR_NOT_AVAILABLE (retriable).
    pub async fn find<F>(
        self: &Arc<Self>,
        broker: &Arc<Broker>,
        key: &str,
        create: F,
    ) -> Result<i32, i16>
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        if broker.topic(self.topic).is_none() {
            if self.creating.swap(true, Ordering::AcqRel) {
                // Another request is creating it: the client retries.
                return Err(COORDINATOR_NOT_AVAILABLE);
            }
            let me = self.clone();
            tokio::spawn(async move {
                create.await;
                me.creating.store(false, Ordering::Release);
            });
        }
        // A new topic's leaders are elected (and loaded) in a moment: wait briefly rather
        // than send the client into its retry backoff.
        let deadline = tokio::time::Instant::now() + FIND_WAIT;
        let mut changes = broker.watch_layout();
        let mut loaded = self.loaded.subscribe();
        loop {
            if let Some(topic) = broker.topic(self.topic) {
                let index = partition_for_group(key, topic.spec.partitions);
                let leader = topic.layout.get(index as usize).and_then(|l| l.leader);
                // When this broker coordinates, it answers once the partition is loaded,
                // so the client's next request does not meet COORDINATOR_LOAD_IN_PROGRESS.
                let ready = leader != Some(broker.config().node_id)
                    || self.coordinator(broker, key).is_ok();
                if let (Some(leader), true) = (leader, ready) {
                    return Ok(leader);
                }
            }
            let changed = async {
                tokio::select! {
                    _ = changes.changed() => {}
                    _ = loaded.changed() => {}
                }
            };
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Err(COORDINATOR_NOT_AVAILABLE);
            }
        }
    }
}

/// Calls `refresh` on `manager` now and after every change of the broker's partition
/// layout, until either is gone.
pub fn follow_layout<M: Send + Sync + 'static>(
    broker: &Arc<Broker>,
    manager: &Arc<M>,
    refresh: fn(&Arc<M>),
) {
    let weak: Weak<M> = Arc::downgrade(manager);
    let mut changes = broker.watch_layout();
    tokio::spawn(async move {
        loop {
            match weak.upgrade() {
                Some(m) => refresh(&m),
                None => return,
            }
            if changes.changed().await.is_err() {
                return;
            }
        }
    });
}

/// An internal topic's replication factor: `wanted`, capped by the brokers registered.
pub fn replication_factor(broker: &Broker, wanted: u16) -> u16 {
    let registered = broker
        .cluster()
        .map_or(1, |link| link.metadata().borrow().brokers.len());
    wanted
        .min(u16::try_from(registered).unwrap_or(u16::MAX))
        .max(1)
}

/// What [`read_records`] finds in an internal topic's partition.
pub enum Item<'a> {
    /// A keyed record and the header of its batch.
    Record {
        header: &'a BatchHeader,
        offset: i64,
        key: Bytes,
        value: Option<Bytes>,
    },
    /// A transaction marker of `producer_id`.
    Marker { producer_id: i64, commit: bool },
}

/// Reads an internal topic's partition from its start to its end (as led now), calling `f`
/// with each keyed record and each transaction marker in order. Returns how many records
/// it read.
pub async fn read_records(
    partition: &Arc<Partition>,
    mut f: impl FnMut(Item<'_>),
) -> Result<u64, String> {
    let progress = partition.progress();
    let (mut offset, end) = (progress.log_start, progress.log_end);
    let mut records = 0u64;
    while offset < end {
        let plan = partition
            .lock()
            .plan_read(offset, end)
            .map_err(|e| e.to_string())?;
        let Some(plan) = plan else { break };
        let bytes = tokio::task::spawn_blocking(move || plan.read(4 << 20))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        if bytes.is_empty() {
            break;
        }
        for item in BatchIter::new(&bytes) {
            let (header, range) = item.map_err(|e| format!("at offset {offset}: {e}"))?;
            offset = header.last_offset() as u64 + 1;
            if header.is_control() {
                if let Some(m) = strata_core::batch::marker::parse(&bytes[range]) {
                    f(Item::Marker {
                        producer_id: header.producer_id,
                        commit: m.commit,
                    });
                }
                continue;
            }
            let Some(batch) = strata_core::batch::records(&bytes[range]) else {
                tracing::error!(
                    topic = %partition.topic,
                    base_offset = header.base_offset,
                    "unreadable batch in an internal topic; skipped"
                );
                continue;
            };
            for r in batch {
                records += 1;
                let Some(key) = r.key else { continue };
                f(Item::Record {
                    header: &header,
                    offset: r.offset,
                    key: Bytes::copy_from_slice(key),
                    value: r.value.map(Bytes::copy_from_slice),
                });
            }
        }
    }
    Ok(records)
}

/// A coordinator's writes: one batch per call, appended as leader at the epoch the
/// coordinator was loaded in, answered once committed (acks=all).
pub struct PartitionOffsets {
    partition: Arc<Partition>,
    epoch: i32,
    clock: Arc<dyn Clock>,
    timeout: Duration,
}

impl PartitionOffsets {
    /// Writes to `partition` while it is led at `epoch`, each write waiting up to
    /// `timeout` to be committed.
    pub fn new(
        partition: Arc<Partition>,
        epoch: i32,
        clock: Arc<dyn Clock>,
        timeout: Duration,
    ) -> Self {
        PartitionOffsets {
            partition,
            epoch,
            clock,
            timeout,
        }
    }
}

impl PartitionOffsets {
    /// Appends `records` as one batch (of `producer`, transactional, if given) and waits
    /// until it is committed; returns its base offset.
    async fn write(
        &self,
        records: Vec<(Bytes, Option<Bytes>)>,
        producer: Option<(i64, i16)>,
    ) -> Result<u64, String> {
        let now = self.clock.now_ms();
        let recs: Vec<Rec<'_>> = records
            .iter()
            .map(|(k, v)| Rec {
                key: Some(k),
                value: v.as_deref(),
                timestamp_delta: 0,
            })
            .collect();
        let bytes = match producer {
            None => build::batch(now, ProducerIds::NONE, &recs),
            Some((producer_id, producer_epoch)) => build::transactional(build::batch(
                now,
                ProducerIds {
                    producer_id,
                    producer_epoch,
                    base_sequence: -1,
                },
                &recs,
            )),
        };
        let bytes = Bytes::from(bytes);
        let batch = crate::log::ValidBatch::new(bytes).map_err(|e| e.to_string())?;
        // The epoch is checked inside the append: a coordinator closed by a leadership
        // change must not write after its successor has loaded (and maybe written).
        let appended = self
            .partition
            .append_in_epoch(self.epoch, &batch, -1, now)
            .map_err(|e| match e {
                LeaderAppendError::NotLeader => format!(
                    "{} is no longer led by this broker at epoch {}",
                    self.partition.topic, self.epoch
                ),
                e => e.to_string(),
            })?;
        self.partition
            .wait_durable(appended.last_offset + 1, self.epoch, self.timeout)
            .await
            .map_err(|e| e.to_string())?;
        Ok(appended.base_offset)
    }
}

#[tonic::async_trait]
impl OffsetsLog for PartitionOffsets {
    async fn append(&self, records: Vec<(Bytes, Option<Bytes>)>) -> Result<(), String> {
        if records.is_empty() {
            return Ok(());
        }
        self.write(records, None).await.map(|_| ())
    }

    async fn append_txn(
        &self,
        records: Vec<(Bytes, Option<Bytes>)>,
        producer: (i64, i16),
    ) -> Result<u64, String> {
        if records.is_empty() {
            return Err("a transactional commit of nothing".to_string());
        }
        self.write(records, Some(producer)).await
    }

    fn end_offset(&self) -> Option<u64> {
        Some(self.partition.progress().log_end)
    }

    fn trim_before(&self, offset: u64) {
        if let Err(e) = self.partition.trim_before(offset) {
            tracing::warn!(topic = %self.partition.topic, partition = self.partition.index, error = %e, "could not delete superseded segments");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::SystemClock;
    use crate::log::{LogConfig, PartitionLog};
    use crate::replication::leader::{Assignment, Policy};

    fn lead(p: &Partition, epoch: i32) {
        p.become_leader(
            epoch,
            Assignment {
                me: 1,
                replicas: vec![1],
                isr: vec![1],
                partition_epoch: epoch,
            },
            Policy {
                min_insync_replicas: 1,
                replica_lag_max_ms: 10_000,
            },
            0,
        );
    }

    /// Issue 14, defect 8: a coordinator loaded at epoch 1 whose partition is now led at
    /// epoch 2 (a successor coordinator loaded and may have written) appended its commit
    /// first and checked the epoch after: its stale write landed behind the successor's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_closed_coordinator_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = PartitionLog::open(dir.path(), LogConfig::default(), 0).unwrap();
        let partition = Partition::start(Arc::from("__consumer_offsets"), 0, log, 0);
        lead(&partition, 1);
        let offsets = PartitionOffsets::new(
            partition.clone(),
            1,
            Arc::new(SystemClock),
            Duration::from_secs(5),
        );
        let commit = || vec![(Bytes::from_static(b"k"), Some(Bytes::from_static(b"v")))];
        offsets
            .append(commit())
            .await
            .expect("written while leading at 1");
        assert_eq!(partition.progress().log_end, 1);
        lead(&partition, 2);
        let refused = offsets.append(commit()).await;
        assert!(
            refused.is_err(),
            "a write of epoch 1's coordinator at epoch 2"
        );
        assert_eq!(
            partition.progress().log_end,
            1,
            "nothing may be appended by the closed coordinator"
        );
    }
}
