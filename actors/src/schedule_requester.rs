//! ScheduleRequester (seed §7): asks upstream for the day's schedule once a day at
//! `outbound.schedule_request_at` (airport local time). Each step is one
//! [`msgx_core::outbound::daily_step`]: reconcile REGISTERED leftovers, then — if the local
//! time has passed and today's daily request does not exist in `REQ_TRACK` — register, write
//! and confirm it. "Is it time" reads the injected clock; "once a day" is the unique
//! `(kind, date)` of the daily request in `REQ_TRACK`, so a restart the same day never asks
//! twice. The actor only decides when to step: at start (which also reconciles leftovers), at
//! the next daily time, and at least every `check_every` (leftovers of failed inserts, clock
//! jumps). Steps never overlap (`AtomicResponse`).

use std::time::Duration;

use actix::{Actor, AsyncContext, AtomicResponse, Context, Handler};
use msgx_core::clock::SharedClock;
use msgx_core::outbound::{daily_step, DailyOutcome, DailyReport, Outbound, OutboundError};
use msgx_core::telemetry;

use crate::child::Child;
use crate::messages::{RequestTick, WorkError};
use crate::next_run::NextRun;

/// Longest pause between two steps.
pub const DEFAULT_CHECK_EVERY: Duration = Duration::from_secs(60);
/// Shortest pause between two steps (the clock may stand still in tests).
const MIN_PAUSE: Duration = Duration::from_secs(1);

/// The schedule requester actor.
pub struct ScheduleRequester {
    /// REQ_TRACK, COUTMSGS, sender, zone, daily time.
    outbound: Outbound,
    /// "Is it time".
    clock: SharedClock,
    /// Longest pause between steps.
    check_every: Duration,
    /// The pending timer.
    next: NextRun,
}

impl ScheduleRequester {
    /// A requester that steps at least every `check_every` (the service uses
    /// [`DEFAULT_CHECK_EVERY`]); it steps once as soon as it is started.
    pub fn new(outbound: Outbound, clock: SharedClock, check_every: Duration) -> Self {
        Self {
            outbound,
            clock,
            check_every,
            next: NextRun::default(),
        }
    }

    fn after_step(&mut self, result: &Result<DailyReport, OutboundError>, ctx: &mut Context<Self>) {
        let mut pause = self.check_every;
        match result {
            Ok(report) => {
                match &report.outcome {
                    DailyOutcome::Requested(sent) => tracing::info!(
                        rqid = %sent.rqid, out_id = sent.out_id, date = %sent.target_date,
                        "daily schedule request sent"
                    ),
                    DailyOutcome::AlreadyRequested { date, rqid, state } => tracing::debug!(
                        %date, rqid = %rqid, state = %state, "daily schedule request exists"
                    ),
                    DailyOutcome::NotYet | DailyOutcome::Off => {}
                }
                if let Some(next) = report.next_run {
                    let until = (next - self.clock.now()).to_std().unwrap_or(Duration::ZERO);
                    pause = pause.min(until);
                }
            }
            // Already counted and logged with its request by the insert path.
            Err(e @ OutboundError::NotDelivered { .. }) => {
                tracing::warn!(error = %e, "schedule requester step: insert failed")
            }
            Err(e) => telemetry::outbound_failed(telemetry::OUTBOUND_STAGE_STEP, None, e),
        }
        self.next.arm(ctx, RequestTick, pause.max(MIN_PAUSE), false);
    }
}

impl Actor for ScheduleRequester {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        tracing::info!(
            at = ?self.outbound.cfg.daily_at.map(|t| t.format("%H:%M").to_string()),
            zone = %self.outbound.cfg.tz,
            "schedule requester started"
        );
        // The first step reconciles REGISTERED leftovers of a crash before anything else.
        ctx.notify(RequestTick);
    }
}

impl Handler<RequestTick> for ScheduleRequester {
    type Result = AtomicResponse<Self, Result<DailyReport, WorkError>>;

    fn handle(&mut self, _: RequestTick, ctx: &mut Self::Context) -> Self::Result {
        self.next.cancel(ctx);
        let (outbound, clock) = (self.outbound.clone(), self.clock.clone());
        let step = async move { daily_step(&outbound, clock.now()).await };
        crate::work::atomic(self, step, |result, act, ctx| act.after_step(result, ctx))
    }
}

// Stop taking work once the step in flight (if any) has finished.
crate::child_actor!(ScheduleRequester, Child::ScheduleRequester);
