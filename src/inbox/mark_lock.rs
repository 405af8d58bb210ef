//! Keeping the mark off rows another inbox session holds (issue 29 item 4).
//!
//! The DB owner (or any of its tools) may hold an inbox row `SELECT … FOR UPDATE` for a long
//! time. A mark UPDATE that waits on such a row used to wait until our client-side timeout,
//! which looked like a broken connection and charged the whole batch. Two ways out:
//!
//! - **skip** (MariaDB ≥ 10.6, MySQL ≥ 8.0): the mark transaction first locks the rows it may
//!   write with `SELECT … FOR UPDATE SKIP LOCKED`; the rows held elsewhere are simply not
//!   returned, are not written, and come back as *skipped*;
//! - **bounded wait** (MySQL 5.7, older MariaDB, or a server that refuses the probe): the mark
//!   session's `innodb_lock_wait_timeout` is `backfill.lock_wait` (whole seconds), far below
//!   `backfill.mark_budget`; a lock wait ends in error 1205, a per-row outcome the sweep
//!   isolates by splitting the group ([`InboxError::is_lock_conflict`]).
//!
//! Which one a server supports is probed once (a `FOR UPDATE SKIP LOCKED` on no row, rolled
//! back) and remembered for the life of the adapter.

use std::time::Duration;

use sqlx::mysql::MySqlDatabaseError;
use sqlx::Executor as _;

use super::{Inbox, InboxError};

/// How a mark transaction keeps off rows held by another session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockAvoidance {
    /// Use `FOR UPDATE SKIP LOCKED` where the server supports it (`backfill.skip_locked`).
    pub skip_locked: bool,
    /// The mark session's `innodb_lock_wait_timeout` (`backfill.lock_wait`, ≥ 1 s).
    pub lock_wait: Duration,
}

impl LockAvoidance {
    /// `SET SESSION innodb_lock_wait_timeout = n` (whole seconds, at least 1: MySQL's minimum).
    pub(super) fn session_statement(&self) -> String {
        format!(
            "SET SESSION innodb_lock_wait_timeout = {}",
            self.lock_wait.as_secs().max(1)
        )
    }
}

/// The server refused the statement itself: syntax (1064: MySQL 5.7, MariaDB < 10.6) or
/// privilege (1142, 1143, 1227). Anything else (a missing table, …) is not an answer about
/// SKIP LOCKED.
fn refused(db: &(dyn sqlx::error::DatabaseError + 'static)) -> bool {
    db.try_downcast_ref::<MySqlDatabaseError>()
        .is_some_and(|m| matches!(m.number(), 1064 | 1142 | 1143 | 1227))
}

/// MySQL error numbers that say "another session holds a row this statement needs": lock wait
/// timeout (1205), deadlock (1213), `NOWAIT` refused (3572).
const LOCK_CONFLICTS: [u16; 3] = [1205, 1213, 3572];

impl InboxError {
    /// The server refused the statement (see [`refused`]).
    fn is_refusal(&self) -> bool {
        matches!(self, Self::Db(sqlx::Error::Database(db)) if refused(db.as_ref()))
    }

    /// True when the statement failed on a row lock held by another session: an outcome of
    /// the rows, not of the connection (nothing was written; the transaction may continue or
    /// be rolled back).
    pub fn is_lock_conflict(&self) -> bool {
        match self {
            Self::Db(sqlx::Error::Database(db)) => db
                .try_downcast_ref::<MySqlDatabaseError>()
                .is_some_and(|m| LOCK_CONFLICTS.contains(&m.number())),
            _ => false,
        }
    }
}

impl Inbox {
    /// Whether the mark may use `FOR UPDATE SKIP LOCKED` on this server. Probed on first use
    /// and remembered once the server answered; an unreachable server answers `false` for now
    /// (the bounded wait works everywhere) and is probed again next time.
    pub async fn skip_locked_supported(&self) -> bool {
        if let Some(known) = self.skip_locked.get() {
            return *known;
        }
        match self.probe_skip_locked().await {
            Ok(supported) => {
                let _ = self.skip_locked.set(supported);
                supported
            }
            Err(e) => {
                tracing::debug!(error = %e, "inbox: SKIP LOCKED probe failed; bounded lock wait for now");
                false
            }
        }
    }

    /// `Ok(false)` when the server refused the statement (syntax on MySQL 5.7 / MariaDB < 10.6,
    /// or no privilege for a locking read); `Err` when it did not answer.
    async fn probe_skip_locked(&self) -> Result<bool, InboxError> {
        let stmt = self
            .names
            .sql("SELECT {id} FROM {table} WHERE {id} = -1 FOR UPDATE SKIP LOCKED");
        let mut conn = self.timed(self.pool.acquire()).await?;
        let probe = async {
            let c: &mut sqlx::MySqlConnection = &mut conn;
            c.execute("BEGIN").await?;
            let done = c.execute(stmt.as_str()).await;
            c.execute("ROLLBACK").await?;
            done
        };
        let answer = self.timed(probe).await;
        if matches!(&answer, Err(e) if !e.is_refusal()) {
            // Possibly mid-transaction: closed, never pooled.
            drop(conn.detach());
        }
        match answer {
            Ok(_) => {
                tracing::info!(
                    "inbox: marks skip rows held by other sessions (FOR UPDATE SKIP LOCKED)"
                );
                Ok(true)
            }
            Err(InboxError::Db(sqlx::Error::Database(db))) if refused(db.as_ref()) => {
                tracing::warn!(
                    error = %db,
                    "inbox: the server refuses FOR UPDATE SKIP LOCKED (needs MariaDB 10.6+ / \
                     MySQL 8.0 and a locking-read privilege); marks fall back to a bounded lock \
                     wait (backfill.lock_wait) and isolate locked rows by splitting"
                );
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}
