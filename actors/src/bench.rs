//! `msgexchange bench enqueue`: poller enqueue throughput over a large backlog, printed next to
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
//! 5. where the time goes: the queue is emptied, W rewound, and the rounds replayed with the
//!    same calls `poll_once` makes, each step timed apart; then once more with the rows made in
//!    memory, which leaves the store side of a round alone.

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use clap::Args;
use msgx_core::clock::{Clock, SystemClock};
use msgx_core::devtools::fixture;
use msgx_core::inbox::names::InboxNames;
use msgx_core::inbox::time::utc_to_local;
use msgx_core::inbox::{Inbox, InboxRow};
use msgx_core::poller::{poll_once, PollConfig};
use msgx_core::settings::{redact_url, Settings};
use msgx_core::store::{EnqueueRow, RoundWrite, Store};
use msgx_core::watermark::Cursor;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::postgres::{PgConnectOptions, PgPool};
use sqlx::{ConnectOptions, Connection};

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

/// Rows per inbox load statement (fewer when the messages are large, see `load_inbox`).
const LOAD_ROWS_PER_STATEMENT: u64 = 2_000;
/// Load statements per inbox transaction.
const LOAD_STATEMENTS_PER_TX: u64 = 10;
/// Concurrent inbox load connections.
const LOAD_CONNECTIONS: usize = 4;
/// Bytes of bound data per load statement, well under the default 16 MiB `max_allowed_packet`.
const LOAD_BYTES_PER_STATEMENT: u64 = 4 * 1024 * 1024;
/// Rows per plain `VALUES` statement (2 parameters a row; PostgreSQL allows 65 535).
const VALUES_ROWS_PER_STATEMENT: u32 = 16_000;

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

    let dbs = BenchDbs::new(settings, &format!("msgx_bench_{}", std::process::id()))?;
    // Refuse leftovers (an earlier `--keep` run with the same pid): "fresh" means fresh, and
    // the clean-up below must only ever drop what this run created.
    dbs.ensure_absent().await?;

    let result = run(settings, args, claim_batch, &dbs).await;
    if args.keep {
        println!(
            "  kept                  : {} and {}",
            redact_url(&dbs.inbox_url),
            redact_url(&dbs.store_url)
        );
        return result;
    }
    let dropped = dbs.drop_all().await;
    match (result, dropped) {
        (Err(e), Err(d)) => {
            eprintln!(
                "msgexchange: also failed to drop the bench databases `{}`: {d:#}",
                dbs.name
            );
            Err(e)
        }
        (Err(e), Ok(())) => Err(e),
        (Ok(()), dropped) => dropped,
    }
}

/// The bench's own databases, on the configured servers.
#[derive(Debug)]
struct BenchDbs {
    /// `msgx_bench_<pid>`, in both servers.
    name: String,
    /// The configured inbox URL with the database replaced.
    inbox_url: String,
    /// The configured store URL with the database replaced.
    store_url: String,
}

impl BenchDbs {
    fn new(settings: &Settings, name: &str) -> anyhow::Result<Self> {
        let inbox_url = with_database(&settings.inbox.url, name).with_context(|| {
            format!(
                "deriving the bench inbox URL from inbox.url `{}`",
                redact_url(&settings.inbox.url)
            )
        })?;
        let store_url = with_database(&settings.store.url, name).with_context(|| {
            format!(
                "deriving the bench store URL from store.url `{}`",
                redact_url(&settings.store.url)
            )
        })?;
        // The drivers must read the name back exactly as written.
        let inbox_db = MySqlConnectOptions::from_str(&inbox_url)
            .with_context(|| format!("parsing {}", redact_url(&inbox_url)))?
            .get_database()
            .map(str::to_string);
        let store_db = PgConnectOptions::from_str(&store_url)
            .with_context(|| format!("parsing {}", redact_url(&store_url)))?
            .get_database()
            .map(str::to_string);
        anyhow::ensure!(
            inbox_db.as_deref() == Some(name) && store_db.as_deref() == Some(name),
            "derived bench URLs do not name `{name}`: {} / {}",
            redact_url(&inbox_url),
            redact_url(&store_url)
        );
        Ok(Self {
            name: name.to_string(),
            inbox_url,
            store_url,
        })
    }

