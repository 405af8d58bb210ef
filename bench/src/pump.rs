//! `msgx-bench pump`: pump throughput (messages/s) over a backlog of realistic
//! well-formed messages, printed next to the bare single-connection PostgreSQL commit rate
//! measured in the same run, on the same database (issue: aim for at least 40 % of the bare
//! `BEGIN; UPDATE; COMMIT` rate with `synchronous_commit` on). Not a timed test: it prints
//! numbers. The server's `synchronous_commit` is never changed: the business transaction's
//! commit waits for the disk flush, as it must; only the pump's stamp and identity binding (and
//! the bare shapes that mirror them) relax it: they are single autocommit statements on a
//! session with `synchronous_commit = off` (the store's relaxed pool), so a message waits for
//! ONE WAL flush, and its stamp and binding are durable no later than its outcome.
//!
//! Everything happens in FRESH databases `msgx_bench_<pid>` (the [`BenchDbs`] of `bench
//! enqueue`), dropped at the end, also after a failure, unless `--keep`.
//!
//! Phases:
//! 1. inbox: the dev fixture, then `--messages` messages from the message [`Generator`]
//!    (`Mix::well_formed()`: every one must succeed) bulk-loaded with multi-row `INSERT`s and
//!    explicit contiguous ids, in generation order; then `poll_once` until W reaches the head
//!    (not timed);
//! 2. bare limits: scratch tables, one held connection, `synchronous_commit` as the server has
//!    it: autocommit `UPDATE`, `BEGIN; UPDATE; COMMIT`, the relaxed commit (one autocommit
//!    `UPDATE` on a second connection whose session has `synchronous_commit = off`: the
//!    stamp's and the binding's shape), the pump-shaped transaction (advisory lock with `SELECT …
//!    FOR UPDATE`, one `WITH … INSERT … UPDATE`) and the pump-shaped message (stamp and bind,
//!    each a relaxed commit, then that transaction: one synchronous commit, two relaxed
//!    ones), plus one round trip and one pool
//!    acquire (the store pool's: no ping before checkout);
//! 3. the real thing: `PumpCore::step_group()` (SystemClock, groups as configured) until Idle;
//!    every outcome must be
//!    SUCCEEDED, in MSG_ID order. Short bare probes run before it and after every tenth (pump
//!    paused), so the ratio is time-matched although the disk's flush time drifts on a shared
//!    machine; in the same pause the housekeeper's vacuum rule (`retention.vacuum*`) maintains
//!    the store's tables, as the running service does beside its pump (without it a 1,000,000
//!    run's head read walks the dead index entries of every row processed before);
//! 4. the bare transaction and the pump-shaped transaction again (the two runs bracket the
//!    pump, so drift on a shared machine shows);
//! 5. where the time goes: the stage timings `PumpCore` recorded itself during phase 3
//!    (`PumpCore::stages`: no copy of the step here);
//! 6. with `--raw-copy both` (the default): the store is emptied and the same backlog enqueued
//!    again (not timed), and phase 3 runs once more with our raw-text copy on
//!    (`retention.raw_copy`); the two runs are printed side by side — rate, share of the
//!    time-matched bare rate, latency, the `raw copy` stage, WAL bytes per message and what the
//!    copies take in the store.
//!
//! This file orchestrates; phase 1 lives in `pump/load.rs`, 2 and 4 in `pump/bare.rs`, 3 in
//! `pump/run.rs` (its tenths and their bare probes in `pump/tenths.rs`), the printed report in
//! `pump/report.rs`.

mod bare;
pub(crate) mod load;
mod report;
mod run;

use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use msgx_core::inbox::Inbox;
use msgx_core::settings::{redact_url, Settings};
use msgx_core::store::Store;

use super::checkpoint;
use super::databases::BenchDbs;
use bare::{bare_shape, round_trips, BareLimits, BareShape, BareTables};
use load::{enqueue_all, load_messages};
use report::print_report;
use run::{pump_phase, Probe};

