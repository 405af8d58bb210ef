//! `kafka.delivery = "exactly-once"`: one dispatch round is one Kafka transaction, and the
//! dispatcher's start learns from Kafka what committed transactions delivered before the store
//! heard of it (KIP-98's transactional producer; the recovery follows KIP-618's "the offsets
//! are in the same transaction" idea with the topic itself as the record of progress).
//!
//! - [`prepare`]: `init_transactions` (fencing every earlier producer with our
//!   `transactional.id` and aborting its open transaction), then [`recover`].
//! - [`recover`]: reads the events topic (and the dead-letter topic) `read_committed` from the
//!   highest offset the store has as SENT (DEAD) per partition, and writes SENT (DEAD) with the
//!   offsets for every PENDING event found there. Nothing found is sent again.
//! - [`send_txn_round`]: the whole batch (many events per key) in one transaction; all acked →
//!   commit → the acks go to the outcome write (SENT after the commit); any failed send →
//!   abort, the failed events back off (DLQ after their last attempt, as in at-least-once) and
//!   the rest go again at once without them.

use futures::future::join_all;

use super::cloudevents;
use super::outcome::{Skips, Unrecorded};
use super::round::{
    collect_dead_letter_results, select_split, send_dead_letters, send_one, AckTiming,
    DispatchConfig, DispatchError, RoundReport, Selected, SendResult,
};
use super::rules::{self, AfterFailure};
use crate::clock::Clock;
use crate::kafka::recover::{committed_after, Found, RecoverError};
use crate::kafka::{EventProducer, ProducerError};
use crate::rows::EventState;
use crate::settings::KafkaSettings;
use crate::store::events::{Acked, PendingEvent, SendFailure};
use crate::store::Store;

/// What [`recover`] wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Records read from the events topic after the highest SENT offsets.
    pub read: usize,
    /// PENDING events found there, now SENT.
    pub sent: u64,
    /// PENDING events found on the dead-letter topic, now DEAD.
    pub dead: u64,
}

/// `init_transactions`, then [`recover`]. The caller holds the lease (checked right before
/// and again right after, so a holder frozen before this call cannot go on past it).
pub async fn prepare(
    store: &Store,
    producer: &EventProducer,
    clock: &dyn Clock,
    k: &KafkaSettings,
    bootstrap: &str,
    cfg: &DispatchConfig,
) -> Result<Recovered, DispatchError> {
    producer.init_transactions(cfg.txn_timeout).await?;
    recover(store, clock, k, bootstrap, cfg).await
}

/// Writes SENT (DEAD) for the PENDING events a committed transaction already delivered to the
/// events (dead-letter) topic. Run after `init_transactions` and before the first round.
pub async fn recover(
    store: &Store,
    clock: &dyn Clock,
    k: &KafkaSettings,
    bootstrap: &str,
    cfg: &DispatchConfig,
) -> Result<Recovered, DispatchError> {
    let sent_after = store.last_offsets(EventState::Sent).await?;
    let dead_after = store.last_offsets(EventState::Dead).await?;
    let (k1, k2, b1, b2) = (
        k.clone(),
        k.clone(),
        bootstrap.to_string(),
        bootstrap.to_string(),
    );
    let (topic, dlq, limit) = (cfg.topic.clone(), cfg.dlq_topic.clone(), cfg.txn_timeout);
    let found = blocking(move || committed_after(&k1, &b1, &topic, &sent_after, limit)).await?;
    let found_dead = blocking(move || committed_after(&k2, &b2, &dlq, &dead_after, limit)).await?;
    let now = clock.now();
    let as_acked = |f: &[Found]| -> Vec<Acked> {
        f.iter()
            .map(|f| Acked {
                event_id: f.event_id,
                partition: f.partition,
                offset: f.offset,
                at: now,
            })
            .collect()
    };
    let sent = store.mark_events_sent(&as_acked(&found)).await?;
    let dead = store.mark_events_dead(&as_acked(&found_dead)).await?;
    Ok(Recovered {
        read: found.len(),
        sent,
        dead,
    })
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
    producer.begin_transaction()?;
    let sends_began = std::time::Instant::now();
    // Queued in event order (join_all polls each future, and so queues its record, in turn):
    // one key's events keep their order inside the transaction.
    let sends = join_all(live.iter().map(|ev| {
        let headers = cloudevents::attributes(ev, &cfg.ce_source);
        send_one(producer, clock, ev, &cfg.topic, headers)
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
    if let Err(e) = producer.commit_transaction(cfg.txn_timeout).await {
        if e.is_fatal() {
            return Err(e.into());
        }
        // Nothing of it is visible; the whole batch goes again.
        tracing::warn!(error = %e, "kafka transaction commit failed; aborting the round");
        abort(producer, cfg).await?;
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