    /// A server-level MySQL connection (no database selected).
    async fn mysql_admin(&self) -> anyhow::Result<MySqlConnection> {
        MySqlConnectOptions::from_str(&self.inbox_url)
            .context("parsing the bench inbox URL")?
            .database("")
            .disable_statement_logging()
            .connect()
            .await
            .with_context(|| {
                format!(
                    "connecting to the inbox server {}",
                    redact_url(&self.inbox_url)
                )
            })
    }

    /// A connection to the PostgreSQL maintenance database `postgres`.
    async fn pg_admin(&self) -> anyhow::Result<sqlx::PgConnection> {
        PgConnectOptions::from_str(&self.store_url)
            .context("parsing the bench store URL")?
            .database("postgres")
            .disable_statement_logging()
            .connect()
            .await
            .with_context(|| {
                format!(
                    "connecting to the maintenance database `postgres` on {}",
                    redact_url(&self.store_url)
                )
            })
    }

    /// Fails when either database already exists.
    async fn ensure_absent(&self) -> anyhow::Result<()> {
        let mut my = self.mysql_admin().await?;
        let in_mysql: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?",
        )
        .bind(&self.name)
        .fetch_one(&mut my)
        .await
        .context("looking for a leftover bench inbox database")?;
        my.close()
            .await
            .context("closing the inbox admin connection")?;
        let mut pg = self.pg_admin().await?;
        let in_pg: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
                .bind(&self.name)
                .fetch_one(&mut pg)
                .await
                .context("looking for a leftover bench store database")?;
        pg.close()
            .await
            .context("closing the store admin connection")?;
        anyhow::ensure!(
            in_mysql == 0 && !in_pg,
            "database `{}` already exists (a `--keep` leftover?); drop it first",
            self.name
        );
        Ok(())
    }

    /// Drops both databases (if they exist); tries both even when the first fails.
    async fn drop_all(&self) -> anyhow::Result<()> {
        let pg = async {
            let mut pg = self.pg_admin().await?;
            let quoted = format!("\"{}\"", self.name.replace('"', "\"\""));
            sqlx::query(&format!("DROP DATABASE IF EXISTS {quoted} WITH (FORCE)"))
                .execute(&mut pg)
                .await
                .with_context(|| format!("dropping the store database `{}`", self.name))?;
            pg.close()
                .await
                .context("closing the store admin connection")
        }
        .await;
        let my = async {
            let mut my = self.mysql_admin().await?;
            let quoted = format!("`{}`", self.name.replace('`', "``"));
            sqlx::query(&format!("DROP DATABASE IF EXISTS {quoted}"))
                .execute(&mut my)
                .await
                .with_context(|| format!("dropping the inbox database `{}`", self.name))?;
            my.close()
                .await
                .context("closing the inbox admin connection")
        }
        .await;
        pg.and(my)
    }
}

