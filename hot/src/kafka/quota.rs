//! Client quotas on the Kafka listeners (KIP-13 byte rates, KIP-124 request time), enforced
//! as Kafka enforces them: each quota's usage is a rate over `SAMPLES` one-second windows
//! (Kafka's `quota.window.num` and `quota.window.size.seconds`); a request that takes the
//! rate over the quota earns a throttle time, `(rate - quota) / quota x window`, which the
//! response carries in `throttle_time_ms` and for which the broker stops reading from the
//! connection (KIP-219), so one tenant cannot starve another however its client behaves.
//!
//! Which quota applies, and who shares it, is the metadata's (`ClientQuotas::resolve`).
//! This module keeps the rates: one [`Rate`] per quota share, pure logic with the time passed
//! in, inside [`Quotas`], which the listeners share. With no quota configured nothing is
//! recorded and nothing is locked.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use strata_controller::metadata::quota::QuotaKey;
use strata_controller::metadata::quota::QuotaShare;
use strata_controller::metadata::ClusterMetadata;
use tokio::sync::watch;

/// Windows a rate is measured over (Kafka's `quota.window.num`).
const SAMPLES: usize = 11;
/// One window (Kafka's `quota.window.size.seconds`).
const WINDOW_MS: u64 = 1000;
/// The longest a single request is throttled for: the whole measured span.
const MAX_THROTTLE_MS: u64 = SAMPLES as u64 * WINDOW_MS;
/// Rates kept before idle ones are swept, and the most kept at all: past it, new shares of
/// a quota are measured together (a flood of fresh client ids throttles itself).
const SWEEP_AT: usize = 10_000;
const MAX_RATES: usize = 100_000;

/// A rate over the last `SAMPLES` windows, Kafka's `Rate` over a `SampledStat`.
#[derive(Debug, Clone)]
pub struct Rate {
    /// (window start, total recorded in it), oldest first once full.
    samples: [(u64, f64); SAMPLES],
    current: usize,
    last_ms: u64,
}

impl Rate {
    pub fn new(now_ms: u64) -> Rate {
        Rate {
            samples: [(now_ms, 0.0); SAMPLES],
            current: 0,
            last_ms: now_ms,
        }
    }

    pub fn record(&mut self, now_ms: u64, amount: f64) {
        self.roll(now_ms);
        self.samples[self.current].1 += amount;
        self.last_ms = now_ms;
    }

    /// Moves to the window `now_ms` falls in, clearing windows that aged out.
    fn roll(&mut self, now_ms: u64) {
        let (start, _) = self.samples[self.current];
        if now_ms < start + WINDOW_MS {
            return;
        }
        let behind = ((now_ms - start) / WINDOW_MS) as usize;
        for _ in 0..behind.min(SAMPLES) {
            self.current = (self.current + 1) % SAMPLES;
            self.samples[self.current] = (0, 0.0);
        }
        // the current window starts on the window grid of the old one
        self.samples[self.current].0 = start + behind as u64 * WINDOW_MS;
    }

    /// Units per second over the measured span. Like Kafka, the span is never taken as
    /// shorter than `SAMPLES - 1` whole windows, so a fresh rate is not inflated by its
    /// first burst.
    pub fn per_second(&mut self, now_ms: u64) -> f64 {
        self.roll(now_ms);
        let oldest_allowed = now_ms.saturating_sub(SAMPLES as u64 * WINDOW_MS);
        let (mut total, mut oldest) = (0.0, now_ms);
        for &(start, v) in &self.samples {
            if v > 0.0 && start >= oldest_allowed {
                total += v;
                oldest = oldest.min(start);
            }
        }
        let span = (now_ms - oldest).max((SAMPLES as u64 - 1) * WINDOW_MS);
        total * 1000.0 / span as f64
    }

    /// How long the owner must wait for the rate to come back to `quota`.
    pub fn throttle_ms(&mut self, now_ms: u64, quota: f64) -> u64 {
        let rate = self.per_second(now_ms);
        if rate <= quota {
            return 0;
        }
        let span = (SAMPLES as u64 - 1) * WINDOW_MS;
        (((rate - quota) / quota) * span as f64).min(MAX_THROTTLE_MS as f64) as u64
    }

    fn idle_since(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.last_ms) > SAMPLES as u64 * WINDOW_MS
    }
}

/// What the quotas count, for /metrics.
#[derive(Debug, Default)]
pub struct QuotaStats {
    /// Responses that carried a throttle time, and the throttle milliseconds given, by
    /// quota (producer, consumer, request).
    pub throttled: [AtomicU64; 3],
    pub throttle_ms: [AtomicU64; 3],
}

fn slot(key: QuotaKey) -> usize {
    match key {
        QuotaKey::ProducerByteRate => 0,
        QuotaKey::ConsumerByteRate => 1,
        QuotaKey::RequestPercentage => 2,
    }
}

