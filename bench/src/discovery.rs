//! `msgx-bench discovery`: does discovery keep up with a gap-heavy inbox?
//!
//! Concurrent writers insert into a fresh bench inbox at `--rate` messages per second; a
//! fraction of their transactions roll back (permanent holes) and a fraction hold their commit
//! for up to `--hold-max` (late commits). The real `InboxPoller` actor, with the configured
//! knobs and `--max-commit-delay`, discovers them into a fresh bench store. Every writer
//! records the wall time its COMMIT returned; discovery lag = `proc_state.enqueued_at` − that
//! time. Printed per minute of commit time: offered and committed rate, lag p50/p99/max and
//! the open holes sampled at the minute's end; at the end, how long after the writers stopped
//! W reached the last committed row — all next to the bound `max_commit_delay + 2 ×
//! poll_interval` (a row behind a rolled-back id waits for the hole's sighting, at most one poll
//! interval after its commit, plus the delay, plus the round that releases it).
//!
//! Not a timed test: it prints numbers. The databases are dropped unless `--keep`.

mod lags;
mod writers;

use lags::report;
use writers::{spawn_writers, Writers};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Actor;
use anyhow::Context as _;
use chrono::{DateTime, Utc};
use clap::Args;
use msgx_core::clock::{SharedClock, SystemClock};
use msgx_core::settings::Settings;
use sqlx::mysql::MySqlPoolOptions;

use msgx_actors::health::Health;
use msgx_actors::inbox_poller::InboxPoller;
use msgx_actors::wiring::Wiring;

use crate::databases::BenchDbs;

/// Discovery benchmark knobs.
#[derive(Debug, Args)]
pub struct DiscoveryBenchArgs {
    /// Offered messages per second over all writers.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// How long the writers write.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Concurrent writers (each its own connection and transaction).
    #[arg(long, default_value_t = 8)]
    pub writers: usize,
    /// Fraction of transactions rolled back (each leaves a permanent hole).
    #[arg(long, default_value_t = 0.01)]
    pub rollback: f64,
    /// Fraction of transactions that hold their commit (late commits).
    #[arg(long, default_value_t = 0.05)]
    pub hold: f64,
    /// Longest hold (uniform in 0..hold-max).
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub hold_max: Duration,
    /// pipeline.max_commit_delay for this run.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub max_commit_delay: Duration,
    /// Keep the bench databases afterwards.
    #[arg(long)]
    pub keep: bool,
}

/// Runs the discovery benchmark.
pub async fn discovery(settings: &Settings, args: &DiscoveryBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.rate > 0.0 && args.rate <= 10_000.0,
        "--rate must be in (0, 10000]"
    );
    anyhow::ensure!(
        args.writers >= 1 && args.writers <= 64,
        "--writers must be 1..=64"
    );
    anyhow::ensure!(
        (0.0..=1.0).contains(&args.rollback) && (0.0..=1.0).contains(&args.hold),
        "--rollback and --hold are fractions in 0..=1"
    );
    anyhow::ensure!(
        args.duration >= Duration::from_secs(1) && args.duration <= Duration::from_secs(86_400),
        "--duration must be 1s..=24h"
    );
    BenchDbs::run_fresh(settings, args.keep, async |dbs| {
        run(settings, args, dbs).await
    })
    .await
}

/// What the writers left and what discovery made of it.
struct Outcome {
    commits: BTreeMap<i64, DateTime<Utc>>,
    rolled_back: u64,
    /// Open holes, the most seen per minute.
    holes_by_minute: BTreeMap<u64, i64>,
    /// How long after the writers stopped W reached the last committed row (None: not in time).
    reached: Option<Duration>,
    /// When the writers started (wall clock): minutes are counted from here.
    start_wall: DateTime<Utc>,
}

