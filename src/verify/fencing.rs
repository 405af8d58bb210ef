//! No write by a stale lease epoch. Rows do not record the epoch that wrote them; what makes
//! the invariant hold is the statement trigger on every table of ours that refuses a write
//! from an epoch other than the lease's (migration 0006). This checks that the fence is in
//! place and enabled on each table, and that the lease row is sane (present, epoch ≥ 0).

use super::{Finding, VerifyError};
use crate::store::Store;

/// Every table a stale instance could write.
const FENCED: &[&str] = &[
    "inbox_cursor",
    "proc_state",
    "flight_state",
    "msg_event",
    "schd_snap_log",
    "late_watch",
    "audit_log",
    "req_track",
    "inbox_hole",
    "late_watch_range",
    "inbox_unseen",
    "proc_state_hst",
    "raw_copy",
    "cutover_stock",
    "cutover_gap",
    "backfill_lock",
];

pub(super) async fn run(store: &Store) -> Result<Finding, VerifyError> {
    let mut f = Finding::new(
        "fenced_writes",
        "no write by a stale lease epoch: the fence trigger is enabled on every table",
    );
    for (i, table) in FENCED.iter().enumerate() {
        f.checked += 1;
        let enabled: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid \
             WHERE c.relname = $1 AND t.tgname = 'fence' AND t.tgenabled IN ('O', 'A'))",
        )
        .bind(table)
        .fetch_one(store.pool())
        .await?;
        if !enabled {
            // The example is the table's position in the list (tables have no id).
            f.violation(i as i64);
        }
    }
    f.checked += 1;
    let lease: Option<i64> =
        sqlx::query_scalar("SELECT epoch FROM instance_lease WHERE id = 1 AND epoch >= 0")
            .fetch_optional(store.pool())
            .await?;
    if lease.is_none() {
        f.violation(-1);
    }
    f.scope = format!(
        "the fence trigger on {} tables (an example is the table's position: {}), and the \
         lease row (example -1)",
        FENCED.len(),
        FENCED.join(", ")
    );
    Ok(f)
}
