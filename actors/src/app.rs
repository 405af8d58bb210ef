//! Wiring the service together: stores, cutover, the supervised actors, the HTTP surface, and
//! the process lifecycle (signals, fatal conditions).

mod pipeline;

use std::sync::Arc;

use actix::Addr;
use anyhow::Context as _;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use msgx_core::clock::{Clock, SharedClock, SystemClock};
use msgx_core::cutover::seed::Approval;
use msgx_core::cutover::CutoverMode;
use msgx_core::inbox::Inbox;
use msgx_core::kafka::{EmbeddedCluster, EventProducer};
use msgx_core::outbound::Outbound;
use msgx_core::settings::{redact_url, KafkaSettings, Settings};
use msgx_core::store::{InstanceLock, SchemaState, SeedOutcome, Store};
use msgx_core::telemetry;
use tokio::sync::mpsc;

use crate::health::Health;
use crate::supervisor::{Fatal, Supervisor};

pub use pipeline::{
    codec, pump_config, start_pipeline, DispatchDeps, HousekeepingDeps, PipelineDeps,
};

/// Opens the stores for an operator command and builds the inbox adapter. The store must exist
/// with this binary's schema: nothing is created or migrated ([`Store::open`]).
pub async fn connect(settings: &Settings) -> anyhow::Result<(Inbox, Store)> {
    let store = Store::open(&settings.store).await.with_context(|| {
        format!(
            "cannot open the store at {}",
            redact_url(&settings.store.connect.url)
        )
    })?;
    let inbox = Inbox::new(
        &settings.inbox,
        settings.inbox_names(),
        settings.inbox_timezone(),
    )?;
    Ok((inbox, store))
}

/// Applies `pipeline.cutover_watermark` if configured (fresh store only): W, the skipped stock
/// and its gaps (watched for `watch_window`, `late.watch_window`) in one transaction, with who
/// approved it and, if required, the approved plan (`pipeline.cutover_expect`, `cutover_by`,
/// `cutover_ticket`): refused with one line when the inbox cannot honour the mode or no longer
/// holds the approved stock.
pub async fn apply_cutover_approved(
    store: &Store,
    inbox: &Inbox,
    mode: Option<CutoverMode>,
    approval: &Approval,
    clock: &dyn Clock,
    watch_window: std::time::Duration,
) -> anyhow::Result<Option<SeedOutcome>> {
    let Some(mode) = mode else {
        return Ok(None);
    };
    let outcome =
        msgx_core::cutover::seed::seed(store, inbox, mode, approval, clock, watch_window).await?;
    Ok(Some(outcome))
}

/// `pipeline.cutover_expect`, `cutover_by` and `cutover_ticket` (validated).
pub fn cutover_approval(settings: &Settings) -> Approval {
    let p = &settings.pipeline;
    Approval {
        expect: settings.cutover_expect().cloned(),
        by: p.cutover_by.clone(),
        ticket: p.cutover_ticket.clone(),
    }
}

/// Installs the Prometheus recorder with our histogram buckets.
pub fn install_metrics() -> anyhow::Result<PrometheusHandle> {
    let mut builder = PrometheusBuilder::new();
    for (name, buckets) in telemetry::histogram_buckets() {
        builder = builder.set_buckets_for_metric(Matcher::Full(name.to_string()), &buckets)?;
    }
    let handle = builder.install_recorder()?;
    telemetry::register();
    Ok(handle)
}

