//! The audited operator action's vocabulary, shared by every action that writes `audit_log`
//! (replay and backfill recovery here in `store::replay`, event requeue in `store::events`,
//! approved skips in `ops::skip`, the cutover seed in `store::cutover`): who asks and why
//! ([`Audit`]), the request's check ([`validate_action`]), the per-row report
//! ([`AdminReport`]), the `audit_log` row written ([`insert_audit`]) and read back
//! ([`AuditEntry`]). Separate from `replay.rs` because the other actions use it without
//! replaying anything.

use chrono::{DateTime, Utc};
use serde_json::json;

use super::StoreError;
use crate::rows::{ErrorClass, ProcState, RawSource};

/// Why an operator action was not run at all (nothing changed, nothing audited).
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The request is incomplete: no rows, or no actor / reason for the audit.
    #[error("operator action refused: {0}")]
    Invalid(String),
    /// The store failed; the transaction rolled back (nothing changed, nothing audited).
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for AdminError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(StoreError::Db(e))
    }
}

/// What an action did to one row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowOutcome {
    /// Changed.
    Applied {
        /// State before.
        previous_state: ProcState,
        /// Error class before.
        previous_class: Option<ErrorClass>,
        /// Mark confirmation before (Some: the inbox row was marked and stays marked).
        previous_backfill_at: Option<DateTime<Utc>>,
        /// Abandon reason before.
        previous_abandon: Option<String>,
        /// A replay: where the pump will read the raw text (None: not checked, or not a replay).
        source: Option<RawSource>,
    },
    /// Not changed, and why.
    Refused {
        /// For the operator and the audit.
        reason: String,
    },
}

impl RowOutcome {
    /// Applied?
    pub fn is_applied(&self) -> bool {
        matches!(self, Self::Applied { .. })
    }
}

/// One row's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowResult {
    /// The row.
    pub msg_id: i64,
    /// What happened.
    pub outcome: RowOutcome,
}

/// The result of an operator action: per row, and the audit row that records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminReport {
    /// `audit_log.id` (0 for a dry run: nothing was written, nothing audited).
    pub audit_id: i64,
    /// Per distinct requested id, ascending.
    pub rows: Vec<RowResult>,
    /// True when the action ran in a transaction that was rolled back (`--dry-run`): the rows
    /// say what would have changed.
    pub dry_run: bool,
}

impl AdminReport {
    /// Rows applied.
    pub fn applied(&self) -> usize {
        self.rows.iter().filter(|r| r.outcome.is_applied()).count()
    }

    /// Rows refused.
    pub fn refused(&self) -> usize {
        self.rows.len() - self.applied()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Audit<'a> {
    /// Who.
    pub actor: &'a str,
    /// Why.
    pub reason: &'a str,
    /// Change or incident number, if any (`audit_log.ticket`).
    pub ticket: Option<&'a str>,
    /// The name of the HTTP token that asked (`audit_log.token_name`); None from the CLI.
    pub token: Option<&'a str>,
}

/// Checks an operator action's request: who and why (trimmed, both required) and the distinct
/// ids (ascending, so two actions lock rows in the same order; at least one). `what` names the
/// ids in the refusal ("message", "event").
pub(crate) fn validate_action<'a>(
    actor: &'a str,
    reason: &'a str,
    ids: &[i64],
    what: &str,
) -> Result<(&'a str, &'a str, Vec<i64>), AdminError> {
    let (actor, why) = (actor.trim(), reason.trim());
    if actor.is_empty() || why.is_empty() {
        return Err(AdminError::Invalid(
            "an audited action needs who (actor) and why (reason)".into(),
        ));
    }
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        return Err(AdminError::Invalid(format!("no {what} ids given")));
    }
    Ok((actor, why, ids))
}

/// The who/what/why of one `audit_log` row.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AuditRow<'a> {
    pub actor: &'a str,
    pub action: &'a str,
    pub reason: &'a str,
    pub ticket: Option<&'a str>,
    /// The HTTP token's name (migration 0019); None from the CLI and the cutover seed.
    pub token: Option<&'a str>,
}

/// Writes the `audit_log` row of an action inside its transaction; returns its id.
pub(crate) async fn insert_audit(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    now: DateTime<Utc>,
    row: AuditRow<'_>,
    msg_ids: &[i64],
    result: serde_json::Value,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO audit_log (at, actor, action, reason, msg_ids, result, ticket, token_name) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id",
    )
    .bind(now)
    .bind(row.actor)
    .bind(row.action)
    .bind(row.reason)
    .bind(msg_ids)
    .bind(result)
    .bind(row.ticket)
    .bind(row.token)
    .fetch_one(&mut **tx)
    .await
}

/// `{"applied": n, "refused": m, "rows": [{"msg_id", "result", …}]}`.
pub(super) fn audit_json(rows: &[RowResult]) -> serde_json::Value {
    let per_row: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| match &r.outcome {
            RowOutcome::Applied {
                previous_state,
                previous_class,
                previous_backfill_at,
                previous_abandon,
                source,
            } => {
                let mut row = json!({
                    "msg_id": r.msg_id,
                    "result": "applied",
                    "previous_state": previous_state,
                    "previous_class": previous_class,
                    "previous_backfill_at": previous_backfill_at.map(|t| t.to_rfc3339()),
                    "previous_abandon_reason": previous_abandon,
                });
                if let Some(source) = source {
                    row["source"] = json!(source.as_str());
                }
                row
            }
            RowOutcome::Refused { reason } => json!({
                "msg_id": r.msg_id,
                "result": "refused",
                "reason": reason,
            }),
        })
        .collect();
    let applied = rows.iter().filter(|r| r.outcome.is_applied()).count();
    json!({ "applied": applied, "refused": rows.len() - applied, "rows": per_row })
}

/// One `audit_log` row.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow, serde::Serialize)]
pub struct AuditEntry {
    /// Row id.
    pub id: i64,
    /// When (the caller's clock).
    pub at: DateTime<Utc>,
    /// Who.
    pub actor: String,
    /// `REPLAY`, `RECOVER_BACKFILL`, …
    pub action: String,
    /// Why.
    pub reason: String,
    /// Which rows were asked for (distinct, ascending).
    pub msg_ids: Vec<i64>,
    /// `{"applied", "refused", "rows": [{"msg_id", "result", "reason" | "previous_…"}]}`.
    pub result: serde_json::Value,
    /// The operator's ticket, if given.
    pub ticket: Option<String>,
    /// The name of the HTTP token that ran it (None from the CLI).
    pub token_name: Option<String>,
}
