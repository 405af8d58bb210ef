//! The processed mark: the only inbox columns we ever write (SPEC §0, seed §5.2).
//!
//! A mark is the DB owner's status value in the status column plus the processed time (airport
//! local time) in the processed column. **Empty mark** means: the status column is NULL or
//! holds only blanks (`TRIM(status) = ''`). Anything else in it — our value, a legacy value, a
//! value some other system wrote — is a mark, and it is never overwritten. The processed time
//! is written only where it is NULL (`COALESCE`), so an odd row with a blank status but a
//! processed time keeps that time.
//!
//! Both statements are batched: one existence check (`SELECT id, status … WHERE id IN (…)`)
//! and one conditional `UPDATE … WHERE id IN (…) AND <empty>` per batch — never a round trip
//! per row. The `IN` list is built per call with `?` placeholders; names come from config as
//! validated identifiers, values are always bound.
//!
//! The UPDATE is never autocommitted: [`Inbox::stage_marks`] runs it in its own inbox
//! transaction and hands back [`StagedMarks`], which the sweeper commits only once it has
//! re-checked its PostgreSQL lock on the rows (G5). A statement that outlives its timeout on
//! our side is therefore never committed on the server's side.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlConnection;
use sqlx::pool::PoolConnection;
use sqlx::{Executor as _, MySql, Row};

use super::mark_lock::LockAvoidance;
use super::names::InboxNames;
use super::time::utc_to_local;
use super::{Inbox, InboxError};

/// The mark statements for one set of inbox names (built once, at start).
#[derive(Debug, Clone)]
pub struct MarkSql {
    /// `SELECT id, status FROM t WHERE id IN ` — the list is appended per call.
    check_prefix: String,
    /// `UPDATE t SET status = ?, processed = COALESCE(processed, ?) WHERE <empty> AND id IN `.
    write_prefix: String,
    /// `SELECT id FROM t WHERE id IN ` — then the list and ` FOR UPDATE SKIP LOCKED`.
    lock_prefix: String,
}

impl MarkSql {
    /// Builds the statements from validated names.
    pub fn new(n: &InboxNames) -> Self {
        Self {
            check_prefix: n.sql("SELECT {id}, {status} FROM {table} WHERE {id} IN "),
            write_prefix: n.sql(
                "UPDATE {table} SET {status} = ?, {processed} = COALESCE({processed}, ?) \
                 WHERE ({status} IS NULL OR TRIM({status}) = '') AND {id} IN ",
            ),
            lock_prefix: n.sql("SELECT {id} FROM {table} WHERE {id} IN "),
        }
    }
}

/// The mark of one existing inbox row, as the existence check found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkState {
    /// Status NULL or blank: ours to write.
    Empty,
    /// Some value is there already (ours or anybody's): never overwritten.
    Marked(String),
}

impl MarkState {
    /// Classifies a status column value (the definition of "empty mark").
    pub fn of(status: Option<&str>) -> Self {
        match status {
            Some(s) if !s.trim().is_empty() => Self::Marked(s.to_string()),
            _ => Self::Empty,
        }
    }
}

impl InboxError {
    /// True when the failure says nothing about particular rows: the inbox is unreachable,
    /// the connection broke, or the statement timed out. A statement-level database error
    /// (a trigger, a lock wait, a constraint) may be caused by one row of a batch.
    pub fn is_connection_level(&self) -> bool {
        match self {
            Self::Timeout(_) | Self::Url { .. } => true,
            Self::Db(sqlx::Error::Database(_)) => false,
            Self::Db(_) => true,
        }
    }
}

impl Inbox {
    /// ONE existence check for a batch: the mark of every id that has a row. Ids without a row
    /// are simply absent from the answer (the caller tells "missing" from the ids it asked for).
    pub async fn mark_states(
        &self,
        sql: &MarkSql,
        ids: &[i64],
    ) -> Result<Vec<(i64, MarkState)>, InboxError> {
        self.mark_states_within(sql, ids, self.query_timeout).await
    }

