//! Approved skip (seed §5.3 step 2, red line 4): after the owner agreed, an id range of
//! unfinished rows (PENDING/FAILED) becomes SKIPPED with `terminal_reason = APPROVED_SKIP`
//! and its backfill intent set, so the normal sweep marks the inbox rows. Never a DELETE.
//!
//! Each batch of at most [`SKIP_BATCH`] rows is ONE transaction through the lifecycle gate:
//! the pipeline lock (no business transaction interleaves), the rows locked `FOR UPDATE` in
//! ascending id order (waiting for a sweep or a replay that holds one), one conditional UPDATE
//! that only touches rows still unfinished, and one `audit_log` row (approver, reason, ticket,
//! the ids and their previous states) before the commit. A crash between batches leaves whole
//! batches only, each audited; running the same request again skips what is still unfinished.
//!
//! Decisions: a range reaching above W is refused as a whole (those rows are not yet
//! discovered in order: wait until W passes them). The current FIFO head may be skipped: it is
//! an unfinished row like any other, and the pump re-reads the head every step (its business
//! transaction only applies to a row still unfinished, under the same pipeline lock).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{Ops, OpsError};
use crate::rows::{ErrorClass, ProcState};
use crate::store::audit::{insert_audit, AuditRow};
use crate::store::PIPELINE_LOCK_KEY;

/// Rows per transaction (and per audit row).
pub const SKIP_BATCH: i64 = 1_000;
/// `proc_state.terminal_reason` of an approved skip.
pub const APPROVED_SKIP: &str = "APPROVED_SKIP";
/// `audit_log.action` of an approved skip.
pub const ACTION_SKIP: &str = "APPROVED_SKIP";

/// A skip request: all of approver, reason and ticket are required.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkipRequest {
    /// First id (inclusive).
    pub from_id: i64,
    /// Last id (inclusive); must be at or below W.
    pub to_id: i64,
    /// Who approved (the owner's representative; `audit_log.actor`).
    pub approver: String,
    /// Why (`audit_log.reason`).
    pub reason: String,
    /// The change or agreement number.
    pub ticket: String,
    /// Count what would be skipped; change nothing, audit nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// One committed batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkipBatch {
    /// Its `audit_log` row.
    pub audit_id: i64,
    /// Rows skipped.
    pub rows: u64,
    /// Lowest id skipped.
    pub first_id: i64,
    /// Highest id skipped.
    pub last_id: i64,
}

/// What a skip did (or would do).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkipReport {
    /// True: nothing changed.
    pub dry_run: bool,
    /// W at the start.
    pub w: i64,
    /// Rows skipped (would be).
    pub skipped: u64,
    /// Of those, PENDING before.
    pub was_pending: u64,
    /// Of those, FAILED before.
    pub was_failed: u64,
    /// Rows in the range already terminal (left alone).
    pub already_terminal: u64,
    /// The batches (empty for a dry run).
    pub batches: Vec<SkipBatch>,
}

fn required(value: &str, key: &str) -> Result<(), OpsError> {
    if value.trim().is_empty() {
        return Err(OpsError::Invalid(format!(
            "an approved skip needs {key}: who approved, why and the ticket are all recorded"
        )));
    }
    if value.chars().count() > 2000 || value.contains('\0') {
        return Err(OpsError::Invalid(format!(
            "{key} is longer than 2000 characters or contains NUL"
        )));
    }
    Ok(())
}

/// Who approved a skip, why and the ticket (trimmed), for the audit and the log.
#[derive(Debug, Clone, Copy)]
struct Approval<'a> {
    approver: &'a str,
    reason: &'a str,
    ticket: &'a str,
    /// The HTTP token's name ([`Ops::caller`]).
    token: Option<&'a str>,
}

/// One committed batch: what it did and the states its rows had.
struct Done {
    batch: SkipBatch,
    was_pending: u64,
    was_failed: u64,
}

impl Ops {
    /// Skips the unfinished rows of the range (see the module doc).
    pub async fn skip(
        &self,
        req: &SkipRequest,
        now: DateTime<Utc>,
    ) -> Result<SkipReport, OpsError> {
        required(&req.approver, "approver")?;
        required(&req.reason, "reason")?;
        required(&req.ticket, "ticket")?;
        // Ids start at 1; a range with to_id below from_id is empty (nothing skipped, nothing
        // audited), a well-formed request as docs/openapi.json describes it.
        if req.from_id < 1 || req.to_id < 1 {
            return Err(OpsError::Invalid(format!(
                "bad id range {}..{}: from_id and to_id must be ≥ 1",
                req.from_id, req.to_id
            )));
        }
        let w = self.store.read_cursor().await?.cursor.w;
        if req.to_id > w {
            return Err(OpsError::Conflict(format!(
                "to_id {} is above W={w}: rows beyond W are not yet discovered in order; \
                 wait until W passes them, then skip",
                req.to_id
            )));
        }
        let mut report = self.count_range(req, w).await?;
        if req.dry_run {
            return Ok(report);
        }
        let approval = Approval {
            approver: req.approver.trim(),
            reason: req.reason.trim(),
            ticket: req.ticket.trim(),
            token: self.caller.as_deref(),
        };
        let mut after = req.from_id - 1;
        while let Some(done) = self.skip_batch(after, req.to_id, approval, now).await? {
            report.skipped += done.batch.rows;
            report.was_pending += done.was_pending;
            report.was_failed += done.was_failed;
            after = done.batch.last_id;
            report.batches.push(done.batch);
        }
        Ok(report)
    }

