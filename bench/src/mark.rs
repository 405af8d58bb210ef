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

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Actor;
use anyhow::Context as _;
use chrono::{DateTime, Utc};
use clap::Args;
use msgx_core::backfill::rules::{classify, overdue_before};
use msgx_core::backfill::{sweep_once, SweepConfig};
use msgx_core::clock::{Clock, SharedClock, SystemClock};
use msgx_core::inbox::names::InboxNames;
use msgx_core::inbox::time::utc_to_local;
use msgx_core::inbox::Inbox;
use msgx_core::settings::{redact_url, Settings};
use msgx_core::store::backfill::SweepWrite;
use msgx_core::store::Store;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::{ConnectOptions, Connection};

use super::checkpoint;
use super::databases::BenchDbs;
use super::inbox_load::{load_inbox, Loaded};
use super::percentile;
use super::report::rate;
use msgx_actors::backfill_sweeper::{BackfillSweeper, DEFAULT_WAKE_GAP};
use msgx_actors::messages::TerminalCommitted;

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

/// One bare measurement.
struct BareRun {
    rows: u64,
    elapsed: Duration,
    /// Per statement, ascending.
    latency: Vec<Duration>,
}

impl BareRun {
    fn rate(&self) -> f64 {
        rate(self.rows, self.elapsed)
    }
}

/// A scratch copy of the inbox table (in the bench's own inbox database, as the DB owner).
struct BareTable {
    conn: MySqlConnection,
    /// Ids of the copied rows, ascending.
    ids: Vec<i64>,
    /// `UPDATE bench_bare_mark SET status = ?, processed = COALESCE(processed, ?) WHERE `.
    prefix: String,
    /// Quoted `id`, status and processed columns.
    id: String,
    status: String,
    processed: String,
    /// The mark value.
    value: String,
}

impl BareTable {
    async fn create(ctx: &Ctx<'_>) -> anyhow::Result<Self> {
        let n = ctx.names;
        let mut conn = MySqlConnectOptions::from_str(ctx.inbox_url)
            .context("parsing the bench inbox URL")?
            .disable_statement_logging()
            .connect()
            .await
            .context("connecting the bare connection")?;
        // Enough rows for the single-row run and for 20 batched statements.
        let rows = ctx.args.bare_rows.max(20 * u64::from(ctx.cfg.batch));
        for sql in [
            "DROP TABLE IF EXISTS bench_bare_mark".to_string(),
            format!("CREATE TABLE bench_bare_mark LIKE {}", n.table),
            format!(
                "INSERT INTO bench_bare_mark SELECT * FROM {} ORDER BY {} LIMIT {rows}",
                n.table, n.id
            ),
        ] {
            sqlx::raw_sql(&sql)
                .execute(&mut conn)
                .await
                .with_context(|| format!("bare table: {sql}"))?;
        }
        let ids: Vec<i64> = sqlx::query_scalar(&format!(
            "SELECT {id} FROM bench_bare_mark ORDER BY {id}",
            id = n.id
        ))
        .fetch_all(&mut conn)
        .await
        .context("bare ids")?;
        Ok(Self {
            conn,
            ids,
            prefix: format!(
                "UPDATE bench_bare_mark SET {s} = ?, {p} = COALESCE({p}, ?) \
                 WHERE ({s} IS NULL OR TRIM({s}) = '') AND ",
                s = n.status,
                p = n.processed
            ),
            id: n.id.to_string(),
            status: n.status.to_string(),
            processed: n.processed.to_string(),
            value: ctx.cfg.mark_value.clone(),
        })
    }

    /// The single-row autocommit UPDATE, one statement per row, until `bare_time` or
    /// `bare_rows`.
    async fn single(&mut self, ctx: &Ctx<'_>) -> anyhow::Result<BareRun> {
        let sql = format!("{}{} = ?", self.prefix, self.id);
        let at = utc_to_local(Utc::now(), ctx.tz);
        let limit = usize::try_from(ctx.args.bare_rows)?.min(self.ids.len());
        let mut latency = Vec::with_capacity(limit);
        let started = Instant::now();
        for id in &self.ids[..limit] {
            let t = Instant::now();
            let done = sqlx::query(&sql)
                .bind(&self.value)
                .bind(at)
                .bind(id)
                .execute(&mut self.conn)
                .await
                .context("bare single-row UPDATE")?;
            anyhow::ensure!(done.rows_affected() == 1, "bare row {id} was not empty");
            latency.push(t.elapsed());
            if started.elapsed() >= ctx.args.bare_time {
                break;
            }
        }
        let elapsed = started.elapsed();
        latency.sort_unstable();
        Ok(BareRun {
            rows: latency.len() as u64,
            elapsed,
            latency,
        })
    }