    /// [`Inbox::mark_states`] bounded by `limit` as well as by `inbox.query_timeout`.
    pub async fn mark_states_within(
        &self,
        sql: &MarkSql,
        ids: &[i64],
        limit: Duration,
    ) -> Result<Vec<(i64, MarkState)>, InboxError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let limit = limit.min(self.query_timeout);
        let stmt = format!("{}({})", sql.check_prefix, placeholders(ids.len()));
        let mut query = sqlx::query(&stmt);
        for id in ids {
            query = query.bind(id);
        }
        let rows = match tokio::time::timeout(limit, query.fetch_all(&self.pool)).await {
            Ok(rows) => rows?,
            Err(_) => return Err(InboxError::Timeout(limit)),
        };
        rows.iter()
            .map(|row| {
                let id: i64 = row.try_get(0)?;
                let status: Option<String> = row.try_get(1)?;
                Ok((id, MarkState::of(status.as_deref())))
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(InboxError::from)
    }

    /// ONE conditional UPDATE for a batch — `value` and the processed time `at` (converted to
    /// airport local time) where the mark is still empty — in an inbox transaction of its
    /// own, NOT committed: see [`StagedMarks`]. Bounded by `limit` as well as by
    /// `inbox.query_timeout`; on a timeout or an error nothing is written (the transaction is
    /// rolled back, or its connection closed, which rolls it back on the server).
    ///
    /// Rows another session holds are never waited for long ([`super::mark_lock`]): with
    /// `SKIP LOCKED` they are left out and listed in [`StagedMarks::skipped`]; otherwise the
    /// session's lock wait is `avoid.lock_wait` and a lock conflict fails the statement
    /// ([`InboxError::is_lock_conflict`]).
    pub async fn stage_marks(
        &self,
        sql: &MarkSql,
        ids: &[i64],
        value: &str,
        at: DateTime<Utc>,
        limit: Duration,
        avoid: LockAvoidance,
    ) -> Result<StagedMarks, InboxError> {
        let limit = limit.min(self.query_timeout);
        let started = Instant::now();
        let skip = avoid.skip_locked && self.skip_locked_supported().await;
        let conn = match tokio::time::timeout(limit, self.pool.acquire()).await {
            Ok(conn) => conn?,
            Err(_) => return Err(InboxError::Timeout(limit)),
        };
        // Without SKIP LOCKED the session's lock wait is lowered for the mark; that session is
        // closed afterwards, never pooled with it (the outbound INSERTs share the pool).
        let mut conn = MarkConn {
            conn: Some(conn),
            poolable: skip,
        };
        let write = Write {
            sql,
            ids,
            value,
            at: utc_to_local(at, self.tz),
            skip,
            session: (!skip).then(|| avoid.session_statement()),
        };
        let rest = limit.saturating_sub(started.elapsed());
        let done = tokio::time::timeout(rest, write.run(conn.get())).await;
        match done {
            Ok(Ok((written, skipped))) => Ok(StagedMarks {
                conn,
                written,
                skipped,
                limit: self.query_timeout,
            }),
            Ok(Err(e)) => {
                roll_back(conn, self.query_timeout).await;
                Err(e.into())
            }
            // `conn` is dropped: closed, so the server rolls back whatever the UPDATE did.
            Err(_) => Err(InboxError::Timeout(limit)),
        }
    }
}

/// The statements of one staged mark.
struct Write<'a> {
    sql: &'a MarkSql,
    ids: &'a [i64],
    value: &'a str,
    at: chrono::NaiveDateTime,
    skip: bool,
    /// `SET SESSION innodb_lock_wait_timeout = …` (without `skip`).
    session: Option<String>,
}

impl Write<'_> {
    /// The lock wait bound, BEGIN, (with `skip`) the rows we can lock now, then the UPDATE of
    /// those in that transaction: `(rows written, ids skipped because another session holds
    /// them)`.
    async fn run(self, conn: &mut MySqlConnection) -> Result<(u64, Vec<i64>), sqlx::Error> {
        if let Some(session) = &self.session {
            conn.execute(session.as_str()).await?;
        }
        // READ COMMITTED for this transaction only: the UPDATE may scan the table instead of
        // the id list (a small inbox), and under REPEATABLE READ it would wait on every row it
        // reads; here InnoDB's semi-consistent read passes a row another session holds when its
        // committed version is not one of ours, and no gap is locked.
        conn.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            .await?;
        conn.execute("BEGIN").await?;
        let (targets, skipped) = if self.skip {
            let stmt = format!(
                "{}({}) FOR UPDATE SKIP LOCKED",
                self.sql.lock_prefix,
                placeholders(self.ids.len())
            );
            let mut query = sqlx::query_scalar::<_, i64>(&stmt);
            for id in self.ids {
                query = query.bind(id);
            }
            let got: std::collections::HashSet<i64> =
                query.fetch_all(&mut *conn).await?.into_iter().collect();
            self.ids.iter().copied().partition(|id| got.contains(id))
        } else {
            (self.ids.to_vec(), Vec::new())
        };
        if targets.is_empty() {
            return Ok((0, skipped));
        }
        let stmt = format!("{}({})", self.sql.write_prefix, placeholders(targets.len()));
        let mut query = sqlx::query(&stmt).bind(self.value).bind(self.at);
        for id in &targets {
            query = query.bind(id);
        }
        let done = conn.execute(query).await?;
        Ok((done.rows_affected(), skipped))
    }
}