/// Pump benchmark knobs.
#[derive(Debug, Args)]
pub struct PumpBenchArgs {
    /// Backlog size: generated well-formed messages loaded and enqueued before the pump starts.
    #[arg(long, default_value_t = 100_000)]
    pub messages: u64,
    /// Keep the bench databases afterwards (for inspection); they are dropped otherwise.
    #[arg(long)]
    pub keep: bool,
    /// Message generator seed (the same seed gives the same messages byte for byte).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Longest run of each bare commit measurement.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub bare_time: Duration,
    /// Most transactions (messages, for the pump-shaped message) per bare measurement.
    #[arg(long, default_value_t = 5_000)]
    pub bare_tx: u64,
    /// Our raw-text copy (`retention.raw_copy`): `both` runs the pump twice on the same
    /// backlog, off then on, and prints them side by side; `off` / `on` run once.
    #[arg(long, value_enum, default_value_t = RawCopyRuns::Both)]
    pub raw_copy: RawCopyRuns,
}

/// Which pump runs `--raw-copy` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RawCopyRuns {
    /// Off, then on (side by side).
    Both,
    /// One run, off.
    Off,
    /// One run, on.
    On,
}

/// Runs the pump benchmark.
pub async fn pump(settings: &Settings, args: &PumpBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.messages > 0, "--messages must be at least 1");
    anyhow::ensure!(
        i64::try_from(args.messages).is_ok(),
        "--messages {} is too large",
        args.messages
    );
    anyhow::ensure!(args.bare_tx > 0, "--bare-tx must be at least 1");
    anyhow::ensure!(!args.bare_time.is_zero(), "--bare-time must be positive");

    BenchDbs::run_fresh(settings, args.keep, async |dbs| {
        run(settings, args, dbs).await
    })
    .await
}

/// Everything between creating and dropping the databases.
async fn run(settings: &Settings, args: &PumpBenchArgs, dbs: &BenchDbs) -> anyhow::Result<()> {
    let names = settings.inbox_names();
    let tz = settings.inbox_timezone();
    eprintln!(
        "bench pump: {} messages, seed {}, databases {} and {}",
        args.messages,
        args.seed,
        redact_url(&dbs.inbox_url),
        redact_url(&dbs.store_url)
    );
    dbs.inbox_fixture(settings).await?;
    let loaded = load_messages(
        &dbs.inbox_url,
        names,
        tz,
        args.messages,
        args.seed,
        msgx_core::devtools::messages::Mix::well_formed(),
    )
    .await?;
    eprintln!(
        "bench pump: inbox loaded: {} messages, {:.1} MiB, in {:.1}s",
        args.messages,
        loaded.bytes as f64 / (1024.0 * 1024.0),
        loaded.inbox.elapsed.as_secs_f64()
    );

    let store = dbs.store(settings).await?;
    let inbox = dbs.inbox(settings)?;

    let outcome = measure(&inbox, &store, settings, args, &loaded).await;
    // Close the pools before the databases are dropped.
    store.pool().close().await;
    inbox.pool().close().await;
    let m = outcome?;
    print_report(settings, args, dbs, &loaded, &m);
    Ok(())
}

/// What the measured phases found.
#[derive(Debug)]
struct Measured {
    /// `SHOW synchronous_commit` and the server version, as the bench saw them.
    server: ServerFacts,
    /// Whether the store pool pings a connection before every checkout (read from the pool).
    test_before_acquire: bool,
    /// The enqueue (not timed, printed for orientation).
    enqueue: load::Enqueued,
    /// Bare limits before the pump.
    before: BareLimits,
    /// The bare transaction and the pump-shaped transaction after the pump.
    after: BareLimits,
    /// The pump run (with the stage timings the real step recorded).
    run: run::PumpRun,
    /// `--raw-copy both`: the second run, with the raw copy on.
    copy_run: Option<run::PumpRun>,
    /// What the copies take in the store after the run that wrote them.
    copies: Option<run::CopyFacts>,
}

/// Facts about the PostgreSQL server the numbers come from.
#[derive(Debug)]
struct ServerFacts {
    synchronous_commit: String,
    fsync: String,
    version: String,
}

