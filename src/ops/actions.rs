//! The audited mutations: replay (by ids with the state the operator saw, or by error class
//! and id range), backfill recovery, dead-event requeue; and the dead-event listing.

use chrono::{DateTime, Utc};
use serde::Deserialize;

mod reports;

pub use reports::{ActionReport, DeadEvent, DeadEvents, RefusedEvent, RequeueReport, RowReport};

use super::{Ops, OpsError};
use crate::inbox::RawMessage;
use crate::rows::{ErrorClass, ProcState};
use crate::store::replay::{self, Audit, Expect, REPLAYABLE_CLASSES, REPLAYABLE_STATES};
use crate::traces::Audited;

/// Most ids one request may name or select (one transaction holds the pipeline lock for all).
pub const MAX_IDS: usize = 10_000;

/// Longest raw text a replay copies into `raw_copy` (longer ones replay from the inbox only;
/// the pump refuses texts above `processing.max_message_bytes`, far below this).
pub const REPLAY_COPY_MAX_BYTES: u64 = 64 * 1024 * 1024;

/// Declares an audited request: its own fields, then who, why and the ticket (and, with
/// `dry_run` after the id field's name, the dry-run switch), unknown fields refused (so no
/// `serde(flatten)`); `checked` validates the audit and the size of the id list. The shared
/// fields are declared once, so the requests cannot drift apart.
macro_rules! audited_request {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $($(#[$field_meta:meta])* pub $field:ident: $ty:ty,)*
        }
        ids: $ids:ident $(, $dry_run:ident)?
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $($(#[$field_meta])* pub $field: $ty,)*
            /// Who.
            pub actor: String,
            /// Why.
            pub reason: String,
            /// Change or incident number.
            pub ticket: Option<String>,
            $(
                /// Show what would change; change nothing, audit nothing.
                #[serde(default)]
                pub $dry_run: bool,
            )?
        }

        impl $name {
            /// Who, why and the ticket, as the audit log records them, and the ids within
            /// [`MAX_IDS`].
            fn checked(&self) -> Result<Audit<'_>, OpsError> {
                let audit = check_audit(&self.actor, &self.reason, self.ticket.as_deref())?;
                check_ids(&self.$ids, stringify!($ids))?;
                Ok(audit)
            }
        }
    };
}

audited_request! {
    /// A replay. Either `msg_ids` with `expect_state` (the state the operator saw; a row that
    /// moved since is refused), or `error_class` with `from_id`..=`to_id` (and optionally
    /// `state`; a range with `to_id` below `from_id` is empty), never both.
    pub struct ReplayRequest {
        /// The rows, by id.
        #[serde(default)]
        pub msg_ids: Vec<i64>,
        // An `Option` field needs no `#[serde(default)]`: serde reads a missing one as None.
        /// With `msg_ids`: `DEAD` or `FAILED`, as seen.
        pub expect_state: Option<String>,
        /// With `msg_ids`: the error class seen (optional).
        pub expect_class: Option<String>,
        /// Select by this replayable class instead of ids…
        pub error_class: Option<String>,
        /// …from this id…
        pub from_id: Option<i64>,
        /// …to this id (inclusive).
        pub to_id: Option<i64>,
        /// With `error_class`: only rows in this state (`DEAD` or `FAILED`).
        pub state: Option<String>,
    }
    ids: msg_ids, dry_run
}

audited_request! {
    /// A backfill recovery of abandoned rows.
    pub struct RecoverRequest {
        /// The rows.
        pub msg_ids: Vec<i64>,
    }
    ids: msg_ids, dry_run
}

audited_request! {
    /// A requeue of DEAD events.
    pub struct RequeueRequest {
        /// The events.
        pub event_ids: Vec<i64>,
    }
    ids: event_ids
}

fn check_ids(ids: &[i64], what: &str) -> Result<(), OpsError> {
    if ids.len() > MAX_IDS {
        return Err(OpsError::Invalid(format!(
            "{} {what} given; at most {MAX_IDS} per request",
            ids.len()
        )));
    }
    Ok(())
}

/// Longest actor / ticket, and reason, stored in the audit log.
const MAX_NAME: usize = 200;
const MAX_REASON: usize = 2000;

