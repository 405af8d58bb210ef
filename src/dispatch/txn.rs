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
//!   SENT/DEAD) to its end (the high watermark seen at start, waiting out another producer's
//!   open transaction that holds the last stable offset below it), takes only records of
//!   ours (the event's `ce_id` UUID and its `ce_msgxevent` number, on the dead-letter topic
//!   the copy's own `ce_id`; the previous release's copy by its number, inbox message, key
//!   and time: [`ours`]) and writes SENT (DEAD) with the offsets for every PENDING one
//!   found; then raises the floors to the ends (never lowers them, except on a partition
//!   found recreated: its end lies below every record ever written there).
//! - [`send_txn_round`]: the whole batch (many events per key) in one transaction; all acked →
//!   every partition it wrote gets a scan floor if it has none (partitions and topics created
//!   since the start included; a store failure there gives the producer up, as at the fence
//!   check) → commit (the lease confirmed through the fenced store right before; a commit whose outcome
//!   is unknown is called again, never taken for "nothing visible") → the acks go to the
//!   outcome write (SENT after the commit); any failed send → abort, the failed events back off
//!   (DLQ after their last attempt, as in at-least-once) and the rest go again at once.
//! - [`recover_previous_release`]: the `at-least-once` start's read-back after a rolling
//!   upgrade (only while events an earlier release made are PENDING): the previous release's
//!   copies only, so an event it delivered is not sent again under another identity.
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
use crate::kafka::consumer::{EventFacts, RecordIdentity};
use crate::kafka::recover::{scan, Found, RecoverError, Scan, ScanLimits};
use crate::kafka::{EventProducer, ProducerError};
use crate::rows::EventState;
use crate::settings::KafkaSettings;
use crate::store::event_scan::EventIdentity;
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

/// Which records a read-back takes for ours, and what it keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadBack {
    /// The exactly-once start: every record of ours (this release's and the previous
    /// release's); recreated partitions retired, the floors raised to the ends.
    ExactlyOnce,
    /// The at-least-once start while events an earlier release made are PENDING: only the
    /// previous release's copies (this release's own records are sent again, as at-least-once
    /// does, under the same identity); partitions without a cursor read from their first
    /// offset, then the floors raised to the ends; nothing retired.
    PreviousRelease,
}

/// Writes SENT (DEAD) for the PENDING events of ours a committed transaction already
/// delivered to the events (dead-letter) topic, then raises both topics' floors to the ends
/// seen at start (a recreated partition's is reset to its new end). Run after
/// `init_transactions` and before the first round.
pub async fn recover(
    store: &Store,
    clock: &dyn Clock,
    k: &KafkaSettings,
    bootstrap: &str,
    cfg: &DispatchConfig,
) -> Result<Recovered, DispatchError> {
    read_back(store, clock, k, bootstrap, cfg, ReadBack::ExactlyOnce).await
}

/// `at-least-once`: before the first round, while a PENDING event an earlier release made is
/// left ([`Store::pending_made_by_earlier_release`]), reads both topics back for the previous
/// release's copies (its number as `ce_id`, with the event's inbox message, key and time) and
/// writes SENT (DEAD) at their offsets: an event the previous release delivered and did not
/// record before it stopped (a rolling upgrade) is not sent again under another identity.
/// Nothing to do (no read) once every such event is written.
pub async fn recover_previous_release(
    store: &Store,
    clock: &dyn Clock,
    k: &KafkaSettings,
    bootstrap: &str,
    cfg: &DispatchConfig,
) -> Result<Recovered, DispatchError> {
    if !store.pending_made_by_earlier_release().await? {
        return Ok(Recovered::default());
    }
    read_back(store, clock, k, bootstrap, cfg, ReadBack::PreviousRelease).await
}

