//! One dispatch round: read the deliverable events, send them (concurrently across keys, one
//! after another within a key), and keep what the broker said for a write of a few statements
//! ([`super::outcome`]).
//!
//! The order of effects is the at-least-once argument: an event becomes SENT only after its
//! ack arrived, in a statement that runs after the acks (a crash in between re-sends it).

use std::time::Instant;

use chrono::{DateTime, Utc};
use futures::future::join_all;
use rdkafka::producer::DeliveryFuture;

use super::cloudevents;
use super::outcome::{Skips, Unrecorded};
use super::rules::{self, AfterFailure, RetryRules};
use crate::clock::Clock;
use crate::kafka::producer::Outgoing;
use crate::kafka::{EventProducer, ProducerError};
use crate::store::events::{Acked, PendingEvent, SendFailure};
use crate::store::{Store, StoreError};
use crate::traces::{DeliverySpan, Destination};

/// What a round needs besides the store and the producer.
#[derive(Debug, Clone)]
pub struct DispatchConfig {
    /// Event topic.
    pub topic: String,
    /// Dead-letter topic.
    pub dlq_topic: String,
    /// CloudEvents `ce_source`.
    pub ce_source: String,
    /// Events per round.
    pub batch: u32,
    /// Retry policy.
    pub retry: RetryRules,
    /// `exactly-once`: how long a transaction call (init, commit, abort) and the start-up
    /// recovery may take (`kafka.transaction_timeout`).
    pub txn_timeout: std::time::Duration,
    /// `exactly-once`: how long the start-up recovery waits out another producer's open
    /// transaction (`kafka.open_transaction_wait`).
    pub open_txn_wait: std::time::Duration,
    /// `exactly-once`: how often, at most, the scan floors move up between rounds
    /// (`dispatch.scan_floor_every`).
    pub scan_floor_every: std::time::Duration,
}

/// Why a round could not complete (the events stay PENDING and are re-sent).
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    /// Reading or recording in PostgreSQL failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The producer could not be rebuilt after a fatal error, or (`exactly-once`) a
    /// transaction call failed for good (fenced).
    #[error(transparent)]
    Producer(#[from] ProducerError),
    /// `exactly-once`: what Kafka holds could not be read at start.
    #[error("exactly-once recovery: {0}")]
    Recover(String),
    /// `exactly-once`: a commit's outcome stayed unknown through every call: only a new
    /// producer's `init_transactions` settles it (and its recovery reads back what landed).
    #[error("kafka transaction commit unresolved after retries: {0}")]
    CommitUnresolved(String),
    /// `exactly-once`: the configured `transactional.id` is not the deployment's.
    #[error(transparent)]
    TransactionalId(#[from] crate::store::event_scan::TransactionalIdMismatch),
    /// `exactly-once`: a round's transaction was left open — the store failed between its
    /// `begin_transaction` and the end of its commit (the fence check before a commit call),
    /// or the producer would not begin one. Every later `begin_transaction` of this producer
    /// would fail: only a new producer's `init_transactions` settles it, as after a crash (its
    /// recovery reads back what landed).
    #[error("kafka transaction left open: {0}")]
    TransactionLeftOpen(String),
}

impl DispatchError {
    /// True when the producer is fenced, broken for good or holds a transaction it can no
    /// longer end (`exactly-once`): the dispatcher stops and its successor starts a new
    /// producer after confirming the lease.
    pub fn producer_fatal(&self) -> bool {
        match self {
            DispatchError::Producer(e) => e.is_fatal(),
            DispatchError::CommitUnresolved(_)
            | DispatchError::TransactionalId(_)
            | DispatchError::TransactionLeftOpen(_) => true,
            _ => false,
        }
    }
}

/// One acknowledged send, for latency metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AckTiming {
    /// Queue → ack.
    pub produce: std::time::Duration,
    /// Commit (event creation, wall clock) → ack.
    pub commit_to_ack: Option<std::time::Duration>,
}

