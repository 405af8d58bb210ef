//! Phase 1: the inbox backlog, bulk-loaded with multi-row `INSERT … VALUES` statements on a
//! few connections, as upstream would have written it.

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::Utc;
use chrono_tz::Tz;
use msgx_core::inbox::names::Ident;
use msgx_core::inbox::names::InboxNames;
use msgx_core::inbox::time::utc_to_local;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::{ConnectOptions, Connection};

use super::statement_for;

/// Rows per inbox load statement (fewer when the messages are large, see `load_inbox`).
const LOAD_ROWS_PER_STATEMENT: u64 = 2_000;
/// Load statements per inbox transaction.
const LOAD_STATEMENTS_PER_TX: u64 = 10;
/// Concurrent inbox load connections (both loaders).
const LOAD_CONNECTIONS: usize = 4;
/// Bytes of bound data per load statement, well under the default 16 MiB `max_allowed_packet`.
const LOAD_BYTES_PER_STATEMENT: u64 = 4 * 1024 * 1024;

/// The loaded backlog.
#[derive(Debug)]
pub(super) struct Loaded {
    /// Load wall time.
    pub(super) elapsed: Duration,
    /// Lowest inbox id.
    pub(super) min_id: i64,
    /// Highest inbox id (the poller is done when W reaches it).
    pub(super) max_id: i64,
}

/// Bulk-loads `rows` inbox rows on a few connections and checks the ids are contiguous.
pub(super) async fn load_inbox(
    url: &str,
    names: &InboxNames,
    tz: Tz,
    rows: u64,
    msg_bytes: usize,
) -> anyhow::Result<Loaded> {
    let options = load_options(url)?;
    let per_statement =
        (LOAD_BYTES_PER_STATEMENT / (msg_bytes as u64 + 64)).clamp(1, LOAD_ROWS_PER_STATEMENT);
    let filler = filler_message(msg_bytes);
    let next = AtomicU64::new(0);
    let job = LoadJob {
        names,
        tz,
        total: rows,
        per_statement,
        per_tx: per_statement * LOAD_STATEMENTS_PER_TX,
        filler: &filler,
        next: &next,
    };
    let elapsed = load_on_connections(&options, async |conn| job.worker(conn).await).await?;
    let (count, min_id, max_id) = loaded_ids(&options, names).await?;
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

/// The bench inbox's connection options, for loading (no statement log: a load is millions of
/// rows).
pub(super) fn load_options(url: &str) -> anyhow::Result<MySqlConnectOptions> {
    Ok(MySqlConnectOptions::from_str(url)
        .context("parsing the bench inbox URL")?
        .disable_statement_logging())
}

/// Runs `worker` on [`LOAD_CONNECTIONS`] connections at once, each opened for it and closed
/// after; the wall time of the whole load.
pub(super) async fn load_on_connections(
    options: &MySqlConnectOptions,
    worker: impl AsyncFn(&mut MySqlConnection) -> anyhow::Result<()>,
) -> anyhow::Result<Duration> {
    let on_one = async || {
        let mut conn = options
            .connect()
            .await
            .context("connecting a load connection")?;
        worker(&mut conn).await?;
        conn.close().await.context("closing a load connection")
    };
    let started = Instant::now();
    futures::future::try_join_all((0..LOAD_CONNECTIONS).map(|_| on_one()))
        .await
        .context("loading the inbox backlog")?;
    Ok(started.elapsed())
}

/// `INSERT INTO <table> (<columns>) VALUES (?,…),…` for `rows` rows of `columns`.
pub(super) fn insert_sql(table: &Ident, columns: &[&Ident], rows: u64) -> String {
    let names: Vec<String> = columns.iter().map(ToString::to_string).collect();
    let row = format!("({})", vec!["?"; columns.len()].join(","));
    let mut sql = format!("INSERT INTO {table} ({}) VALUES ", names.join(", "));
    for i in 0..rows {
        if i > 0 {
            sql.push(',');
        }
        sql.push_str(&row);
    }
    sql
}

/// Rows in the bench inbox and their lowest and highest id, after a load.
pub(super) async fn loaded_ids(
    options: &MySqlConnectOptions,
    names: &InboxNames,
) -> anyhow::Result<(i64, Option<i64>, Option<i64>)> {
    let mut conn = options
        .connect()
        .await
        .context("connecting to the bench inbox")?;
    let found = sqlx::query_as(&format!(
        "SELECT COUNT(*), MIN({id}), MAX({id}) FROM {t}",
        id = names.id,
        t = names.table
    ))
    .fetch_one(&mut conn)
    .await
    .context("counting the loaded inbox rows")?;
    conn.close().await.context("closing the inbox connection")?;
    Ok(found)
}

/// What every load worker shares.
struct LoadJob<'a> {
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
    /// `INSERT … VALUES` of `rows` `(received, message)` rows into the inbox table.
    fn insert_sql(&self, rows: u64) -> String {
        insert_sql(
            &self.names.table,
            &[&self.names.received, &self.names.message],
            rows,
        )
    }

    /// One connection: takes a transaction's worth of rows at a time until none are left.
    async fn worker(&self, conn: &mut MySqlConnection) -> anyhow::Result<()> {
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
                let sql = statement_for(n, self.per_statement, &full_sql, |n| self.insert_sql(n));
                let received = utc_to_local(Utc::now(), self.tz);
                let mut query = sqlx::query(&sql);
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
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filler_has_the_asked_size() {
        for n in [0, 5, 16, 300, 1000] {
            assert_eq!(filler_message(n).len(), n);
        }
    }
}
