//! The service's life before and after the pipeline: waiting for the store at start-up (one
//! clear line per attempt, `/readyz` 503, never a crash loop), standing by for the lease (hot
//! standby), and the graceful shutdown after SIGTERM/SIGINT.

use std::future::Future;
use std::time::{Duration, Instant};

use actix::Addr;
use anyhow::Context as _;
use msgx_core::settings::{redact_url, Settings};
use msgx_core::store::{InstanceLock, LeaseConfig, SchemaState, Store, StoreError};
use msgx_core::telemetry;

use crate::health::Health;
use crate::messages::ShutdownPipeline;
use crate::supervisor::Supervisor;

/// Longest pause between two lease attempts of a standby.
const STANDBY_RETRY: Duration = Duration::from_millis(250);

/// First pause between two start-up connection attempts (doubling from there).
const CONNECT_RETRY_MIN: Duration = Duration::from_secs(1);

/// Longest pause between two start-up connection attempts.
const CONNECT_RETRY_MAX: Duration = Duration::from_secs(30);

/// The lease timing from the settings.
pub fn lease_config(settings: &Settings) -> LeaseConfig {
    LeaseConfig {
        ttl: settings.lease.ttl,
        check_timeout: settings.lease.check_timeout,
    }
}

/// Opens the store without migrating an older schema (only the lease holder does: see
/// [`Store::connect_unmigrated`]), retrying while it is unreachable. Configuration errors (a
/// bad URL), schema refusals and failed migrations stop at once. `None` when `stop` fired
/// first.
pub async fn connect_store(
    settings: &Settings,
    health: &Health,
    stop: &mut (impl Future<Output = ()> + Unpin),
) -> anyhow::Result<Option<(Store, SchemaState)>> {
    let mut attempt = 0i32;
    loop {
        attempt = attempt.saturating_add(1);
        let wait = msgx_core::backoff::doubling(attempt, CONNECT_RETRY_MIN, CONNECT_RETRY_MAX);
        match Store::connect_unmigrated(&settings.store).await {
            Ok(connected) => return Ok(Some(connected)),
            Err(StoreError::Db(e)) => {
                tracing::warn!(
                    attempt,
                    store = %redact_url(&settings.store.connect.url),
                    error = %e,
                    retry_in_s = wait.as_secs(),
                    "store unreachable at start-up; retrying"
                );
                health.waiting(Some(
                    "store unreachable at start-up; retrying (the service log has the cause)"
                        .into(),
                ));
            }
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "cannot open the store at {}",
                        redact_url(&settings.store.connect.url)
                    )
                })
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = &mut *stop => return Ok(None),
        }
    }
}

/// With `late.hole_evidence` on, waits until `inbox.url` reaches a writable primary
/// (evidence read from a replica would release holes whose rows are still coming). A
/// read-only server, a replica or an unreachable one is what a failover looks like for a
/// while: each check that finds one is a WARN line and `msgx_inbox_not_primary_total`,
/// `/readyz` says so, and the check is repeated (doubling up to 30 s) — not an exit 2, which
/// the unit would never restart (`RestartPreventExitStatus=2`). `false` when `stop` fired
/// first.
pub async fn wait_for_primary(
    inbox: &msgx_core::inbox::Inbox,
    health: &Health,
    stop: &mut (impl Future<Output = ()> + Unpin),
) -> bool {
    use msgx_core::inbox::primary::PrimaryError;
    let mut attempt = 0i32;
    loop {
        attempt = attempt.saturating_add(1);
        let wait = msgx_core::backoff::doubling(attempt, CONNECT_RETRY_MIN, CONNECT_RETRY_MAX);
        let public = match inbox.check_primary().await {
            Ok(_) => {
                telemetry::inbox_primary_found();
                return true;
            }
            Err(e @ PrimaryError::NotPrimary(what)) => {
                let why = if what.starts_with("a replica") {
                    "replica"
                } else {
                    "read_only"
                };
                telemetry::inbox_not_primary(why, &e, attempt, wait);
                "the inbox server is not a writable primary"
            }
            Err(e @ PrimaryError::Inbox(_)) => {
                telemetry::inbox_not_primary("unreachable", &e, attempt, wait);
                "the inbox server is unreachable"
            }
        };
        health.waiting(Some(format!(
            "waiting for the inbox's primary (late.hole_evidence): {public}; retrying (the \
             service log has the cause)"
        )));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = &mut *stop => return false,
        }
    }
}

