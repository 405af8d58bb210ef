//! One poll round's write: enqueue the rows up to the new W, write `(W, HOLE_SINCE)` back,
//! replace the open holes and watch the released ones, in ONE transaction (W never moves
//! without its rows, and a hole's first sighting is durable with the W it belongs to).

use chrono::{DateTime, NaiveDateTime, Utc};

use super::{Store, StoreError};
use crate::watermark::{Cursor, Hole, Released};

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
    /// The open holes after the round (replace the stored set), all above `cursor.w`.
    pub holes: &'a [Hole],
    /// Holes released this round: written to `late_watch_range` in the same transaction that
    /// moves W past them, so a crash can never lose the watch. One row per range, whatever
    /// its size.
    pub released: &'a [Released],
    /// Until when released ids are watched for a late commit.
    pub watch_until: DateTime<Utc>,
}

impl Store {
    /// Commits a round; returns how many rows were new (conflicts mean already enqueued).
    pub async fn commit_round(&self, round: RoundWrite<'_>) -> Result<u64, StoreError> {
        Ok(self.commit_round_with(round, false).await?.0)
    }

    /// [`Store::commit_round`], and the ids that were new to PROC_STATE when `new_ids` (the
    /// traced discovery: a row the compat entry registered first has its own trace already).
    pub async fn commit_round_with(
        &self,
        round: RoundWrite<'_>,
        new_ids: bool,
    ) -> Result<(u64, Vec<i64>), StoreError> {
        let mut tx = self.pool().begin().await?;
        if round.async_commit {
            sqlx::query("SET LOCAL synchronous_commit = off")
                .execute(&mut *tx)
                .await?;
        }
        // The compare-and-set first: a second writer fails before it wrote anything else.
        let moved = sqlx::query(
            "UPDATE inbox_cursor SET w = $1, hole_since = $2, hole_seen_db_at = NULL, \
             updated_at = $3 WHERE id = 1 AND w = $4",
        )
        .bind(round.cursor.w)
        .bind(round.cursor.hole_since)
        .bind(round.now)
        .bind(round.expected_w)
        .execute(&mut *tx)
        .await?;
        if moved.rows_affected() != 1 {
            tx.rollback().await?;
            return Err(StoreError::CursorMoved {
                expected: round.expected_w,
            });
        }
        let (inserted, new) = if round.rows.is_empty() {
            (0, Vec::new())
        } else {
            let ids: Vec<i64> = round.rows.iter().map(|r| r.msg_id).collect();
            let received: Vec<Option<DateTime<Utc>>> =
                round.rows.iter().map(|r| r.received_at).collect();
            const INSERT: &str = "INSERT INTO proc_state \
                 (msg_id, received_at, enqueued_at, source, state) \
                 SELECT id, recv, $3, 'POLL', 'PENDING' \
                 FROM UNNEST($1::bigint[], $2::timestamptz[]) AS r(id, recv) \
                 ON CONFLICT (msg_id) DO NOTHING";
            if new_ids {
                let mut new: Vec<i64> = sqlx::query_scalar(&format!("{INSERT} RETURNING msg_id"))
                    .bind(&ids)
                    .bind(&received)
                    .bind(round.now)
                    .fetch_all(&mut *tx)
                    .await?;
                new.sort_unstable(); // RETURNING promises no order
                (new.len() as u64, new)
            } else {
                let n = sqlx::query(INSERT)
                    .bind(&ids)
                    .bind(&received)
                    .bind(round.now)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                (n, Vec::new())
            }
        };
        if !round.released.is_empty() {
            let first: Vec<i64> = round.released.iter().map(|r| r.first).collect();
            let last: Vec<i64> = round.released.iter().map(|r| r.last).collect();
            sqlx::query(
                "INSERT INTO late_watch_range (first_id, last_id, released_at, expires_at) \
                 SELECT f, l, $3, $4 FROM UNNEST($1::bigint[], $2::bigint[]) AS r(f, l) \
                 ON CONFLICT (first_id) DO NOTHING",
            )
            .bind(&first)
            .bind(&last)
            .bind(round.now)
            .bind(round.watch_until)
            .execute(&mut *tx)
            .await?;
        }
        replace_holes(&mut tx, round.holes).await?;
        // Seed §4 "in the inbox, not enqueued": W and its rows are not committed yet.
        crate::failpoint::hit("poll_before_enqueue_commit");
        tx.commit().await?;
        Ok((inserted, new))
    }
}

/// Replaces the stored hole set (small: at most the gaps of one batch plus those beyond it).
async fn replace_holes(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    holes: &[Hole],
) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM inbox_hole")
        .execute(&mut **tx)
        .await?;
    if holes.is_empty() {
        return Ok(());
    }
    let first: Vec<i64> = holes.iter().map(|h| h.first).collect();
    let last: Vec<i64> = holes.iter().map(|h| h.last).collect();
    let seen: Vec<DateTime<Utc>> = holes.iter().map(|h| h.first_seen).collect();
    let db: Vec<Option<NaiveDateTime>> = holes.iter().map(|h| h.seen_db_at).collect();
    sqlx::query(
        "INSERT INTO inbox_hole (first_id, last_id, first_seen, seen_db_at) \
         SELECT * FROM UNNEST($1::bigint[], $2::bigint[], $3::timestamptz[], $4::timestamp[])",
    )
    .bind(&first)
    .bind(&last)
    .bind(&seen)
    .bind(&db)
    .execute(&mut **tx)
    .await?;
    Ok(())
}
