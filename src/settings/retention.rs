//! `[retention]`: how long our own records are kept (seed §8, SPEC §10, issue 13 item 5) and
//! how the housekeeping job that enforces it paces itself. Every key is a humantime duration
//! (or a count), validated at start with one line naming the key.

use std::time::Duration;

use serde::Deserialize;

use super::{check_nonzero, humantime_serde_compat, invalid, SettingsError};

/// Retention of PROC_STATE, SCHD_SNAP_LOG, MSG_EVENT, AUDIT_LOG and LATE_WATCH, and the pace
/// of the housekeeping actor that applies it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionSettings {
    /// Turns the housekeeping actor on (false: nothing is archived or deleted).
    pub enabled: bool,
    /// A terminal PROC_STATE row that is marked moves to PROC_STATE_HST this long after it
    /// became terminal (and once it has no events or schedule snapshot left).
    #[serde(with = "humantime_serde_compat")]
    pub proc_state: Duration,
    /// A terminal row whose marking was abandoned (MISSING_ROW / MAX_ATTEMPTS) moves this long
    /// after it was abandoned (and `proc_state` after it became terminal): the time an
    /// operator has to recover it (`recover-backfill`).
    #[serde(with = "humantime_serde_compat")]
    pub abandoned_grace: Duration,
    /// SCHD_SNAP_LOG rows (applied schedules) are deleted this long after they were applied
    /// (the seed: 90 days).
    #[serde(with = "humantime_serde_compat")]
    pub schd_snap_log: Duration,
    /// SENT events are deleted this long after the broker acknowledged them. PENDING and DEAD
    /// events are never deleted; FLIGHT_DELETED events are kept (the late guard's tombstones).
    #[serde(with = "humantime_serde_compat")]
    pub msg_event_sent: Duration,
    /// Audit rows (operator actions) are deleted this long after the action.
    #[serde(with = "humantime_serde_compat")]
    pub audit_log: Duration,
    /// Detected late arrivals (`late_watch`) are deleted this long after detection, and watch
    /// ranges this long after their window closed (the detector closes them at
    /// `late.watch_window` already; this catches ranges it never got to).
    #[serde(with = "humantime_serde_compat")]
    pub late_watch: Duration,
    /// How often a housekeeping job starts (after the previous one finished).
    #[serde(with = "humantime_serde_compat")]
    pub period: Duration,
    /// Rows per batch (one transaction each).
    pub batch: u32,
    /// Pause between two batches: the job yields the store to the pump and the sweeper.
    #[serde(with = "humantime_serde_compat")]
    pub batch_pause: Duration,
    /// A job stops after this many batches (the rest waits for the next period).
    pub max_batches: u32,
}

impl RetentionSettings {
    /// Every duration key with its value (for the common upper bound).
    pub fn durations(&self) -> Vec<(&'static str, Duration)> {
        vec![
            ("retention.proc_state", self.proc_state),
            ("retention.abandoned_grace", self.abandoned_grace),
            ("retention.schd_snap_log", self.schd_snap_log),
            ("retention.msg_event_sent", self.msg_event_sent),
            ("retention.audit_log", self.audit_log),
            ("retention.late_watch", self.late_watch),
            ("retention.period", self.period),
            ("retention.batch_pause", self.batch_pause),
        ]
    }

    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        for (key, d) in self.durations() {
            if key != "retention.batch_pause" {
                check_nonzero(d, key)?;
            }
        }
        if self.batch == 0 || self.batch > 50_000 {
            return Err(invalid(
                "retention.batch",
                format!("{} is outside 1..=50000", self.batch),
            ));
        }
        if self.max_batches == 0 {
            return Err(invalid("retention.max_batches", "must be at least 1"));
        }
        if self.batch_pause > Duration::from_secs(60) {
            return Err(invalid("retention.batch_pause", "longer than 1m"));
        }
        Ok(())
    }
}
