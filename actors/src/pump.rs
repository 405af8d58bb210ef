//! Pump: the single FIFO head, ever. Each `Step` runs one core step
//! ([`msgx_core::pump::PumpCore::step`]) while the mailbox waits (`AtomicResponse`), so no
//! second head can interleave. After a step it decides when to step again: at once after
//! progress, at the FAILED head's due time, or after `idle_poll` — and earlier when the poller
//! says W moved. No busy loop.

use std::sync::Arc;
use std::time::Duration;

use actix::{
    Actor, ActorFutureExt, AsyncContext, AtomicResponse, Context, Handler, Message, WrapFuture,
};
use msgx_core::clock::SharedClock;
use msgx_core::pump::drain::DrainEstimator;
use msgx_core::pump::{Outcome, PumpCore, StepOutcome};
use msgx_core::store::StoreError;
use msgx_core::telemetry;
use tokio::sync::Mutex;

use crate::backfill_sweeper::TerminalCommitted;
use crate::dispatcher::EventsQueued;
use crate::messages::WatermarkMoved;
use crate::next_run::NextRun;
use crate::wiring::Wiring;

/// Run one pump step now (internal timer; tests may send it).
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "Result<StepOutcome, crate::messages::WorkError>")]
pub struct Step;

/// Default window of the processing rate (`processing.drain_rate_window`).
pub const DEFAULT_DRAIN_WINDOW: Duration = Duration::from_secs(300);

/// Refresh backlog metrics.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
struct RefreshBacklog;

/// The pump actor.
pub struct Pump {
    /// The core step and its read-ahead buffer (locked only by the running step).
    core: Arc<Mutex<PumpCore>>,
    /// Due times are compared on this clock.
    clock: SharedClock,
    /// Longest sleep without being woken.
    idle_poll: Duration,
    /// The pending wake-up.
    next: NextRun,
    /// Where terminal commits are announced (the backfill sweeper).
    wiring: Wiring,
    /// Messages finished (terminal) by this actor since it started.
    finished: u64,
    /// The recent processing rate, for the estimated drain time (G6).
    drain: DrainEstimator,
}

impl Pump {
    /// A pump; it starts stepping when started.
    pub fn new(core: PumpCore, clock: SharedClock, idle_poll: Duration, wiring: Wiring) -> Self {
        Self {
            core: Arc::new(Mutex::new(core)),
            clock,
            idle_poll,
            next: NextRun::default(),
            wiring,
            finished: 0,
            drain: DrainEstimator::new(DEFAULT_DRAIN_WINDOW),
        }
    }

    /// Sets the window of the processing rate behind the estimated drain time.
    pub fn with_drain_window(mut self, window: Duration) -> Self {
        self.drain = DrainEstimator::new(window);
        self
    }

    fn schedule(&mut self, ctx: &mut Context<Self>, after: Duration) {
        self.next.arm(ctx, Step, after, false);
    }

    fn after_step(&mut self, result: &Result<StepOutcome, StoreError>, ctx: &mut Context<Self>) {
        let delay = match result {
            Ok(step) => {
                telemetry::pump_step(step);
                match step {
                    StepOutcome::Processed {
                        msg_id, outcome, ..
                    } if outcome.is_terminal() => {
                        self.finished += 1;
                        if matches!(outcome, Outcome::Succeeded { events, .. } if *events > 0) {
                            self.wiring.events_queued(EventsQueued { msg_id: *msg_id });
                        }
                        self.wiring
                            .terminal_committed(TerminalCommitted { msg_id: *msg_id });
                    }
                    StepOutcome::Poisoned { msg_id, .. } => {
                        self.finished += 1;
                        self.wiring
                            .terminal_committed(TerminalCommitted { msg_id: *msg_id });
                    }
                    _ => {}
                }
                match step {
                    StepOutcome::Processed { .. } | StepOutcome::Poisoned { .. } => Duration::ZERO,
                    StepOutcome::Waiting { until, .. } => (*until - self.clock.now())
                        .to_std()
                        .unwrap_or(Duration::ZERO)
                        .min(self.idle_poll),
                    StepOutcome::Idle => self.idle_poll,
                }
            }
            Err(e) => {
                telemetry::pump_step_failed(e);
                self.idle_poll
            }
        };
        self.schedule(ctx, delay);
    }
}

impl Actor for Pump {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        tracing::info!("pump started");
        ctx.notify(Step);
        ctx.run_interval(Duration::from_secs(5), |_, ctx| ctx.notify(RefreshBacklog));
    }
}

impl Handler<Step> for Pump {
    type Result = AtomicResponse<Self, Result<StepOutcome, crate::messages::WorkError>>;

    fn handle(&mut self, _: Step, ctx: &mut Self::Context) -> Self::Result {
        self.next.cancel(ctx);
        let core = self.core.clone();
        let step = async move { core.lock().await.step().await };
        AtomicResponse::new(Box::pin(step.into_actor(self).map(|result, act, ctx| {
            act.after_step(&result, ctx);
            result.map_err(crate::messages::WorkError::from)
        })))
    }
}

impl Handler<WatermarkMoved> for Pump {
    type Result = ();

    fn handle(&mut self, _: WatermarkMoved, ctx: &mut Self::Context) {
        // New rows ≤ W: look for the head now instead of at the next idle poll.
        self.schedule(ctx, Duration::ZERO);
    }
}

impl Handler<RefreshBacklog> for Pump {
    type Result = AtomicResponse<Self, ()>;

    fn handle(&mut self, _: RefreshBacklog, _: &mut Self::Context) -> Self::Result {
        let core = self.core.clone();
        let clock = self.clock.clone();
        self.drain.record(clock.now(), self.finished);
        let refresh = async move {
            let store = core.lock().await.store().clone();
            match store.backlog().await {
                Ok(b) => {
                    let age = b.oldest.and_then(|t| (clock.now() - t).to_std().ok());
                    telemetry::backlog(b.unfinished, age);
                    Some(b.unfinished)
                }
                Err(e) => {
                    telemetry::pump_step_failed(&e);
                    None
                }
            }
        };
        AtomicResponse::new(Box::pin(refresh.into_actor(self).map(
            |unfinished, act, _| {
                if let Some(n) = unfinished {
                    telemetry::drain_estimate(act.drain.estimate(n));
                }
            },
        )))
    }
}

// Stop taking work once the step in flight (if any) has finished.
crate::stop_on_shutdown!(Pump, "pump");
