//! The durable watch of released holes (SPEC §6): ranges in `late_watch_range`, detections in
//! `late_watch`.
//!
//! The poller inserts each released hole as ONE range row in the same transaction that moves W
//! past it (`RoundWrite::released`), whatever its size (a purged prefix of 80M ids is one row).
//! The late detector pages through the ranges and asks the inbox for rows inside them with
//! range queries; per page it either
//! - records the hits ([`Store::late_watch_detected`]): in ONE transaction each hit's range is
//!   split around it, the hit is recorded in `late_watch` (the audit of late arrivals) and
//!   enqueued as a `LATE` `PROC_STATE` row; or
//! - records the page as checked and closes (deletes) the ranges whose window has passed
//!   ([`Store::late_watch_checked`]) — only after a successful check at or after expiry.

use chrono::{DateTime, Utc};

use super::{Store, StoreError};

/// One watched range of released ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub struct WatchRange {
    /// First released id.
    pub first_id: i64,
    /// Last released id.
    pub last_id: i64,
    /// When the poller released it.
    pub released_at: DateTime<Utc>,
    /// End of its watch window.
    pub expires_at: DateTime<Utc>,
    /// Last check that found it absent.
    pub checked_at: Option<DateTime<Utc>>,
}

impl WatchRange {
    /// Ids in the range.
    pub fn len(&self) -> i64 {
        self.last_id - self.first_id + 1
    }

    /// Never true for a stored range.
    pub fn is_empty(&self) -> bool {
        self.last_id < self.first_id
    }

    /// Does it hold `id`?
    pub fn contains(&self, id: i64) -> bool {
        (self.first_id..=self.last_id).contains(&id)
    }
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

/// `range` without the ids in `hits` (ascending, all inside it): the pieces left to watch.
pub fn split_range(range: &WatchRange, hits: &[i64]) -> Vec<WatchRange> {
    let mut out = Vec::new();
    let mut from = range.first_id;
    for &hit in hits {
        if hit > from {
            out.push(WatchRange {
                first_id: from,
                last_id: hit - 1,
                ..*range
            });
        }
        from = hit + 1;
    }
    if from <= range.last_id {
        out.push(WatchRange {
            first_id: from,
            ..*range
        });
    }
    out
}

impl Store {
    /// Up to `limit` watched ranges starting after `after`, ascending.
    pub async fn late_watch_page(
        &self,
        after: i64,
        limit: u32,
    ) -> Result<Vec<WatchRange>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT first_id, last_id, released_at, expires_at, checked_at FROM late_watch_range \
             WHERE first_id > $1 ORDER BY first_id LIMIT $2",
        )
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(self.pool())
        .await?)
    }

    /// These ids (ascending) were found in the inbox inside the watched `ranges`: in ONE
    /// transaction split each range around its hits, record each hit as detected in
    /// `late_watch`, and enqueue it as `PENDING` with source `LATE` (`ON CONFLICT DO NOTHING`).
    /// A range that changed meanwhile (locked and compared) is left alone: its hits are found
    /// again next round.
    pub async fn late_watch_detected(
        &self,
        ranges: &[WatchRange],
        hits: &[i64],
        now: DateTime<Utc>,
    ) -> Result<Vec<Enqueued>, StoreError> {
        if hits.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.pool().begin().await?;
        let firsts: Vec<i64> = ranges.iter().map(|r| r.first_id).collect();
        let locked: Vec<WatchRange> = sqlx::query_as(
            "SELECT first_id, last_id, released_at, expires_at, checked_at FROM late_watch_range \
             WHERE first_id = ANY($1) ORDER BY first_id FOR UPDATE",
        )
        .bind(&firsts)
        .fetch_all(&mut *tx)
        .await?;
        let mut detected = Vec::new();
        let mut pieces = Vec::new();
        let mut replaced = Vec::new();
        for range in locked.iter().filter(|l| ranges.contains(l)) {
            let inside: Vec<i64> = hits
                .iter()
                .copied()
                .filter(|h| range.contains(*h))
                .collect();
            if inside.is_empty() {
                continue;
            }
            replaced.push(range.first_id);
            pieces.extend(split_range(range, &inside));
            detected.extend(inside.into_iter().map(|id| (id, *range)));
        }
        sqlx::query("DELETE FROM late_watch_range WHERE first_id = ANY($1)")
            .bind(&replaced)
            .execute(&mut *tx)
            .await?;
        insert_ranges(&mut tx, &pieces).await?;
        let ids: Vec<i64> = detected.iter().map(|(id, _)| *id).collect();
        let released: Vec<DateTime<Utc>> = detected.iter().map(|(_, r)| r.released_at).collect();
        let expires: Vec<DateTime<Utc>> = detected.iter().map(|(_, r)| r.expires_at).collect();
        sqlx::query(
            "INSERT INTO late_watch (msg_id, released_at, expires_at, checked_at, detected_at) \
             SELECT id, rel, exp, $4, $4 \
             FROM UNNEST($1::bigint[], $2::timestamptz[], $3::timestamptz[]) AS d(id, rel, exp) \
             ON CONFLICT (msg_id) DO NOTHING",
        )
        .bind(&ids)
        .bind(&released)
        .bind(&expires)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let inserted: Vec<i64> = sqlx::query_scalar(
            "INSERT INTO proc_state (msg_id, enqueued_at, source, state) \
             SELECT id, $2, 'LATE', 'PENDING' FROM UNNEST($1::bigint[]) AS id \
             WHERE NOT EXISTS (SELECT 1 FROM proc_state_hst h WHERE h.msg_id = id) \
             ON CONFLICT (msg_id) DO NOTHING RETURNING msg_id",
        )
        .bind(&ids)
        .bind(now)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(ids
            .into_iter()
            .map(|msg_id| Enqueued {
                msg_id,
                new_row: inserted.contains(&msg_id),
            })
            .collect())
    }

    /// These ranges were checked and hold no row: close (delete) those whose window has passed
    /// at `now`, stamp `checked_at` on the rest. Returns the closed ranges `(first, last)`.
    pub async fn late_watch_checked(
        &self,
        ranges: &[WatchRange],
        now: DateTime<Utc>,
    ) -> Result<Vec<(i64, i64)>, StoreError> {
        if ranges.is_empty() {
            return Ok(Vec::new());
        }
        let firsts: Vec<i64> = ranges.iter().map(|r| r.first_id).collect();
        let lasts: Vec<i64> = ranges.iter().map(|r| r.last_id).collect();
        let mut tx = self.pool().begin().await?;
        // Only ranges still exactly as checked: a split one is checked again next round.
        let mut closed: Vec<(i64, i64)> = sqlx::query_as(
            "DELETE FROM late_watch_range w USING UNNEST($1::bigint[], $2::bigint[]) AS c(f, l) \
             WHERE w.first_id = c.f AND w.last_id = c.l AND w.expires_at <= $3 \
             RETURNING w.first_id, w.last_id",
        )
        .bind(&firsts)
        .bind(&lasts)
        .bind(now)
        .fetch_all(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE late_watch_range w SET checked_at = $3 \
             FROM UNNEST($1::bigint[], $2::bigint[]) AS c(f, l) \
             WHERE w.first_id = c.f AND w.last_id = c.l",
        )
        .bind(&firsts)
        .bind(&lasts)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        closed.sort_unstable();
        Ok(closed)
    }

    /// Watched ids (the `msgx_late_watch_size` gauge) and ranges.
    pub async fn late_watch_open(&self) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT COALESCE(sum(last_id - first_id + 1), 0)::bigint FROM late_watch_range",
        )
        .fetch_one(self.pool())
        .await?)
    }

    /// The ids among `ids` inside a watched range (the compensation scan leaves those to the
    /// late detector). Ranges are disjoint: the one starting last at or before an id is the
    /// only candidate (one index probe per id).
    pub async fn late_watch_covering(&self, ids: &[i64]) -> Result<Vec<i64>, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT i FROM UNNEST($1::bigint[]) AS i \
             WHERE (SELECT last_id FROM late_watch_range WHERE first_id <= i \
                    ORDER BY first_id DESC LIMIT 1) >= i",
        )
        .bind(ids)
        .fetch_all(self.pool())
        .await?)
    }
}