    /// The report before any batch: the range's rows by state. A dry run's whole answer (what
    /// would be skipped); a real run starts from it with nothing skipped yet.
    async fn count_range(&self, req: &SkipRequest, w: i64) -> Result<SkipReport, OpsError> {
        let (pending, failed, terminal): (i64, i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE state = $3), \
                    count(*) FILTER (WHERE state = $4), \
                    count(*) FILTER (WHERE state <> ALL($5)) \
             FROM proc_state WHERE msg_id BETWEEN $1 AND $2",
        )
        .bind(req.from_id)
        .bind(req.to_id)
        .bind(ProcState::Pending)
        .bind(ProcState::Failed)
        .bind([ProcState::Pending, ProcState::Failed].as_slice())
        .fetch_one(self.store.pool())
        .await?;
        let dry = |n: i64| if req.dry_run { n as u64 } else { 0 };
        Ok(SkipReport {
            dry_run: req.dry_run,
            w,
            skipped: dry(pending + failed),
            was_pending: dry(pending),
            was_failed: dry(failed),
            already_terminal: terminal as u64,
            batches: Vec::new(),
        })
    }

    /// One batch in ONE transaction through the lifecycle gate: the pipeline lock, the next
    /// [`SKIP_BATCH`] unfinished rows above `after` locked in id order, the conditional
    /// UPDATE, the audit row, commit. None when no unfinished row is left in the range.
    async fn skip_batch(
        &self,
        after: i64,
        to_id: i64,
        approval: Approval<'_>,
        now: DateTime<Utc>,
    ) -> Result<Option<Done>, OpsError> {
        let mut tx = self.store.pool().begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(PIPELINE_LOCK_KEY)
            .execute(&mut *tx)
            .await?;
        let locked: Vec<(i64, ProcState, Option<ErrorClass>)> = sqlx::query_as(
            "SELECT msg_id, state, error_class FROM proc_state \
             WHERE state IN ('PENDING', 'FAILED') AND msg_id > $1 AND msg_id <= $2 \
             ORDER BY msg_id LIMIT $3 FOR UPDATE",
        )
        .bind(after)
        .bind(to_id)
        .bind(SKIP_BATCH)
        .fetch_all(&mut *tx)
        .await?;
        let (Some(first), Some(last)) = (locked.first(), locked.last()) else {
            tx.rollback().await?;
            return Ok(None);
        };
        let (first, last) = (first.0, last.0);
        let ids: Vec<i64> = locked.iter().map(|r| r.0).collect();
        let Approval {
            approver,
            reason,
            ticket,
            ..
        } = approval;
        let done = sqlx::query(
            "UPDATE proc_state SET state = 'SKIPPED', terminal_reason = $2, \
                    terminal_at = $3, next_attempt_at = NULL, \
                    processed_seq = nextval('proc_order_seq'), backfill_next_at = $3, \
                    error_text = $4, updated_at = $3 \
             WHERE msg_id = ANY($1) AND state IN ('PENDING', 'FAILED')",
        )
        .bind(&ids)
        .bind(APPROVED_SKIP)
        .bind(now)
        .bind(format!("approved skip by {approver} ({ticket}): {reason}"))
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let audit_id = audit_batch(&mut tx, approval, &locked, done, now).await?;
        tx.commit().await?;
        tracing::warn!(
            first_id = first,
            last_id = last,
            rows = done,
            approver,
            ticket,
            reason,
            audit_id,
            "approved skip: rows SKIPPED(APPROVED_SKIP)"
        );
        let was = |s: ProcState| locked.iter().filter(|r| r.1 == s).count() as u64;
        Ok(Some(Done {
            batch: SkipBatch {
                audit_id,
                rows: done,
                first_id: first,
                last_id: last,
            },
            was_pending: was(ProcState::Pending),
            was_failed: was(ProcState::Failed),
        }))
    }
}

/// The batch's `audit_log` row: the approval, the ids and their previous states.
async fn audit_batch(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    approval: Approval<'_>,
    locked: &[(i64, ProcState, Option<ErrorClass>)],
    done: u64,
    now: DateTime<Utc>,
) -> Result<i64, sqlx::Error> {
    let ids: Vec<i64> = locked.iter().map(|r| r.0).collect();
    let rows: Vec<serde_json::Value> = locked
        .iter()
        .map(|(id, state, class)| {
            json!({"msg_id": id, "result": "applied", "previous_state": state,
                   "previous_class": class})
        })
        .collect();
    let row = AuditRow {
        actor: approval.approver,
        action: ACTION_SKIP,
        reason: approval.reason,
        ticket: Some(approval.ticket),
        token: approval.token,
    };
    insert_audit(
        tx,
        now,
        row,
        &ids,
        json!({"applied": done, "refused": 0, "rows": rows}),
    )
    .await
}

impl SkipReport {
    /// For people.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for b in &self.batches {
            out.push_str(&format!(
                "{}..{}: {} skipped, audit #{}\n",
                b.first_id, b.last_id, b.rows, b.audit_id
            ));
        }
        out.push_str(&format!(
            "{}{} {} skipped (PENDING {}, FAILED {}), {} already terminal left alone; W={}\n",
            if self.dry_run { "dry run: " } else { "" },
            self.skipped,
            if self.dry_run { "would be" } else { "rows" },
            self.was_pending,
            self.was_failed,
            self.already_terminal,
            self.w
        ));
        out
    }
}
