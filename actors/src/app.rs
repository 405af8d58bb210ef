//! Wiring the service together: stores, cutover, the supervised actors, the HTTP surface, and
//! the process lifecycle (signals, fatal conditions).

use std::sync::Arc;

use actix::{Actor, Addr};
use anyhow::Context as _;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use msgx_core::backfill::SweepConfig;
use msgx_core::clock::{Clock, SharedClock, SystemClock};
use msgx_core::codec::xml::XmlCodec;
use msgx_core::codec::Codec;
use msgx_core::cutover::seed::Approval;
use msgx_core::cutover::CutoverMode;
use msgx_core::dispatch::{DispatchConfig, RetryRules};
use msgx_core::inbox::Inbox;
use msgx_core::kafka::{EmbeddedCluster, EventProducer};
use msgx_core::late::DetectConfig;
use msgx_core::outbound::Outbound;
use msgx_core::poller::PollConfig;
use msgx_core::pump::{HeadRules, PumpConfig, PumpCore};
use msgx_core::settings::{
    redact_url, KafkaSettings, LateSettings, PipelineSettings, ProcessingSettings,
    RetentionSettings, Settings,
};
use msgx_core::store::{InstanceLock, SchemaState, SeedOutcome, Store};
use msgx_core::telemetry;
use tokio::sync::mpsc;

use crate::backfill_sweeper::BackfillSweeper;
use crate::child::Child;
use crate::dispatcher::Dispatcher;
use crate::health::Health;
use crate::housekeeper::Housekeeper;
use crate::inbox_poller::InboxPoller;
use crate::late_detector::LateDetector;
use crate::pump::Pump;
use crate::purge_watch::PurgeWatch;
use crate::schedule_requester::{ScheduleRequester, DEFAULT_CHECK_EVERY};
use crate::supervisor::{ChildFactory, Fatal, Supervisor};
use crate::wiring::Wiring;

/// What the actors need.
pub struct PipelineDeps {
    /// Shared inbox adapter.
    pub inbox: Inbox,
    /// Own PostgreSQL.
    pub store: Store,
    /// Time source for every deadline.
    pub clock: SharedClock,
    /// Discovery knobs.
    pub pipeline: PipelineSettings,
    /// Processing knobs.
    pub processing: ProcessingSettings,
    /// Raw-text retention (the pump writes our raw copy when `raw_copy` is on).
    pub retention: RetentionSettings,
    /// Airport zone.
    pub tz: chrono_tz::Tz,
    /// Late detection knobs.
    pub late: LateSettings,
    /// Backfill (marking) knobs and the inbox mark columns.
    pub backfill: SweepConfig,
    /// Sweep schedule.
    pub backfill_period: std::time::Duration,
    /// The detector's inbox check (names, batch, timeout).
    pub late_check: DetectConfig,
    /// Readiness facts.
    pub health: Health,
    /// Receivers (tests add their own).
    pub wiring: Wiring,
    /// The single-instance lock, kept and watched by the supervisor.
    pub lock: Option<InstanceLock>,
    /// Fatal conditions go here.
    pub fatal: mpsc::UnboundedSender<Fatal>,
    /// Event delivery; None runs the pipeline without a dispatcher (events stay PENDING).
    pub dispatch: Option<DispatchDeps>,
    /// The daily schedule request (schedule requester); None runs without it.
    pub outbound: Option<Outbound>,
    /// The supervisor's restart limit (`[supervisor]`).
    pub intensity: crate::supervisor::Intensity,
    /// How often the supervisor renews the lease (`lease.renew_every`).
    pub lease_every: std::time::Duration,
    /// Retention (the housekeeper); None runs without it.
    pub housekeeping: Option<HousekeepingDeps>,
}

