//! Retention of our own records (issue 13 item 5): one bounded batch per call, each its own
//! transaction, so a crash mid-batch rolls the whole batch back and the next job redoes it —
//! nothing is lost or doubled. The housekeeping job (the `retention` module above the store)
//! loops over them.

use chrono::{DateTime, Utc};

use super::{Store, StoreError, PROC_STATE_COLUMNS};

/// What one archive batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArchiveBatch {
    /// Rows moved from PROC_STATE to PROC_STATE_HST.
    pub moved: u64,
    /// The highest msg_id moved (the next batch continues above it); None when none was.
    pub last: Option<i64>,
}

/// Which rows may be archived (all conditions together).
#[derive(Debug, Clone, Copy)]
pub struct ArchiveCut {
    /// Terminal before this instant (`now − retention.proc_state`).
    pub terminal_before: DateTime<Utc>,
    /// Or abandoned MISSING_ROW before this instant (`now − retention.abandoned_grace`)
    /// instead of marked (MAX_ATTEMPTS rows are never archived: issue 29).
    pub abandoned_before: DateTime<Utc>,
}

/// A table whose old rows are deleted in batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiring {
    /// `schd_snap_log` by `applied_at`.
    SchdSnapLog,
    /// `msg_event` in state SENT by `sent_at`, FLIGHT_DELETED tombstones excepted.
    MsgEventSent,
    /// `audit_log` by `at`.
    AuditLog,
    /// `late_watch` (detected late arrivals) by `detected_at`.
    LateWatch,
    /// `late_watch_range` by `expires_at` (already past its window).
    LateWatchRange,
}

impl Expiring {
    /// Every table, in job order.
    pub const ALL: [Expiring; 5] = [
        Expiring::SchdSnapLog,
        Expiring::MsgEventSent,
        Expiring::AuditLog,
        Expiring::LateWatch,
        Expiring::LateWatchRange,
    ];

    /// The table name (metrics label).
    pub fn table(self) -> &'static str {
        match self {
            Expiring::SchdSnapLog => "schd_snap_log",
            Expiring::MsgEventSent => "msg_event",
            Expiring::AuditLog => "audit_log",
            Expiring::LateWatch => "late_watch",
            Expiring::LateWatchRange => "late_watch_range",
        }
    }

    /// One batch: the oldest `limit` rows before `before`, in one statement.
    fn statement(self) -> &'static str {
        match self {
            Expiring::SchdSnapLog => {
                "DELETE FROM schd_snap_log WHERE id IN (SELECT id FROM schd_snap_log \
                 WHERE applied_at < $1 ORDER BY applied_at LIMIT $2)"
            }
            // The late-arrival guard reads a deleted flight's newest FLIGHT_DELETED event as
            // its tombstone (store::business::load_tombstones): those are kept.
            Expiring::MsgEventSent => {
                "DELETE FROM msg_event WHERE event_id IN (SELECT event_id FROM msg_event \
                 WHERE state = 'SENT' AND sent_at < $1 AND event_type <> 'FLIGHT_DELETED' \
                 ORDER BY sent_at LIMIT $2)"
            }
            Expiring::AuditLog => {
                "DELETE FROM audit_log WHERE id IN (SELECT id FROM audit_log \
                 WHERE at < $1 ORDER BY at LIMIT $2)"
            }
            Expiring::LateWatch => {
                "DELETE FROM late_watch WHERE msg_id IN (SELECT msg_id FROM late_watch \
                 WHERE COALESCE(detected_at, expires_at) < $1 ORDER BY msg_id LIMIT $2)"
            }
            Expiring::LateWatchRange => {
                "DELETE FROM late_watch_range WHERE first_id IN (SELECT first_id \
                 FROM late_watch_range WHERE expires_at < $1 ORDER BY first_id LIMIT $2)"
            }
        }
    }
}