/// What a round did.
#[derive(Debug, Clone, Default)]
pub struct RoundReport {
    /// Events read.
    pub selected: usize,
    /// Acknowledged by the broker in this round (written as SENT by the next write).
    pub acked: usize,
    /// Failed sends that will be retried (or go to the DLQ next).
    pub failed: usize,
    /// Events not attempted, or failed only with an earlier event of their key, because that
    /// earlier event failed in this round.
    pub held_back: usize,
    /// Events acknowledged although an earlier event of their key failed in this round: on the
    /// topic out of key order. A broker that checks an idempotent producer's sequences (Kafka)
    /// refuses them; one that does not (librdkafka's mock) shows here.
    pub overtaken: usize,
    /// Dead-letter copies that failed (retried later).
    pub dlq_failed: usize,
    /// The batch was full: there may be more right now.
    pub full: bool,
    /// The producer hit a fatal error and was rebuilt (the reason).
    pub producer_recreated: Option<String>,
    /// First few failed sends (event id, error), for the log.
    pub failures: Vec<(i64, String)>,
    /// Dead events (event id, last error), for the log.
    pub dead_events: Vec<(i64, String)>,
    /// Per acknowledged event.
    pub timings: Vec<AckTiming>,
    /// Where the round's time went: select, send (until the last ack).
    pub stages: [std::time::Duration; 2],
}

impl RoundReport {
    /// The round's telemetry event.
    pub fn event(&self) -> crate::telemetry::DispatchRound<'_> {
        crate::telemetry::DispatchRound {
            selected: self.selected,
            acked: self.acked,
            retries: (self.failed + self.dlq_failed) as u64,
            timings: self
                .timings
                .iter()
                .map(|t| (t.produce, t.commit_to_ack))
                .collect(),
            failures: &self.failures,
            dead_events: &self.dead_events,
            dlq_failed: self.dlq_failed,
            overtaken: self.overtaken,
            producer_recreated: self.producer_recreated.as_deref(),
        }
    }
}

pub(super) enum SendResult {
    Acked(Acked, AckTiming),
    Failed(i64, String),
}

pub(super) async fn send_one(
    producer: &EventProducer,
    clock: &dyn Clock,
    ev: &PendingEvent,
    to: Target<'_>,
    headers: Vec<(&'static str, String)>,
) -> SendResult {
    match queue_one(producer, ev, to, headers) {
        Ok(q) => q.ack(clock).await,
        Err(refused) => refused,
    }
}

/// Where a record goes: the topic, and whether it is a dead-letter copy (its delivery span
/// says so).
#[derive(Debug, Clone, Copy)]
pub(super) struct Target<'a> {
    pub(super) topic: &'a str,
    pub(super) dead_letter: bool,
}

impl<'a> Target<'a> {
    pub(super) fn events(topic: &'a str) -> Self {
        Self {
            topic,
            dead_letter: false,
        }
    }
}

/// One record queued in the producer, its ack still to come.
struct Queued<'a> {
    ev: &'a PendingEvent,
    fut: DeliveryFuture,
    start: Instant,
    /// Its delivery span while tracing is on ([`crate::traces`]).
    span: Option<DeliverySpan>,
}

/// Queues `ev` without waiting; the producer's refusal (queue full, too large) is its result.
/// While tracing is on, the record's delivery span starts here and its trace headers are added.
fn queue_one<'a>(
    producer: &EventProducer,
    ev: &'a PendingEvent,
    to: Target<'_>,
    mut headers: Vec<(&'static str, String)>,
) -> Result<Queued<'a>, SendResult> {
    let start = Instant::now();
    let span = crate::traces::active().map(|t| {
        let dest = Destination {
            topic: to.topic,
            dead_letter: to.dead_letter,
            transactional_id: producer.transactional_id(),
        };
        t.delivery(ev, dest, &mut headers)
    });
    let rec = Outgoing {
        topic: to.topic,
        key: &ev.flight_key,
        payload: ev.payload.as_bytes(),
        timestamp_ms: ev.created_at.timestamp_millis(),
    };
    match producer.send(rec, cloudevents::to_headers(&headers)) {
        Ok(fut) => Ok(Queued {
            ev,
            fut,
            start,
            span,
        }),
        Err(e) => {
            let error = e.to_string();
            if let Some(span) = span {
                span.failed(&error);
            }
            Err(SendResult::Failed(ev.event_id, error))
        }
    }
}

