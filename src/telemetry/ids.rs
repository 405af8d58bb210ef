//! Id lists for people (log lines and reports): a log line or report names a count and a few ranges, never every id
//! (a cutover or a rotation can concern a hundred thousand rows).

use std::fmt;

/// Most ranges written out; the rest are counted.
pub const SHOWN_RANGES: usize = 5;

/// `ids` (any order, duplicates allowed) as ascending inclusive ranges.
pub fn ranges(ids: &[i64]) -> Vec<(i64, i64)> {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out: Vec<(i64, i64)> = Vec::new();
    for id in sorted {
        match out.last_mut() {
            Some(last) if last.1 + 1 == id => last.1 = id,
            _ => out.push((id, id)),
        }
    }
    out
}

/// Displays as `3 ids in 2 ranges: 4-5, 9` — at most [`SHOWN_RANGES`] ranges, then
/// `… (+N ranges)`.
#[derive(Debug, Clone, Copy)]
pub struct IdSummary<'a>(pub &'a [i64]);

impl fmt::Display for IdSummary<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_ranges(f, self.0.len() as u64, &ranges(self.0))
    }
}

/// Displays ranges already built: `N ids in K ranges: a-b, c, …`.
#[derive(Debug, Clone, Copy)]
pub struct RangeSummary<'a>(pub &'a [(i64, i64)]);

impl fmt::Display for RangeSummary<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = self.0.iter().map(|(a, b)| (b - a + 1).max(0) as u64).sum();
        write_ranges(f, count, self.0)
    }
}

/// Displays the ranges alone: `a-b, c, …` — at most [`SHOWN_RANGES`], then `… (+N ranges)`.
#[derive(Debug, Clone, Copy)]
pub struct RangeList<'a>(pub &'a [(i64, i64)]);

impl fmt::Display for RangeList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        list(f, self.0)
    }
}

fn write_ranges(f: &mut fmt::Formatter<'_>, count: u64, ranges: &[(i64, i64)]) -> fmt::Result {
    let noun = if count == 1 { "id" } else { "ids" };
    write!(f, "{count} {noun}")?;
    if ranges.is_empty() {
        return Ok(());
    }
    if ranges.len() > 1 {
        write!(f, " in {} ranges", ranges.len())?;
    }
    f.write_str(": ")?;
    list(f, ranges)
}

fn list(f: &mut fmt::Formatter<'_>, ranges: &[(i64, i64)]) -> fmt::Result {
    for (i, (a, b)) in ranges.iter().take(SHOWN_RANGES).enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        if a == b {
            write!(f, "{a}")?;
        } else {
            write!(f, "{a}-{b}")?;
        }
    }
    if ranges.len() > SHOWN_RANGES {
        write!(f, ", … (+{} ranges)", ranges.len() - SHOWN_RANGES)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_list_is_a_count_and_a_few_ranges() {
        let many: Vec<i64> = (1..=100_000).filter(|i| i % 1000 != 0).collect();
        let line = IdSummary(&many).to_string();
        assert!(
            line.starts_with("99900 ids in 100 ranges: 1-999, 1001-1999"),
            "{line}"
        );
        assert!(line.ends_with("… (+95 ranges)"), "{line}");
        assert!(line.len() < 120, "bounded: {line}");
        assert_eq!(
            IdSummary(&[9, 4, 5, 5]).to_string(),
            "4 ids in 2 ranges: 4-5, 9"
        );
        assert_eq!(IdSummary(&[7]).to_string(), "1 id: 7");
        assert_eq!(IdSummary(&[]).to_string(), "0 ids");
        assert_eq!(
            RangeSummary(&[(3, 5), (8, 8)]).to_string(),
            "4 ids in 2 ranges: 3-5, 8"
        );
    }
}
