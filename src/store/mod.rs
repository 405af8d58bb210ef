//! Our own PostgreSQL: schema by migrations at start-up, the discovery cursor and the queue.

pub mod backfill;
mod business;
mod cursor;
mod enqueue;
pub mod events;
mod group;
mod inspect;
pub mod late_watch;
mod queue;
pub mod replay;

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection};

use crate::settings::{redact_url, StoreSettings};

pub use business::{BusinessResult, PIPELINE_LOCK_KEY};
pub use cursor::{SeedOutcome, StoredCursor};
pub use enqueue::{EnqueueRow, RoundWrite};
pub use group::{GroupLoad, GroupTx};
pub use queue::{Backlog, Binding, HeadRow};

/// Why a store call failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The URL could not be parsed.
    #[error("store url `{url}` is invalid: {source}")]
    Url {
        url: String,
        #[source]
        source: sqlx::Error,
    },
    /// Connection, statement, constraint…
    #[error("store statement failed: {0}")]
    Db(#[from] sqlx::Error),
    /// Migrations failed at start-up.
    #[error("store migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The cursor changed under us: another writer (a second instance?) moved W.
    #[error(
        "inbox cursor moved concurrently (expected W={expected}); is a second instance running?"
    )]
    CursorMoved { expected: i64 },
    /// Another instance holds the single-instance lock (or ours was lost).
    #[error(
        "another msgexchange instance holds the instance lock on this store (or ours was lost)"
    )]
    InstanceLocked,
    /// A stored row does not decode (a bug or a manual edit).
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// Cutover seeding refused.
    #[error("cutover seeding refused: {0}")]
    SeedRefused(String),
}

impl StoreError {
    /// True when a newer instance took the lock and this one's writes are fenced off
    /// (migration 0006, SQLSTATE `MXFEN`).
    pub fn is_fenced(&self) -> bool {
        match self {
            StoreError::Db(sqlx::Error::Database(e)) => e.code().as_deref() == Some("MXFEN"),
            _ => false,
        }
    }
}

/// The embedded migrations (run at start-up; the build needs no database).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// The PostgreSQL store.
#[derive(Debug, Clone)]
pub struct Store {
    /// Shared pool.
    pool: PgPool,
    /// A small pool whose sessions run with `synchronous_commit = off`: the pump's per-message
    /// bookkeeping (attempt stamp, identity binding) commits there as ONE autocommit statement
    /// instead of BEGIN; SET LOCAL; UPDATE; COMMIT — durable no later than the synchronous
    /// business commit that follows it (the WAL is flushed in order), re-done if a crash loses it.
    relaxed: PgPool,
}

impl Store {
    /// Connects (creating the database first when configured) and runs migrations.
    pub async fn connect(settings: &StoreSettings) -> Result<Self, StoreError> {
        let options =
            PgConnectOptions::from_str(&settings.url).map_err(|source| StoreError::Url {
                url: redact_url(&settings.url),
                source,
            })?;
        if settings.create_database {
            create_database_if_missing(&options).await?;
        }
        // No ping before every checkout: a dead connection fails its statement, which every
        // caller already treats as a store failure; the ping cost a round trip per statement.
        let pool = PgPoolOptions::new()
            .max_connections(settings.max_connections)
            .acquire_timeout(settings.connect_timeout)
            .test_before_acquire(false)
            .connect_with(options)
            .await?;
        MIGRATOR.run(&pool).await?;
        Ok(Self::with_relaxed(pool))
    }

    /// Wraps an existing pool (tests, tools); runs migrations.
    pub async fn from_pool(pool: PgPool) -> Result<Self, StoreError> {
        MIGRATOR.run(&pool).await?;
        Ok(Self::with_relaxed(pool))
    }

    /// The same store whose every connection carries this instance's fencing epoch: from now
    /// on each write to our tables fails (SQLSTATE `MXFEN`, [`StoreError::is_fenced`]) once a
    /// newer instance has taken the lock. New pools, same settings; the old ones are closed.
    pub async fn fenced(self, epoch: i64) -> Result<Self, StoreError> {
        let epoch = epoch.to_string();
        let options = (*self.pool.connect_options())
            .clone()
            .options([("msgx.epoch", epoch.as_str())]);
        let pool = PgPoolOptions::new()
            .max_connections(self.pool.options().get_max_connections())
            .acquire_timeout(self.pool.options().get_acquire_timeout())
            .test_before_acquire(false)
            .connect_with(options)
            .await?;
        self.pool.close().await;
        self.relaxed.close().await;
        Ok(Self::with_relaxed(pool))
    }