async fn read_back(
    store: &Store,
    clock: &dyn Clock,
    k: &KafkaSettings,
    bootstrap: &str,
    cfg: &DispatchConfig,
    which: ReadBack,
) -> Result<Recovered, DispatchError> {
    let exactly_once = which == ReadBack::ExactlyOnce;
    let mut out = Recovered::default();
    for (topic, state) in [
        (&cfg.topic, EventState::Sent),
        (&cfg.dlq_topic, EventState::Dead),
    ] {
        let floors = store.scan_floors(topic).await?;
        let recorded = store.last_offsets(topic, state).await?;
        let limits = ScanLimits {
            read: cfg.txn_timeout,
            open_wait: cfg.open_txn_wait,
            uncursored_from_start: !exactly_once,
        };
        let (k, b, t) = (k.clone(), bootstrap.to_string(), topic.clone());
        let read = blocking(move || scan(&k, &b, &t, &floors, &recorded, limits)).await?;
        if exactly_once {
            for p in &read.recreated {
                store.retire_offsets(topic, *p, state, clock.now()).await?;
            }
        }
        let (written, others, known) =
            write_found(store, clock, topic, state, &read, which).await?;
        telemetry::ScanRecovered {
            topic,
            read: read.found.len(),
            recovered: written,
            already_recorded: known,
            others,
            recreated: &read.recreated,
        }
        .emit();
        let (gone, kept): (Vec<_>, Vec<_>) = read
            .ends
            .iter()
            .copied()
            .partition(|(p, _)| exactly_once && read.recreated.contains(p));
        store.reset_scan_floors(topic, &gone, clock.now()).await?;
        store.record_scan_floors(topic, &kept, clock.now()).await?;
        out.read += read.found.len();
        out.others += others;
        match state {
            EventState::Dead => out.dead = written,
            _ => out.sent = written,
        }
    }
    Ok(out)
}

/// Matches what a scan read against the store: records of ours (for `which`) whose event is
/// PENDING are written as `state` at their offsets. Returns (written, others, already
/// recorded); this release's own records skipped by an at-least-once read-back count in none.
async fn write_found(
    store: &Store,
    clock: &dyn Clock,
    topic: &str,
    state: EventState,
    read: &Scan,
    which: ReadBack,
) -> Result<(u64, usize, usize), DispatchError> {
    let ids: Vec<i64> = read
        .found
        .iter()
        .filter_map(|f| f.identity.number())
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
        let row_state = match (ours(&f.identity, &rows, state), which) {
            (None, _) => {
                others += 1;
                continue;
            }
            (Some(Whose::Current(_)), ReadBack::PreviousRelease) => continue,
            (Some(Whose::Current(s) | Whose::PreviousRelease(s)), _) => s,
        };
        match row_state {
            // The first committed copy is the one written; a later copy is a duplicate.
            EventState::Pending if taken.insert(f.identity.number()) => {
                acked.push(as_acked(f, now))
            }
            _ => known += 1,
        }
    }
    let written = match state {
        EventState::Dead => store.mark_events_dead(&acked, topic).await?,
        _ => store.mark_events_sent(&acked, topic).await?,
    };
    Ok((written, others, known))
}

/// A record of ours, by whom it was sent, with the event's state now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Whose {
    /// Sent by this release (or one since issue 40): the event's UUID and number.
    Current(EventState),
    /// Sent by the previous release: its number as `ce_id`, the event's message, key, time.
    PreviousRelease(EventState),
}

/// The event of ours `identity` names, if it names one, read on the topic whose records
/// become `state`: on the events topic a record with the event's `ce_id`; on the dead-letter
/// topic one with the copy's own `ce_id` (a copy made before a requeue has another, so it
/// never takes the requeue back), or the event's (a copy an earlier build made); on either,
/// the previous release's copy (its number as `ce_id`, with the event's inbox message, key
/// and time).
fn ours(
    identity: &RecordIdentity,
    rows: &HashMap<i64, EventIdentity>,
    state: EventState,
) -> Option<Whose> {
    let row = rows.get(&identity.number()?)?;
    let own = match state {
        EventState::Dead => [row.dead_ce_id.as_deref(), row.ce_id.as_deref()],
        _ => [row.ce_id.as_deref(), None],
    };
    let facts = EventFacts {
        event_id: row.event_id,
        msg_id: row.msg_id,
        flight_key: &row.flight_key,
        created_at: row.created_at,
    };
    if own
        .into_iter()
        .flatten()
        .any(|id| identity.is(row.event_id, Some(id)))
    {
        Some(Whose::Current(row.state))
    } else if identity.is_previous_release_copy(&facts) {
        Some(Whose::PreviousRelease(row.state))
    } else {
        None
    }
}

