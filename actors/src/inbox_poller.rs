//! InboxPoller: runs one discovery round ([`msgx_core::poller::poll_once`]) at a time and
//! decides only when to run the next: at once while batches come back full or a hole was
//! released, else after `poll_interval`. Rounds never overlap (the mailbox waits on each).

use std::time::Duration;

use actix::{Actor, AsyncContext, AtomicResponse, Context, Handler};
use msgx_core::clock::SharedClock;
use msgx_core::inbox::Inbox;
use msgx_core::poller::{poll_once, PollConfig, PollError, PollReport};
use msgx_core::store::Store;
use msgx_core::telemetry;

use crate::child::Child;
use crate::health::Health;
use crate::messages::{HolesReleased, PollNow, RoundSummary, WatermarkMoved, WorkError};
use crate::next_run::NextRun;
use crate::wiring::Wiring;

/// The discovery actor.
pub struct InboxPoller {
    /// Shared inbox (read only here).
    inbox: Inbox,
    /// Own PostgreSQL: cursor and queue.
    store: Store,
    /// Hole aging reads time here.
    clock: SharedClock,
    /// Batch size, hole delay, commit mode.
    cfg: PollConfig,
    /// Pause after a round that was not full.
    poll_interval: Duration,
    /// Where to report moves and releases.
    wiring: Wiring,
    /// Readiness for `/readyz`.
    health: Health,
    /// The pending timer, cancelled when a round is asked for early.
    next: NextRun,
    /// W after the last good round, only for logs (PostgreSQL holds the truth).
    last_w: Option<i64>,
    /// When a round last read pages ahead (`pipeline.hole_sight_ahead`). A full window re-polls
    /// at once; while W waits at a hole those back-to-back rounds read one page, and the pages
    /// ahead are read again at most once per `poll_interval`.
    last_read_ahead: Option<std::time::Instant>,
}

impl InboxPoller {
    /// A poller; it starts polling as soon as it is started.
    pub fn new(
        inbox: Inbox,
        store: Store,
        clock: SharedClock,
        cfg: PollConfig,
        poll_interval: Duration,
        wiring: Wiring,
        health: Health,
    ) -> Self {
        Self {
            inbox,
            store,
            clock,
            cfg,
            poll_interval,
            wiring,
            health,
            next: NextRun::default(),
            last_w: None,
            last_read_ahead: None,
        }
    }

    fn after_round(&mut self, result: &Result<PollReport, PollError>, ctx: &mut Context<Self>) {
        let again_now = match result {
            Ok(report) => {
                report.event().emit();
                self.health.poll_ok();
                self.last_w = Some(report.advance.w);
                if report.moved() {
                    self.wiring.watermark_moved(WatermarkMoved {
                        w: report.advance.w,
                    });
                }
                for r in &report.advance.released {
                    self.wiring.holes_released(HolesReleased {
                        first: r.first,
                        last: r.last,
                        at: self.clock.now(),
                    });
                }
                report.poll_again_now()
            }
            Err(e) => {
                telemetry::poll_failed(e.stage(), e, self.last_w);
                self.health.poll_failed(e.to_string());
                false
            }
        };
        // At once when more is waiting; else after the poll interval — or sooner, when the hole
        // W waits at comes due before that.
        // (A hole already due but not released is held by evidence: the interval, no spin.)
        let due = result
            .as_ref()
            .ok()
            .and_then(|r| r.next_due)
            .filter(|d| !d.is_zero());
        let delay = if again_now {
            Duration::ZERO
        } else {
            due.map_or(self.poll_interval, |d| d.min(self.poll_interval))
        };
        self.next.arm(ctx, PollNow, delay, false);
    }
}

impl Actor for InboxPoller {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        tracing::info!(
            claim_batch = self.cfg.claim_batch,
            max_commit_delay = ?self.cfg.max_commit_delay,
            poll_interval = ?self.poll_interval,
            "inbox poller started"
        );
        ctx.notify(PollNow);
    }
}

impl Handler<PollNow> for InboxPoller {
    type Result = AtomicResponse<Self, Result<RoundSummary, WorkError>>;

    fn handle(&mut self, _: PollNow, ctx: &mut Self::Context) -> Self::Result {
        self.next.cancel(ctx);
        let ahead_due = self
            .last_read_ahead
            .is_none_or(|t| t.elapsed() >= self.poll_interval);
        let cfg = PollConfig {
            sight_ahead: if ahead_due { self.cfg.sight_ahead } else { 1 },
            ..self.cfg
        };
        let page = cfg.claim_batch.max(1) as usize;
        let (inbox, store, clock) = (self.inbox.clone(), self.store.clone(), self.clock.clone());
        let round = async move { poll_once(&inbox, &store, clock.as_ref(), cfg).await };
        crate::work::atomic(self, round, move |result, act, ctx| {
            if result.as_ref().is_ok_and(|r| r.read > page) {
                act.last_read_ahead = Some(std::time::Instant::now());
            }
            act.after_round(result, ctx);
        })
    }
}

// Stop taking work once the step in flight (if any) has finished.
crate::child_actor!(InboxPoller, Child::InboxPoller);
