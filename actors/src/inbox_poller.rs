//! InboxPoller: runs one discovery round ([`msgx_core::poller::poll_once`]) at a time and
//! decides only when to run the next ([`Pace`]): at once while batches come back full or a hole
//! was released, `min_poll_gap` after the start of a round that found rows, and backing off to
//! `poll_interval` while rounds come back empty. Rounds never overlap (the mailbox waits on
//! each).

use std::time::Duration;

use actix::{Actor, AsyncContext, AtomicResponse, Context, Handler};
use chrono::{DateTime, Utc};
use msgx_core::clock::SharedClock;
use msgx_core::inbox::Inbox;
use msgx_core::poller::{poll_once, Pace, PollConfig, PollError, PollReport};
use msgx_core::store::Store;
use msgx_core::telemetry;

use crate::child::Child;
use crate::health::Health;
use crate::messages::{HolesReleased, PollNow, RoundSummary, WatermarkMoved, WorkError};
use crate::next_run::NextRun;
use crate::wiring::Wiring;
use crate::work::Handles;

/// The discovery actor.
pub struct InboxPoller {
    /// Shared inbox (read only here), own PostgreSQL (cursor and queue), and the clock hole
    /// aging reads.
    on: Handles,
    /// Batch size, hole delay, commit mode.
    cfg: PollConfig,
    /// The idle pace (for the start-up log).
    poll_interval: Duration,
    /// When the next round starts, and whether it may read pages ahead.
    pace: Pace,
    /// Where to report moves and releases.
    wiring: Wiring,
    /// Readiness for `/readyz`.
    health: Health,
    /// The pending timer, cancelled when a round is asked for early.
    next: NextRun,
    /// W after the last good round, only for logs (PostgreSQL holds the truth).
    last_w: Option<i64>,
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
            on: Handles::new(inbox, store, clock),
            cfg,
            poll_interval,
            pace: Pace::new(cfg.min_gap, poll_interval),
            wiring,
            health,
            next: NextRun::default(),
            last_w: None,
        }
    }

    fn after_round(
        &mut self,
        result: &Result<PollReport, PollError>,
        started: DateTime<Utc>,
        ctx: &mut Context<Self>,
    ) {
        match result {
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
                        at: self.on.clock.now(),
                    });
                }
            }
            Err(e) => {
                telemetry::poll_failed(e.stage(), e, self.last_w);
                self.health.poll_failed(e.stage());
            }
        }
        let delay = self
            .pace
            .after_round(result.as_ref().ok(), started, self.on.clock.now());
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
            min_poll_gap = ?self.cfg.min_gap,
            "inbox poller started"
        );
        ctx.notify(PollNow);
    }
}

impl Handler<PollNow> for InboxPoller {
    type Result = AtomicResponse<Self, Result<RoundSummary, WorkError>>;

    fn handle(&mut self, _: PollNow, ctx: &mut Self::Context) -> Self::Result {
        self.next.cancel(ctx);
        let started = self.on.clock.now();
        let cfg = PollConfig {
            sight_ahead: match self.pace.may_read_ahead(started) {
                true => self.cfg.sight_ahead,
                false => 1,
            },
            probe_head: self.pace.probe_head(),
            ..self.cfg
        };
        let page = cfg.claim_batch.max(1) as usize;
        let on = self.on.clone();
        let round = async move { poll_once(&on.inbox, &on.store, on.clock.as_ref(), cfg).await };
        crate::work::atomic(self, round, move |result, act, ctx| {
            if result.as_ref().is_ok_and(|r| r.read > page) {
                act.pace.read_ahead(started);
            }
            act.after_round(result, started, ctx);
        })
    }
}

// Stop taking work once the step in flight (if any) has finished.
crate::child_actor!(InboxPoller, Child::InboxPoller);