fn as_acked(f: &Found, at: chrono::DateTime<chrono::Utc>) -> Acked {
    Acked {
        event_id: f.identity.number().unwrap_or_default(),
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
    // A store failure here leaves the transaction open, as the fence check's in `commit`
    // does: the producer is given up (its successor's `init_transactions` ends the
    // transaction, its recovery reads back whatever the log holds). Not abort-and-send-again:
    // that re-sends a batch whose aborted copy a broker keeping aborted records visible to
    // `read_committed` (tansu, librdkafka's mock) shows beside the new one, as a duplicate
    // (issue 53's r14 duplicates).
    cursor_before_commit(store, clock, cfg, &results, &dlq_results)
        .await
        .map_err(|e| left_open("cursor before commit", e.into()))?;
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

/// Gives every partition this transaction wrote (events topic and dead-letter topic, including
/// partitions added and topics created since the start) a scan floor at or below our first
/// record there, if it has none, before the commit: a crash after the commit and before
/// SENT/DEAD is written then finds the records on the next start (the recovery reads only
/// partitions with a cursor).
async fn cursor_before_commit(
    store: &Store,
    clock: &dyn Clock,
    cfg: &DispatchConfig,
    results: &[SendResult],
    dlq_results: &[SendResult],
) -> Result<(), crate::store::StoreError> {
    for (topic, rs) in [(&cfg.topic, results), (&cfg.dlq_topic, dlq_results)] {
        let first: Vec<(i32, i64)> = rs
            .iter()
            .filter_map(|r| match r {
                SendResult::Acked(a, _) => Some((a.partition, a.offset)),
                SendResult::Failed(..) => None,
            })
            .collect();
        store.ensure_scan_floors(topic, &first, clock.now()).await?;
    }
    Ok(())
}

/// Commits the open transaction, the lease confirmed through the fenced store right before
/// each call: Ok(Ok) committed; Ok(Err) failed and aborted (nothing visible). Only an error
/// librdkafka classifies as "the transaction must be aborted" is taken for nothing visible
/// (KIP-98: such a transaction can no longer commit). A commit whose outcome is unknown
/// (timed out: librdkafka keeps it running) is called again, as librdkafka documents, never
/// aborted and re-sent (which, if it then landed, would put the batch in the log twice);
/// still unknown after [`COMMIT_TRIES`], fatal, or an error of no known class: Err, and the
/// dispatcher gives the producer up (the next one's `init_transactions` settles it, its
/// recovery reads it).
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
        match after_commit_error(&e, attempt) {
            AfterCommitError::Retry => telemetry::commit_retried(attempt, &e),
            AfterCommitError::Abort => {
                abort(producer, cfg).await?;
                return Ok(Err(e));
            }
            AfterCommitError::GiveUp if e.is_fatal() => return Err(e.into()),
            AfterCommitError::GiveUp => {
                return Err(DispatchError::CommitUnresolved(format!(
                    "after {attempt} call(s): {e}"
                )))
            }
        }
    }
}

/// What a failed commit call leaves (see [`commit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterCommitError {
    /// Outcome unknown, librdkafka still resolving it: call commit again.
    Retry,
    /// The transaction cannot commit (librdkafka: abort required): abort, nothing is visible.
    Abort,
    /// Fenced or broken, still unknown after every call, or an error nobody classified: the
    /// transaction may be committed, so nothing of it may go again from this producer.
    GiveUp,
}

fn after_commit_error(e: &ProducerError, attempt: u32) -> AfterCommitError {
    if e.is_fatal() {
        AfterCommitError::GiveUp
    } else if e.requires_abort() {
        AfterCommitError::Abort
    } else if e.is_retriable() && attempt < COMMIT_TRIES {
        AfterCommitError::Retry
    } else {
        AfterCommitError::GiveUp
    }
}

/// An error of `what` (the begin, the cursor written before the commit, or the commit: the
/// store failed its fence check, before the first call or between calls) inside a round leaves the transaction open, perhaps
/// committing: give the producer up (a fatal error passes as it is).
fn left_open(what: &str, e: DispatchError) -> DispatchError {
    if e.producer_fatal() {
        return e;
    }
    DispatchError::TransactionLeftOpen(format!("{what}: {e}"))
}

/// Aborts the open transaction. Any failure gives the producer up: a fatal one (fenced) as it
/// is, any other as a transaction left open (its successor's `init_transactions` aborts it),
/// since only a completed abort says nothing of it is visible.
async fn abort(producer: &EventProducer, cfg: &DispatchConfig) -> Result<(), DispatchError> {
    match producer.abort_transaction(cfg.txn_timeout).await {
        Ok(()) => Ok(()),
        Err(e) if e.is_fatal() => Err(e.into()),
        Err(e) => Err(DispatchError::TransactionLeftOpen(format!("abort: {e}"))),
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

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::error::KafkaError;

    fn commit_error(source: KafkaError) -> ProducerError {
        ProducerError::Transaction {
            op: "commit",
            source,
        }
    }

    #[test]
    fn a_commit_error_of_no_known_class_gives_the_producer_up() {
        // Not librdkafka's transaction error at all (the blocking call was cancelled or
        // panicked, or any other error): whether the commit landed is unknown.
        for source in [
            KafkaError::Canceled,
            KafkaError::Global(rdkafka::types::RDKafkaErrorCode::Unknown),
        ] {
            let e = commit_error(source);
            assert_eq!(after_commit_error(&e, 1), AfterCommitError::GiveUp, "{e}");
        }
    }
}