/// What the housekeeper needs (`[retention]`).
#[derive(Debug, Clone)]
pub struct HousekeepingDeps {
    /// Retention periods and pace.
    pub cfg: msgx_core::retention::RetentionConfig,
    /// `retention.period`.
    pub period: std::time::Duration,
    /// `retention.vacuum*`.
    pub vacuum: msgx_core::retention::VacuumPolicy,
    /// `retention.vacuum_check`.
    pub vacuum_check: std::time::Duration,
}

impl HousekeepingDeps {
    /// From the settings; None when `retention.enabled` is false.
    pub fn from_settings(settings: &Settings) -> Option<Self> {
        let r = &settings.retention;
        r.enabled.then(|| Self {
            cfg: msgx_core::retention::RetentionConfig::from_settings(r),
            period: r.period,
            vacuum: msgx_core::retention::VacuumPolicy::from_settings(r),
            vacuum_check: r.vacuum_check,
        })
    }
}

impl PipelineDeps {
    /// The deps every pipeline has, from the settings: no lock, no dispatcher, no outbound
    /// requester, no housekeeper, fresh health and wiring (the service sets those it runs; tests keep them off).
    pub fn from_settings(
        settings: &Settings,
        inbox: Inbox,
        store: Store,
        clock: SharedClock,
        fatal: mpsc::UnboundedSender<Fatal>,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            inbox,
            store,
            clock,
            pipeline: settings.pipeline.clone(),
            processing: settings.processing.clone(),
            retention: settings.retention.clone(),
            tz: settings.inbox_timezone(),
            late: settings.late.clone(),
            late_check: DetectConfig::from_settings(settings),
            backfill: SweepConfig::new(&settings.backfill, settings.inbox_names()),
            backfill_period: settings.backfill.period,
            health: Health::default(),
            wiring: Wiring::default(),
            lock: None,
            fatal,
            dispatch: None,
            outbound: None,
            intensity: crate::supervisor::Intensity {
                max_restarts: settings.supervisor.max_restarts,
                window: settings.supervisor.restart_window,
            },
            lease_every: settings.lease.renew_every,
            housekeeping: None,
        })
    }
}

/// What the dispatcher needs.
#[derive(Clone)]
pub struct DispatchDeps {
    /// Producer settings.
    pub kafka: KafkaSettings,
    /// Broker list (the embedded cluster's when `kafka.brokers = embedded`).
    pub bootstrap: String,
    /// Topics, batch, retry policy.
    pub cfg: DispatchConfig,
    /// Safety-net period.
    pub idle_poll: std::time::Duration,
}

impl DispatchDeps {
    /// From the settings, with `bootstrap` as the broker list.
    pub fn new(settings: &Settings, bootstrap: &str) -> Self {
        let (k, d) = (&settings.kafka, &settings.dispatch);
        Self {
            kafka: k.clone(),
            bootstrap: bootstrap.to_string(),
            cfg: DispatchConfig {
                topic: k.topic.clone(),
                dlq_topic: k.dlq_topic.clone(),
                ce_source: k.ce_source.clone(),
                batch: d.batch,
                retry: RetryRules {
                    retry_initial: d.retry_initial,
                    retry_max: d.retry_max,
                    max_attempts: d.max_attempts,
                },
                txn_timeout: k.transaction_timeout,
                scan_floor_every: d.scan_floor_every,
            },
            idle_poll: d.idle_poll,
        }
    }
}

/// The pump knobs from the settings.
pub fn pump_config(
    p: &ProcessingSettings,
    retention: &RetentionSettings,
    tz: chrono_tz::Tz,
) -> PumpConfig {
    PumpConfig {
        rules: HeadRules {
            head_deadline: p.head_deadline,
            max_attempts: p.max_attempts,
            retry_initial: p.retry_initial,
            retry_max: p.retry_max,
        },
        max_message_bytes: p.max_message_bytes,
        identity_with_date: p.identity_with_date,
        tz,
        read_ahead: p.read_ahead,
        group_max: p.group_max,
        group_max_wait: p.group_max_wait,
        raw_copy: retention.raw_copy,
    }
}