fn check_text(value: &str, key: &str, max: usize) -> Result<(), OpsError> {
    if value.chars().count() > max {
        return Err(OpsError::Invalid(format!(
            "{key} is longer than {max} characters"
        )));
    }
    if value.chars().any(|c| c == '\0') {
        return Err(OpsError::Invalid(format!("{key} contains a NUL character")));
    }
    Ok(())
}

/// Who, why and the ticket of an audited action, checked, as the audit log records them.
fn check_audit<'a>(
    actor: &'a str,
    reason: &'a str,
    ticket: Option<&'a str>,
) -> Result<Audit<'a>, OpsError> {
    if actor.trim().is_empty() || reason.trim().is_empty() {
        return Err(OpsError::Invalid(
            "an audited action needs who (actor) and why (reason)".into(),
        ));
    }
    check_text(actor, "actor", MAX_NAME)?;
    check_text(reason, "reason", MAX_REASON)?;
    if let Some(t) = ticket {
        check_text(t, "ticket", MAX_NAME)?;
    }
    Ok(Audit {
        actor,
        reason,
        ticket,
        token: None,
    })
}

/// `value` (in any case) as one of `allowed`; `what` says what it is not when refused.
fn check_replayable<T>(value: &str, key: &str, what: &str, allowed: &[T]) -> Result<T, OpsError>
where
    T: Copy + PartialEq + std::fmt::Display + for<'a> TryFrom<&'a str>,
{
    match T::try_from(value.trim().to_ascii_uppercase().as_str()) {
        Ok(found) if allowed.contains(&found) => Ok(found),
        _ => Err(OpsError::Invalid(format!(
            "{key} `{value}` is not {what} (only {})",
            replay::names(allowed)
        ))),
    }
}

fn check_state(value: &str, key: &str) -> Result<ProcState, OpsError> {
    check_replayable(value, key, "replayable", REPLAYABLE_STATES)
}

fn check_class(value: &str, key: &str) -> Result<ErrorClass, OpsError> {
    check_replayable(value, key, "a replayable class", REPLAYABLE_CLASSES)
}

/// A replay by ids: each expected in `expect_state` (required: a row that moved since the
/// operator saw it is refused) and `expect_class`, if given.
fn rows_by_ids(req: &ReplayRequest) -> Result<Vec<(i64, Expect)>, OpsError> {
    if req.state.is_some() {
        return Err(OpsError::Invalid(
            "state goes with error_class; with msg_ids use expect_state".into(),
        ));
    }
    let Some(seen) = req.expect_state.as_deref() else {
        return Err(OpsError::Invalid(
            "expect_state is required with msg_ids: the state you saw the rows in \
             (DEAD or FAILED); a row that moved since is refused"
                .into(),
        ));
    };
    let expect = Expect {
        state: Some(check_state(seen, "expect_state")?),
        class: req
            .expect_class
            .as_deref()
            .map(|c| check_class(c, "expect_class"))
            .transpose()?,
    };
    Ok(req.msg_ids.iter().map(|id| (*id, expect.clone())).collect())
}

impl Ops {
    /// `audit` with the HTTP token's name this `Ops` runs for ([`Ops::called_by`]).
    fn audited<'a>(&'a self, audit: Audit<'a>) -> Audit<'a> {
        Audit {
            token: self.caller.as_deref(),
            ..audit
        }
    }

