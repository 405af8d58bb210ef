//! Operator actions on `PROC_STATE`, each audited (SPEC §2, §5; seed §2, §5.2; G5):
//!
//! - [`replay`]: DEAD/FAILED rows of the replayable classes back to PENDING;
//! - [`recover_abandoned`]: abandoned backfills rescheduled.
//!
//! Both run in ONE PostgreSQL transaction that takes the pipeline lock (so they never
//! interleave with a business transaction), changes each row with ONE conditional statement
//! that first locks the row (`FOR UPDATE`) — waiting for a backfill sweep that holds it while it
//! writes the inbox mark — and records an `audit_log` row with the per-row results before it
//! commits. The operator operations (`ops::Ops`, behind the admin API and the CLI)
//! call them.
//!
//! Replay needs the raw text (seed §9): the inbox row first, else our raw copy (`raw_copy`,
//! issue 13 item 4). The caller that sees the inbox (`ops::Ops::replay`) passes the texts the
//! inbox still holds; for the others the copy is looked up and share-locked in the replay's
//! transaction (so the expiry purge cannot take it before the row is PENDING, after which the
//! purge keeps it), and a row with neither is refused. Each applied row records its source
//! (`inbox` / `raw_copy`) in the report, the audit row and the log line.
//!
//! A replay applied from the inbox writes its own copy of the text into `raw_copy` in the same
//! transaction, whatever `retention.raw_copy` says (issue 29 item 2): the old mark stays on the
//! row, so a DB owner's purge after the replay cannot turn it into DEAD(MALFORMED) — the pump
//! reads the copy.
//!
//! Replay never touches the inbox: a mark that is already there stays (marks are never
//! revoked). A replayed row that was marked before is confirmed as "already marked" by the
//! sweeper once it is terminal again; the audit row says which rows were marked at replay time
//! (`backfill_at`), and the row keeps it (`marked_before_replay_at`, migration 0021): the DB
//! owner may purge a marked row at any time, also while it is processed again, and the sweep
//! then confirms it rather than report a purge before the mark.
//!
//! Files: this one holds the two actions and their statements; `replay/raw_text.rs` where a
//! replay's text comes from; the audit vocabulary they share with every other audited action
//! (`Audit`, `AdminReport`, `audit_log`) is `store/audit.rs`, re-exported here.

mod raw_text;

use chrono::{DateTime, Utc};

use super::audit::{audit_json, insert_audit, validate_action, AuditRow};
use super::{Store, PIPELINE_LOCK_KEY, PROC_STATE_COLUMNS};
use crate::rows::{ErrorClass, ProcState, RawSource};
use raw_text::{copy_inbox_text, raw_source};

pub use super::audit::{AdminError, AdminReport, Audit, AuditEntry, RowOutcome, RowResult};
pub use raw_text::{InboxText, NO_RAW_TEXT};

/// Error classes a replay accepts (SPEC §2).
pub const REPLAYABLE_CLASSES: &[ErrorClass] = &[
    ErrorClass::CodecError,
    ErrorClass::Unsupported,
    ErrorClass::Infra,
    ErrorClass::Exhausted,
];
/// States a replay accepts.
pub const REPLAYABLE_STATES: &[ProcState] = &[ProcState::Dead, ProcState::Failed];

/// "A, B, C" (refusal texts).
pub fn names<T: std::fmt::Display>(values: &[T]) -> String {
    values
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `audit_log.action` of a replay.
pub const ACTION_REPLAY: &str = "REPLAY";
/// `audit_log.action` of a backfill recovery.
pub const ACTION_RECOVER_BACKFILL: &str = "RECOVER_BACKFILL";

/// Who asks for an audited action and why (both required), and the operator's ticket.
/// The row as the operator saw it: the action applies only while the row still is so, and is
/// refused for a row that has moved since (G5: a FAILED row the pump escalated to DEAD and the
/// sweeper marked a second later is not flipped back).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expect {
    /// `proc_state.state` seen (None: any).
    pub state: Option<ProcState>,
    /// `proc_state.error_class` seen (None: any).
    pub class: Option<ErrorClass>,
}

impl Expect {
    /// "FAILED(INFRA)", "DEAD", "any state".
    fn describe(&self) -> String {
        match (self.state, self.class) {
            (Some(s), Some(c)) => format!("{s}({c})"),
            (Some(s), None) => s.to_string(),
            (None, Some(c)) => format!("class {c}"),
            (None, None) => "any state".into(),
        }
    }

    fn matches(&self, state: ProcState, class: Option<ErrorClass>) -> bool {
        self.state.is_none_or(|s| s == state) && self.class.is_none_or(|c| Some(c) == class)
    }
}

