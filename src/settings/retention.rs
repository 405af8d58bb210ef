//! `[retention]`: how long our own records are kept (seed §8, SPEC §10, issue 13 item 5) and
//! how the housekeeping job that enforces it paces itself; and how long raw text stays
//! available for a replay (seed §5.2, §6, §9, §12 G10; Q6/Q7/Q9): the DB owner's retention of
//! marked inbox rows (`r_keep`), and our own compressed copy of each message's raw text
//! (`raw_copy`, kept for `replay_window`). Every key is a humantime duration (or a count or a
//! flag), validated at start with one line naming the key.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{check_nonzero, duration, invalid, SettingsError};

/// Retention of PROC_STATE, SCHD_SNAP_LOG, MSG_EVENT, AUDIT_LOG, LATE_WATCH and the raw-text
/// copies, the pace of the housekeeping actor that applies it, and the owner's retention.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionSettings {
    /// Turns the housekeeping actor on (false: nothing is archived or deleted).
    pub enabled: bool,
    /// A terminal PROC_STATE row that is marked moves to PROC_STATE_HST this long after it
    /// became terminal (and once it has no events or schedule snapshot left).
    #[serde(with = "duration")]
    pub proc_state: Duration,
    /// A terminal row whose marking was abandoned (MISSING_ROW / MAX_ATTEMPTS) moves this long
    /// after it was abandoned (and `proc_state` after it became terminal): the time an
    /// operator has to recover it (`recover-backfill`).
    #[serde(with = "duration")]
    pub abandoned_grace: Duration,
    /// SCHD_SNAP_LOG rows (applied schedules) are deleted this long after they were applied
    /// (the seed: 90 days).
    #[serde(with = "duration")]
    pub schd_snap_log: Duration,
    /// SENT events are deleted this long after the broker acknowledged them. PENDING and DEAD
    /// events are never deleted; FLIGHT_DELETED events are kept (the late guard's tombstones).
    #[serde(with = "duration")]
    pub msg_event_sent: Duration,
    /// Audit rows (operator actions) are deleted this long after the action.
    #[serde(with = "duration")]
    pub audit_log: Duration,
    /// Detected late arrivals (`late_watch`) are deleted this long after detection, and watch
    /// ranges this long after their window closed (the detector closes them at
    /// `late.watch_window` already; this catches ranges it never got to).
    #[serde(with = "duration")]
    pub late_watch: Duration,
    /// How often a housekeeping job starts (after the previous one finished).
    #[serde(with = "duration")]
    pub period: Duration,
    /// Rows per batch (one transaction each).
    pub batch: u32,
    /// Pause between two batches: the job yields the store to the pump and the sweeper.
    #[serde(with = "duration")]
    pub batch_pause: Duration,
    /// A job stops after this many batches (the rest waits for the next period).
    pub max_batches: u32,
    /// R_keep: how long the DB owner keeps an inbox row after it was marked, before purging
    /// it (Q6/Q7/Q9; the owner's number, not ours). `backfill.overdue_after` (R) must not
    /// exceed it (seed §5.2: `R ≤ R_keep`, so a row whose mark keeps failing is retried before
    /// the owner's retention runs out).
    #[serde(with = "duration")]
    pub r_keep: Duration,
    /// Keep our own compressed copy of each message's raw text, written in the business
    /// transaction that records its outcome; a replay falls back to it once the inbox row is
    /// purged (G10: needed where the owner purges on marking).
    pub raw_copy: bool,
    /// How long a copy is kept after the pump last wrote it; older copies are deleted in
    /// batches (`store::raw_copy::purge_expired_raw_copies`).
    #[serde(with = "duration")]
    pub replay_window: Duration,
    /// Whether the housekeeper runs `VACUUM (ANALYZE)` / `ANALYZE` on our own tables itself:
    /// `auto` only where the server's autovacuum does not cover them (`autovacuum = off`, or a
    /// table with `autovacuum_enabled = false`), `always`, or `off`. Without either, every
    /// update of a million-row backlog leaves a dead version that the pump and the dispatcher
    /// walk ever after (docs/performance.md).
    pub vacuum: VacuumMode,
    /// How often the housekeeper reads the tables' dead-tuple counts (`pg_stat_user_tables`)
    /// and vacuums the ones past the threshold.
    #[serde(with = "duration")]
    pub vacuum_check: Duration,
    /// A table is vacuumed once its dead tuples exceed
    /// `vacuum_threshold + vacuum_scale_factor × live tuples` (PostgreSQL's own rule), and
    /// analyzed alone once as many rows changed since its last analyze.
    pub vacuum_threshold: u32,
    /// See `vacuum_threshold`.
    pub vacuum_scale_factor: f64,
}

/// `retention.vacuum`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum VacuumMode {
    /// Only the tables the server's autovacuum does not cover.
    Auto,
    /// Every table past the threshold, whatever the server does.
    Always,
    /// Never (the DBA vacuums).
    Off,
}

impl RetentionSettings {
    /// The durations that must be longer than zero, with their keys.
    fn nonzero_durations(&self) -> [(&'static str, Duration); 10] {
        [
            ("retention.proc_state", self.proc_state),
            ("retention.abandoned_grace", self.abandoned_grace),
            ("retention.schd_snap_log", self.schd_snap_log),
            ("retention.msg_event_sent", self.msg_event_sent),
            ("retention.audit_log", self.audit_log),
            ("retention.late_watch", self.late_watch),
            ("retention.period", self.period),
            ("retention.r_keep", self.r_keep),
            ("retention.replay_window", self.replay_window),
            ("retention.vacuum_check", self.vacuum_check),
        ]
    }

    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        for (key, d) in self.nonzero_durations() {
            check_nonzero(d, key)?;
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
        if self.vacuum_check < Duration::from_secs(1)
            || self.vacuum_check > Duration::from_secs(86_400)
        {
            return Err(invalid(
                "retention.vacuum_check",
                format!(
                    "{} is outside 1s..=1d",
                    humantime::format_duration(self.vacuum_check)
                ),
            ));
        }
        if !(0.0..=10.0).contains(&self.vacuum_scale_factor) {
            return Err(invalid(
                "retention.vacuum_scale_factor",
                format!("{} is outside 0..=10", self.vacuum_scale_factor),
            ));
        }
        Ok(())
    }
}
