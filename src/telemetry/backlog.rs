//! The backlog gauges of every queue (processing, marking, delivery), set by one event from
//! one periodic refresh (the core step `backlog::read`, called by the pump's `RefreshBacklog`).

use std::time::Duration;

use metrics::gauge;

use super::{
    BACKFILL_OLDEST_UNMARKED_SECONDS, BACKFILL_PENDING, DISPATCH_OLDEST_PENDING_SECONDS,
    DISPATCH_PENDING, PIPELINE_ESTIMATED_DRAIN_SECONDS, PIPELINE_OLDEST_UNPROCESSED_SECONDS,
    PIPELINE_UNFINISHED,
};

/// Every backlog at one refresh. Ages are zero when the queue is empty.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backlog {
    /// PENDING + FAILED rows.
    pub unfinished: i64,
    /// Age of the oldest of them.
    pub oldest_unfinished: Option<Duration>,
    /// Terminal rows not yet marked in the inbox (and not abandoned).
    pub unmarked: i64,
    /// Age of the oldest of them (since it became terminal).
    pub oldest_unmarked: Option<Duration>,
    /// MSG_EVENT rows PENDING delivery.
    pub events_pending: i64,
    /// Age of the oldest of them.
    pub oldest_event: Option<Duration>,
    /// G6: seconds to drain `unfinished` at the recent rate; 0 when empty, +Inf when stalled
    /// with a backlog, NaN before a rate is known.
    pub drain_seconds: f64,
}

impl Backlog {
    /// Sets the backlog gauges.
    pub fn emit(&self) {
        let _whole = super::whole::event();
        let secs = |d: Option<Duration>| d.map_or(0.0, |a| a.as_secs_f64());
        gauge!(PIPELINE_UNFINISHED).set(self.unfinished as f64);
        gauge!(PIPELINE_OLDEST_UNPROCESSED_SECONDS).set(secs(self.oldest_unfinished));
        gauge!(BACKFILL_PENDING).set(self.unmarked as f64);
        gauge!(BACKFILL_OLDEST_UNMARKED_SECONDS).set(secs(self.oldest_unmarked));
        gauge!(DISPATCH_PENDING).set(self.events_pending as f64);
        gauge!(DISPATCH_OLDEST_PENDING_SECONDS).set(secs(self.oldest_event));
        gauge!(PIPELINE_ESTIMATED_DRAIN_SECONDS).set(self.drain_seconds);
    }
}