    /// The same UPDATE with `IN (batch ids)`, autocommit, over all copied rows.
    async fn batched(&mut self, ctx: &Ctx<'_>, batch: u32) -> anyhow::Result<BareRun> {
        let at = utc_to_local(Utc::now(), ctx.tz);
        let mut latency = Vec::new();
        let mut rows = 0;
        let started = Instant::now();
        for chunk in self.ids.chunks(batch as usize) {
            let sql = format!(
                "{}{} IN ({})",
                self.prefix,
                self.id,
                vec!["?"; chunk.len()].join(",")
            );
            let mut q = sqlx::query(&sql).bind(&self.value).bind(at);
            for id in chunk {
                q = q.bind(id);
            }
            let t = Instant::now();
            rows += q
                .execute(&mut self.conn)
                .await
                .context("bare IN UPDATE")?
                .rows_affected();
            latency.push(t.elapsed());
        }
        let elapsed = started.elapsed();
        latency.sort_unstable();
        Ok(BareRun {
            rows,
            elapsed,
            latency,
        })
    }

    /// Empties the scratch marks again.
    async fn reset(&mut self) -> anyhow::Result<()> {
        sqlx::raw_sql(&format!(
            "UPDATE bench_bare_mark SET {s} = NULL, {p} = NULL",
            s = self.status,
            p = self.processed
        ))
        .execute(&mut self.conn)
        .await
        .context("resetting the bare table")?;
        Ok(())
    }

    async fn drop_table(mut self) -> anyhow::Result<()> {
        sqlx::raw_sql("DROP TABLE IF EXISTS bench_bare_mark")
            .execute(&mut self.conn)
            .await
            .context("dropping the bare table")?;
        self.conn
            .close()
            .await
            .context("closing the bare connection")
    }
}

/// The real sweeps.
struct SweepRun {
    sweeps: u64,
    marked: u64,
    elapsed: Duration,
    /// Per sweep, ascending.
    took: Vec<Duration>,
    /// Inbox rows carrying the mark value afterwards.
    inbox_marked: i64,
    /// `PROC_STATE` rows confirmed afterwards.
    confirmed: i64,
}

/// Phase 3: `sweep_once` until nothing is due.
async fn sweep_phase(ctx: &Ctx<'_>) -> anyhow::Result<SweepRun> {
    let clock = SystemClock;
    let mut took = Vec::new();
    let mut marked = 0;
    let started = Instant::now();
    loop {
        let r = sweep_once(ctx.inbox, ctx.store, &clock, ctx.cfg)
            .await
            .context("sweep")?;
        anyhow::ensure!(
            r.transient() == 0 && r.missing.is_empty(),
            "unexpected sweep outcome: {} transient ({:?}), {} missing",
            r.transient(),
            r.transient_error,
            r.missing.len()
        );
        if r.selected == 0 {
            break;
        }
        marked += r.marked + r.already_marked;
        took.push(r.took);
    }
    let elapsed = started.elapsed();
    took.sort_unstable();
    let n = ctx.names;
    let inbox_marked: i64 = sqlx::query_scalar(&format!(
        "SELECT COUNT(*) FROM {t} WHERE {s} = ?",
        t = n.table,
        s = n.status
    ))
    .bind(&ctx.cfg.mark_value)
    .fetch_one(ctx.inbox.pool())
    .await
    .context("counting marks")?;
    let confirmed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM proc_state WHERE backfill_at IS NOT NULL")
            .fetch_one(ctx.store.pool())
            .await
            .context("counting confirmations")?;
    anyhow::ensure!(
        u64::try_from(inbox_marked).ok() == Some(ctx.args.rows)
            && u64::try_from(confirmed).ok() == Some(ctx.args.rows),
        "after the sweeps: {inbox_marked} inbox rows marked, {confirmed} confirmed, expected {}",
        ctx.args.rows
    );
    Ok(SweepRun {
        sweeps: took.len() as u64,
        marked,
        elapsed,
        took,
        inbox_marked,
        confirmed,
    })
}

