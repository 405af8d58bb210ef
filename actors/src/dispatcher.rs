//! Dispatcher: runs one dispatch round ([`msgx_core::dispatch::dispatch_once`]) at a time and
//! decides only when the next one runs: at once while rounds come back full, when the pump
//! says it committed events ([`EventsQueued`]), at the next retry time of a backing-off event,
//! and otherwise every `dispatch.idle_poll` (a safety net; no busy loop). Rounds never overlap
//! (the mailbox waits on each), so one key's events are never in two rounds at once. A round
//! writes the previous round's outcome while it sends, so after a round that sent something
//! one more round follows at once to write it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::child::Child;
use crate::messages::{
    DispatchNow, DispatchSummary, EventsQueued, Shutdown, ShutdownError, WorkError,
};
use crate::next_run::NextRun;
use crate::supervisor::Supervised;
use actix::{Actor, ActorFutureExt, AsyncContext, AtomicResponse, Context, Handler, WrapFuture};
use msgx_core::clock::SharedClock;
use msgx_core::dispatch::{dispatch_once, DispatchConfig, DispatchState};
use msgx_core::kafka::EventProducer;
use msgx_core::store::Store;
use msgx_core::telemetry;

/// How often, at most, the next retry time is read (one query on the backing-off events).
const RETRY_CHECK_EVERY: Duration = Duration::from_secs(5);

/// The longest wait for librdkafka's stragglers at shutdown (after a round nothing of ours is
/// queued there); never past the shutdown deadline.
const SHUTDOWN_FLUSH_MAX: Duration = Duration::from_secs(2);

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
    /// When the next retry time was last read.
    retry_checked_at: Option<Instant>,
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
            retry_checked_at: None,
        }
    }

    /// (Re)arms the timer to fire after `after`, unless it already fires sooner.
    fn schedule(&mut self, ctx: &mut Context<Self>, after: Duration, only_if_sooner: bool) {
        self.next.arm(ctx, DispatchNow, after, only_if_sooner);
    }

    /// At most every [`RETRY_CHECK_EVERY`], wakes for a retry due before the safety-net poll
    /// (the backlog gauges come from the pump's one refresh of every backlog).
    fn wake_for_retry(&mut self, ctx: &mut Context<Self>) {
        if self
            .retry_checked_at
            .is_some_and(|t| t.elapsed() < RETRY_CHECK_EVERY)
        {
            return;
        }
        self.retry_checked_at = Some(Instant::now());
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
    type Result = AtomicResponse<Self, Result<DispatchSummary, WorkError>>;

    fn handle(&mut self, _: DispatchNow, ctx: &mut Self::Context) -> Self::Result {
        self.next.cancel(ctx);
        let Some((mut producer, mut state)) = self.producer.take() else {
            // Only possible if a round panicked mid-way; the supervisor rebuilds us.
            return AtomicResponse::new(Box::pin(actix::fut::ready(Err(
                WorkError::ProducerUnavailable,
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
                result.map(DispatchSummary::from).map_err(WorkError::from)
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

impl Supervised for Dispatcher {
    const CHILD: Child = Child::Dispatcher;
}

impl Handler<Shutdown> for Dispatcher {
    type Result = AtomicResponse<Self, Result<(), ShutdownError>>;

    /// Handled after the round in flight (atomic): waits for the acknowledgements still on
    /// their way, writes SENT/DEAD/failures the last round carries, then stops — so a deploy
    /// does not re-send what the broker already acknowledged. Both within `deadline`: what is
    /// not written by then is re-sent by the next instance.
    fn handle(&mut self, msg: Shutdown, ctx: &mut Self::Context) -> Self::Result {
        self.next.cancel(ctx);
        let store = self.store.clone();
        let carried = self.producer.take();
        let actor = Self::CHILD.name();
        let finish = async move {
            let Some((producer, mut state)) = carried else {
                return Ok(());
            };
            // Nothing of ours is queued in librdkafka after a round; this only drains stragglers.
            let left = msg.deadline.saturating_duration_since(Instant::now());
            let _ = producer.flush(left.min(SHUTDOWN_FLUSH_MAX));
            let left = msg.deadline.saturating_duration_since(Instant::now());
            let written =
                tokio::time::timeout(left, msgx_core::dispatch::flush(&store, &mut state));
            match written.await {
                Ok(Ok((sent, dead))) => {
                    tracing::info!(sent, dead, "dispatcher wrote its last outcome");
                    Ok(())
                }
                Ok(Err(source)) => Err(ShutdownError::Store { actor, source }),
                Err(_) => Err(ShutdownError::Deadline { actor }),
            }
        };
        AtomicResponse::new(Box::pin(finish.into_actor(self).map(
            move |result, _, ctx| {
                crate::shutdown::stop(ctx, &mut NextRun::default(), actor);
                result
            },
        )))
    }
}
