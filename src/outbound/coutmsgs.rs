//! The shared outbound table (`COUTMSGS`, SPEC §12) as the outbound path sees it: read its
//! highest id (the reconcile floor), insert one message (writing only the creation time and
//! the text), and find a message by its `RQID` above a floor. Never DDL, UPDATE or DELETE; the
//! downstream adapter's columns are never touched.

use std::time::Duration;

use chrono::NaiveDateTime;
use sqlx::mysql::MySqlPool;
use sqlx::Row;

use super::request::rqid_like_pattern;
use crate::inbox::names::OutboxNames;

/// Why a statement on the outbound table failed. A failed insert may still have landed (the
/// acknowledgement can be lost): the request stays REGISTERED and the reconciler decides.
#[derive(Debug, thiserror::Error)]
pub enum CoutError {
    /// The statement did not finish within `inbox.query_timeout`.
    #[error("outbound table statement timed out after {0:?}")]
    Timeout(Duration),
    /// Connection, permission, missing table, …
    #[error("outbound table statement failed: {0}")]
    Db(#[from] sqlx::Error),
}

/// The outbound table adapter (shares the inbox's MySQL pool).
#[derive(Debug, Clone)]
pub struct Coutmsgs {
    pool: MySqlPool,
    query_timeout: Duration,
    max_id: String,
    insert: String,
    find: String,
}

impl Coutmsgs {
    /// The adapter over `pool` (normally [`crate::inbox::Inbox::pool`]).
    pub fn new(pool: MySqlPool, names: &OutboxNames, query_timeout: Duration) -> Self {
        let (t, id) = (&names.table, &names.id);
        Self {
            pool,
            query_timeout,
            max_id: format!("SELECT MAX({id}) FROM {t}"),
            insert: format!(
                "INSERT INTO {t} ({created}, {message}) VALUES (?, ?)",
                created = names.created,
                message = names.message
            ),
            // Only rows above the floor: a primary-key range, never the whole table.
            find: format!(
                "SELECT {id} FROM {t} WHERE {id} > ? AND {message} LIKE ? ESCAPE '!' \
                 ORDER BY {id} LIMIT 1",
                message = names.message
            ),
        }
    }

    /// `MAX(id)`, 0 for an empty table: every row written after this call has a larger id
    /// (auto-increment never hands out a used value again).
    pub async fn max_id(&self) -> Result<i64, CoutError> {
        let row = self
            .timed(sqlx::query(&self.max_id).fetch_one(&self.pool))
            .await?;
        let max: Option<i64> = row.try_get(0)?;
        Ok(max.unwrap_or(0))
    }

    /// Inserts one message and returns its id (`LAST_INSERT_ID()` of the same connection).
    /// The insert runs in an explicit transaction: if we give up before `COMMIT` is sent (a
    /// timeout while the statement waits on a lock), the server rolls it back when it notices
    /// the closed connection, so only a lost `COMMIT` acknowledgement is ambiguous.
    pub async fn insert(&self, created_local: NaiveDateTime, text: &str) -> Result<i64, CoutError> {
        let work = async {
            let mut tx = self.pool.begin().await?;
            let done = sqlx::query(&self.insert)
                .bind(created_local)
                .bind(text)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(done.last_insert_id() as i64)
        };
        self.timed(work).await
    }

    /// The lowest id above `floor` whose text contains `<RQID>rqid</RQID>`, if any.
    pub async fn find_rqid_above(&self, floor: i64, rqid: &str) -> Result<Option<i64>, CoutError> {
        let row = self
            .timed(
                sqlx::query(&self.find)
                    .bind(floor)
                    .bind(rqid_like_pattern(rqid))
                    .fetch_optional(&self.pool),
            )
            .await?;
        Ok(match row {
            Some(row) => Some(row.try_get(0)?),
            None => None,
        })
    }

    async fn timed<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, CoutError> {
        crate::inbox::within(self.query_timeout, fut, CoutError::Timeout).await
    }
}