/// The row before the change, as locked; whether the change applied.
type Locked = (
    ProcState,
    Option<ErrorClass>,
    Option<DateTime<Utc>>,
    Option<String>,
    bool,
);

/// The replay statement. `cur` locks the row (waiting for a sweep that holds it) and sees its
/// newest version; the UPDATE applies only if that version is replayable (`$6`: the classes,
/// `$7`: the states), as the operator saw it (`$3`, `$4`) and its raw text is there (`$5`).
const REPLAY_SQL: &str = "WITH cur AS ( \
         SELECT msg_id, state, error_class, backfill_at, backfill_abandon_reason, \
                marked_before_replay_at \
         FROM proc_state WHERE msg_id = $1 FOR UPDATE \
     ), done AS ( \
         UPDATE proc_state p SET state = 'PENDING', attempts = 0, \
                marked_before_replay_at = COALESCE(cur.marked_before_replay_at, cur.backfill_at), \
                processing_started_at = NULL, next_attempt_at = NULL, \
                error_class = NULL, error_text = NULL, processed_seq = NULL, \
                terminal_reason = NULL, terminal_at = NULL, identity_key = NULL, \
                backfill_next_at = NULL, backfill_at = NULL, backfill_attempts = 0, \
                backfill_abandon_reason = NULL, backfill_abandoned_at = NULL, \
                backfill_error = NULL, updated_at = $2 \
         FROM cur \
         WHERE p.msg_id = cur.msg_id \
           AND cur.state = ANY($7) AND cur.error_class = ANY($6) \
           AND p.state = ANY($7) AND p.error_class = ANY($6) \
           AND ($3::text IS NULL OR cur.state = $3) \
           AND ($4::text IS NULL OR cur.error_class = $4) \
           AND $5::boolean \
         RETURNING p.msg_id \
     ) \
     SELECT cur.state, cur.error_class, cur.backfill_at, cur.backfill_abandon_reason, \
            EXISTS (SELECT 1 FROM done) FROM cur";

/// The backfill recovery statement (same shape as [`REPLAY_SQL`]).
const RECOVER_SQL: &str = "WITH cur AS ( \
         SELECT msg_id, state, error_class, backfill_at, backfill_abandon_reason \
         FROM proc_state WHERE msg_id = $1 FOR UPDATE \
     ), done AS ( \
         UPDATE proc_state p SET backfill_abandon_reason = NULL, \
                backfill_abandoned_at = NULL, backfill_attempts = 0, \
                backfill_error = NULL, backfill_next_at = $2, updated_at = $2 \
         FROM cur \
         WHERE p.msg_id = cur.msg_id \
           AND cur.state IN ('SUCCEEDED', 'SKIPPED', 'DEAD') \
           AND cur.backfill_abandon_reason IS NOT NULL AND cur.backfill_at IS NULL \
           AND p.state IN ('SUCCEEDED', 'SKIPPED', 'DEAD') \
           AND p.backfill_abandon_reason IS NOT NULL AND p.backfill_at IS NULL \
           AND ($3::text IS NULL OR cur.state = $3) \
           AND ($4::text IS NULL OR cur.error_class = $4) \
         RETURNING p.msg_id \
     ) \
     SELECT cur.state, cur.error_class, cur.backfill_at, cur.backfill_abandon_reason, \
            EXISTS (SELECT 1 FROM done) FROM cur";

/// The action [`run_action`] runs.
#[derive(Debug, Clone, Copy)]
enum Action<'a> {
    /// A replay; the requested rows whose inbox row still holds text, ascending by id.
    Replay { in_inbox: &'a [InboxText] },
    /// A backfill recovery.
    Recover,
}

impl Action<'_> {
    /// `audit_log.action`.
    fn name(self) -> &'static str {
        match self {
            Self::Replay { .. } => ACTION_REPLAY,
            Self::Recover => ACTION_RECOVER_BACKFILL,
        }
    }

    /// Why the action does not apply to a row as it is (before any expectation).
    fn refusal(self, state: ProcState, class: Option<ErrorClass>) -> String {
        match self {
            Self::Replay { .. } if !REPLAYABLE_STATES.contains(&state) => {
                format!("state {state} is not replayable (only DEAD or FAILED)")
            }
            Self::Replay { .. } => format!(
                "error class {} is not replayable (only {})",
                class.map_or("NULL", ErrorClass::as_str),
                names(REPLAYABLE_CLASSES)
            ),
            Self::Recover if state.is_unfinished() => {
                format!("state {state} is not terminal; there is no backfill to recover")
            }
            Self::Recover => "backfill is not abandoned".to_string(),
        }
    }
}

