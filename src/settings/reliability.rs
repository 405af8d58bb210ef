//! `[lease]` (the single-instance lease and the hot standby) and `[supervisor]` (restart
//! intensity, graceful shutdown), plus the upper bound every duration of the configuration is
//! held to: no value can overflow a time computation later (`late.watch_window = "300000y"`
//! once overflowed chrono on every hole release).

use std::time::Duration;

use serde::Deserialize;

use super::{check_nonzero, humantime_serde_compat, invalid, Settings, SettingsError};

/// The single-instance lease (SPEC §8): a row in `instance_lease` with an expiry, renewed by
/// the holder; a standby takes it over once it expired or the holder's session is gone.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseSettings {
    /// How long a lease lives without renewal: a frozen holder is taken over after this.
    #[serde(with = "humantime_serde_compat")]
    pub ttl: Duration,
    /// How often the holder renews (and a standby retries). Well below `ttl`.
    #[serde(with = "humantime_serde_compat")]
    pub renew_every: Duration,
    /// One renewal may take this long before it counts as failed.
    #[serde(with = "humantime_serde_compat")]
    pub check_timeout: Duration,
    /// true: a second instance waits for the lease (hot standby, `/readyz` false);
    /// false: it gives up after `store.instance_lock_wait` and exits non-zero.
    pub standby: bool,
}

/// The supervisor's limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SupervisorSettings {
    /// More than this many child restarts within `restart_window` stop the service (OTP
    /// restart intensity): a crash loop is an operator's problem, not a retry's.
    pub max_restarts: u32,
    /// The window of `max_restarts`.
    #[serde(with = "humantime_serde_compat")]
    pub restart_window: Duration,
    /// SIGTERM/SIGINT: the actors finish their step, the dispatcher writes SENT for what was
    /// acknowledged, the lease is released, within this time.
    #[serde(with = "humantime_serde_compat")]
    pub shutdown_grace: Duration,
}

/// How much shorter than `store.idle_in_transaction_timeout` the backfill's
/// `backfill.mark_budget` must be: time for the inbox COMMIT of the last marks and the
/// sweep's write-back after the budget is spent, before PostgreSQL could end the sweep's
/// transaction — and its row locks (G5) — for idleness.
pub const MARK_MARGIN: Duration = Duration::from_secs(2);

/// No duration in the configuration may exceed this (ten years): anything longer is a typo.
pub const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

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

/// Every duration key with its value (one list, so none escapes the bound).
fn durations(s: &Settings) -> Vec<(&'static str, Duration)> {
    let mut all = vec![
        ("inbox.connect_timeout", s.inbox.connect_timeout),
        ("inbox.query_timeout", s.inbox.query_timeout),
        ("inbox.read_timeout", s.inbox.read_timeout),
        ("inbox.write_timeout", s.inbox.write_timeout),
        ("store.connect_timeout", s.store.connect_timeout),
        ("store.instance_lock_wait", s.store.instance_lock_wait),
        ("store.statement_timeout", s.store.statement_timeout),
        ("store.lock_timeout", s.store.lock_timeout),
        (
            "store.idle_in_transaction_timeout",
            s.store.idle_in_transaction_timeout,
        ),
        ("kafka.linger", s.kafka.linger),
        ("kafka.delivery_timeout", s.kafka.delivery_timeout),
        ("kafka.request_timeout", s.kafka.request_timeout),
        ("dispatch.idle_poll", s.dispatch.idle_poll),
        ("dispatch.retry_initial", s.dispatch.retry_initial),
        ("dispatch.retry_max", s.dispatch.retry_max),
        ("pipeline.poll_interval", s.pipeline.poll_interval),
        ("pipeline.min_poll_gap", s.pipeline.min_poll_gap),
        ("pipeline.max_commit_delay", s.pipeline.max_commit_delay),
        ("processing.head_deadline", s.processing.head_deadline),
        ("processing.retry_initial", s.processing.retry_initial),
        ("processing.retry_max", s.processing.retry_max),
        ("processing.idle_poll", s.processing.idle_poll),
        (
            "processing.drain_rate_window",
            s.processing.drain_rate_window,
        ),
        ("backfill.period", s.backfill.period),
        ("backfill.retry_initial", s.backfill.retry_initial),
        ("backfill.retry_max", s.backfill.retry_max),
        ("backfill.overdue_after", s.backfill.overdue_after),
        ("backfill.mark_budget", s.backfill.mark_budget),
        ("late.detect_period", s.late.detect_period),
        ("late.watch_window", s.late.watch_window),
        ("late.hole_evidence_cap", s.late.hole_evidence_cap),
        ("late.compensation_period", s.late.compensation_period),
        ("lease.ttl", s.lease.ttl),
        ("lease.renew_every", s.lease.renew_every),
        ("lease.check_timeout", s.lease.check_timeout),
        ("supervisor.restart_window", s.supervisor.restart_window),
        ("supervisor.shutdown_grace", s.supervisor.shutdown_grace),
    ];
    all.extend(s.retention.durations());
    all
}

/// Checks the reliability sections and the bound of every duration.
pub(super) fn validate(s: &Settings) -> Result<(), SettingsError> {
    for (key, d) in durations(s) {
        if d > MAX_DURATION {
            return Err(invalid(
                key,
                format!(
                    "{} is longer than the upper bound of 10 years",
                    humantime::format_duration(d)
                ),
            ));
        }
    }
    s.lease.validate()?;
    s.supervisor.validate()?;
    let st = &s.store;
    check_nonzero(st.statement_timeout, "store.statement_timeout")?;
    check_nonzero(st.lock_timeout, "store.lock_timeout")?;
    check_nonzero(
        st.idle_in_transaction_timeout,
        "store.idle_in_transaction_timeout",
    )?;
    if st.lock_timeout > st.statement_timeout {
        return Err(invalid(
            "store.lock_timeout",
            "longer than store.statement_timeout",
        ));
    }
    mark_budget(s)?;
    // MySQL takes these in whole seconds.
    for (key, d) in [
        ("inbox.read_timeout", s.inbox.read_timeout),
        ("inbox.write_timeout", s.inbox.write_timeout),
    ] {
        if d < Duration::from_secs(1) || d > Duration::from_secs(3600) {
            return Err(invalid(key, "outside 1s..=1h (MySQL counts whole seconds)"));
        }
    }
    Ok(())
}

/// The sweep writes inbox marks while it holds PostgreSQL row locks (G5): its inbox budget
/// must end before the server could end the sweep's transaction for idleness.
fn mark_budget(s: &Settings) -> Result<(), SettingsError> {
    let (budget, idle) = (s.backfill.mark_budget, s.store.idle_in_transaction_timeout);
    check_nonzero(budget, "backfill.mark_budget")?;
    if budget.saturating_add(MARK_MARGIN) > idle {
        return Err(invalid(
            "backfill.mark_budget",
            format!(
                "{} is not at least {} shorter than store.idle_in_transaction_timeout = {}: a \
                 backfill sweep holds its PostgreSQL row locks while it writes inbox marks, and \
                 the server ends a transaction idle that long; lower backfill.mark_budget or \
                 raise store.idle_in_transaction_timeout",
                humantime::format_duration(budget),
                humantime::format_duration(MARK_MARGIN),
                humantime::format_duration(idle)
            ),
        ));
    }
    Ok(())
}
