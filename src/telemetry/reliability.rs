//! Supervisor, lease and verification metrics (issue 11), each next to its log line.

use metrics::{counter, describe_counter, describe_gauge, gauge};

/// Child restarts within `supervisor.restart_window` (the restart intensity's count).
pub const SUPERVISOR_RESTARTS_IN_WINDOW: &str = "msgx_supervisor_restarts_in_window";
/// 1 once the supervisor gave up (restart intensity exceeded; the process exits).
pub const SUPERVISOR_GAVE_UP: &str = "msgx_supervisor_gave_up";
/// Lease renewals that failed (the lease stays ours until a whole ttl passes without one).
pub const LEASE_RENEW_FAILURES_TOTAL: &str = "msgx_instance_lease_renew_failures_total";
/// 1 while the lease row was found edited by hand (refusing to act).
pub const LEASE_TAMPERED: &str = "msgx_instance_lease_tampered";
/// Violations found by the last `verify` run, by `invariant`.
pub const VERIFY_VIOLATIONS: &str = "msgx_verify_violations";

/// HELP lines.
pub fn describe() {
    describe_gauge!(
        SUPERVISOR_RESTARTS_IN_WINDOW,
        "Child restarts within supervisor.restart_window"
    );
    describe_gauge!(
        SUPERVISOR_GAVE_UP,
        "1 once the restart intensity was exceeded and the service stops"
    );
    describe_counter!(
        LEASE_RENEW_FAILURES_TOTAL,
        "Failed renewals of the single-instance lease"
    );
    describe_gauge!(
        LEASE_TAMPERED,
        "1 while the instance_lease row was changed outside msgexchange"
    );
    describe_gauge!(
        VERIFY_VIOLATIONS,
        "Violations per invariant found by the last verify run"
    );
}

/// The restart intensity's current count.
pub fn restarts_in_window(n: usize) {
    gauge!(SUPERVISOR_RESTARTS_IN_WINDOW).set(n as f64);
}

/// The supervisor gives up: the service stops non-zero.
pub fn supervisor_gave_up(why: &str) {
    gauge!(SUPERVISOR_GAVE_UP).set(1.0);
    tracing::error!(
        why,
        alert = true,
        "supervisor gave up; stopping the service"
    );
}

/// One renewal failed (transient).
pub fn lease_renew_failed(why: &str) {
    counter!(LEASE_RENEW_FAILURES_TOTAL).increment(1);
    tracing::warn!(why, "instance lease renewal failed; retrying");
}

/// The lease row makes no sense: refuse to act.
pub fn lease_tampered(why: &str) {
    gauge!(LEASE_TAMPERED).set(1.0);
    tracing::error!(
        why,
        alert = true,
        "instance lease row edited by hand; refusing to act"
    );
}

/// Standing by: another instance holds the lease.
pub fn lease_standby(holder_known: bool) {
    gauge!(super::INSTANCE_LEASE_HELD).set(0.0);
    gauge!(LEASE_TAMPERED).set(0.0);
    if !holder_known {
        tracing::info!("standing by: another instance holds the lease; waiting to take over");
    }
}

/// One invariant's violation count from `verify`.
pub fn verify_result(invariant: &'static str, violations: u64) {
    gauge!(VERIFY_VIOLATIONS, "invariant" => invariant).set(violations as f64);
}
