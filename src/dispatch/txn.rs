//! `kafka.delivery = "exactly-once"`: one dispatch round is one Kafka transaction, and the
//! dispatcher's start learns from Kafka what committed transactions delivered before the store
//! heard of it (KIP-98's transactional producer; the recovery follows KIP-618's "the offsets
//! are in the same transaction" idea with the topic itself as the record of progress).
//!
//! - [`prepare`]: the deployment's one `transactional.id` (recorded in the store at first use,
//!   [`Store::claim_transactional_id`]), `init_transactions` (fencing every earlier producer
//!   with it and aborting its open transaction), then [`recover`].
//! - [`recover`]: reads the events topic (and the dead-letter topic) `read_committed` from
//!   each partition's durable cursor (the scan floor, or past the highest offset written
//!   SENT/DEAD) to its end, takes only records of ours (the event's `ce_id` UUID and its
//!   `ce_msgxevent` number, [`RecordIdentity::is`]) and writes SENT (DEAD) with the offsets for
//!   every PENDING one found; then records the ends as the new floors.
//! - [`send_txn_round`]: the whole batch (many events per key) in one transaction; all acked →
//!   commit (the lease confirmed through the fenced store right before; a commit whose outcome
//!   is unknown is called again, never taken for "nothing visible") → the acks go to the
//!   outcome write (SENT after the commit); any failed send → abort, the failed events back off
//!   (DLQ after their last attempt, as in at-least-once) and the rest go again at once.
//! - [`record_floors`]: between transactions, with every committed one written, the ends of
//!   both topics become the floors, so the next start reads only what came after.

use std::collections::HashMap;

use futures::future::join_all;

use super::cloudevents;
use super::outcome::{Skips, Unrecorded};
use super::round::{
    collect_dead_letter_results, select_split, send_dead_letters, send_one, AckTiming,
    DispatchConfig, DispatchError, RoundReport, Selected, SendResult, Target,
};
use super::rules::{self, AfterFailure};
use crate::clock::Clock;
use crate::kafka::consumer::RecordIdentity;
use crate::kafka::recover::{scan, Found, RecoverError, Scan};
use crate::kafka::{EventProducer, ProducerError};
use crate::rows::EventState;
use crate::settings::KafkaSettings;
use crate::store::events::{Acked, PendingEvent, SendFailure};
use crate::store::Store;
use crate::telemetry;

/// Times a commit whose outcome is unknown is called again before the dispatcher gives the
/// producer up (its successor's `init_transactions` settles the transaction either way, and
/// its recovery reads back whatever committed).
const COMMIT_TRIES: u32 = 3;

/// What [`recover`] wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Committed records read from both topics.
    pub read: usize,
    /// PENDING events of ours found on the events topic, now SENT.
    pub sent: u64,
    /// PENDING events of ours found on the dead-letter topic, now DEAD.
    pub dead: u64,
    /// Records of other stores or deployments (or no event at all), skipped.
    pub others: usize,
}

/// The deployment's `transactional.id`, `init_transactions`, then [`recover`]. The caller
/// holds the lease (checked right before and again right after, so a holder frozen before
/// this call cannot go on past it).
pub async fn prepare(
    store: &Store,
    producer: &mut EventProducer,
    clock: &dyn Clock,
    k: &KafkaSettings,
    bootstrap: &str,
    cfg: &DispatchConfig,
) -> Result<Recovered, DispatchError> {
    use_deployment_id(store, producer, clock, k).await?;
    producer.init_transactions(cfg.txn_timeout).await?;
    recover(store, clock, k, bootstrap, cfg).await
}

/// Rebuilds `producer` with the deployment's recorded `transactional.id` (recording the
/// default at the first exactly-once start); a configured id that differs is refused.
pub async fn use_deployment_id(
    store: &Store,
    producer: &mut EventProducer,
    clock: &dyn Clock,
    k: &KafkaSettings,
) -> Result<(), DispatchError> {
    let id = store
        .claim_transactional_id(
            &k.transactional_id,
            &k.default_transactional_id(),
            clock.now(),
        )
        .await??;
    producer.use_transactional_id(&id)?;
    Ok(())
}

