//! `msgx-bench mark`: backfill marks per second over a backlog of terminal rows,
//! printed next to the bare single-row autocommit `UPDATE` rate on the inbox server measured
//! in the same run (issue: aim for at least 20× thanks to batching), and how old the oldest
//! unmarked terminal row gets under a steady stream of terminal rows. Not a timed test: it
//! prints numbers.
//!
//! Everything happens in FRESH databases `msgx_bench_<pid>` (the `BenchDbs` of `bench
//! enqueue`), dropped at the end, also after a failure, unless `--keep`.
//!
//! Phases:
//! 1. inbox: the dev fixture, then `--rows` rows plus the steady phase's rows bulk-loaded
//!    (unmarked); store: `Store::connect` and `--rows` terminal `PROC_STATE` rows (mostly
//!    SUCCEEDED, some SKIPPED and DEAD) with their backfill intent, by SQL;
//! 2. bare limits on a scratch copy of the inbox table (acting as the DB owner): the
//!    single-row autocommit `UPDATE … WHERE id = ? AND <empty mark>` on one connection, and
//!    the same with `WHERE id IN (<batch> ids)`;
//! 3. the real thing: `sweep_once` (SystemClock, `backfill.batch`) until nothing is due; every
//!    sweep timed; then the bare single-row rate again (the two bracket the sweeps);
//! 4. where the time goes: the first `--sample` rows unmarked again (both stores) and swept
//!    with the same public calls `sweep_once` makes, each stage timed apart;
//! 5. steady state (after `VACUUM ANALYZE proc_state`, as autovacuum would have run by then):
//!    terminal rows appear at `--steady-rate` per second (by SQL, as the pump
//!    would commit them) for `--steady`, while the real `BackfillSweeper` actor runs in its
//!    own arbiter — once on its period alone, once woken by `TerminalCommitted` per row (as
//!    the pump will send it). The oldest unmarked age is sampled every 250 ms; the per-row
//!    lag `BACKFILL_AT − TERMINAL_AT` is read back afterwards.

mod bare;
mod report;
mod steady;
mod sweeps;

use bare::{BareRun, BareTable};
use report::print_report;
use steady::{steady_phase, Steady};
use sweeps::{stage_phase, sweep_phase, Stages, SweepRun};

use std::time::Duration;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use clap::Args;
use msgx_core::backfill::{sweep_once, SweepConfig};
use msgx_core::clock::SystemClock;
use msgx_core::inbox::names::InboxNames;
use msgx_core::inbox::Inbox;
use msgx_core::settings::{redact_url, Settings};
use msgx_core::store::Store;

use super::checkpoint;
use super::databases::BenchDbs;
use super::inbox_load::{load_inbox, Loaded};
use super::report::rate;

/// Mark benchmark knobs.
#[derive(Debug, Args)]
pub struct MarkBenchArgs {
    /// Backlog: terminal rows (and their unmarked inbox rows) before the sweeps start.
    #[arg(long, default_value_t = 100_000)]
    pub rows: u64,
    /// Rows per sweep (default: `backfill.batch`).
    #[arg(long)]
    pub batch: Option<u32>,
    /// Longest run of each bare single-row UPDATE measurement.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub bare_time: Duration,
    /// Most rows per bare single-row UPDATE measurement.
    #[arg(long, default_value_t = 4_000)]
    pub bare_rows: u64,
    /// Rows unmarked again and swept stage by stage for "where the time goes".
    #[arg(long, default_value_t = 20_000)]
    pub sample: u64,
    /// Terminal rows per second in the steady phase.
    #[arg(long, default_value_t = 500)]
    pub steady_rate: u64,
    /// Length of each steady run (period only; woken); 0s skips the steady phase.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    pub steady: Duration,
    /// Keep the bench databases afterwards (for inspection); they are dropped otherwise.
    #[arg(long)]
    pub keep: bool,
    /// Size in bytes of the filler message text of each inbox row.
    #[arg(long, default_value_t = 300)]
    pub msg_bytes: usize,
}

