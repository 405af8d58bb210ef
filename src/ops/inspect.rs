//! `msgexchange inspect ID` / `GET /admin/messages/{id}`: one message's processing record, its
//! inbox row (metadata only, never the text), its events and its audit trail.

use std::fmt::Write as _;

use serde::Serialize;

use super::{Ops, OpsError};
use crate::inbox::RowMeta;
use crate::store::audit::AuditEntry;

/// The inbox side of a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "found", rename_all = "snake_case")]
pub enum InboxView {
    /// The row is there.
    Present(RowMeta),
    /// No row with this id (purged, or never committed).
    Absent,
    /// The inbox could not be read; the rest of the answer stands.
    Unreadable {
        /// Why.
        error: String,
    },
}

/// Everything about one message.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Inspection {
    /// `proc_state` as stored, with `events` (id, type, key, state, attempts, last error).
    #[serde(flatten)]
    pub record: serde_json::Map<String, serde_json::Value>,
    /// The inbox row's metadata.
    pub inbox: InboxView,
    /// Every audited action that named this message, oldest first.
    pub audit: Vec<AuditEntry>,
}

impl Ops {
    /// The message, or NotFound when there is no processing record.
    pub async fn inspect(&self, msg_id: i64) -> Result<Inspection, OpsError> {
        let Some(view) = self.store.message_view(msg_id).await? else {
            let inbox = match self.inbox.row_meta(msg_id).await {
                Ok(Some(_)) => "the inbox has the row (not enqueued yet, or released as a hole)",
                Ok(None) => "the inbox has no such row either",
                Err(_) => "the inbox could not be read",
            };
            return Err(OpsError::NotFound(format!(
                "no processing record for message {msg_id}; {inbox}"
            )));
        };
        let record = match view {
            serde_json::Value::Object(map) => map,
            other => {
                return Err(OpsError::Store(crate::store::StoreError::Corrupt(format!(
                    "message view of {msg_id} is not an object: {other}"
                ))))
            }
        };
        let inbox = match self.inbox.row_meta(msg_id).await {
            Ok(Some(meta)) => InboxView::Present(meta),
            Ok(None) => InboxView::Absent,
            Err(e) => InboxView::Unreadable {
                error: e.to_string(),
            },
        };
        let audit: Vec<AuditEntry> = sqlx::query_as(
            "SELECT id, at, actor, action, reason, msg_ids, result, ticket, token_name \
             FROM audit_log \
             WHERE msg_ids @> ARRAY[$1]::bigint[] ORDER BY id",
        )
        .bind(msg_id)
        .fetch_all(self.store.pool())
        .await?;
        Ok(Inspection {
            record,
            inbox,
            audit,
        })
    }
}

impl Inspection {
    /// For people: the record's key facts, the inbox row, the events, the audit trail.
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.render_record(&mut out);
        self.render_inbox(&mut out);
        self.render_events(&mut out);
        self.render_audit(&mut out);
        out
    }

    /// A field of the record as text (`-` when absent or null).
    fn field(&self, key: &str) -> String {
        match self.record.get(key) {
            None | Some(serde_json::Value::Null) => "-".to_string(),
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
        }
    }

    fn render_record(&self, out: &mut String) {
        let _ = writeln!(out, "message {}", self.field("msg_id"));
        for key in [
            "state",
            "source",
            "msg_type",
            "attempts",
            "error_class",
            "error_text",
            "terminal_reason",
            "terminal_at",
            "identity_key",
            "received_at",
            "enqueued_at",
            "processing_started_at",
            "next_attempt_at",
            "backfill_at",
            "backfill_attempts",
            "backfill_abandon_reason",
            "backfill_error",
            "stale_fields",
            "updated_at",
            // true: moved to PROC_STATE_HST by retention (migration 0014).
            "archived",
        ] {
            let _ = writeln!(out, "  {key:<24}{}", self.field(key));
        }
    }

    fn render_inbox(&self, out: &mut String) {
        match &self.inbox {
            InboxView::Present(m) => {
                let _ = writeln!(
                    out,
                    "inbox row   received={} processed={} status={} bytes={}",
                    m.received_local.as_deref().unwrap_or("-"),
                    m.processed_local.as_deref().unwrap_or("-"),
                    m.status.as_deref().unwrap_or("-"),
                    m.message_bytes
                );
            }
            InboxView::Absent => {
                let _ = writeln!(out, "inbox row   absent");
            }
            InboxView::Unreadable { error } => {
                let _ = writeln!(out, "inbox row   unreadable: {error}");
            }
        }
    }

    fn render_events(&self, out: &mut String) {
        let events = self
            .record
            .get("events")
            .and_then(|e| e.as_array())
            .map(Vec::as_slice)
            .unwrap_or_default();
        let _ = writeln!(out, "events      {}", events.len());
        for e in events {
            let _ = writeln!(
                out,
                "  #{} {} key={} state={} attempts={} last_error={}",
                e["event_id"],
                e["event_type"].as_str().unwrap_or("-"),
                e["flight_key"].as_str().unwrap_or("-"),
                e["state"].as_str().unwrap_or("-"),
                e["attempts"],
                e["last_error"].as_str().unwrap_or("-")
            );
        }
    }

    fn render_audit(&self, out: &mut String) {
        let _ = writeln!(out, "audit       {}", self.audit.len());
        for a in &self.audit {
            let _ = writeln!(
                out,
                "  #{} {} {} by {}{} ({}){}",
                a.id,
                a.at.to_rfc3339(),
                a.action,
                a.actor,
                a.token_name
                    .as_deref()
                    .map(|t| format!(" via token {t}"))
                    .unwrap_or_default(),
                a.reason,
                a.ticket
                    .as_deref()
                    .map(|t| format!(" ticket {t}"))
                    .unwrap_or_default()
            );
        }
    }
}
