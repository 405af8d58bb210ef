//! `INBOX_CURSOR`: read the cursor, seed it once at cutover.

use chrono::{DateTime, NaiveDateTime, Utc};

use super::{Store, StoreError};
use crate::watermark::Cursor;

/// The cursor row as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredCursor {
    /// W and HOLE_SINCE.
    pub cursor: Cursor,
    /// When a cutover seeding set W, if ever.
    pub seeded_at: Option<DateTime<Utc>>,
    /// MySQL server time (its system zone) when the hole at W+1 was first seen with
    /// `late.hole_evidence` on; None when no hole is open or it was not read.
    pub hole_seen_db_at: Option<NaiveDateTime>,
}

/// What a cutover seeding did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeedOutcome {
    /// W was set on a fresh store.
    Seeded { w: i64 },
    /// The store was seeded before (at that time); nothing changed.
    AlreadySeeded { at: DateTime<Utc>, w: i64 },
}

impl Store {
    /// Reads `(W, HOLE_SINCE, SEEDED_AT, HOLE_SEEN_DB_AT)`.
    pub async fn read_cursor(&self) -> Result<StoredCursor, StoreError> {
        type Row = (
            i64,
            Option<DateTime<Utc>>,
            Option<DateTime<Utc>>,
            Option<NaiveDateTime>,
        );
        let (w, hole_since, seeded_at, hole_seen_db_at): Row = sqlx::query_as(
            "SELECT w, hole_since, seeded_at, hole_seen_db_at FROM inbox_cursor WHERE id = 1",
        )
        .fetch_one(self.pool())
        .await?;
        Ok(StoredCursor {
            cursor: Cursor { w, hole_since },
            seeded_at,
            hole_seen_db_at,
        })
    }

    /// Seeds W once, on a fresh store only (no watermark, no hole timer, no PROC_STATE rows).
    /// The check and the write are one statement, and SEEDED_AT is written with W.
    pub async fn seed_cursor(&self, w: i64, now: DateTime<Utc>) -> Result<SeedOutcome, StoreError> {
        let done = sqlx::query(
            "UPDATE inbox_cursor SET w = $1, hole_since = NULL, hole_seen_db_at = NULL, \
             seeded_at = $2, updated_at = $2 \
             WHERE id = 1 AND w = 0 AND hole_since IS NULL AND seeded_at IS NULL \
               AND NOT EXISTS (SELECT 1 FROM proc_state)",
        )
        .bind(w)
        .bind(now)
        .execute(self.pool())
        .await?;
        if done.rows_affected() == 1 {
            return Ok(SeedOutcome::Seeded { w });
        }
        let current = self.read_cursor().await?;
        if let Some(at) = current.seeded_at {
            return Ok(SeedOutcome::AlreadySeeded {
                at,
                w: current.cursor.w,
            });
        }
        let records = self.proc_state_count().await?;
        Err(StoreError::SeedRefused(format!(
            "the store is not fresh (W={}, hole open: {}, {} processing records); \
             re-seeding an upgraded instance must be an explicit operator action — \
             unset pipeline.cutover_watermark to start from the stored watermark",
            current.cursor.w,
            current.cursor.hole_since.is_some(),
            records
        )))
    }
}
