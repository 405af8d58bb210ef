//! One late-detection round over the durable watch list.

use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::inbox::names::InboxNames;
use crate::inbox::{Inbox, InboxError};
use crate::settings::{Settings, SettingsError};
use crate::store::{Store, StoreError};
use crate::telemetry;

/// Knobs of a detection round.
#[derive(Debug, Clone)]
pub struct DetectConfig {
    /// Watched ids per inbox statement (`late.batch`).
    pub batch: u32,
    /// The configured inbox names (the check reads only the id column).
    pub names: InboxNames,
    /// Limit of one inbox statement (`inbox.query_timeout`).
    pub query_timeout: Duration,
}

impl DetectConfig {
    /// From the settings: `late.batch`, the inbox names, `inbox.query_timeout`.
    pub fn from_settings(settings: &Settings) -> Result<Self, SettingsError> {
        Ok(Self {
            batch: settings.late.batch,
            names: settings.inbox_names()?,
            query_timeout: settings.inbox.query_timeout,
        })
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
    /// Watched ids checked against the inbox.
    pub checked: u64,
    /// Ids found in the inbox: marked detected and enqueued (LATE) in one transaction.
    pub detected: Vec<LateHit>,
    /// Absent ids whose watch window had passed: closed (deleted from the watch list).
    pub closed: Vec<i64>,
    /// Open watched ids after the round.
    pub open: i64,
    /// Wall time of the round.
    pub took: Duration,
}

/// Why a round stopped. Batches before the failure are committed and stay; the failed batch
/// changed nothing (its ids stay watched, none is closed).
#[derive(Debug, thiserror::Error)]
pub enum DetectError {
    /// Our PostgreSQL failed.
    #[error("late detection: store: {0}")]
    Store(#[from] StoreError),
    /// The inbox could not be read: an infrastructure failure, never "absent".
    #[error("late detection: inbox check: {0}")]
    Inbox(#[from] InboxError),
}

/// One detection round (SPEC §6, G1): every open watched id, in batches of `cfg.batch` in id
/// order, is checked against the inbox with one statement per batch.
///
/// - present → detected and enqueued as `LATE` in ONE PostgreSQL transaction, then counted
///   (`msgx_pipeline_late_arrival_detected_total`) and alerted with its id;
/// - absent, window passed → closed (deleted): an id is closed only after a successful check
///   at or after its expiry, so a row that committed inside the window is never missed;
/// - absent, window open → `checked_at` stamped.
///
/// An inbox failure stops the round with [`DetectError::Inbox`] before anything of that batch
/// is written: the watch stays intact. Time (detection, expiry) is the injected clock's.
pub async fn detect_once(
    inbox: &Inbox,
    store: &Store,
    clock: &dyn Clock,
    cfg: &DetectConfig,
) -> Result<DetectReport, DetectError> {
    let started = Instant::now();
    let mut report = DetectReport::default();
    let mut after = 0i64;
    loop {
        let now = clock.now();
        let page = store.late_watch_page(after, cfg.batch.max(1), now).await?;
        let Some(last) = page.last() else {
            break;
        };
        after = last.msg_id;
        let ids: Vec<i64> = page.iter().map(|w| w.msg_id).collect();
        let present = inbox
            .present_ids(&cfg.names, &ids, cfg.query_timeout)
            .await?;
        report.checked += ids.len() as u64;
        let (hits, absent): (Vec<i64>, Vec<i64>) =
            ids.into_iter().partition(|id| present.contains(id));
        for e in store.late_watch_detected(&hits, now).await? {
            telemetry::late_detected(e.msg_id);
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
        let closed = store.late_watch_absent(&absent, now).await?;
        if let (Some(first), Some(last)) = (closed.first(), closed.last()) {
            tracing::info!(
                count = closed.len(),
                first,
                last,
                "released hole ids never arrived within the watch window; no longer watched"
            );
        }
        report.closed.extend(closed);
        if page.len() < cfg.batch.max(1) as usize {
            break;
        }
    }
    report.open = store.late_watch_open().await?;
    telemetry::late_watch_size(report.open);
    report.took = started.elapsed();
    Ok(report)
}
