//! The shared MySQL inbox adapter. It reads rows and, in later stages, writes only the
//! processed-mark columns: no DDL, no DELETE, ever (the DB owner's tables, SPEC §0).

mod auto_increment;
mod connect;
pub mod evidence;
pub mod mark;
pub mod mark_lock;
mod meta;
pub mod names;
pub mod primary;
pub mod survey;
pub mod time;

use std::time::Duration;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::Row;

use crate::settings::InboxSettings;
pub use connect::connect_options;
pub use meta::RowMeta;
use names::InboxNames;

/// Why an inbox call failed. All of these are infrastructure failures: never "no rows".
#[derive(Debug, thiserror::Error)]
pub enum InboxError {
    /// The URL could not be parsed.
    #[error("inbox url `{url}` is invalid: {source}")]
    Url {
        url: String,
        #[source]
        source: sqlx::Error,
    },
    /// The statement did not finish within `inbox.query_timeout`.
    #[error("inbox statement timed out after {0:?}")]
    Timeout(Duration),
    /// Connection, permission, missing table, …
    #[error("inbox statement failed: {0}")]
    Db(#[from] sqlx::Error),
}

impl InboxError {
    /// True when the inbox was unreachable or did not answer in time ([`crate::outage`]).
    pub fn is_outage(&self) -> bool {
        match self {
            Self::Timeout(_) => true,
            Self::Url { .. } => false,
            Self::Db(e) => crate::outage::is_outage(e),
        }
    }
}

/// One inbox row as discovery sees it: never the message text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InboxRow {
    /// `CMINMSGS_ID`.
    pub id: i64,
    /// `CMINMSGS_DATE_RECEIVED` read as airport local time; None when NULL or unreadable.
    pub received_at: Option<DateTime<Utc>>,
}

/// The inbox adapter.
#[derive(Debug, Clone)]
pub struct Inbox {
    /// Lazily connected: an unreachable inbox must not stop the service from starting.
    pool: MySqlPool,
    /// Zone the DATETIME columns are written in.
    tz: Tz,
    /// Per-statement limit.
    query_timeout: Duration,
    /// Prebuilt statements (names are config).
    sql: InboxSql,
    /// The names, for the operator look-ups built per call ([`Inbox::row_meta`]).
    names: InboxNames,
    /// Whether the server takes `FOR UPDATE SKIP LOCKED` (probed once: [`mark_lock`]).
    skip_locked: std::sync::Arc<std::sync::OnceLock<bool>>,
}

/// The raw text of one inbox row, as the processor reads it (outside any PG transaction).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawMessage {
    /// No such row: it was purged (or never existed), or is gone for a moment (a table
    /// rotation): read again for `processing.missing_row_grace`, then DEAD(MALFORMED).
    Missing,
    /// The row holds no text.
    Empty,
    /// Larger than the limit: not transferred at all.
    TooLarge(u64),
    /// The text.
    Text(String),
}

#[derive(Debug, Clone)]
struct InboxSql {
    rows_after: String,
    id_range: String,
    max_id: String,
    /// Prefix of the raw read; the `IN (…)` list is appended per call.
    raw_prefix: String,
    /// The raw read of the rows after an id, in id order (the pump's read behind a group).
    raw_after: String,
}

impl InboxSql {
    fn new(n: &InboxNames) -> Self {
        Self {
            // CAST AS CHAR: a zero or odd date must not fail decoding the whole batch.
            rows_after: n.sql(
                "SELECT {id}, CAST({received} AS CHAR) FROM {table} WHERE {id} > ? ORDER BY {id} LIMIT ?",
            ),
            id_range: n.sql("SELECT MIN({id}), MAX({id}) FROM {table}"),
            max_id: n.sql("SELECT MAX({id}) FROM {table}"),
            // LENGTH first: a huge message is refused without moving it over the wire.
            raw_prefix: n.sql(
                "SELECT {id}, LENGTH({message}), CASE WHEN LENGTH({message}) <= ? THEN {message} END \
                 FROM {table} WHERE {id} IN ",
            ),
            raw_after: n.sql(
                "SELECT {id}, LENGTH({message}), CASE WHEN LENGTH({message}) <= ? THEN {message} END \
                 FROM {table} WHERE {id} > ? ORDER BY {id} LIMIT ?",
            ),
        }
    }
}

impl Inbox {
    /// Builds the adapter; connections open on first use.
    pub fn new(settings: &InboxSettings, names: &InboxNames, tz: Tz) -> Result<Self, InboxError> {
        let options = connect_options(settings)?;
        // Session bounds (whole seconds): a stalled connection or a lock held by someone else
        // fails the statement on the server too, not only our client-side query_timeout.
        let session = format!(
            "SET SESSION net_read_timeout = {}, net_write_timeout = {}, innodb_lock_wait_timeout = {}",
            settings.read_timeout.as_secs().max(1),
            settings.write_timeout.as_secs().max(1),
            settings.query_timeout.as_secs_f64().ceil().max(1.0) as u64,
        );
        let pool = MySqlPoolOptions::new()
            .max_connections(settings.max_connections)
            .acquire_timeout(settings.connect_timeout)
            .after_connect(move |conn, _| {
                let session = session.clone();
                Box::pin(async move {
                    use sqlx::Executor as _;
                    conn.execute(session.as_str()).await?;
                    Ok(())
                })
            })
            .connect_lazy_with(options);
        Ok(Self {
            pool,
            tz,
            query_timeout: settings.query_timeout,
            sql: InboxSql::new(names),
            names: names.clone(),
            skip_locked: Default::default(),
        })
    }

