//! The cutover record (`cutover_stock`, `cutover_gap`, migration 0015): written once with W,
//! read by every path that must not take the skipped stock for ours.

use chrono::{DateTime, Utc};

use super::audit::{insert_audit, AuditRow};
use super::late_watch::{insert_ranges, WatchRange};
use super::{SeedOutcome, Store, StoreError};
use crate::rows::stock::{CutoverStock, StockSpan};

/// `audit_log.action` of a cutover seeding.
pub const ACTION_CUTOVER: &str = "CUTOVER";

/// Who approved a seeding, for its `audit_log` row (action `CUTOVER`, no message ids).
#[derive(Debug, Clone, Copy)]
pub struct SeedAudit<'a> {
    /// `pipeline.cutover_by` (empty: "config").
    pub by: &'a str,
    /// `pipeline.cutover_ticket` (empty: none).
    pub ticket: &'a str,
    /// The stock token the seeding computed.
    pub token: &'a str,
    /// Whether an approved plan (`pipeline.cutover_expect`) was required and matched.
    pub expected: bool,
}

/// `(mode, w, first_id, stock_rows, seeded_at)` as stored.
type StockRow = (String, i64, Option<i64>, i64, DateTime<Utc>);

impl Store {
    /// Seeds W once, on a fresh store only (no watermark, no hole, no PROC_STATE rows), and in
    /// the same transaction records what the cutover skipped: the stock span, its gaps, and
    /// the gaps as watched released holes until `watch_until` (a late commit among them is
    /// processed as LATE, like any released hole's). SEEDED_AT is written with W.
    ///
    /// Ids below the first stock row (`1..first`) are watched as one released hole too: a row
    /// that was in flight there at the cutover and commits later is a new message, processed
    /// as LATE like any other (not left to the compensation scan's window). They are not
    /// `cutover_gap` ids (not in the skipped span). The seeding's `audit_log` row (who, ticket,
    /// mode, W, token) is written in the same transaction.
    pub async fn seed_cutover(
        &self,
        stock: &CutoverStock,
        watch_until: DateTime<Utc>,
        audit: &SeedAudit<'_>,
    ) -> Result<SeedOutcome, StoreError> {
        let now = stock.seeded_at;
        let mut tx = self.pool().begin().await?;
        let done = sqlx::query(
            "UPDATE inbox_cursor SET w = $1, hole_since = NULL, hole_seen_db_at = NULL, \
             seeded_at = $2, updated_at = $2 \
             WHERE id = 1 AND w = 0 AND hole_since IS NULL AND seeded_at IS NULL \
               AND NOT EXISTS (SELECT 1 FROM proc_state) \
               AND NOT EXISTS (SELECT 1 FROM inbox_hole) \
               AND NOT EXISTS (SELECT 1 FROM cutover_stock)",
        )
        .bind(stock.w)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() != 1 {
            tx.rollback().await?;
            return self.not_seeded().await;
        }
        let span = stock.span.as_ref();
        sqlx::query(
            "INSERT INTO cutover_stock (mode, w, first_id, stock_rows, seeded_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&stock.mode)
        .bind(stock.w)
        .bind(span.map(|s| s.first))
        .bind(span.map_or(0, |s| s.rows))
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let gaps = span.map_or(&[][..], |s| s.gaps.as_slice());
        let first: Vec<i64> = gaps.iter().map(|g| g.0).collect();
        let last: Vec<i64> = gaps.iter().map(|g| g.1).collect();
        sqlx::query("INSERT INTO cutover_gap SELECT * FROM UNNEST($1::bigint[], $2::bigint[])")
            .bind(&first)
            .bind(&last)
            .execute(&mut *tx)
            .await?;
        let below_first = span.filter(|s| s.first > 1).map(|s| (1, s.first - 1));
        let watched: Vec<WatchRange> = below_first
            .iter()
            .chain(gaps)
            .map(|&(first_id, last_id)| WatchRange {
                first_id,
                last_id,
                released_at: now,
                expires_at: watch_until,
                checked_at: None,
            })
            .collect();
        insert_ranges(&mut tx, &watched).await?;
        insert_seed_audit(&mut tx, stock, audit).await?;
        tx.commit().await?;
        Ok(SeedOutcome::Seeded { w: stock.w })
    }

    /// Why a seeding wrote nothing: seeded before, or refused on a store that is not fresh.
    async fn not_seeded(&self) -> Result<SeedOutcome, StoreError> {
        let current = self.read_cursor().await?;
        if let Some(at) = current.seeded_at {
            return Ok(SeedOutcome::AlreadySeeded {
                at,
                w: current.cursor.w,
            });
        }
        let records = self.proc_state_count().await?;
        Err(StoreError::SeedRefused(format!(
            "the store is not fresh (W={}, hole open: {}, {} processing records); \
             re-seeding an upgraded instance must be an explicit operator action — \
             unset pipeline.cutover_watermark to start from the stored watermark",
            current.cursor.w,
            current.cursor.hole_since.is_some(),
            records
        )))
    }

    /// What the cutover skipped, with every gap; None when the store was never seeded.
    pub async fn cutover_stock(&self) -> Result<Option<CutoverStock>, StoreError> {
        let row: Option<StockRow> = sqlx::query_as(
            "SELECT mode, w, first_id, stock_rows, seeded_at FROM cutover_stock WHERE id = 1",
        )
        .fetch_optional(self.pool())
        .await?;
        let Some((mode, w, first, rows, seeded_at)) = row else {
            return Ok(None);
        };
        let span = match first {
            None => None,
            Some(first) => Some(StockSpan {
                first,
                last: w,
                rows,
                gaps: sqlx::query_as("SELECT first_id, last_id FROM cutover_gap ORDER BY first_id")
                    .fetch_all(self.pool())
                    .await?,
            }),
        };
        Ok(Some(CutoverStock {
            mode,
            w,
            span,
            seeded_at,
        }))
    }
}

/// The seeding's `audit_log` row.
async fn insert_seed_audit(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    stock: &CutoverStock,
    audit: &SeedAudit<'_>,
) -> Result<(), sqlx::Error> {
    let span = stock.span.as_ref();
    let result = serde_json::json!({
        "mode": stock.mode,
        "w": stock.w,
        "stock_token": audit.token,
        "expectation_checked": audit.expected,
        "stock_rows": span.map_or(0, |s| s.rows),
        "gap_ids": span.map_or(0, |s| s.gap_ids()),
    });
    let reason = format!(
        "cutover seeding: pipeline.cutover_watermark = {}, W = {}",
        stock.mode, stock.w
    );
    let by = if audit.by.is_empty() {
        "config"
    } else {
        audit.by
    };
    let row = AuditRow {
        actor: by,
        action: ACTION_CUTOVER,
        reason: &reason,
        ticket: Some(audit.ticket).filter(|t| !t.is_empty()),
        token: None,
    };
    insert_audit(tx, stock.seeded_at, row, &[], result).await?;
    Ok(())
}
