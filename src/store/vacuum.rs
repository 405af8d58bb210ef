//! Our own VACUUM of our own tables (`retention.vacuum`): where the server's autovacuum is off,
//! nothing reclaims the dead row versions a backlog leaves (about three per message in
//! PROC_STATE: enqueue, attempt stamp, outcome, mark), and every later read walks them. The
//! rule that picks the tables is `crate::retention::vacuum`; these are the statements.

use sqlx::Connection as _;

use super::{Store, StoreError};

/// The tables we maintain: every table of our migrations that rows are ever updated in or
/// deleted from (the cutover record, written once, needs no vacuum). Only these names are ever
/// put into a VACUUM statement (it takes no bind parameters). Spelled once, as the `table`
/// label values of the vacuum series (telemetry imports nothing of ours).
pub const MAINTAINED_TABLES: &[&str] = crate::telemetry::VACUUM_TABLES;

/// One table's activity counters (`pg_stat_user_tables`).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct TableActivity {
    /// The table (one of [`MAINTAINED_TABLES`]).
    pub table: String,
    /// Live tuples (estimate).
    pub live: i64,
    /// Dead tuples (estimate) since the last vacuum.
    pub dead: i64,
    /// Rows inserted, updated or deleted since the last analyze.
    pub modified: i64,
    /// The table does not opt out of autovacuum (`autovacuum_enabled` reloption).
    pub autovacuum_enabled: bool,
}

/// What to run on a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Maintenance {
    /// `VACUUM (ANALYZE, SKIP_LOCKED)`: reclaims dead tuples and refreshes the statistics.
    Vacuum,
    /// `ANALYZE (SKIP_LOCKED)`: statistics only (a table that mostly grows).
    Analyze,
}

impl Maintenance {
    /// The metrics label.
    pub fn label(self) -> &'static str {
        match self {
            Maintenance::Vacuum => "vacuum",
            Maintenance::Analyze => "analyze",
        }
    }
}

/// A VACUUM of a million-row table can outlast `store.statement_timeout`; it runs on a session
/// of its own with this bound instead (the session is closed afterwards).
const MAINTENANCE_TIMEOUT_MS: u64 = 30 * 60 * 1000;

impl Store {
    /// Whether the server's autovacuum runs at all (`autovacuum` and `track_counts`, which it
    /// needs, both on).
    pub async fn server_autovacuum(&self) -> Result<bool, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT current_setting('autovacuum')::bool AND current_setting('track_counts')::bool",
        )
        .fetch_one(self.pool())
        .await?)
    }

    /// The activity counters of our tables in the current schema.
    pub async fn table_activity(&self) -> Result<Vec<TableActivity>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT s.relname::text AS table, s.n_live_tup AS live, s.n_dead_tup AS dead, \
                    s.n_mod_since_analyze AS modified, \
                    NOT EXISTS (SELECT 1 FROM unnest(c.reloptions) o \
                                WHERE lower(o) IN ('autovacuum_enabled=false', \
                                  'autovacuum_enabled=off', 'autovacuum_enabled=0', \
                                  'autovacuum_enabled=no')) AS autovacuum_enabled \
             FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid \
             WHERE s.relname = ANY($1) AND pg_table_is_visible(s.relid) \
             ORDER BY s.relname",
        )
        .bind(MAINTAINED_TABLES)
        .fetch_all(self.pool())
        .await?)
    }

    /// Runs `what` on `table` (one of [`MAINTAINED_TABLES`]) on a session of its own: VACUUM
    /// cannot run in a transaction and may take longer than our statement timeout. A table
    /// another session holds a conflicting lock on is skipped (`SKIP_LOCKED`), not waited for.
    pub async fn maintain_table(&self, table: &str, what: Maintenance) -> Result<(), StoreError> {
        let Some(table) = MAINTAINED_TABLES.iter().find(|t| **t == table) else {
            return Err(StoreError::NotOurTable(table.to_string()));
        };
        let mut conn = self.pool().acquire().await?.detach();
        let result = async {
            sqlx::raw_sql(&format!("SET statement_timeout = {MAINTENANCE_TIMEOUT_MS}"))
                .execute(&mut conn)
                .await?;
            let sql = match what {
                Maintenance::Vacuum => format!("VACUUM (ANALYZE, SKIP_LOCKED) \"{table}\""),
                Maintenance::Analyze => format!("ANALYZE (SKIP_LOCKED) \"{table}\""),
            };
            sqlx::raw_sql(&sql).execute(&mut conn).await?;
            Ok::<_, sqlx::Error>(())
        }
        .await;
        let _ = conn.close().await;
        Ok(result?)
    }
}