/// Everything between creating and dropping the databases.
async fn run(
    settings: &Settings,
    args: &EnqueueBenchArgs,
    claim_batch: u32,
    dbs: &BenchDbs,
) -> anyhow::Result<()> {
    let async_commit = settings.pipeline.async_enqueue_commit;
    let names = settings.inbox_names()?;
    let tz = settings.inbox_timezone()?;
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
    fixture::create_inbox_fixture(&dbs.inbox_url, &names, &settings.outbox_names()?)
        .await
        .with_context(|| {
            format!(
                "creating the inbox fixture at {}",
                redact_url(&dbs.inbox_url)
            )
        })?;
    let load = load_inbox(&dbs.inbox_url, &names, tz, args.rows, args.msg_bytes).await?;
    println!(
        "  inbox load            : {} rows in {:.1}s ({:.0} rows/s, ids {}..={})",
        args.rows,
        load.elapsed.as_secs_f64(),
        rate(args.rows, load.elapsed),
        load.min_id,
        load.max_id
    );

    // 2. The store and the inbox adapter, exactly as the service builds them.
    let mut store_settings = settings.store.clone();
    store_settings.url = dbs.store_url.clone();
    store_settings.create_database = true;
    let store = Store::connect(&store_settings)
        .await
        .with_context(|| format!("opening the bench store at {}", redact_url(&dbs.store_url)))?;
    let mut inbox_settings = settings.inbox.clone();
    inbox_settings.url = dbs.inbox_url.clone();
    let inbox =
        Inbox::new(&inbox_settings, &names, tz).context("building the bench inbox adapter")?;

    let outcome = measure(&inbox, &store, settings, args, claim_batch, &load).await;
    // Close the pools before the databases are dropped.
    store.pool().close().await;
    inbox.pool().close().await;
    let m = outcome?;

    let sync_note = if async_commit {
        "SET LOCAL synchronous_commit = off"
    } else {
        "synchronous_commit as configured on the server"
    };
    let unnest_rate = rate(2 * args.rows, m.bare_unnest_before + m.bare_unnest_after);
    println!(
        "  bare PG UNNEST insert : {unnest_rate:.0} rows/s  (before the poller {:.0}, after {:.0}; \
         {claim_batch} rows per tx, {sync_note})",
        rate(args.rows, m.bare_unnest_before),
        rate(args.rows, m.bare_unnest_after),
    );
    let values_rate = rate(args.rows, m.bare_values);
    println!(
        "  bare PG VALUES insert : {values_rate:.0} rows/s  (same transactions, before the poller)"
    );
    let poll_rate = rate(args.rows, m.poll.elapsed);
    let mut sorted = m.poll.latencies.clone();
    sorted.sort_unstable();
    println!(
        "  poller enqueue        : {:.0} rows/s  ({:.1}% of bare UNNEST, {:.1}% of bare VALUES)   \
         rounds {}, round p50 {} p99 {} max {}",
        poll_rate,
        100.0 * poll_rate / unnest_rate,
        100.0 * poll_rate / values_rate,
        sorted.len(),
        ms(percentile(&sorted, 0.50)),
        ms(percentile(&sorted, 0.99)),
        ms(sorted.last().copied().unwrap_or_default()),
    );
    println!(
        "  poller detail         : {} rows in {:.1}s, {} newly enqueued, proc_state holds {}",
        args.rows,
        m.poll.elapsed.as_secs_f64(),
        m.poll.enqueued_new,
        m.poll.proc_state_rows
    );
    let b = &m.breakdown;
    let per_round = |d: Duration, rounds: u32| ms(d / rounds.max(1));
    println!(
        "  round breakdown       : replay {:.0} rows/s; per round read_cursor {} + rows_after {} \
         + commit_round {} + max_id {} = {}",
        rate(args.rows, b.elapsed),
        per_round(b.read_cursor, b.rounds),
        per_round(b.rows_after, b.rounds),
        per_round(b.commit_round, b.rounds),
        per_round(b.max_id, b.rounds),
        per_round(
            b.read_cursor + b.rows_after + b.commit_round + b.max_id,
            b.rounds
        ),
    );
    let st = &m.store_side;
    let bare_txs = u32::try_from(args.rows.div_ceil(u64::from(claim_batch))).unwrap_or(u32::MAX);
    println!(
        "  store side alone      : replay {:.0} rows/s; per round read_cursor {} + commit_round {} = {} \
         (bare UNNEST tx {}; rows made in memory, no inbox reads)",
        rate(args.rows, st.elapsed),
        per_round(st.read_cursor, st.rounds),
        per_round(st.commit_round, st.rounds),
        per_round(st.read_cursor + st.commit_round, st.rounds),
        ms((m.bare_unnest_before + m.bare_unnest_after) / bare_txs.max(1).saturating_mul(2)),
    );
    let rss: Vec<String> = m
        .poll
        .rss
        .iter()
        .map(|(label, mib)| match mib {
            Some(v) => format!("{label} {v:.1}"),
            None => format!("{label} n/a"),
        })
        .collect();
    println!("  RSS MiB               : {}", rss.join(", "));
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
    /// The poller phase.
    poll: PollPhase,
    /// The timed replay of the rounds.
    breakdown: Breakdown,
    /// The timed replay of the rounds' store side alone (rows made in memory).
    store_side: Breakdown,
}

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
    let bare = |shape| bare_phase(pool, shape, args.rows, claim_batch, async_commit);
    let bare_unnest_before = bare(BareShape::Unnest).await?;
    let bare_values = bare(BareShape::Values).await?;
    checkpoint(pool).await;
    let cfg = PollConfig {
        claim_batch,
        ..crate::app::poll_config(&settings.pipeline)
    };
    let poll = poll_phase(inbox, store, cfg, load).await?;
    // Measured again after the poller: the two bracket it, so drift during the run shows.
    let bare_unnest_after = bare(BareShape::Unnest).await?;
    let breakdown = round_breakdown(inbox, store, cfg, load, true).await?;
    let store_side = round_breakdown(inbox, store, cfg, load, false).await?;
    Ok(Measured {
        bare_unnest_before,
        bare_unnest_after,
        bare_values,
        poll,
        breakdown,
        store_side,
    })
}

