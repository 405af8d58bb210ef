//! Estimated drain time (SPEC §9, G6): the unfinished backlog divided by the processing rate
//! over the last `processing.drain_rate_window` — pure, on the injected clock. The pump actor
//! feeds it its running count of finished messages every backlog refresh.

use std::collections::VecDeque;
use std::time::Duration;

use chrono::{DateTime, Utc};

/// What the estimate says.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DrainEstimate {
    /// Nothing to drain.
    Empty,
    /// Not enough history yet (just started): no rate.
    Unknown,
    /// A backlog and no progress over the window: it never drains at this rate.
    Stalled,
    /// Seconds until the backlog is gone at the recent rate.
    Seconds(f64),
}

impl DrainEstimate {
    /// As the `msgx_pipeline_estimated_drain_seconds` gauge: 0 when empty, NaN while unknown,
    /// +Inf when stalled.
    pub fn seconds(self) -> f64 {
        match self {
            Self::Empty => 0.0,
            Self::Unknown => f64::NAN,
            Self::Stalled => f64::INFINITY,
            Self::Seconds(s) => s,
        }
    }
}

/// Finished-message counts over a sliding window.
#[derive(Debug, Clone)]
pub struct DrainEstimator {
    window: Duration,
    /// (when, finished so far), oldest first; the first one may be just before the window so
    /// the rate covers all of it.
    samples: VecDeque<(DateTime<Utc>, u64)>,
}

impl DrainEstimator {
    /// An estimator over `window` (at least one second).
    pub fn new(window: Duration) -> Self {
        Self {
            window: window.max(Duration::from_secs(1)),
            samples: VecDeque::new(),
        }
    }

    /// Records that `finished` messages were finished in total by `at`.
    pub fn record(&mut self, at: DateTime<Utc>, finished: u64) {
        if self.samples.back().is_some_and(|(t, _)| *t > at) {
            // The clock went back (a test, an NTP step): start over rather than divide by it.
            self.samples.clear();
        }
        self.samples.push_back((at, finished));
        let start = crate::clock::minus(at, self.window);
        // Keep one sample at or before the window start.
        while self.samples.len() > 2 && self.samples[1].0 <= start {
            self.samples.pop_front();
        }
    }

    /// Finished messages per second over the window; None until a tenth of it is covered.
    pub fn rate(&self) -> Option<f64> {
        let (first, last) = (self.samples.front()?, self.samples.back()?);
        let span = (last.0 - first.0).to_std().ok()?;
        if span < self.window / 10 || span.is_zero() {
            return None;
        }
        Some(last.1.saturating_sub(first.1) as f64 / span.as_secs_f64())
    }

    /// The estimate for `backlog` unfinished messages.
    pub fn estimate(&self, backlog: i64) -> DrainEstimate {
        if backlog <= 0 {
            return DrainEstimate::Empty;
        }
        match self.rate() {
            None => DrainEstimate::Unknown,
            Some(r) if r <= 0.0 => DrainEstimate::Stalled,
            Some(r) => DrainEstimate::Seconds(backlog as f64 / r),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::UNIX_EPOCH + chrono::Duration::seconds(s)
    }

    #[test]
    fn rate_over_the_window_and_estimate() {
        let mut d = DrainEstimator::new(Duration::from_secs(300));
        assert_eq!(d.estimate(10), DrainEstimate::Unknown);
        d.record(t(0), 0);
        d.record(t(10), 100);
        assert_eq!(
            d.estimate(10),
            DrainEstimate::Unknown,
            "10 s < a tenth of 5 min"
        );
        d.record(t(60), 600);
        assert_eq!(d.rate(), Some(10.0));
        assert_eq!(d.estimate(1200), DrainEstimate::Seconds(120.0));
        assert_eq!(d.estimate(0), DrainEstimate::Empty);
    }

    #[test]
    fn old_samples_leave_the_window() {
        let mut d = DrainEstimator::new(Duration::from_secs(60));
        d.record(t(0), 0);
        d.record(t(30), 3000); // a burst long ago
        for s in (35..=200).step_by(5) {
            d.record(t(s), 3000 + (s as u64 - 30)); // then 1 msg/s
        }
        let r = d.rate().expect("rate");
        assert!((r - 1.0).abs() < 0.1, "{r}");
        assert!(d.samples.len() <= 14);
    }

    #[test]
    fn no_progress_is_stalled_and_a_clock_step_back_restarts() {
        let mut d = DrainEstimator::new(Duration::from_secs(60));
        d.record(t(0), 5);
        d.record(t(30), 5);
        assert_eq!(d.estimate(3), DrainEstimate::Stalled);
        d.record(t(10), 7);
        assert_eq!(d.estimate(3), DrainEstimate::Unknown);
    }
}