/// The codec from the settings.
pub fn codec(p: &ProcessingSettings, tz: chrono_tz::Tz) -> Arc<dyn Codec> {
    let max = usize::try_from(p.max_message_bytes).unwrap_or(usize::MAX);
    Arc::new(XmlCodec::new(tz, max, p.flop_subtype_list()))
}

/// Starts the supervisor and its children (inside an actix system): every child of
/// [`Child::ALL`] the deps provide, in that order.
pub fn start_pipeline(deps: PipelineDeps) -> Addr<Supervisor> {
    let children = Child::ALL
        .iter()
        .copied()
        .filter_map(|child| factory(child, &deps))
        .collect();
    let PipelineDeps {
        wiring,
        lock,
        fatal,
        health,
        intensity,
        lease_every,
        ..
    } = deps;
    Supervisor::new(wiring, children, lock, fatal)
        .with_health(health)
        .with_intensity(intensity)
        .with_lease_every(lease_every)
        .start()
}

/// The actor table: how each child is built from the deps, with what it receives besides
/// `Shutdown`. `None` for the children the deps leave out (no dispatcher, schedule requester or
/// housekeeper).
fn factory(child: Child, d: &PipelineDeps) -> Option<ChildFactory> {
    let factory = match child {
        Child::LateDetector => late_detector(d),
        Child::BackfillSweeper => backfill_sweeper(d),
        Child::Dispatcher => dispatcher(d, d.dispatch.clone()?),
        Child::ScheduleRequester => schedule_requester(d, d.outbound.clone()?),
        Child::PurgeWatch => purge_watch(d),
        Child::Housekeeper => housekeeper(d, d.housekeeping.clone()?),
        Child::Pump => pump(d),
        Child::InboxPoller => inbox_poller(d),
    };
    debug_assert_eq!(
        factory.name,
        child.name(),
        "{child:?} built from another actor"
    );
    Some(factory)
}

/// Wakes on `HolesReleased`.
fn late_detector(d: &PipelineDeps) -> ChildFactory {
    let (inbox, store, clock) = (d.inbox.clone(), d.store.clone(), d.clock.clone());
    let (check, period) = (d.late_check.clone(), d.late.detect_period);
    ChildFactory::of(
        move |_| {
            let (i, s, c) = (inbox.clone(), store.clone(), clock.clone());
            Some(LateDetector::new(i, s, c, check.clone(), period))
        },
        |r, addr| r.holes = vec![addr.clone().recipient()],
    )
}

/// Wakes on `TerminalCommitted`; tells of `MarksConfirmed`.
fn backfill_sweeper(d: &PipelineDeps) -> ChildFactory {
    let (inbox, store, clock) = (d.inbox.clone(), d.store.clone(), d.clock.clone());
    let (cfg, period) = (d.backfill.clone(), d.backfill_period);
    ChildFactory::of(
        move |wiring| {
            let (i, s, c) = (inbox.clone(), store.clone(), clock.clone());
            let sweeper = BackfillSweeper::new(i, s, c, cfg.clone(), period);
            Some(sweeper.with_wiring(wiring.clone()))
        },
        |r, addr| r.terminal = vec![addr.clone().recipient()],
    )
}

/// Wakes on `EventsQueued`. A producer librdkafka refuses leaves it down (the supervisor
/// retries with its backoff).
fn dispatcher(d: &PipelineDeps, x: DispatchDeps) -> ChildFactory {
    let (store, clock, lock) = (d.store.clone(), d.clock.clone(), d.lock.clone());
    ChildFactory::of(
        move |_| {
            let producer = EventProducer::new(&x.kafka, &x.bootstrap)
                .map_err(|e| tracing::error!(error = %e, "cannot create the kafka producer"))
                .ok()?;
            let (s, c) = (store.clone(), clock.clone());
            let d = Dispatcher::new(s, c, producer, x.cfg.clone(), x.idle_poll);
            Some(match x.kafka.exactly_once() {
                true => d.exactly_once(x.kafka.clone(), x.bootstrap.clone(), lock.clone()),
                false => d,
            })
        },
        |r, addr| r.events = vec![addr.clone().recipient()],
    )
}

