//! Dispatcher: runs one dispatch round ([`msgx_core::dispatch::send_round`]) at a time and
//! decides only when the next one runs: at once while rounds come back full, when the pump
//! says it committed events ([`EventsQueued`]), at the next retry time of a backing-off event,
//! and otherwise every `dispatch.idle_poll` (a safety net; no busy loop). Rounds never overlap
//! (the mailbox waits on each), so one key's events are never in two rounds at once.
//!
//! What the broker said is written by a task of its own beside the rounds
//! ([`msgx_core::dispatch::write_outcome`], one write at a time, everything learned since the
//! last one): a slow commit in PostgreSQL never holds the next round's sends, and until a
//! write is done its events stay out of the selections.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::child::Child;
use crate::messages::{
    DispatchNow, DispatchSummary, EventsQueued, Shutdown, ShutdownError, WorkError, WriteEnded,
};
use crate::next_run::NextRun;
use crate::supervisor::Supervised;
use actix::{Actor, ActorFutureExt, AsyncContext, AtomicResponse, Context, Handler, WrapFuture};
use msgx_core::clock::SharedClock;
use msgx_core::dispatch::{send_round, write_outcome, DispatchConfig, DispatchState, Unrecorded};
use msgx_core::kafka::EventProducer;
use msgx_core::store::{Store, StoreError};
use msgx_core::telemetry;

/// How often, at most, the next retry time is read (one query on the backing-off events).
const RETRY_CHECK_EVERY: Duration = Duration::from_secs(5);

/// The longest wait for librdkafka's stragglers at shutdown (after a round nothing of ours is
/// queued there); never past the shutdown deadline.
const SHUTDOWN_FLUSH_MAX: Duration = Duration::from_secs(2);

/// Events whose outcome is not written yet above which rounds stop sending (a store that
/// answers reads but fails writes would otherwise grow the skip list without bound).
const UNWRITTEN_MAX_BATCHES: usize = 4;

/// What an outcome write hands back: the outcome and (SENT, DEAD) rows written.
type Written = (Unrecorded, Result<(u64, u64), StoreError>);

/// The outcome write in flight.
type Write = tokio::task::JoinHandle<Written>;