/// The loaded backlog.
#[derive(Debug)]
struct Loaded {
    /// Load wall time.
    elapsed: Duration,
    /// Lowest inbox id.
    min_id: i64,
    /// Highest inbox id (the poller is done when W reaches it).
    max_id: i64,
}

/// Bulk-loads `rows` inbox rows on a few connections and checks the ids are contiguous.
async fn load_inbox(
    url: &str,
    names: &InboxNames,
    tz: Tz,
    rows: u64,
    msg_bytes: usize,
) -> anyhow::Result<Loaded> {
    let options = MySqlConnectOptions::from_str(url)
        .context("parsing the bench inbox URL")?
        .disable_statement_logging();
    let per_statement =
        (LOAD_BYTES_PER_STATEMENT / (msg_bytes as u64 + 64)).clamp(1, LOAD_ROWS_PER_STATEMENT);
    let filler = filler_message(msg_bytes);
    let next = AtomicU64::new(0);
    let job = LoadJob {
        options: &options,
        names,
        tz,
        total: rows,
        per_statement,
        per_tx: per_statement * LOAD_STATEMENTS_PER_TX,
        filler: &filler,
        next: &next,
    };
    let started = Instant::now();
    futures::future::try_join_all((0..LOAD_CONNECTIONS).map(|_| job.worker()))
        .await
        .context("loading the inbox backlog")?;
    let elapsed = started.elapsed();

    let mut conn = options
        .connect()
        .await
        .context("connecting to the bench inbox")?;
    let (count, min_id, max_id): (i64, Option<i64>, Option<i64>) = sqlx::query_as(&format!(
        "SELECT COUNT(*), MIN({id}), MAX({id}) FROM {t}",
        id = names.id,
        t = names.table
    ))
    .fetch_one(&mut conn)
    .await
    .context("counting the loaded inbox rows")?;
    conn.close().await.context("closing the inbox connection")?;
    let (Some(min_id), Some(max_id)) = (min_id, max_id) else {
        anyhow::bail!("the inbox is empty after loading {rows} rows");
    };
    // A gap would be a hole to the poller, held for max_commit_delay: say so instead.
    anyhow::ensure!(
        u64::try_from(count).ok() == Some(rows) && max_id - min_id + 1 == count,
        "loaded ids are not contiguous: {count} rows, ids {min_id}..={max_id} (expected {rows}; \
         check auto_increment_increment / innodb_autoinc_lock_mode)"
    );
    Ok(Loaded {
        elapsed,
        min_id,
        max_id,
    })
}

/// What every load worker shares.
struct LoadJob<'a> {
    /// The bench inbox connection options.
    options: &'a MySqlConnectOptions,
    /// Table and columns.
    names: &'a InboxNames,
    /// Zone of the DATETIME column.
    tz: Tz,
    /// Rows to load in all.
    total: u64,
    /// Rows per statement.
    per_statement: u64,
    /// Rows per transaction.
    per_tx: u64,
    /// The message text of every row.
    filler: &'a str,
    /// Next row number to hand out (a transaction's worth at a time).
    next: &'a AtomicU64,
}

