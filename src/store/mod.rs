//! Our own PostgreSQL, the one store API: connecting (fenced by the lease epoch) and the schema
//! (`schema`: migrations, the version guard), the discovery cursor and holes, the queue and its
//! group transaction, events, marking, operator actions, cutover, retention and the lease.

pub mod audit;
pub mod backfill;
pub mod batch;
mod business;
mod cursor;
mod cutover;
mod enqueue;
pub mod event_scan;
pub mod events;
mod fresh;
mod group;
mod inspect;
pub mod late_watch;
mod lease;
mod queue;
pub mod raw_copy;
pub mod replay;
pub mod retention;
pub mod schema;
mod trace_context;
pub use trace_context::StoredTraceContext;
mod unseen;
pub mod vacuum;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection};

use crate::settings::StoreSettings;

pub use business::{BusinessResult, PIPELINE_LOCK_KEY};
pub use cursor::{SeedOutcome, StoredCursor};
pub use cutover::SeedAudit;
pub use enqueue::{EnqueueRow, RoundWrite};
pub use group::{GroupLoad, GroupTx, Stamp};
pub use lease::{session_name, InstanceLock, LeaseConfig};
pub use queue::{Backlog, HeadRow};
pub use raw_copy::{purge_expired_raw_copies, PendingCopy, StoredCopy};
pub use schema::SchemaState;
pub use vacuum::{Maintenance, TableActivity, MAINTAINED_TABLES};

/// The columns `proc_state` and `proc_state_hst` share (a column added to one is added to
/// both; `proc_state_hst` has `archived_at` besides, and a later column comes after it, so the
/// archive names these instead of `p.*`). `proc_state_all` lists those of migration 0014, all
/// that its live-or-archived reads use.
pub(crate) const PROC_STATE_COLUMNS: &str = "msg_id, state, source, received_at, enqueued_at, \
    attempts, next_attempt_at, error_class, error_text, processing_started_at, terminal_reason, \
    terminal_at, identity_key, backfill_next_at, backfill_at, backfill_attempts, \
    backfill_abandon_reason, backfill_abandoned_at, updated_at, processed_seq, msg_type, \
    stale_fields, backfill_error, marked_before_replay_at, trace_parent, trace_state";

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
    /// A maintenance statement was asked for a table that is not one of ours
    /// (`vacuum::MAINTAINED_TABLES`); table names cannot be bound, so nothing else is run.
    #[error("refusing to vacuum `{0}`: not one of our tables")]
    NotOurTable(String),
    /// The store's schema is missing, behind or ahead of this binary's (or its database is
    /// missing): the message names the versions and what to do.
    #[error("{0}")]
    Schema(String),
    /// A newer instance took the lease over (we froze or lost the store for a whole ttl).
    #[error("the instance lease was taken over by `{holder}` (epoch {epoch})")]
    LeaseTakenOver { epoch: i64, holder: String },
    /// The lease row says something no instance wrote (edited by hand): refuse to act.
    #[error("the instance_lease row was changed outside msgexchange: {0}; refusing to act")]
    LeaseTampered(String),
    /// A lease statement did not answer in time (`lease.check_timeout`).
    #[error("the instance lease check did not answer within {0:?}")]
    LeaseTimeout(std::time::Duration),
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

    /// True when PostgreSQL was unreachable or the connection broke ([`crate::outage`]).
    pub fn is_outage(&self) -> bool {
        matches!(self, StoreError::Db(e) if crate::outage::is_outage(e))
    }
}

/// `s` cut to at most `max` bytes, at a character boundary: error texts are for people;
/// keep rows small.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The embedded migrations (run at start-up; the build needs no database).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// The PostgreSQL store.
#[derive(Debug, Clone)]
pub struct Store {
    /// Shared pool.
    pool: PgPool,
    /// A small pool whose sessions run with `synchronous_commit = off`: the pump's per-message
    /// bookkeeping (a group's attempt stamps) commits there as ONE autocommit statement instead
    /// of BEGIN; SET LOCAL; UPDATE; COMMIT — durable no later than the synchronous business
    /// commit that follows it (the WAL is flushed in order), re-done if a crash loses it.
    relaxed: PgPool,
}

impl Store {
    /// Connects for the service, the tests and the tools: creates the database first when
    /// configured (`store.create_database`), then brings an older or empty schema to this
    /// binary's (`store.migrate_at_start`; refused when off). A schema newer than this binary's
    /// is always refused, naming both versions. Operator commands use [`Store::open`].
    pub async fn connect(settings: &StoreSettings) -> Result<Self, StoreError> {
        let pool = Self::connect_pool(settings).await?;
        match schema::schema_state(&pool).await? {
            SchemaState::Current { .. } => {}
            state @ SchemaState::Ahead { .. } => return Err(refuse(&pool, &state).await),
            state if !settings.migrate_at_start => return Err(refuse(&pool, &state).await),
            _ => migrate_untimed(&pool).await?,
        }
        Ok(Self::with_relaxed(pool))
    }

