//! A scrape sees each event's series whole. An event sets several series one after another
//! (W and the enqueued count of a poll round; the counters of a dispatch round), and the
//! exporter reads counters, then gauges, then histograms: without this, a scrape between two
//! of an event's writes shows a W whose rows are not counted yet. Events hold the shared side
//! of one lock while they write; `/metrics` renders under the exclusive side. Writes are a
//! few atomics, so neither side waits long.

use std::sync::{PoisonError, RwLock, RwLockReadGuard};

static EVENTS: RwLock<()> = RwLock::new(());

/// Held while one event writes its series, so [`between_events`] never renders half of them.
/// Events must not nest (a waiting renderer would block the inner one).
pub(crate) fn event() -> RwLockReadGuard<'static, ()> {
    EVENTS.read().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `render` when no event is half written (the `/metrics` handler).
pub fn between_events<R>(render: impl FnOnce() -> R) -> R {
    let _quiet = EVENTS.write().unwrap_or_else(PoisonError::into_inner);
    render()
}