/// Writes SENT (DEAD) for the PENDING events of ours a committed transaction already
/// delivered to the events (dead-letter) topic, then records both topics' ends as their scan
/// floors. Run after `init_transactions` and before the first round.
pub async fn recover(
    store: &Store,
    clock: &dyn Clock,
    k: &KafkaSettings,
    bootstrap: &str,
    cfg: &DispatchConfig,
) -> Result<Recovered, DispatchError> {
    let mut out = Recovered::default();
    for (topic, state) in [
        (&cfg.topic, EventState::Sent),
        (&cfg.dlq_topic, EventState::Dead),
    ] {
        let floors = store.scan_floors(topic).await?;
        let recorded = store.last_offsets(topic, state).await?;
        let (k, b, t, limit) = (
            k.clone(),
            bootstrap.to_string(),
            topic.clone(),
            cfg.txn_timeout,
        );
        let read = blocking(move || scan(&k, &b, &t, &floors, &recorded, limit)).await?;
        for p in &read.recreated {
            store.retire_offsets(topic, *p, state, clock.now()).await?;
        }
        let (written, others, known) = write_found(store, clock, topic, state, &read).await?;
        telemetry::ScanRecovered {
            topic,
            read: read.found.len(),
            recovered: written,
            already_recorded: known,
            others,
            recreated: &read.recreated,
        }
        .emit();
        store
            .record_scan_floors(topic, &read.ends, clock.now())
            .await?;
        out.read += read.found.len();
        out.others += others;
        match state {
            EventState::Dead => out.dead = written,
            _ => out.sent = written,
        }
    }
    Ok(out)
}

/// Matches what a scan read against the store: records of ours whose event is PENDING are
/// written as `state` at their offsets. Returns (written, others, already recorded).
async fn write_found(
    store: &Store,
    clock: &dyn Clock,
    topic: &str,
    state: EventState,
    read: &Scan,
) -> Result<(u64, usize, usize), DispatchError> {
    let ids: Vec<i64> = read
        .found
        .iter()
        .filter_map(|f| f.identity.event_id)
        .collect();
    let rows: HashMap<i64, _> = store
        .event_identities(&ids)
        .await?
        .into_iter()
        .map(|r| (r.event_id, r))
        .collect();
    let (mut acked, mut others, mut known) = (Vec::new(), 0, 0);
    let mut taken = std::collections::HashSet::new();
    let now = clock.now();
    for f in &read.found {
        match ours(&f.identity, &rows) {
            None => others += 1,
            // The first committed copy is the one written; a later copy is a duplicate.
            Some(EventState::Pending) if taken.insert(f.identity.event_id) => {
                acked.push(as_acked(f, now))
            }
            Some(_) => known += 1,
        }
    }
    let written = match state {
        EventState::Dead => store.mark_events_dead(&acked, topic).await?,
        _ => store.mark_events_sent(&acked, topic).await?,
    };
    Ok((written, others, known))
}

/// The state of the event of ours `identity` names, if it names one.
fn ours(
    identity: &RecordIdentity,
    rows: &HashMap<i64, crate::store::event_scan::EventIdentity>,
) -> Option<EventState> {
    let row = rows.get(&identity.event_id?)?;
    identity
        .is(row.event_id, row.ce_id.as_deref())
        .then_some(row.state)
}

fn as_acked(f: &Found, at: chrono::DateTime<chrono::Utc>) -> Acked {
    Acked {
        event_id: f.identity.event_id.unwrap_or_default(),
        partition: f.partition,
        offset: f.offset,
        at,
    }
}

