//! The compat entry `POST /cminmsgs/send` (seed §5.1, §4): upstream's old "I wrote inbox row
//! N" call. It registers `PROC_STATE` for an inbox id beyond W (source `COMPAT`) and never
//! reads or moves W: the pump only takes ids ≤ W, so the row waits until the poller's W
//! catches up and order is kept; the poller's own insert of that id is then a no-op.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Ops, OpsError};
use crate::traces::{valid_tracestate, TraceParent};

/// Largest id accepted (2^53 − 1: exact in every JSON parser); beyond it is not an inbox id.
pub const MAX_COMPAT_ID: i64 = 9_007_199_254_740_991;

/// The request body.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompatRequest {
    /// `CMINMSGS_ID` of the row upstream wrote.
    pub msg_id: i64,
}

/// The answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CompatResult {
    /// The id.
    pub msg_id: i64,
    /// True when this call registered it; false when it was registered before (by an earlier
    /// call or by the poller).
    pub registered: bool,
    /// Its state now.
    pub state: String,
    /// Who registered it: `COMPAT`, `POLL` or `LATE`.
    pub source: String,
    /// W as read after the call (unchanged by it).
    pub watermark: i64,
}

/// The caller's W3C trace context (`traceparent`, `tracestate` request headers), kept with
/// the row so the message's trace continues the caller's (issue 54).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallerTrace {
    /// A valid `traceparent`, normalised.
    pub parent: Option<TraceParent>,
    /// Its `tracestate`, when valid and a `traceparent` came with it.
    pub state: Option<String>,
}

impl CallerTrace {
    /// From the raw header values. A malformed `traceparent` is ignored, as W3C Trace Context
    /// tells a receiver (the message gets its own trace); it never refuses the call.
    pub fn from_headers(traceparent: Option<&str>, tracestate: Option<&str>) -> Self {
        let parent = traceparent.and_then(TraceParent::parse);
        let state = tracestate
            .map(str::trim)
            .filter(|s| parent.is_some() && valid_tracestate(s))
            .map(str::to_string);
        Self { parent, state }
    }
}

impl Ops {
    /// Registers `req.msg_id` beyond W, idempotently. Refused (nothing changed) for an id that
    /// is not positive or absurd, absent from the inbox, or at/below W without a record (a
    /// released hole: the late detector enqueues it). A registering call keeps `caller`'s
    /// trace context with the row.
    pub async fn compat_register(
        &self,
        req: &CompatRequest,
        now: DateTime<Utc>,
        caller: &CallerTrace,
    ) -> Result<CompatResult, OpsError> {
        let id = req.msg_id;
        if id <= 0 {
            return Err(OpsError::Invalid(format!(
                "msg_id {id} is not an inbox id (must be positive)"
            )));
        }
        if id > MAX_COMPAT_ID {
            return Err(OpsError::Invalid(format!(
                "msg_id {id} is absurd (above {MAX_COMPAT_ID})"
            )));
        }
        let Some(meta) = self.inbox.row_meta(id).await? else {
            return Err(OpsError::NotFound(format!(
                "the inbox has no row {id}; nothing registered"
            )));
        };
        // One statement: insert only beyond W; a row that exists already stays as it is.
        let inserted: Option<i64> = sqlx::query_scalar(
            "INSERT INTO proc_state (msg_id, source, received_at, enqueued_at, updated_at, \
                                     trace_parent, trace_state) \
             SELECT $1, 'COMPAT', $2, $3, $3, $4, $5 \
             WHERE $1 > (SELECT w FROM inbox_cursor WHERE id = 1) \
             ON CONFLICT (msg_id) DO NOTHING RETURNING msg_id",
        )
        .bind(id)
        .bind(meta.received_at)
        .bind(now)
        .bind(caller.parent.map(|p| p.to_string()))
        .bind(caller.state.as_deref())
        .fetch_optional(self.store.pool())
        .await?;
        if let (Some(_), Some(t)) = (inserted, crate::traces::active()) {
            let parent = caller.parent.map(|p| p.to_string());
            let trace = t.message(id, parent.as_deref(), caller.state.as_deref());
            t.inbox_commit(id, &trace, meta.received_at.unwrap_or(now), "COMPAT");
        }
        let (w,): (i64,) = sqlx::query_as("SELECT w FROM inbox_cursor WHERE id = 1")
            .fetch_one(self.store.pool())
            .await?;
        let row: Option<(String, String)> =
            sqlx::query_as("SELECT state, source FROM proc_state_all WHERE msg_id = $1")
                .bind(id)
                .fetch_optional(self.store.pool())
                .await?;
        let Some((state, source)) = row else {
            return Err(OpsError::Conflict(format!(
                "msg_id {id} is at or below the watermark W={w} and has no processing record: \
                 it was released as a hole; the late detector enqueues it if it appears"
            )));
        };
        let registered = inserted.is_some();
        tracing::info!(
            msg_id = id,
            watermark = w,
            registered,
            source = %source,
            "compat entry: inbox id registered beyond the watermark"
        );
        Ok(CompatResult {
            msg_id: id,
            registered,
            state,
            source,
            watermark: w,
        })
    }
}
