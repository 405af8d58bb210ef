//! `PROC_STATE` as the backfill's work list (SPEC §5, seed §5.2): the sweep transaction that
//! locks a batch, and the write-back of its outcomes.
//!
//! The sweep is ONE PostgreSQL transaction: it selects its batch `FOR UPDATE SKIP LOCKED`,
//! keeps those row locks while the caller writes the inbox marks (MySQL), then writes every
//! outcome (confirm / back off / abandon) and commits. An operator replay or a poison
//! escalation on one of these rows waits for that commit, so the three are mutually exclusive
//! per message (the lifecycle gate, G5): a mark is only ever written while its row is terminal
//! and locked by the sweeper — the caller commits each inbox write only after
//! [`SweepTx::held`] answered in this transaction.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgHasArrayType;
use sqlx::{Encode, Postgres, Transaction, Type};

use super::{truncate, Store, StoreError};
use crate::rows::{AbandonReason, ProcState, Source};

/// Terminal states: the only rows ever marked.
const TERMINAL: &str = "state IN ('SUCCEEDED', 'SKIPPED', 'DEAD')";
/// Terminal, unconfirmed, not abandoned: the partial index `proc_state_backfill_idx`.
const UNMARKED: &str = "state IN ('SUCCEEDED', 'SKIPPED', 'DEAD') \
                        AND backfill_at IS NULL AND backfill_abandon_reason IS NULL";
/// Longest `backfill_error` kept.
const BACKFILL_ERROR_MAX: usize = 1000;

/// One row of a sweep batch, locked by the sweep transaction.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct BackfillRow {
    /// MSG_ID = inbox id.
    pub msg_id: i64,
    /// SUCCEEDED / SKIPPED / DEAD.
    pub state: ProcState,
    /// How we learned of the row (tells "never seen" from "purged").
    pub source: Source,
    /// Transient failures so far.
    pub backfill_attempts: i32,
    /// Since when another inbox session has held the row (`backfill_lock`), if it did at the
    /// last try.
    pub locked_since: Option<DateTime<Utc>>,
    /// When we had confirmed its mark before a replay reopened it (migration 0021): a row
    /// gone since was purged after its mark, not before.
    pub marked_before_replay_at: Option<DateTime<Utc>>,
}

/// What a sweep writes back, all in its one transaction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepWrite {
    /// Marked now, or found marked already: `BACKFILL_AT` (confirmation).
    pub confirmed: Vec<i64>,
    /// Transient failure: `attempts + 1`, next try at, error text.
    pub backed_off: Vec<(i64, DateTime<Utc>, String)>,
    /// Given up: reason, error text. `MAX_ATTEMPTS` counts the final failure too.
    pub abandoned: Vec<(i64, AbandonReason, String)>,
    /// Held by another inbox session: next try at, error text; attempts NOT counted.
    pub locked: Vec<(i64, DateTime<Utc>, String)>,
}

impl SweepWrite {
    /// Rows this write touches.
    pub fn len(&self) -> usize {
        self.confirmed.len() + self.backed_off.len() + self.abandoned.len() + self.locked.len()
    }

    /// Rows with an outcome other than "held": their `backfill_lock` entry, if any, ends.
    fn settled(&self) -> Vec<i64> {
        let rest = self.backed_off.iter().map(|r| r.0);
        let gone = self.abandoned.iter().map(|r| r.0);
        self.confirmed
            .iter()
            .copied()
            .chain(rest)
            .chain(gone)
            .collect()
    }

    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The open sweep: its transaction (holding the batch's row locks) and the batch.
#[derive(Debug)]
pub struct SweepTx {
    tx: Transaction<'static, Postgres>,
    rows: Vec<BackfillRow>,
}

/// Rows another inbox session held at their last try and still unmarked (`backfill_lock`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LockedRows {
    /// How many.
    pub rows: i64,
    /// Since when the longest-held of them has been held.
    pub oldest_since: Option<DateTime<Utc>>,
}

impl LockedRows {
    /// How long the longest-held row has been held at `now` (zero when none).
    pub fn oldest_age(&self, now: DateTime<Utc>) -> std::time::Duration {
        self.oldest_since
            .and_then(|t| (now - t).to_std().ok())
            .unwrap_or_default()
    }
}

/// Backfill backlog facts for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackfillBacklog {
    /// Terminal rows neither confirmed nor abandoned.
    pub pending: i64,
    /// The earliest terminal time among them (else last update).
    pub oldest: Option<DateTime<Utc>>,
}