/// Phases 1 (enqueue) to 5 on the loaded inbox and the fresh store.
async fn measure(
    inbox: &Inbox,
    store: &Store,
    settings: &Settings,
    args: &PumpBenchArgs,
    loaded: &load::Loaded,
) -> anyhow::Result<Measured> {
    let pool = store.pool();
    let server = server_facts(pool).await?;
    anyhow::ensure!(
        server.synchronous_commit != "off",
        "the server runs with synchronous_commit = {}; this bench compares commits that wait \
         for the disk flush, as the pump's must",
        server.synchronous_commit
    );
    let enqueue = enqueue_all(inbox, store, settings, loaded)
        .await
        .context("enqueueing the backlog")?;
    eprintln!(
        "bench pump: enqueued {} rows in {} rounds, {:.1}s (not timed)",
        enqueue.rows,
        enqueue.rounds,
        enqueue.elapsed.as_secs_f64()
    );

    let tables = BareTables::create(pool, args.messages).await?;
    let result = measure_with_tables(inbox, store, settings, args, loaded, &tables).await;
    tables.drop_all().await?;
    let (before, after, run, copy_run, copies) = result?;
    Ok(Measured {
        server,
        test_before_acquire: pool.options().get_test_before_acquire(),
        enqueue,
        before,
        after,
        run,
        copy_run,
        copies,
    })
}

/// Phases 2 to 4, with the bare scratch tables in place throughout (the probes between the
/// pump's tenths use them too).
async fn measure_with_tables(
    inbox: &Inbox,
    store: &Store,
    settings: &Settings,
    args: &PumpBenchArgs,
    loaded: &load::Loaded,
    tables: &BareTables,
) -> anyhow::Result<(
    BareLimits,
    BareLimits,
    run::PumpRun,
    Option<run::PumpRun>,
    Option<run::CopyFacts>,
)> {
    let pool = store.pool();
    let mut before = BareLimits::default();
    for shape in BareShape::ALL {
        checkpoint(pool).await;
        let r = bare_shape(tables, shape, args.bare_tx, args.bare_time).await?;
        eprintln!("bench pump: bare {}: {:.0}/s", shape.label(), r.rate());
        before.shapes.push(r);
    }
    before.round_trips = Some(round_trips(tables, 2_000).await?);

    // Probes: a fifth of a bare measurement each.
    let probe = Probe {
        tables,
        time: args.bare_time / 5,
        units: args.bare_tx,
        vacuum: msgx_core::retention::vacuum::VacuumPolicy::from_settings(&settings.retention),
    };
    checkpoint(pool).await;
    let first_on = args.raw_copy == RawCopyRuns::On;
    let run = pump_phase(inbox, store, settings, loaded, probe, first_on).await?;
    let mut copies = None;
    if first_on {
        copies = Some(run::copy_facts(store).await?);
    }
    let mut copy_run = None;
    if args.raw_copy == RawCopyRuns::Both {
        let again = run::reset_store(store).await?;
        enqueue_all(inbox, store, settings, loaded)
            .await
            .context("enqueueing the backlog again")?;
        eprintln!(
            "bench pump: store emptied ({again}) and the backlog enqueued again; raw_copy on"
        );
        checkpoint(pool).await;
        copy_run = Some(pump_phase(inbox, store, settings, loaded, probe, true).await?);
        copies = Some(run::copy_facts(store).await?);
    }

    let mut after = BareLimits::default();
    for shape in [BareShape::Tx, BareShape::PumpTx] {
        checkpoint(pool).await;
        let r = bare_shape(tables, shape, args.bare_tx, args.bare_time).await?;
        eprintln!(
            "bench pump: bare {} (after the pump): {:.0}/s",
            shape.label(),
            r.rate()
        );
        after.shapes.push(r);
    }
    Ok((before, after, run, copy_run, copies))
}

/// `synchronous_commit`, `fsync` and the version of the server.
async fn server_facts(pool: &sqlx::PgPool) -> anyhow::Result<ServerFacts> {
    let show = |name: &'static str| async move {
        sqlx::query_scalar::<_, String>(&format!("SHOW {name}"))
            .fetch_one(pool)
            .await
            .with_context(|| format!("SHOW {name}"))
    };
    Ok(ServerFacts {
        synchronous_commit: show("synchronous_commit").await?,
        fsync: show("fsync").await?,
        version: show("server_version").await?,
    })
}