/// Records both topics' ends as their scan floors. Call only between transactions, with
/// every committed one's outcome written (the dispatcher's state holds nothing unwritten).
pub async fn record_floors(
    store: &Store,
    producer: &EventProducer,
    clock: &dyn Clock,
    cfg: &DispatchConfig,
) -> Result<(), DispatchError> {
    // Short: it runs before a round, and a broker that does not answer fails the round anyway.
    let timeout = cfg.txn_timeout.min(std::time::Duration::from_secs(5));
    for topic in [&cfg.topic, &cfg.dlq_topic] {
        let ends = producer
            .partition_ends(topic, timeout)
            .await
            .map_err(|e| DispatchError::Recover(format!("{topic}: partition ends: {e}")))?;
        store.record_scan_floors(topic, &ends, clock.now()).await?;
    }
    Ok(())
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RecoverError> + Send + 'static,
) -> Result<T, DispatchError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| DispatchError::Recover(e.to_string()))?
        .map_err(|e| DispatchError::Recover(e.to_string()))
}

/// One transactional round (see the module doc). A fatal producer error (fenced: another
/// holder's producer took over our `transactional.id`) is returned: only a new producer,
/// after the lease is confirmed, may go on.
pub async fn send_txn_round(
    store: &Store,
    producer: &EventProducer,
    clock: &dyn Clock,
    cfg: &DispatchConfig,
    skips: &Skips,
) -> Result<(RoundReport, Unrecorded), DispatchError> {
    let sel = select_split(store, clock, cfg, skips).await?;
    if sel.is_empty() {
        return Ok((sel.report, Unrecorded::default()));
    }
    let Selected {
        exhausted,
        live,
        now,
        mut report,
        t0,
    } = sel;
    let mut out = Unrecorded::default();
    // A begin refused for the state it is in (a transaction of this producer left open)
    // would be refused at every round: the producer is given up.
    producer
        .begin_transaction()
        .map_err(|e| left_open("begin", e.into()))?;
    let sends_began = std::time::Instant::now();
    // Queued in event order (join_all polls each future, and so queues its record, in turn):
    // one key's events keep their order inside the transaction.
    let sends = join_all(live.iter().map(|ev| {
        let headers = cloudevents::attributes(ev, &cfg.ce_source);
        send_one(producer, clock, ev, Target::events(&cfg.topic), headers)
    }));
    let dead_letters = send_dead_letters(producer, clock, &exhausted, cfg);
    let (results, dlq_results) = futures::join!(sends, dead_letters);
    let all_acked = results
        .iter()
        .chain(&dlq_results)
        .all(|r| matches!(r, SendResult::Acked(..)));
    if !all_acked {
        abort(producer, cfg).await?;
        file_failures(
            &live,
            &results,
            &exhausted,
            &dlq_results,
            now,
            cfg,
            &mut out,
        );
        report.failed = out.failures.len();
        report.failures = first_failures(&out);
        // The others go again at once, without the failed ones (their keys are held).
        report.full = true;
        report.stages[1] = t0.elapsed() - report.stages[0];
        return Ok((report, out));
    }
    if let Err(e) = commit(store, producer, cfg)
        .await
        .map_err(|e| left_open("commit", e))?
    {
        // Aborted: nothing of it is visible; the whole batch goes again.
        tracing::warn!(error = %e, "kafka transaction commit failed; the round was aborted");
        report.failures = vec![(0, e.to_string())];
        report.failed = live.len() + exhausted.len();
        return Ok((report, out));
    }
    // The dangerous window of seed §4's last row: committed, not yet SENT.
    crate::failpoint::hit("dispatch_after_ack");
    file_commit(&live, results, clock, sends_began, &mut report, &mut out);
    collect_dead_letter_results(&exhausted, dlq_results, now, cfg, &mut report, &mut out);
    report.stages[1] = t0.elapsed() - report.stages[0];
    Ok((report, out))
}