/// Every connection's quota usage, shared by the broker's listeners.
pub struct Quotas {
    metadata: Option<watch::Receiver<Arc<ClusterMetadata>>>,
    rates: Mutex<Rates>,
    started: Instant,
    stats: Arc<QuotaStats>,
}

/// Who a connection is, as quotas name it: its user (the principal without `User:`) and
/// the client id of its requests.
pub struct Client<'a> {
    pub user: &'a str,
    pub client_id: &'a str,
}

impl Quotas {
    /// `metadata`: the cluster metadata holding the quotas (`None`: no quotas ever apply).
    pub fn new(
        metadata: Option<watch::Receiver<Arc<ClusterMetadata>>>,
        stats: Arc<QuotaStats>,
    ) -> Arc<Quotas> {
        Arc::new(Quotas {
            metadata,
            rates: Mutex::new(Rates::default()),
            started: Instant::now(),
            stats,
        })
    }

    /// Whether any quota is configured (with none, nothing is measured).
    pub fn active(&self) -> bool {
        self.metadata
            .as_ref()
            .is_some_and(|m| !m.borrow().client_quotas.is_empty())
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn quota(&self, client: &Client<'_>, key: QuotaKey) -> Option<(QuotaShare, f64)> {
        let m = self.metadata.as_ref()?.borrow();
        m.client_quotas.resolve(client.user, client.client_id, key)
    }

    /// Records `amount` (bytes, or milliseconds of request time) against the client's
    /// quota of `key`; the throttle it earned (zero within the quota, or with none).
    pub fn record(&self, client: &Client<'_>, key: QuotaKey, amount: f64) -> Duration {
        let Some((share, quota)) = self.quota(client, key) else {
            return Duration::ZERO;
        };
        let now = self.now_ms();
        let mut rates = self.rates.lock().unwrap_or_else(|e| e.into_inner());
        let rate = rates.rate_for(key, share, now);
        rate.record(now, amount);
        let ms = rate.throttle_ms(now, quota);
        drop(rates);
        self.count(key, ms)
    }

    /// The throttle the client owes on `key` now, recording nothing (a fetch asks before it
    /// reads, so a throttled consumer is answered without data).
    pub fn owed(&self, client: &Client<'_>, key: QuotaKey) -> Duration {
        let Some((share, quota)) = self.quota(client, key) else {
            return Duration::ZERO;
        };
        let now = self.now_ms();
        let mut rates = self.rates.lock().unwrap_or_else(|e| e.into_inner());
        let ms = rates
            .by_share
            .get_mut(&(key, share))
            .map_or(0, |r| r.throttle_ms(now, quota));
        drop(rates);
        self.count(key, ms)
    }

    fn count(&self, key: QuotaKey, ms: u64) -> Duration {
        if ms > 0 {
            self.stats.throttled[slot(key)].fetch_add(1, Ordering::Relaxed);
            self.stats.throttle_ms[slot(key)].fetch_add(ms, Ordering::Relaxed);
        }
        Duration::from_millis(ms)
    }
}

/// The rates of every quota share in use.
#[derive(Default)]
struct Rates {
    by_share: HashMap<(QuotaKey, QuotaShare), Rate>,
    swept_at: u64,
}

impl Rates {
    /// The rate of one share, created when first used. Past `SWEEP_AT` rates, idle ones are
    /// swept (at most once per measured span); past `MAX_RATES`, a new share is measured
    /// with every other overflowing one.
    fn rate_for(&mut self, key: QuotaKey, share: QuotaShare, now: u64) -> &mut Rate {
        let mut id = (key, share);
        if !self.by_share.contains_key(&id) {
            if self.by_share.len() >= SWEEP_AT && now >= self.swept_at + MAX_THROTTLE_MS {
                self.by_share.retain(|_, r| !r.idle_since(now));
                self.swept_at = now;
            }
            if self.by_share.len() >= MAX_RATES {
                id.1 = QuotaShare {
                    user: None,
                    client_id: Some("<overflow>".into()),
                };
            }
        }
        self.by_share.entry(id).or_insert_with(|| Rate::new(now))
    }
}

/// A future that also reports the time spent in its polls: a handler's own work, not its
/// waits (a long-poll fetch or an acks=all wait costs no request time while it waits).
pub struct Busy<F> {
    inner: std::pin::Pin<Box<F>>,
    busy: Duration,
}

impl<F: std::future::Future> Busy<F> {
    pub fn new(inner: F) -> Self {
        Busy {
            inner: Box::pin(inner),
            busy: Duration::ZERO,
        }
    }
}

impl<F: std::future::Future> std::future::Future for Busy<F> {
    type Output = (F::Output, Duration);

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let started = Instant::now();
        let polled = self.inner.as_mut().poll(cx);
        self.busy += started.elapsed();
        polled.map(|out| (out, self.busy))
    }
}