impl Store {
    /// Opens the sweep transaction and locks up to `batch` rows due now (SPEC §5 predicate,
    /// exactly): terminal ∧ unconfirmed ∧ not abandoned ∧ (no intent time ∨ intent due ∨
    /// received — else enqueued (G4) — before `overdue_before` = now − R), in fair rotation
    /// order `backfill_attempts, msg_id`. Rows locked by someone else (a replay, a poison
    /// escalation, another sweep) are skipped, never waited for.
    pub async fn begin_sweep(
        &self,
        now: DateTime<Utc>,
        overdue_before: DateTime<Utc>,
        batch: u32,
    ) -> Result<SweepTx, StoreError> {
        let mut tx = self.pool().begin().await?;
        let rows: Vec<BackfillRow> = sqlx::query_as(&format!(
            "SELECT msg_id, state, source, backfill_attempts, marked_before_replay_at, \
                    (SELECT l.since FROM backfill_lock l WHERE l.msg_id = p.msg_id) AS locked_since \
             FROM proc_state p \
             WHERE {UNMARKED} \
               AND (backfill_next_at IS NULL OR backfill_next_at <= $1 \
                    OR COALESCE(received_at, enqueued_at) < $2) \
             ORDER BY backfill_attempts, msg_id LIMIT $3 \
             FOR UPDATE SKIP LOCKED"
        ))
        .bind(now)
        .bind(overdue_before)
        .bind(i64::from(batch))
        .fetch_all(&mut *tx)
        .await?;
        Ok(SweepTx { tx, rows })
    }

    /// Pending count and oldest terminal time of the unmarked rows (one query on the partial
    /// index `proc_state_backfill_idx`).
    pub async fn backfill_backlog(&self) -> Result<BackfillBacklog, StoreError> {
        let (pending, oldest): (i64, Option<DateTime<Utc>>) = sqlx::query_as(&format!(
            "SELECT count(*), min(COALESCE(terminal_at, updated_at)) FROM proc_state WHERE {UNMARKED}"
        ))
        .fetch_one(self.pool())
        .await?;
        Ok(BackfillBacklog { pending, oldest })
    }
}

impl SweepTx {
    /// The locked batch.
    pub fn rows(&self) -> &[BackfillRow] {
        &self.rows
    }

