//! `msgx-bench e2e`: the whole service drains an inbox backlog end to end — enqueue (poller),
//! process (pump, group commit), mark (backfill sweeper) and deliver (dispatcher, to the
//! configured Kafka: the embedded mock cluster when `kafka.brokers` is unset) — started exactly as `run_service`
//! starts the pipeline. Prints, per stage, the throughput of every tenth of the backlog (is it
//! flat?), the total time and the peak RSS of this process (the service and the bench share it),
//! and where the service's pump spent its time, by stage (its `msgx_pump_stage_seconds`, the
//! table `msgx-bench pump` prints for the pump alone);
//! then an idle phase (nothing arriving: the statements the service sends the inbox per second);
//! then, per steady offered rate (`--rates`, by default 100, 300, 1,000 msg/s, for `--steady`
//! each), where a message's time goes from its inbox commit to its Kafka ack and to its inbox
//! mark (`e2e/steady.rs`), and the inbox statements per second under that load, with a bare
//! produce probe against the same broker (its floor: send → ack of a plain producer with the
//! dispatcher's settings) beside the phase at 100 records/s (the same moments and host load)
//! and alone after it at the phase's rate. Not a timed test: it prints numbers.
//!
//! The backlog is the simulator's message mix (`Mix::default()`) without unknown types: an
//! UNSUPPORTED head blocks FIFO for its whole retry schedule (minutes, by design), which would
//! measure the retry policy, not the pipeline. Malformed messages stay in (DEAD at once).
//!
//! Inbox statements are counted by MariaDB for a user only the service's inbox pool uses
//! (`inbox_stats`). The service is stopped (graceful shutdown, as on SIGTERM) and its pools
//! closed before the databases are dropped, also after a failure.
//!
//! Fresh databases `msgx_bench_<pid>`, dropped at the end unless `--keep`.

mod cpu;
mod drain;
mod idle;
mod pump_stages;
mod rendered;
mod steady;
mod txn_probe;

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Addr;
use anyhow::Context as _;
use clap::Args;
use metrics_exporter_prometheus::PrometheusHandle;
use msgx_actors::app::{
    install_metrics, kafka_bootstrap, start_pipeline, DispatchDeps, HousekeepingDeps, PipelineDeps,
};
use msgx_actors::messages::ShutdownPipeline;
use msgx_actors::supervisor::Supervisor;
use msgx_core::clock::{SharedClock, SystemClock};
use msgx_core::devtools::messages::Mix;
use msgx_core::inbox::Inbox;
use msgx_core::kafka::EmbeddedCluster;
use msgx_core::settings::{redact_url, Settings};
use msgx_core::store::Store;

use super::databases::BenchDbs;
use super::inbox_stats::InboxStats;
use super::pump::load::load_messages;
use crate::percentile;
use drain::drain;
use idle::idle;
use steady::{steady, Offer};

/// End-to-end benchmark knobs.
#[derive(Debug, Args)]
pub struct E2eBenchArgs {
    /// Backlog size: messages in the inbox before the service starts.
    #[arg(long, default_value_t = 1_000_000)]
    pub messages: u64,
    /// Message generator seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Give up after this long.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30m")]
    pub timeout: Duration,
    /// Length of the idle phase after the drain (nothing arriving; inbox statements per
    /// second); 0s skips it.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "15s")]
    pub idle: Duration,
    /// Also list the idle phase's inbox statements by shape, from MariaDB's general log (turned
    /// on for the phase only, then put back; needs the SUPER or SYSTEM_VARIABLES_ADMIN grant).
    #[arg(long)]
    pub idle_trace: bool,
    /// Length of each steady phase after the drain (one per `--rates`); 0s skips them.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "20s")]
    pub steady: Duration,
    /// The offered rates (msg/s) of the steady phases, in order. A rate so low that every
    /// message finds the dispatcher idle (10) measures the floor of one message's delivery.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "100,300,1000",
        value_parser = clap::value_parser!(u64).range(1..=100_000)
    )]
    pub rates: Vec<u64>,
    /// Delay every response of the embedded mock cluster by this much (a broker farther
    /// away than this process; the bare probe sees it too). Only with `kafka.brokers =
    /// embedded`.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub broker_rtt: Option<Duration>,
    /// The `msgx-bench pump` rate (msg/s) measured on this machine the same way: the drain
    /// prints its ratio to it (the pump alone is the ceiling of the whole service).
    #[arg(long)]
    pub pump_rate: Option<f64>,
    /// Keep the bench databases afterwards.
    #[arg(long)]
    pub keep: bool,
}

/// Runs the end-to-end benchmark.
pub async fn e2e(settings: &Settings, args: &E2eBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.messages > 0, "--messages must be at least 1");
    BenchDbs::run_fresh(settings, args.keep, async |dbs| {
        run(settings, args, dbs).await
    })
    .await
}