/// Phase 4 totals.
#[derive(Default)]
struct Stages {
    rows: u64,
    sweeps: u32,
    elapsed: Duration,
    select_lock: Duration,
    check: Duration,
    update: Duration,
    write_back: Duration,
    backlog: Duration,
}

/// Phase 4: the first `--sample` rows unmarked again in both stores, then swept with the same
/// calls `sweep_once` makes, each stage timed.
async fn stage_phase(ctx: &Ctx<'_>, first: i64) -> anyhow::Result<Stages> {
    let sample = ctx.args.sample.min(ctx.args.rows);
    if sample == 0 {
        return Ok(Stages::default());
    }
    let last = first + i64::try_from(sample)? - 1;
    unmark_sample(ctx, first, last).await?;
    checkpoint(ctx.store.pool()).await;
    let mut s = Stages::default();
    let started = Instant::now();
    while sweep_timed(ctx, &mut s).await? {}
    s.elapsed = started.elapsed();
    Ok(s)
}

/// `first..=last` unconfirmed in the store and unmarked in the inbox again.
async fn unmark_sample(ctx: &Ctx<'_>, first: i64, last: i64) -> anyhow::Result<()> {
    let now = Utc::now();
    sqlx::query(
        "UPDATE proc_state SET backfill_at = NULL, backfill_next_at = $3 \
         WHERE msg_id BETWEEN $1 AND $2",
    )
    .bind(first)
    .bind(last)
    .bind(now)
    .execute(ctx.store.pool())
    .await
    .context("unconfirming the sample")?;
    let n = ctx.names;
    sqlx::query(&format!(
        "UPDATE {t} SET {s} = NULL, {p} = NULL WHERE {id} BETWEEN ? AND ?",
        t = n.table,
        s = n.status,
        p = n.processed,
        id = n.id
    ))
    .bind(first)
    .bind(last)
    .execute(ctx.inbox.pool())
    .await
    .context("unmarking the sample (bench database, as the DB owner)")?;
    Ok(())
}

/// One sweep with the calls `sweep_once` makes, each stage timed into `s`; false when nothing
/// was due.
async fn sweep_timed(ctx: &Ctx<'_>, s: &mut Stages) -> anyhow::Result<bool> {
    let now = SystemClock.now();
    let t = Instant::now();
    let mut tx = ctx
        .store
        .begin_sweep(
            now,
            overdue_before(now, ctx.cfg.rules.overdue_after),
            ctx.cfg.batch,
        )
        .await?;
    s.select_lock += t.elapsed();
    let ids: Vec<i64> = tx.rows().iter().map(|r| r.msg_id).collect();
    if ids.is_empty() {
        tx.finish(&SweepWrite::default(), now).await?;
        return Ok(false);
    }
    let t = Instant::now();
    let found = ctx.inbox.mark_states(&ctx.cfg.marks, &ids).await?;
    s.check += t.elapsed();
    let checked = classify(&ids, found);
    let t = Instant::now();
    // As the sweep does: the UPDATE in an inbox transaction, the lock re-checked in
    // PostgreSQL, then the inbox COMMIT.
    let staged = ctx
        .inbox
        .stage_marks(
            &ctx.cfg.marks,
            &checked.to_mark,
            &ctx.cfg.mark_value,
            now,
            ctx.cfg.budget,
            ctx.cfg.avoid,
        )
        .await?;
    tx.held(&checked.to_mark).await?;
    let written = staged
        .commit(msgx_core::backfill::sweep::MARK_COMMIT_LIMIT)
        .await?;
    s.update += t.elapsed();
    anyhow::ensure!(
        written as usize == checked.to_mark.len(),
        "stage replay wrote {written} of {} marks",
        checked.to_mark.len()
    );
    let t = Instant::now();
    let write = SweepWrite {
        confirmed: ids.clone(),
        ..SweepWrite::default()
    };
    tx.finish(&write, now).await?;
    s.write_back += t.elapsed();
    let t = Instant::now();
    ctx.store.backfill_backlog().await?;
    s.backlog += t.elapsed();
    s.rows += ids.len() as u64;
    s.sweeps += 1;
    Ok(true)
}

