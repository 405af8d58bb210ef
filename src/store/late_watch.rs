//! The durable watch list of released hole ids (`late_watch`, SPEC §6).
//!
//! The poller inserts released ids in the same transaction that moves W past them
//! (`RoundWrite::released`). The late detector pages through the *open* ids
//! (`detected_at IS NULL`), and per batch either
//! - marks hits detected **and** enqueues them as `LATE` `PROC_STATE` rows in one transaction
//!   ([`Store::late_watch_detected`]), or
//! - records absent ids as checked and closes (deletes) those whose window has passed
//!   ([`Store::late_watch_absent`]).
//!
//! Detected rows are kept (the audit of late arrivals); closed ones are deleted, so the open
//! index stays as small as the live watch.

use chrono::{DateTime, Utc};

use super::{Store, StoreError};

/// One open watched id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchedId {
    /// The released inbox id.
    pub msg_id: i64,
    /// Its watch window has passed (`expires_at <= now`): closed if absent at this check.
    pub expired: bool,
}

/// One row of the watch list, for operators and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub struct WatchEntry {
    /// The released inbox id.
    pub msg_id: i64,
    /// When the poller released it.
    pub released_at: DateTime<Utc>,
    /// End of its watch window.
    pub expires_at: DateTime<Utc>,
    /// Last check that found it absent (or the detecting check).
    pub checked_at: Option<DateTime<Utc>>,
    /// When it was found in the inbox (and enqueued as LATE).
    pub detected_at: Option<DateTime<Utc>>,
}

/// A detected id and whether this detection enqueued it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enqueued {
    /// The inbox id.
    pub msg_id: i64,
    /// False when a `PROC_STATE` row already existed (e.g. the compat entry registered it):
    /// nothing was inserted, the existing row is processed as it is.
    pub new_row: bool,
}

impl Store {
    /// Up to `limit` open watched ids greater than `after`, ascending (partial index
    /// `late_watch_open_idx`), each with whether its window has passed at `now`.
    pub async fn late_watch_page(
        &self,
        after: i64,
        limit: u32,
        now: DateTime<Utc>,
    ) -> Result<Vec<WatchedId>, StoreError> {
        let rows: Vec<(i64, bool)> = sqlx::query_as(
            "SELECT msg_id, expires_at <= $3 FROM late_watch \
             WHERE detected_at IS NULL AND msg_id > $1 ORDER BY msg_id LIMIT $2",
        )
        .bind(after)
        .bind(i64::from(limit))
        .bind(now)
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|(msg_id, expired)| WatchedId { msg_id, expired })
            .collect())
    }

    /// These watched ids were found in the inbox: in ONE transaction, mark them detected and
    /// enqueue each as `PENDING` with source `LATE` (`ON CONFLICT DO NOTHING`). Ids no longer
    /// open (detected or closed meanwhile) are left alone and not returned.
    pub async fn late_watch_detected(
        &self,
        ids: &[i64],
        now: DateTime<Utc>,
    ) -> Result<Vec<Enqueued>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.pool().begin().await?;
        let mut detected: Vec<i64> = sqlx::query_scalar(
            "UPDATE late_watch SET detected_at = $2, checked_at = $2 \
             WHERE msg_id = ANY($1) AND detected_at IS NULL RETURNING msg_id",
        )
        .bind(ids)
        .bind(now)
        .fetch_all(&mut *tx)
        .await?;
        detected.sort_unstable();
        let inserted: Vec<i64> = sqlx::query_scalar(
            "INSERT INTO proc_state (msg_id, enqueued_at, source, state) \
             SELECT id, $2, 'LATE', 'PENDING' FROM UNNEST($1::bigint[]) AS id \
             ON CONFLICT (msg_id) DO NOTHING RETURNING msg_id",
        )
        .bind(&detected)
        .bind(now)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(detected
            .into_iter()
            .map(|msg_id| Enqueued {
                msg_id,
                new_row: inserted.contains(&msg_id),
            })
            .collect())
    }

    /// These watched ids were checked and are absent: close (delete) the open ones whose
    /// window has passed at `now`, stamp `checked_at` on the rest. Returns the closed ids.
    pub async fn late_watch_absent(
        &self,
        ids: &[i64],
        now: DateTime<Utc>,
    ) -> Result<Vec<i64>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.pool().begin().await?;
        let mut closed: Vec<i64> = sqlx::query_scalar(
            "DELETE FROM late_watch \
             WHERE msg_id = ANY($1) AND detected_at IS NULL AND expires_at <= $2 \
             RETURNING msg_id",
        )
        .bind(ids)
        .bind(now)
        .fetch_all(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE late_watch SET checked_at = $2 WHERE msg_id = ANY($1) AND detected_at IS NULL",
        )
        .bind(ids)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        closed.sort_unstable();
        Ok(closed)
    }

    /// Open watched ids (the `msgx_late_watch_size` gauge).
    pub async fn late_watch_open(&self) -> Result<i64, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT count(*) FROM late_watch WHERE detected_at IS NULL")
                .fetch_one(self.pool())
                .await?,
        )
    }

    /// The watch list row of `msg_id`, if any (operators, tests).
    pub async fn late_watch_entry(&self, msg_id: i64) -> Result<Option<WatchEntry>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT msg_id, released_at, expires_at, checked_at, detected_at \
             FROM late_watch WHERE msg_id = $1",
        )
        .bind(msg_id)
        .fetch_optional(self.pool())
        .await?)
    }
}
