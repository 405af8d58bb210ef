//! MySQL DATETIME carries no zone: the inbox writes airport local time (config, default
//! Asia/Shanghai). We convert explicitly and store `timestamptz` (seed §6, SPEC §10).

use chrono::{DateTime, NaiveDateTime, TimeZone, Utc};
use chrono_tz::Tz;

/// Parses `YYYY-MM-DD HH:MM:SS[.ffffff]` in `tz`; None for zero dates and anything else.
pub fn local_to_utc(raw: &str, tz: Tz) -> Option<DateTime<Utc>> {
    let naive = NaiveDateTime::parse_from_str(raw.trim(), "%Y-%m-%d %H:%M:%S%.f").ok()?;
    let local = tz.from_local_datetime(&naive);
    // Ambiguous (DST fold) → the earlier instant; a skipped local time has no instant.
    local.earliest().map(|t| t.with_timezone(&Utc))
}

/// The inverse, for writers acting as upstream (dev tools, tests): UTC → local DATETIME text.
pub fn utc_to_local(t: DateTime<Utc>, tz: Tz) -> NaiveDateTime {
    t.with_timezone(&tz).naive_local()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shanghai_local_becomes_utc() {
        let tz: Tz = "Asia/Shanghai".parse().expect("zone");
        let t = local_to_utc("2026-11-30 09:30:00", tz).expect("parses");
        assert_eq!(t.to_rfc3339(), "2026-11-30T01:30:00+00:00");
        let t = local_to_utc("2026-11-30 09:30:00.250000", tz).expect("fraction");
        assert_eq!(t.timestamp_subsec_millis(), 250);
        assert_eq!(utc_to_local(t, tz).to_string(), "2026-11-30 09:30:00.250");
    }

    #[test]
    fn zero_and_garbage_dates_are_none() {
        let tz: Tz = "Asia/Shanghai".parse().expect("zone");
        assert_eq!(local_to_utc("0000-00-00 00:00:00", tz), None);
        assert_eq!(local_to_utc("yesterday", tz), None);
        assert_eq!(local_to_utc("", tz), None);
    }
}
