//! Bandwidth caps for uploads and cold reads.

use std::time::Duration;

/// A token bucket: transfers wait until their bytes fit under a rate.
pub(crate) struct Limiter {
    per_sec: Option<u64>,
    state: tokio::sync::Mutex<(tokio::time::Instant, f64)>,
}

impl Limiter {
    pub(crate) fn new(per_sec: Option<u64>) -> Self {
        Limiter {
            per_sec,
            state: tokio::sync::Mutex::new((tokio::time::Instant::now(), 0.0)),
        }
    }

    /// Waits until `n` more bytes fit under the cap.
    pub(crate) async fn take(&self, n: u64) {
        let Some(rate) = self.per_sec.filter(|r| *r > 0) else {
            return;
        };
        let mut s = self.state.lock().await;
        let now = tokio::time::Instant::now();
        // Credit: up to one second's worth may accumulate while idle.
        let elapsed = now.duration_since(s.0).as_secs_f64();
        s.1 = (s.1 + elapsed * rate as f64).min(rate as f64);
        s.0 = now;
        s.1 -= n as f64;
        if s.1 < 0.0 {
            let wait = Duration::from_secs_f64(-s.1 / rate as f64);
            tokio::time::sleep(wait).await;
            s.0 = tokio::time::Instant::now();
            s.1 = 0.0;
        }
    }
}
