//! `[inbox]` (the shared MySQL inbox we read and mark) and `[store]` (our own PostgreSQL).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::tls::{check_connect, ConnectKeys, INBOX_TLS, STORE_TLS};
use super::{check_nonzero, check_positive, duration, invalid, SettingsError};

/// Connection and naming of the shared inbox.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct InboxSettings {
    /// `url` (`mysql://…`), `password` and the TLS keys, as `inbox.url` etc. (flattened).
    #[serde(flatten)]
    pub connect: ConnectKeys,
    /// Zone the inbox DATETIME columns are written in (they carry none).
    pub timezone: String,
    /// Opening a connection may take this long before the round counts as failed.
    #[serde(with = "duration")]
    pub connect_timeout: Duration,
    /// One inbox statement may take this long; a slow inbox is an infrastructure failure.
    #[serde(with = "duration")]
    pub query_timeout: Duration,
    /// Pool size; the poller needs one, the pump and sweeper one each later.
    pub max_connections: u32,
    /// Inbound table name (DB owner's contract).
    pub table: String,
    /// Auto-increment id column.
    pub id_column: String,
    /// Receive time column (DATETIME, nullable).
    pub received_column: String,
    /// Raw message column (LONGTEXT).
    pub message_column: String,
    /// Processed-time mark column.
    pub processed_column: String,
    /// Processed-status mark column.
    pub status_column: String,
    /// Outbound table name (written by the outbound path, created only by the dev fixture).
    pub out_table: String,
    /// MySQL `net_read_timeout` of our sessions (whole seconds): a stalled read is an error.
    #[serde(with = "duration")]
    pub read_timeout: Duration,
    /// MySQL `net_write_timeout` of our sessions (whole seconds).
    #[serde(with = "duration")]
    pub write_timeout: Duration,
}

impl InboxSettings {
    /// URL scheme, pool, timeouts. The zone and the names are checked by
    /// [`Settings::inbox_timezone`](super::Settings::inbox_timezone) and
    /// [`Settings::inbox_names`](super::Settings::inbox_names).
    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        check_connect(&INBOX_TLS, &self.connect)?;
        check_positive(self.max_connections, "inbox.max_connections")?;
        check_nonzero(self.connect_timeout, "inbox.connect_timeout")?;
        check_nonzero(self.query_timeout, "inbox.query_timeout")?;
        // MySQL takes these in whole seconds.
        for (key, d) in [
            ("inbox.read_timeout", self.read_timeout),
            ("inbox.write_timeout", self.write_timeout),
        ] {
            if d < Duration::from_secs(1) || d > Duration::from_secs(3600) {
                return Err(invalid(key, "outside 1s..=1h (MySQL counts whole seconds)"));
            }
        }
        Ok(())
    }
}

/// Own PostgreSQL.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSettings {
    /// `url` (`postgres://…`), `password` and the TLS keys, as `store.url` etc. (flattened).
    #[serde(flatten)]
    pub connect: ConnectKeys,
    /// Pool size.
    pub max_connections: u32,
    /// Opening a connection may take this long.
    #[serde(with = "duration")]
    pub connect_timeout: Duration,
    /// Create the database named in `url` when it does not exist (dev and demo convenience).
    pub create_database: bool,
    /// `run` brings an older or empty schema to this binary's at start; off: it refuses to
    /// start instead (sites that migrate by hand with `msgexchange migrate`).
    pub migrate_at_start: bool,
    /// How long start-up waits for the single-instance lock (a killed predecessor's session
    /// may take a moment to end) before refusing to start.
    #[serde(with = "duration")]
    pub instance_lock_wait: Duration,
    /// PostgreSQL `statement_timeout` of our sessions (migrations run without it).
    #[serde(with = "duration")]
    pub statement_timeout: Duration,
    /// PostgreSQL `lock_timeout`: a lock held by a frozen old instance fails the step instead
    /// of blocking it for ever.
    #[serde(with = "duration")]
    pub lock_timeout: Duration,
    /// PostgreSQL `idle_in_transaction_session_timeout`: a session that froze inside a
    /// transaction (SIGSTOP, a hung client) is ended by the server and its locks released.
    #[serde(with = "duration")]
    pub idle_in_transaction_timeout: Duration,
}

impl StoreSettings {
    /// URL scheme, pool and the session timeouts.
    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        check_connect(&STORE_TLS, &self.connect)?;
        check_positive(self.max_connections, "store.max_connections")?;
        check_nonzero(self.connect_timeout, "store.connect_timeout")?;
        check_nonzero(self.statement_timeout, "store.statement_timeout")?;
        check_nonzero(self.lock_timeout, "store.lock_timeout")?;
        check_nonzero(
            self.idle_in_transaction_timeout,
            "store.idle_in_transaction_timeout",
        )?;
        if self.lock_timeout > self.statement_timeout {
            return Err(invalid(
                "store.lock_timeout",
                "longer than store.statement_timeout",
            ));
        }
        Ok(())
    }
}
