//! The copy-rate limit of a reassignment (`strata topic reassign --throttle`): each replica
//! a move adds fetches at most `rate` bytes per second from the leader, so a large
//! partition's copy does not take the disk and network its leader's producers and
//! consumers need. Replicas already in place are never throttled: an ISR member held back
//! would slow every acks=all produce.
//!
//! A token bucket per (topic, partition, replica), one second deep: a fetch first waits
//! until the bucket is out of debt, asks for at most a second's worth of bytes, and what it
//! got is then charged to the bucket.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The smallest response a throttled fetch may ask for (a rate below it still copies, in
/// bursts a second or more apart).
const MIN_FETCH_BYTES: usize = 64 << 10;
/// Buckets unused this long are dropped (their move ended or their follower went away).
const FORGET_AFTER: Duration = Duration::from_secs(60);

type Key = (String, u32, i32);

struct Bucket {
    /// Bytes that may be sent now; negative: owed.
    tokens: f64,
    at: Instant,
}

#[derive(Default)]
pub struct Throttles {
    buckets: Mutex<HashMap<Key, Bucket>>,
}

impl Throttles {
    /// How long a fetch of `key` must wait at `rate` bytes per second before it is served,
    /// and the most bytes it may ask for then.
    pub fn admit(&self, key: &Key, rate: u64, max_bytes: usize, now: Instant) -> (Duration, usize) {
        let rate = rate.max(1) as f64;
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() > 1024 {
            buckets.retain(|_, b| now.duration_since(b.at) < FORGET_AFTER);
        }
        // A new bucket starts empty: its first fetch is served at once and charged, so a
        // copy never bursts more than one fetch above its rate.
        let b = buckets.entry(key.clone()).or_insert(Bucket {
            tokens: 0.0,
            at: now,
        });
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * rate).min(rate);
        b.at = now;
        let wait = if b.tokens < 0.0 {
            Duration::from_secs_f64(-b.tokens / rate)
        } else {
            Duration::ZERO
        };
        (wait, max_bytes.min((rate as usize).max(MIN_FETCH_BYTES)))
    }

    /// Charges `bytes` sent to `key`.
    pub fn charge(&self, key: &Key, bytes: usize) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = buckets.get_mut(key) {
            b.tokens -= bytes as f64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fetches as fast as the throttle lets them for `seconds` of simulated time; returns the
    /// bytes sent.
    fn copy(rate: u64, fetch_returns: usize, seconds: u64) -> usize {
        let t = Throttles::default();
        let key = ("t".to_string(), 0, 3);
        let start = Instant::now();
        let mut now = start;
        let mut sent = 0;
        while now < start + Duration::from_secs(seconds) {
            let (wait, max) = t.admit(&key, rate, 32 << 20, now);
            now += wait;
            let n = fetch_returns.min(max);
            t.charge(&key, n);
            sent += n;
            now += Duration::from_millis(1); // the fetch itself
        }
        sent
    }

    #[test]
    fn a_throttled_copy_keeps_to_its_rate_over_time() {
        for rate in [100_000u64, 1 << 20, 10 << 20] {
            let sent = copy(rate, 8 << 20, 20);
            let per_second = sent as f64 / 20.0;
            // one fetch's burst above the rate at most, spread over 20 s
            let one_fetch = (rate as usize).max(MIN_FETCH_BYTES) as f64;
            assert!(
                per_second <= rate as f64 + one_fetch / 20.0 + 1.0,
                "{rate}: {per_second}"
            );
            assert!(per_second >= rate as f64 * 0.9, "{rate}: {per_second}");
        }
    }

    #[test]
    fn a_fetch_asks_for_at_most_a_seconds_worth() {
        let t = Throttles::default();
        let key = ("t".to_string(), 0, 3);
        let (wait, max) = t.admit(&key, 1 << 20, 32 << 20, Instant::now());
        assert_eq!((wait, max), (Duration::ZERO, 1 << 20));
        let (_, max) = t.admit(&key, 1000, 32 << 20, Instant::now());
        assert_eq!(max, MIN_FETCH_BYTES);
    }
}
