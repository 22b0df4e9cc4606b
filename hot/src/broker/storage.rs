//! Restarting partitions whose storage failed, without restarting the broker.
//!
//! A partition whose fsync (or the truncation or epoch record after a cut) returned an
//! error stops accepting writes at once (`Partition::failed`). This task notices within
//! half a second and restarts it: the log is reopened and cut back to its last successful
//! fsync (`Partition::restart`). A transient fault (a flaky path, an fsync that ran out of
//! space on thin-provisioned or network storage) then costs the partition a few seconds;
//! a disk that keeps failing is retried with a growing pause, one ERROR line each time.
//!
//! In a cluster the restart must not let this broker append again in the leader epoch
//! whose writes it dropped (followers may hold them: they fetch before the leader's
//! fsync). So when a failed partition is led here, the broker first leaves the cluster
//! (`ClusterLink::storage_fault`): the controllers move its leaderships to in-sync
//! followers at new epochs and take it out of every ISR. Once every failed partition is
//! restarted the broker registers again and catches up as a follower, as after a full
//! disk. A failed follower (or idle) replica is restarted in place and fetches again.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::{Broker, Partition};

/// How often partitions are checked for a failed storage.
const CHECK_EVERY: Duration = Duration::from_millis(500);
/// The pause before a partition is restarted again when its restart failed, or when it
/// failed again soon after one: doubled each time, up to `MAX_PAUSE`.
const FIRST_PAUSE: Duration = Duration::from_secs(1);
const MAX_PAUSE: Duration = Duration::from_secs(60);
/// A partition that runs this long after a restart without failing starts over without a
/// pause.
const SETTLED_AFTER: Duration = Duration::from_secs(120);

/// A failed partition as this task tracks it.
struct Failed {
    /// The newest leader epoch in which this broker led it, when it did at the failure:
    /// it is restarted only once the metadata has moved its leadership past that epoch.
    led_in: Option<i32>,
    /// When a restart may be tried.
    not_before: tokio::time::Instant,
}

/// The restarts of one partition: when the last one was tried, and the pause before the
/// next if it fails again soon.
#[derive(Clone, Copy)]
struct Restarts {
    last: tokio::time::Instant,
    pause: Duration,
}

impl Broker {
    /// Restarts failed partitions until the broker is dropped (see the module docs).
    pub fn spawn_storage_recovery(self: &Arc<Self>) {
        tokio::spawn(run(Arc::downgrade(self)));
    }

    /// Where the metadata puts a partition: (leader, leader epoch).
    fn leadership(&self, p: &Partition) -> Option<(Option<i32>, i32)> {
        self.topic(&p.topic).and_then(|t| {
            t.layout
                .get(p.index as usize)
                .map(|l| (l.leader, l.leader_epoch))
        })
    }

    /// What a partition that just failed is tracked as (`history`: its last restart).
    fn on_failure(&self, p: &Partition, history: Option<Restarts>) -> Failed {
        let role = p.progress().leader_epoch;
        let named = self
            .leadership(p)
            .filter(|(leader, _)| *leader == Some(self.config.node_id))
            .map(|(_, epoch)| epoch);
        let led_in = match (role, named) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        let now = tokio::time::Instant::now();
        let not_before = match history {
            Some(h) if now < h.last + SETTLED_AFTER => h.last + h.pause,
            _ => now,
        };
        Failed {
            led_in: led_in.filter(|_| self.cluster.is_some()),
            not_before,
        }
    }

    /// Whether a failed partition may be restarted now: at once unless it was led here in
    /// a cluster (`led_in` is only set then); then only when no registration of this
    /// broker is left for the controllers to give leaderships to, and the metadata has
    /// moved the leadership past the epoch it was led in.
    fn may_restart(&self, p: &Partition, f: &Failed) -> bool {
        let Some(led_in) = f.led_in else {
            return true;
        };
        let out = self
            .cluster
            .as_ref()
            .is_some_and(|link| link.out_for_storage_fault());
        out && self
            .leadership(p)
            .is_none_or(|(leader, epoch)| leader != Some(self.config.node_id) || epoch > led_in)
    }
}

async fn run(broker: Weak<Broker>) {
    let mut tracked: HashMap<(Arc<str>, i32), Failed> = HashMap::new();
    let mut history: HashMap<(Arc<str>, i32), Restarts> = HashMap::new();
    loop {
        tokio::time::sleep(CHECK_EVERY).await;
        let Some(b) = broker.upgrade() else { return };
        let failed: Vec<Arc<Partition>> = b
            .topics()
            .iter()
            .flat_map(|t| {
                t.local()
                    .filter(|p| p.failed())
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .collect();
        let now = tokio::time::Instant::now();
        tracked.retain(|(topic, index), _| {
            failed
                .iter()
                .any(|p| &p.topic == topic && p.index == *index)
        });
        history.retain(|_, h| now < h.last + SETTLED_AFTER);
        for p in &failed {
            let key = (p.topic.clone(), p.index);
            let h = history.get(&key).copied();
            tracked.entry(key).or_insert_with(|| b.on_failure(p, h));
        }
        if let Some(link) = &b.cluster {
            // Out of the cluster while a failed partition that was led here waits.
            link.storage_fault(tracked.values().any(|f| f.led_in.is_some()));
        }
        let mut restarted = false;
        for p in failed {
            let key = (p.topic.clone(), p.index);
            let Some(f) = tracked.get_mut(&key) else {
                continue;
            };
            if tokio::time::Instant::now() < f.not_before || !b.may_restart(&p, f) {
                continue;
            }
            let pause = history
                .get(&key)
                .map_or(FIRST_PAUSE, |h| (h.pause * 2).min(MAX_PAUSE));
            history.insert(
                key.clone(),
                Restarts {
                    last: tokio::time::Instant::now(),
                    pause,
                },
            );
            let at = b.clock.now_ms();
            let q = p.clone();
            let result = tokio::task::spawn_blocking(move || q.restart(at))
                .await
                .unwrap_or_else(|e| Err(std::io::Error::other(e)));
            match result {
                Ok(_) => {
                    tracked.remove(&key);
                    restarted = true;
                    if b.cluster.is_none() {
                        p.lead_alone(b.config.node_id);
                    }
                }
                Err(e) => {
                    tracing::error!(topic = %p.topic, partition = p.index, error = %e, retry_in = ?pause, "could not restart the partition after a storage failure; check the disk");
                    f.not_before = tokio::time::Instant::now() + pause;
                }
            }
        }
        if restarted {
            b.reconcile_again.notify_one();
            b.layout_changed();
            if let Some(link) = &b.cluster {
                link.storage_fault(tracked.values().any(|f| f.led_in.is_some()));
            }
        }
    }
}
