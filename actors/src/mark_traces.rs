//! The inbox mark's spans (issue 54): one `UPDATE <inbox.table>` span per row a backfill sweep
//! confirmed or abandoned, in the row's message trace. Reported after the sweep, beside the
//! mailbox (the spans carry their own times); the caller contexts of compat-registered rows
//! are read only while tracing is on.

use chrono::{DateTime, Utc};
use msgx_core::backfill::SweepReport;
use msgx_core::store::Store;
use msgx_core::traces::{Marking, Traces};

/// Reports the marks of a finished sweep that ran from `started` to `ended`.
pub fn report(
    traces: &'static Traces,
    store: &Store,
    sweep: &SweepReport,
    started: DateTime<Utc>,
    ended: DateTime<Utc>,
) {
    let rows: Vec<(i64, &'static str)> = sweep
        .confirmed
        .iter()
        .map(|id| (*id, "confirmed"))
        .chain(
            sweep
                .missing
                .iter()
                .map(|(id, _)| (*id, "abandoned_missing_row")),
        )
        .chain(
            sweep
                .abandoned
                .iter()
                .map(|id| (*id, "abandoned_max_attempts")),
        )
        .collect();
    if rows.is_empty() {
        return;
    }
    let store = store.clone();
    actix_rt::spawn(async move {
        let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
        let stored = store.trace_contexts(&ids).await.unwrap_or_else(|e| {
            tracing::debug!(error = %e, "reading the caller trace contexts failed");
            Vec::new()
        });
        for (msg_id, outcome) in rows {
            let ctx = stored.iter().find(|c| c.0 == msg_id);
            traces.marked(&Marking {
                msg_id,
                stored: ctx.map(|c| c.1.as_str()),
                state: ctx.and_then(|c| c.2.as_deref()),
                started,
                ended,
                outcome,
            });
        }
    });
}
