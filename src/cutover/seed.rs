//! The cutover seeding step: read the visible stock (ids only, in bounded pages), then write
//! W, the stock record and its gaps — the gaps also as watched released holes — in ONE
//! PostgreSQL transaction that first checks the store is fresh. A crash before the commit
//! leaves a fresh store; after it, a restart finds it seeded.

use std::time::Duration;

use super::{CutoverMode, StockScan, StockSpan};
use crate::clock::Clock;
use crate::inbox::{Inbox, InboxError};
use crate::store::{SeedOutcome, Store, StoreError};

/// Stock ids read per inbox statement (ids only: cheap; a 10M-row stock is 200 statements).
pub const STOCK_PAGE: u32 = 50_000;

/// Why seeding did not happen (nothing written).
#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    /// The inbox could not be read: the stock is unknown, so nothing is seeded.
    #[error("cutover seeding needs the inbox's stock, but the inbox is unreadable: {0}")]
    Inbox(#[from] InboxError),
    /// Our PostgreSQL refused or failed.
    #[error("{0}")]
    Store(#[from] StoreError),
}

/// The W a mode seeds, read from the inbox as it is now.
pub async fn watermark_of(inbox: &Inbox, mode: CutoverMode) -> Result<i64, InboxError> {
    let range = match mode {
        CutoverMode::Min | CutoverMode::Max => inbox.id_range().await?,
        CutoverMode::Zero | CutoverMode::Id(_) => None,
    };
    Ok(mode.watermark(range))
}

/// The visible stock at or below `w` (what `max` and `<id>` skip) and its gaps; None when no
/// row is there.
pub async fn read_stock(inbox: &Inbox, w: i64) -> Result<Option<StockSpan>, InboxError> {
    let mut scan = StockScan::default();
    let mut after = 0i64;
    loop {
        let rows = inbox.mark_rows(after, w, STOCK_PAGE).await?;
        let Some(last) = rows.last() else { break };
        after = last.id;
        for r in &rows {
            scan.push(r.id);
        }
        if rows.len() < STOCK_PAGE as usize {
            break;
        }
    }
    Ok(scan.finish(w))
}

/// Seeds the store for `mode` (fresh store only; see [`Store::seed_cutover`]). `watch_window`
/// is `late.watch_window`: how long the stock's gaps are watched, like any released hole.
pub async fn seed(
    store: &Store,
    inbox: &Inbox,
    mode: CutoverMode,
    clock: &dyn Clock,
    watch_window: Duration,
) -> Result<SeedOutcome, SeedError> {
    let w = watermark_of(inbox, mode).await?;
    let span = match mode {
        CutoverMode::Max | CutoverMode::Id(_) => read_stock(inbox, w).await?,
        // `min` reads every row; `zero` too, after the hole rule.
        CutoverMode::Min | CutoverMode::Zero => None,
    };
    let now = clock.now();
    let stock = super::CutoverStock {
        mode: mode.to_string(),
        w,
        span,
        seeded_at: now,
    };
    let outcome = store
        .seed_cutover(&stock, crate::clock::plus(now, watch_window))
        .await?;
    log(&stock, outcome);
    Ok(outcome)
}

fn log(stock: &super::CutoverStock, outcome: SeedOutcome) {
    match (outcome, &stock.span) {
        (SeedOutcome::Seeded { w }, Some(span)) => tracing::warn!(
            mode = %stock.mode,
            watermark = w,
            stock_rows_skipped = span.rows,
            gap_ids_watched = span.gap_ids(),
            gaps = %crate::telemetry::ids::RangeSummary(&span.gaps),
            "cutover seeding applied on a fresh store: the visible stock at or below W is \
             skipped for good; the ids without a row are watched as holes"
        ),
        (SeedOutcome::Seeded { w }, None) => tracing::warn!(
            mode = %stock.mode,
            watermark = w,
            "cutover seeding applied on a fresh store: every row above W is read"
        ),
        (SeedOutcome::AlreadySeeded { at, w }, _) => tracing::info!(
            mode = %stock.mode,
            seeded_at = %at,
            watermark = w,
            "cutover already applied earlier; ignoring pipeline.cutover_watermark (unset it)"
        ),
    }
}