impl LoadJob<'_> {
    fn insert_sql(&self, rows: u64) -> String {
        let mut sql = format!(
            "INSERT INTO {} ({}, {}) VALUES ",
            self.names.table, self.names.received, self.names.message
        );
        for i in 0..rows {
            sql.push_str(if i == 0 { "(?,?)" } else { ",(?,?)" });
        }
        sql
    }

    /// One connection: takes a transaction's worth of rows at a time until none are left.
    async fn worker(&self) -> anyhow::Result<()> {
        let mut conn = self
            .options
            .connect()
            .await
            .context("connecting a load connection")?;
        let full_sql = self.insert_sql(self.per_statement);
        loop {
            let start = self.next.fetch_add(self.per_tx, Ordering::Relaxed);
            if start >= self.total {
                break;
            }
            let end = (start + self.per_tx).min(self.total);
            let mut tx = conn.begin().await.context("BEGIN")?;
            let mut at = start;
            while at < end {
                let n = (end - at).min(self.per_statement);
                let partial_sql;
                let sql = if n == self.per_statement {
                    full_sql.as_str()
                } else {
                    partial_sql = self.insert_sql(n);
                    partial_sql.as_str()
                };
                let received = utc_to_local(Utc::now(), self.tz);
                let mut query = sqlx::query(sql);
                for _ in 0..n {
                    query = query.bind(received).bind(self.filler);
                }
                query
                    .execute(&mut *tx)
                    .await
                    .with_context(|| format!("inserting inbox rows {}..{}", at + 1, at + n))?;
                at += n;
            }
            tx.commit().await.context("COMMIT")?;
        }
        conn.close().await.context("closing a load connection")
    }
}

/// A message-like filler of exactly `bytes` ASCII bytes (the poller never reads it; it only
/// makes the inbox rows as wide as real ones).
fn filler_message(bytes: usize) -> String {
    const HEAD: &str = "ZCZC BENCH MSGX ";
    let mut s: String = HEAD.chars().take(bytes).collect();
    let body = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ";
    while s.len() < bytes {
        let take = (bytes - s.len()).min(body.len());
        s.push_str(&body[..take]);
    }
    s
}

/// The two bare statement shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BareShape {
    /// The poller's statement: `INSERT … SELECT … FROM UNNEST($1, $2)`.
    Unnest,
    /// A plain multi-row `INSERT … VALUES (…),(…)`.
    Values,
}

/// `rows` rows in transactions of `batch` rows, like the poller's rounds (without the cursor
/// update and the inbox reads); returns the wall time.
async fn bare_insert(
    pool: &PgPool,
    shape: BareShape,
    rows: u64,
    batch: u32,
    async_commit: bool,
) -> anyhow::Result<Duration> {
    let unnest_sql = "INSERT INTO bench_bare (msg_id, received_at, enqueued_at, source, state) \
                      SELECT id, recv, $3, 'POLL', 'PENDING' \
                      FROM UNNEST($1::bigint[], $2::timestamptz[]) AS r(id, recv) \
                      ON CONFLICT (msg_id) DO NOTHING";
    let per_statement = batch.min(VALUES_ROWS_PER_STATEMENT);
    let full_values_sql = values_sql(per_statement as usize);
    let started = Instant::now();
    let mut next: u64 = 1;
    while next <= rows {
        let n = (rows - next + 1).min(u64::from(batch));
        let now = Utc::now();
        let first = i64::try_from(next).context("row number overflow")?;
        let last = i64::try_from(next + n).context("row number overflow")?;
        let ids: Vec<i64> = (first..last).collect();
        // Spread the receive times a little, as real ones are.
        let received: Vec<Option<DateTime<Utc>>> = ids
            .iter()
            .map(|id| Some(now - chrono::Duration::milliseconds(id % 1000)))
            .collect();
        let mut tx = pool.begin().await.context("BEGIN")?;
        if async_commit {
            sqlx::query("SET LOCAL synchronous_commit = off")
                .execute(&mut *tx)
                .await
                .context("SET LOCAL synchronous_commit")?;
        }
        let mut inserted = 0;
        match shape {
            BareShape::Unnest => {
                inserted += sqlx::query(unnest_sql)
                    .bind(&ids)
                    .bind(&received)
                    .bind(now)
                    .execute(&mut *tx)
                    .await
                    .context("INSERT … UNNEST")?
                    .rows_affected();
            }
            BareShape::Values => {
                for (chunk_ids, chunk_recv) in ids
                    .chunks(per_statement as usize)
                    .zip(received.chunks(per_statement as usize))
                {
                    let partial_sql;
                    let sql = if chunk_ids.len() == per_statement as usize {
                        full_values_sql.as_str()
                    } else {
                        partial_sql = values_sql(chunk_ids.len());
                        partial_sql.as_str()
                    };
                    let mut query = sqlx::query(sql).bind(now);
                    for (id, recv) in chunk_ids.iter().zip(chunk_recv) {
                        query = query.bind(*id).bind(*recv);
                    }
                    inserted += query
                        .execute(&mut *tx)
                        .await
                        .context("INSERT … VALUES")?
                        .rows_affected();
                }
            }
        }
        tx.commit().await.context("COMMIT")?;
        anyhow::ensure!(
            inserted == n,
            "bare insert wrote {inserted} of {n} rows at row {next}"
        );
        next += n;
    }
    Ok(started.elapsed())
}

