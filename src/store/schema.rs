//! Which schema a store has, against the migrations this binary carries (issue 22: safe
//! upgrades). The service migrates at start (`store.migrate_at_start`); every other command
//! opens the store as it is ([`Store::open`]): it never creates a database or a table, and a
//! missing, older or newer schema is a clear error naming both versions.

use sqlx::postgres::{PgConnectOptions, PgPool};

use super::{Store, StoreError, MIGRATOR};
use crate::db_options;
use crate::settings::{redact_url, StoreSettings};

/// The store's schema compared with this binary's migrations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchemaState {
    /// Every migration this binary knows is applied, and nothing else.
    Current {
        /// The version both agree on.
        version: i64,
    },
    /// No msgexchange schema at all (an empty database).
    Missing {
        /// This binary's newest migration.
        binary: i64,
    },
    /// Older than this binary: these migrations are not applied yet.
    Behind {
        /// The store's newest applied migration.
        store: i64,
        /// This binary's newest migration.
        binary: i64,
        /// The versions `migrate` would apply.
        pending: Vec<i64>,
    },
    /// Migrated by a newer msgexchange: this binary must not run against it.
    Ahead {
        /// The store's newest applied migration.
        store: i64,
        /// This binary's newest migration.
        binary: i64,
    },
}

impl SchemaState {
    /// The refusal of a command that needs the current schema, or None.
    pub fn refusal(&self) -> Option<StoreError> {
        let why = match self {
            SchemaState::Current { .. } => return None,
            SchemaState::Missing { binary } => format!(
                "the store has no msgexchange schema (this binary's is version {binary}); \
                 run `msgexchange migrate` or start the service, which migrates"
            ),
            SchemaState::Behind { store, binary, .. } => format!(
                "the store's schema is at version {store}, this binary expects {binary}; run \
                 `msgexchange migrate` (or start the service) first"
            ),
            SchemaState::Ahead { store, binary } => format!(
                "the store's schema is at version {store}, newer than this binary's {binary}: \
                 it was migrated by a newer msgexchange; use that version (downgrades are not \
                 supported)"
            ),
        };
        Some(StoreError::Schema(why))
    }
}

/// The oldest schema whose `instance_lease` this binary's lease statements work on (migration
/// 0011, the lease's expiry): an older store is migrated before the lease is taken, as every
/// release before issue 30 did.
pub const LEASE_SCHEMA: i64 = 11;

/// How many times a migration is tried when it loses a deadlock to a running instance.
pub(super) const MIGRATION_ATTEMPTS: u32 = 5;

/// Whether a failed migration lost a deadlock (SQLSTATE `40P01`) and may simply run again: a
/// migration that alters a table the running previous release writes (`msgexchange migrate`
/// under it, docs/operations.md "Rolling upgrade") takes its locks in another order than the
/// pump's statements, and PostgreSQL may cancel the migration to break the cycle. Each
/// migration is its own transaction, so the cancelled one left nothing behind.
pub(super) fn lost_a_deadlock(e: &sqlx::migrate::MigrateError) -> bool {
    use sqlx::migrate::MigrateError;
    let (MigrateError::ExecuteMigration(sqlx::Error::Database(db), _)
    | MigrateError::Execute(sqlx::Error::Database(db))) = e
    else {
        return false;
    };
    db.code().as_deref() == Some("40P01")
}

/// This binary's newest migration.
pub fn binary_version() -> i64 {
    MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
}

