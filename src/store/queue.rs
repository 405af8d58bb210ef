//! `PROC_STATE` as the pump's queue: the head, stamping an attempt, FAILED with backoff, and
//! the one-statement terminal states (non-business, poison).

use chrono::{DateTime, Utc};
use sqlx::{Executor, Postgres};

use super::{Store, StoreError};
use crate::late::Source;
use crate::pump::outcome::{ErrorClass, SingleTerminal};
use crate::pump::rules::Head;

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

/// Result of binding a message's business identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Binding {
    /// This message holds the identity (first binding, or bound on an earlier attempt).
    Bound,
    /// Another message holds it: a business duplicate.
    Duplicate {
        /// The message that holds it.
        holder: Option<i64>,
    },
}

pub(super) const UNFINISHED: &str = "state IN ('PENDING', 'FAILED')";

/// `msg_id, state, attempts, next_attempt_at, processing_started_at, since, source`.
pub(super) type HeadTuple = (
    i64,
    String,
    i32,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
    DateTime<Utc>,
    String,
);

impl Store {
    /// The smallest unfinished MSG_ID ≤ W (partial index `proc_state_head_idx`).
    pub async fn head(&self) -> Result<Option<HeadRow>, StoreError> {
        let row: Option<HeadTuple> = sqlx::query_as(&format!(
            "SELECT msg_id, state, attempts, next_attempt_at, processing_started_at, \
                        COALESCE(received_at, enqueued_at), source \
                 FROM proc_state \
                 WHERE {UNFINISHED} AND msg_id <= (SELECT w FROM inbox_cursor WHERE id = 1) \
                 ORDER BY msg_id LIMIT 1"
        ))
        .fetch_optional(self.pool())
        .await?;
        row.map(head_row).transpose()
    }

    /// Up to `limit` unfinished ids ≤ W from `from` on (the raw read-ahead window).
    pub async fn next_unfinished(&self, from: i64, limit: i64) -> Result<Vec<i64>, StoreError> {
        Ok(sqlx::query_scalar(&format!(
            "SELECT msg_id FROM proc_state \
             WHERE {UNFINISHED} AND msg_id >= $1 \
               AND msg_id <= (SELECT w FROM inbox_cursor WHERE id = 1) \
             ORDER BY msg_id LIMIT $2"
        ))
        .bind(from)
        .bind(limit)
        .fetch_all(self.pool())
        .await?)
    }

    /// Starts an attempt: counts it, stamps PROCESSING_STARTED_AT once. Returns the attempt
    /// number, or None when the row is no longer unfinished.
    pub async fn stamp_attempt(
        &self,
        msg_id: i64,
        now: DateTime<Utc>,
    ) -> Result<Option<i32>, StoreError> {
        // Relaxed commit (one autocommit statement on the relaxed pool): the business
        // transaction's synchronous commit flushes the WAL up to and including this record, so
        // the stamp is durable whenever its outcome is; a crash before that may lose it, and
        // the attempt is simply stamped again.
        Ok(sqlx::query_scalar(&format!(
            "UPDATE proc_state SET attempts = attempts + 1, \
                    processing_started_at = COALESCE(processing_started_at, $2), updated_at = $2 \
             WHERE msg_id = $1 AND {UNFINISHED} RETURNING attempts"
        ))
        .bind(msg_id)
        .bind(now)
        .fetch_optional(self.relaxed())
        .await?)
    }

    /// FAILED with a class and the next attempt time.
    pub async fn mark_failed(
        &self,
        msg_id: i64,
        class: ErrorClass,
        detail: &str,
        next_attempt_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        mark_failed_on(self.pool(), msg_id, class, detail, next_attempt_at, now).await
    }