    /// How many of `ids` are still terminal, unconfirmed and not abandoned, read in the
    /// sweep's transaction right before their marks are committed in the inbox: an answer at
    /// all proves the transaction — and with it the row locks — is alive at this moment (a
    /// session ended by the server fails the statement), and the count that the rows are still
    /// the sweep's to mark (G5). The statement restarts the server's idle timer too.
    pub async fn held(&mut self, ids: &[i64]) -> Result<usize, StoreError> {
        let n: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM proc_state WHERE msg_id = ANY($1) AND {UNMARKED}"
        ))
        .bind(ids)
        .fetch_one(&mut *self.tx)
        .await?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// Writes every outcome and commits, releasing the locks; returns the rows held by another
    /// inbox session as they stand after this sweep. Each statement re-checks the row is still
    /// terminal, unconfirmed and not abandoned (they are locked by us, so this only guards
    /// against a bug).
    pub async fn finish(
        mut self,
        write: &SweepWrite,
        now: DateTime<Utc>,
    ) -> Result<LockedRows, StoreError> {
        if !write.confirmed.is_empty() {
            sqlx::query(&format!(
                "UPDATE proc_state SET backfill_at = $2, backfill_next_at = NULL, \
                        backfill_error = NULL, updated_at = $2 \
                 WHERE msg_id = ANY($1) AND {UNMARKED}"
            ))
            .bind(&write.confirmed)
            .bind(now)
            .execute(&mut *self.tx)
            .await?;
        }
        self.update_each(&next_try(true), &write.backed_off, |at| *at, now)
            .await?;
        self.update_each(
            &format!(
                "UPDATE proc_state p SET backfill_abandon_reason = u.reason, \
                        backfill_abandoned_at = $4, backfill_next_at = NULL, \
                        backfill_error = u.err, \
                        backfill_attempts = p.backfill_attempts \
                            + CASE WHEN u.reason = 'MAX_ATTEMPTS' THEN 1 ELSE 0 END, \
                        updated_at = $4 \
                 FROM UNNEST($1::bigint[], $2::text[], $3::text[]) AS u(id, reason, err) \
                 WHERE p.msg_id = u.id AND p.{TERMINAL} \
                   AND p.backfill_at IS NULL AND p.backfill_abandon_reason IS NULL"
            ),
            &write.abandoned,
            |reason| reason.as_str(),
            now,
        )
        .await?;
        // Held: the next try, no attempt counted.
        self.update_each(&next_try(false), &write.locked, |at| *at, now)
            .await?;
        let locked = self.track_locks(write, now).await?;
        self.tx.commit().await?;
        Ok(locked)
    }

    /// `backfill_lock`: a held row keeps its first `since`; any other outcome ends its entry, and
    /// entries of rows no longer waiting for a mark (replayed, archived) are dropped. Returns
    /// what is left.
    async fn track_locks(
        &mut self,
        write: &SweepWrite,
        now: DateTime<Utc>,
    ) -> Result<LockedRows, StoreError> {
        let held: Vec<i64> = write.locked.iter().map(|r| r.0).collect();
        if !held.is_empty() {
            sqlx::query(
                "INSERT INTO backfill_lock (msg_id, since) SELECT id, $2 FROM UNNEST($1::bigint[]) AS id \
                 ON CONFLICT (msg_id) DO NOTHING",
            )
            .bind(&held)
            .bind(now)
            .execute(&mut *self.tx)
            .await?;
        }
        sqlx::query(&format!(
            "DELETE FROM backfill_lock l WHERE l.msg_id = ANY($1) \
                OR NOT EXISTS (SELECT 1 FROM proc_state p WHERE p.msg_id = l.msg_id AND p.{UNMARKED})"
        ))
        .bind(write.settled())
        .execute(&mut *self.tx)
        .await?;
        let (rows, oldest_since): (i64, Option<DateTime<Utc>>) =
            sqlx::query_as("SELECT count(*), min(since) FROM backfill_lock")
                .fetch_one(&mut *self.tx)
                .await?;
        Ok(LockedRows { rows, oldest_since })
    }

    /// One write-back of rows with a value and an error each (`$1` ids, `$2` the `value` of
    /// each, `$3` its error truncated, `$4` now): the back-off and the abandon differ only in
    /// their statement and `$2`. No rows, no statement.
    async fn update_each<T, V>(
        &mut self,
        sql: &str,
        rows: &[(i64, T, String)],
        value: impl Fn(&T) -> V,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError>
    where
        V: for<'q> Encode<'q, Postgres> + Type<Postgres> + PgHasArrayType + Send,
    {
        if rows.is_empty() {
            return Ok(());
        }
        let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
        let values: Vec<V> = rows.iter().map(|r| value(&r.1)).collect();
        let errors: Vec<&str> = rows
            .iter()
            .map(|r| truncate(&r.2, BACKFILL_ERROR_MAX))
            .collect();
        sqlx::query(sql)
            .bind(ids)
            .bind(values)
            .bind(errors)
            .bind(now)
            .execute(&mut *self.tx)
            .await?;
        Ok(())
    }
}

/// Sets the next try of unconfirmed terminal rows (`$1` ids, `$2` when, `$3` error, `$4` now),
/// counting an attempt or not (a row held by the owner's lock is not charged).
fn next_try(count_attempt: bool) -> String {
    let attempts = if count_attempt {
        "backfill_attempts = p.backfill_attempts + 1, "
    } else {
        ""
    };
    format!(
        "UPDATE proc_state p SET {attempts}backfill_next_at = u.next_at, backfill_error = u.err, \
                updated_at = $4 \
         FROM UNNEST($1::bigint[], $2::timestamptz[], $3::text[]) AS u(id, next_at, err) \
         WHERE p.msg_id = u.id AND p.{TERMINAL} \
           AND p.backfill_at IS NULL AND p.backfill_abandon_reason IS NULL"
    )
}