/// A mark UPDATE run in its own inbox transaction and not committed yet. The sweeper commits
/// it only after PostgreSQL confirmed that the rows are still locked by the sweep (G5), so a
/// mark is never written after the lock that guards it was lost. Dropped without
/// [`StagedMarks::commit`] or [`StagedMarks::rollback`], its connection is closed, never
/// returned to the pool: the server rolls the transaction back.
#[derive(Debug)]
pub struct StagedMarks {
    conn: MarkConn,
    written: u64,
    skipped: Vec<i64>,
    /// `inbox.query_timeout`, for the ROLLBACK.
    limit: Duration,
}

impl StagedMarks {
    /// Rows the UPDATE wrote (a row marked meanwhile by somebody else, or gone, is not
    /// counted).
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Ids left out because another session holds their row (`SKIP LOCKED`): not written,
    /// not failed — their turn comes in a later sweep.
    pub fn skipped(&self) -> &[i64] {
        &self.skipped
    }

    /// COMMIT within `limit`; returns the rows written. An error leaves the outcome unknown
    /// to us (the connection is closed: a COMMIT that never reached the server rolls back);
    /// the next existence check settles it.
    pub async fn commit(self, limit: Duration) -> Result<u64, InboxError> {
        let Self {
            mut conn, written, ..
        } = self;
        match tokio::time::timeout(limit, conn.get().execute("COMMIT")).await {
            Ok(Ok(_)) => {
                conn.release();
                Ok(written)
            }
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(InboxError::Timeout(limit)),
        }
    }

    /// ROLLBACK: nothing of the UPDATE is written (if the statement fails, the connection is
    /// closed, which rolls back as well).
    pub async fn rollback(self) {
        roll_back(self.conn, self.limit).await;
    }
}

/// ROLLBACK; the connection goes back to the pool only if that worked (else it is closed,
/// which rolls back on the server).
async fn roll_back(mut conn: MarkConn, limit: Duration) {
    let done = tokio::time::timeout(limit, conn.get().execute("ROLLBACK")).await;
    if matches!(done, Ok(Ok(_))) {
        conn.release();
    }
}

/// The connection of a staged mark: closed on drop, pooled only by [`MarkConn::release`].
#[derive(Debug)]
struct MarkConn {
    conn: Option<PoolConnection<MySql>>,
    /// False when the session's lock wait was changed: closed even after a clean end.
    poolable: bool,
}

impl MarkConn {
    fn get(&mut self) -> &mut MySqlConnection {
        // Some until release() or drop, both of which consume the value.
        self.conn.as_deref_mut().expect("mark connection held")
    }

    /// Its transaction is over: back to the pool (unless its session settings differ).
    fn release(mut self) {
        if self.poolable {
            drop(self.conn.take());
        }
    }
}

impl Drop for MarkConn {
    fn drop(&mut self) {
        // Detached and dropped: the socket closes and the server rolls back whatever the
        // transaction holds. Never pooled with an open transaction, which the next BEGIN on
        // that connection would commit implicitly.
        if let Some(conn) = self.conn.take() {
            drop(conn.detach());
        }
    }
}

/// `?,?,…,?`
fn placeholders(n: usize) -> String {
    let mut s = String::with_capacity(n * 2);
    for i in 0..n {
        s.push_str(if i == 0 { "?" } else { ",?" });
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_mark_is_null_or_blank() {
        assert_eq!(MarkState::of(None), MarkState::Empty);
        assert_eq!(MarkState::of(Some("")), MarkState::Empty);
        assert_eq!(MarkState::of(Some("   ")), MarkState::Empty);
        assert_eq!(
            MarkState::of(Some("PROCESSED")),
            MarkState::Marked("PROCESSED".into())
        );
        assert_eq!(MarkState::of(Some(" Y ")), MarkState::Marked(" Y ".into()));
    }

    #[test]
    fn statements_quote_names_and_guard_the_empty_mark() {
        let sql = MarkSql::new(&InboxNames::defaults());
        assert_eq!(
            sql.check_prefix,
            "SELECT `CMINMSGS_ID`, `CMINMSGS_STATUS` FROM `CMINMSGS` WHERE `CMINMSGS_ID` IN "
        );
        assert!(sql.write_prefix.starts_with(
            "UPDATE `CMINMSGS` SET `CMINMSGS_STATUS` = ?, \
             `CMINMSGS_DATE_PROCESSED` = COALESCE(`CMINMSGS_DATE_PROCESSED`, ?)"
        ));
        assert!(sql
            .write_prefix
            .contains("(`CMINMSGS_STATUS` IS NULL OR TRIM(`CMINMSGS_STATUS`) = '')"));
        assert_eq!(placeholders(3), "?,?,?");
        assert_eq!(placeholders(1), "?");
    }
}
