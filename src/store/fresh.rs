//! Is the store fresh: never polled, never seeded, nothing recorded (the first start's
//! decision, issue 30: an inbox with history needs an explicit cutover mode).

use super::{Store, StoreError};

impl Store {
    /// True when no instance has ever discovered, processed or seeded anything here: the same
    /// condition cutover seeding requires ([`Store::seed_cutover`]).
    pub async fn is_fresh(&self) -> Result<bool, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT w = 0 AND hole_since IS NULL AND seeded_at IS NULL \
               AND NOT EXISTS (SELECT 1 FROM proc_state) \
               AND NOT EXISTS (SELECT 1 FROM inbox_hole) \
               AND NOT EXISTS (SELECT 1 FROM cutover_stock) \
             FROM inbox_cursor WHERE id = 1",
        )
        .fetch_optional(self.pool())
        .await?
        .unwrap_or(true))
    }
}
