//! The cutover record (`cutover_stock` + `cutover_gap`, migration 0015) as read and written by
//! the store: what a cutover seeding skipped. The rules that compute it are in the `cutover`
//! module.

use chrono::{DateTime, Utc};
use serde::Serialize;

/// What a cutover skipped, as stored (`cutover_stock` + `cutover_gap`, migration 0015).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CutoverStock {
    /// The mode as configured (`min`, `zero`, `max` or the id).
    pub mode: String,
    /// The seeded W.
    pub w: i64,
    /// The stock rows skipped: none for `min` and `zero`.
    pub span: Option<StockSpan>,
    /// When the seeding committed.
    pub seeded_at: DateTime<Utc>,
}

/// The visible stock a cutover skipped: every id in `first..=last` except the gaps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StockSpan {
    /// The lowest stock id (ids below it had no row at the cutover: not stock, no gap).
    pub first: i64,
    /// The highest id skipped: the seeded W.
    pub last: i64,
    /// Stock rows skipped.
    pub rows: i64,
    /// Ids in `first..=last` with no committed row at the cutover, as inclusive ranges in
    /// ascending order: holes like any other (watched; a late commit is processed as LATE).
    pub gaps: Vec<(i64, i64)>,
}

impl StockSpan {
    /// True when `id` was a visible stock row at the cutover, so it is not ours.
    pub fn skips(&self, id: i64) -> bool {
        if id < self.first || id > self.last {
            return false;
        }
        // The last gap starting at or before `id`.
        let i = self.gaps.partition_point(|g| g.0 <= id);
        !(i > 0 && self.gaps[i - 1].1 >= id)
    }

    /// Ids in the gaps.
    pub fn gap_ids(&self) -> i64 {
        self.gaps.iter().map(|(f, l)| l - f + 1).sum()
    }
}

impl CutoverStock {
    /// True when `id` was skipped at the cutover (a stock row of the previous system).
    pub fn skips(&self, id: i64) -> bool {
        self.span.as_ref().is_some_and(|s| s.skips(id))
    }
}