/// `INSERT … VALUES` for `rows` rows: `$1` is the enqueue time, then `(id, received)` pairs.
fn values_sql(rows: usize) -> String {
    let mut sql = String::from(
        "INSERT INTO bench_bare (msg_id, received_at, enqueued_at, source, state) VALUES ",
    );
    for i in 0..rows {
        if i > 0 {
            sql.push(',');
        }
        sql.push_str(&format!(
            "(${}, ${}, $1, 'POLL', 'PENDING')",
            2 * i + 2,
            2 * i + 3
        ));
    }
    sql.push_str(" ON CONFLICT (msg_id) DO NOTHING");
    sql
}

/// One bare measurement in a fresh scratch copy of `proc_state` (same columns, defaults,
/// constraints and indexes), dropped afterwards so autovacuum of its rows cannot run during (and
/// slow down) a later phase.
async fn bare_phase(
    pool: &PgPool,
    shape: BareShape,
    rows: u64,
    batch: u32,
    async_commit: bool,
) -> anyhow::Result<Duration> {
    sqlx::query("CREATE TABLE bench_bare (LIKE proc_state INCLUDING ALL)")
        .execute(pool)
        .await
        .context("creating the scratch table bench_bare")?;
    checkpoint(pool).await;
    let took = bare_insert(pool, shape, rows, batch, async_commit)
        .await
        .with_context(|| format!("bare {shape:?} insert"))?;
    sqlx::query("DROP TABLE bench_bare")
        .execute(pool)
        .await
        .context("dropping the scratch table bench_bare")?;
    Ok(took)
}

/// Flushes dirty buffers between phases so one phase's writes are not paid by the next.
/// Best effort: needs superuser or `pg_checkpoint`; the bench stays valid without it.
async fn checkpoint(pool: &PgPool) {
    if let Err(e) = sqlx::query("CHECKPOINT").execute(pool).await {
        tracing::debug!(error = %e, "CHECKPOINT between bench phases refused; continuing");
    }
}

/// The poller phase.
#[derive(Debug)]
struct PollPhase {
    /// Wall time from the first round to W at the inbox head.
    elapsed: Duration,
    /// Wall time of every round.
    latencies: Vec<Duration>,
    /// Sum of the rounds' newly enqueued rows.
    enqueued_new: u64,
    /// `count(*)` of proc_state afterwards.
    proc_state_rows: i64,
    /// RSS samples: start, every 10 % of progress, end.
    rss: Vec<(String, Option<f64>)>,
}