/// One steady run.
struct Steady {
    woken: bool,
    wake_gap: Duration,
    period: Duration,
    rows: u64,
    duration: Duration,
    /// Oldest unmarked age, sampled every 250 ms, ascending.
    oldest: Vec<Duration>,
    oldest_max: Duration,
    /// `BACKFILL_AT − TERMINAL_AT` of the rows marked, ascending.
    lag: Vec<Duration>,
    /// Rows still unmarked when the run ended.
    unmarked_at_end: i64,
}

impl Steady {
    fn label(&self) -> String {
        if self.woken {
            format!(
                "woken per row, gap {}",
                humantime::format_duration(self.wake_gap)
            )
        } else {
            format!("period {} only", humantime::format_duration(self.period))
        }
    }
}

/// Phase 5: terminal rows `first..` appear at `steady_rate`/s for `steady` while the real
/// actor sweeps (in its own arbiter).
async fn steady_phase(ctx: &Ctx<'_>, first: i64, rows: u64, woken: bool) -> anyhow::Result<Steady> {
    let clock: SharedClock = Arc::new(SystemClock);
    let arbiter = actix::Arbiter::new();
    let sweeper = BackfillSweeper::new(
        ctx.inbox.clone(),
        ctx.store.clone(),
        clock.clone(),
        ctx.cfg.clone(),
        ctx.period,
    )
    .with_wake_gap(DEFAULT_WAKE_GAP);
    let addr = BackfillSweeper::start_in_arbiter(&arbiter.handle(), |_| sweeper);
    // Let the first sweep (at start, nothing due) pass.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let stop = Arc::new(AtomicBool::new(false));
    let sampler = spawn_oldest_sampler(ctx.store.clone(), stop.clone());
    let end = first + i64::try_from(rows)?;
    let duration = offer_terminal(ctx, &addr, first, end, woken).await?;
    stop.store(true, Ordering::SeqCst);
    let mut oldest = sampler.await.context("sampler")?;
    arbiter.stop();
    drop(addr);
    oldest.sort_unstable();
    let oldest_max = oldest.last().copied().unwrap_or_default();
    let (lag, unmarked_at_end) = marked_lag(ctx, first, end).await?;
    Ok(Steady {
        woken,
        wake_gap: DEFAULT_WAKE_GAP,
        period: ctx.period,
        rows,
        duration,
        oldest,
        oldest_max,
        lag,
        unmarked_at_end,
    })
}

/// The oldest unmarked age every 250 ms until `stop`.
fn spawn_oldest_sampler(
    store: Store,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<Duration>> {
    actix_rt::spawn(async move {
        let mut samples = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(250)).await;
            if let Ok(b) = store.backfill_backlog().await {
                let age = b
                    .oldest
                    .and_then(|t| (Utc::now() - t).to_std().ok())
                    .unwrap_or_default();
                samples.push(age);
            }
        }
        samples
    })
}

/// Rows `first..end` become terminal at `steady_rate`/s (waking the sweeper per row when
/// `woken`); returns how long that took.
async fn offer_terminal(
    ctx: &Ctx<'_>,
    addr: &actix::Addr<BackfillSweeper>,
    first: i64,
    end: i64,
    woken: bool,
) -> anyhow::Result<Duration> {
    // 100 ms ticks of rate/10 rows each, on the wall clock (no drift).
    let per_tick = (ctx.args.steady_rate / 10).max(1);
    let started = Instant::now();
    let mut next = first;
    let mut tick = 0u32;
    while next < end {
        let due = started + Duration::from_millis(100) * tick;
        tokio::time::sleep_until(due.into()).await;
        let last = (next + i64::try_from(per_tick)? - 1).min(end - 1);
        insert_terminal(ctx.store, (next, last), Utc::now(), false).await?;
        if woken {
            for id in next..=last {
                addr.do_send(TerminalCommitted { msg_id: id });
            }
        }
        next = last + 1;
        tick += 1;
    }
    Ok(started.elapsed())
}

