//! Durations in the configuration: humantime text (`"5m"`, `"30s"`, `"1h 30m"`), bounded by
//! [`MAX_DURATION`] where they are parsed. Every duration field is declared
//! `#[serde(with = "duration")]`, and a `std::time::Duration` without it cannot be loaded from
//! TOML text at all, so no duration reaches the service unbounded: no value can overflow a time
//! computation later (`late.watch_window = "300000y"` once overflowed chrono on every hole
//! release). `config` appends `for key `section.key`` to the error, so it names the key.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

/// No duration in the configuration may exceed this (ten years): anything longer is a typo.
pub const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// A configured duration: parsed from humantime text and at most [`MAX_DURATION`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct BoundedDuration(Duration);

impl BoundedDuration {
    /// Parses humantime text; the error says what was wrong with the value.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let d = humantime::parse_duration(raw.trim())
            .map_err(|e| format!("`{raw}` is not a duration like \"5m\" or \"30s\" ({e})"))?;
        if d > MAX_DURATION {
            return Err(format!(
                "{} is longer than the upper bound of 10 years",
                humantime::format_duration(d)
            ));
        }
        Ok(Self(d))
    }

    /// The duration.
    pub fn get(self) -> Duration {
        self.0
    }
}

impl<'de> Deserialize<'de> for BoundedDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        Self::parse(&raw).map_err(serde::de::Error::custom)
    }
}

/// `#[serde(with = "duration")]` for a `std::time::Duration` field: read through
/// [`BoundedDuration`], written back as compact humantime text (`"30d"`, `"1h 30m"`).
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    BoundedDuration::deserialize(d).map(BoundedDuration::get)
}

/// See [`deserialize`].
pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&compact(*d))
}

/// `d` as humantime text in days, hours, minutes, seconds and sub-seconds (`"30d"`, not
/// humantime's `"30days"`; months and years are avoided, their lengths are averages).
pub fn compact(d: Duration) -> String {
    let secs = d.as_secs();
    let nanos = u64::from(d.subsec_nanos());
    let parts = [
        (secs / 86_400, "d"),
        (secs / 3600 % 24, "h"),
        (secs / 60 % 60, "m"),
        (secs % 60, "s"),
        (nanos / 1_000_000, "ms"),
        (nanos / 1000 % 1000, "us"),
        (nanos % 1000, "ns"),
    ];
    let text: Vec<String> = parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect();
    if text.is_empty() {
        "0s".into()
    } else {
        text.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_is_part_of_parsing() {
        assert_eq!(
            BoundedDuration::parse("5m").map(BoundedDuration::get),
            Ok(Duration::from_secs(300))
        );
        assert!(BoundedDuration::parse("3650d").is_ok(), "ten years is fine");
        let e = BoundedDuration::parse("11y").expect_err("above the bound");
        assert!(e.contains("upper bound of 10 years"), "{e}");
        let e = BoundedDuration::parse("soon").expect_err("not a duration");
        assert!(e.contains("`soon`"), "{e}");
    }

    #[test]
    fn compact_text_parses_back_to_the_same_duration() {
        for (d, text) in [
            (Duration::ZERO, "0s"),
            (Duration::from_millis(200), "200ms"),
            (Duration::from_secs(300), "5m"),
            (Duration::from_secs(5400), "1h 30m"),
            (Duration::from_secs(60 * 86_400), "60d"),
            (Duration::new(90_061, 1_001_001), "1d 1h 1m 1s 1ms 1us 1ns"),
        ] {
            assert_eq!(compact(d), text);
            assert_eq!(humantime::parse_duration(text), Ok(d), "{text}");
        }
    }
}
