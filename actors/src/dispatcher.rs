//! Dispatcher: runs one dispatch round ([`msgx_core::dispatch::dispatch_once`]) at a time and
//! decides only when the next one runs: at once while rounds come back full, when the pump
//! says it committed events ([`EventsQueued`]), at the next retry time of a backing-off event,
//! and otherwise every `dispatch.idle_poll` (a safety net; no busy loop). Rounds never overlap
//! (the mailbox waits on each), so one key's events are never in two rounds at once. A round
//! writes the previous round's outcome while it sends, so after a round that sent something
//! one more round follows at once to write it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::next_run::NextRun;
use actix::{
    Actor, ActorFutureExt, AsyncContext, AtomicResponse, Context, Handler, Message, WrapFuture,
};
use msgx_core::clock::SharedClock;
use msgx_core::dispatch::{dispatch_once, DispatchConfig, DispatchState, RoundReport};
use msgx_core::kafka::EventProducer;
use msgx_core::store::Store;
use msgx_core::telemetry;

/// How often the backlog gauges are refreshed (the count scans the pending index).
const BACKLOG_EVERY: Duration = Duration::from_secs(5);

pub use crate::messages::EventsQueued;

/// Run one round now (the actor's own timer sends it; tests may).
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "Result<RoundSummary, crate::messages::WorkError>")]
pub struct DispatchNow;

/// What a round did, for whoever asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RoundSummary {
    /// Events read.
    pub selected: usize,
    /// Acknowledged by the broker.
    pub acked: usize,
    /// Marked SENT (the previous round's acks).
    pub sent: u64,
    /// Failed sends.
    pub failed: usize,
    /// Marked DEAD (after the DLQ copy).
    pub dead: u64,
}

impl From<&RoundReport> for RoundSummary {
    fn from(r: &RoundReport) -> Self {
        Self {
            selected: r.selected,
            acked: r.acked,
            sent: r.sent,
            failed: r.failed + r.dlq_failed,
            dead: r.dead,
        }
    }
}

/// The dispatcher actor.
pub struct Dispatcher {
    store: Store,
    clock: SharedClock,
    cfg: Arc<DispatchConfig>,
    /// Out of the actor while a round runs (the round owns it, then hands it back), with the
    /// outcome the last round has not written yet.
    producer: Option<(EventProducer, DispatchState)>,
    /// The safety-net period.
    idle_poll: Duration,
    /// The pending timer and when it fires.
    next: NextRun,
    /// Last backlog refresh.
    backlog_at: Option<Instant>,
}

impl Dispatcher {
    /// A dispatcher; it runs a round when started.
    pub fn new(
        store: Store,
        clock: SharedClock,
        producer: EventProducer,
        cfg: DispatchConfig,
        idle_poll: Duration,
    ) -> Self {
        Self {
            store,
            clock,
            cfg: Arc::new(cfg),
            producer: Some((producer, DispatchState::default())),
            idle_poll,
            next: NextRun::default(),
            backlog_at: None,
        }
    }

    /// (Re)arms the timer to fire after `after`, unless it already fires sooner.
    fn schedule(&mut self, ctx: &mut Context<Self>, after: Duration, only_if_sooner: bool) {
        self.next.arm(ctx, DispatchNow, after, only_if_sooner);
    }

    /// At most every [`BACKLOG_EVERY`], wakes for a retry due before the safety-net poll (the
    /// backlog gauges come from the pump's one refresh of every backlog).
    fn wake_for_retry(&mut self, ctx: &mut Context<Self>) {
        if self.backlog_at.is_some_and(|t| t.elapsed() < BACKLOG_EVERY) {
            return;
        }
        self.backlog_at = Some(Instant::now());
        let (store, clock) = (self.store.clone(), self.clock.clone());
        let idle = self.idle_poll;
        let fut = async move {
            let now = clock.now();
            match store.next_event_retry(now).await {
                Ok(next) => next.and_then(|t| (t - now).to_std().ok()),
                Err(e) => {
                    tracing::warn!(error = %e, "dispatch next-retry query failed");
                    None
                }
            }
        };
        ctx.spawn(fut.into_actor(self).map(move |next_retry, act, ctx| {
            // A retry due before the safety net: wake for it.
            if let Some(d) = next_retry.filter(|d| *d < idle) {
                act.schedule(ctx, d, true);
            }
        }));
    }
}

