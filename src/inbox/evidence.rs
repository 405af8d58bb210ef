//! Transaction evidence for holes (`late.hole_evidence`, docs/hole-evidence.md): the MySQL
//! server's clock and its list of open InnoDB transactions (`information_schema.INNODB_TRX`).
//!
//! Both are read **in the server's system time zone**, because that is the zone
//! `INNODB_TRX.trx_started` is shown in whatever the session's `time_zone` is (MariaDB 10.11
//! and MySQL both render it with the server's `localtime`), while `NOW()` follows the session
//! (sqlx sets `+00:00` on every connection). Comparing `NOW()` with `trx_started` directly
//! would be off by the server's UTC offset — on a server in Asia/Shanghai every open
//! transaction would look 8 hours younger than it is. `CONVERT_TZ(NOW(6),
//! @@session.time_zone, 'SYSTEM')` puts "now" in the same zone; the values are only ever
//! compared with each other, never with our own clock.
//!
//! Reading `INNODB_TRX` needs the `PROCESS` privilege. Without it (or without the table) the
//! evidence is [`EvidenceError::Unavailable`]: logged once, and the poller falls back to the
//! plain `max_commit_delay` rule. The evidence is only valid on the primary: a replica's list
//! shows its own applier, not the upstream's open transactions.

use std::sync::atomic::{AtomicBool, Ordering};

use chrono::NaiveDateTime;
use sqlx::mysql::MySqlDatabaseError;
use sqlx::Row;

use super::{Inbox, InboxError};

/// "Now" on the server, in the zone `INNODB_TRX.trx_started` is shown in.
const SERVER_NOW: &str = "SELECT CONVERT_TZ(NOW(6), @@session.time_zone, 'SYSTEM')";

/// The server's "now", the start of the oldest open transaction that may hold an inbox id,
/// and whether this connection's own transaction is in the list (the freshness marker).
///
/// Not counted: autocommit non-locking SELECTs (`trx_autocommit_non_locking = 1`) — they
/// cannot have inserted a row, and they are what every reader of this service runs (the
/// poller, the pump's raw reads), on whichever pooled connection; and the reading connection
/// itself (its marker transaction, below). Everything else counts, however unrelated to the
/// inbox it looks: a transaction that took an id can sit in a lock wait before its first undo
/// record, so "has modified rows" would not be a safe filter.
///
/// `INNODB_TRX` is a cache that InnoDB refreshes only when it has not been *read* for 100 ms,
/// so a reader polling it faster than that freezes it. The statement therefore runs inside a
/// transaction that first reads the inbox (which registers it with InnoDB): the snapshot is
/// only used when it contains that transaction, i.e. was taken after it started.
const SNAPSHOT: &str = "SELECT CONVERT_TZ(NOW(6), @@session.time_zone, 'SYSTEM'), \
     (SELECT MIN(trx_started) FROM information_schema.INNODB_TRX \
      WHERE trx_autocommit_non_locking = 0 AND trx_mysql_thread_id <> CONNECTION_ID()), \
     (SELECT COUNT(*) FROM information_schema.INNODB_TRX \
      WHERE trx_mysql_thread_id = CONNECTION_ID())";

/// Pause before the second attempt when the first snapshot was stale (the cache refreshes
/// only after 100 ms without readers).
const STALE_RETRY_AFTER: std::time::Duration = std::time::Duration::from_millis(150);

/// Set while the evidence is unavailable, so the warning is logged once (again after it came
/// back and was lost again). Process-wide: it only governs logging.
static UNAVAILABLE_LOGGED: AtomicBool = AtomicBool::new(false);

/// What one read of the transaction list saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrxSnapshot {
    /// Server time of the read (statement start), in the server's system zone. The list
    /// itself is newer than the start of the reading transaction (checked), and that started
    /// after every earlier statement of this process.
    pub read_at: NaiveDateTime,
    /// `trx_started` of the oldest open transaction that counts; None when there is none.
    pub oldest_started: Option<NaiveDateTime>,
}