/// Runs the mark benchmark.
pub async fn mark(settings: &Settings, args: &MarkBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.rows > 0, "--rows must be at least 1");
    anyhow::ensure!(args.bare_rows > 0, "--bare-rows must be at least 1");
    anyhow::ensure!(!args.bare_time.is_zero(), "--bare-time must be positive");
    anyhow::ensure!(args.steady_rate > 0, "--steady-rate must be at least 1");
    let batch = args.batch.unwrap_or(settings.backfill.batch);
    anyhow::ensure!(
        (1..=10_000).contains(&batch),
        "--batch {batch} is outside 1..=10000"
    );
    let steady_rows = args.steady_rate * args.steady.as_secs();
    anyhow::ensure!(
        i64::try_from(args.rows + 2 * steady_rows).is_ok(),
        "--rows {} is too large",
        args.rows
    );

    BenchDbs::run_fresh(settings, args.keep, async |dbs| {
        run(settings, args, batch, steady_rows, dbs).await
    })
    .await
}

/// Everything between creating and dropping the databases.
async fn run(
    settings: &Settings,
    args: &MarkBenchArgs,
    batch: u32,
    steady_rows: u64,
    dbs: &BenchDbs,
) -> anyhow::Result<()> {
    let names = settings.inbox_names();
    let tz = settings.inbox_timezone();
    println!(
        "bench mark: {} terminal rows, batch {batch}, mark_value {}, msg_bytes {}",
        args.rows, settings.backfill.mark_value, args.msg_bytes
    );
    println!(
        "  databases             : {} and {}",
        redact_url(&dbs.inbox_url),
        redact_url(&dbs.store_url)
    );
    dbs.inbox_fixture(settings).await?;
    let total = args.rows + 2 * steady_rows;
    let loaded = load_inbox(&dbs.inbox_url, names, tz, total, args.msg_bytes).await?;
    println!(
        "  inbox load            : {total} rows in {:.1}s (ids {}..={}; the last {} for the steady phase)",
        loaded.elapsed.as_secs_f64(),
        loaded.min_id,
        loaded.max_id,
        2 * steady_rows
    );

    let store = dbs.store(settings).await?;
    let inbox = dbs.inbox(settings)?;
    let mut backfill = settings.backfill.clone();
    backfill.batch = batch;
    let cfg = SweepConfig::new(&backfill, names);

    let ctx = Ctx {
        inbox: &inbox,
        store: &store,
        cfg: &cfg,
        names,
        inbox_url: &dbs.inbox_url,
        tz,
        args,
        loaded: &loaded,
        period: settings.backfill.period,
    };
    let outcome = measure(&ctx, steady_rows).await;
    store.pool().close().await;
    inbox.pool().close().await;
    let m = outcome?;
    print_report(&ctx, batch, &m);
    Ok(())
}

/// What the phases share.
struct Ctx<'a> {
    inbox: &'a Inbox,
    store: &'a Store,
    cfg: &'a SweepConfig,
    names: &'a InboxNames,
    inbox_url: &'a str,
    tz: chrono_tz::Tz,
    args: &'a MarkBenchArgs,
    loaded: &'a Loaded,
    period: Duration,
}

/// What the phases found.
struct Measured {
    /// Bare single-row autocommit UPDATE before the sweeps.
    single_before: BareRun,
    /// The same after the sweeps.
    single_after: BareRun,
    /// Bare `IN (batch ids)` autocommit UPDATE.
    batched: BareRun,
    /// The sweeps.
    sweeps: SweepRun,
    /// Where the time goes.
    stages: Stages,
    /// Steady runs (period only; woken).
    steady: Vec<Steady>,
}

