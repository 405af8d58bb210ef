//! Phases 2 and 4 of `bench pump`: the bare single-connection commit rates the pump is
//! measured against, in scratch tables of the bench store, with `synchronous_commit` as the
//! server has it (never changed for the server or a session): every commit waits for the WAL
//! flush, except in the relaxed transactions, which mirror the pump's attempt stamp
//! (`Store::stamp_attempts`, here for one row) and the identity binding of its own the pump
//! ran per message before group commit (group commit binds it in the outcome statement): one
//! autocommit `UPDATE` on a second held connection whose session has `synchronous_commit =
//! off`, as the store's relaxed pool. Bare reference shapes: no store function is called.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::Utc;
use msgx_core::store::PIPELINE_LOCK_KEY;
use sqlx::postgres::PgPool;
use sqlx::Connection as _;

/// Identity keys handed to the pump-shaped message, unique over the process (every probe binds
/// fresh keys, as every message does).
static NEXT_IDENT: AtomicU64 = AtomicU64::new(0);

/// The bare statement shapes (the single-statement and single-transaction ones first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BareShape {
    /// `UPDATE bench_commit SET n = n + 1 WHERE id = $1` in autocommit.
    Autocommit,
    /// `BEGIN; UPDATE …; COMMIT`: the bare limit.
    Tx,
    /// The stamp's shape: one autocommit `UPDATE … RETURNING` on a session with
    /// `synchronous_commit = off` (a relaxed commit: no wait for the WAL flush).
    RelaxedTx,
    /// The business transaction's shape: `BEGIN`; the advisory lock and `SELECT … FOR UPDATE`
    /// in one statement; `WITH … INSERT … UPDATE` (one statement); `COMMIT`.
    PumpTx,
    /// A message's transactions as the pump runs them: stamp and bind identity (an UPDATE of
    /// a uniquely indexed column), each in a relaxed transaction, then the pump-shaped
    /// transaction, whose synchronous commit flushes the WAL of all three: one flush waited for.
    PumpMessage,
}

/// Statements of a relaxed commit: the one autocommit `UPDATE` on the relaxed session.
pub(super) const RELAXED_TX_STATEMENTS: u32 = 1;

/// Statements of the pump-shaped transaction: `BEGIN`, the lock and the row, the writes,
/// `COMMIT`.
pub(super) const PUMP_TX_STATEMENTS: u32 = 4;

impl BareShape {
    /// Every shape, in measuring order.
    pub(super) const ALL: [BareShape; 5] = [
        BareShape::Autocommit,
        BareShape::Tx,
        BareShape::RelaxedTx,
        BareShape::PumpTx,
        BareShape::PumpMessage,
    ];

    /// Printed name.
    pub(super) fn label(self) -> &'static str {
        match self {
            Self::Autocommit => "autocommit UPDATE",
            Self::Tx => "BEGIN; UPDATE; COMMIT",
            Self::RelaxedTx => "relaxed commit",
            Self::PumpTx => "pump-shaped tx",
            Self::PumpMessage => "pump-shaped message",
        }
    }

    /// Synchronous commits (WAL flushes waited for) per unit.
    pub(super) fn sync_commits(self) -> u32 {
        match self {
            Self::RelaxedTx => 0,
            _ => 1,
        }
    }

    /// Relaxed commits (`synchronous_commit = off` for the transaction) per unit.
    pub(super) fn relaxed_commits(self) -> u32 {
        match self {
            Self::RelaxedTx => 1,
            Self::PumpMessage => 2,
            _ => 0,
        }
    }

    /// Round trips per unit (BEGIN and COMMIT are one each).
    pub(super) fn round_trips(self) -> u32 {
        match self {
            Self::Autocommit => 1,
            Self::Tx => 3,
            Self::RelaxedTx => RELAXED_TX_STATEMENTS,
            Self::PumpTx => PUMP_TX_STATEMENTS,
            Self::PumpMessage => 2 * RELAXED_TX_STATEMENTS + PUMP_TX_STATEMENTS,
        }
    }
}

/// One bare measurement.
#[derive(Debug)]
pub(super) struct BareRun {
    /// What was measured.
    pub(super) shape: BareShape,
    /// Units done (transactions; messages for the pump-shaped message).
    pub(super) units: u64,
    /// Wall time of all units.
    pub(super) elapsed: Duration,
    /// Wall time of each unit, ascending.
    pub(super) unit_latency: Vec<Duration>,
    /// The last COMMIT of each unit (the statement itself in autocommit), ascending.
    pub(super) commit_latency: Vec<Duration>,
}

