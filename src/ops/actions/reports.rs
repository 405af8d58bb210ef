//! What the audited actions answer: per-row results ([`ActionReport`], [`RowReport`]), a
//! requeue's ([`RequeueReport`]) and a page of DEAD events ([`DeadEvents`]), as serde types
//! (the API and `--json` print them) with their one-line-per-row rendering for people.
//! Separate from the actions (`actions.rs`) because the admin API and the CLI read these
//! shapes without running anything.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::rows::{ErrorClass, ProcState, RawSource};
use crate::store::replay::{AdminReport, RowOutcome};

/// One row's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RowReport {
    /// The row.
    pub msg_id: i64,
    /// `applied` (or, in a dry run, would be) or `refused`.
    pub result: &'static str,
    /// State before, when applied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_state: Option<ProcState>,
    /// Error class before, when applied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_class: Option<ErrorClass>,
    /// Why refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A replay, when applied: where the pump reads the raw text, `inbox` (the row is there)
    /// or `raw_copy` (the row is gone; our copy, `retention.raw_copy`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<&'static str>,
}

/// What a replay or recovery did (or would do).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ActionReport {
    /// The `audit_log` row; None for a dry run or when nothing was selected.
    pub audit_id: Option<i64>,
    /// True for a dry run: nothing changed.
    pub dry_run: bool,
    /// Rows applied (would be applied).
    pub applied: usize,
    /// Rows refused.
    pub refused: usize,
    /// Per row, ascending id.
    pub rows: Vec<RowReport>,
}

impl ActionReport {
    pub(super) fn from_admin(r: &AdminReport) -> Self {
        let rows = r
            .rows
            .iter()
            .map(|row| match &row.outcome {
                RowOutcome::Applied {
                    previous_state,
                    previous_class,
                    source,
                    ..
                } => RowReport {
                    msg_id: row.msg_id,
                    result: "applied",
                    previous_state: Some(*previous_state),
                    previous_class: *previous_class,
                    reason: None,
                    source: source.map(RawSource::as_str),
                },
                RowOutcome::Refused { reason } => RowReport {
                    msg_id: row.msg_id,
                    result: "refused",
                    previous_state: None,
                    previous_class: None,
                    reason: Some(reason.clone()),
                    source: None,
                },
            })
            .collect();
        Self {
            audit_id: (!r.dry_run && r.audit_id > 0).then_some(r.audit_id),
            dry_run: r.dry_run,
            applied: r.applied(),
            refused: r.refused(),
            rows,
        }
    }

    pub(super) fn empty(dry_run: bool) -> Self {
        Self {
            audit_id: None,
            dry_run,
            applied: 0,
            refused: 0,
            rows: Vec::new(),
        }
    }

    /// For people: one line per row and a summary.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for r in &self.rows {
            match r.result {
                "applied" => out.push_str(&format!(
                    "{} {} (was {}{}){}\n",
                    r.msg_id,
                    if self.dry_run {
                        "would apply"
                    } else {
                        "applied"
                    },
                    r.previous_state.map_or("-", ProcState::as_str),
                    r.previous_class
                        .map(|c| format!("({c})"))
                        .unwrap_or_default(),
                    r.source
                        .map(|s| format!(", raw text from {s}"))
                        .unwrap_or_default()
                )),
                _ => out.push_str(&format!(
                    "{} refused: {}\n",
                    r.msg_id,
                    r.reason.as_deref().unwrap_or("-")
                )),
            }
        }
        out.push_str(&format!(
            "{}{} applied, {} refused{}\n",
            if self.dry_run { "dry run: " } else { "" },
            self.applied,
            self.refused,
            self.audit_id
                .map(|id| format!(", audit #{id}"))
                .unwrap_or_default()
        ));
        out
    }
}

/// What a requeue did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RequeueReport {
    /// The `audit_log` row.
    pub audit_id: i64,
    /// Events back to PENDING.
    pub requeued: Vec<i64>,
    /// Events left alone and why.
    pub refused: Vec<RefusedEvent>,
}

/// One refused event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RefusedEvent {
    /// The event.
    pub event_id: i64,
    /// Why.
    pub reason: String,
}

/// One DEAD event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct DeadEvent {
    /// `msg_event.event_id`.
    pub event_id: i64,
    /// The message that raised it.
    pub msg_id: i64,
    /// Kafka key.
    pub flight_key: String,
    /// Type.
    pub event_type: String,
    /// Failed sends.
    pub attempts: i32,
    /// The last failure.
    pub last_error: Option<String>,
    /// When it went DEAD.
    pub dead_at: Option<DateTime<Utc>>,
    /// Dead-letter partition and offset, when copied.
    pub kafka_partition: Option<i32>,
    /// Dead-letter offset.
    pub kafka_offset: Option<i64>,
}

/// A page of DEAD events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadEvents {
    /// Ascending event id.
    pub events: Vec<DeadEvent>,
    /// Pass as `after` for the next page (None: this was the last).
    pub next_after: Option<i64>,
}

impl DeadEvents {
    /// For people: one line per event.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for e in &self.events {
            out.push_str(&format!(
                "#{} msg={} {} key={} attempts={} dead_at={} last_error={}\n",
                e.event_id,
                e.msg_id,
                e.event_type,
                e.flight_key,
                e.attempts,
                e.dead_at
                    .map(|t| t.to_rfc3339())
                    .unwrap_or_else(|| "-".into()),
                e.last_error.as_deref().unwrap_or("-")
            ));
        }
        out.push_str(&format!("{} dead event(s)", self.events.len()));
        if let Some(next) = self.next_after {
            out.push_str(&format!("; more after {next} (--after {next})"));
        }
        out.push('\n');
        out
    }
}

impl RequeueReport {
    /// For people.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for id in &self.requeued {
            out.push_str(&format!("#{id} requeued\n"));
        }
        for r in &self.refused {
            out.push_str(&format!("#{} refused: {}\n", r.event_id, r.reason));
        }
        out.push_str(&format!(
            "{} requeued, {} refused, audit #{}\n",
            self.requeued.len(),
            self.refused.len(),
            self.audit_id
        ));
        out
    }
}