impl Queued<'_> {
    /// What the broker said (and the delivery span ends with it).
    async fn ack(mut self, clock: &dyn Clock) -> SendResult {
        let span = self.span.take();
        let result = self.wait(clock).await;
        if let Some(span) = span {
            match &result {
                SendResult::Acked(a, _) => span.acked(a.partition, a.offset),
                SendResult::Failed(_, error) => span.failed(error),
            }
        }
        result
    }

    async fn wait(self, clock: &dyn Clock) -> SendResult {
        let ev = self.ev;
        match self.fut.await {
            Ok(Ok(delivery)) => {
                let commit_to_ack = (Utc::now() - ev.created_at).to_std().ok();
                SendResult::Acked(
                    Acked {
                        event_id: ev.event_id,
                        partition: delivery.partition,
                        offset: delivery.offset,
                        at: clock.now(),
                    },
                    AckTiming {
                        produce: self.start.elapsed(),
                        commit_to_ack,
                    },
                )
            }
            Ok(Err((e, _))) => SendResult::Failed(ev.event_id, e.to_string()),
            Err(_) => SendResult::Failed(ev.event_id, "producer dropped the delivery".into()),
        }
    }
}

/// Copies the exhausted events to the dead-letter topic, all at once, each with the
/// dead-letter headers (the original topic, attempts, last error).
pub(super) async fn send_dead_letters(
    producer: &EventProducer,
    clock: &dyn Clock,
    exhausted: &[PendingEvent],
    cfg: &DispatchConfig,
) -> Vec<SendResult> {
    join_all(exhausted.iter().map(|ev| {
        let headers = cloudevents::dead_letter_attributes(ev, &cfg.ce_source, &cfg.topic);
        let to = Target {
            topic: &cfg.dlq_topic,
            dead_letter: true,
        };
        send_one(producer, clock, ev, to, headers)
    }))
    .await
}

/// Sends one key's events, all in flight at once (issue 43 item 3: a far broker costs one round
/// trip per round, not one per event of the key). They are queued in event order and queueing
/// stops at the first refusal; the idempotent producer keeps a partition's queue order through
/// its retries, and `enable.gapless.guarantee` turns a batch the broker refused for good into a
/// fatal producer error: the records queued behind it are purged and those already in flight
/// are refused out of sequence by the broker (Kafka checks an idempotent producer's sequence),
/// so no later event of the key lands before the failed one. Returns the results of the queued
/// events, in chain order, and how many were not queued.
async fn send_chain(
    producer: &EventProducer,
    clock: &dyn Clock,
    chain: &[PendingEvent],
    cfg: &DispatchConfig,
) -> (Vec<SendResult>, usize) {
    let mut queued = Vec::with_capacity(chain.len());
    let mut refused = None;
    for ev in chain {
        let headers = cloudevents::attributes(ev, &cfg.ce_source);
        match queue_one(producer, ev, Target::events(&cfg.topic), headers) {
            Ok(q) => queued.push(q),
            Err(r) => {
                refused = Some(r);
                break;
            }
        }
    }
    let not_queued = chain.len() - queued.len() - usize::from(refused.is_some());
    let mut out = join_all(queued.into_iter().map(|q| q.ack(clock))).await;
    out.extend(refused);
    (out, not_queued)
}

/// A round's selection: the deliverable events split into the exhausted ones (copied to the
/// dead-letter topic) and the live ones (sent), when they were read, and the report begun.
pub(super) struct Selected {
    pub(super) exhausted: Vec<PendingEvent>,
    pub(super) live: Vec<PendingEvent>,
    pub(super) now: DateTime<Utc>,
    pub(super) report: RoundReport,
    pub(super) t0: Instant,
}

impl Selected {
    /// Nothing to send: the round ends with its report.
    pub(super) fn is_empty(&self) -> bool {
        self.exhausted.is_empty() && self.live.is_empty()
    }
}

/// Reads the deliverable events (without `skips`) and splits off the exhausted ones.
pub(super) async fn select_split(
    store: &Store,
    clock: &dyn Clock,
    cfg: &DispatchConfig,
    skips: &Skips,
) -> Result<Selected, StoreError> {
    let t0 = Instant::now();
    let now = clock.now();
    let batch = store
        .deliverable_events(now, cfg.batch, &skips.ids, &skips.keys)
        .await?;
    let mut report = RoundReport {
        selected: batch.len(),
        full: batch.len() as u32 >= cfg.batch,
        ..RoundReport::default()
    };
    let (exhausted, live) = batch
        .into_iter()
        .partition(|e| rules::is_exhausted(e, &cfg.retry));
    report.stages[0] = t0.elapsed();
    Ok(Selected {
        exhausted,
        live,
        now,
        report,
        t0,
    })
}

