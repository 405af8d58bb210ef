//! Operator operations, one code path for the admin HTTP API and the CLI (`msgexchange status`,
//! `inspect`, `replay`, `recover-backfill`, `events …`) and the compat entry
//! (`POST /cminmsgs/send`). They talk to the stores directly, so the CLI works while the
//! service is down. Inputs and outputs are serde types: the API and `--json` print the same.
//!
//! Every mutation requires who (actor) and why (reason), may name a ticket, runs through the
//! lifecycle gate (pipeline lock + row lock, `store::replay`) and writes one `audit_log` row.

mod actions;
mod compat;
mod cutover;
mod inspect;
mod purge;
mod skip;
mod status;
mod survey;

use std::time::Duration;

pub use actions::{
    ActionReport, DeadEvent, DeadEvents, RecoverRequest, ReplayRequest, RequeueReport,
    RequeueRequest, MAX_IDS,
};
pub use compat::{CallerTrace, CompatRequest, CompatResult, MAX_COMPAT_ID};
pub use cutover::{CutoverPlan, StockPart, PLAN_BATCH, PLAN_RANGES};
pub use inspect::{InboxView, Inspection};
pub use purge::{
    Advance, BoundaryWatch, PurgeReadiness, PurgeRequest, Unmarked, BOUNDARY_MAX_ROWS,
    MARKED_REASONS, PULL_DOWN_MAX_IDS, PURGE_BATCH, REASONS,
};
pub use skip::{SkipBatch, SkipReport, SkipRequest, ACTION_SKIP, APPROVED_SKIP, SKIP_BATCH};
pub use status::Status;
pub use survey::{Progress, Survey, SurveyRequest, TypeCount, SURVEY_BATCH};

use crate::inbox::{Inbox, InboxError};
use crate::settings::Settings;
use crate::store::audit::AdminError;
use crate::store::{Store, StoreError};

/// Why an operation did not run (nothing changed, nothing audited).
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// The request is wrong (HTTP 400).
    #[error("{0}")]
    Invalid(String),
    /// What it names does not exist (HTTP 404).
    #[error("{0}")]
    NotFound(String),
    /// It conflicts with the current state (HTTP 409).
    #[error("{0}")]
    Conflict(String),
    /// Our PostgreSQL failed; the transaction rolled back (HTTP 503).
    #[error("store unavailable, nothing changed: {0}")]
    Store(#[from] StoreError),
    /// The inbox failed (HTTP 503).
    #[error("inbox unavailable, nothing changed: {0}")]
    Inbox(#[from] InboxError),
}

impl From<AdminError> for OpsError {
    fn from(e: AdminError) -> Self {
        match e {
            AdminError::Invalid(why) => Self::Invalid(why),
            AdminError::Store(e) => Self::Store(e),
        }
    }
}

impl From<sqlx::Error> for OpsError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(StoreError::Db(e))
    }
}

impl OpsError {
    /// The HTTP status of this refusal; the CLI exits non-zero on any of them.
    pub fn http_status(&self) -> u16 {
        match self {
            Self::Invalid(_) => 400,
            Self::NotFound(_) => 404,
            Self::Conflict(_) => 409,
            Self::Store(_) | Self::Inbox(_) => 503,
        }
    }
}

/// What the operations need: both stores and the drain-rate window.
#[derive(Debug, Clone)]
pub struct Ops {
    /// Our PostgreSQL.
    pub store: Store,
    /// The shared inbox (read only here).
    pub inbox: Inbox,
    /// Window of the processing rate behind the drain estimate (`processing.drain_rate_window`).
    pub drain_window: Duration,
    /// `kafka.dlq_topic`: where a requeued event's dead-letter copy lies when an older release
    /// recorded it without its topic.
    pub dlq_topic: String,
    /// The name of the HTTP token an audited action is run for (`audit_log.token_name`);
    /// None from the CLI ([`Ops::called_by`]).
    pub caller: Option<std::sync::Arc<str>>,
}

impl Ops {
    /// From the settings and connected stores.
    pub fn new(settings: &Settings, store: Store, inbox: Inbox) -> Self {
        Self {
            store,
            inbox,
            drain_window: settings.processing.drain_rate_window,
            dlq_topic: settings.kafka.dlq_topic.clone(),
            caller: None,
        }
    }

    /// These operations on behalf of the HTTP token named `token`: the audit rows they
    /// write record the name beside the actor the request states.
    pub fn called_by(&self, token: &std::sync::Arc<str>) -> Self {
        Self {
            caller: Some(token.clone()),
            ..self.clone()
        }
    }
}