    /// The pool, for the dev tools acting as the DB owner.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// `id > after`, ascending, at most `limit` rows; ids and receive times only.
    pub async fn rows_after(&self, after: i64, limit: u32) -> Result<Vec<InboxRow>, InboxError> {
        let rows = self
            .timed(
                sqlx::query(&self.sql.rows_after)
                    .bind(after)
                    .bind(limit)
                    .fetch_all(&self.pool),
            )
            .await?;
        rows.iter()
            .map(|row| {
                let id: i64 = row.try_get(0)?;
                let raw: Option<String> = row.try_get(1)?;
                let received_at = raw.as_deref().and_then(|s| time::local_to_utc(s, self.tz));
                if raw.is_some() && received_at.is_none() {
                    tracing::warn!(
                        msg_id = id,
                        raw = raw.as_deref(),
                        "inbox receive time unreadable; stored as NULL"
                    );
                }
                Ok(InboxRow { id, received_at })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(InboxError::from)
    }

    /// `(MIN(id), MAX(id))`, None for an empty inbox.
    pub async fn id_range(&self) -> Result<Option<(i64, i64)>, InboxError> {
        let row = self
            .timed(sqlx::query(&self.sql.id_range).fetch_one(&self.pool))
            .await?;
        let min: Option<i64> = row.try_get(0)?;
        let max: Option<i64> = row.try_get(1)?;
        Ok(min.zip(max))
    }

    /// `MAX(id)`: the inbox head, for lag.
    pub async fn max_id(&self) -> Result<Option<i64>, InboxError> {
        let row = self
            .timed(sqlx::query(&self.sql.max_id).fetch_one(&self.pool))
            .await?;
        Ok(row.try_get(0)?)
    }

    /// Raw texts of these rows (one statement); ids without a row come back `Missing`.
    pub async fn raw_messages(
        &self,
        ids: &[i64],
        max_bytes: u64,
    ) -> Result<Vec<(i64, RawMessage)>, InboxError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let placeholders = vec!["?"; ids.len()].join(",");
        let sql = format!("{}({placeholders})", self.sql.raw_prefix);
        let mut query = sqlx::query(&sql).bind(max_bytes);
        for id in ids {
            query = query.bind(id);
        }
        let rows = self.timed(query.fetch_all(&self.pool)).await?;
        let mut found = std::collections::HashMap::with_capacity(rows.len());
        for row in &rows {
            let (id, raw) = raw_of(row)?;
            found.insert(id, raw);
        }
        Ok(ids
            .iter()
            .map(|id| (*id, found.remove(id).unwrap_or(RawMessage::Missing)))
            .collect())
    }

    /// Raw texts of up to `limit` rows after `after`, in id order (one statement). An id
    /// without a row is simply not there: nothing here says "missing".
    pub async fn raw_messages_after(
        &self,
        after: i64,
        limit: u32,
        max_bytes: u64,
    ) -> Result<Vec<(i64, RawMessage)>, InboxError> {
        let query = sqlx::query(&self.sql.raw_after)
            .bind(max_bytes)
            .bind(after)
            .bind(limit);
        let rows = self.timed(query.fetch_all(&self.pool)).await?;
        rows.iter().map(raw_of).collect()
    }

    async fn timed<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, InboxError> {
        within(self.query_timeout, fut, InboxError::Timeout).await
    }
}

/// `fut`, a statement on the inbox server (the inbox or the outbound table), given `limit`
/// to answer: one that does not fails with `timed_out(limit)`.
pub(crate) async fn within<T, E: From<sqlx::Error>>(
    limit: Duration,
    fut: impl std::future::Future<Output = Result<T, sqlx::Error>>,
    timed_out: fn(Duration) -> E,
) -> Result<T, E> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r.map_err(E::from),
        Err(_) => Err(timed_out(limit)),
    }
}

/// One row of a raw read: its id and text (`LENGTH` first: a text over the limit is not sent).
fn raw_of(row: &sqlx::mysql::MySqlRow) -> Result<(i64, RawMessage), InboxError> {
    let id: i64 = row.try_get(0)?;
    let len: Option<i64> = row.try_get(1)?;
    let text: Option<String> = row.try_get(2)?;
    let raw = match (len, text) {
        (None, _) | (Some(0), _) => RawMessage::Empty,
        (Some(_), Some(text)) if text.trim().is_empty() => RawMessage::Empty,
        (Some(_), Some(text)) => RawMessage::Text(text),
        (Some(len), None) => RawMessage::TooLarge(len.max(0) as u64),
    };
    Ok((id, raw))
}
