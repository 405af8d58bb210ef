//! Dispatcher: reads the deliverable events ([`msgx_core::dispatch::Selection`]) one read at a
//! time and sends each selection as a task of its own, up to [`MAX_SENDS_IN_FLIGHT`] at once;
//! it decides only when the next read runs: at once while reads come back full, when the pump
//! says it committed events ([`EventsQueued`]), when a send ends after a read skipped its keys,
//! at the next retry time of a backing-off event, and otherwise every `dispatch.idle_poll` (a
//! safety net; no busy loop). A selection's events and keys stay out of the reads until its
//! send ended, so one key's events are never in two sends at once, and an event committed
//! while a send waits for the broker goes out at once instead of after that send's acks.
//!
//! What the broker said is written by a task of its own beside the sends
//! ([`msgx_core::dispatch::write_outcome`], one write at a time, everything learned since the
//! last one): a slow commit in PostgreSQL never holds the next sends, and until a write is
//! done its events stay out of the selections.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::child::Child;
use crate::messages::{
    DispatchNow, DispatchSummary, EventsQueued, SendEnded, Shutdown, ShutdownError, WorkError,
    WriteEnded,
};
use crate::next_run::NextRun;
use crate::supervisor::Supervised;
use actix::{Actor, ActorFutureExt, AsyncContext, AtomicResponse, Context, Handler, WrapFuture};
use msgx_core::clock::SharedClock;
use msgx_core::dispatch::{
    write_outcome, DispatchConfig, DispatchError, DispatchState, RoundReport, Selection,
    SendTicket, Unrecorded,
};
use msgx_core::kafka::EventProducer;
use msgx_core::store::{Store, StoreError};
use msgx_core::telemetry;

/// How often, at most, the next retry time is read (one query on the backing-off events).
const RETRY_CHECK_EVERY: Duration = Duration::from_secs(5);

/// The longest wait for librdkafka's stragglers at shutdown (after the sends ended nothing of
/// ours is queued there); never past the shutdown deadline.
const SHUTDOWN_FLUSH_MAX: Duration = Duration::from_secs(2);

/// Events whose outcome is not written yet above which no more is sent (a store that answers
/// reads but fails writes would otherwise grow the skip list without bound).
const UNWRITTEN_MAX_BATCHES: usize = 4;

/// Selections sent at once. One would make an event committed during a send wait for that
/// send's acks before it is even read (about twice the broker's ack time); a few let a
/// backlog's batches overlap too, within librdkafka's own in-flight window.
pub const MAX_SENDS_IN_FLIGHT: usize = 4;

/// What an outcome write hands back: the outcome and (SENT, DEAD) rows written.
type Written = (Unrecorded, Result<(u64, u64), StoreError>);

/// The outcome write in flight.
type Write = tokio::task::JoinHandle<Written>;

/// A send in flight: its report and the outcome to write.
type Send = tokio::task::JoinHandle<(RoundReport, Unrecorded)>;

/// The dispatcher actor.
pub struct Dispatcher {
    store: Store,
    clock: SharedClock,
    cfg: Arc<DispatchConfig>,
    /// Shared by the sends in flight; replaced (the next generation) after a fatal error.
    producer: Arc<EventProducer>,
    /// What the broker said and the store does not know yet, and what is being sent.
    state: DispatchState,
    /// The sends in flight.
    sends: HashMap<SendTicket, Send>,
    /// The outcome write in flight, if any.
    write: Option<Write>,
    /// A read skipped the keys of sends in flight (or did not run, too many in flight): read
    /// again when one of them ends.
    read_again: bool,
    /// The safety-net period.
    idle_poll: Duration,
    /// The pending timer and when it fires.
    next: NextRun,
    /// When the next retry time was last read.
    retry_checked_at: Option<Instant>,
}

