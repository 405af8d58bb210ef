//! The caller trace contexts kept with compat-registered rows (migration 0023, issue 54).

use super::{Store, StoreError};

/// `(msg_id, traceparent, tracestate)` of a row registered with a caller's context.
pub type StoredTraceContext = (i64, String, Option<String>);

impl Store {
    /// The stored caller contexts of `ids` (rows without one are left out). Read only while
    /// tracing is on.
    pub async fn trace_contexts(&self, ids: &[i64]) -> Result<Vec<StoredTraceContext>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT msg_id, trace_parent, trace_state FROM proc_state \
             WHERE msg_id = ANY($1) AND trace_parent IS NOT NULL",
        )
        .bind(ids)
        .fetch_all(self.pool())
        .await?)
    }
}