/// Replay: DEAD/FAILED rows of the classes CODEC_ERROR, UNSUPPORTED, INFRA, EXHAUSTED go back
/// to PENDING (attempts 0, processing start, next attempt, error, processing order and
/// terminal fields cleared) and lose their backfill intent, confirmation, attempts and abandon
/// reason, in ONE conditional statement per row. Anything else is refused with a reason, and
/// so is a row that moved since the operator saw it (`rows`: each id with the state it was
/// seen in). A replayed row also loses its business identity: the pump binds it again, so a
/// DEAD record whose identity another record holds by now ends SKIPPED(DUPLICATE) naming the
/// holder (migration 0012). The pump then processes them as the current head(s): replay does
/// not restore historic order. Audited (who, why, when, which rows, per-row result), unless a
/// dry run (the same transaction, rolled back).
///
/// `in_inbox`: the requested rows whose inbox row still holds text, with the text (the caller
/// read the inbox; any order): an applied one gets its raw copy written in the replay's
/// transaction. Any other row replays only from its raw copy, and is refused without one
/// ([`NO_RAW_TEXT`]).
pub async fn replay(
    store: &Store,
    rows: &[(i64, Expect)],
    audit: Audit<'_>,
    dry_run: bool,
    now: DateTime<Utc>,
    in_inbox: &[InboxText],
) -> Result<AdminReport, AdminError> {
    let mut in_inbox = in_inbox.to_vec();
    in_inbox.sort_unstable_by_key(|t| t.0);
    let in_inbox = in_inbox.as_slice();
    run_action(
        store,
        rows,
        audit,
        dry_run,
        now,
        Action::Replay { in_inbox },
    )
    .await
}

/// Recovery of abandoned backfills: terminal rows abandoned (MISSING_ROW or MAX_ATTEMPTS) and
/// not confirmed get their abandon reason, error and attempts cleared and are due at once
/// (`backfill_next_at = now`). Anything else is refused with a reason. Audited, unless a dry
/// run.
pub async fn recover_abandoned(
    store: &Store,
    msg_ids: &[i64],
    audit: Audit<'_>,
    dry_run: bool,
    now: DateTime<Utc>,
) -> Result<AdminReport, AdminError> {
    let rows: Vec<(i64, Expect)> = msg_ids.iter().map(|id| (*id, Expect::default())).collect();
    run_action(store, &rows, audit, dry_run, now, Action::Recover).await
}

/// The shared frame: validate, one transaction under the pipeline lock, one statement per
/// distinct id (ascending, so two actions lock in the same order), the audit row, commit — or,
/// for a dry run, roll back without an audit row.
async fn run_action(
    store: &Store,
    requested: &[(i64, Expect)],
    audit: Audit<'_>,
    dry_run: bool,
    now: DateTime<Utc>,
    action: Action<'_>,
) -> Result<AdminReport, AdminError> {
    let all: Vec<i64> = requested.iter().map(|r| r.0).collect();
    let (actor, why, ids) = validate_action(audit.actor, audit.reason, &all, "message")?;
    let ticket = audit.ticket.map(str::trim).filter(|t| !t.is_empty());
    let mut tx = store.pool().begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(PIPELINE_LOCK_KEY)
        .execute(&mut *tx)
        .await?;
    let mut rows = Vec::with_capacity(ids.len());
    for &msg_id in &ids {
        // The first expectation given for an id (ids are de-duplicated).
        let expect = requested
            .iter()
            .find(|r| r.0 == msg_id)
            .map(|r| r.1.clone())
            .unwrap_or_default();
        let outcome = act_on_row(&mut tx, msg_id, &expect, now, action).await?;
        rows.push(RowResult { msg_id, outcome });
    }
    if dry_run {
        tx.rollback().await?;
        return Ok(AdminReport {
            audit_id: 0,
            rows,
            dry_run: true,
        });
    }
    let row = AuditRow {
        actor,
        action: action.name(),
        reason: why,
        ticket,
        token: audit.token,
    };
    let audit_id = insert_audit(&mut tx, now, row, &ids, audit_json(&rows)).await?;
    tx.commit().await?;
    log_action(&rows, row, action);
    Ok(AdminReport {
        audit_id,
        rows,
        dry_run: false,
    })
}