/// Runs the service until SIGINT/SIGTERM or a fatal condition. `/readyz` answers from the
/// start (503 while the store is unreachable or this instance stands by for the lease).
pub async fn run_service(settings: Settings) -> anyhow::Result<()> {
    crate::first_start::require_brokers(&settings)?;
    let metrics = install_metrics()?;
    tracing::info!(
        inbox = %redact_url(&settings.inbox.connect.url),
        store = %redact_url(&settings.store.connect.url),
        table = %settings.inbox.table,
        "msgexchange starting"
    );
    for (key, why) in settings.unverified_tls() {
        tracing::warn!(
            key,
            "this connection does not verify its server over TLS: {why}"
        );
    }
    for (key, why) in settings.http.token_warnings() {
        tracing::warn!(key, "{why}");
    }
    let health = Health::default();
    health.lease(false);
    health.waiting(Some("starting".into()));
    let listen = settings.http.listen.parse()?;
    let early = serve_early(&settings, listen, &metrics, &health)?;
    let mut stop = Box::pin(shutdown_signal());
    let Some((store, inbox, lock)) = take_the_lease(&settings, &health, &mut stop).await? else {
        early.stop(true).await;
        return Ok(());
    };
    let clock: SharedClock = Arc::new(SystemClock);
    let cutover = settings.cutover();
    crate::first_start::require_cutover_choice(&store, &inbox, cutover)
        .await
        .context("checking whether the inbox holds history (first start on a fresh store)")?;
    crate::first_start::require_transactional_id(&store, &settings.kafka).await?;
    apply_cutover_approved(
        &store,
        &inbox,
        cutover,
        &cutover_approval(&settings),
        clock.as_ref(),
        settings.late.watch_window,
    )
    .await?;
    let outbound = Outbound::from_settings(&settings, &store, &inbox)?;
    // Kept alive for the whole run: dropping it stops the embedded brokers.
    let (_embedded, bootstrap) = kafka_bootstrap(&settings.kafka)?;
    // Fail fast on a producer configuration librdkafka refuses (the supervisor would only
    // retry it forever).
    EventProducer::new(&settings.kafka, &bootstrap).context("kafka producer (section [kafka])")?;
    tracing::info!(brokers = %bootstrap, topic = %settings.kafka.topic, "delivering events to kafka");

    let (fatal_tx, fatal_rx) = mpsc::unbounded_channel();
    let admin_ops = msgx_core::ops::Ops::new(&settings, store.clone(), inbox.clone());
    let (admin_clock, verify_inbox) = (clock.clone(), inbox.clone());
    let supervisor = start_pipeline(PipelineDeps {
        health: health.clone(),
        lock: Some(lock.clone()),
        dispatch: Some(DispatchDeps::new(&settings, &bootstrap)),
        outbound: Some(outbound),
        housekeeping: HousekeepingDeps::from_settings(&settings),
        ..PipelineDeps::from_settings(&settings, inbox, store, clock, fatal_tx)?
    });
    let admin = crate::admin::AdminState::from_settings(&settings, admin_ops, admin_clock);
    early.stop(true).await;
    let server = serve(&settings, listen, metrics, &health, admin, verify_inbox)?;
    health.waiting(None);
    tracing::info!(%listen, "serving /metrics, /healthz, /readyz");

    let result = run_until_stopped(&settings, stop, fatal_rx, &supervisor, &lock, &health).await;
    server.stop(true).await;
    result
}

/// Until the pipeline runs: `/metrics`, `/healthz` and `/readyz`; a configured admin surface
/// answers 503 with the reason (starting, standing by) instead of looking absent.
fn serve_early(
    settings: &Settings,
    listen: std::net::SocketAddr,
    metrics: &PrometheusHandle,
    health: &Health,
) -> anyhow::Result<actix_web::dev::ServerHandle> {
    let admin_configured = !crate::auth::Tokens::from_settings(&settings.http).is_empty();
    let limits = crate::http::Limits::from_settings(&settings.http);
    let early = crate::http::serve_early(
        listen,
        metrics.clone(),
        health.clone(),
        admin_configured,
        limits,
    );
    spawn_server(listen, early)
}

/// Runs a bound HTTP server beside the service; its handle stops it.
fn spawn_server(
    listen: std::net::SocketAddr,
    bound: std::io::Result<actix_web::dev::Server>,
) -> anyhow::Result<actix_web::dev::ServerHandle> {
    let server = bound.with_context(|| format!("cannot listen on {listen} (http.listen)"))?;
    let handle = server.handle();
    actix_rt::spawn(server);
    Ok(handle)
}