/// Reads `_sqlx_migrations` (successful rows) and compares.
pub async fn schema_state(pool: &PgPool) -> Result<SchemaState, StoreError> {
    let binary = binary_version();
    let table: Option<String> = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations')::text")
        .fetch_one(pool)
        .await?;
    if table.is_none() {
        return Ok(SchemaState::Missing { binary });
    }
    let applied: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success ORDER BY version")
            .fetch_all(pool)
            .await?;
    let Some(&store) = applied.last() else {
        return Ok(SchemaState::Missing { binary });
    };
    if applied
        .iter()
        .any(|v| MIGRATOR.iter().all(|m| m.version != *v))
    {
        return Ok(SchemaState::Ahead { store, binary });
    }
    let pending: Vec<i64> = MIGRATOR
        .iter()
        .map(|m| m.version)
        .filter(|v| !applied.contains(v))
        .collect();
    Ok(if pending.is_empty() {
        SchemaState::Current { version: store }
    } else {
        SchemaState::Behind {
            store,
            binary,
            pending,
        }
    })
}

impl Store {
    /// Opens an existing store for an operator command: creates nothing, migrates nothing, and
    /// refuses a missing database or a schema that is not this binary's.
    pub async fn open(settings: &StoreSettings) -> Result<Self, StoreError> {
        let pool = match super::session_pool(settings, session_options(settings)?).await {
            Ok(pool) => pool,
            // invalid_catalog_name: the database does not exist; nothing is created.
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("3D000") => {
                return Err(StoreError::Schema(format!(
                    "the store database does not exist ({}); nothing was created — check \
                     store.url, or run `msgexchange migrate` to create and migrate it",
                    redact_url(&settings.connect.url)
                )))
            }
            Err(e) => return Err(e.into()),
        };
        if let Some(refused) = schema_state(&pool).await?.refusal() {
            pool.close().await;
            return Err(refused);
        }
        Ok(Self::with_relaxed(pool))
    }
}

/// The connect options of our sessions: [`connect_options`] with our statement, lock and idle
/// timeouts.
pub(super) fn session_options(settings: &StoreSettings) -> Result<PgConnectOptions, StoreError> {
    let options = connect_options(settings)?;
    Ok(options.options([
        (
            "statement_timeout",
            settings.statement_timeout.as_millis().to_string(),
        ),
        (
            "lock_timeout",
            settings.lock_timeout.as_millis().to_string(),
        ),
        (
            "idle_in_transaction_session_timeout",
            settings.idle_in_transaction_timeout.as_millis().to_string(),
        ),
    ]))
}

/// `store.url` with `store.password` and the TLS keys (`ssl_mode`, `ssl_ca`, the client
/// certificate `ssl_cert` / `ssl_key`), as [`db_options::connect_options`] applies them to both
/// databases: what every connection to the store is opened with (the pools, the lease session,
/// `CREATE DATABASE`).
pub fn connect_options(settings: &StoreSettings) -> Result<PgConnectOptions, StoreError> {
    db_options::connect_options(&settings.connect).map_err(|source| StoreError::Url {
        url: redact_url(&settings.connect.url),
        source,
    })
}

/// What `msgexchange status` can say about a store whose schema is not this binary's (it
/// cannot read the rest): the schema state and the lease row's `(epoch, holder)`.
#[derive(Debug, Clone)]
pub struct SchemaProbe {
    /// The store's schema against this binary's.
    pub state: SchemaState,
    /// The lease row, when the store has one.
    pub lease: Option<(i64, Option<String>)>,
}

/// Reads the schema state and the lease row of an existing store; creates and migrates
/// nothing.
pub async fn probe(settings: &StoreSettings) -> Result<SchemaProbe, StoreError> {
    let pool = super::session_pool(settings, session_options(settings)?).await?;
    let state = schema_state(&pool).await?;
    let table: Option<String> = sqlx::query_scalar("SELECT to_regclass('instance_lease')::text")
        .fetch_one(&pool)
        .await?;
    let lease: Option<(i64, Option<String>)> = match table {
        Some(_) => {
            sqlx::query_as("SELECT epoch, holder FROM instance_lease WHERE id = 1")
                .fetch_optional(&pool)
                .await?
        }
        None => None,
    };
    pool.close().await;
    Ok(SchemaProbe { state, lease })
}