    /// Replays rows (see [`ReplayRequest`]) through the lifecycle gate; audited unless a dry run.
    pub async fn replay(
        &self,
        req: &ReplayRequest,
        now: DateTime<Utc>,
    ) -> Result<ActionReport, OpsError> {
        let audit = self.audited(req.checked()?);
        let by_class = req.error_class.is_some() || req.from_id.is_some() || req.to_id.is_some();
        let rows = match (by_class, req.msg_ids.is_empty()) {
            (true, false) => {
                return Err(OpsError::Invalid(
                    "give either msg_ids (with expect_state) or error_class with from_id and \
                     to_id, not both"
                        .into(),
                ))
            }
            (false, true) => {
                return Err(OpsError::Invalid(
                    "no message ids given: name msg_ids (with expect_state), or error_class \
                     with from_id and to_id"
                        .into(),
                ))
            }
            (false, false) => rows_by_ids(req)?,
            (true, true) => self.rows_by_class(req).await?,
        };
        if rows.is_empty() {
            return Ok(ActionReport::empty(req.dry_run));
        }
        // The raw text: the inbox first (read here, outside the transaction; the replay
        // copies it into raw_copy), our raw copy for the rows it no longer has (looked up in
        // the replay's transaction).
        let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
        let in_inbox = self.inbox_texts(&ids).await?;
        let report = replay::replay(&self.store, &rows, audit, req.dry_run, now, &in_inbox).await?;
        let mut out = ActionReport::from_admin(&report);
        self.name_purge_boundary(&mut out).await?;
        if let (false, Some(t)) = (req.dry_run, crate::traces::active()) {
            let applied: Vec<(i64, Option<i64>)> = out
                .rows
                .iter()
                .filter(|r| r.result == "applied")
                .map(|r| (r.msg_id, None))
                .collect();
            let who = Audited {
                action: "replay",
                actor: &req.actor,
                reason: &req.reason,
                ticket: req.ticket.as_deref(),
                audit_id: out.audit_id,
            };
            t.operator_actions(&self.store, &applied, who, now).await;
        }
        Ok(out)
    }

    /// The texts the inbox holds for these ids (rows without text left out); a text over
    /// [`REPLAY_COPY_MAX_BYTES`] is replayed from the inbox without a copy.
    async fn inbox_texts(&self, ids: &[i64]) -> Result<Vec<replay::InboxText>, OpsError> {
        let mut out = Vec::new();
        for chunk in ids.chunks(1000) {
            for (id, raw) in self
                .inbox
                .raw_messages(chunk, REPLAY_COPY_MAX_BYTES)
                .await?
            {
                match raw {
                    RawMessage::Text(t) => out.push((id, Some(t))),
                    RawMessage::TooLarge(_) => out.push((id, None)),
                    RawMessage::Missing | RawMessage::Empty => {}
                }
            }
        }
        Ok(out)
    }

    /// A row refused for want of raw text says where the DB owner's purge stands: the inbox's
    /// lowest id now (rows below it were purged).
    async fn name_purge_boundary(&self, report: &mut ActionReport) -> Result<(), OpsError> {
        let refused_for_text = |r: &RowReport| r.reason.as_deref() == Some(replay::NO_RAW_TEXT);
        if !report.rows.iter().any(refused_for_text) {
            return Ok(());
        }
        let first = self.inbox.id_range().await?.map(|(min, _)| min);
        let note = match first {
            Some(min) => format!(
                "; the DB owner's purge: the inbox now starts at id {min} (a purge up to the \
                 purge boundary removes rows; replay before it, or keep retention.raw_copy on)"
            ),
            None => "; the DB owner's purge: the inbox is empty".to_string(),
        };
        for r in report.rows.iter_mut().filter(|r| refused_for_text(r)) {
            if let Some(reason) = r.reason.as_mut() {
                reason.push_str(&note);
            }
        }
        Ok(())
    }

    /// A replay by class: the rows of `error_class` (and `state`, if given) in the id range,
    /// each expected as found; at most [`MAX_IDS`].
    async fn rows_by_class(&self, req: &ReplayRequest) -> Result<Vec<(i64, Expect)>, OpsError> {
        if req.expect_state.is_some() || req.expect_class.is_some() {
            return Err(OpsError::Invalid(
                "expect_state/expect_class go with msg_ids; with error_class use state".into(),
            ));
        }
        let class = check_class(
            req.error_class.as_deref().unwrap_or_default(),
            "error_class",
        )?;
        let (Some(from), Some(to)) = (req.from_id, req.to_id) else {
            return Err(OpsError::Invalid(
                "error_class needs from_id and to_id (an id range)".into(),
            ));
        };
        // A range with to_id below from_id selects nothing (an empty report): the request is
        // well formed (docs/openapi.json cannot compare two fields).
        let state = req
            .state
            .as_deref()
            .map(|s| check_state(s, "state"))
            .transpose()?;
        let found: Vec<(i64, ProcState)> = sqlx::query_as(
            "SELECT msg_id, state FROM proc_state \
             WHERE state = ANY($6) AND error_class = $1 \
               AND ($2::text IS NULL OR state = $2) AND msg_id BETWEEN $3 AND $4 \
             ORDER BY msg_id LIMIT $5",
        )
        .bind(class)
        .bind(state)
        .bind(from)
        .bind(to)
        .bind(MAX_IDS as i64 + 1)
        .bind(REPLAYABLE_STATES)
        .fetch_all(self.store.pool())
        .await?;
        if found.len() > MAX_IDS {
            return Err(OpsError::Invalid(format!(
                "more than {MAX_IDS} rows match; narrow the id range"
            )));
        }
        Ok(found
            .into_iter()
            .map(|(id, state)| {
                let expect = Expect {
                    state: Some(state),
                    class: Some(class),
                };
                (id, expect)
            })
            .collect())
    }

