//! The cutover seeding step: refuse what cannot be honoured ([`super::expect`]), read the
//! visible stock (ids only, in bounded pages), then write W, the stock record and its gaps —
//! the gaps also as watched released holes — and the audit record in ONE PostgreSQL
//! transaction that first checks the store is fresh. A crash before the commit leaves a fresh
//! store; after it, a restart finds it seeded (and checks nothing again).

use std::time::Duration;

use super::expect::{beyond_head, CutoverExpect, StockToken};
use super::{CutoverMode, StockScan, StockSpan};
use crate::clock::Clock;
use crate::inbox::{Inbox, InboxError};
use crate::store::{SeedAudit, SeedOutcome, Store, StoreError};

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
    /// The mode cannot be honoured on this inbox, or the stock is not the approved one: one
    /// line that says why and what to do.
    #[error("{0}")]
    Refused(String),
}

/// Who approved the seeding and what they approved (`pipeline.cutover_*`).
#[derive(Debug, Clone, Default)]
pub struct Approval {
    /// `pipeline.cutover_expect`: the plan's W and stock token, if required.
    pub expect: Option<CutoverExpect>,
    /// `pipeline.cutover_by` (empty: "config").
    pub by: String,
    /// `pipeline.cutover_ticket` (empty: none).
    pub ticket: String,
}

/// The W a mode seeds, read from the inbox as it is now.
pub async fn watermark_of(inbox: &Inbox, mode: CutoverMode) -> Result<i64, InboxError> {
    let range = match mode {
        CutoverMode::Min | CutoverMode::Max => inbox.id_range().await?,
        CutoverMode::Zero | CutoverMode::Id(_) => None,
    };
    Ok(mode.watermark(range))
}

/// The visible stock at or below `w` (what `max` and `<id>` skip) with its gaps (None when no
/// row is there), and the stock's token, in one pass.
async fn read_stock_and_token(
    inbox: &Inbox,
    w: i64,
) -> Result<(Option<StockSpan>, StockToken), InboxError> {
    let scan = scan_stock(inbox, w).await?;
    let token = scan.token(w);
    Ok((scan.finish(w), token))
}

/// Every id at or below `w`, ascending.
async fn scan_stock(inbox: &Inbox, w: i64) -> Result<StockScan, InboxError> {
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
    Ok(scan)
}

/// Refuses an `<id>` the inbox has not handed out yet (see [`beyond_head`]).
pub async fn check_head(inbox: &Inbox, mode: CutoverMode) -> Result<(), SeedError> {
    if !matches!(mode, CutoverMode::Id(_)) {
        return Ok(());
    }
    let head = inbox.max_id().await?;
    // Unknown (a view, no privilege on information_schema): judged on MAX(id) alone.
    let next_id = inbox.next_auto_increment().await.unwrap_or(None);
    match beyond_head(mode, head, next_id) {
        Some(why) => Err(SeedError::Refused(why)),
        None => Ok(()),
    }
}

/// Seeds the store for `mode` (fresh store only; see [`Store::seed_cutover`]). `watch_window`
/// is `late.watch_window`: how long the stock's gaps are watched, like any released hole. On a
/// store seeded before, nothing is checked or written (`AlreadySeeded`). Otherwise the seeding
/// is refused, with one line, for an `<id>` above the inbox's head, and — with an approved
/// plan — when the inbox no longer gives its W or its stock token.
pub async fn seed(
    store: &Store,
    inbox: &Inbox,
    mode: CutoverMode,
    approval: &Approval,
    clock: &dyn Clock,
    watch_window: Duration,
) -> Result<SeedOutcome, SeedError> {
    if let Some(at) = store.read_cursor().await?.seeded_at {
        let w = store.read_cursor().await?.cursor.w;
        let outcome = SeedOutcome::AlreadySeeded { at, w };
        log_already(mode, outcome);
        return Ok(outcome);
    }
    check_head(inbox, mode).await?;
    let mut w = watermark_of(inbox, mode).await?;
    if let Some(expect) = &approval.expect {
        w = expect.w_to_seed(mode, w).map_err(SeedError::Refused)?;
    }
    let (span, token) = read_stock_and_token(inbox, w).await?;
    if let Some(expect) = &approval.expect {
        expect.check(&token).map_err(SeedError::Refused)?;
    }
    let span = match mode {
        CutoverMode::Max | CutoverMode::Id(_) => span,
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
    let audit = SeedAudit {
        by: approval.by.trim(),
        ticket: approval.ticket.trim(),
        token: token.as_str(),
        expected: approval.expect.is_some(),
    };
    let outcome = store
        .seed_cutover(&stock, crate::clock::plus(now, watch_window), &audit)
        .await?;
    log(&stock, outcome);
    Ok(outcome)
}

fn log_already(mode: CutoverMode, outcome: SeedOutcome) {
    if let SeedOutcome::AlreadySeeded { at, w } = outcome {
        tracing::info!(
            mode = %mode,
            seeded_at = %at,
            watermark = w,
            "cutover already applied earlier; ignoring pipeline.cutover_watermark (unset it)"
        );
    }
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
