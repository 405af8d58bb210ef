//! Operator actions in the traces of the messages they touch (issue 54): after an audited
//! replay or requeue, one `msgx.operator.<action>` span per message (the caller contexts of
//! compat-registered rows read first, so those land in the caller's trace).

use chrono::{DateTime, Utc};

use super::{OperatorAction, Traces};
use crate::store::Store;

/// Who and why, as audited.
#[derive(Debug, Clone, Copy)]
pub struct Audited<'a> {
    /// `replay`, `requeue`.
    pub action: &'static str,
    /// The actor.
    pub actor: &'a str,
    /// The reason.
    pub reason: &'a str,
    /// The ticket.
    pub ticket: Option<&'a str>,
    /// The `audit_log` row.
    pub audit_id: Option<i64>,
}

impl Traces {
    /// Reports an action on `rows` (`(msg_id, event_id)`). A store error only loses the
    /// caller contexts (the spans go to the derived traces): the action itself is done.
    pub async fn operator_actions(
        &self,
        store: &Store,
        rows: &[(i64, Option<i64>)],
        who: Audited<'_>,
        at: DateTime<Utc>,
    ) {
        let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
        let stored = store.trace_contexts(&ids).await.unwrap_or_default();
        for &(msg_id, event_id) in rows {
            let ctx = stored.iter().find(|c| c.0 == msg_id);
            self.operator_action(&OperatorAction {
                msg_id,
                stored: ctx.map(|c| c.1.as_str()),
                state: ctx.and_then(|c| c.2.as_deref()),
                action: who.action,
                actor: who.actor,
                reason: who.reason,
                ticket: who.ticket,
                audit_id: who.audit_id,
                event_id,
                at,
            });
        }
    }
}
