//! One live record per business identity: no two PROC_STATE rows bound to one identity key
//! (the unique index says so; this reads it back in identity order, page by page).

use super::{Finding, VerifyError};
use crate::store::Store;

pub(super) async fn run(store: &Store, batch: i64) -> Result<Finding, VerifyError> {
    let mut f = Finding::new(
        "identity_unique",
        "one live record per identity (SNDR|TYPE|STYP|SEQN[|date])",
    );
    let mut after = String::new();
    let mut prev: Option<String> = None;
    loop {
        let rows: Vec<(String, i64)> = sqlx::query_as(
            // Live and archived records together (migration 0014).
            "SELECT identity_key, msg_id FROM proc_state_all \
             WHERE identity_key IS NOT NULL AND identity_key > $1 \
             ORDER BY identity_key, msg_id LIMIT $2",
        )
        .bind(&after)
        .bind(batch)
        .fetch_all(store.pool())
        .await?;
        let Some(last) = rows.last() else { break };
        after = last.0.clone();
        for (key, id) in rows {
            f.checked += 1;
            if prev.as_deref() == Some(key.as_str()) {
                f.violation(id);
            }
            prev = Some(key);
        }
    }
    Ok(f)
}
