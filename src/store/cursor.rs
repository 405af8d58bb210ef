//! `INBOX_CURSOR` and `INBOX_HOLE`: read the cursor and the open holes, seed W once at cutover.

use chrono::{DateTime, NaiveDateTime, Utc};

use super::{Store, StoreError};
use crate::watermark::{Cursor, Hole};

/// The cursor row as stored, with the open holes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCursor {
    /// W and HOLE_SINCE.
    pub cursor: Cursor,
    /// When a cutover seeding set W, if ever.
    pub seeded_at: Option<DateTime<Utc>>,
    /// The open holes (`inbox_hole`), ascending by first id, as stored: the poller checks
    /// them ([`crate::watermark::check_holes`]) before it uses them.
    pub holes: Vec<Hole>,
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
    /// Reads `(W, HOLE_SINCE, SEEDED_AT)` and the open holes: ONE statement, so one snapshot
    /// (the holes always belong to the W they are read with).
    pub async fn read_cursor(&self) -> Result<StoredCursor, StoreError> {
        type Row = (
            i64,
            Option<DateTime<Utc>>,
            Option<DateTime<Utc>>,
            Option<i64>,
            Option<i64>,
            Option<DateTime<Utc>>,
            Option<NaiveDateTime>,
        );
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT c.w, c.hole_since, c.seeded_at, h.first_id, h.last_id, h.first_seen, \
                    h.seen_db_at \
             FROM inbox_cursor c LEFT JOIN inbox_hole h ON true \
             WHERE c.id = 1 ORDER BY h.first_id",
        )
        .fetch_all(self.pool())
        .await?;
        let Some(&(w, hole_since, seeded_at, ..)) = rows.first() else {
            return Err(StoreError::Corrupt("inbox_cursor has no row".into()));
        };
        let holes = rows
            .into_iter()
            .filter_map(|(.., first, last, first_seen, seen_db_at)| {
                Some(Hole {
                    first: first?,
                    last: last?,
                    first_seen: first_seen?,
                    seen_db_at,
                })
            })
            .collect();
        Ok(StoredCursor {
            cursor: Cursor { w, hole_since },
            seeded_at,
            holes,
        })
    }
}
