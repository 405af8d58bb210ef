//! The compensation scan (seed §5.1 stage 1, "补偿扫描"): inbox rows at or below W that
//! discovery never saw.
//!
//! `id > W` never looks back: when the DB owner rotates the inbox table (seed §6 plan B)
//! without seeding `AUTO_INCREMENT = max(ID)+1`, or restores it, new rows reuse ids W already
//! passed and would be lost silently. The scan re-reads the last `window` ids at or below W in
//! bounded batches and looks each row up in `PROC_STATE`; a row that is neither enqueued nor
//! inside a watched released hole (those are the late detector's) is recorded in
//! `inbox_unseen` and enqueued as `LATE` in one transaction — processed under the ordering
//! guard like any late arrival — and reported at ERROR with its ids.
//!
//! W is read first: every id ≤ that W was enqueued or released before the read, and
//! `PROC_STATE` rows are never deleted, so "not enqueued and not watched" is never a race.
//!
//! A reused id whose old row *was* enqueued cannot be enqueued again (one `PROC_STATE` row per
//! inbox id). The scan tells it by the receive time: a row whose `DATE_RECEIVED` differs from
//! the one recorded at enqueue is a different row under an old id — reported at ERROR and
//! counted (`msgx_inbox_id_reused_total`) for the operator and the DB owner, never silently
//! taken for the old one.
//!
//! The visible stock an explicit cutover skipped (`max`, `<id>`) has no `PROC_STATE` row by
//! design: the scan leaves it alone ([`crate::cutover::CutoverStock::skips`]).

use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::inbox::Inbox;
use crate::store::Store;
use crate::telemetry;

use super::DetectError;

/// Knobs of a scan.
#[derive(Debug, Clone)]
pub struct ScanConfig {
    /// Ids at or below W to re-read (`late.compensation_window`); 0 = off.
    pub window: u64,
    /// Rows per inbox statement (`late.batch`; ids and receive times only, bounded by
    /// `inbox.query_timeout` like every inbox read).
    pub batch: u32,
}

/// What a scan did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ScanReport {
    /// The id range scanned, `(from, to]`.
    pub from: i64,
    /// W at the start of the scan.
    pub to: i64,
    /// Inbox rows looked at.
    pub checked: u64,
    /// Rows discovery never saw, enqueued as LATE now.
    pub enqueued: Vec<i64>,
    /// Ids whose inbox row is not the row we enqueued under that id (another receive time).
    pub reused: Vec<i64>,
    /// Wall time.
    pub took: Duration,
}

/// One scan over `(W − window, W]`. A failure stops it; batches before it are committed.
pub async fn compensation_scan(
    inbox: &Inbox,
    store: &Store,
    clock: &dyn Clock,
    cfg: &ScanConfig,
) -> Result<ScanReport, DetectError> {
    let started = Instant::now();
    let w = store.read_cursor().await?.cursor.w;
    let window = i64::try_from(cfg.window).unwrap_or(i64::MAX);
    let from = w.saturating_sub(window).max(0);
    let mut report = ScanReport {
        from,
        to: w,
        ..ScanReport::default()
    };
    if cfg.window == 0 || w <= 0 {
        return Ok(report);
    }
    let batch = cfg.batch.max(1);
    // The stock a cutover skipped is the previous system's, never ours (migration 0015).
    let stock = store.cutover_stock().await?;
    let mut after = from;
    while after < w {
        let rows = inbox.rows_after(after, batch).await?;
        let full = rows.len() >= batch as usize;
        let rows: Vec<_> = rows.into_iter().take_while(|r| r.id <= w).collect();
        let Some(last) = rows.last() else {
            break;
        };
        after = last.id;
        report.checked += rows.len() as u64;
        let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
        let recorded = store.received_of(&ids).await?;
        let mut unknown = Vec::new();
        for row in &rows {
            match recorded.get(&row.id) {
                None if stock.as_ref().is_some_and(|s| s.skips(row.id)) => {}
                None => unknown.push(row.id),
                // Both known and different: another row under an old id.
                Some(Some(then)) if row.received_at.is_some_and(|now| now != *then) => {
                    report.reused.push(row.id)
                }
                Some(_) => {}
            }
        }
        let watched = store.late_watch_covering(&unknown).await?;
        let unseen: Vec<i64> = unknown
            .into_iter()
            .filter(|id| !watched.contains(id))
            .collect();
        if !unseen.is_empty() {
            let enqueued = store.enqueue_unseen(&unseen, w, clock.now()).await?;
            telemetry::unseen_below_w(w, &enqueued);
            report.enqueued.extend(enqueued);
        }
        if !full {
            break;
        }
    }
    if !report.reused.is_empty() {
        telemetry::id_reused(w, &report.reused);
    }
    report.took = started.elapsed();
    telemetry::compensation_scan(from, w, report.checked, report.took);
    Ok(report)
}