/// `BACKFILL_AT − TERMINAL_AT` of the rows `first..end` marked (ascending), and how many are
/// still unmarked.
async fn marked_lag(ctx: &Ctx<'_>, first: i64, end: i64) -> anyhow::Result<(Vec<Duration>, i64)> {
    let lag_ms: Vec<f64> = sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM (backfill_at - terminal_at))::float8 * 1000 \
         FROM proc_state WHERE msg_id >= $1 AND msg_id < $2 AND backfill_at IS NOT NULL",
    )
    .bind(first)
    .bind(end)
    .fetch_all(ctx.store.pool())
    .await
    .context("reading the per-row lag")?;
    let mut lag: Vec<Duration> = lag_ms
        .into_iter()
        .map(|ms| Duration::from_secs_f64(ms.max(0.0) / 1000.0))
        .collect();
    lag.sort_unstable();
    let unmarked_at_end: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM proc_state WHERE msg_id >= $1 AND msg_id < $2 AND backfill_at IS NULL",
    )
    .bind(first)
    .bind(end)
    .fetch_one(ctx.store.pool())
    .await
    .context("counting unmarked rows")?;
    Ok((lag, unmarked_at_end))
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

/// The printed report.
fn print_report(ctx: &Ctx<'_>, batch: u32, m: &Measured) {
    let single = rate(
        m.single_before.rows + m.single_after.rows,
        m.single_before.elapsed + m.single_after.elapsed,
    );
    println!(
        "  bare single UPDATE    : {single:.0} rows/s  (before the sweeps {:.0}, after {:.0}; \
         autocommit, `WHERE id = ? AND <empty mark>`, one connection; p50 {} p99 {})",
        m.single_before.rate(),
        m.single_after.rate(),
        ms(percentile(&m.single_before.latency, 0.50)),
        ms(percentile(&m.single_before.latency, 0.99)),
    );
    println!(
        "  bare IN ({batch}) UPDATE : {:.0} rows/s  ({} statements, p50 {} p99 {})",
        m.batched.rate(),
        m.batched.latency.len(),
        ms(percentile(&m.batched.latency, 0.50)),
        ms(percentile(&m.batched.latency, 0.99)),
    );
    let s = &m.sweeps;
    let marks = rate(s.marked, s.elapsed);
    println!(
        "  sweep_once            : {marks:.0} marks/s = {:.1}× the bare single-row rate \
         ({:.0}% of bare IN)   {} rows in {:.2}s, {} sweeps, sweep p50 {} p99 {} max {}",
        marks / single.max(1e-9),
        100.0 * marks / m.batched.rate().max(1e-9),
        s.marked,
        s.elapsed.as_secs_f64(),
        s.sweeps,
        ms(percentile(&s.took, 0.50)),
        ms(percentile(&s.took, 0.99)),
        ms(s.took.last().copied().unwrap_or_default()),
    );
    println!(
        "  verified              : {} inbox rows carry `{}`, {} PROC_STATE rows confirmed",
        s.inbox_marked, ctx.cfg.mark_value, s.confirmed
    );
    let st = &m.stages;
    if st.sweeps > 0 {
        let per = |d: Duration| ms(d / st.sweeps);
        println!(
            "  where the time goes   : {} rows again, {:.0} marks/s; per sweep: select+lock {} \
             + existence check {} + UPDATE {} + write-back+commit {} (+ backlog gauge {}, at most \
             1/s while draining)",
            st.rows,
            rate(st.rows, st.elapsed),
            per(st.select_lock),
            per(st.check),
            per(st.update),
            per(st.write_back),
            per(st.backlog),
        );
    }
    for r in &m.steady {
        println!(
            "  steady {}/s ({}) : {} rows over {:.0}s; oldest unmarked max {:.1}s (sampled p50 \
             {:.1}s p99 {:.1}s); per-row lag terminal→mark p50 {:.2}s p99 {:.2}s max {:.2}s; {} \
             unmarked at the end",
            ctx.args.steady_rate,
            r.label(),
            r.rows,
            r.duration.as_secs_f64(),
            r.oldest_max.as_secs_f64(),
            percentile(&r.oldest, 0.50).as_secs_f64(),
            percentile(&r.oldest, 0.99).as_secs_f64(),
            percentile(&r.lag, 0.50).as_secs_f64(),
            percentile(&r.lag, 0.99).as_secs_f64(),
            r.lag.last().copied().unwrap_or_default().as_secs_f64(),
            r.unmarked_at_end,
        );
    }
}

/// A duration as milliseconds with one decimal.
fn ms(d: Duration) -> String {
    format!("{:.1}ms", d.as_secs_f64() * 1e3)
}