impl Store {
    /// Moves up to `limit` archivable PROC_STATE rows with `msg_id > after` to PROC_STATE_HST
    /// (stamped `archived_at = now`) in ONE transaction: lock them (skipping rows another
    /// session holds), copy, delete the same rows. Archivable: terminal, before
    /// `cut.terminal_before`, marked (confirmed) — or abandoned MISSING_ROW (the row is gone:
    /// nothing left to mark) before `cut.abandoned_before` — and with
    /// no event and no schedule snapshot left (both reference the row; PENDING and DEAD events
    /// are still needed, SENT ones go by `retention.msg_event_sent` first).
    pub async fn archive_batch(
        &self,
        cut: ArchiveCut,
        after: i64,
        limit: i64,
        now: DateTime<Utc>,
    ) -> Result<ArchiveBatch, StoreError> {
        let mut tx = self.pool().begin().await?;
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT p.msg_id FROM proc_state p \
             WHERE p.msg_id > $1 AND p.state IN ('SUCCEEDED', 'SKIPPED', 'DEAD') \
               AND p.terminal_at < $2 \
               AND (p.backfill_at IS NOT NULL \
                    OR (p.backfill_abandon_reason = 'MISSING_ROW' \
                        AND p.backfill_abandoned_at < $3)) \
               AND NOT EXISTS (SELECT 1 FROM msg_event e WHERE e.msg_id = p.msg_id) \
               AND NOT EXISTS (SELECT 1 FROM schd_snap_log s WHERE s.msg_id = p.msg_id) \
             ORDER BY p.msg_id LIMIT $4 FOR UPDATE SKIP LOCKED",
        )
        .bind(after)
        .bind(cut.terminal_before)
        .bind(cut.abandoned_before)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        if ids.is_empty() {
            tx.rollback().await?;
            return Ok(ArchiveBatch::default());
        }
        let copied = sqlx::query(&format!(
            "INSERT INTO proc_state_hst ({PROC_STATE_COLUMNS}, archived_at) \
             SELECT {PROC_STATE_COLUMNS}, $2 FROM proc_state p WHERE p.msg_id = ANY($1)"
        ))
        .bind(&ids)
        .bind(now)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        // Copied, not yet deleted: a crash here rolls the copy back (tests/housekeeping.rs).
        crate::failpoint::hit("housekeeping_mid_batch");
        let deleted = sqlx::query("DELETE FROM proc_state WHERE msg_id = ANY($1)")
            .bind(&ids)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if copied != deleted || deleted != ids.len() as u64 {
            // Cannot happen with the rows locked; never commit a batch that does not balance.
            tx.rollback().await?;
            return Err(StoreError::Corrupt(format!(
                "archive batch did not balance: {} locked, {copied} copied, {deleted} deleted",
                ids.len()
            )));
        }
        tx.commit().await?;
        Ok(ArchiveBatch {
            moved: deleted,
            last: ids.last().copied(),
        })
    }

    /// Deletes up to `limit` rows of `table` older than `before` (one statement). Returns the
    /// rows deleted.
    pub async fn expire_batch(
        &self,
        table: Expiring,
        before: DateTime<Utc>,
        limit: i64,
    ) -> Result<u64, StoreError> {
        if table == Expiring::AuditLog && !self.may_delete_audit().await? {
            // The audit trail is append-only for this role (docs/operations.md, "Database
            // accounts"): its retention is the table owner's job.
            tracing::info!(
                "retention: audit_log is append-only for this role; its expired rows are \
                 left to the table's owner"
            );
            return Ok(0);
        }
        Ok(sqlx::query(table.statement())
            .bind(before)
            .bind(limit)
            .execute(self.pool())
            .await?
            .rows_affected())
    }

    /// Whether this role may delete from `audit_log` (not when the trail is append-only).
    async fn may_delete_audit(&self) -> Result<bool, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT has_table_privilege('audit_log', 'DELETE')")
                .fetch_one(self.pool())
                .await?,
        )
    }

    /// Row estimates of our tables from the planner statistics (`pg_class.reltuples`; -1 or 0
    /// before the first ANALYZE): cheap at any size.
    pub async fn table_estimates(&self) -> Result<Vec<(String, i64)>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT c.relname::text, GREATEST(c.reltuples, 0)::bigint FROM pg_class c \
             WHERE c.relname = ANY($1) AND c.relkind = 'r' AND pg_table_is_visible(c.oid) \
             ORDER BY c.relname",
        )
        .bind(crate::telemetry::SIZED_TABLES)
        .fetch_all(self.pool())
        .await?)
    }
}
