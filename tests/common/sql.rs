//! One-line reads and writes on the store for tests: the `sqlx` chain (query, bind, fetch,
//! expect) said once, with the statement in the panic message.

use std::fmt::Debug;
use std::future::Future;

use sqlx::postgres::{PgArguments, PgRow, Postgres};
use sqlx::query::Query;

use super::TestEnv;

/// A value read from one column (what `query_scalar` decodes).
pub trait Col: for<'r> sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres> + Send + Unpin {}
impl<T> Col for T where T: for<'r> sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres> + Send + Unpin {}

/// A `$1` argument (an id, a list of ids, a time), shown in the panic message.
pub trait Arg: for<'q> sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres> + Sync + Debug {}
impl<T> Arg for T where T: for<'q> sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres> + Sync + Debug {}

/// Awaits a statement; its result, or a panic naming the statement and its `$1`.
async fn checked<R>(
    run: impl Future<Output = Result<R, sqlx::Error>>,
    sql: &str,
    arg: &dyn Debug,
) -> R {
    run.await
        .unwrap_or_else(|e| panic!("{sql} ($1 = {arg:?}): {e}"))
}

impl TestEnv {
    /// Runs these statements on the store (no binds; several statements allowed).
    pub async fn exec(&self, sql: &str) {
        sqlx::raw_sql(sql)
            .execute(self.store.pool())
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// The one value this query returns.
    pub async fn scalar<T: Col>(&self, sql: &str) -> T {
        sqlx::query_scalar(sql)
            .fetch_one(self.store.pool())
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// The one value this query returns for this `$1` (an id, a list of ids).
    pub async fn scalar_for<T: Col, B: Arg>(&self, sql: &str, arg: B) -> T {
        let q = sqlx::query_scalar(sql).bind(&arg);
        checked(q.fetch_one(self.store.pool()), sql, &arg).await
    }

    /// A `count(*)` (or any BIGINT) query.
    pub async fn count(&self, sql: &str) -> i64 {
        self.scalar(sql).await
    }

    /// The one column this query returns, every row of it.
    pub async fn column<T: Col>(&self, sql: &str) -> Vec<T> {
        sqlx::query_scalar(sql)
            .fetch_all(self.store.pool())
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Every row this query returns, as tuples (or any `FromRow`).
    pub async fn rows<T>(&self, sql: &str) -> Vec<T>
    where
        T: for<'r> sqlx::FromRow<'r, PgRow> + Send + Unpin,
    {
        sqlx::query_as(sql)
            .fetch_all(self.store.pool())
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// The one column this query returns for this `$1`, every row of it.
    pub async fn column_for<T: Col, B: Arg>(&self, sql: &str, arg: B) -> Vec<T> {
        let q = sqlx::query_scalar(sql).bind(&arg);
        checked(q.fetch_all(self.store.pool()), sql, &arg).await
    }

    /// One column of one PROC_STATE row.
    pub async fn proc_col<T: Col>(&self, column: &str, msg_id: i64) -> T {
        let sql = format!("SELECT {column} FROM proc_state WHERE msg_id = $1");
        self.scalar_for(&sql, msg_id).await
    }

    /// Runs one statement on the store with this `$1` (an id, a list of ids).
    pub async fn exec_for<B: Arg>(&self, sql: &str, arg: B) {
        checked(
            sqlx::query(sql).bind(&arg).execute(self.store.pool()),
            sql,
            &arg,
        )
        .await;
    }

    /// Runs one statement on the store with the parameters `bind` adds to it, in order.
    pub async fn exec_with<'q>(
        &self,
        sql: &'q str,
        bind: impl FnOnce(Query<'q, Postgres, PgArguments>) -> Query<'q, Postgres, PgArguments>,
    ) {
        bind(sqlx::query(sql))
            .execute(self.store.pool())
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Moves the watermark W by hand.
    pub async fn set_w(&self, w: i64) {
        self.exec_for("UPDATE inbox_cursor SET w = $1", w).await;
    }
}
