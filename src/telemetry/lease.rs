//! Single-instance lease metrics, each next to its log line.

use metrics::{counter, gauge};

use super::Def;

/// 1 while this instance holds the single-instance lease.
pub const INSTANCE_LEASE_HELD: &str = "msgx_instance_lease_held";
/// This instance's fencing epoch (bumped by every instance that takes the lease).
pub const INSTANCE_LEASE_EPOCH: &str = "msgx_instance_lease_epoch";
/// Lease renewals that failed (the lease stays ours until a whole ttl passes without one).
pub const LEASE_RENEW_FAILURES_TOTAL: &str = "msgx_instance_lease_renew_failures_total";
/// 1 while the lease row was found edited by hand (refusing to act).
pub const LEASE_TAMPERED: &str = "msgx_instance_lease_tampered";

/// The series of this file.
pub(super) fn defs() -> Vec<Def> {
    vec![
        Def::gauge(INSTANCE_LEASE_HELD, "1 = yes", "1 while this instance holds the single-instance lease (0 from start-up until it is taken)").starts_at(0.0),
        Def::gauge(INSTANCE_LEASE_EPOCH, "epoch", "Fencing epoch of this instance's lease; NaN until the lease is taken"),
        Def::counter(LEASE_RENEW_FAILURES_TOTAL, "renewals", "Failed renewals of the single-instance lease"),
        Def::gauge(LEASE_TAMPERED, "1 = yes", "1 while the instance_lease row was changed outside msgexchange").starts_at(0.0),
    ]
}

/// The lease was taken with this fencing epoch.
pub fn lease_held(epoch: i64) {
    gauge!(INSTANCE_LEASE_HELD).set(1.0);
    gauge!(INSTANCE_LEASE_EPOCH).set(epoch as f64);
}

/// The lease was lost (the process stops).
pub fn lease_lost(why: &str) {
    gauge!(INSTANCE_LEASE_HELD).set(0.0);
    tracing::error!(why, alert = true, "single-instance lease lost; stopping");
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
    gauge!(INSTANCE_LEASE_HELD).set(0.0);
    gauge!(LEASE_TAMPERED).set(0.0);
    if !holder_known {
        tracing::info!("standing by: another instance holds the lease; waiting to take over");
    }
}
