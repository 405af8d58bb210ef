//! `[outbound]`: our requests to upstream through the shared outbound table (`COUTMSGS`,
//! seed §7, SPEC §7/§12) — the columns we write, who we are, and the daily schedule request.

use chrono::NaiveTime;
use serde::{Deserialize, Serialize};

use super::{invalid, SettingsError};

/// The outbound path.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OutboundSettings {
    /// Auto-increment id column of `inbox.out_table` (read: floor and look-up; never written).
    pub id_column: String,
    /// Creation-time column (DATETIME, airport local time): ours to write.
    pub created_column: String,
    /// Message text column (LONGTEXT): ours to write.
    pub message_column: String,
    /// Our sender name in `META/SNDR` (and the prefix of every `RQID`).
    pub sender: String,
    /// `META/RCVR` of our requests.
    pub receiver: String,
    /// Local airport time (`inbox.timezone`) of the daily schedule request, `HH:MM`; "" = off.
    pub schedule_request_at: String,
}

impl OutboundSettings {
    /// Checks names, sender/receiver and the daily time.
    pub fn validate(&self) -> Result<(), SettingsError> {
        check_name(&self.sender, "outbound.sender")?;
        check_name(&self.receiver, "outbound.receiver")?;
        self.schedule_time()?;
        Ok(())
    }

    /// The daily request time, `None` when off.
    pub fn schedule_time(&self) -> Result<Option<NaiveTime>, SettingsError> {
        parse_daily_time(&self.schedule_request_at)
            .map_err(|reason| invalid("outbound.schedule_request_at", reason))
    }
}

/// `HH:MM` (24 h) or "" (off).
pub fn parse_daily_time(raw: &str) -> Result<Option<NaiveTime>, String> {
    let raw = raw.trim();
    if raw.is_empty() {
        return Ok(None);
    }
    let ok_shape = raw.len() == 5 && raw.as_bytes().get(2) == Some(&b':');
    match NaiveTime::parse_from_str(raw, "%H:%M") {
        Ok(t) if ok_shape => Ok(Some(t)),
        _ => Err(format!(
            "`{raw}` is not a local time HH:MM (00:00..23:59), or \"\" for off"
        )),
    }
}

/// Sender/receiver names go into XML and into a `LIKE` pattern: letters and digits only.
fn check_name(v: &str, key: &'static str) -> Result<(), SettingsError> {
    if v.is_empty() || v.len() > 16 || !v.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(invalid(
            key,
            format!("`{v}` must be 1..=16 ASCII letters or digits"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daily_time_is_hh_mm_or_off() {
        assert_eq!(parse_daily_time(""), Ok(None));
        assert_eq!(parse_daily_time("  "), Ok(None));
        assert_eq!(
            parse_daily_time("02:30"),
            Ok(NaiveTime::from_hms_opt(2, 30, 0))
        );
        assert_eq!(
            parse_daily_time("23:59"),
            Ok(NaiveTime::from_hms_opt(23, 59, 0))
        );
        for bad in [
            "24:00",
            "2:30",
            "02:60",
            "0230",
            "02:30:00",
            "half past two",
            "-1:00",
        ] {
            assert!(parse_daily_time(bad).is_err(), "{bad}");
        }
    }
}