/// Connects the stores and takes the lease; from then on the store is fenced with the
/// lease's epoch. `None` when `stop` fired first.
async fn take_the_lease(
    settings: &Settings,
    health: &Health,
    stop: &mut (impl std::future::Future<Output = ()> + Unpin),
) -> anyhow::Result<Option<(Store, Inbox, InstanceLock)>> {
    let Some((store, schema)) = crate::lifecycle::connect_store(settings, health, stop).await?
    else {
        return Ok(None);
    };
    let inbox = Inbox::new(
        &settings.inbox,
        settings.inbox_names(),
        settings.inbox_timezone(),
    )?;
    if settings.late.hole_evidence
        && !crate::lifecycle::wait_for_primary(&inbox, health, stop).await
    {
        return Ok(None);
    }
    if let SchemaState::Behind {
        store: at, binary, ..
    } = &schema
    {
        tracing::warn!(
            store_schema = *at,
            binary_schema = *binary,
            "the store's schema is older than this binary's: it is migrated only once this \
             instance holds the lease (an older instance holding it keeps running on its schema)"
        );
    }
    let lease = crate::lifecycle::acquire_lease(settings, &store, &schema, health, stop).await?;
    let Some(lock) = lease else {
        return Ok(None);
    };
    if let SchemaState::Behind { pending, .. } = &schema {
        // The lease is ours: no older instance runs any more (its writes are fenced).
        store
            .migrate_held()
            .await
            .context("migrating the store after taking the lease")?;
        tracing::info!(applied = ?pending, "store schema migrated by the lease holder");
    }
    // From here on every write carries this instance's epoch: once a newer instance takes the
    // lock, our writes fail instead of racing it (migration 0006).
    let store = store
        .fenced(lock.epoch())
        .await
        .context("reconnecting the store with the lease epoch")?;
    telemetry::lease_held(lock.epoch());
    health.lease(true);
    Ok(Some((store, inbox, lock)))
}

/// The HTTP surface of the running service: metrics, health, and the admin surface (with
/// `/admin/verify`) when tokens are configured.
fn serve(
    settings: &Settings,
    listen: std::net::SocketAddr,
    metrics: PrometheusHandle,
    health: &Health,
    admin: Option<crate::admin::AdminState>,
    verify_inbox: Inbox,
) -> anyhow::Result<actix_web::dev::ServerHandle> {
    if admin.is_some() {
        tracing::info!("admin surface enabled under /admin/ and /cminmsgs/send (bearer tokens)");
    }
    let verify = match &admin {
        Some(a) => Some(crate::verify_cmd::input(
            settings,
            verify_inbox,
            a.store.clone(),
            5000,
            None,
        )?),
        None => None,
    };
    let limits = crate::http::Limits::from_settings(&settings.http);
    let server =
        crate::http::serve_with_verify(listen, metrics, health.clone(), admin, verify, limits);
    spawn_server(listen, server)
}

/// Waits for SIGINT/SIGTERM (graceful shutdown: `Ok`) or a fatal condition (its error; after
/// exceeding the restart intensity the lease is released first, so a standby takes over at
/// once instead of after `lease.ttl`).
async fn run_until_stopped(
    settings: &Settings,
    stop: impl std::future::Future<Output = ()>,
    mut fatal_rx: mpsc::UnboundedReceiver<Fatal>,
    supervisor: &Addr<Supervisor>,
    lock: &InstanceLock,
    health: &Health,
) -> anyhow::Result<()> {
    tokio::select! {
        _ = stop => {
            crate::lifecycle::graceful_shutdown(settings, supervisor, lock, health).await;
            Ok(())
        }
        Some(fatal) = fatal_rx.recv() => {
            match &fatal {
                Fatal::LockLost(why) => telemetry::lease_lost(why),
                Fatal::LeaseTampered(why) => telemetry::lease_tampered(why),
                Fatal::RestartIntensity { .. } => {
                    if let Err(e) = lock.release().await {
                        tracing::warn!(error = %e, "could not release the lease");
                    }
                }
            }
            Err(anyhow::anyhow!("{fatal}"))
        }
    }
}

/// The broker list: the configured one, or a freshly started embedded mock cluster (returned
/// so the caller keeps it alive).
pub fn kafka_bootstrap(k: &KafkaSettings) -> anyhow::Result<(Option<EmbeddedCluster>, String)> {
    if k.is_embedded() {
        let cluster = EmbeddedCluster::start(1, &[&k.topic, &k.dlq_topic])
            .context("kafka.brokers = embedded")?;
        let bootstrap = cluster.bootstrap().to_string();
        Ok((Some(cluster), bootstrap))
    } else {
        Ok((None, k.brokers.trim().to_string()))
    }
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
