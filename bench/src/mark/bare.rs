//! Phase 2 of `msgx-bench mark`: the bare limits on a scratch copy of the inbox table (acting
//! as the DB owner): the single-row autocommit `UPDATE … WHERE id = ? AND <empty mark>` and the
//! same with `WHERE id IN (<batch> ids)`. A stage of its own: it never touches our code.

use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::Utc;
use msgx_core::inbox::time::utc_to_local;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::{ConnectOptions, Connection};

use super::Ctx;
use crate::report::rate;

/// One bare measurement.
pub(super) struct BareRun {
    pub(super) rows: u64,
    pub(super) elapsed: Duration,
    /// Per statement, ascending.
    pub(super) latency: Vec<Duration>,
}

impl BareRun {
    pub(super) fn rate(&self) -> f64 {
        rate(self.rows, self.elapsed)
    }
}

/// A scratch copy of the inbox table (in the bench's own inbox database, as the DB owner).
pub(super) struct BareTable {
    pub(super) conn: MySqlConnection,
    /// Ids of the copied rows, ascending.
    pub(super) ids: Vec<i64>,
    /// `UPDATE bench_bare_mark SET status = ?, processed = COALESCE(processed, ?) WHERE `.
    pub(super) prefix: String,
    /// Quoted `id`, status and processed columns.
    pub(super) id: String,
    pub(super) status: String,
    pub(super) processed: String,
    /// The mark value.
    pub(super) value: String,
}

impl BareTable {
    pub(super) async fn create(ctx: &Ctx<'_>) -> anyhow::Result<Self> {
        let n = ctx.names;
        let mut conn = MySqlConnectOptions::from_str(ctx.inbox_url)
            .context("parsing the bench inbox URL")?
            .disable_statement_logging()
            .connect()
            .await
            .context("connecting the bare connection")?;
        // Enough rows for the single-row run and for 20 batched statements.
        let rows = ctx.args.bare_rows.max(20 * u64::from(ctx.cfg.batch));
        for sql in [
            "DROP TABLE IF EXISTS bench_bare_mark".to_string(),
            format!("CREATE TABLE bench_bare_mark LIKE {}", n.table),
            format!(
                "INSERT INTO bench_bare_mark SELECT * FROM {} ORDER BY {} LIMIT {rows}",
                n.table, n.id
            ),
        ] {
            sqlx::raw_sql(&sql)
                .execute(&mut conn)
                .await
                .with_context(|| format!("bare table: {sql}"))?;
        }
        let ids: Vec<i64> = sqlx::query_scalar(&format!(
            "SELECT {id} FROM bench_bare_mark ORDER BY {id}",
            id = n.id
        ))
        .fetch_all(&mut conn)
        .await
        .context("bare ids")?;
        Ok(Self {
            conn,
            ids,
            prefix: format!(
                "UPDATE bench_bare_mark SET {s} = ?, {p} = COALESCE({p}, ?) \
                 WHERE ({s} IS NULL OR TRIM({s}) = '') AND ",
                s = n.status,
                p = n.processed
            ),
            id: n.id.to_string(),
            status: n.status.to_string(),
            processed: n.processed.to_string(),
            value: ctx.cfg.mark_value.clone(),
        })
    }

    /// The single-row autocommit UPDATE, one statement per row, until `bare_time` or
    /// `bare_rows`.
    pub(super) async fn single(&mut self, ctx: &Ctx<'_>) -> anyhow::Result<BareRun> {
        let sql = format!("{}{} = ?", self.prefix, self.id);
        let at = utc_to_local(Utc::now(), ctx.tz);
        let limit = usize::try_from(ctx.args.bare_rows)?.min(self.ids.len());
        let mut latency = Vec::with_capacity(limit);
        let started = Instant::now();
        for id in &self.ids[..limit] {
            let t = Instant::now();
            let done = sqlx::query(&sql)
                .bind(&self.value)
                .bind(at)
                .bind(id)
                .execute(&mut self.conn)
                .await
                .context("bare single-row UPDATE")?;
            anyhow::ensure!(done.rows_affected() == 1, "bare row {id} was not empty");
            latency.push(t.elapsed());
            if started.elapsed() >= ctx.args.bare_time {
                break;
            }
        }
        let elapsed = started.elapsed();
        latency.sort_unstable();
        Ok(BareRun {
            rows: latency.len() as u64,
            elapsed,
            latency,
        })
    }

    /// The same UPDATE with `IN (batch ids)`, autocommit, over all copied rows.
    pub(super) async fn batched(&mut self, ctx: &Ctx<'_>, batch: u32) -> anyhow::Result<BareRun> {
        let at = utc_to_local(Utc::now(), ctx.tz);
        let mut latency = Vec::new();
        let mut rows = 0;
        let started = Instant::now();
        for chunk in self.ids.chunks(batch as usize) {
            let sql = format!(
                "{}{} IN ({})",
                self.prefix,
                self.id,
                vec!["?"; chunk.len()].join(",")
            );
            let mut q = sqlx::query(&sql).bind(&self.value).bind(at);
            for id in chunk {
                q = q.bind(id);
            }
            let t = Instant::now();
            rows += q
                .execute(&mut self.conn)
                .await
                .context("bare IN UPDATE")?
                .rows_affected();
            latency.push(t.elapsed());
        }
        let elapsed = started.elapsed();
        latency.sort_unstable();
        Ok(BareRun {
            rows,
            elapsed,
            latency,
        })
    }

    /// Empties the scratch marks again.
    pub(super) async fn reset(&mut self) -> anyhow::Result<()> {
        sqlx::raw_sql(&format!(
            "UPDATE bench_bare_mark SET {s} = NULL, {p} = NULL",
            s = self.status,
            p = self.processed
        ))
        .execute(&mut self.conn)
        .await
        .context("resetting the bare table")?;
        Ok(())
    }

    pub(super) async fn drop_table(mut self) -> anyhow::Result<()> {
        sqlx::raw_sql("DROP TABLE IF EXISTS bench_bare_mark")
            .execute(&mut self.conn)
            .await
            .context("dropping the bare table")?;
        self.conn
            .close()
            .await
            .context("closing the bare connection")
    }
}