impl BareRun {
    /// Units per second.
    pub(super) fn rate(&self) -> f64 {
        self.units as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// One round trip and one pool acquire, to price the pump's statements that do no writes.
#[derive(Debug)]
pub(super) struct RoundTrips {
    /// `SELECT 1` on a held connection, ascending.
    pub(super) select_one: Vec<Duration>,
    /// `pool.acquire()` of an idle connection of the store pool (it pings the connection
    /// first only if the pool has `test_before_acquire`, which the store turns off).
    pub(super) acquire: Vec<Duration>,
}

/// The bare measurements of one bracket.
#[derive(Debug, Default)]
pub(super) struct BareLimits {
    /// In measuring order.
    pub(super) shapes: Vec<BareRun>,
    /// Measured before the pump only.
    pub(super) round_trips: Option<RoundTrips>,
}

impl BareLimits {
    /// The measurement of `shape`, if this bracket has one.
    pub(super) fn get(&self, shape: BareShape) -> Option<&BareRun> {
        self.shapes.iter().find(|r| r.shape == shape)
    }
}

/// The scratch tables (each bare run holds one connection of `pool` throughout).
pub(super) struct BareTables {
    pool: PgPool,
    rows: i64,
}

impl BareTables {
    /// Creates and fills `bench_commit` (`rows` rows, a proc_state stand-in with a unique
    /// partial index like the identity's) and `bench_commit_event`.
    pub(super) async fn create(pool: &PgPool, rows: u64) -> anyhow::Result<Self> {
        let rows = i64::try_from(rows.max(1)).context("row count")?;
        for sql in [
            "CREATE TABLE bench_commit (id BIGINT PRIMARY KEY, n BIGINT NOT NULL DEFAULT 0, \
             state TEXT NOT NULL DEFAULT 'PENDING', attempts INTEGER NOT NULL DEFAULT 0, \
             started_at TIMESTAMPTZ, ident TEXT, updated_at TIMESTAMPTZ)",
            "CREATE UNIQUE INDEX bench_commit_ident_idx ON bench_commit (ident) \
             WHERE ident IS NOT NULL",
            "CREATE TABLE bench_commit_event (id BIGSERIAL PRIMARY KEY, commit_id BIGINT NOT \
             NULL, payload JSONB NOT NULL, created_at TIMESTAMPTZ NOT NULL)",
        ] {
            sqlx::query(sql)
                .execute(pool)
                .await
                .with_context(|| format!("creating the bare scratch tables: {sql}"))?;
        }
        sqlx::query("INSERT INTO bench_commit (id) SELECT generate_series(1, $1::bigint)")
            .bind(rows)
            .execute(pool)
            .await
            .context("filling bench_commit")?;
        sqlx::query("VACUUM ANALYZE bench_commit")
            .execute(pool)
            .await
            .context("VACUUM ANALYZE bench_commit")?;
        Ok(Self {
            pool: pool.clone(),
            rows,
        })
    }

    /// Drops the tables (their dead rows must not be vacuumed during a later phase).
    pub(super) async fn drop_all(self) -> anyhow::Result<()> {
        sqlx::query("DROP TABLE bench_commit, bench_commit_event")
            .execute(&self.pool)
            .await
            .context("dropping the bare scratch tables")?;
        Ok(())
    }
}

/// Runs `shape` on the held connection until `max_units` units or `max_time`, whichever
/// comes first.
pub(super) async fn bare_shape(
    tables: &BareTables,
    shape: BareShape,
    max_units: u64,
    max_time: Duration,
) -> anyhow::Result<BareRun> {
    // One connection for the whole run: the single-connection commit rate; and, as the store
    // has, a second one whose session commits without waiting for the WAL flush.
    let mut conn = tables
        .pool
        .acquire()
        .await
        .context("a connection for a bare run")?;
    let mut relaxed = tables
        .pool
        .acquire()
        .await
        .context("a relaxed connection for a bare run")?;
    sqlx::query("SET synchronous_commit = off")
        .execute(&mut *relaxed)
        .await
        .context("SET synchronous_commit = off")?;
    let capacity = usize::try_from(max_units.min(8_192)).unwrap_or(8_192);
    let mut unit_latency = Vec::with_capacity(capacity);
    let mut commit_latency = Vec::with_capacity(capacity);
    let payload = serde_json::json!({
        "flight": "CA1234", "type": "FLIGHT_UPDATED",
        "fields": {"ETOT": "20261130101500", "GATE": "B12", "STND": "213"}
    });
    let started = Instant::now();
    let mut units = 0u64;
    while units < max_units && started.elapsed() < max_time {
        let id = i64::try_from(units).unwrap_or(i64::MAX) % tables.rows + 1;
        let unit_started = Instant::now();
        let commit = match shape {
            BareShape::Autocommit => {
                let t = Instant::now();
                update_n(&mut conn, id).await?;
                t.elapsed()
            }
            BareShape::Tx => {
                let mut tx = conn.begin().await.context("BEGIN")?;
                update_n(&mut tx, id).await?;
                let t = Instant::now();
                tx.commit().await.context("COMMIT")?;
                t.elapsed()
            }
            BareShape::RelaxedTx => relaxed_stamp(&mut relaxed, id).await?,
            BareShape::PumpTx => pump_tx(&mut conn, id, &payload).await?,
            BareShape::PumpMessage => {
                relaxed_stamp(&mut relaxed, id).await?;
                // A key never bound before, as a new message's: the UPDATE always writes
                // and inserts into the unique index.
                let key = NEXT_IDENT.fetch_add(1, Ordering::Relaxed);
                relaxed_bind(&mut relaxed, id, &format!("BENCH|FLOP|UPDT|{key}")).await?;
                pump_tx(&mut conn, id, &payload).await?
            }
        };
        unit_latency.push(unit_started.elapsed());
        commit_latency.push(commit);
        units += 1;
    }
    let elapsed = started.elapsed();
    unit_latency.sort_unstable();
    commit_latency.sort_unstable();
    Ok(BareRun {
        shape,
        units,
        elapsed,
        unit_latency,
        commit_latency,
    })
}

/// `UPDATE bench_commit SET n = n + 1 WHERE id = $1` (one row, or fail).
async fn update_n(conn: &mut sqlx::PgConnection, id: i64) -> anyhow::Result<()> {
    let done = sqlx::query("UPDATE bench_commit SET n = n + 1 WHERE id = $1")
        .bind(id)
        .execute(conn)
        .await
        .context("UPDATE bench_commit")?;
    anyhow::ensure!(done.rows_affected() == 1, "bench_commit row {id} missing");
    Ok(())
}

/// The stamp on the relaxed session (`Store::stamp_attempts`'s shape for one row); returns
/// its time.
async fn relaxed_stamp(conn: &mut sqlx::PgConnection, id: i64) -> anyhow::Result<Duration> {
    let now = Utc::now();
    let t = Instant::now();
    let attempts: Option<i32> = sqlx::query_scalar(
        "UPDATE bench_commit SET attempts = attempts + 1, \
         started_at = COALESCE(started_at, $2), updated_at = $2 \
         WHERE id = $1 RETURNING attempts",
    )
    .bind(id)
    .bind(now)
    .fetch_optional(conn)
    .await
    .context("stamp UPDATE")?;
    anyhow::ensure!(attempts.is_some(), "bench_commit row {id} missing");
    Ok(t.elapsed())
}

/// An identity binding of its own on the relaxed session (an UPDATE of a uniquely indexed
/// column, as the pump bound identities before group commit); returns its time.
async fn relaxed_bind(
    conn: &mut sqlx::PgConnection,
    id: i64,
    ident: &str,
) -> anyhow::Result<Duration> {
    let t = Instant::now();
    sqlx::query("UPDATE bench_commit SET ident = $2 WHERE id = $1")
        .bind(id)
        .bind(ident)
        .execute(conn)
        .await
        .context("identity UPDATE")?;
    Ok(t.elapsed())
}

/// The pump-shaped transaction; returns the COMMIT's time.
async fn pump_tx(
    conn: &mut sqlx::PgConnection,
    id: i64,
    payload: &serde_json::Value,
) -> anyhow::Result<Duration> {
    let now = Utc::now();
    let mut tx = conn.begin().await.context("BEGIN")?;
    let state: Option<String> = sqlx::query_scalar(
        "SELECT state FROM bench_commit \
         WHERE id = $1 AND (SELECT 1 FROM pg_advisory_xact_lock($2)) = 1 FOR UPDATE",
    )
    .bind(id)
    .bind(PIPELINE_LOCK_KEY)
    .fetch_optional(&mut *tx)
    .await
    .context("advisory lock + SELECT … FOR UPDATE")?;
    anyhow::ensure!(state.is_some(), "bench_commit row {id} missing");
    sqlx::query(
        "WITH ev AS (INSERT INTO bench_commit_event (commit_id, payload, created_at) \
                     VALUES ($1, $2, $3) RETURNING 1) \
         UPDATE bench_commit SET state = 'SUCCEEDED', n = n + 1, updated_at = $3 WHERE id = $1",
    )
    .bind(id)
    .bind(payload)
    .bind(now)
    .execute(&mut *tx)
    .await
    .context("INSERT bench_commit_event + UPDATE bench_commit")?;
    let t = Instant::now();
    tx.commit().await.context("COMMIT")?;
    Ok(t.elapsed())
}

/// `n` times `SELECT 1` on a held connection, and `n` pool acquires of an idle connection
/// (the store pool as configured; sqlx pings a released connection in a background task, not
/// in the acquire).
pub(super) async fn round_trips(tables: &BareTables, n: usize) -> anyhow::Result<RoundTrips> {
    let mut conn = tables.pool.acquire().await.context("a connection")?;
    let mut select_one = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let _: i32 = sqlx::query_scalar("SELECT 1")
            .fetch_one(&mut *conn)
            .await
            .context("SELECT 1")?;
        select_one.push(t.elapsed());
    }
    drop(conn);
    let mut acquire = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let conn = tables.pool.acquire().await.context("pool acquire")?;
        acquire.push(t.elapsed());
        drop(conn);
    }
    select_one.sort_unstable();
    acquire.sort_unstable();
    Ok(RoundTrips {
        select_one,
        acquire,
    })
}