/// A connection's mute: when it may next be read from (KIP-219: the broker stops reading
/// from a throttled connection until its throttle time is over).
#[derive(Debug, Default)]
pub struct Mute(Mutex<Option<tokio::time::Instant>>);

impl Mute {
    /// Mutes the connection for `d` from now (never shortens a longer mute).
    pub fn extend(&self, d: Duration) {
        if d.is_zero() {
            return;
        }
        let until = tokio::time::Instant::now() + d;
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if m.is_none_or(|u| u < until) {
            *m = Some(until);
        }
    }

    /// Waits out the mute, if any.
    pub async fn wait(&self) {
        let until = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(until) = until {
            tokio::time::sleep_until(until).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_controller::metadata::quota::{
        EntityName, QuotaAlteration, QuotaEntity, QuotaValue,
    };

    #[test]
    fn a_fresh_rate_is_spread_over_the_whole_span() {
        let mut r = Rate::new(0);
        r.record(0, 10_000.0);
        // 10,000 units in the first instant: 1,000/s over the ten-window minimum span
        assert_eq!(r.per_second(0), 1000.0);
        assert_eq!(r.throttle_ms(0, 1000.0), 0);
        r.record(0, 10_000.0);
        // twice the quota: throttled for as long as it takes to halve the rate
        assert_eq!(r.throttle_ms(0, 1000.0), 10_000);
    }

    #[test]
    fn a_steady_rate_within_quota_is_never_throttled_and_old_windows_age_out() {
        let mut r = Rate::new(0);
        for t in (0..30_000).step_by(100) {
            r.record(t, 90.0); // 900/s
            assert_eq!(r.throttle_ms(t, 1000.0), 0, "at {t} ms");
        }
        let steady = r.per_second(29_999);
        assert!((850.0..=950.0).contains(&steady), "{steady}");
        // silence: every window ages out
        assert_eq!(r.per_second(29_999 + 12_000), 0.0);
    }

    /// A client that sends twice its quota and honours the throttle it is given ends up at
    /// its quota: the throttle is what brings the rate back.
    #[test]
    fn honouring_the_throttle_holds_a_client_to_its_quota() {
        let mut r = Rate::new(0);
        let (quota, mut t, mut sent) = (1000.0, 0u64, 0.0);
        while t < 60_000 {
            r.record(t, 500.0);
            sent += 500.0;
            t += 250 + r.throttle_ms(t, quota); // 2,000/s unthrottled
        }
        let achieved = sent * 1000.0 / t as f64;
        assert!(
            (900.0..=1150.0).contains(&achieved),
            "{achieved}/s against a quota of 1000/s"
        );
    }

    fn quotas(alterations: &[QuotaAlteration]) -> Arc<Quotas> {
        let mut m = ClusterMetadata::default();
        m.client_quotas.alter(alterations).unwrap();
        let (_tx, rx) = watch::channel(Arc::new(m));
        // the sender may go: the receiver keeps the last value
        Quotas::new(Some(rx), Arc::default())
    }

    #[test]
    fn shares_follow_the_entity_that_matched() {
        let q = quotas(&[QuotaAlteration {
            entity: QuotaEntity {
                user: None,
                client_id: Some(EntityName::Default),
            },
            set: [(QuotaKey::ProducerByteRate, QuotaValue::new(100.0).unwrap())].into(),
            remove: vec![],
        }]);
        let a = Client {
            user: "ANONYMOUS",
            client_id: "a",
        };
        let b = Client {
            user: "ANONYMOUS",
            client_id: "b",
        };
        // a's burst throttles a, not b: the default client id gives each id its own rate
        assert!(q.record(&a, QuotaKey::ProducerByteRate, 5000.0) > Duration::ZERO);
        assert_eq!(
            q.record(&b, QuotaKey::ProducerByteRate, 500.0),
            Duration::ZERO
        );
        assert!(q.owed(&a, QuotaKey::ProducerByteRate) > Duration::ZERO);
        assert_eq!(q.owed(&b, QuotaKey::ProducerByteRate), Duration::ZERO);
        // no quota on fetches
        assert_eq!(
            q.record(&a, QuotaKey::ConsumerByteRate, 1e9),
            Duration::ZERO
        );
        assert_eq!(q.stats.throttled[0].load(Ordering::Relaxed), 2);
    }

    #[test]
    fn rates_past_the_cap_are_measured_together() {
        let mut rates = Rates::default();
        for i in 0..MAX_RATES + 5 {
            let share = QuotaShare {
                user: None,
                client_id: Some(i.to_string()),
            };
            rates
                .rate_for(QuotaKey::ProducerByteRate, share, 0)
                .record(0, 1.0);
        }
        assert_eq!(rates.by_share.len(), MAX_RATES + 1);
        // idle ones are swept when new shares come
        let share = QuotaShare {
            user: None,
            client_id: Some("late".into()),
        };
        rates.rate_for(QuotaKey::ProducerByteRate, share, 60_000);
        assert_eq!(rates.by_share.len(), 1);
    }
}