/// The dispatcher actor.
pub struct Dispatcher {
    store: Store,
    clock: SharedClock,
    cfg: Arc<DispatchConfig>,
    /// Out of the actor while a round runs (the round owns it, then hands it back).
    producer: Option<EventProducer>,
    /// What the broker said and the store does not know yet.
    state: DispatchState,
    /// The outcome write in flight, if any.
    write: Option<Write>,
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
            producer: Some(producer),
            state: DispatchState::default(),
            write: None,
            idle_poll,
            next: NextRun::default(),
            retry_checked_at: None,
        }
    }

    /// (Re)arms the timer to fire after `after`, unless it already fires sooner.
    fn schedule(&mut self, ctx: &mut Context<Self>, after: Duration, only_if_sooner: bool) {
        self.next.arm(ctx, DispatchNow, after, only_if_sooner);
    }

    /// Starts a write of everything learned since the last one, unless one is in flight. The
    /// task tells the actor when it ends ([`WriteEnded`]); it runs outside the actor's context
    /// so it progresses while a round holds the mailbox.
    fn start_write(&mut self, ctx: &mut Context<Self>) {
        if self.write.is_some() {
            return;
        }
        let Some(u) = self.state.take_for_write() else {
            return;
        };
        let (store, me) = (self.store.clone(), ctx.address());
        self.write = Some(actix::spawn(async move {
            let result = write_outcome(&store, &u).await;
            me.do_send(WriteEnded);
            (u, result)
        }));
    }

    /// A write ended: filed into the state; when it was written, the next write starts (after
    /// a failure it is retried after the next round, so a failing store is not hammered).
    fn write_ended(
        &mut self,
        ended: Result<Written, tokio::task::JoinError>,
        ctx: &mut Context<Self>,
    ) {
        if settle(&mut self.state, ended) {
            self.start_write(ctx);
        }
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

/// Files an ended write into `state`: written (and counted), back to wait for the next write,
/// or lost with its task (its events go again). Returns whether it was written.
fn settle(state: &mut DispatchState, ended: Result<Written, tokio::task::JoinError>) -> bool {
    match ended {
        Ok((u, Ok((sent, dead)))) => {
            state.write_finished(u, true);
            telemetry::OutcomeWritten { sent, dead }.emit();
            true
        }
        Ok((u, Err(e))) => {
            state.write_finished(u, false);
            telemetry::dispatch_failed(&e);
            false
        }
        Err(e) => {
            state.write_lost();
            tracing::error!(error = %e, "dispatch outcome write lost; its events go again");
            false
        }
    }
}

impl Actor for Dispatcher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        tracing::info!(topic = %self.cfg.topic, batch = self.cfg.batch, "dispatcher started");
        self.schedule(ctx, Duration::ZERO, false);
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        if let Some(p) = &self.producer {
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
        let unwritten_max = UNWRITTEN_MAX_BATCHES * self.cfg.batch as usize;
        if self.state.unwritten() >= unwritten_max {
            // Nothing more is sent until the store takes what was sent.
            tracing::warn!(
                unwritten = self.state.unwritten(),
                "dispatch waits for its outcome write"
            );
            self.start_write(ctx);
            self.schedule(ctx, self.idle_poll, false);
            return AtomicResponse::new(Box::pin(actix::fut::ready(
                Ok(DispatchSummary::default()),
            )));
        }
        let Some(mut producer) = self.producer.take() else {
            // Only possible if a round panicked mid-way; the supervisor rebuilds us.
            return AtomicResponse::new(Box::pin(actix::fut::ready(Err(
                WorkError::ProducerUnavailable,
            ))));
        };
        let (store, clock, cfg) = (self.store.clone(), self.clock.clone(), self.cfg.clone());
        let skips = self.state.skips();
        let round = async move {
            let result = send_round(&store, &mut producer, clock.as_ref(), &cfg, &skips).await;
            (result, producer)
        };
        AtomicResponse::new(Box::pin(round.into_actor(self).map(
            |(result, producer), act, ctx| {
                act.producer = Some(producer);
                let result = result.map(|(report, fresh)| {
                    act.state.add(fresh);
                    report
                });
                act.start_write(ctx);
                let delay = match &result {
                    Ok(r) => {
                        r.event().emit();
                        if r.full || r.producer_recreated.is_some() {
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

impl Handler<WriteEnded> for Dispatcher {
    type Result = ();

    fn handle(&mut self, _: WriteEnded, ctx: &mut Self::Context) {
        let Some(write) = self.write.take() else {
            return;
        };
        // The task sent this as its last step: the join is immediate.
        ctx.wait(
            write
                .into_actor(self)
                .map(|ended, act, ctx| act.write_ended(ended, ctx)),
        );
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
    /// their way and for the write in flight, writes what is left (SENT/DEAD/failures), then
    /// stops — so a deploy does not re-send what the broker already acknowledged. All within
    /// `deadline`: what is not written by then is re-sent by the next instance.
    fn handle(&mut self, msg: Shutdown, ctx: &mut Self::Context) -> Self::Result {
        self.next.cancel(ctx);
        let store = self.store.clone();
        let producer = self.producer.take();
        let write = self.write.take();
        let mut state = std::mem::take(&mut self.state);
        let actor = Self::CHILD.name();
        let finish = async move {
            if let Some(p) = &producer {
                // Nothing of ours is queued in librdkafka after a round; this only drains
                // stragglers.
                let left = msg.deadline.saturating_duration_since(Instant::now());
                let _ = p.flush(left.min(SHUTDOWN_FLUSH_MAX));
            }
            let left = msg.deadline.saturating_duration_since(Instant::now());
            let written = tokio::time::timeout(left, async {
                if let Some(w) = write {
                    settle(&mut state, w.await);
                }
                msgx_core::dispatch::flush(&store, &mut state).await
            });
            match written.await {
                Ok(Ok((sent, dead))) => {
                    telemetry::OutcomeWritten { sent, dead }.emit();
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
