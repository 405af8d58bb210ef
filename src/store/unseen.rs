//! Rows below W that discovery never saw (the compensation scan, `late::compensation_scan`).

use chrono::{DateTime, Utc};

use super::{Store, StoreError};

impl Store {
    /// The receive time recorded at enqueue for each of `ids` that has a `PROC_STATE` row,
    /// live or archived (`proc_state_all`, migration 0014: an archived row was enqueued).
    pub async fn received_of(
        &self,
        ids: &[i64],
    ) -> Result<std::collections::BTreeMap<i64, Option<DateTime<Utc>>>, StoreError> {
        if ids.is_empty() {
            return Ok(Default::default());
        }
        let rows: Vec<(i64, Option<DateTime<Utc>>)> =
            sqlx::query_as("SELECT msg_id, received_at FROM proc_state_all WHERE msg_id = ANY($1)")
                .bind(ids)
                .fetch_all(self.pool())
                .await?;
        Ok(rows.into_iter().collect())
    }

    /// In ONE transaction: record each id in `inbox_unseen` (found at `now` with W = `w`) and
    /// enqueue it as `PENDING` with source `LATE`. Returns the ids this call enqueued (an id
    /// that got a row meanwhile is left alone).
    pub async fn enqueue_unseen(
        &self,
        ids: &[i64],
        w: i64,
        now: DateTime<Utc>,
    ) -> Result<Vec<i64>, StoreError> {
        let mut tx = self.pool().begin().await?;
        let mut inserted: Vec<i64> = sqlx::query_scalar(
            "INSERT INTO proc_state (msg_id, enqueued_at, source, state) \
             SELECT id, $2, 'LATE', 'PENDING' FROM UNNEST($1::bigint[]) AS id \
             WHERE NOT EXISTS (SELECT 1 FROM proc_state_hst h WHERE h.msg_id = id) \
             ON CONFLICT (msg_id) DO NOTHING RETURNING msg_id",
        )
        .bind(ids)
        .bind(now)
        .fetch_all(&mut *tx)
        .await?;
        inserted.sort_unstable();
        sqlx::query(
            "INSERT INTO inbox_unseen (msg_id, found_at, w_at) \
             SELECT id, $2, $3 FROM UNNEST($1::bigint[]) AS id ON CONFLICT (msg_id) DO NOTHING",
        )
        .bind(&inserted)
        .bind(now)
        .bind(w)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(inserted)
    }
}