/// An at-least-once round: selects the deliverable events (without `skips`) and sends them;
/// returns the report and the outcome to write.
pub(super) async fn select_and_send(
    store: &Store,
    producer: &EventProducer,
    clock: &dyn Clock,
    cfg: &DispatchConfig,
    skips: &Skips,
) -> Result<(RoundReport, Unrecorded), StoreError> {
    let mut sel = select_split(store, clock, cfg, skips).await?;
    if sel.is_empty() {
        return Ok((sel.report, Unrecorded::default()));
    }
    let chains = rules::chains(sel.live);
    let sends = join_all(chains.iter().map(|c| send_chain(producer, clock, c, cfg)));
    let dead_letters = send_dead_letters(producer, clock, &sel.exhausted, cfg);
    let (chain_results, dlq_results) = futures::join!(sends, dead_letters);

    // The dangerous window of seed §4's last row: acked, not yet SENT.
    crate::failpoint::hit("dispatch_after_ack");
    let (report, mut out) = (&mut sel.report, Unrecorded::default());
    report.stages[1] = sel.t0.elapsed() - report.stages[0];
    collect_chain_results(&chains, chain_results, sel.now, cfg, report, &mut out);
    collect_dead_letter_results(&sel.exhausted, dlq_results, sel.now, cfg, report, &mut out);
    Ok((sel.report, out))
}

/// Files each chain's send results into the outcome to write (acks, failures with their next
/// attempt, the failed keys to hold back) and counts them in the report. `report.acked`,
/// `report.failed` and `report.failures` cover the chains only, not the dead-letter copies.
fn collect_chain_results(
    chains: &[Vec<PendingEvent>],
    chain_results: Vec<(Vec<SendResult>, usize)>,
    at: DateTime<Utc>,
    cfg: &DispatchConfig,
    report: &mut RoundReport,
    out: &mut Unrecorded,
) {
    for (chain, (results, held)) in chains.iter().zip(chain_results) {
        report.held_back += held;
        let mut failed = false;
        // `results` follows the chain's order (queueing stops at its first refusal).
        for (ev, r) in chain.iter().zip(results) {
            match r {
                SendResult::Acked(a, t) => {
                    // On the topic whatever came before it: recorded, and counted if it
                    // overtook a failed event of its key (a broker without sequence checks).
                    report.overtaken += usize::from(failed);
                    out.acked.push(a);
                    report.timings.push(t);
                }
                // Failed with the one before it (the fatal error that stopped the producer):
                // held back, not an attempt of its own.
                SendResult::Failed(..) if failed => report.held_back += 1,
                SendResult::Failed(id, error) => {
                    failed = true;
                    let next_attempt_at =
                        match rules::after_failure(ev.attempts + 1, at, &cfg.retry) {
                            AfterFailure::RetryAt(t) => t,
                            AfterFailure::Exhausted => at,
                        };
                    out.failures.push(SendFailure {
                        event_id: id,
                        next_attempt_at,
                        error,
                    });
                    out.hold_keys.push(ev.flight_key.clone());
                }
            }
        }
    }
    report.acked = out.acked.len();
    report.failed = out.failures.len();
    report.failures = out
        .failures
        .iter()
        .take(5)
        .map(|f| (f.event_id, f.error.clone()))
        .collect();
}

/// Files the dead-letter copies' results: an acked copy makes its event DEAD; a failed copy
/// keeps the event PENDING (still holding its key back) until the longest retry delay.
pub(super) fn collect_dead_letter_results(
    exhausted: &[PendingEvent],
    dlq_results: Vec<SendResult>,
    at: DateTime<Utc>,
    cfg: &DispatchConfig,
    report: &mut RoundReport,
    out: &mut Unrecorded,
) {
    for (ev, r) in exhausted.iter().zip(dlq_results) {
        match r {
            SendResult::Acked(a, _) => {
                report
                    .dead_events
                    .push((a.event_id, ev.last_error.clone().unwrap_or_default()));
                out.dead.push(a);
            }
            SendResult::Failed(id, e) => {
                report.dlq_failed += 1;
                out.hold_keys.push(ev.flight_key.clone());
                out.failures.push(SendFailure {
                    event_id: id,
                    next_attempt_at: retry_max_from(at, &cfg.retry),
                    error: format!("dead-letter copy failed: {e}"),
                });
            }
        }
    }
}

fn retry_max_from(at: DateTime<Utc>, r: &RetryRules) -> DateTime<Utc> {
    rules::add(at, r.retry_max)
}