    /// A non-business terminal state (MALFORMED, SKIPPED, EXHAUSTED…) in ONE statement that
    /// also sets the backfill intent and the processing order (seed §2 write boundaries).
    pub async fn finish_single(
        &self,
        msg_id: i64,
        state: SingleTerminal,
        class: ErrorClass,
        detail: &str,
        msg_type: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        finish_single_on(self.pool(), msg_id, state, class, detail, msg_type, now).await
    }

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
        .bind(truncate(detail))
        .bind(now)
        .bind(max_attempts)
        .bind(deadline_before)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Binds the identity in its own statement; first binding wins (unique index over the
    /// rows that are not DEAD: a DEAD record does not hold its identity, migration 0012).
    pub async fn bind_identity(&self, msg_id: i64, key: &str) -> Result<Binding, StoreError> {
        // Relaxed commit (relaxed pool), as for the stamp: the binding is durable no later than
        // the business transaction that follows it; if a crash loses it, the next attempt
        // binds again.
        // An archived holder (PROC_STATE_HST, migration 0014) is outside the unique index:
        // checked first. Archived rows never come back, so no race widens this.
        let archived: Option<i64> = sqlx::query_scalar(
            "SELECT msg_id FROM proc_state_hst WHERE identity_key = $1 AND state <> 'DEAD' \
             AND msg_id <> $2",
        )
        .bind(key)
        .bind(msg_id)
        .fetch_optional(self.pool())
        .await?;
        if let Some(holder) = archived {
            return Ok(Binding::Duplicate {
                holder: Some(holder),
            });
        }
        let bound = sqlx::query(
            "UPDATE proc_state SET identity_key = $2 WHERE msg_id = $1 \
             AND identity_key IS DISTINCT FROM $2",
        )
        .bind(msg_id)
        .bind(key)
        .execute(self.relaxed())
        .await;
        match bound {
            Ok(_) => Ok(Binding::Bound),
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("23505") => {
                let holder: Option<i64> = sqlx::query_scalar(
                    "SELECT msg_id FROM proc_state WHERE identity_key = $1 \
                         AND state <> 'DEAD'",
                )
                .bind(key)
                .fetch_optional(self.pool())
                .await?;
                Ok(Binding::Duplicate { holder })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Unfinished count and oldest age (metrics; scans the partial index).
    pub async fn backlog(&self) -> Result<Backlog, StoreError> {
        let (unfinished, oldest): (i64, Option<DateTime<Utc>>) = sqlx::query_as(&format!(
            "SELECT count(*), min(COALESCE(received_at, enqueued_at)) FROM proc_state WHERE {UNFINISHED}"
        ))
        .fetch_one(self.pool())
        .await?;
        Ok(Backlog { unfinished, oldest })
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
    let source = Source::from_db(&source)
        .ok_or_else(|| StoreError::Corrupt(format!("proc_state {msg_id}: source {source:?}")))?;
    Ok(HeadRow {
        head: Head {
            msg_id,
            failed: state == "FAILED",
            attempts,
            next_attempt_at: next,
            processing_started_at: started,
        },
        since,
        source,
    })
}

/// [`Store::mark_failed`] on any executor (the pool, or a group's transaction).
pub(super) async fn mark_failed_on<'e>(
    exec: impl Executor<'e, Database = Postgres>,
    msg_id: i64,
    class: ErrorClass,
    detail: &str,
    next_attempt_at: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let done = sqlx::query(&format!(
        "UPDATE proc_state SET state = 'FAILED', error_class = $2, error_text = $3, \
                next_attempt_at = $4, updated_at = $5 \
         WHERE msg_id = $1 AND {UNFINISHED}"
    ))
    .bind(msg_id)
    .bind(class.as_str())
    .bind(truncate(detail))
    .bind(next_attempt_at)
    .bind(now)
    .execute(exec)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// [`Store::finish_single`] on any executor (the pool, or a group's transaction).
pub(super) async fn finish_single_on<'e>(
    exec: impl Executor<'e, Database = Postgres>,
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
    .bind(state.as_str())
    .bind(class.as_str())
    .bind(truncate(detail))
    .bind(now)
    .bind(msg_type)
    .execute(exec)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Error texts are for people; keep rows small.
fn truncate(s: &str) -> &str {
    const MAX: usize = 2000;
    if s.len() <= MAX {
        return s;
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