    /// Adds the relaxed-commit pool (same server and credentials and session settings,
    /// connected lazily).
    fn with_relaxed(pool: PgPool) -> Self {
        let options = (*pool.connect_options())
            .clone()
            .options([("synchronous_commit", "off")]);
        let relaxed = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(pool.options().get_acquire_timeout())
            .test_before_acquire(false)
            .connect_lazy_with(options);
        Self { pool, relaxed }
    }

    /// The relaxed-commit pool (see the field).
    pub(crate) fn relaxed(&self) -> &PgPool {
        &self.relaxed
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Number of PROC_STATE rows (tests, tools, cutover checks).
    pub async fn proc_state_count(&self) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar("SELECT count(*) FROM proc_state")
            .fetch_one(&self.pool)
            .await?)
    }
}

/// `CREATE DATABASE` through the maintenance database when the target does not exist.
async fn create_database_if_missing(target: &PgConnectOptions) -> Result<(), StoreError> {
    let Some(name) = target.get_database().map(str::to_string) else {
        return Ok(());
    };
    let mut admin = target.clone().database("postgres").connect().await?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(&name)
            .fetch_one(&mut admin)
            .await?;
    if !exists {
        let quoted = format!("\"{}\"", name.replace('"', "\"\""));
        match sqlx::query(&format!("CREATE DATABASE {quoted}"))
            .execute(&mut admin)
            .await
        {
            Ok(_) => tracing::info!(database = %name, "created store database"),
            // Raced with another creator: fine.
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P04") => {}
            Err(e) => return Err(e.into()),
        }
    }
    admin.close().await?;
    Ok(())
}

/// The single-instance lock: a PostgreSQL advisory lock held on a dedicated connection for
/// the life of the process (two pollers would overwrite W, seed §5.1), and the fencing epoch
/// taken with it (migration 0006): [`Store::fenced`] makes every write of the instance check
/// that the epoch is still the current one.
#[derive(Debug, Clone)]
pub struct InstanceLock {
    /// The connection that holds the lock; the lock dies with it.
    conn: std::sync::Arc<tokio::sync::Mutex<sqlx::PgConnection>>,
    /// This instance's fencing token.
    epoch: i64,
}

/// Advisory lock key: "msgx" in ASCII.
const INSTANCE_LOCK_KEY: i64 = 0x6d73_6778;

impl InstanceLock {
    /// Takes the lock or fails with a clear message when another instance holds it.
    pub async fn acquire(store: &Store) -> Result<Self, StoreError> {
        let mut conn = store.pool().acquire().await?.detach();
        let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(INSTANCE_LOCK_KEY)
            .fetch_one(&mut conn)
            .await?;
        if !got {
            return Err(StoreError::InstanceLocked);
        }
        // A new epoch fences every earlier holder's connections, whatever state they are in.
        let host = std::env::var("HOSTNAME")
            .ok()
            .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "?".into());
        let holder = format!("{host}:{}", std::process::id());
        let epoch: i64 = sqlx::query_scalar(
            "UPDATE instance_lease SET epoch = epoch + 1, holder = $1, acquired_at = now() \
             WHERE id = 1 RETURNING epoch",
        )
        .bind(&holder)
        .fetch_one(&mut conn)
        .await?;
        tracing::info!(epoch, holder = %holder, "instance lock taken; lease epoch bumped");
        Ok(Self {
            conn: std::sync::Arc::new(tokio::sync::Mutex::new(conn)),
            epoch,
        })
    }

    /// This instance's fencing token (pass it to [`Store::fenced`]).
    pub fn epoch(&self) -> i64 {
        self.epoch
    }

    /// Confirms the lock is still held (its connection is alive and owns it).
    pub async fn check(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.lock().await;
        let held: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' \
             AND pid = pg_backend_pid() AND objid = $1::bigint::oid AND granted) \
             AND (SELECT epoch FROM instance_lease WHERE id = 1) = $2",
        )
        .bind(INSTANCE_LOCK_KEY)
        .bind(self.epoch)
        .fetch_one(&mut *conn)
        .await?;
        if held {
            Ok(())
        } else {
            Err(StoreError::InstanceLocked)
        }
    }
}
