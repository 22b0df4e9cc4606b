//! The runtime of one partition on this broker: the single-writer log behind a short lock,
//! a flusher task that group-commits fsyncs, and the high watermark that releases
//! `acks=all` producers and long-polling consumers.
//!
//! The lock is held only for in-memory work and page-cache writes; fsyncs run on the
//! blocking pool and reads run outside the lock from a [`ReadPlan`].

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{watch, Notify};

use crate::log::{AppendError, Appended, PartitionLog, ReadError, ReadPlan, ValidBatch};

/// Kafka's special ListOffsets timestamps.
const LATEST: i64 = -1;
const EARLIEST: i64 = -2;
const MAX_TIMESTAMP: i64 = -3;

/// What consumers and producers may rely on, published after every change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Offsets below this are durable per the topic's flush policy and visible to consumers.
    pub high_watermark: u64,
    pub log_start: u64,
    pub log_end: u64,
    /// Set when an fsync failed: nothing more will be acknowledged.
    pub failed: bool,
}

/// Why waiting for an acknowledgement ended without one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WaitError {
    #[error("timed out waiting for the write to become durable")]
    Timeout,
    #[error("the partition's storage failed; the write is not known to be durable")]
    StorageFailed,
}

pub struct Partition {
    pub topic: Arc<str>,
    pub index: i32,
    log: Mutex<PartitionLog>,
    progress: watch::Sender<Progress>,
    flush: Notify,
    stop: watch::Sender<bool>,
}

impl Partition {
    /// Wraps an opened log and starts its flusher on the current runtime.
    pub fn start(topic: Arc<str>, index: i32, log: PartitionLog) -> Arc<Partition> {
        let end = log.end_offset();
        let (progress, _) = watch::channel(Progress {
            high_watermark: end,
            log_start: log.start_offset(),
            log_end: end,
            failed: false,
        });
        let (stop, _) = watch::channel(false);
        let p = Arc::new(Partition {
            topic,
            index,
            log: Mutex::new(log),
            progress,
            flush: Notify::new(),
            stop,
        });
        tokio::spawn(p.clone().run_flusher());
        p
    }

