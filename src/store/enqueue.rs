//! One poll round's write: enqueue the rows up to the new W and write `(W, HOLE_SINCE,
//! HOLE_SEEN_DB_AT)` back, in ONE transaction (W never moves without its rows).

use chrono::{DateTime, NaiveDateTime, Utc};

use super::{Store, StoreError};
use crate::watermark::Cursor;

/// A row to enqueue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnqueueRow {
    /// Inbox id.
    pub msg_id: i64,
    /// Converted receive time.
    pub received_at: Option<DateTime<Utc>>,
}

/// The round to commit.
#[derive(Debug, Clone)]
pub struct RoundWrite<'a> {
    /// W as read at the start of the round; the write fails if it changed meanwhile.
    pub expected_w: i64,
    /// The decided cursor.
    pub cursor: Cursor,
    /// Rows ≤ the new W, ascending.
    pub rows: &'a [EnqueueRow],
    /// Enqueue time (the injected clock).
    pub now: DateTime<Utc>,
    /// Commit without waiting for the WAL flush (safe: a lost round is re-read).
    pub async_commit: bool,
    /// Ids released as a permanent hole this round, and until when to watch them for a late
    /// commit: written to `late_watch` in the same transaction that moves W past them, so a
    /// crash can never lose the watch.
    pub released: Option<(std::ops::RangeInclusive<i64>, DateTime<Utc>)>,
}

impl Store {
    /// Commits a round; returns how many rows were new (conflicts mean already enqueued).
    /// Clears `HOLE_SEEN_DB_AT` (no transaction evidence): see [`Store::commit_round_seen`].
    pub async fn commit_round(&self, round: RoundWrite<'_>) -> Result<u64, StoreError> {
        self.commit_round_seen(round, None).await
    }

    /// [`Store::commit_round`] that also writes `HOLE_SEEN_DB_AT`, the MySQL server time the
    /// hole in `round.cursor` was first seen (`late.hole_evidence`), in the same transaction as
    /// `HOLE_SINCE`. A NULL makes the next round with evidence take a new sighting — later,
    /// so it only ever counts more transactions as older (safe).
    pub async fn commit_round_seen(
        &self,
        round: RoundWrite<'_>,
        hole_seen_db_at: Option<NaiveDateTime>,
    ) -> Result<u64, StoreError> {
        // Never a sighting without a hole.
        let hole_seen_db_at = hole_seen_db_at.filter(|_| round.cursor.hole_since.is_some());
        let mut tx = self.pool().begin().await?;
        if round.async_commit {
            sqlx::query("SET LOCAL synchronous_commit = off")
                .execute(&mut *tx)
                .await?;
        }
        let inserted = if round.rows.is_empty() {
            0
        } else {
            let ids: Vec<i64> = round.rows.iter().map(|r| r.msg_id).collect();
            let received: Vec<Option<DateTime<Utc>>> =
                round.rows.iter().map(|r| r.received_at).collect();
            sqlx::query(
                "INSERT INTO proc_state (msg_id, received_at, enqueued_at, source, state) \
                 SELECT id, recv, $3, 'POLL', 'PENDING' \
                 FROM UNNEST($1::bigint[], $2::timestamptz[]) AS r(id, recv) \
                 ON CONFLICT (msg_id) DO NOTHING",
            )
            .bind(&ids)
            .bind(&received)
            .bind(round.now)
            .execute(&mut *tx)
            .await?
            .rows_affected()
        };
        if let Some((ids, expires_at)) = &round.released {
            sqlx::query(
                "INSERT INTO late_watch (msg_id, released_at, expires_at) \
                 SELECT g, $3, $4 FROM generate_series($1::bigint, $2::bigint) AS g \
                 ON CONFLICT (msg_id) DO NOTHING",
            )
            .bind(ids.start())
            .bind(ids.end())
            .bind(round.now)
            .bind(expires_at)
            .execute(&mut *tx)
            .await?;
        }
        let moved = sqlx::query(
            "UPDATE inbox_cursor SET w = $1, hole_since = $2, hole_seen_db_at = $5, \
             updated_at = $3 WHERE id = 1 AND w = $4",
        )
        .bind(round.cursor.w)
        .bind(round.cursor.hole_since)
        .bind(round.now)
        .bind(round.expected_w)
        .bind(hole_seen_db_at)
        .execute(&mut *tx)
        .await?;
        if moved.rows_affected() != 1 {
            tx.rollback().await?;
            return Err(StoreError::CursorMoved {
                expected: round.expected_w,
            });
        }
        // Seed §4 "in the inbox, not enqueued": W and its rows are not committed yet.
        crate::failpoint::hit("poll_before_enqueue_commit");
        tx.commit().await?;
        Ok(inserted)
    }
}
