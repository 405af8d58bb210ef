//! Cutover seeding (seed §5.1): an explicit, one-time choice of the starting watermark on a
//! fresh store. The code never picks one by default.
//!
//! What `max` and `<id>` skip is the *visible stock*: the inbox rows committed at the cutover
//! at or below the seeded W. They are the previous system's and are never processed by us, by
//! any path. The ids *missing* from the stock at that moment (rolled back, or still
//! uncommitted) are holes like any other: watched, and a late commit among them is processed
//! as LATE. [`CutoverStock`] is that record, stored with W in one transaction
//! ([`seed::seed`]); `Ops::cutover_plan` shows what a mode would do before anyone commits to
//! it.

pub mod expect;
pub mod seed;

use std::fmt;

pub use crate::rows::stock::{CutoverStock, StockSpan};

/// Where a fresh instance starts reading the inbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutoverMode {
    /// Read every existing row: W = MIN(id) − 1 (no false hole before the oldest row).
    Min,
    /// Start at W = 0 and let the hole rule deal with a purged prefix.
    Zero,
    /// Skip the visible stock: W = MAX(id).
    Max,
    /// Start right after this id.
    Id(i64),
}

impl CutoverMode {
    /// Parses the config value; empty means "no seeding".
    pub fn parse(raw: &str) -> Result<Option<Self>, String> {
        let raw = raw.trim();
        Ok(Some(match raw.to_ascii_lowercase().as_str() {
            "" => return Ok(None),
            "min" => Self::Min,
            "zero" => Self::Zero,
            "max" => Self::Max,
            other => match other.parse::<i64>() {
                Ok(id) if id >= 0 => Self::Id(id),
                _ => {
                    return Err(format!(
                        "`{raw}` is not `min`, `zero`, `max` or a non-negative id"
                    ))
                }
            },
        }))
    }

    /// The watermark to seed, given the inbox's current id range (None = empty inbox).
    pub fn watermark(self, range: Option<(i64, i64)>) -> i64 {
        match (self, range) {
            (Self::Zero, _) => 0,
            (Self::Id(id), _) => id,
            (Self::Min, Some((min, _))) => min.saturating_sub(1).max(0),
            (Self::Max, Some((_, max))) => max,
            (Self::Min | Self::Max, None) => 0,
        }
    }
}

/// Builds a [`StockSpan`] from the stock ids read in ascending pages. Every id from the first
/// row to W without a row is a gap: between rows, and after the last one (`<id>` beyond the
/// inbox head). Ids below the first row are not gaps of the span (not counted as stock
/// gaps), but the seeding watches them as one released hole all the same
/// (`Store::seed_cutover`): a row in flight there at the cutover is processed
/// as LATE.
#[derive(Debug, Clone, Default)]
pub struct StockScan {
    first: Option<i64>,
    prev: i64,
    rows: i64,
    gaps: Vec<(i64, i64)>,
    /// Sum of the ids (wrapping): with `rows` and the last id, the [`expect::StockToken`].
    sum: u64,
}

impl StockScan {
    /// Feeds the next ascending id (each at most once).
    pub fn push(&mut self, id: i64) {
        if self.first.is_none() {
            self.first = Some(id);
        } else if id > self.prev + 1 {
            self.gaps.push((self.prev + 1, id - 1));
        }
        self.prev = id;
        self.rows += 1;
        self.sum = self.sum.wrapping_add(id as u64);
    }

    /// The token of the stock seen so far at or below `w` (see [`expect::StockToken`]).
    pub fn token(&self, w: i64) -> expect::StockToken {
        expect::StockToken::of(w, self.rows, self.first.map(|_| self.prev), self.sum)
    }

    /// The span `first..=w` for a seeded `w` (every id pushed must be `<= w`); None when no
    /// row was seen.
    pub fn finish(mut self, w: i64) -> Option<StockSpan> {
        let first = self.first?;
        if w > self.prev {
            self.gaps.push((self.prev + 1, w));
        }
        Some(StockSpan {
            first,
            last: w,
            rows: self.rows,
            gaps: self.gaps,
        })
    }
}

impl fmt::Display for CutoverMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Min => f.write_str("min"),
            Self::Zero => f.write_str("zero"),
            Self::Max => f.write_str("max"),
            Self::Id(id) => write!(f, "{id}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_all_modes() {
        assert_eq!(CutoverMode::parse(""), Ok(None));
        assert_eq!(CutoverMode::parse(" MIN "), Ok(Some(CutoverMode::Min)));
        assert_eq!(CutoverMode::parse("zero"), Ok(Some(CutoverMode::Zero)));
        assert_eq!(CutoverMode::parse("max"), Ok(Some(CutoverMode::Max)));
        assert_eq!(CutoverMode::parse("4711"), Ok(Some(CutoverMode::Id(4711))));
        assert!(CutoverMode::parse("-3").is_err());
        assert!(CutoverMode::parse("latest").is_err());
    }

    #[test]
    fn the_stock_is_what_was_visible_and_the_gaps_are_not() {
        let mut scan = StockScan::default();
        for id in [5, 6, 9, 10, 14] {
            scan.push(id);
        }
        let span = scan.finish(16).expect("rows");
        assert_eq!((span.first, span.last, span.rows), (5, 16, 5));
        assert_eq!(span.gaps, vec![(7, 8), (11, 13), (15, 16)]);
        assert_eq!(span.gap_ids(), 7);
        let skipped: Vec<i64> = (0..20).filter(|i| span.skips(*i)).collect();
        assert_eq!(skipped, vec![5, 6, 9, 10, 14]);
        assert!(
            StockScan::default().finish(10).is_none(),
            "no stock, nothing skipped"
        );
    }

    #[test]
    fn watermark_per_mode() {
        let r = Some((1000, 2000));
        assert_eq!(CutoverMode::Min.watermark(r), 999);
        assert_eq!(CutoverMode::Zero.watermark(r), 0);
        assert_eq!(CutoverMode::Max.watermark(r), 2000);
        assert_eq!(CutoverMode::Id(1500).watermark(r), 1500);
        assert_eq!(CutoverMode::Min.watermark(None), 0);
        assert_eq!(CutoverMode::Max.watermark(None), 0);
    }
}