/// One row of an action: for a replay its raw text's source first (the inbox, else our copy,
/// share-locked until commit so the expiry purge skips it, else none — then the statement
/// does not apply), then the row's conditional statement.
async fn act_on_row(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    msg_id: i64,
    expect: &Expect,
    now: DateTime<Utc>,
    action: Action<'_>,
) -> Result<RowOutcome, sqlx::Error> {
    let source = match action {
        Action::Replay { in_inbox } => Some(raw_source(tx, msg_id, in_inbox).await?),
        Action::Recover => {
            restore_archived(tx, msg_id).await?;
            None
        }
    };
    let sql = match action {
        Action::Replay { .. } => REPLAY_SQL,
        Action::Recover => RECOVER_SQL,
    };
    let mut query = sqlx::query_as::<_, Locked>(sql)
        .bind(msg_id)
        .bind(now)
        .bind(expect.state)
        .bind(expect.class);
    if let Some(source) = source {
        query = query
            .bind(source.is_some())
            .bind(REPLAYABLE_CLASSES)
            .bind(REPLAYABLE_STATES);
    }
    let locked: Option<Locked> = query.fetch_optional(&mut **tx).await?;
    let outcome = judge(locked, source, expect, action);
    if let (Action::Replay { in_inbox }, true) = (action, outcome.is_applied()) {
        copy_inbox_text(tx, msg_id, in_inbox, now).await?;
    }
    Ok(outcome)
}

/// A recovery of a record the archive took while it was abandoned MAX_ATTEMPTS (releases
/// before issue 29 archived them after `retention.abandoned_grace`): moved back to
/// `proc_state` first, in the recovery's transaction, so the sweep can mark it. Nothing else
/// is ever moved back.
async fn restore_archived(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    msg_id: i64,
) -> Result<(), sqlx::Error> {
    let restored = sqlx::query(&format!(
        "WITH gone AS ( \
             DELETE FROM proc_state_hst WHERE msg_id = $1 \
               AND backfill_abandon_reason = 'MAX_ATTEMPTS' AND backfill_at IS NULL \
               AND NOT EXISTS (SELECT 1 FROM proc_state WHERE msg_id = $1) \
             RETURNING * \
         ) \
         INSERT INTO proc_state ({PROC_STATE_COLUMNS}) SELECT {PROC_STATE_COLUMNS} FROM gone"
    ))
    .bind(msg_id)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if restored > 0 {
        tracing::info!(
            msg_id,
            "abandoned record restored from the archive for recovery"
        );
    }
    Ok(())
}

/// What the row's statement said, for the report: applied, or refused and why (no row, no
/// raw text, not acted on as it is, or moved since the operator saw it). Pure.
fn judge(
    locked: Option<Locked>,
    source: Option<Option<RawSource>>,
    expect: &Expect,
    action: Action<'_>,
) -> RowOutcome {
    let Some((state, class, backfill_at, abandon, applied)) = locked else {
        return RowOutcome::Refused {
            reason: "no such message".into(),
        };
    };
    if applied {
        return RowOutcome::Applied {
            previous_state: state,
            previous_class: class,
            previous_backfill_at: backfill_at,
            previous_abandon: abandon,
            source: source.flatten(),
        };
    }
    let reason =
        if matches!(source, Some(None)) && replayable(state, class) && expect.matches(state, class)
        {
            NO_RAW_TEXT.into()
        } else if expect.matches(state, class) {
            action.refusal(state, class)
        } else {
            let now_is = match class {
                Some(c) => format!("{state}({c})"),
                None => state.to_string(),
            };
            let moved = format!(
                "the row moved since it was seen: expected {}, now {now_is}",
                expect.describe()
            );
            let base = action.refusal(state, class);
            // Say also when the row as it is now could not be acted on at all.
            if base.contains("not replayable") || base.contains("not terminal") {
                format!("{moved}; {base}")
            } else {
                moved
            }
        };
    RowOutcome::Refused { reason }
}

/// The log line (and for a replay the metric) of each row, after the commit.
fn log_action(rows: &[RowResult], audit: AuditRow<'_>, action: Action<'_>) {
    for r in rows {
        match (&r.outcome, action) {
            (RowOutcome::Applied { source, .. }, Action::Replay { .. }) => {
                crate::telemetry::replay(
                    r.msg_id,
                    true,
                    audit.reason,
                    source.map(RawSource::as_str),
                )
            }
            (RowOutcome::Refused { reason }, Action::Replay { .. }) => {
                crate::telemetry::replay(r.msg_id, false, reason, None)
            }
            (outcome, Action::Recover) => tracing::warn!(
                msg_id = r.msg_id,
                action = audit.action,
                actor = audit.actor,
                token = audit.token,
                reason = audit.reason,
                ticket = audit.ticket,
                applied = outcome.is_applied(),
                "operator action"
            ),
        }
    }
}

/// A replay's state and class (the statement's own condition, for the refusal text).
fn replayable(state: ProcState, class: Option<ErrorClass>) -> bool {
    REPLAYABLE_STATES.contains(&state) && class.is_some_and(|c| REPLAYABLE_CLASSES.contains(&c))
}