impl Dispatcher {
    /// A dispatcher; it reads as soon as it is started.
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
            producer: Arc::new(producer),
            state: DispatchState::default(),
            sends: HashMap::new(),
            write: None,
            read_again: false,
            idle_poll,
            next: NextRun::default(),
            retry_checked_at: None,
        }
    }

    /// (Re)arms the timer to fire after `after`, unless it already fires sooner.
    fn schedule(&mut self, ctx: &mut Context<Self>, after: Duration, only_if_sooner: bool) {
        self.next.arm(ctx, DispatchNow, after, only_if_sooner);
    }

    /// A read came back: starts sending what it found and decides when to read next.
    fn read_ended(
        &mut self,
        read: Result<Selection, StoreError>,
        ctx: &mut Context<Self>,
    ) -> Result<DispatchSummary, WorkError> {
        let selection = match read {
            Ok(s) => s,
            Err(e) => {
                let e = DispatchError::from(e);
                telemetry::dispatch_failed(&e);
                self.schedule(ctx, self.idle_poll, false);
                return Err(WorkError::from(e));
            }
        };
        if selection.is_empty() {
            selection.empty_report().event().emit();
            self.schedule(ctx, self.idle_poll, false);
            self.wake_for_retry(ctx);
            return Ok(DispatchSummary::default());
        }
        // A full read: there may be more now, beside this send.
        let delay = if selection.is_full() {
            Duration::ZERO
        } else {
            self.idle_poll
        };
        let selected = self.start_send(selection, ctx);
        self.schedule(ctx, delay, false);
        Ok(DispatchSummary {
            selected,
            sends_in_flight: self.sends.len(),
        })
    }

    /// Sends `selection` as a task of its own; it tells the actor when it ends ([`SendEnded`]).
    /// Returns the events it covers.
    fn start_send(&mut self, selection: Selection, ctx: &mut Context<Self>) -> usize {
        let selected = selection.len();
        let ticket = self.state.begin_send(selection.skips());
        let (producer, clock, cfg) = (self.producer.clone(), self.clock.clone(), self.cfg.clone());
        let me = ctx.address();
        let task = actix::spawn(async move {
            let sent = selection.send(&producer, clock.as_ref(), &cfg).await;
            me.do_send(SendEnded(ticket));
            sent
        });
        self.sends.insert(ticket, task);
        selected
    }

    /// A send ended: its outcome waits for the write; the producer is rebuilt after a fatal
    /// error; a read skipped meanwhile runs again now.
    fn send_ended(
        &mut self,
        ticket: SendTicket,
        ended: Result<(RoundReport, Unrecorded), tokio::task::JoinError>,
        ctx: &mut Context<Self>,
    ) {
        match ended {
            Ok((mut report, fresh)) => {
                self.state.end_send(ticket, fresh);
                report.producer_recreated = self.rebuild_if_fatal();
                report.event().emit();
                self.read_again |= report.producer_recreated.is_some();
            }
            Err(e) => {
                self.state.abandon_send(ticket);
                tracing::error!(error = %e, "dispatch send lost; its events go again");
            }
        }
        self.start_write(ctx);
        if std::mem::take(&mut self.read_again) {
            self.schedule(ctx, Duration::ZERO, true);
        }
        self.wake_for_retry(ctx);
    }

    /// After librdkafka's fatal error (the producer can deliver nothing more) the next sends
    /// get a new producer; sends still on the old one fail and go again. Returns the reason.
    fn rebuild_if_fatal(&mut self) -> Option<String> {
        let reason = self.producer.fatal_error()?;
        match self.producer.rebuilt() {
            Ok(p) => self.producer = Arc::new(p),
            Err(e) => telemetry::dispatch_failed(&DispatchError::from(e)),
        }
        Some(reason)
    }

    /// Starts a write of everything learned since the last one, unless one is in flight. The
    /// task tells the actor when it ends ([`WriteEnded`]); it runs outside the actor's context
    /// so it progresses while a read holds the mailbox.
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
    /// a failure it is retried after the next send, so a failing store is not hammered).
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
        // Acked-but-unmarked events are re-sent by the next instance; this only shortens the
        // window.
        let _ = self.producer.flush(Duration::from_secs(2));
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
        if !self.sends.is_empty() {
            // This read leaves their keys out (or does not run): read again when one ends.
            self.read_again = true;
            if self.sends.len() >= MAX_SENDS_IN_FLIGHT {
                return AtomicResponse::new(Box::pin(actix::fut::ready(Ok(DispatchSummary {
                    selected: 0,
                    sends_in_flight: self.sends.len(),
                }))));
            }
        }
        let (store, clock, cfg) = (self.store.clone(), self.clock.clone(), self.cfg.clone());
        let skips = self.state.skips();
        // Atomic: the next read starts after this one's events are skipped.
        let read = async move { Selection::read(&store, clock.as_ref(), &cfg, &skips).await };
        AtomicResponse::new(Box::pin(
            read.into_actor(self)
                .map(|read, act, ctx| act.read_ended(read, ctx)),
        ))
    }
}

impl Handler<SendEnded> for Dispatcher {
    type Result = ();

    fn handle(&mut self, SendEnded(ticket): SendEnded, ctx: &mut Self::Context) {
        let Some(send) = self.sends.remove(&ticket) else {
            return;
        };
        // The task sent this as its last step: the join is immediate.
        ctx.wait(
            send.into_actor(self)
                .map(move |ended, act, ctx| act.send_ended(ticket, ended, ctx)),
        );
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
        // Immediately: latency from commit to ack is what this wake-up is for. A wake during
        // a read waits in the mailbox and arms one read right after it.
        self.schedule(ctx, Duration::ZERO, true);
    }
}

impl Supervised for Dispatcher {
    const CHILD: Child = Child::Dispatcher;
}

impl Handler<Shutdown> for Dispatcher {
    type Result = AtomicResponse<Self, Result<(), ShutdownError>>;

    /// Handled after the read in flight (atomic): waits for the sends in flight (their
    /// acknowledgements) and for the write in flight, writes what is left (SENT/DEAD/failures),
    /// then stops — so a deploy does not re-send what the broker already acknowledged. All
    /// within `deadline`: what is not written by then is re-sent by the next instance.
    fn handle(&mut self, msg: Shutdown, ctx: &mut Self::Context) -> Self::Result {
        self.next.cancel(ctx);
        let store = self.store.clone();
        let producer = self.producer.clone();
        let sends: Vec<(SendTicket, Send)> = self.sends.drain().collect();
        let write = self.write.take();
        let mut state = std::mem::take(&mut self.state);
        let actor = Self::CHILD.name();
        let finish = async move {
            let written = tokio::time::timeout_at(msg.deadline.into(), async {
                for (ticket, send) in sends {
                    match send.await {
                        Ok((_, fresh)) => state.end_send(ticket, fresh),
                        Err(_) => state.abandon_send(ticket),
                    }
                }
                // Nothing of ours is queued in librdkafka after the sends; this only drains
                // stragglers.
                let left = msg.deadline.saturating_duration_since(Instant::now());
                let _ = producer.flush(left.min(SHUTDOWN_FLUSH_MAX));
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