/// Why there is no evidence.
#[derive(Debug, thiserror::Error)]
pub enum EvidenceError {
    /// The account may not read the transaction list (no `PROCESS` privilege), the table does
    /// not exist, or the server time cannot be expressed in its system zone. Permanent until
    /// the configuration changes: use the timer rule.
    #[error("hole evidence unavailable: {0}")]
    Unavailable(String),
    /// The list was an old cached copy twice in a row (something reads `INNODB_TRX` more
    /// often than every 100 ms): no evidence this round.
    #[error("information_schema.INNODB_TRX returned a stale cached snapshot")]
    Stale,
    /// A timeout or connection failure: no evidence this round.
    #[error(transparent)]
    Inbox(#[from] InboxError),
}

impl EvidenceError {
    fn from_inbox(e: InboxError) -> Self {
        match &e {
            InboxError::Db(sqlx::Error::Database(db)) => {
                match db
                    .try_downcast_ref::<MySqlDatabaseError>()
                    .map(|m| m.number())
                {
                    // 1227 ER_SPECIFIC_ACCESS_DENIED_ERROR (needs PROCESS), 1142 table access
                    // denied, 1044 database access denied, 1109 unknown table.
                    Some(1227 | 1142 | 1044 | 1109) => Self::Unavailable(db.message().to_string()),
                    _ => Self::Inbox(e),
                }
            }
            _ => Self::Inbox(e),
        }
    }
}

impl Inbox {
    /// The server's current time (microseconds) in its system zone: the hole's first sighting
    /// for the evidence rule. Needs no privilege.
    pub async fn server_now(&self) -> Result<NaiveDateTime, EvidenceError> {
        let now: Option<NaiveDateTime> = self
            .timed(sqlx::query_scalar(SERVER_NOW).fetch_one(&self.pool))
            .await
            .map_err(EvidenceError::from_inbox)?;
        now.ok_or_else(|| {
            EvidenceError::Unavailable(
                "CONVERT_TZ(NOW(), session zone, 'SYSTEM') is NULL on this server".into(),
            )
        })
    }

    /// The server time and the oldest open transaction, read in one statement inside a
    /// short read-only transaction that proves the list fresh (see [`TrxSnapshot`]); one retry
    /// when the cached list was stale. Logs the first [`EvidenceError::Unavailable`] at WARN
    /// and when the evidence comes back.
    pub async fn trx_snapshot(&self) -> Result<TrxSnapshot, EvidenceError> {
        let mut result = self.trx_snapshot_once().await;
        if matches!(result, Err(EvidenceError::Stale)) {
            tokio::time::sleep(STALE_RETRY_AFTER).await;
            result = self.trx_snapshot_once().await;
        }
        match &result {
            Err(EvidenceError::Unavailable(reason)) => {
                if !UNAVAILABLE_LOGGED.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        reason = %reason,
                        "late.hole_evidence is on but the inbox account cannot read \
                         information_schema.INNODB_TRX (grant PROCESS, on the primary); \
                         holes follow the max_commit_delay timer rule"
                    );
                }
            }
            Ok(_) => {
                if UNAVAILABLE_LOGGED.swap(false, Ordering::Relaxed) {
                    tracing::info!("hole evidence available again");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "no transaction evidence this round; timer rule");
            }
        }
        result
    }

    async fn trx_snapshot_once(&self) -> Result<TrxSnapshot, EvidenceError> {
        let inbox = |e: InboxError| EvidenceError::from_inbox(e);
        let mut tx = self.timed(self.pool.begin()).await.map_err(inbox)?;
        // Registers the transaction with InnoDB (the marker); dropped = rolled back.
        self.timed(sqlx::query(&self.sql.max_id).fetch_one(&mut *tx))
            .await
            .map_err(inbox)?;
        let row = self
            .timed(sqlx::query(SNAPSHOT).fetch_one(&mut *tx))
            .await
            .map_err(inbox)?;
        self.timed(tx.rollback()).await.map_err(inbox)?;
        let decode = |e: sqlx::Error| EvidenceError::Inbox(e.into());
        let read_at: Option<NaiveDateTime> = row.try_get(0).map_err(decode)?;
        let oldest_started: Option<NaiveDateTime> = row.try_get(1).map_err(decode)?;
        let marker: i64 = row.try_get(2).map_err(decode)?;
        let read_at = read_at.ok_or_else(|| {
            EvidenceError::Unavailable(
                "CONVERT_TZ(NOW(), session zone, 'SYSTEM') is NULL on this server".into(),
            )
        })?;
        if marker == 0 {
            return Err(EvidenceError::Stale);
        }
        Ok(TrxSnapshot {
            read_at,
            oldest_started,
        })
    }
}
