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
//!
//! `kafka.delivery = "exactly-once"`: before its first round the dispatcher takes the
//! deployment's recorded `transactional.id`, confirms the lease, calls `init_transactions`
//! (fencing the previous holder's producer), confirms the lease again and recovers from Kafka
//! what was committed but not written SENT ([`msgx_core::dispatch::txn::prepare`]). Between
//! rounds, at most every `dispatch.scan_floor_every` and only while every committed round is written, the
//! topics' ends become the recovery's floors ([`txn::record_floors`]). A fenced producer, a
//! commit whose outcome stayed unknown, or an outcome write lost with its task, stops the
//! dispatcher: the supervisor's next one starts over from the lease.
//!
//! `kafka.delivery = "at-least-once"`: while an event an earlier release made is PENDING (a
//! rolling upgrade from the previous release), the start first reads both topics back for the
//! previous release's copies ([`txn::recover_previous_release`]): an event it delivered and did
//! not record is not sent again under another identity. Tried [`PREVIOUS_RELEASE_TRIES`] times;
//! then rounds go on without it (at-least-once: such events may reach consumers twice).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::child::Child;
use crate::messages::{
    DispatchNow, DispatchSummary, EventsQueued, Shutdown, ShutdownError, WorkError, WriteEnded,
};
use crate::next_run::NextRun;
use crate::supervisor::Supervised;
use actix::{
    Actor, ActorContext, ActorFutureExt, AsyncContext, AtomicResponse, Context, Handler, WrapFuture,
};
use msgx_core::clock::SharedClock;
use msgx_core::dispatch::{
    send_round, txn, write_outcome, DispatchConfig, DispatchState, Unrecorded,
};
use msgx_core::kafka::EventProducer;
use msgx_core::settings::KafkaSettings;
use msgx_core::store::{InstanceLock, Store, StoreError};
use msgx_core::telemetry;

/// How often, at most, the next retry time is read (one query on the backing-off events).
const RETRY_CHECK_EVERY: Duration = Duration::from_secs(5);

/// The longest wait for librdkafka's stragglers at shutdown (after a round nothing of ours is
/// queued there); never past the shutdown deadline.
const SHUTDOWN_FLUSH_MAX: Duration = Duration::from_secs(2);

/// Events whose outcome is not written yet above which rounds stop sending (a store that
/// answers reads but fails writes would otherwise grow the skip list without bound).
const UNWRITTEN_MAX_BATCHES: usize = 4;

/// At-least-once starts: read-back attempts before rounds go on without it.
const PREVIOUS_RELEASE_TRIES: u32 = 3;

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
    /// What the start needs (the exactly-once start, or the at-least-once read-back).
    eo: Option<ExactlyOnce>,
}