/// Phases 1 (store side) to 5.
async fn measure(ctx: &Ctx<'_>, steady_rows: u64) -> anyhow::Result<Measured> {
    let first = ctx.loaded.min_id;
    let last = first + i64::try_from(ctx.args.rows)? - 1;
    terminal_rows(ctx.store, first, last, Utc::now()).await?;
    checkpoint(ctx.store.pool()).await;

    let mut bare = BareTable::create(ctx).await?;
    let single_before = bare.single(ctx).await?;
    bare.reset().await?;
    let batched = bare.batched(ctx, ctx.cfg.batch).await?;
    bare.reset().await?;
    eprintln!(
        "bench mark: bare single-row {:.0} rows/s, IN ({}) {:.0} rows/s",
        single_before.rate(),
        ctx.cfg.batch,
        batched.rate()
    );

    let sweeps = sweep_phase(ctx).await?;
    let single_after = bare.single(ctx).await?;
    bare.drop_table().await?;
    eprintln!(
        "bench mark: sweeps {:.0} marks/s; bare single-row after {:.0} rows/s",
        rate(sweeps.marked, sweeps.elapsed),
        single_after.rate()
    );

    let stages = stage_phase(ctx, first).await?;

    // 120 000 updates since the last ANALYZE: autovacuum would run now; do it explicitly so
    // the steady phase sees the planner statistics a running service has.
    sqlx::query("VACUUM ANALYZE proc_state")
        .execute(ctx.store.pool())
        .await
        .context("VACUUM ANALYZE proc_state")?;

    let mut steady = Vec::new();
    if steady_rows > 0 {
        let mut next = last + 1;
        for woken in [false, true] {
            let s = steady_phase(ctx, next, steady_rows, woken).await?;
            eprintln!(
                "bench mark: steady ({}) oldest unmarked max {:.1}s",
                s.label(),
                s.oldest_max.as_secs_f64()
            );
            next += i64::try_from(steady_rows)?;
            steady.push(s);
            // Leave nothing behind for the next run.
            while sweep_once(ctx.inbox, ctx.store, &SystemClock, ctx.cfg)
                .await
                .context("draining after a steady run")?
                .selected
                > 0
            {}
        }
    }
    Ok(Measured {
        single_before,
        single_after,
        batched,
        sweeps,
        stages,
        steady,
    })
}

/// `first..=last` as terminal rows due now (2 % DEAD, 2 % SKIPPED, the rest SUCCEEDED).
async fn terminal_rows(
    store: &Store,
    first: i64,
    last: i64,
    now: DateTime<Utc>,
) -> anyhow::Result<()> {
    insert_terminal(store, (first, last), now, true).await?;
    sqlx::query("ANALYZE proc_state")
        .execute(store.pool())
        .await
        .context("ANALYZE proc_state")?;
    Ok(())
}

/// `first..=last` inserted as terminal at `now` with their backfill due then (as the pump
/// commits them: state + backfill intent): all SUCCEEDED, or with `mixed` 2 % DEAD (MALFORMED)
/// and 2 % SKIPPED (DUPLICATE) among them.
async fn insert_terminal(
    store: &Store,
    (first, last): (i64, i64),
    now: DateTime<Utc>,
    mixed: bool,
) -> anyhow::Result<()> {
    let (state, class) = match mixed {
        true => (
            "CASE g % 50 WHEN 0 THEN 'DEAD' WHEN 1 THEN 'SKIPPED' ELSE 'SUCCEEDED' END",
            "CASE g % 50 WHEN 0 THEN 'MALFORMED' WHEN 1 THEN 'DUPLICATE' END",
        ),
        false => ("'SUCCEEDED'", "NULL"),
    };
    sqlx::query(&format!(
        "INSERT INTO proc_state (msg_id, state, source, received_at, enqueued_at, error_class, \
                terminal_at, backfill_next_at) \
         SELECT g, {state}, 'POLL', $3, $3, {class}, $3, $3 \
         FROM generate_series($1::bigint, $2::bigint) g"
    ))
    .bind(first)
    .bind(last)
    .bind(now)
    .execute(store.pool())
    .await
    .with_context(|| format!("inserting terminal rows {first}..={last}"))?;
    Ok(())
}
