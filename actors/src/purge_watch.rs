//! PurgeWatch (seed §6, issues 13 and 19): keeps the `msgx_purge_boundary_id` gauge (and the
//! boundary row's receive time) current for the DB owner's purge job, by the purge rule of
//! purge readiness (marked AND our record terminal and confirmed, or skipped cutover stock).
//! Every `backfill.period` — the boundary moves when the sweep confirms marks, and down when a
//! row below it is replayed — one round of [`msgx_core::ops::BoundaryWatch::advance`]: pull the
//! boundary down below a record that is no longer finished and confirmed, then read on from it
//! to the first row that is not purgeable. It is a child of its own, so a long first catch-up
//! never delays polling, processing or marking; when a round hits its row cap it runs the next
//! one at once.
//!
//! A sweep that confirmed marks wakes it early ([`MarksConfirmed`], at most one round per
//! [`WAKE_GAP`]): during a drain it reads on over a second's confirmations at a time instead of
//! `backfill.period`'s worth, so when the drain ends nothing is left to read and an idle inbox
//! sees the poller's one statement per `poll_interval` and this watch's one per period
//! (issue 43; before, a million-row drain left ~30 reads of 5,000 rows for the idle minutes).

use std::time::{Duration, Instant};

use actix::{Actor, ActorFutureExt, AsyncContext, AtomicResponse, Context, Handler, WrapFuture};
use msgx_core::inbox::Inbox;
use msgx_core::ops::{Advance, BoundaryWatch, BOUNDARY_MAX_ROWS};
use msgx_core::store::Store;

use crate::child::Child;
use crate::messages::{MarksConfirmed, RefreshBoundary, WorkError};
use crate::next_run::NextRun;

/// Shortest gap from a round's start to a round woken by [`MarksConfirmed`]: the sweep confirms
/// every second or so during a drain, and one read of 5,000 rows covers a second of it.
pub const WAKE_GAP: Duration = Duration::from_secs(1);

/// The purge boundary watcher.
pub struct PurgeWatch {
    /// Shared inbox (ids and marks only).
    inbox: Inbox,
    /// Our store (the records the rule reads).
    store: Store,
    /// The boundary so far.
    watch: BoundaryWatch,
    /// Pause between rounds.
    period: Duration,
    /// The pending timer.
    next: NextRun,
    /// Start of the last round (a wake waits out [`WAKE_GAP`] from it).
    last_start: Option<Instant>,
}

impl PurgeWatch {
    /// A watcher; it runs a first round as soon as it is started.
    pub fn new(inbox: Inbox, store: Store, period: Duration) -> Self {
        Self {
            inbox,
            store,
            watch: BoundaryWatch::default(),
            period,
            next: NextRun::default(),
            last_start: None,
        }
    }
}

impl Actor for PurgeWatch {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        tracing::info!(period = ?self.period, "purge boundary watch started");
        ctx.notify(RefreshBoundary);
    }
}

impl Handler<RefreshBoundary> for PurgeWatch {
    type Result = AtomicResponse<Self, Result<Advance, WorkError>>;

    fn handle(&mut self, _: RefreshBoundary, ctx: &mut Self::Context) -> Self::Result {
        self.next.cancel(ctx);
        self.last_start = Some(Instant::now());
        let (inbox, store) = (self.inbox.clone(), self.store.clone());
        let mut watch = self.watch.clone();
        let round = async move {
            let r = watch.advance(&inbox, &store, BOUNDARY_MAX_ROWS).await;
            (watch, r)
        };
        // Not `work::atomic`: the watch comes back with what a failed round still found.
        AtomicResponse::new(Box::pin(round.into_actor(self).map(|(watch, r), act, ctx| {
            act.watch = watch;
            let again = match &r {
                Ok(a) => {
                    tracing::debug!(
                        rows = a.rows,
                        pulled_down = a.pulled_down,
                        boundary = act.watch.boundary.map(|b| b.0),
                        "purge boundary refreshed"
                    );
                    !a.caught_up
                }
                Err(e) => {
                    tracing::warn!(error = %e, "purge boundary refresh failed; retrying next period");
                    false
                }
            };
            let after = if again { Duration::ZERO } else { act.period };
            act.next.arm(ctx, RefreshBoundary, after, false);
            r.map_err(WorkError::from)
        })))
    }
}

impl Handler<MarksConfirmed> for PurgeWatch {
    type Result = ();

    fn handle(&mut self, msg: MarksConfirmed, ctx: &mut Self::Context) {
        let after = self
            .next
            .arm_woken(ctx, RefreshBoundary, self.last_start, WAKE_GAP);
        tracing::trace!(
            rows = msg.rows,
            ?after,
            "marks confirmed: purge boundary round soon"
        );
    }
}

crate::child_actor!(PurgeWatch, Child::PurgeWatch);