/// The start before the first round: `exactly-once`, the producer's `init_transactions` and
/// the recovery, under the lease; `at-least-once`, the read-back of the previous release's
/// copies.
struct ExactlyOnce {
    /// `exactly-once` (the transactional start); false: the at-least-once read-back.
    transactional: bool,
    /// At-least-once read-backs that failed so far.
    failed: u32,
    kafka: KafkaSettings,
    bootstrap: String,
    /// The lease (None in tests that run without one).
    lock: Option<InstanceLock>,
    /// `init_transactions` succeeded on the current producer.
    initialized: bool,
    /// The start ran: rounds may go.
    prepared: bool,
    /// When the floors were last recorded (by the start's recovery or between rounds).
    floors_at: Option<Instant>,
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
            eo: None,
        }
    }

    /// `exactly-once`: the producer is transactional; before the first round the lease is
    /// confirmed, `init_transactions` fences the previous holder and Kafka is read back.
    pub fn exactly_once(
        mut self,
        kafka: KafkaSettings,
        bootstrap: String,
        lock: Option<InstanceLock>,
    ) -> Self {
        self.eo = Some(ExactlyOnce {
            transactional: true,
            failed: 0,
            kafka,
            bootstrap,
            lock,
            initialized: false,
            prepared: false,
            floors_at: None,
        });
        self
    }

    /// `at-least-once`: before the first round, the previous release's copies are read back
    /// (see the module doc).
    pub fn at_least_once(mut self, kafka: KafkaSettings, bootstrap: String) -> Self {
        self.eo = Some(ExactlyOnce {
            transactional: false,
            failed: 0,
            kafka,
            bootstrap,
            lock: None,
            initialized: true,
            prepared: false,
            floors_at: None,
        });
        self
    }

    /// True in `exactly-once` mode.
    fn transactional(&self) -> bool {
        self.eo.as_ref().is_some_and(|e| e.transactional)
    }

    /// The exactly-once start (see the module doc), run in place of the first round: lease,
    /// `init_transactions`, lease (once per producer), then the recovery. A fenced producer
    /// stops the dispatcher; any other failure (broker or store unreachable, lease not
    /// confirmed) is retried after `dispatch.idle_poll` and no round runs before it succeeds
    /// (a lost lease stops the whole service through the supervisor).
    fn prepare(
        &mut self,
        mut producer: EventProducer,
        (kafka, bootstrap, lock, mut initialized): (
            KafkaSettings,
            String,
            Option<InstanceLock>,
            bool,
        ),
    ) -> AtomicResponse<Self, Result<DispatchSummary, WorkError>> {
        if !self.transactional() {
            return self.read_back_previous_release(producer, kafka, bootstrap);
        }
        let (store, clock, cfg) = (self.store.clone(), self.clock.clone(), self.cfg.clone());
        let start = async move {
            let result = async {
                if !initialized {
                    txn::use_deployment_id(&store, &mut producer, clock.as_ref(), &kafka).await?;
                    confirm_lease(&lock).await?;
                    let init = producer.init_transactions(cfg.txn_timeout).await;
                    init.map_err(msgx_core::dispatch::DispatchError::from)?;
                    initialized = true;
                    confirm_lease(&lock).await?;
                }
                Ok::<_, WorkError>(
                    txn::recover(&store, clock.as_ref(), &kafka, &bootstrap, &cfg).await?,
                )
            }
            .await;
            (result, producer, initialized)
        };
        AtomicResponse::new(Box::pin(start.into_actor(self).map(
            |(result, producer, initialized), act, ctx| {
                act.producer = Some(producer);
                if let Some(eo) = act.eo.as_mut() {
                    eo.initialized = initialized;
                    eo.prepared = result.is_ok();
                    eo.floors_at = result.is_ok().then(Instant::now);
                }
                match result {
                    Ok(r) => {
                        tracing::info!(
                            read = r.read,
                            sent = r.sent,
                            dead = r.dead,
                            others = r.others,
                            "exactly-once start: producer fenced its predecessors; \
                             what Kafka held of ours is written"
                        );
                        act.schedule(ctx, Duration::ZERO, false);
                        Ok(DispatchSummary::default())
                    }
                    Err(e) => {
                        let fatal = matches!(&e, WorkError::Dispatch(d) if d.producer_fatal());
                        if fatal {
                            tracing::error!(error = %e, "exactly-once start: producer fenced; dispatcher stops");
                            ctx.stop();
                        } else {
                            tracing::warn!(error = %e, "exactly-once start failed; retried");
                            act.schedule(ctx, act.idle_poll, false);
                        }
                        Err(e)
                    }
                }
            },
        )))
    }

    /// The at-least-once start (see the module doc): the previous release's copies read back,
    /// retried after `dispatch.idle_poll`; after [`PREVIOUS_RELEASE_TRIES`] failures rounds go
    /// on without it.
    fn read_back_previous_release(
        &mut self,
        producer: EventProducer,
        kafka: KafkaSettings,
        bootstrap: String,
    ) -> AtomicResponse<Self, Result<DispatchSummary, WorkError>> {
        let (store, clock, cfg) = (self.store.clone(), self.clock.clone(), self.cfg.clone());
        let start = async move {
            txn::recover_previous_release(&store, clock.as_ref(), &kafka, &bootstrap, &cfg).await
        };
        AtomicResponse::new(Box::pin(start.into_actor(self).map(
            move |result, act, ctx| {
                act.producer = Some(producer);
                let Some(start) = act.eo.as_mut() else {
                    return Ok(DispatchSummary::default());
                };
                match result {
                    Ok(r) => {
                        start.prepared = true;
                        if r.read > 0 {
                            tracing::info!(
                                sent = r.sent,
                                dead = r.dead,
                                "at-least-once start: the previous release's deliveries are written"
                            );
                        }
                        act.schedule(ctx, Duration::ZERO, false);
                        Ok(DispatchSummary::default())
                    }
                    Err(e) => {
                        start.failed += 1;
                        let give_up = start.failed >= PREVIOUS_RELEASE_TRIES;
                        start.prepared = give_up;
                        if give_up {
                            tracing::warn!(
                                error = %e,
                                tries = start.failed,
                                "at-least-once start: the previous release's records could not be \
                                 read back; delivering without (an event it sent may reach \
                                 consumers again under its new identity)"
                            );
                            act.schedule(ctx, Duration::ZERO, false);
                        } else {
                            tracing::warn!(error = %e, "at-least-once start: read-back failed; retried");
                            act.schedule(ctx, act.idle_poll, false);
                        }
                        Err(WorkError::from(e))
                    }
                }
            },
        )))
    }

    /// `exactly-once`: true (and the clock restarted) when the floors may be recorded before
    /// this round: due, no transaction open (rounds never overlap), and every committed round's
    /// outcome written, so nothing of ours below the ends is unknown to the store.
    fn floors_due(&mut self) -> bool {
        let quiet = self.state.unwritten() == 0 && self.write.is_none();
        let Some(eo) = self.eo.as_mut().filter(|e| e.prepared && e.transactional) else {
            return false;
        };
        let every = self.cfg.scan_floor_every;
        let due = eo.floors_at.is_none_or(|t| t.elapsed() >= every);
        if quiet && due {
            eo.floors_at = Some(Instant::now());
        }
        quiet && due
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
        let (store, me, cfg) = (self.store.clone(), ctx.address(), self.cfg.clone());
        self.write = Some(actix::spawn(async move {
            let result = write_outcome(&store, &u, &cfg).await;
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
        let lost = ended.is_err();
        if settle(&mut self.state, ended) {
            self.start_write(ctx);
        } else if lost && self.transactional() {
            // Its acks' transactions are committed: re-sending them would duplicate. A new
            // dispatcher recovers them from Kafka before writing anything later.
            ctx.stop();
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

/// Renews the lease now; not ours (or unreachable) is an error.
async fn confirm_lease(lock: &Option<InstanceLock>) -> Result<(), WorkError> {
    match lock {
        Some(l) => Ok(l.check().await?),
        None => Ok(()),
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
        if let Some(eo) = self.eo.as_ref().filter(|e| !e.prepared) {
            let args = (
                eo.kafka.clone(),
                eo.bootstrap.clone(),
                eo.lock.clone(),
                eo.initialized,
            );
            return self.prepare(producer, args);
        }
        let (store, clock, cfg) = (self.store.clone(), self.clock.clone(), self.cfg.clone());
        let skips = self.state.skips();
        let floors = self.floors_due();
        let round = async move {
            if floors {
                if let Err(e) = txn::record_floors(&store, &producer, clock.as_ref(), &cfg).await {
                    tracing::warn!(error = %e, "exactly-once: recording the scan floors failed");
                }
            }
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
                        if e.producer_fatal() && act.transactional() {
                            // Fenced (a newer producer took our transactional.id), or a
                            // transaction this producer can no longer end: the next
                            // dispatcher starts over from the lease with a new producer.
                            tracing::error!(error = %e, "kafka producer given up (fenced, or its transaction left open); dispatcher stops");
                            ctx.stop();
                        }
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
        let (store, cfg) = (self.store.clone(), self.cfg.clone());
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
                msgx_core::dispatch::flush(&store, &mut state, &cfg).await
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
