//! One dispatch round driven the way the `Dispatcher` actor drives it, for the tests and
//! `msgx-bench dispatch` (which includes this file): the core's `send_round` (a transactional
//! round when the producer is, `kafka.delivery = "exactly-once"`) beside `write_outcome` of
//! what the earlier rounds learned, both on the caller's `DispatchState`. The actor runs the
//! write as a task beside its next round; here the two are joined, so a round-by-round caller
//! sees the same selections (what a write covers stays skipped until it ends).
//!
//! Only `msgx_core` is used here: the bench has no `tests/common`.

use std::time::{Duration, Instant};

use msgx_core::clock::Clock;
use msgx_core::dispatch::{
    send_round, write_outcome, DispatchConfig, DispatchError, DispatchState, RoundReport,
};
use msgx_core::kafka::EventProducer;
use msgx_core::store::Store;

/// What one round sent, and what the write beside it recorded.
#[derive(Debug)]
pub struct Round {
    /// The sending half's report (selected, acked, failed, …).
    pub report: RoundReport,
    /// Events the write beside the round marked SENT (earlier rounds' acks).
    pub sent: u64,
    /// Events the write beside the round marked DEAD.
    pub dead: u64,
    /// How long that write took (it overlaps the round's sends).
    pub write_took: Duration,
}

impl std::ops::Deref for Round {
    type Target = RoundReport;

    fn deref(&self) -> &RoundReport {
        &self.report
    }
}

/// One round: writes the outcome waiting in `state` while the next events are selected
/// (without what the write covers) and sent; the round's outcome is added to `state` for the
/// next write. A failed write leaves its outcome in `state` for the next round to write.
pub async fn round(
    store: &Store,
    producer: &mut EventProducer,
    clock: &dyn Clock,
    cfg: &DispatchConfig,
    state: &mut DispatchState,
) -> Result<Round, DispatchError> {
    let writing = state.take_for_write();
    let skips = state.skips();
    let write = async {
        let t = Instant::now();
        let r = match &writing {
            Some(u) => write_outcome(store, u, cfg).await,
            None => Ok((0, 0)),
        };
        (r, t.elapsed())
    };
    let ((written, write_took), sent) =
        futures::join!(write, send_round(store, producer, clock, cfg, &skips));
    if let Some(u) = writing {
        state.write_finished(u, written.is_ok());
    }
    let (report, fresh) = sent?;
    state.add(fresh);
    let (sent, dead) = written?;
    Ok(Round {
        report,
        sent,
        dead,
        write_took,
    })
}