    /// Locks the log. A panic while holding the lock cannot leave a half-written batch
    /// visible (the high watermark did not move), so a poisoned lock is still usable.
    pub fn lock(&self) -> MutexGuard<'_, PartitionLog> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn progress(&self) -> Progress {
        *self.progress.borrow()
    }

    pub fn subscribe(&self) -> watch::Receiver<Progress> {
        self.progress.subscribe()
    }

    /// Appends a batch. Returns where it landed and the offset the high watermark must
    /// reach before the write is durable (pass it to [`Partition::wait_durable`]).
    pub fn append(&self, batch: &ValidBatch, now_ms: i64) -> Result<Appended, AppendError> {
        if self.progress.borrow().failed {
            return Err(AppendError::Io(std::io::Error::other(
                "partition storage failed earlier; restart the broker after checking the disk",
            )));
        }
        let mut log = self.lock();
        let appended = log.append(batch, now_ms)?;
        let wait_for_fsync = log.config().acks_wait_for_fsync();
        let (start, end) = (log.start_offset(), log.end_offset());
        drop(log);
        self.progress.send_modify(|p| {
            p.log_start = start;
            p.log_end = end;
            if !wait_for_fsync {
                p.high_watermark = p.high_watermark.max(end);
            }
        });
        if appended.flush_now {
            self.flush.notify_one();
        }
        Ok(appended)
    }

    /// Waits until everything below `end` is durable (below the high watermark).
    pub async fn wait_durable(&self, end: u64, timeout: Duration) -> Result<(), WaitError> {
        let mut rx = self.progress.subscribe();
        let reached = tokio::time::timeout(timeout, async {
            match rx.wait_for(|p| p.high_watermark >= end || p.failed).await {
                Ok(p) => p.high_watermark >= end,
                Err(_) => false,
            }
        })
        .await;
        match reached {
            Err(_) => Err(WaitError::Timeout),
            Ok(true) => Ok(()),
            Ok(false) => Err(WaitError::StorageFailed),
        }
    }

    /// Plans a consumer read at `offset`, bounded by the high watermark.
    pub fn plan_read(&self, offset: u64) -> Result<(Option<ReadPlan>, Progress), ReadError> {
        let log = self.lock();
        let progress = self.progress();
        let plan = log.plan_read(offset, progress.high_watermark)?;
        Ok((plan, progress))
    }

    /// Reads whole batches at `offset` below the high watermark, waiting up to `max_wait`
    /// for some to arrive (a long poll for one partition).
    pub async fn read_waiting(
        &self,
        offset: u64,
        max_bytes: usize,
        max_wait: Duration,
    ) -> Result<(bytes::Bytes, Progress), ReadError> {
        let deadline = tokio::time::Instant::now() + max_wait;
        let mut rx = self.progress.subscribe();
        loop {
            rx.borrow_and_update();
            let (plan, progress) = self.plan_read(offset)?;
            if let Some(plan) = plan {
                let bytes = tokio::task::spawn_blocking(move || plan.read(max_bytes))
                    .await
                    .map_err(|e| ReadError::Io(std::io::Error::other(e)))??;
                if !bytes.is_empty() {
                    return Ok((bytes, progress));
                }
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                return Ok((bytes::Bytes::new(), self.progress()));
            }
        }
    }

    /// Applies a changed topic config (retention, segment and flush settings).
    pub fn set_config(&self, config: crate::log::LogConfig) {
        let mut log = self.lock();
        if *log.config() != config {
            log.set_config(config);
        }
    }

    /// (timestamp, offset) for a ListOffsets query: -1 latest (the high watermark), -2
    /// earliest, -3 the largest timestamp, or the first record at or after a timestamp;
    /// (-1, -1) when no record below the high watermark qualifies.
    pub fn offset_for(&self, timestamp: i64) -> std::io::Result<(i64, i64)> {
        let progress = self.progress();
        let hw = progress.high_watermark;
        match timestamp {
            LATEST => Ok((-1, hw as i64)),
            EARLIEST => Ok((-1, progress.log_start as i64)),
            MAX_TIMESTAMP => Ok(self
                .lock()
                .max_timestamp()
                .filter(|(_, o)| *o < hw)
                .map_or((-1, -1), |(ts, o)| (ts, o as i64))),
            ts => Ok(self
                .lock()
                .offset_for_timestamp(ts)?
                .filter(|(o, _)| *o < hw)
                .map_or((-1, -1), |(o, found)| (found, o as i64))),
        }
    }

    /// Applies retention; publishes the new log start.
    pub fn apply_retention(&self, now_ms: i64) -> std::io::Result<usize> {
        let mut log = self.lock();
        let deleted = log.apply_retention(now_ms)?;
        let start = log.start_offset();
        drop(log);
        self.progress.send_modify(|p| p.log_start = start);
        Ok(deleted.len())
    }

    /// Stops the flusher and closes the log cleanly (flushing everything).
    pub fn close(&self) -> std::io::Result<()> {
        self.stop.send_replace(true);
        self.lock().close()
    }

    /// Stops the flusher without closing (the partition's files are about to be deleted).
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }

    async fn run_flusher(self: Arc<Self>) {
        let mut stop = self.stop.subscribe();
        loop {
            tokio::select! {
                _ = self.flush.notified() => {}
                _ = async { let _ = stop.wait_for(|s| *s).await.is_ok(); } => return,
            }
            let (work, dir, wait_for_fsync) = {
                let mut log = self.lock();
                (
                    log.take_sync_work(),
                    log.dir().to_path_buf(),
                    log.config().acks_wait_for_fsync(),
                )
            };
            let Some(work) = work else { continue };
            let end = work.end;
            let result = tokio::task::spawn_blocking(move || work.run(&dir)).await;
            match result {
                Ok(Ok(())) => self.progress.send_modify(|p| {
                    if wait_for_fsync {
                        p.high_watermark = p.high_watermark.max(end);
                    }
                }),
                Ok(Err(e)) => {
                    tracing::error!(topic = %self.topic, partition = self.index, error = %e, "fsync failed; partition stops accepting writes");
                    self.progress.send_modify(|p| p.failed = true);
                    return;
                }
                Err(e) => {
                    tracing::error!(topic = %self.topic, partition = self.index, error = %e, "flush task panicked");
                    self.progress.send_modify(|p| p.failed = true);
                    return;
                }
            }
        }
    }
}