/// Takes the lease, standing by while another instance holds it (`lease.standby`), or giving
/// up after `store.instance_lock_wait` without standby. `schema` is the store's schema as
/// connected: `/readyz` says when this standby waits to migrate it. `None` when `stop` fired
/// first.
pub async fn acquire_lease(
    settings: &Settings,
    store: &Store,
    schema: &SchemaState,
    health: &Health,
    stop: &mut (impl Future<Output = ()> + Unpin),
) -> anyhow::Result<Option<InstanceLock>> {
    let cfg = lease_config(settings);
    let started = Instant::now();
    let mut announced = false;
    loop {
        match InstanceLock::acquire_with(store, cfg).await {
            Ok(lock) => {
                health.waiting(None);
                return Ok(Some(lock));
            }
            Err(StoreError::InstanceLocked) => {
                if !settings.lease.standby && started.elapsed() >= settings.store.instance_lock_wait
                {
                    return Err(StoreError::InstanceLocked)
                        .context("no standby (lease.standby = false)");
                }
                telemetry::lease_standby(announced);
                announced = true;
                health.lease(false);
                health.waiting(Some(format!(
                    "standing by: another instance holds the lease{}",
                    schema_wait(schema)
                )));
            }
            Err(StoreError::LeaseTampered(why)) => {
                telemetry::lease_tampered(&why);
                health.waiting(Some(
                    "refusing to act: the lease row was edited by hand (the service log has \
                     what)"
                        .into(),
                ));
                if !settings.lease.standby {
                    return Err(StoreError::LeaseTampered(why).into());
                }
            }
            Err(e @ (StoreError::Db(_) | StoreError::LeaseTimeout(_))) => {
                tracing::warn!(error = %e, "store unreachable while waiting for the lease; retrying");
                health.waiting(Some(
                    "waiting for the lease: the store is unreachable (the service log has the \
                     cause)"
                        .into(),
                ));
            }
            Err(e) => return Err(e.into()),
        }
        // Often: a crashed predecessor's session may take a moment to disappear.
        let retry = settings.lease.renew_every.min(STANDBY_RETRY);
        tokio::select! {
            _ = tokio::time::sleep(retry) => {}
            _ = &mut *stop => return Ok(None),
        }
    }
}

/// What a standby adds to its `/readyz` reason while the store's schema is older than its
/// own: it migrates only once it holds the lease.
fn schema_wait(schema: &SchemaState) -> String {
    match schema {
        SchemaState::Behind { store, binary, .. } => format!(
            "; the store's schema is at version {store}, this binary's {binary}: it migrates \
             once it holds the lease"
        ),
        _ => String::new(),
    }
}

/// SIGTERM/SIGINT: every actor stops taking work and finishes its step, the dispatcher
/// writes SENT for what was acknowledged, then the lease is released so a standby takes over
/// at once. Bounded by `supervisor.shutdown_grace`.
pub async fn graceful_shutdown(
    settings: &Settings,
    supervisor: &Addr<Supervisor>,
    lock: &InstanceLock,
    health: &Health,
) {
    let grace = settings.supervisor.shutdown_grace;
    let begun = Instant::now();
    let deadline = begun + grace;
    health.waiting(Some("shutting down".into()));
    tracing::info!(
        grace_s = grace.as_secs_f64(),
        "shutdown requested; stopping the pipeline"
    );
    match tokio::time::timeout(grace, supervisor.send(ShutdownPipeline { deadline })).await {
        Ok(Ok(report)) if report.unclean.is_empty() => {
            tracing::info!(stopped = ?report.stopped, "every actor stopped cleanly")
        }
        Ok(Ok(report)) => tracing::warn!(
            stopped = ?report.stopped, unclean = ?report.unclean,
            "some actors did not stop cleanly (their work rolls back and is redone)"
        ),
        Ok(Err(e)) => tracing::warn!(error = %e, "supervisor unavailable at shutdown"),
        Err(_) => tracing::warn!("shutdown grace elapsed with work in flight (it rolls back)"),
    }
    match lock.release().await {
        Ok(()) => telemetry::lease_standby(true),
        Err(e) => {
            tracing::warn!(error = %e, "could not release the lease; a standby takes it after lease.ttl")
        }
    }
    tracing::info!(
        took_ms = begun.elapsed().as_millis() as u64,
        "shutdown complete"
    );
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    /// `supervisor.shutdown_grace` of config/default.toml.
    fn default_grace() -> Duration {
        let defaults: toml::Value =
            toml::from_str(include_str!("../../config/default.toml")).expect("default.toml");
        let grace = defaults["supervisor"]["shutdown_grace"]
            .as_str()
            .expect("shutdown_grace");
        humantime::parse_duration(grace).expect("a duration")
    }

    /// The unit's `TimeoutStopSec` and compose's `stop_grace_period` leave the graceful
    /// shutdown its whole time: the pipeline's grace, then the bounded HTTP drain, then a
    /// margin (issue 30: Docker's default 10 s killed a 20 s grace half way).
    #[test]
    fn stop_timeouts_cover_the_grace_and_the_http_drain() {
        let needed = default_grace() + crate::http::HTTP_DRAIN + Duration::from_secs(5);
        let unit = include_str!("../../packaging/msgexchange.service");
        let timeout = unit
            .lines()
            .find_map(|l| l.strip_prefix("TimeoutStopSec="))
            .expect("TimeoutStopSec");
        let timeout = humantime::parse_duration(timeout.trim()).expect("a duration");
        assert!(timeout >= needed, "TimeoutStopSec={timeout:?} < {needed:?}");
        let compose: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(include_str!("../../docker-compose.yml")).expect("compose");
        let period = compose["services"]["msgexchange"]["stop_grace_period"]
            .as_str()
            .expect("stop_grace_period");
        let period = humantime::parse_duration(period).expect("a duration");
        assert!(
            period >= needed,
            "stop_grace_period {period:?} < {needed:?}"
        );
    }
}
