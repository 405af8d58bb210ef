//! The supervised pipeline: what its actors need ([`PipelineDeps`], [`DispatchDeps`],
//! [`HousekeepingDeps`]), the pump's and the codec's configuration, and one factory per child
//! of the actor table, each building its actor from its core step's config. Separate from
//! `app.rs` (the process: stores, cutover, metrics, lease, HTTP, signals) because tests and the
//! bench start the pipeline without the rest of the process.

use std::sync::Arc;

use actix::{Actor, Addr};
use msgx_core::backfill::SweepConfig;
use msgx_core::clock::SharedClock;
use msgx_core::codec::xml::XmlCodec;
use msgx_core::codec::Codec;
use msgx_core::dispatch::{DispatchConfig, RetryRules};
use msgx_core::inbox::Inbox;
use msgx_core::kafka::EventProducer;
use msgx_core::late::DetectConfig;
use msgx_core::outbound::Outbound;
use msgx_core::poller::PollConfig;
use msgx_core::pump::{HeadRules, PumpConfig, PumpCore};
use msgx_core::settings::{
    KafkaSettings, LateSettings, PipelineSettings, ProcessingSettings, RetentionSettings, Settings,
};
use msgx_core::store::{InstanceLock, Store};
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
                open_txn_wait: k.open_transaction_wait,
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
            missing_row_grace: p.missing_row_grace,
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
                false => d.at_least_once(x.kafka.clone(), x.bootstrap.clone()),
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
