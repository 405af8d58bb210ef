//! The service's life before and after the pipeline: waiting for the store at start-up (one
//! clear line per attempt, `/readyz` 503, never a crash loop), standing by for the lease (hot
//! standby), and the graceful shutdown after SIGTERM/SIGINT.

use std::future::Future;
use std::time::{Duration, Instant};

use actix::Addr;
use anyhow::Context as _;
use msgx_core::settings::{redact_url, Settings};
use msgx_core::store::{InstanceLock, LeaseConfig, Store, StoreError};
use msgx_core::telemetry;

use crate::health::Health;
use crate::messages::ShutdownPipeline;
use crate::supervisor::Supervisor;

/// Longest pause between two lease attempts of a standby.
const STANDBY_RETRY: Duration = Duration::from_millis(250);

/// Longest pause between two start-up connection attempts.
const CONNECT_RETRY_MAX: Duration = Duration::from_secs(30);

/// The lease timing from the settings.
pub fn lease_config(settings: &Settings) -> LeaseConfig {
    LeaseConfig {
        ttl: settings.lease.ttl,
        check_timeout: settings.lease.check_timeout,
    }
}

/// Opens the store (migrating it), retrying while it is unreachable. Configuration errors (a
/// bad URL) and failed migrations stop at once. `None` when `stop` fired first.
pub async fn connect_store(
    settings: &Settings,
    health: &Health,
    stop: &mut (impl Future<Output = ()> + Unpin),
) -> anyhow::Result<Option<Store>> {
    let mut wait = Duration::from_secs(1);
    let mut attempt = 0u64;
    loop {
        attempt += 1;
        match Store::connect(&settings.store).await {
            Ok(store) => return Ok(Some(store)),
            Err(StoreError::Db(e)) => {
                let why = format!("store unreachable at start-up: {e}");
                tracing::warn!(
                    attempt,
                    store = %redact_url(&settings.store.url),
                    error = %e,
                    retry_in_s = wait.as_secs(),
                    "store unreachable at start-up; retrying"
                );
                health.waiting(Some(why));
            }
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "cannot open the store at {}",
                        redact_url(&settings.store.url)
                    )
                })
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = &mut *stop => return Ok(None),
        }
        wait = (wait * 2).min(CONNECT_RETRY_MAX);
    }
}

/// Takes the lease, standing by while another instance holds it (`lease.standby`), or giving
/// up after `store.instance_lock_wait` without standby. `None` when `stop` fired first.
pub async fn acquire_lease(
    settings: &Settings,
    store: &Store,
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
                health.waiting(Some("standing by: another instance holds the lease".into()));
            }
            Err(StoreError::LeaseTampered(why)) => {
                telemetry::lease_tampered(&why);
                health.waiting(Some(format!("refusing to act: {why}")));
                if !settings.lease.standby {
                    return Err(StoreError::LeaseTampered(why).into());
                }
            }
            Err(e @ (StoreError::Db(_) | StoreError::LeaseTimeout(_))) => {
                tracing::warn!(error = %e, "store unreachable while waiting for the lease; retrying");
                health.waiting(Some(format!("waiting for the lease: {e}")));
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
