//! Ids that hold the purge without an inbox row (issue 29 item 1). The rule ([`super::rule`])
//! judges rows that exist; an id with no visible row is not "nothing" when a row may still
//! commit there: an upstream transaction that holds its commit is invisible to every read, yet
//! a `DELETE … WHERE id <= B` waits on its lock and removes it once it commits. So the purge
//! boundary never passes an id that is not accounted for:
//!
//! - `watched_hole`: at or below W inside a released hole still watched (`late_watch_range`):
//!   the late detector enqueues a row that commits there;
//! - `open_hole`: above W inside an open hole (`inbox_hole`): the poller waits for it;
//! - `beyond_watermark`: any other id above W: not discovered yet.
//!
//! An id at or below W outside every watched range is accounted for: enqueued (its record and
//! row are judged by the rule) or given up after its watch window. Unfinished records and
//! replays in progress hold the purge through their rows (`pending`, `marked_pending`, …); a
//! record whose row is gone has nothing left to delete.
//!
//! W and the open holes are read in one statement BEFORE the watched ranges: a hole released
//! between the two reads lies above the W read, so it is held either way (never too high).

use crate::ops::OpsError;
use crate::store::Store;

/// Reasons an id without an inbox row holds the purge, in the order they are reported.
pub const ID_REASONS: &[&str] = &["watched_hole", "open_hole", "beyond_watermark"];

/// W, the open holes and the watched ranges, as read once for one check.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct IdHolds {
    /// W.
    pub w: i64,
    /// Open holes `(first, last)`, ascending (all above W).
    open: Vec<(i64, i64)>,
    /// Watched released ranges `(first, last)` starting at or below the range end, ascending.
    watched: Vec<(i64, i64)>,
}

impl IdHolds {
    /// Reads W with the open holes, then the watched ranges that start at or below `to`.
    pub(crate) async fn load(store: &Store, to: i64) -> Result<Self, OpsError> {
        let cursor = store.read_cursor().await?;
        let open = cursor.holes.iter().map(|h| (h.first, h.last)).collect();
        let watched: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT first_id, last_id FROM late_watch_range WHERE first_id <= $1 \
             ORDER BY first_id",
        )
        .bind(to)
        .fetch_all(store.pool())
        .await?;
        Ok(Self {
            w: cursor.cursor.w,
            open,
            watched,
        })
    }

    /// From parts (tests).
    #[cfg(test)]
    fn of(w: i64, open: Vec<(i64, i64)>, watched: Vec<(i64, i64)>) -> Self {
        Self { w, open, watched }
    }

    /// The held pieces of the ids `from..=to` (none of which has an inbox row), by reason,
    /// ascending: `(reason, first, last)`.
    pub(crate) fn classify(&self, from: i64, to: i64) -> Vec<(&'static str, i64, i64)> {
        let mut out = Vec::new();
        if from > to {
            return out;
        }
        let below_to = to.min(self.w);
        if from <= below_to {
            for (a, b) in overlaps(&self.watched, from, below_to) {
                out.push(("watched_hole", a, b));
            }
        }
        let above_from = from.max(self.w.saturating_add(1));
        if above_from <= to {
            let mut next = above_from;
            for (a, b) in overlaps(&self.open, above_from, to) {
                if a > next {
                    out.push(("beyond_watermark", next, a - 1));
                }
                out.push(("open_hole", a, b));
                next = b.saturating_add(1);
            }
            if next <= to {
                out.push(("beyond_watermark", next, to));
            }
        }
        out
    }
}

/// The pieces of the sorted, disjoint `ranges` inside `from..=to`.
fn overlaps(ranges: &[(i64, i64)], from: i64, to: i64) -> Vec<(i64, i64)> {
    let start = ranges.partition_point(|r| r.1 < from);
    ranges[start..]
        .iter()
        .take_while(|r| r.0 <= to)
        .map(|r| (r.0.max(from), r.1.min(to)))
        .collect()
}

/// The lowest id that holds the purge whatever the rows say (the gauge's ceiling): W + 1, or
/// the first watched released id below it. W is read before the ranges (see the module doc).
pub(crate) async fn first_held_id(store: &Store, w: i64) -> Result<i64, OpsError> {
    let first: Option<i64> = sqlx::query_scalar("SELECT min(first_id) FROM late_watch_range")
        .fetch_one(store.pool())
        .await?;
    let above_w = w.saturating_add(1);
    Ok(first.map_or(above_w, |f| f.min(above_w)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_is_split_by_reason() {
        let h = IdHolds::of(10, vec![(12, 13)], vec![(2, 3), (6, 8)]);
        assert_eq!(
            h.classify(1, 20),
            vec![
                ("watched_hole", 2, 3),
                ("watched_hole", 6, 8),
                ("beyond_watermark", 11, 11),
                ("open_hole", 12, 13),
                ("beyond_watermark", 14, 20),
            ]
        );
        // Inside one range, and a gap nothing holds.
        assert_eq!(h.classify(7, 7), vec![("watched_hole", 7, 7)]);
        assert!(h.classify(4, 5).is_empty());
        assert!(h.classify(9, 10).is_empty());
        assert!(h.classify(5, 4).is_empty());
        // A gap that ends inside the open hole.
        assert_eq!(
            h.classify(11, 12),
            vec![("beyond_watermark", 11, 11), ("open_hole", 12, 12)]
        );
        for (reason, ..) in h.classify(1, 20) {
            assert!(ID_REASONS.contains(&reason));
        }
    }
}
