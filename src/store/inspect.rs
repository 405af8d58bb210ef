//! Read-only views for operators (the admin HTTP surface): one message's processing record and
//! the events it raised, as JSON.

use super::{Store, StoreError};

impl Store {
    /// `proc_state` of `msg_id` with its events (id, type, key, state, attempts, last error),
    /// or None when there is no such row. An archived record (PROC_STATE_HST, migration 0014)
    /// is shown too, with `"archived": true`.
    pub async fn message_view(&self, msg_id: i64) -> Result<Option<serde_json::Value>, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT to_jsonb(p) || jsonb_build_object('events', COALESCE(( \
                 SELECT jsonb_agg(jsonb_build_object('event_id', e.event_id, \
                        'event_type', e.event_type, 'flight_key', e.flight_key, \
                        'state', e.state, 'attempts', e.attempts, 'last_error', e.last_error, \
                        'sent_at', e.sent_at, 'dead_at', e.dead_at) ORDER BY e.event_id) \
                 FROM msg_event e WHERE e.msg_id = p.msg_id), '[]'::jsonb)) \
             FROM proc_state_all p WHERE p.msg_id = $1",
        )
        .bind(msg_id)
        .fetch_optional(self.pool())
        .await?)
    }
}