/// `poll_once` until W reaches the inbox head.
async fn poll_phase(
    inbox: &Inbox,
    store: &Store,
    cfg: PollConfig,
    load: &Loaded,
) -> anyhow::Result<PollPhase> {
    let clock = SystemClock;
    let total = u64::try_from(load.max_id - load.min_id + 1).context("id range")?;
    let expected_rounds = total.div_ceil(u64::from(cfg.claim_batch)) as usize + 8;
    // Allocated up front so the samples themselves do not grow the RSS.
    let mut latencies: Vec<Duration> = Vec::with_capacity(expected_rounds);
    let mut rss: Vec<(String, Option<f64>)> = Vec::with_capacity(12);
    rss.push(("start".to_string(), rss_mib()));
    let mut enqueued_new: u64 = 0;
    let mut next_tenth: u64 = 1;
    let mut w = store
        .read_cursor()
        .await
        .context("reading the fresh cursor")?
        .cursor
        .w;
    let started = Instant::now();
    while w < load.max_id {
        let round_started = Instant::now();
        let report = poll_once(inbox, store, &clock, cfg)
            .await
            .with_context(|| format!("poll round {} at W={w}", latencies.len() + 1))?;
        latencies.push(round_started.elapsed());
        enqueued_new += report.enqueued_new;
        anyhow::ensure!(
            report.moved(),
            "W did not move from {w} in round {} (read {} rows, inbox head {}); the bench loads \
             contiguous ids, so this should not happen",
            latencies.len(),
            report.read,
            load.max_id
        );
        w = report.advance.w;
        let done = u64::try_from(w - load.min_id + 1).unwrap_or(0);
        while next_tenth <= 9 && done * 10 >= next_tenth * total {
            let sample = rss_mib();
            eprintln!(
                "bench enqueue: {:>3}% W={w} after {:.1}s, {} rounds, RSS {}",
                next_tenth * 10,
                started.elapsed().as_secs_f64(),
                latencies.len(),
                sample.map_or_else(|| "n/a".to_string(), |v| format!("{v:.1} MiB"))
            );
            rss.push((format!("{}%", next_tenth * 10), sample));
            next_tenth += 1;
        }
    }
    let elapsed = started.elapsed();
    rss.push(("end".to_string(), rss_mib()));
    let proc_state_rows = store
        .proc_state_count()
        .await
        .context("counting proc_state")?;
    anyhow::ensure!(
        u64::try_from(proc_state_rows).ok() == Some(total),
        "proc_state holds {proc_state_rows} rows after the run, expected {total}"
    );
    Ok(PollPhase {
        elapsed,
        latencies,
        enqueued_new,
        proc_state_rows,
        rss,
    })
}

/// Per-step wall time of the replayed rounds.
#[derive(Debug, Default)]
struct Breakdown {
    /// Replayed rounds.
    rounds: u32,
    /// Wall time of the whole replay.
    elapsed: Duration,
    /// `Store::read_cursor`.
    read_cursor: Duration,
    /// `Inbox::rows_after`.
    rows_after: Duration,
    /// `Store::commit_round` (BEGIN, SET LOCAL, INSERT … UNNEST, cursor UPDATE, COMMIT).
    commit_round: Duration,
    /// `Inbox::max_id` after a full batch.
    max_id: Duration,
}

/// Where a round's time goes: after the real run, empties the queue, rewinds W and replays the
/// rounds with the same public calls `poll_once` makes, in the same order, timing each apart
/// (the ids are contiguous, so the watermark rule reduces to "W = last id read"). Without
/// `read_inbox` the rows are made in memory instead: the store side of the rounds alone.
async fn round_breakdown(
    inbox: &Inbox,
    store: &Store,
    cfg: PollConfig,
    load: &Loaded,
    read_inbox: bool,
) -> anyhow::Result<Breakdown> {
    let pool = store.pool();
    sqlx::query("TRUNCATE proc_state")
        .execute(pool)
        .await
        .context("emptying proc_state for the replay")?;
    sqlx::query("UPDATE inbox_cursor SET w = $1, hole_since = NULL WHERE id = 1")
        .bind(load.min_id - 1)
        .execute(pool)
        .await
        .context("rewinding W for the replay")?;
    checkpoint(pool).await;

    let clock = SystemClock;
    let mut b = Breakdown::default();
    let started = Instant::now();
    let mut w = load.min_id - 1;
    while w < load.max_id {
        let t0 = Instant::now();
        let before = store
            .read_cursor()
            .await
            .context("replay: read_cursor")?
            .cursor;
        let t1 = Instant::now();
        let rows = if read_inbox {
            inbox
                .rows_after(before.w, cfg.claim_batch)
                .await
                .with_context(|| format!("replay: rows_after {}", before.w))?
        } else {
            synthetic_rows(
                before.w,
                i64::from(cfg.claim_batch).min(load.max_id - before.w),
            )
        };
        let t2 = Instant::now();
        let Some(last) = rows.last() else {
            anyhow::bail!(
                "replay: no inbox rows after {} below the head {}",
                before.w,
                load.max_id
            );
        };
        let enqueue: Vec<EnqueueRow> = rows
            .iter()
            .map(|r| EnqueueRow {
                msg_id: r.id,
                received_at: r.received_at,
            })
            .collect();
        store
            .commit_round(RoundWrite {
                expected_w: before.w,
                cursor: Cursor {
                    w: last.id,
                    hole_since: None,
                },
                rows: &enqueue,
                now: clock.now(),
                async_commit: cfg.async_commit,
            })
            .await
            .context("replay: commit_round")?;
        let t3 = Instant::now();
        if read_inbox && rows.len() >= cfg.claim_batch as usize {
            inbox.max_id().await.context("replay: max_id")?;
        }
        let t4 = Instant::now();
        b.read_cursor += t1 - t0;
        b.rows_after += t2 - t1;
        b.commit_round += t3 - t2;
        b.max_id += t4 - t3;
        b.rounds += 1;
        w = last.id;
    }
    b.elapsed = started.elapsed();
    Ok(b)
}