async fn run(settings: &Settings, args: &DiscoveryBenchArgs, dbs: &BenchDbs) -> anyhow::Result<()> {
    dbs.inbox_fixture(settings).await?;
    let inbox = dbs.inbox(settings)?;
    let store = dbs.store(settings).await?;
    let bound = args.max_commit_delay + 2 * settings.pipeline.poll_interval;
    print_header(settings, args, bound);
    let poller = start_poller(settings, args, inbox, store.clone());
    let pool = MySqlPoolOptions::new()
        .max_connections(args.writers as u32 + 1)
        .connect(&dbs.inbox_url)
        .await
        .context("connecting the writers")?;
    let writers = spawn_writers(settings, args, &pool)?;
    let outcome = observe(&store, args, writers, bound).await?;
    // Stop the poller before the databases go (the typed shutdown every actor handles).
    let deadline = Instant::now() + Duration::from_secs(5);
    if let Err(e) = poller
        .send(msgx_actors::messages::Shutdown { deadline })
        .await
    {
        tracing::warn!(error = %e, "stopping the bench poller");
    }
    report(&store, args, outcome, bound).await
}

/// The run's knobs and the bound.
fn print_header(settings: &Settings, args: &DiscoveryBenchArgs, bound: Duration) {
    println!(
        "bench discovery: {:.0} msg/s offered for {}, {} writers, {:.1}% rolled back, {:.1}% held \
         up to {}, max_commit_delay {}, poll_interval {}, claim_batch {}, hole_sight_ahead {}",
        args.rate,
        humantime::format_duration(args.duration),
        args.writers,
        100.0 * args.rollback,
        100.0 * args.hold,
        humantime::format_duration(args.hold_max),
        humantime::format_duration(args.max_commit_delay),
        humantime::format_duration(settings.pipeline.poll_interval),
        settings.pipeline.claim_batch,
        settings.pipeline.hole_sight_ahead,
    );
    println!(
        "  bound                 : max_commit_delay + 2 x poll_interval = {:.1}s",
        bound.as_secs_f64()
    );
}

/// The real poller actor with the configured knobs.
fn start_poller(
    settings: &Settings,
    args: &DiscoveryBenchArgs,
    inbox: msgx_core::inbox::Inbox,
    store: msgx_core::store::Store,
) -> actix::Addr<InboxPoller> {
    let cfg = msgx_core::poller::PollConfig {
        max_commit_delay: args.max_commit_delay,
        ..msgx_core::poller::PollConfig::from_settings(&settings.pipeline, &settings.late)
    };
    let clock: SharedClock = Arc::new(SystemClock);
    InboxPoller::new(
        inbox,
        store,
        clock,
        cfg,
        settings.pipeline.poll_interval,
        Wiring::default(),
        Health::default(),
    )
    .start()
}

/// Samples the open holes every second while the writers write, joins them, then waits for W
/// to reach the last committed row.
async fn observe(
    store: &msgx_core::store::Store,
    args: &DiscoveryBenchArgs,
    mut writers: Writers,
    bound: Duration,
) -> anyhow::Result<Outcome> {
    let mut holes_by_minute: BTreeMap<u64, i64> = BTreeMap::new();
    while writers.started.elapsed() < args.duration {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let open: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox_hole")
            .fetch_one(store.pool())
            .await?;
        let minute = writers.started.elapsed().as_secs() / 60;
        let e = holes_by_minute.entry(minute).or_insert(0);
        *e = (*e).max(open);
    }
    let mut rolled_back = 0;
    while let Some(joined) = writers.tasks.join_next().await {
        rolled_back += joined.context("writer task")??;
    }
    let commits = std::mem::take(&mut *writers.commits.lock().unwrap_or_else(|p| p.into_inner()));
    let last_committed = commits.keys().next_back().copied().unwrap_or(0);
    let reached = wait_for_w(store, last_committed, bound).await?;
    Ok(Outcome {
        commits,
        rolled_back,
        holes_by_minute,
        reached,
        start_wall: writers.start_wall,
    })
}

/// How long until W reaches `last_committed` (trailing rolled-back ids are no hole: no row
/// follows), or None after `3 × bound + 30 s`.
async fn wait_for_w(
    store: &msgx_core::store::Store,
    last_committed: i64,
    bound: Duration,
) -> anyhow::Result<Option<Duration>> {
    let stopped = Instant::now();
    let deadline = stopped + 3 * bound + Duration::from_secs(30);
    loop {
        let w: i64 = sqlx::query_scalar("SELECT w FROM inbox_cursor WHERE id = 1")
            .fetch_one(store.pool())
            .await?;
        if w >= last_committed {
            return Ok(Some(stopped.elapsed()));
        }
        if Instant::now() > deadline {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