/// Receives nothing but `Shutdown`.
fn schedule_requester(d: &PipelineDeps, outbound: Outbound) -> ChildFactory {
    let clock = d.clock.clone();
    ChildFactory::of(
        move |_| {
            let (o, c) = (outbound.clone(), clock.clone());
            Some(ScheduleRequester::new(o, c, DEFAULT_CHECK_EVERY))
        },
        |_, _| {},
    )
}

/// Wakes on `MarksConfirmed`.
fn purge_watch(d: &PipelineDeps) -> ChildFactory {
    let (inbox, store, period) = (d.inbox.clone(), d.store.clone(), d.backfill_period);
    ChildFactory::of(
        move |_| Some(PurgeWatch::new(inbox.clone(), store.clone(), period)),
        |r, addr| r.confirmed = vec![addr.clone().recipient()],
    )
}

/// Takes `HousekeepNow` from tests and tools.
fn housekeeper(d: &PipelineDeps, h: HousekeepingDeps) -> ChildFactory {
    let (store, clock) = (d.store.clone(), d.clock.clone());
    ChildFactory::of(
        move |_| {
            let keeper = Housekeeper::new(store.clone(), clock.clone(), h.cfg.clone(), h.period);
            Some(keeper.with_vacuum(h.vacuum, h.vacuum_check))
        },
        |r, addr| r.housekeeper = Some(addr.clone().recipient()),
    )
}

/// Wakes on `WatermarkMoved` (beside the watermark receivers tests add); takes `Step` from
/// tests.
fn pump(d: &PipelineDeps) -> ChildFactory {
    let (inbox, store, clock) = (d.inbox.clone(), d.store.clone(), d.clock.clone());
    let codec = codec(&d.processing, d.tz);
    let cfg = pump_config(&d.processing, &d.retention, d.tz);
    let (idle, drain_window) = (d.processing.idle_poll, d.processing.drain_rate_window);
    ChildFactory::of(
        move |wiring| {
            let (i, s, c) = (inbox.clone(), store.clone(), clock.clone());
            let core = PumpCore::new(i, s, codec.clone(), c.clone(), cfg);
            let pump = Pump::new(core, c, idle, wiring.clone());
            Some(pump.with_drain_window(drain_window))
        },
        |r, addr| {
            r.pump = Some(addr.clone().recipient());
            r.watermark.retain(|w| w.connected());
            r.watermark.push(addr.clone().recipient());
        },
    )
}

/// Takes `PollNow` from tests; reports to `/readyz`.
fn inbox_poller(d: &PipelineDeps) -> ChildFactory {
    let cfg = PollConfig::from_settings(&d.pipeline, &d.late);
    let (inbox, store, clock) = (d.inbox.clone(), d.store.clone(), d.clock.clone());
    let (interval, health) = (d.pipeline.poll_interval, d.health.clone());
    ChildFactory::of(
        move |wiring| {
            let (i, s, c) = (inbox.clone(), store.clone(), clock.clone());
            let (w, h) = (wiring.clone(), health.clone());
            Some(InboxPoller::new(i, s, c, cfg, interval, w, h))
        },
        |r, addr| r.poller = Some(addr.clone().recipient()),
    )
}

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
    let early = crate::http::serve_early(listen, metrics.clone(), health.clone(), admin_configured);
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
    if settings.late.hole_evidence {
        // Evidence read from a replica would release holes whose rows are still coming.
        inbox.check_primary().await?;
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
    let server = crate::http::serve_with_verify(listen, metrics, health.clone(), admin, verify);
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
