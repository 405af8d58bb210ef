//! Phase 3: the bare PostgreSQL insert rate, the limit the poller is measured against: the
//! poller's `UNNEST` statement and a plain multi-row `VALUES` statement, in scratch copies of
//! `proc_state`, one transaction per `claim_batch` rows.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use sqlx::postgres::PgPool;

use super::{checkpoint, spread_received_at, statement_for};

/// Rows per plain `VALUES` statement (2 parameters a row; PostgreSQL allows 65 535).
const VALUES_ROWS_PER_STATEMENT: u32 = 16_000;

/// The two bare statement shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BareShape {
    /// The poller's statement: `INSERT … SELECT … FROM UNNEST($1, $2)`.
    Unnest,
    /// A plain multi-row `INSERT … VALUES (…),(…)`.
    Values,
}

/// What a bare measurement writes: `rows` rows in transactions of `batch` rows, committed
/// with `synchronous_commit = off` when `async_commit`.
#[derive(Debug, Clone, Copy)]
pub(super) struct BareLoad {
    pub(super) rows: u64,
    pub(super) batch: u32,
    pub(super) async_commit: bool,
}

/// The load in transactions like the poller's rounds (without the cursor update and the inbox
/// reads); returns the wall time.
async fn bare_insert(pool: &PgPool, shape: BareShape, load: BareLoad) -> anyhow::Result<Duration> {
    let BareLoad {
        rows,
        batch,
        async_commit,
    } = load;
    let unnest_sql = "INSERT INTO bench_bare (msg_id, received_at, enqueued_at, source, state) \
                      SELECT id, recv, $3, 'POLL', 'PENDING' \
                      FROM UNNEST($1::bigint[], $2::timestamptz[]) AS r(id, recv) \
                      ON CONFLICT (msg_id) DO NOTHING";
    let per_statement = batch.min(VALUES_ROWS_PER_STATEMENT);
    let full_values_sql = values_sql(per_statement as usize);
    let started = Instant::now();
    let mut next: u64 = 1;
    while next <= rows {
        let n = (rows - next + 1).min(u64::from(batch));
        let now = Utc::now();
        let first = i64::try_from(next).context("row number overflow")?;
        let last = i64::try_from(next + n).context("row number overflow")?;
        let ids: Vec<i64> = (first..last).collect();
        let received: Vec<Option<DateTime<Utc>>> = ids
            .iter()
            .map(|id| Some(spread_received_at(now, *id)))
            .collect();
        let mut tx = pool.begin().await.context("BEGIN")?;
        if async_commit {
            sqlx::query("SET LOCAL synchronous_commit = off")
                .execute(&mut *tx)
                .await
                .context("SET LOCAL synchronous_commit")?;
        }
        let mut inserted = 0;
        match shape {
            BareShape::Unnest => {
                inserted += sqlx::query(unnest_sql)
                    .bind(&ids)
                    .bind(&received)
                    .bind(now)
                    .execute(&mut *tx)
                    .await
                    .context("INSERT … UNNEST")?
                    .rows_affected();
            }
            BareShape::Values => {
                for (chunk_ids, chunk_recv) in ids
                    .chunks(per_statement as usize)
                    .zip(received.chunks(per_statement as usize))
                {
                    let sql = statement_for(
                        chunk_ids.len(),
                        per_statement as usize,
                        &full_values_sql,
                        values_sql,
                    );
                    let mut query = sqlx::query(&sql).bind(now);
                    for (id, recv) in chunk_ids.iter().zip(chunk_recv) {
                        query = query.bind(*id).bind(*recv);
                    }
                    inserted += query
                        .execute(&mut *tx)
                        .await
                        .context("INSERT … VALUES")?
                        .rows_affected();
                }
            }
        }
        tx.commit().await.context("COMMIT")?;
        anyhow::ensure!(
            inserted == n,
            "bare insert wrote {inserted} of {n} rows at row {next}"
        );
        next += n;
    }
    Ok(started.elapsed())
}

/// `INSERT … VALUES` for `rows` rows: `$1` is the enqueue time, then `(id, received)` pairs.
fn values_sql(rows: usize) -> String {
    let mut sql = String::from(
        "INSERT INTO bench_bare (msg_id, received_at, enqueued_at, source, state) VALUES ",
    );
    for i in 0..rows {
        if i > 0 {
            sql.push(',');
        }
        sql.push_str(&format!(
            "(${}, ${}, $1, 'POLL', 'PENDING')",
            2 * i + 2,
            2 * i + 3
        ));
    }
    sql.push_str(" ON CONFLICT (msg_id) DO NOTHING");
    sql
}

/// One bare measurement in a fresh scratch copy of `proc_state` (same columns, defaults,
/// constraints and indexes), dropped afterwards so autovacuum of its rows cannot run during (and
/// slow down) a later phase.
pub(super) async fn bare_phase(
    pool: &PgPool,
    shape: BareShape,
    load: BareLoad,
) -> anyhow::Result<Duration> {
    sqlx::query("CREATE TABLE bench_bare (LIKE proc_state INCLUDING ALL)")
        .execute(pool)
        .await
        .context("creating the scratch table bench_bare")?;
    checkpoint(pool).await;
    let took = bare_insert(pool, shape, load)
        .await
        .with_context(|| format!("bare {shape:?} insert"))?;
    sqlx::query("DROP TABLE bench_bare")
        .execute(pool)
        .await
        .context("dropping the scratch table bench_bare")?;
    Ok(took)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_statement_numbers_its_parameters() {
        assert_eq!(
            values_sql(2),
            "INSERT INTO bench_bare (msg_id, received_at, enqueued_at, source, state) \
             VALUES ($2, $3, $1, 'POLL', 'PENDING'),($4, $5, $1, 'POLL', 'PENDING') \
             ON CONFLICT (msg_id) DO NOTHING"
        );
    }
}