    /// Recovers abandoned backfills; audited unless a dry run.
    pub async fn recover_backfill(
        &self,
        req: &RecoverRequest,
        now: DateTime<Utc>,
    ) -> Result<ActionReport, OpsError> {
        let report = replay::recover_abandoned(
            &self.store,
            &req.msg_ids,
            self.audited(req.checked()?),
            req.dry_run,
            now,
        )
        .await?;
        Ok(ActionReport::from_admin(&report))
    }

    /// DEAD events back to PENDING; audited.
    pub async fn requeue_events(
        &self,
        req: &RequeueRequest,
        now: DateTime<Utc>,
    ) -> Result<RequeueReport, OpsError> {
        let r = self
            .store
            .requeue_dead_events(
                &req.event_ids,
                self.audited(req.checked()?),
                &self.dlq_topic,
                now,
            )
            .await?;
        if let Some(t) = crate::traces::active() {
            self.trace_requeue(t, req, &r.requeued, Some(r.audit_id), now)
                .await;
        }
        Ok(RequeueReport {
            audit_id: r.audit_id,
            requeued: r.requeued,
            refused: r
                .refused
                .into_iter()
                .map(|(event_id, reason)| RefusedEvent { event_id, reason })
                .collect(),
        })
    }

    /// The requeued events in their messages' traces (tracing on only).
    async fn trace_requeue(
        &self,
        t: &crate::traces::Traces,
        req: &RequeueRequest,
        requeued: &[i64],
        audit_id: Option<i64>,
        now: DateTime<Utc>,
    ) {
        let rows: Vec<(i64, i64)> =
            sqlx::query_as("SELECT msg_id, event_id FROM msg_event WHERE event_id = ANY($1)")
                .bind(requeued)
                .fetch_all(self.store.pool())
                .await
                .unwrap_or_default();
        let rows: Vec<(i64, Option<i64>)> = rows.into_iter().map(|(m, e)| (m, Some(e))).collect();
        let who = Audited {
            action: "requeue",
            actor: &req.actor,
            reason: &req.reason,
            ticket: req.ticket.as_deref(),
            audit_id,
        };
        t.operator_actions(&self.store, &rows, who, now).await;
    }

    /// DEAD events with ids above `after`, at most `limit` (1..=1000).
    pub async fn list_dead_events(&self, after: i64, limit: i64) -> Result<DeadEvents, OpsError> {
        if !(1..=1000).contains(&limit) {
            return Err(OpsError::Invalid(format!(
                "limit {limit} is outside 1..=1000"
            )));
        }
        let mut events: Vec<DeadEvent> = sqlx::query_as(
            "SELECT event_id, msg_id, flight_key, event_type, attempts, last_error, dead_at, \
                    kafka_partition, kafka_offset \
             FROM msg_event WHERE state = 'DEAD' AND event_id > $1 ORDER BY event_id LIMIT $2",
        )
        .bind(after)
        .bind(limit + 1)
        .fetch_all(self.store.pool())
        .await?;
        let more = events.len() as i64 > limit;
        events.truncate(limit as usize);
        let next_after = more.then(|| events.last().map(|e| e.event_id)).flatten();
        Ok(DeadEvents { events, next_after })
    }
}
