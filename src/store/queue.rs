//! `PROC_STATE` as the pump's queue: the head rows, FAILED with backoff, and the one-statement
//! terminal states (non-business, poison).

use chrono::{DateTime, Utc};

use super::{truncate, GroupTx, Store, StoreError};
use crate::rows::{ErrorClass, Head, ProcState, SingleTerminal, Source};

/// The head with what the metrics need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadRow {
    /// Decision inputs.
    pub head: Head,
    /// Receive time, else enqueue time: the head's age.
    pub since: DateTime<Utc>,
    /// Where the row came from: a `LATE` row is processed with the ordering guard.
    pub source: Source,
}

/// Backlog facts for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backlog {
    /// PENDING + FAILED rows.
    pub unfinished: i64,
    /// Oldest receive (else enqueue) time among them.
    pub oldest: Option<DateTime<Utc>>,
}

/// The unfinished rows ([`ProcState::is_unfinished`]) as SQL. A literal, not a bound value:
/// the partial index `proc_state_head_idx` (migration 0001) has this predicate, and the
/// planner only uses it for a query that repeats it.
pub(super) const UNFINISHED: &str = "state IN ('PENDING', 'FAILED')";

/// Longest `error_text` kept.
pub(super) const ERROR_TEXT_MAX: usize = 2000;

/// `msg_id, state, attempts, next_attempt_at, processing_started_at, since, source`.
pub(super) type HeadTuple = (
    i64,
    ProcState,
    i32,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
    DateTime<Utc>,
    String,
);

impl Store {
    /// Poison escalation: DEAD(EXHAUSTED) with the backfill intent, in ONE statement that
    /// re-checks the poison facts on the row itself — so an operator replay that reset the row
    /// in between makes this a no-op instead of being overwritten (lifecycle gate, G5).
    pub async fn poison(
        &self,
        msg_id: i64,
        max_attempts: i32,
        deadline_before: DateTime<Utc>,
        detail: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(&format!(
            "UPDATE proc_state SET state = 'DEAD', error_class = 'EXHAUSTED', error_text = $2, \
                    terminal_reason = 'EXHAUSTED', terminal_at = $3, next_attempt_at = NULL, \
                    processed_seq = nextval('proc_order_seq'), backfill_next_at = $3, updated_at = $3 \
             WHERE msg_id = $1 AND {UNFINISHED} \
               AND (attempts >= $4 OR (state = 'FAILED' AND processing_started_at <= $5))"
        ))
        .bind(msg_id)
        .bind(truncate(detail, ERROR_TEXT_MAX))
        .bind(now)
        .bind(max_attempts)
        .bind(deadline_before)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The backlog gauges from index-backed reads only, cheap at any backlog: an exact count
    /// up to [`EXACT_BACKLOG_UP_TO`] rows of the partial head index, above that the id span of
    /// the unfinished rows (`max − min + 1`: in FIFO order the unfinished rows are one run of
    /// ids, so this overcounts only by the inbox's rolled-back holes); the oldest is the head's
    /// receive (else enqueue) time.
    pub async fn backlog_gauges(&self) -> Result<Backlog, StoreError> {
        let (counted, first, last, oldest): (i64, Option<i64>, Option<i64>, Option<DateTime<Utc>>) =
            sqlx::query_as(&format!(
                "SELECT (SELECT count(*) FROM (SELECT 1 FROM proc_state WHERE {UNFINISHED} \
                                                ORDER BY msg_id LIMIT $1) c), \
                        (SELECT min(msg_id) FROM proc_state WHERE {UNFINISHED}), \
                        (SELECT max(msg_id) FROM proc_state WHERE {UNFINISHED}), \
                        (SELECT COALESCE(received_at, enqueued_at) FROM proc_state \
                          WHERE {UNFINISHED} ORDER BY msg_id LIMIT 1)"
            ))
            .bind(EXACT_BACKLOG_UP_TO)
            .fetch_one(self.pool())
            .await?;
        Ok(Backlog {
            unfinished: bounded_count(counted, first, last),
            oldest,
        })
    }
}

/// Up to this many unfinished rows (or pending events) a backlog gauge is an exact count.
pub const EXACT_BACKLOG_UP_TO: i64 = 10_000;

/// A backlog gauge from a count capped at [`EXACT_BACKLOG_UP_TO`] index entries: that count
/// while below the cap, above it the id span `first..=last` of the backlog (an upper bound).
pub(super) fn bounded_count(counted: i64, first: Option<i64>, last: Option<i64>) -> i64 {
    match (first, last) {
        (Some(first), Some(last)) if counted >= EXACT_BACKLOG_UP_TO => {
            (last - first + 1).max(counted)
        }
        _ => counted,
    }
}

/// A head row as read from `proc_state`.
pub(super) fn head_row(
    (msg_id, state, attempts, next, started, since, source): HeadTuple,
) -> Result<HeadRow, StoreError> {
    let source = Source::try_from(source.as_str())
        .map_err(|_| StoreError::Corrupt(format!("proc_state {msg_id}: source {source:?}")))?;
    Ok(HeadRow {
        head: Head {
            msg_id,
            failed: state == ProcState::Failed,
            attempts,
            next_attempt_at: next,
            processing_started_at: started,
        },
        since,
        source,
    })
}

impl GroupTx {
    /// FAILED with a class and the next attempt time (the group ends with this message).
    pub async fn mark_failed(
        &mut self,
        msg_id: i64,
        class: ErrorClass,
        detail: &str,
        next_attempt_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        self.failed(msg_id, class, detail, [next_attempt_at, now], None)
            .await
    }