/// The inbox rows `after+1 ..= after+n` as `rows_after` would return them, made in memory.
fn synthetic_rows(after: i64, n: i64) -> Vec<InboxRow> {
    let now = Utc::now();
    (after + 1..=after + n)
        .map(|id| InboxRow {
            id,
            received_at: Some(now - chrono::Duration::milliseconds(id % 1000)),
        })
        .collect()
}

/// `url` with its database (the path) replaced by `database`; scheme, credentials, host and
/// query parameters are kept as written.
pub fn with_database(url: &str, database: &str) -> anyhow::Result<String> {
    let scheme_end = url
        .find("://")
        .map(|i| i + 3)
        .context("the URL has no scheme (`scheme://…`)")?;
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    anyhow::ensure!(!authority.is_empty(), "the URL has no host");
    let after_path = rest[authority_end..]
        .find(['?', '#'])
        .map_or("", |i| &rest[authority_end + i..]);
    Ok(format!(
        "{}{authority}/{database}{after_path}",
        &url[..scheme_end]
    ))
}

/// Resident set size of this process in MiB (Linux `/proc/self/status`), None elsewhere.
pub fn rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Nearest-rank percentile of an ascending slice (`p` in 0..=1); zero when empty.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn rate(rows: u64, took: Duration) -> f64 {
    rows as f64 / took.as_secs_f64().max(1e-9)
}

fn ms(d: Duration) -> String {
    format!("{:.1}ms", d.as_secs_f64() * 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_is_replaced_and_the_rest_kept() {
        assert_eq!(
            with_database("mysql://root@127.0.0.1:3306/msgx_inbox", "b").expect("url"),
            "mysql://root@127.0.0.1:3306/b"
        );
        assert_eq!(
            with_database("postgres://u:p@h:5432/msgx?sslmode=disable", "b").expect("url"),
            "postgres://u:p@h:5432/b?sslmode=disable"
        );
        assert_eq!(
            with_database("postgres://h", "b").expect("url"),
            "postgres://h/b"
        );
        assert_eq!(
            with_database("postgresql://h/?application_name=x", "b").expect("url"),
            "postgresql://h/b?application_name=x"
        );
        assert!(with_database("no-scheme", "b").is_err());
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 0.50), Duration::from_millis(50));
        assert_eq!(percentile(&v, 0.99), Duration::from_millis(99));
        assert_eq!(percentile(&v, 1.0), Duration::from_millis(100));
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
    }

    #[test]
    fn filler_has_the_asked_size() {
        for n in [0, 5, 16, 300, 1000] {
            assert_eq!(filler_message(n).len(), n);
        }
    }

    #[test]
    fn values_statement_numbers_its_parameters() {
        assert_eq!(
            values_sql(2),
            "INSERT INTO bench_bare (msg_id, received_at, enqueued_at, source, state) \
             VALUES ($2, $3, $1, 'POLL', 'PENDING'),($4, $5, $1, 'POLL', 'PENDING') \
             ON CONFLICT (msg_id) DO NOTHING"
        );
    }
}
