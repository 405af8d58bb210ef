//! One late-detection round over the durable watch list.

use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::inbox::names::InboxNames;
use crate::inbox::{Inbox, InboxError};
use crate::settings::Settings;
use crate::store::late_watch::split_range;
use crate::store::{Store, StoreError};
use crate::telemetry;

/// Knobs of a detection round.
#[derive(Debug, Clone)]
pub struct DetectConfig {
    /// Watched ranges per inbox statement, and hits per statement (`late.batch`).
    pub batch: u32,
    /// The configured inbox names (the check reads only the id column).
    pub names: InboxNames,
    /// Limit of one inbox statement (`inbox.query_timeout`).
    pub query_timeout: Duration,
    /// Ids behind W the compensation scan re-reads (`late.compensation_window`, 0 = off).
    pub compensation_window: u64,
    /// How often it runs (`late.compensation_period`).
    pub compensation_period: Duration,
}

impl DetectConfig {
    /// From the settings: `late.batch`, the inbox names, `inbox.query_timeout`, the
    /// compensation scan's window and period.
    pub fn from_settings(settings: &Settings) -> Self {
        Self {
            batch: settings.late.batch,
            names: settings.inbox_names().clone(),
            query_timeout: settings.inbox.query_timeout,
            compensation_window: settings.late.compensation_window,
            compensation_period: settings.late.compensation_period,
        }
    }

    /// The compensation scan's knobs.
    pub fn scan(&self) -> crate::late::ScanConfig {
        crate::late::ScanConfig {
            window: self.compensation_window,
            batch: self.batch,
        }
    }
}

/// A detected late arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LateHit {
    /// The inbox id.
    pub msg_id: i64,
    /// A `LATE` `PROC_STATE` row was inserted (false: a row already existed).
    pub enqueued: bool,
}

/// What a round did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DetectReport {
    /// Watched ids checked against the inbox (the sizes of the ranges checked).
    pub checked: u64,
    /// Ids found in the inbox: recorded as detected and enqueued (LATE) in one transaction.
    pub detected: Vec<LateHit>,
    /// Absent ranges `(first, last)` whose watch window had passed: closed (deleted).
    pub closed: Vec<(i64, i64)>,
    /// Watched ids after the round.
    pub open: i64,
    /// Wall time of the round.
    pub took: Duration,
}

/// Why a round stopped. Pages before the failure are committed and stay; the failed page
/// changed nothing (its ranges stay watched, none is closed).
#[derive(Debug, thiserror::Error)]
pub enum DetectError {
    /// Our PostgreSQL failed.
    #[error("late detection: store: {0}")]
    Store(#[from] StoreError),
    /// The inbox could not be read: an infrastructure failure, never "absent".
    #[error("late detection: inbox check: {0}")]
    Inbox(#[from] InboxError),
}

/// One detection round (SPEC §6, G1): every watched range, `cfg.batch` ranges per page in id
/// order, is checked against the inbox with range queries (at most `cfg.batch` hits each):
///
/// - rows found → each is recorded as detected and enqueued as `LATE` in ONE PostgreSQL
///   transaction that also splits its range around it, then counted
///   (`msgx_pipeline_late_arrival_detected_total`) and alerted with its id;
/// - a page with no (more) rows → its ranges are stamped checked, and those whose window has
///   passed are closed (deleted): a range is closed only after a successful check at or after
///   its expiry, so a row that committed inside the window is never missed.
///
/// An inbox failure stops the round with [`DetectError::Inbox`] before anything of that page
/// is written: the watch stays intact. Time (detection, expiry) is the injected clock's.
pub async fn detect_once(
    inbox: &Inbox,
    store: &Store,
    clock: &dyn Clock,
    cfg: &DetectConfig,
) -> Result<DetectReport, DetectError> {
    let started = Instant::now();
    let batch = cfg.batch.max(1);
    let mut report = DetectReport::default();
    let mut after = 0i64;
    loop {
        let now = clock.now();
        let page = store.late_watch_page(after, batch).await?;
        let Some(last) = page.last() else {
            break;
        };
        after = last.first_id;
        let spans: Vec<(i64, i64)> = page.iter().map(|r| (r.first_id, r.last_id)).collect();
        report.checked += page.iter().map(|r| r.len() as u64).sum::<u64>();
        // Every hit inside the page's ranges, a bounded batch at a time.
        let mut from = i64::MIN;
        let mut hits = Vec::new();
        loop {
            let found = inbox
                .ids_in_ranges(&cfg.names, &spans, from, batch, cfg.query_timeout)
                .await?;
            let full = found.len() >= batch as usize;
            if let Some(last_hit) = found.last() {
                from = *last_hit;
            }
            hits.extend(found);
            if !full {
                break;
            }
        }
        for e in store.late_watch_detected(&page, &hits, now).await? {
            telemetry::late_detected(e.msg_id);
            if let (true, Some(t)) = (e.new_row, crate::traces::active()) {
                t.late_detected(e.msg_id, now);
            }
            if !e.new_row {
                tracing::warn!(
                    msg_id = e.msg_id,
                    "late arrival already had a processing row; not enqueued again"
                );
            }
            report.detected.push(LateHit {
                msg_id: e.msg_id,
                enqueued: e.new_row,
            });
        }
        // Every range of the page was checked whole, the pieces left of a split one too.
        let checked: Vec<_> = page
            .iter()
            .flat_map(|r| {
                let inside: Vec<i64> = hits.iter().copied().filter(|h| r.contains(*h)).collect();
                split_range(r, &inside)
            })
            .collect();
        let closed = store.late_watch_checked(&checked, now).await?;
        for (first, last) in &closed {
            tracing::info!(
                first,
                last,
                count = last - first + 1,
                "released hole ids never arrived within the watch window; no longer watched"
            );
        }
        report.closed.extend(closed);
        if page.len() < batch as usize {
            break;
        }
    }
    report.open = store.late_watch_open().await?;
    telemetry::late_watch_size(report.open);
    report.took = started.elapsed();
    Ok(report)
}
