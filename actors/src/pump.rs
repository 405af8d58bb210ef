//! Pump: the single FIFO head, ever. Each `Step` runs one core group
//! ([`msgx_core::pump::PumpCore::step_group`]: the head and the ready heads behind it, one
//! commit) while the mailbox waits (`AtomicResponse`), so no second head can interleave. After
//! a group it decides when to step again: at once after progress (straight into the mailbox,
//! no timer), at the FAILED head's due time, or after `idle_poll` — and earlier when the poller
//! says W moved. No busy loop. The backlog gauges are refreshed beside the mailbox, never
//! between two groups.

use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, ActorFutureExt, AsyncContext, AtomicResponse, Context, Handler, WrapFuture};
use msgx_core::backlog;
use msgx_core::clock::SharedClock;
use msgx_core::pump::drain::DrainEstimator;
use msgx_core::pump::{Outcome, PumpCore, StepOutcome};
use msgx_core::store::StoreError;
use msgx_core::telemetry;
use opentelemetry::trace::TraceContextExt as _;
use tokio::sync::Mutex;
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::child::Child;
use crate::messages::{
    EventsQueued, RefreshBacklog, Step, TerminalCommitted, WatermarkMoved, WorkError,
};
use crate::next_run::NextRun;
use crate::wiring::Wiring;

/// Default window of the processing rate (`processing.drain_rate_window`).
pub const DEFAULT_DRAIN_WINDOW: Duration = Duration::from_secs(300);

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
    /// The store, for the backlog gauges (read without the core's lock).
    store: msgx_core::store::Store,
    /// A `Step` is already in the mailbox: an immediate re-step is not queued twice.
    step_queued: bool,
    /// The running group's span (traces on; else a disabled span).
    group_span: tracing::Span,
}

impl Pump {
    /// A pump; it starts stepping when started.
    pub fn new(core: PumpCore, clock: SharedClock, idle_poll: Duration, wiring: Wiring) -> Self {
        let store = core.store().clone();
        Self {
            store,
            step_queued: false,
            group_span: tracing::Span::none(),
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

    /// Steps after `after`; at once means straight into the mailbox (no timer: the timer
    /// wheel's millisecond granularity would cost up to 1 ms per group), and only once.
    fn schedule(&mut self, ctx: &mut Context<Self>, after: Duration) {
        if after.is_zero() {
            self.next.cancel(ctx);
            if !self.step_queued {
                self.step_queued = true;
                ctx.notify(Step);
            }
        } else {
            self.next.arm(ctx, Step, after, false);
        }
    }

    fn after_group(
        &mut self,
        result: &Result<Vec<StepOutcome>, StoreError>,
        ctx: &mut Context<Self>,
    ) {
        let delay = match result {
            Ok(steps) => {
                if let Some(traces) = msgx_core::traces::active() {
                    let group = std::mem::replace(&mut self.group_span, tracing::Span::none());
                    let members = steps
                        .iter()
                        .filter(|s| {
                            matches!(
                                s,
                                StepOutcome::Processed { .. } | StepOutcome::Poisoned { .. }
                            )
                        })
                        .count();
                    group.record("msgx.pump.members", members);
                    if members == 0 {
                        group.record("msgx.idle", true);
                    }
                    let group = group.context().span().span_context().clone();
                    crate::pump_traces::report(traces, &self.store, steps, self.clock.now(), group);
                }
                let (mut terminal, mut events) = (None, None);
                let delay = steps
                    .iter()
                    .map(|step| self.after_step(step, &mut terminal, &mut events))
                    .min()
                    .unwrap_or(self.idle_poll);
                // One wake-up per group (the newest message), not one per message.
                if let Some(msg_id) = events {
                    self.wiring.events_queued(EventsQueued { msg_id });
                }
                if let Some(msg_id) = terminal {
                    self.wiring.terminal_committed(TerminalCommitted { msg_id });
                }
                delay
            }
            Err(e) => {
                telemetry::pump_step_failed(e);
                self.idle_poll
            }
        };
        self.schedule(ctx, delay);
    }

    /// Metrics of one committed outcome and what to announce; returns when to step again.
    fn after_step(
        &mut self,
        step: &StepOutcome,
        terminal: &mut Option<i64>,
        events: &mut Option<i64>,
    ) -> Duration {
        step.event().emit();
        match step {
            StepOutcome::Processed {
                msg_id, outcome, ..
            } if outcome.is_terminal() => {
                self.finished += 1;
                if matches!(outcome, Outcome::Succeeded { events, .. } if *events > 0) {
                    *events = Some(*msg_id);
                }
                *terminal = Some(*msg_id);
            }
            StepOutcome::Poisoned { msg_id, .. } => {
                self.finished += 1;
                *terminal = Some(*msg_id);
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
}

impl Actor for Pump {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        tracing::info!("pump started");
        self.schedule(ctx, Duration::ZERO);
        ctx.run_interval(Duration::from_secs(5), |_, ctx| ctx.notify(RefreshBacklog));
    }
}

impl Handler<Step> for Pump {
    type Result = AtomicResponse<Self, Result<Vec<StepOutcome>, WorkError>>;

    fn handle(&mut self, _: Step, ctx: &mut Self::Context) -> Self::Result {
        self.next.cancel(ctx);
        self.step_queued = false;
        let core = self.core.clone();
        // With traces on, the group is a span of its own (its log lines carry its ids), and
        // each member's processing span links to it. A group that found no work is marked
        // idle and never exported (`traces::queue`): a span per idle poll would be noise.
        let span = match msgx_core::traces::active() {
            Some(_) => tracing::info_span!(
                "msgx.pump.group",
                msgx.pump.members = tracing::field::Empty,
                msgx.idle = tracing::field::Empty
            ),
            None => tracing::Span::none(),
        };
        self.group_span = span.clone();
        let step = async move { core.lock().await.step_group().await }.instrument(span);
        crate::work::atomic(self, step, |result, act, ctx| act.after_group(result, ctx))
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
    type Result = ();

    /// The one refresh of every backlog gauge (processing, marking, delivery: `backlog::read`),
    /// here because the drain estimate needs the pump's finished count. Spawned beside the
    /// mailbox (not atomic): a slow count never delays a group, and the queries run on the
    /// partial indexes.
    fn handle(&mut self, _: RefreshBacklog, ctx: &mut Self::Context) {
        let store = self.store.clone();
        let clock = self.clock.clone();
        self.drain.record(clock.now(), self.finished);
        let refresh = async move {
            let now = clock.now();
            match backlog::read(&store).await {
                Ok(b) => Some((b, now)),
                Err(e) => {
                    telemetry::pump_step_failed(&e);
                    None
                }
            }
        };
        ctx.spawn(refresh.into_actor(self).map(|read, act, _| {
            if let Some((b, now)) = read {
                b.event(now, act.drain.estimate(b.queue.unfinished)).emit();
            }
        }));
    }
}

// Stop taking work once the step in flight (if any) has finished.
crate::child_actor!(Pump, Child::Pump);
