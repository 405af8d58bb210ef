//! LateDetector (SPEC §6, G1): runs one detection round ([`msgx_core::late::detect_once`]) at
//! a time and decides only when to run the next: at start (a restarted detector resumes the
//! durable watch list at once), every `late.detect_period`, and at once when the poller says
//! it released a hole (`HolesReleased` is only a wake-up: the poller already wrote the ids to
//! `late_watch_range` in the transaction that moved W). Rounds never overlap (`AtomicResponse`).
//!
//! It also runs the compensation scan ([`msgx_core::late::compensation_scan`]) every
//! `late.compensation_period` (`ScanNow`, its own timer; 0-sized window = off): rows at or
//! below W that discovery never saw are enqueued LATE.

use std::time::Duration;

use actix::{Actor, AsyncContext, AtomicResponse, Context, Handler};
use msgx_core::clock::SharedClock;
use msgx_core::inbox::Inbox;
use msgx_core::late::{
    compensation_scan, detect_once, DetectConfig, DetectError, DetectReport, ScanReport,
};
use msgx_core::store::Store;
use msgx_core::telemetry;

use crate::child::Child;
use crate::messages::{DetectNow, HolesReleased, ScanNow, WorkError};
use crate::next_run::NextRun;
use crate::work::Handles;

/// The late detector actor.
pub struct LateDetector {
    /// Shared inbox (one id check per batch), own PostgreSQL (the watch list and the queue),
    /// detection and expiry time.
    on: Handles,
    /// Batch size, inbox names, statement timeout.
    cfg: DetectConfig,
    /// Pause between rounds (`late.detect_period`).
    period: Duration,
    /// The pending timer, cancelled when a round is asked for early.
    next: NextRun,
    /// The compensation scan's timer.
    next_scan: NextRun,
}

impl LateDetector {
    /// A detector; it runs a first round as soon as it is started.
    pub fn new(
        inbox: Inbox,
        store: Store,
        clock: SharedClock,
        cfg: DetectConfig,
        period: Duration,
    ) -> Self {
        Self {
            on: Handles::new(inbox, store, clock),
            cfg,
            period,
            next: NextRun::default(),
            next_scan: NextRun::default(),
        }
    }

    fn after_round(&mut self, result: &Result<DetectReport, DetectError>, ctx: &mut Context<Self>) {
        match result {
            Ok(r) => {
                if !r.detected.is_empty() || !r.closed.is_empty() {
                    tracing::info!(
                        checked = r.checked,
                        detected = r.detected.len(),
                        closed = r.closed.len(),
                        open = r.open,
                        took_ms = r.took.as_millis() as u64,
                        "late detection round"
                    );
                } else {
                    tracing::debug!(checked = r.checked, open = r.open, "late detection round");
                }
            }
            // Nothing of the failed batch was written: the watch is intact, retried next period.
            Err(e) => tracing::error!(
                error = %e,
                "late detection round failed; watched ids kept, retrying next period"
            ),
        }
        self.next.arm(ctx, DetectNow, self.period, false);
    }
}

impl Actor for LateDetector {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        tracing::info!(
            period = ?self.period,
            batch = self.cfg.batch,
            "late detector started"
        );
        ctx.notify(DetectNow);
        if self.cfg.compensation_window > 0 {
            ctx.notify(ScanNow);
        }
    }
}

impl Handler<ScanNow> for LateDetector {
    type Result = AtomicResponse<Self, Result<ScanReport, WorkError>>;

    fn handle(&mut self, _: ScanNow, ctx: &mut Self::Context) -> Self::Result {
        self.next_scan.cancel(ctx);
        let on = self.on.clone();
        let cfg = self.cfg.scan();
        let scan =
            async move { compensation_scan(&on.inbox, &on.store, on.clock.as_ref(), &cfg).await };
        crate::work::atomic(self, scan, |result, act, ctx| {
            if let Err(e) = result {
                tracing::error!(error = %e, "compensation scan failed; retrying next period");
            }
            if act.cfg.compensation_window > 0 {
                let period = act.cfg.compensation_period;
                act.next_scan.arm(ctx, ScanNow, period, false);
            }
        })
    }
}

impl Handler<DetectNow> for LateDetector {
    type Result = AtomicResponse<Self, Result<DetectReport, WorkError>>;

    fn handle(&mut self, _: DetectNow, ctx: &mut Self::Context) -> Self::Result {
        self.next.cancel(ctx);
        let (on, cfg) = (self.on.clone(), self.cfg.clone());
        let round = async move { detect_once(&on.inbox, &on.store, on.clock.as_ref(), &cfg).await };
        crate::work::atomic(self, round, |result, act, ctx| act.after_round(result, ctx))
    }
}

impl Handler<HolesReleased> for LateDetector {
    type Result = ();

    fn handle(&mut self, msg: HolesReleased, ctx: &mut Self::Context) {
        telemetry::late_watch_received(msg.first, msg.last);
        // A wake-up only: refresh the watch (and its size gauge) now instead of next period.
        self.next.cancel(ctx);
        ctx.notify(DetectNow);
    }
}

// Stop taking work once the step in flight (if any) has finished.
crate::child_actor!(LateDetector, Child::LateDetector);