pub(super) async fn insert_ranges(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    ranges: &[WatchRange],
) -> Result<(), StoreError> {
    if ranges.is_empty() {
        return Ok(());
    }
    let f: Vec<i64> = ranges.iter().map(|r| r.first_id).collect();
    let l: Vec<i64> = ranges.iter().map(|r| r.last_id).collect();
    let rel: Vec<DateTime<Utc>> = ranges.iter().map(|r| r.released_at).collect();
    let exp: Vec<DateTime<Utc>> = ranges.iter().map(|r| r.expires_at).collect();
    let chk: Vec<Option<DateTime<Utc>>> = ranges.iter().map(|r| r.checked_at).collect();
    sqlx::query(
        "INSERT INTO late_watch_range (first_id, last_id, released_at, expires_at, checked_at) \
         SELECT * FROM UNNEST($1::bigint[], $2::bigint[], $3::timestamptz[], $4::timestamptz[], \
                              $5::timestamptz[])",
    )
    .bind(&f)
    .bind(&l)
    .bind(&rel)
    .bind(&exp)
    .bind(&chk)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(first_id: i64, last_id: i64) -> WatchRange {
        let at = DateTime::from_timestamp(1_790_000_000, 0).expect("time");
        WatchRange {
            first_id,
            last_id,
            released_at: at,
            expires_at: at,
            checked_at: None,
        }
    }

    #[test]
    fn a_range_splits_around_its_hits() {
        let r = range(10, 20);
        let ends = |v: Vec<WatchRange>| -> Vec<(i64, i64)> {
            v.iter().map(|p| (p.first_id, p.last_id)).collect()
        };
        assert_eq!(ends(split_range(&r, &[15])), vec![(10, 14), (16, 20)]);
        assert_eq!(ends(split_range(&r, &[10, 20])), vec![(11, 19)]);
        assert_eq!(ends(split_range(&r, &[10, 11, 12])), vec![(13, 20)]);
        assert!(split_range(&range(5, 5), &[5]).is_empty());
        assert_eq!(ends(split_range(&r, &[])), vec![(10, 20)]);
    }
}
