//! msgx-bench: the benchmarks of msgexchange, in their own workspace member so the production
//! binary carries none of them (`msgx-bench enqueue|pump|mark|dispatch`). Each prints its
//! figures next to the bare limits measured in the same run, on the same servers.
//!
//! `msgx-bench enqueue`: poller enqueue throughput over a large backlog, printed next to
//! the bare PostgreSQL insert rate measured in the same run, on the same servers (issue: aim
//! for at least 50 % of the bare rate, with flat memory). Not a timed test: it prints numbers.
//!
//! Everything happens in FRESH databases `msgx_bench_<pid>`, derived from the configured inbox
//! and store URLs (same servers, same credentials, only the database name replaced). They are
//! dropped at the end, also after a failure, unless `--keep`.
//!
//! Phases:
//! 1. inbox: the dev fixture (acting as the DB owner), then a bulk load of `--rows` rows with
//!    multi-row `INSERT … VALUES` statements on a few connections;
//! 2. store: `Store::connect` (creates the database, runs the migrations);
//! 3. bare limits: `rows` rows into scratch copies of `proc_state`, one transaction per
//!    `claim_batch` rows, with the poller's exact `UNNEST` statement and with a plain multi-row
//!    `VALUES` statement, both under the poller's `synchronous_commit` setting (UNNEST is
//!    measured again after step 4, so the two bracket the poller);
//! 4. the real thing: `poll_once` in a loop until W reaches the inbox head, with per-round
//!    latency and RSS samples every 10 % of progress;
//! 5. where the time goes: the stage timings `poll_once` recorded itself during phase 4
//!    (`PollReport::stages`, summed), no replay of the round.
//!
//! This file orchestrates the phases; the databases live in `databases`, phase 1 in
//! `inbox_load`, 3 in `bare`, 4 in `poller_run`, and the printed numbers in `report`.

mod bare;
mod databases;
mod discovery;
mod dispatch;
// The tests' dispatcher round (msgx-core only), so the bench measures what the tests drive;
// the bench reads only some of what it reports.
#[allow(dead_code)]
#[path = "../../tests/common/dispatch_round.rs"]
mod dispatch_round;
mod e2e;
mod inbox_load;
mod inbox_stats;
mod mark;
mod poller_run;
mod pump;
mod report;

use std::borrow::Cow;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::Args;
use msgx_core::inbox::Inbox;
use msgx_core::poller::PollConfig;
use msgx_core::settings::{redact_url, Settings};
use msgx_core::store::Store;
use sqlx::postgres::PgPool;

use bare::{bare_phase, BareLoad, BareShape};
use databases::BenchDbs;
use inbox_load::{load_inbox, Loaded};
use poller_run::{poll_phase, PollPhase};
use report::{print_measured, rate};

pub use databases::with_database;
pub use discovery::{discovery, DiscoveryBenchArgs};
pub use dispatch::{dispatch, DispatchBenchArgs};
pub use e2e::{e2e, E2eBenchArgs};
pub use mark::{mark, MarkBenchArgs};
pub use poller_run::rss_mib;
pub use pump::{pump, PumpBenchArgs};
pub use report::percentile;

/// Enqueue benchmark knobs.
#[derive(Debug, Args)]
pub struct EnqueueBenchArgs {
    /// Backlog size: inbox rows loaded before the poller starts.
    #[arg(long, default_value_t = 1_000_000)]
    pub rows: u64,
    /// Rows per poll round and per bare-insert transaction (default: `pipeline.claim_batch`).
    #[arg(long)]
    pub claim_batch: Option<u32>,
    /// Keep the bench databases afterwards (for inspection); they are dropped otherwise.
    #[arg(long)]
    pub keep: bool,
    /// Size in bytes of the filler message text of each inbox row.
    #[arg(long, default_value_t = 300)]
    pub msg_bytes: usize,
}

/// Runs the enqueue benchmark.
pub async fn enqueue(settings: &Settings, args: &EnqueueBenchArgs) -> anyhow::Result<()> {
    let claim_batch = args.claim_batch.unwrap_or(settings.pipeline.claim_batch);
    anyhow::ensure!(
        (1..=50_000).contains(&claim_batch),
        "--claim-batch {claim_batch} is outside 1..=50000"
    );
    anyhow::ensure!(args.rows > 0, "--rows must be at least 1");
    anyhow::ensure!(
        i64::try_from(args.rows).is_ok(),
        "--rows {} is too large",
        args.rows
    );

    BenchDbs::run_fresh(settings, args.keep, async |dbs| {
        run(settings, args, claim_batch, dbs).await
    })
    .await
}