/// Commits the open transaction, the lease confirmed through the fenced store right before
/// each call: Ok(Ok) committed; Ok(Err) failed and aborted (nothing visible). A commit whose
/// outcome is unknown (timed out: librdkafka keeps it running) is called again, as librdkafka
/// documents, never aborted and re-sent (which, if it then landed, would put the batch in the
/// log twice); still unknown after [`COMMIT_TRIES`], or fatal: Err, and the dispatcher gives
/// the producer up (the next one's `init_transactions` settles it, its recovery reads it).
async fn commit(
    store: &Store,
    producer: &EventProducer,
    cfg: &DispatchConfig,
) -> Result<Result<(), ProducerError>, DispatchError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        store.confirm_fence().await?;
        let e = match producer.commit_transaction(cfg.txn_timeout).await {
            Ok(()) => return Ok(Ok(())),
            Err(e) => e,
        };
        if e.is_fatal() {
            return Err(e.into());
        }
        if e.is_retriable() && !e.requires_abort() {
            if attempt >= COMMIT_TRIES {
                return Err(DispatchError::CommitUnresolved(e.to_string()));
            }
            telemetry::commit_retried(attempt, &e);
            continue;
        }
        abort(producer, cfg).await?;
        return Ok(Err(e));
    }
}

/// An error of `what` (the begin, or the commit: the store failed its fence check, before the
/// first call or between calls) inside a round leaves the transaction open, perhaps
/// committing: give the producer up (a fatal error passes as it is).
fn left_open(what: &str, e: DispatchError) -> DispatchError {
    if e.producer_fatal() {
        return e;
    }
    DispatchError::TransactionLeftOpen(format!("{what}: {e}"))
}

/// Aborts the open transaction; a fatal error (fenced) is returned, any other is logged
/// (librdkafka aborts on its own by the transaction timeout at worst).
async fn abort(producer: &EventProducer, cfg: &DispatchConfig) -> Result<(), ProducerError> {
    match producer.abort_transaction(cfg.txn_timeout).await {
        Ok(()) => Ok(()),
        Err(e) if e.is_fatal() => Err(e),
        Err(e) => {
            tracing::warn!(error = %e, "kafka transaction abort failed");
            Ok(())
        }
    }
}

/// A committed round: every ack is written as SENT by the next outcome write, stamped with
/// the commit's time (a `read_committed` reader sees the record from then on), and timed to it.
fn file_commit(
    live: &[PendingEvent],
    results: Vec<SendResult>,
    clock: &dyn Clock,
    sends_began: std::time::Instant,
    report: &mut RoundReport,
    out: &mut Unrecorded,
) {
    let committed_at = clock.now();
    for (ev, r) in live.iter().zip(results) {
        if let SendResult::Acked(a, _) = r {
            out.acked.push(Acked {
                at: committed_at,
                ..a
            });
            report.timings.push(AckTiming {
                produce: sends_began.elapsed(),
                commit_to_ack: (chrono::Utc::now() - ev.created_at).to_std().ok(),
            });
        }
    }
    report.acked = out.acked.len();
}

/// An aborted round: the failed sends back off (exhausted ones are copied to the DLQ next), a
/// failed dead-letter copy waits for the longest retry delay; their keys are held until the
/// failures are written. Events whose send succeeded are not filed: they go again.
fn file_failures(
    live: &[PendingEvent],
    results: &[SendResult],
    exhausted: &[PendingEvent],
    dlq_results: &[SendResult],
    at: chrono::DateTime<chrono::Utc>,
    cfg: &DispatchConfig,
    out: &mut Unrecorded,
) {
    for (ev, r) in live.iter().zip(results) {
        if let SendResult::Failed(_, error) = r {
            let next_attempt_at = match rules::after_failure(ev.attempts + 1, at, &cfg.retry) {
                AfterFailure::RetryAt(t) => t,
                AfterFailure::Exhausted => at,
            };
            out.failures.push(SendFailure {
                event_id: ev.event_id,
                next_attempt_at,
                error: error.clone(),
            });
            out.hold_keys.push(ev.flight_key.clone());
        }
    }
    for (ev, r) in exhausted.iter().zip(dlq_results) {
        if let SendResult::Failed(_, e) = r {
            out.failures.push(SendFailure {
                event_id: ev.event_id,
                next_attempt_at: rules::add(at, cfg.retry.retry_max),
                error: format!("dead-letter copy failed: {e}"),
            });
            out.hold_keys.push(ev.flight_key.clone());
        }
    }
}

fn first_failures(out: &Unrecorded) -> Vec<(i64, String)> {
    out.failures
        .iter()
        .take(5)
        .map(|f| (f.event_id, f.error.clone()))
        .collect()
}
