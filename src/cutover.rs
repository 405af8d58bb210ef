//! Cutover seeding (seed §5.1): an explicit, one-time choice of the starting watermark on a
//! fresh store. The code never picks one by default.

use std::fmt;

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