/// Loads the backlog, then runs the service through the phases and stops it, whatever
/// the phases returned, before the databases go.
async fn run(settings: &Settings, args: &E2eBenchArgs, dbs: &BenchDbs) -> anyhow::Result<()> {
    load_backlog(settings, args, dbs).await?;
    let stats = InboxStats::setup(dbs).await?;
    let service = match Service::start(settings, dbs, &stats.url, args.broker_rtt).await {
        Ok(s) => s,
        Err(e) => {
            stats.teardown().await?;
            return Err(e);
        }
    };
    let result = phases(settings, args, dbs, &service, &stats).await;
    service.stop(settings).await;
    let torn_down = stats.teardown().await;
    result.and(torn_down)
}

/// The inbox as the DB owner and upstream would have it: the fixture and the backlog.
async fn load_backlog(
    settings: &Settings,
    args: &E2eBenchArgs,
    dbs: &BenchDbs,
) -> anyhow::Result<()> {
    dbs.inbox_fixture(settings).await?;
    let mix = Mix {
        unknown_type: 0.0,
        ..Mix::default()
    };
    let (names, tz) = (settings.inbox_names(), settings.inbox_timezone());
    let loaded = load_messages(&dbs.inbox_url, names, tz, args.messages, args.seed, mix).await?;
    println!(
        "bench e2e: {} messages (seed {}, simulator mix without unknown types), {:.1} MiB, \
         loaded in {:.1}s; databases {} and {}",
        args.messages,
        args.seed,
        loaded.bytes as f64 / (1024.0 * 1024.0),
        loaded.inbox.elapsed.as_secs_f64(),
        redact_url(&dbs.inbox_url),
        redact_url(&dbs.store_url)
    );
    Ok(())
}

/// The drain, the idle phase and the steady phases, on the running service.
async fn phases(
    settings: &Settings,
    args: &E2eBenchArgs,
    dbs: &BenchDbs,
    service: &Service,
    stats: &InboxStats,
) -> anyhow::Result<()> {
    let rate = drain(service, args.messages, args.timeout).await?;
    if let Some(pump) = args.pump_rate.filter(|p| *p > 0.0) {
        println!(
            "  against the pump alone: {rate:.0} / {pump:.0} msg/s = {:.1} % (kafka.delivery = {})",
            100.0 * rate / pump,
            settings.kafka.delivery.as_str()
        );
    }
    if !args.idle.is_zero() {
        idle(
            stats,
            args.idle,
            settings.pipeline.poll_interval,
            args.idle_trace,
        )
        .await?;
    }
    if args.steady.is_zero() {
        return Ok(());
    }
    // Enough writers that 1,000 autocommit INSERTs a second keep their pace on a loaded host
    // (4 queued up to seconds behind the pool and offered bursts, not a rate).
    let owner = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(16)
        .connect(&dbs.inbox_url)
        .await?;
    let offer = Offer {
        owner: &owner,
        names: settings.inbox_names(),
        tz: settings.inbox_timezone(),
        length: args.steady,
    };
    let mut result = Ok(());
    for &rate in &args.rates {
        // The broker sampled beside the phase (same moments, same host load) at a light rate,
        // and alone after it at the phase's rate.
        let beside = bare_probe(&service.dispatch, PROBE_BESIDE_RATE, args.steady);
        let (phase, beside) = tokio::join!(
            steady(&offer, &service.store, stats, rate, settings),
            beside
        );
        result = phase.and_then(|()| {
            print_probe("beside the phase", PROBE_BESIDE_RATE, &beside?);
            Ok(())
        });
        if result.is_err() {
            break;
        }
        result = bare_probe(&service.dispatch, rate, args.steady)
            .await
            .map(|lat| print_probe("alone after it", rate, &lat));
        if result.is_ok() && settings.kafka.exactly_once() {
            result = txn_probe::bare_txn_probe(&service.dispatch, TXN_PROBES, 1024)
                .await
                .map(|lat| print_txn_probe(&lat));
        }
        if result.is_err() {
            break;
        }
    }
    owner.close().await;
    result
}

/// Records per second of the probe that runs beside each steady phase: enough samples for a
/// p99 (2,000 in 20 s), a tenth of the broker's load at 1,000 msg/s.
const PROBE_BESIDE_RATE: u64 = 100;

/// The broker's own floor at `rate`: a bare producer with the dispatcher's settings, same topic,
/// records of a typical event's size (1 KiB) over an airport day's keys, send → ack: the
/// real-broker target of issue 21 is read against it.
async fn bare_probe(
    deps: &DispatchDeps,
    rate: u64,
    length: Duration,
) -> anyhow::Result<Vec<Duration>> {
    crate::dispatch::bare_latency_probe(deps, (rate, length), 1024, 1500).await
}