    /// Connects the service before it holds the lease (issue 30: only the lease holder or
    /// `msgexchange migrate` migrates). Creates the database when configured; migrates only a
    /// store no instance can be running on — an empty one (sqlx's migration lock serialises two
    /// first starts) or one older than the lease itself ([`schema::LEASE_SCHEMA`]). Any other
    /// older schema is returned as `Behind` for [`Store::migrate_held`] once the lease is held;
    /// a newer one, or an older one with `store.migrate_at_start` off, is refused.
    pub async fn connect_unmigrated(
        settings: &StoreSettings,
    ) -> Result<(Self, SchemaState), StoreError> {
        let pool = Self::connect_pool(settings).await?;
        let state = match schema::schema_state(&pool).await? {
            state @ SchemaState::Current { .. } => state,
            state @ SchemaState::Ahead { .. } => return Err(refuse(&pool, &state).await),
            state if !settings.migrate_at_start => return Err(refuse(&pool, &state).await),
            SchemaState::Behind { store, .. } if store < schema::LEASE_SCHEMA => {
                migrate_untimed(&pool).await?;
                schema::schema_state(&pool).await?
            }
            SchemaState::Missing { .. } => {
                migrate_untimed(&pool).await?;
                schema::schema_state(&pool).await?
            }
            state @ SchemaState::Behind { .. } => state,
        };
        Ok((Self::with_relaxed(pool), state))
    }

    /// Brings an older schema to this binary's: only for the lease holder (see
    /// [`Store::connect_unmigrated`]), before it fences its sessions.
    pub async fn migrate_held(&self) -> Result<(), StoreError> {
        migrate_untimed(&self.pool).await
    }

    /// `msgexchange migrate`: creates the database when configured, applies this binary's
    /// pending migrations and returns their versions (none: already current). Idempotent;
    /// refuses a schema newer than this binary's.
    pub async fn migrate(settings: &StoreSettings) -> Result<Vec<i64>, StoreError> {
        let pool = Self::connect_pool(settings).await?;
        let pending = match schema::schema_state(&pool).await? {
            SchemaState::Current { .. } => Vec::new(),
            SchemaState::Missing { .. } => MIGRATOR.iter().map(|m| m.version).collect(),
            SchemaState::Behind { pending, .. } => pending,
            state @ SchemaState::Ahead { .. } => return Err(refuse(&pool, &state).await),
        };
        if !pending.is_empty() {
            migrate_untimed(&pool).await?;
        }
        pool.close().await;
        Ok(pending)
    }

    async fn connect_pool(settings: &StoreSettings) -> Result<PgPool, StoreError> {
        let options = schema::session_options(settings)?;
        if settings.create_database {
            create_database_if_missing(&options).await?;
        }
        Ok(session_pool(settings, options).await?)
    }

    /// The same store whose every connection carries this instance's fencing epoch: from now
    /// on each write to our tables fails (SQLSTATE `MXFEN`, [`StoreError::is_fenced`]) once a
    /// newer instance has taken the lock. New pools, same settings; the old ones are closed.
    pub async fn fenced(self, epoch: i64) -> Result<Self, StoreError> {
        let name = lease::session_name(epoch);
        let epoch = epoch.to_string();
        let options = (*self.pool.connect_options())
            .clone()
            .options([("msgx.epoch", epoch.as_str())])
            .application_name(&name);
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

/// A pool of our sessions with `store.*`'s size and connect timeout. No ping before every
/// checkout: a dead connection fails its statement, which every caller already treats as a
/// store failure; the ping cost a round trip per statement.
async fn session_pool(
    settings: &StoreSettings,
    options: PgConnectOptions,
) -> Result<PgPool, sqlx::Error> {
    PgPoolOptions::new()
        .max_connections(settings.max_connections)
        .acquire_timeout(settings.connect_timeout)
        .test_before_acquire(false)
        .connect_with(options)
        .await
}

/// The refusal for a schema state, the pool closed.
async fn refuse(pool: &PgPool, state: &SchemaState) -> StoreError {
    pool.close().await;
    state
        .refusal()
        .unwrap_or_else(|| StoreError::Schema("the schema is current".into()))
}

/// Runs the pending migrations; one that lost a deadlock to a running instance's statements
/// ([`schema::lost_a_deadlock`]) is run again after a short pause, a few times.
async fn migrate_untimed(pool: &PgPool) -> Result<(), StoreError> {
    let mut attempt = 1;
    loop {
        match migrate_once(pool).await {
            Err(StoreError::Migrate(e))
                if attempt < schema::MIGRATION_ATTEMPTS && schema::lost_a_deadlock(&e) =>
            {
                tracing::warn!(attempt, error = %e, "a migration lost a deadlock to a running instance's statements and was rolled back; running it again");
                tokio::time::sleep(std::time::Duration::from_millis(200 * u64::from(attempt)))
                    .await;
                attempt += 1;
            }
            done => return done,
        }
    }
}

/// Runs the migrations on one session without our statement/lock timeouts (an index build on
/// a large table may take longer); the session is closed afterwards, not returned to the pool
/// (on a failure too: closing it drops sqlx's migration lock).
async fn migrate_once(pool: &PgPool) -> Result<(), StoreError> {
    use sqlx::Executor as _;
    let mut conn = pool.acquire().await?.detach();
    conn.execute("SET statement_timeout = 0; SET lock_timeout = 0; SET idle_in_transaction_session_timeout = 0")
        .await?;
    let result = MIGRATOR.run(&mut conn).await;
    let _ = conn.close().await;
    Ok(result?)
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
