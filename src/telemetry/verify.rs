//! Result of the `verify` command (issue 11), per invariant.

use metrics::gauge;

use super::Def;

/// Violations found by the last `verify` run, by `invariant` (one of [`INVARIANTS`]).
pub const VERIFY_VIOLATIONS: &str = "msgx_verify_violations";

/// Every invariant `verify` checks (`Finding::invariant`).
pub const INVARIANTS: &[&str] = &[
    "inbox_covered",
    "terminal_marked",
    "mark_value",
    "inbox_row_present",
    "fifo",
    "mark_only_terminal",
    "identity_unique",
    "events_delivered",
    "fenced_writes",
    "kafka_readback",
];

/// The series of this file.
pub(super) fn defs() -> Vec<Def> {
    vec![Def::gauge(
        VERIFY_VIOLATIONS,
        "rows",
        "Violations per invariant found by the last verify run; NaN until verify runs in this process",
    )
    .label("invariant", INVARIANTS)]
}

/// One invariant's violation count from `verify`.
pub fn verify_result(invariant: &'static str, violations: u64) {
    gauge!(VERIFY_VIOLATIONS, "invariant" => invariant).set(violations as f64);
}
