//! `[lease]` (the single-instance lease and the hot standby) and `[supervisor]` (restart
//! intensity, graceful shutdown).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{check_nonzero, duration, invalid, SettingsError};

/// The single-instance lease (SPEC §8): a row in `instance_lease` with an expiry, renewed by
/// the holder; a standby takes it over once it expired or the holder's session is gone.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseSettings {
    /// How long a lease lives without renewal: a frozen holder is taken over after this.
    #[serde(with = "duration")]
    pub ttl: Duration,
    /// How often the holder renews (and a standby retries). Well below `ttl`.
    #[serde(with = "duration")]
    pub renew_every: Duration,
    /// One renewal may take this long before it counts as failed.
    #[serde(with = "duration")]
    pub check_timeout: Duration,
    /// true: a second instance waits for the lease (hot standby, `/readyz` false);
    /// false: it gives up after `store.instance_lock_wait` and exits non-zero.
    pub standby: bool,
}

/// The supervisor's limits.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SupervisorSettings {
    /// More than this many child restarts within `restart_window` stop the service (OTP
    /// restart intensity): a crash loop is an operator's problem, not a retry's.
    pub max_restarts: u32,
    /// The window of `max_restarts`.
    #[serde(with = "duration")]
    pub restart_window: Duration,
    /// SIGTERM/SIGINT: the actors finish their step, the dispatcher writes SENT for what was
    /// acknowledged, the lease is released, within this time.
    #[serde(with = "duration")]
    pub shutdown_grace: Duration,
}

impl LeaseSettings {
    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        check_nonzero(self.ttl, "lease.ttl")?;
        check_nonzero(self.renew_every, "lease.renew_every")?;
        check_nonzero(self.check_timeout, "lease.check_timeout")?;
        if self.ttl > Duration::from_secs(600) {
            return Err(invalid("lease.ttl", "longer than 10m"));
        }
        if self.renew_every.saturating_mul(2) > self.ttl {
            return Err(invalid(
                "lease.renew_every",
                "more than half of lease.ttl (one late renewal would lose the lease)",
            ));
        }
        if self.check_timeout >= self.ttl {
            return Err(invalid("lease.check_timeout", "not shorter than lease.ttl"));
        }
        Ok(())
    }
}

impl SupervisorSettings {
    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        if self.max_restarts == 0 || self.max_restarts > 10_000 {
            return Err(invalid("supervisor.max_restarts", "outside 1..=10000"));
        }
        check_nonzero(self.restart_window, "supervisor.restart_window")?;
        check_nonzero(self.shutdown_grace, "supervisor.shutdown_grace")?;
        if self.shutdown_grace > Duration::from_secs(600) {
            return Err(invalid("supervisor.shutdown_grace", "longer than 10m"));
        }
        Ok(())
    }
}
