//! One refresh of every backlog gauge (processing, marking, delivery): the single place the
//! backlog gauges come from (the pump's periodic `RefreshBacklog` calls it), so the three
//! queues are read at one moment, by one set of queries on their partial indexes.

use chrono::{DateTime, Utc};

use crate::pump::drain::DrainEstimate;
use crate::store::backfill::BackfillBacklog;
use crate::store::events::EventBacklog;
use crate::store::Backlog as QueueBacklog;
use crate::store::{Store, StoreError};
use crate::telemetry;

/// The backlogs as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backlogs {
    /// Unfinished rows (`Store::backlog_gauges`: exact up to 10 000, then the id span).
    pub queue: QueueBacklog,
    /// Unmarked terminal rows (`proc_state_backfill_idx`).
    pub backfill: BackfillBacklog,
    /// PENDING events (`msg_event_pending_idx`).
    pub events: EventBacklog,
}

/// Reads every backlog.
pub async fn read(store: &Store) -> Result<Backlogs, StoreError> {
    let (queue, backfill, events) = futures::try_join!(
        store.backlog_gauges(),
        store.backfill_backlog(),
        store.event_backlog()
    )?;
    Ok(Backlogs {
        queue,
        backfill,
        events,
    })
}

impl Backlogs {
    /// The telemetry event, ages by `now`, with the pump's drain estimate.
    pub fn event(&self, now: DateTime<Utc>, drain: DrainEstimate) -> telemetry::Backlog {
        let age = |t: Option<DateTime<Utc>>| t.map(|t| (now - t).to_std().unwrap_or_default());
        telemetry::Backlog {
            unfinished: self.queue.unfinished,
            oldest_unfinished: age(self.queue.oldest),
            unmarked: self.backfill.pending,
            oldest_unmarked: age(self.backfill.oldest),
            events_pending: self.events.pending,
            oldest_event: age(self.events.oldest),
            drain_seconds: drain.seconds(),
        }
    }
}
