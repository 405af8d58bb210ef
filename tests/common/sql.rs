//! One-line reads and writes on the store for tests: the `sqlx` chain (query, bind, fetch,
//! expect) said once, with the statement in the panic message.

use std::fmt::Debug;

use sqlx::postgres::Postgres;

use super::TestEnv;

impl TestEnv {
    /// Runs these statements on the store (no binds; several statements allowed).
    pub async fn exec(&self, sql: &str) {
        sqlx::raw_sql(sql)
            .execute(self.store.pool())
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// The one value this query returns.
    pub async fn scalar<T>(&self, sql: &str) -> T
    where
        T: for<'r> sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres> + Send + Unpin,
    {
        sqlx::query_scalar(sql)
            .fetch_one(self.store.pool())
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// The one value this query returns for this `$1` (an id, a list of ids).
    pub async fn scalar_for<T, B>(&self, sql: &str, arg: B) -> T
    where
        T: for<'r> sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres> + Send + Unpin,
        B: for<'q> sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres> + Send + Debug,
    {
        let shown = format!("{arg:?}");
        sqlx::query_scalar(sql)
            .bind(arg)
            .fetch_one(self.store.pool())
            .await
            .unwrap_or_else(|e| panic!("{sql} ($1 = {shown}): {e}"))
    }

    /// A `count(*)` (or any BIGINT) query.
    pub async fn count(&self, sql: &str) -> i64 {
        self.scalar(sql).await
    }

    /// One column of one PROC_STATE row.
    pub async fn proc_col<T>(&self, column: &str, msg_id: i64) -> T
    where
        T: for<'r> sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres> + Send + Unpin,
    {
        let sql = format!("SELECT {column} FROM proc_state WHERE msg_id = $1");
        self.scalar_for(&sql, msg_id).await
    }

    /// Moves the watermark W by hand.
    pub async fn set_w(&self, w: i64) {
        sqlx::query("UPDATE inbox_cursor SET w = $1")
            .bind(w)
            .execute(self.store.pool())
            .await
            .expect("set w");
    }
}
