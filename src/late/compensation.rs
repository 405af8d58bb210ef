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

use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::inbox::names::InboxNames;
use crate::inbox::Inbox;
use crate::store::Store;
use crate::telemetry;

use super::DetectError;

/// Knobs of a scan.
#[derive(Debug, Clone)]
pub struct ScanConfig {
    /// Ids at or below W to re-read (`late.compensation_window`); 0 = off.
    pub window: u64,
    /// Rows per inbox statement (`late.batch`).
    pub batch: u32,
    /// The configured inbox names (ids only are read).
    pub names: InboxNames,
    /// Limit of one inbox statement (`inbox.query_timeout`).
    pub query_timeout: Duration,
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
    let mut after = from;
    loop {
        let ids = inbox
            .ids_in_ranges(&cfg.names, &[(from + 1, w)], after, batch, cfg.query_timeout)
            .await?;
        let Some(&last) = ids.last() else {
            break;
        };
        after = last;
        report.checked += ids.len() as u64;
        let unknown = store.not_enqueued(&ids).await?;
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
        if ids.len() < batch as usize {
            break;
        }
    }
    report.took = started.elapsed();
    telemetry::compensation_scan(from, w, report.checked, report.took);
    Ok(report)
}