/// Everything between creating and dropping the databases.
async fn run(
    settings: &Settings,
    args: &EnqueueBenchArgs,
    claim_batch: u32,
    dbs: &BenchDbs,
) -> anyhow::Result<()> {
    let async_commit = settings.pipeline.async_enqueue_commit;
    let names = settings.inbox_names();
    let tz = settings.inbox_timezone();
    println!(
        "bench enqueue: {} rows, claim_batch {claim_batch}, async_enqueue_commit={async_commit}, msg_bytes {}",
        args.rows, args.msg_bytes
    );
    println!(
        "  databases             : {} and {}",
        redact_url(&dbs.inbox_url),
        redact_url(&dbs.store_url)
    );

    // 1. The inbox, as the DB owner and upstream would have it.
    dbs.inbox_fixture(settings).await?;
    let load = load_inbox(&dbs.inbox_url, names, tz, args.rows, args.msg_bytes).await?;
    println!(
        "  inbox load            : {} rows in {:.1}s ({:.0} rows/s, ids {}..={})",
        args.rows,
        load.elapsed.as_secs_f64(),
        rate(args.rows, load.elapsed),
        load.min_id,
        load.max_id
    );

    // 2. The store and the inbox adapter, exactly as the service builds them.
    let store = dbs.store(settings).await?;
    let inbox = dbs.inbox(settings)?;

    let outcome = measure(&inbox, &store, settings, args, claim_batch, &load).await;
    // Close the pools before the databases are dropped.
    store.pool().close().await;
    inbox.pool().close().await;
    let m = outcome?;

    print_measured(args, claim_batch, async_commit, &m);
    Ok(())
}

/// What the measured phases found.
#[derive(Debug)]
struct Measured {
    /// Time of the bare UNNEST inserts before the poller phase.
    bare_unnest_before: Duration,
    /// Time of the bare UNNEST inserts after the poller phase.
    bare_unnest_after: Duration,
    /// Time of the bare VALUES inserts.
    bare_values: Duration,
    /// The poller phase (with the stage timings `poll_once` recorded).
    poll: PollPhase,
}

/// Phases 3 and 4, on the loaded inbox and the fresh store.
async fn measure(
    inbox: &Inbox,
    store: &Store,
    settings: &Settings,
    args: &EnqueueBenchArgs,
    claim_batch: u32,
    load: &Loaded,
) -> anyhow::Result<Measured> {
    let async_commit = settings.pipeline.async_enqueue_commit;
    let pool = store.pool();
    let bare_load = BareLoad {
        rows: args.rows,
        batch: claim_batch,
        async_commit,
    };
    let bare = |shape| bare_phase(pool, shape, bare_load);
    let bare_unnest_before = bare(BareShape::Unnest).await?;
    let bare_values = bare(BareShape::Values).await?;
    checkpoint(pool).await;
    let cfg = PollConfig {
        claim_batch,
        ..PollConfig::from_settings(&settings.pipeline, &settings.late)
    };
    let poll = poll_phase(inbox, store, cfg, load).await?;
    // Measured again after the poller: the two bracket it, so drift during the run shows.
    let bare_unnest_after = bare(BareShape::Unnest).await?;
    Ok(Measured {
        bare_unnest_before,
        bare_unnest_after,
        bare_values,
        poll,
    })
}

/// Flushes dirty buffers between phases so one phase's writes are not paid by the next.
/// Best effort: needs superuser or `pg_checkpoint`; the bench stays valid without it.
async fn checkpoint(pool: &PgPool) {
    if let Err(e) = sqlx::query("CHECKPOINT").execute(pool).await {
        tracing::debug!(error = %e, "CHECKPOINT between bench phases refused; continuing");
    }
}

/// The statement for `rows` rows: `full_sql` (built once, for `full_rows`) when the chunk is
/// full, else one built by `build` for the shorter last chunk.
fn statement_for<T: PartialEq>(
    rows: T,
    full_rows: T,
    full_sql: &str,
    build: impl FnOnce(T) -> String,
) -> Cow<'_, str> {
    if rows == full_rows {
        Cow::Borrowed(full_sql)
    } else {
        Cow::Owned(build(rows))
    }
}

/// A receive time for row `id` a little before `now`: spread over a second, as real ones are.
fn spread_received_at(now: DateTime<Utc>, id: i64) -> DateTime<Utc> {
    now - chrono::Duration::milliseconds(id % 1000)
}
