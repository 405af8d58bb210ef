//! BackfillSweeper: runs one sweep ([`msgx_core::backfill::sweep_once`]) at a time and decides
//! only when to run the next: every `backfill.period` (a schedule, not a deadline), at once
//! while full batches drain a backlog, and early — at most once per `wake_gap` — when the pump
//! says a row became terminal ([`TerminalCommitted`]). Sweeps never overlap (the mailbox waits
//! on each). The sweep itself reports to telemetry; a sweep that confirmed marks tells the purge
//! watch ([`MarksConfirmed`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::child::Child;
use crate::messages::{MarksConfirmed, SweepNow, TerminalCommitted, WorkError};
use crate::next_run::NextRun;
use crate::wiring::Wiring;
use crate::work::Handles;
use actix::{Actor, AtomicResponse, Context, Handler};
use msgx_core::backfill::rules::sweep_again_now;
use msgx_core::backfill::{sweep_once, SweepConfig, SweepReport};
use msgx_core::clock::SharedClock;
use msgx_core::inbox::Inbox;
use msgx_core::store::{Store, StoreError};

/// Default shortest gap between a sweep's start and a sweep woken by [`TerminalCommitted`]:
/// at 500 terminal rows/s that is one batch of ~500 per sweep instead of one sweep per row.
pub const DEFAULT_WAKE_GAP: Duration = Duration::from_secs(1);

/// The backfill actor.
pub struct BackfillSweeper {
    on: Handles,
    cfg: Arc<SweepConfig>,
    /// The schedule.
    period: Duration,
    /// Shortest gap from a sweep's start to a woken sweep.
    wake_gap: Duration,
    /// The pending timer and when it fires.
    next: NextRun,
    /// Start of the last sweep.
    last_start: Option<Instant>,
    /// The same on the clock: the start of its mark spans (traces on).
    sweep_started: Option<chrono::DateTime<chrono::Utc>>,
    /// Who hears of confirmed marks (the purge watch; none unless wired).
    wiring: Wiring,
}

impl BackfillSweeper {
    /// A sweeper; it sweeps once when started, then every `period`.
    pub fn new(
        inbox: Inbox,
        store: Store,
        clock: SharedClock,
        cfg: SweepConfig,
        period: Duration,
    ) -> Self {
        Self {
            on: Handles::new(inbox, store, clock),
            cfg: Arc::new(cfg),
            period,
            wake_gap: DEFAULT_WAKE_GAP.min(period),
            next: NextRun::default(),
            last_start: None,
            sweep_started: None,
            wiring: Wiring::default(),
        }
    }

    /// Tells `wiring`'s confirmed-marks receivers after each sweep that confirmed marks.
    pub fn with_wiring(mut self, wiring: Wiring) -> Self {
        self.wiring = wiring;
        self
    }

    /// Sets the shortest gap between a sweep and a sweep woken by [`TerminalCommitted`].
    pub fn with_wake_gap(mut self, gap: Duration) -> Self {
        self.wake_gap = gap;
        self
    }

    /// (Re)arms the timer to fire after `after`, unless it already fires sooner.
    fn schedule(&mut self, ctx: &mut Context<Self>, after: Duration, only_if_sooner: bool) {
        self.next.arm(ctx, SweepNow, after, only_if_sooner);
    }

    fn after_sweep(&mut self, result: &Result<SweepReport, StoreError>, ctx: &mut Context<Self>) {
        if let (Ok(r), Some(traces)) = (result, msgx_core::traces::active()) {
            let ended = self.on.clock.now();
            let started = self.sweep_started.unwrap_or(ended);
            crate::mark_traces::report(traces, &self.on.store, r, started, ended);
        }
        if let Ok(r) = result {
            if !r.confirmed.is_empty() {
                let rows = r.confirmed.len();
                self.wiring.marks_confirmed(MarksConfirmed { rows });
            }
        }
        let delay = match result {
            Ok(r)
                if sweep_again_now(r.selected, self.cfg.batch, r.transient() + r.locked.len()) =>
            {
                Duration::ZERO
            }
            Ok(_) => self.period,
            Err(e) => {
                tracing::error!(error = %e, "backfill sweep failed on the store; retrying at the next period");
                self.period
            }
        };
        // Wakes that arrived during the sweep wait in the mailbox (AtomicResponse) and arm a
        // sooner timer right after this one.
        self.schedule(ctx, delay, false);
    }
}

impl Actor for BackfillSweeper {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        tracing::info!(period = ?self.period, batch = self.cfg.batch, "backfill sweeper started");
        self.schedule(ctx, Duration::ZERO, false);
    }
}

impl Handler<SweepNow> for BackfillSweeper {
    type Result = AtomicResponse<Self, Result<SweepReport, WorkError>>;

    fn handle(&mut self, _: SweepNow, ctx: &mut Self::Context) -> Self::Result {
        self.next.cancel(ctx);
        self.last_start = Some(Instant::now());
        self.sweep_started = Some(self.on.clock.now());
        let (on, cfg) = (self.on.clone(), self.cfg.clone());
        let sweep = async move { sweep_once(&on.inbox, &on.store, on.clock.as_ref(), &cfg).await };
        crate::work::atomic(self, sweep, |result, act, ctx| act.after_sweep(result, ctx))
    }
}

impl Handler<TerminalCommitted> for BackfillSweeper {
    type Result = ();

    fn handle(&mut self, _: TerminalCommitted, ctx: &mut Self::Context) {
        self.next
            .arm_woken(ctx, SweepNow, self.last_start, self.wake_gap);
    }
}

// Stop taking work once the step in flight (if any) has finished.
crate::child_actor!(BackfillSweeper, Child::BackfillSweeper);