/// One-record transactions the exactly-once floor is sampled with after each phase.
const TXN_PROBES: usize = 200;

fn print_txn_probe(lat: &[Duration]) {
    println!(
        "      bare transaction probe, after it p50 {:>7.1} ms  p99 {:>7.1} ms  ({} one-record transactions, begin → commit)",
        percentile(lat, 0.5).as_secs_f64() * 1e3,
        percentile(lat, 0.99).as_secs_f64() * 1e3,
        lat.len()
    );
}

fn print_probe(when: &str, rate: u64, lat: &[Duration]) {
    println!(
        "      bare produce probe, {when:<16} p50 {:>7.1} ms  p99 {:>7.1} ms  ({} records at {rate}/s, send → ack)",
        percentile(lat, 0.5).as_secs_f64() * 1e3,
        percentile(lat, 0.99).as_secs_f64() * 1e3,
        lat.len()
    );
}

/// The service's pipeline, started in this process exactly as `run_service` starts it.
struct Service {
    supervisor: Addr<Supervisor>,
    /// The dispatcher's producer settings and broker, for the bare produce probe.
    dispatch: DispatchDeps,
    /// The recorder the binary installs: progress is read from the service's own counters.
    metrics: PrometheusHandle,
    store: Store,
    inbox: Inbox,
    /// Kept alive while the service runs (`kafka.brokers = embedded`).
    _embedded: Option<EmbeddedCluster>,
}

impl Service {
    /// Opens the store, connects the inbox (as `inbox_url`) and starts the pipeline with a
    /// dispatcher and the housekeeper.
    async fn start(
        settings: &Settings,
        dbs: &BenchDbs,
        inbox_url: &str,
        broker_rtt: Option<Duration>,
    ) -> anyhow::Result<Self> {
        let store = dbs.store(settings).await?;
        let inbox = dbs.inbox_at(settings, inbox_url)?;
        let (embedded, bootstrap) = kafka_bootstrap(&settings.kafka)?;
        if let Some(rtt) = broker_rtt {
            let cluster = embedded
                .as_ref()
                .context("--broker-rtt needs kafka.brokers = embedded")?;
            cluster.set_round_trip_time(rtt)?;
            println!("  broker round trip     : {rtt:?} added to every mock broker response");
        }
        print_settings(settings, embedded.is_some(), &bootstrap);
        let metrics = install_metrics()?;
        let clock: SharedClock = Arc::new(SystemClock);
        let (fatal, _fatal_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut deps =
            PipelineDeps::from_settings(settings, inbox.clone(), store.clone(), clock, fatal)?;
        let dispatch = DispatchDeps::new(settings, &bootstrap);
        deps.dispatch = Some(dispatch.clone());
        // The housekeeper runs as in the service: it vacuums our hot tables where the server's
        // autovacuum is off (retention.vacuum).
        deps.housekeeping = HousekeepingDeps::from_settings(settings);
        let supervisor = start_pipeline(deps);
        Ok(Self {
            supervisor,
            dispatch,
            metrics,
            store,
            inbox,
            _embedded: embedded,
        })
    }

    /// Stops the pipeline as SIGTERM does (every actor finishes its step), then closes the
    /// pools, so nothing is running when the databases are dropped.
    async fn stop(self, settings: &Settings) {
        let grace = settings.supervisor.shutdown_grace;
        let began = Instant::now();
        let deadline = began + grace;
        match tokio::time::timeout(grace, self.supervisor.send(ShutdownPipeline { deadline })).await
        {
            Ok(Ok(report)) if report.unclean.is_empty() => println!(
                "  service stopped       : {} actors stopped cleanly in {:.1}s",
                report.stopped.len(),
                began.elapsed().as_secs_f64()
            ),
            Ok(Ok(report)) => println!(
                "  service stopped       : unclean {:?} (stopped {:?})",
                report.unclean, report.stopped
            ),
            Ok(Err(e)) => println!("  service stopped       : supervisor unavailable ({e})"),
            Err(_) => println!("  service stopped       : not within {grace:?}"),
        }
        self.store.pool().close().await;
        self.inbox.pool().close().await;
    }
}

/// The settings that shape the figures.
fn print_settings(settings: &Settings, embedded: bool, bootstrap: &str) {
    println!(
        "  kafka                 : {}; processing.group_max {}, group_max_wait {:?}; poll_interval {:?}, claim_batch {}; backfill.period {:?}, batch {}; dispatch.batch {}",
        if embedded {
            format!("embedded mock cluster {bootstrap}")
        } else {
            bootstrap.to_string()
        },
        settings.processing.group_max,
        settings.processing.group_max_wait,
        settings.pipeline.poll_interval,
        settings.pipeline.claim_batch,
        settings.backfill.period,
        settings.backfill.batch,
        settings.dispatch.batch,
    );
}
