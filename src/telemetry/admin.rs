//! Operator action metrics (replays through the admin surface or the CLI).

use metrics::counter;

use super::Def;

/// Operator replays by result (`applied`, `refused`).
pub const REPLAY_TOTAL: &str = "msgx_admin_replay_total";

/// `result` of [`REPLAY_TOTAL`].
pub const REPLAY_RESULTS: &[&str] = &["applied", "refused"];

/// The series of this file.
pub(super) fn defs() -> Vec<Def> {
    vec![
        Def::counter(REPLAY_TOTAL, "replays", "Operator replays by result")
            .label("result", REPLAY_RESULTS),
    ]
}

/// An operator replay was applied or refused.
pub fn replay(msg_id: i64, applied: bool, reason: &str) {
    let result = if applied { "applied" } else { "refused" };
    counter!(REPLAY_TOTAL, "result" => result).increment(1);
    tracing::warn!(msg_id, result, reason, "operator replay");
}