    /// FAILED(INFRA) after a store outage, not charged to the message (SPEC §4): `attempts`
    /// back to `attempts_before` (its value before this attempt's stamp) and no
    /// `processing_started_at`, so the head deadline starts again at the next attempt (see
    /// `PumpCore::outage`).
    pub async fn mark_failed_uncharged(
        &mut self,
        msg_id: i64,
        detail: &str,
        next_attempt_at: DateTime<Utc>,
        now: DateTime<Utc>,
        attempts_before: i32,
    ) -> Result<bool, StoreError> {
        let times = [next_attempt_at, now];
        self.failed(
            msg_id,
            ErrorClass::Infra,
            detail,
            times,
            Some(attempts_before),
        )
        .await
    }

    /// FAILED, due at `next` (`[next, now]`); with `restore`, `attempts` set to it and
    /// `processing_started_at` cleared as well.
    async fn failed(
        &mut self,
        msg_id: i64,
        class: ErrorClass,
        detail: &str,
        [next, now]: [DateTime<Utc>; 2],
        restore: Option<i32>,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(&format!(
            "UPDATE proc_state SET state = 'FAILED', error_class = $2, error_text = $3, \
                    next_attempt_at = $4, updated_at = $5, attempts = COALESCE($6, attempts), \
                    processing_started_at = CASE WHEN $6 IS NULL THEN processing_started_at END \
             WHERE msg_id = $1 AND {UNFINISHED}"
        ))
        .bind(msg_id)
        .bind(class)
        .bind(truncate(detail, ERROR_TEXT_MAX))
        .bind(next)
        .bind(now)
        .bind(restore)
        .execute(&mut *self.tx)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// A non-business terminal state (DEAD, SKIPPED) in ONE statement that also sets the
    /// backfill intent and the processing order (seed §2 write boundaries).
    pub async fn finish_single(
        &mut self,
        msg_id: i64,
        state: SingleTerminal,
        class: ErrorClass,
        detail: &str,
        msg_type: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(&format!(
            "UPDATE proc_state SET state = $2, error_class = $3, error_text = $4, \
                    terminal_reason = $3, terminal_at = $5, next_attempt_at = NULL, \
                    processed_seq = nextval('proc_order_seq'), backfill_next_at = $5, \
                    msg_type = COALESCE($6, msg_type), updated_at = $5 \
             WHERE msg_id = $1 AND {UNFINISHED}"
        ))
        .bind(msg_id)
        .bind(state.state())
        .bind(class)
        .bind(truncate(detail, ERROR_TEXT_MAX))
        .bind(now)
        .bind(msg_type)
        .execute(&mut *self.tx)
        .await?;
        Ok(done.rows_affected() == 1)
    }
}
