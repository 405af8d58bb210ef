//! `[retention]`: how long raw text stays available for a replay (seed §5.2, §6, §9, §12 G10;
//! Q6/Q7/Q9): the DB owner's retention of marked inbox rows (`r_keep`), and our own
//! compressed copy of each message's raw text (`raw_copy`, kept for `replay_window`).

use std::time::Duration;

use serde::Deserialize;

use super::{check_nonzero, humantime_serde_compat, invalid, Settings, SettingsError};

/// Raw-text retention.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionSettings {
    /// R_keep: how long the DB owner keeps an inbox row after it was marked, before purging
    /// it (Q6/Q7/Q9; the owner's number, not ours). `backfill.overdue_after` (R) must not
    /// exceed it (seed §5.2: `R ≤ R_keep`, so a row whose mark keeps failing is retried before
    /// the owner's retention runs out).
    #[serde(with = "humantime_serde_compat")]
    pub r_keep: Duration,
    /// Keep our own compressed copy of each message's raw text, written in the business
    /// transaction that records its outcome; a replay falls back to it once the inbox row is
    /// purged (G10: needed where the owner purges on marking).
    pub raw_copy: bool,
    /// How long a copy is kept after the pump last wrote it; older copies are deleted in
    /// batches (`store::raw_copy::purge_expired_raw_copies`).
    #[serde(with = "humantime_serde_compat")]
    pub replay_window: Duration,
}

impl RetentionSettings {
    /// The duration keys with their values (for the 10-year bound).
    pub(super) fn durations(&self) -> [(&'static str, Duration); 2] {
        [
            ("retention.r_keep", self.r_keep),
            ("retention.replay_window", self.replay_window),
        ]
    }
}

/// `R ≤ R_keep` and a usable replay window.
pub(super) fn validate(s: &Settings) -> Result<(), SettingsError> {
    let r = &s.retention;
    check_nonzero(r.r_keep, "retention.r_keep")?;
    check_nonzero(r.replay_window, "retention.replay_window")?;
    let overdue = s.backfill.overdue_after;
    if overdue > r.r_keep {
        return Err(invalid(
            "backfill.overdue_after",
            format!(
                "R = {} exceeds retention.r_keep = {} (the DB owner's retention of marked rows, \
                 Q6/Q7): R must be at most R_keep (seed §5.2), else a row whose mark keeps \
                 failing is force-retried only after the owner's retention ran out; lower \
                 backfill.overdue_after or confirm a longer retention with the DB owner",
                humantime::format_duration(overdue),
                humantime::format_duration(r.r_keep)
            ),
        ));
    }
    Ok(())
}
