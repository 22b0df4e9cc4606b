//! Where an acknowledged write spends its time on the leader, for the per-stage latency
//! breakdown (`strata_stage_*` in /metrics, printed by `bench/latency_bench.py`): each
//! append's end offset and instant are kept until the leader's fsync and every follower's
//! fetch passed it, and each of those is observed once, as the time since the append.

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use crate::metrics::Histogram;

/// Appends remembered at most (older ones are dropped unmeasured: a follower that far
/// behind is out of the ISR's way anyway).
const MAX_PENDING: usize = 4096;

#[derive(Debug, Default)]
pub struct AppendTimes {
    /// (end offset, when appended), in offset order.
    pending: VecDeque<(u64, Instant)>,
    /// How far the leader's fsync has been observed.
    durable: u64,
    /// How far each follower's fetch offset has been observed.
    followers: BTreeMap<i32, u64>,
}

impl AppendTimes {
    /// A leader starting at log end `end` (what came before is not measured).
    pub fn new(end: u64) -> AppendTimes {
        AppendTimes {
            pending: VecDeque::new(),
            durable: end,
            followers: BTreeMap::new(),
        }
    }

    pub fn appended(&mut self, end: u64, at: Instant) {
        if self.pending.len() == MAX_PENDING {
            self.pending.pop_front();
        }
        self.pending.push_back((end, at));
    }

    /// The leader's log is fsynced below `end`: observes the appends it covers.
    pub fn durable(&mut self, end: u64, into: &Histogram) {
        let from = self.durable;
        if end > from {
            self.observe(from, end, into);
            self.durable = end;
            self.prune();
        }
    }

    /// `follower` fetched from `offset`: observes the appends it holds now. Its first fetch
    /// only sets where it is.
    pub fn fetched(&mut self, follower: i32, offset: u64, into: &Histogram) {
        match self.followers.insert(follower, offset) {
            Some(from) if offset > from => {
                self.observe(from, offset, into);
                self.prune();
            }
            _ => {}
        }
    }

    fn observe(&self, from: u64, to: u64, into: &Histogram) {
        let now = Instant::now();
        let start = self.pending.partition_point(|(e, _)| *e <= from);
        for (end, at) in self.pending.range(start..) {
            if *end > to {
                break;
            }
            into.observe(now.saturating_duration_since(*at));
        }
    }

    /// Forgets the appends the leader's fsync and every follower passed.
    fn prune(&mut self) {
        let low = self
            .followers
            .values()
            .copied()
            .chain([self.durable])
            .min()
            .unwrap_or(0);
        while self.pending.front().is_some_and(|(e, _)| *e <= low) {
            self.pending.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn count(h: &Histogram) -> u64 {
        h.count()
    }

    #[test]
    fn each_append_is_observed_once_per_stage_and_forgotten_when_all_passed() {
        let (fsync, acks) = (Histogram::default(), Histogram::default());
        let t0 = Instant::now() - Duration::from_millis(20);
        let mut t = AppendTimes::new(10);
        t.fetched(2, 10, &acks);
        t.fetched(3, 10, &acks);
        t.appended(12, t0);
        t.appended(15, t0);
        t.durable(12, &fsync);
        assert_eq!(count(&fsync), 1);
        t.fetched(2, 15, &acks);
        assert_eq!(count(&acks), 2);
        t.fetched(2, 15, &acks);
        assert_eq!(count(&acks), 2, "nothing new");
        t.durable(15, &fsync);
        t.fetched(3, 13, &acks);
        assert_eq!((count(&fsync), count(&acks)), (2, 3));
        assert_eq!(t.pending.len(), 1, "the append follower 3 lacks is kept");
        t.fetched(3, 15, &acks);
        assert!(t.pending.is_empty());
    }
}