impl Actor for Dispatcher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        tracing::info!(topic = %self.cfg.topic, batch = self.cfg.batch, "dispatcher started");
        self.schedule(ctx, Duration::ZERO, false);
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        if let Some((p, _)) = &self.producer {
            // Acked-but-unmarked events are re-sent by the next instance; this only shortens
            // the window.
            let _ = p.flush(Duration::from_secs(2));
        }
    }
}

impl Handler<DispatchNow> for Dispatcher {
    type Result = AtomicResponse<Self, Result<RoundSummary, crate::messages::WorkError>>;

    fn handle(&mut self, _: DispatchNow, ctx: &mut Self::Context) -> Self::Result {
        self.next.cancel(ctx);
        let Some((mut producer, mut state)) = self.producer.take() else {
            // Only possible if a round panicked mid-way; the supervisor rebuilds us.
            return AtomicResponse::new(Box::pin(actix::fut::ready(Err(
                crate::messages::WorkError::ProducerUnavailable,
            ))));
        };
        let (store, clock, cfg) = (self.store.clone(), self.clock.clone(), self.cfg.clone());
        let round = async move {
            let result =
                dispatch_once(&store, &mut producer, clock.as_ref(), &cfg, &mut state).await;
            (result, producer, state)
        };
        AtomicResponse::new(Box::pin(round.into_actor(self).map(
            |(result, producer, state), act, ctx| {
                // An outcome not yet written is written by the next round: run it now.
                let carried = state.has_unrecorded();
                act.producer = Some((producer, state));
                let delay = match &result {
                    Ok(r) => {
                        r.event().emit();
                        if r.full || carried || r.producer_recreated.is_some() {
                            Duration::ZERO
                        } else {
                            act.idle_poll
                        }
                    }
                    Err(e) => {
                        telemetry::dispatch_failed(e);
                        act.idle_poll
                    }
                };
                act.schedule(ctx, delay, false);
                act.wake_for_retry(ctx);
                result
                    .map(|r| RoundSummary::from(&r))
                    .map_err(crate::messages::WorkError::from)
            },
        )))
    }
}

impl Handler<EventsQueued> for Dispatcher {
    type Result = ();

    fn handle(&mut self, _: EventsQueued, ctx: &mut Self::Context) {
        // Immediately: latency from commit to ack is what this wake-up is for. Wakes during a
        // round wait in the mailbox and arm one round right after it.
        self.schedule(ctx, Duration::ZERO, true);
    }
}

impl Handler<crate::messages::Shutdown> for Dispatcher {
    type Result = AtomicResponse<Self, Result<(), crate::messages::ShutdownError>>;

    /// Handled after the round in flight (atomic): waits for the acknowledgements still on
    /// their way, writes SENT/DEAD/failures the last round carries, then stops — so a deploy
    /// does not re-send what the broker already acknowledged.
    fn handle(&mut self, _: crate::messages::Shutdown, ctx: &mut Self::Context) -> Self::Result {
        self.next.cancel(ctx);
        let store = self.store.clone();
        let carried = self.producer.take();
        let finish = async move {
            let Some((producer, mut state)) = carried else {
                return Ok(());
            };
            // Nothing of ours is queued in librdkafka after a round; this only drains stragglers.
            let _ = producer.flush(Duration::from_secs(2));
            let written = msgx_core::dispatch::flush(&store, &mut state).await;
            match written {
                Ok((sent, dead)) => {
                    tracing::info!(sent, dead, "dispatcher wrote its last outcome");
                    Ok(())
                }
                Err(source) => Err(crate::messages::ShutdownError::Store {
                    actor: "dispatcher",
                    source,
                }),
            }
        };
        AtomicResponse::new(Box::pin(finish.into_actor(self).map(|result, _, ctx| {
            crate::shutdown::stop(ctx, &mut NextRun::default(), "dispatcher");
            result
        })))
    }
}
