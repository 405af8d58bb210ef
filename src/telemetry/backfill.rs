//! Marking metrics (the backfill sweeper writing marks into the inbox), each next to its log
//! line.

use std::time::Duration;

use chrono::{DateTime, Utc};
use metrics::{counter, gauge, histogram};

use super::Def;
use crate::rows::AbandonReason;

/// Terminal rows not yet marked in the inbox (and not abandoned).
pub const BACKFILL_PENDING: &str = "msgx_backfill_pending";
/// Age of the oldest terminal row not yet marked.
pub const BACKFILL_OLDEST_UNMARKED_SECONDS: &str = "msgx_backfill_oldest_unmarked_seconds";
/// Rows confirmed marked, by result (`marked`, `already_marked`).
pub const BACKFILL_MARKED_TOTAL: &str = "msgx_backfill_marked_total";
/// Rows abandoned, by reason (`MISSING_ROW`, `MAX_ATTEMPTS`) and kind.
pub const BACKFILL_ABANDONED_TOTAL: &str = "msgx_backfill_abandoned_total";
/// Rows whose mark failed transiently (backed off).
pub const BACKFILL_TRANSIENT_FAILURES_TOTAL: &str = "msgx_backfill_transient_failures_total";
/// Row tries that found the inbox row held by another session (the DB owner): not written,
/// not charged an attempt.
pub const BACKFILL_LOCKED_TOTAL: &str = "msgx_backfill_locked_total";
/// Unmarked rows held by another session at their last try.
pub const BACKFILL_LOCKED_ROWS: &str = "msgx_backfill_locked_rows";
/// How long the longest-held of them has been held.
pub const BACKFILL_LOCKED_OLDEST_SECONDS: &str = "msgx_backfill_locked_oldest_seconds";
/// Duration of one sweep.
pub const BACKFILL_SWEEP_SECONDS: &str = "msgx_backfill_sweep_duration_seconds";

/// `result` of [`BACKFILL_MARKED_TOTAL`].
pub const MARK_RESULTS: &[&str] = &["marked", "already_marked"];
/// `kind` of a MISSING_ROW abandon: we never saw the row (`MissingKind::NeverSeen`).
pub const KIND_NEVER_SEEN: &str = "never_seen";
/// `kind`: the row vanished after we read it (`MissingKind::PurgedBeforeMark`).
pub const KIND_PURGED_BEFORE_MARK: &str = "purged_before_mark";
/// Every `kind` of a MISSING_ROW abandon.
pub const MISSING_KINDS: &[&str] = &[KIND_NEVER_SEEN, KIND_PURGED_BEFORE_MARK];
/// `kind` of a MAX_ATTEMPTS abandon.
pub const KIND_TRANSIENT: &str = "transient";

/// Every (`reason`, `kind`) pair of [`BACKFILL_ABANDONED_TOTAL`].
pub fn abandoned_combos() -> Vec<Vec<&'static str>> {
    let mut all: Vec<Vec<&'static str>> = MISSING_KINDS
        .iter()
        .map(|k| vec![AbandonReason::MissingRow.as_str(), *k])
        .collect();
    all.push(vec![AbandonReason::MaxAttempts.as_str(), KIND_TRANSIENT]);
    all
}

/// The series of this file.
pub(super) fn defs() -> Vec<Def> {
    vec![
        Def::gauge(BACKFILL_PENDING, "rows", "Terminal rows not yet marked in the inbox (and not abandoned); NaN before the first backlog refresh"),
        Def::gauge(BACKFILL_OLDEST_UNMARKED_SECONDS, "seconds", "Age of the oldest terminal row not yet marked (0 when none); NaN before the first backlog refresh"),
        Def::counter(BACKFILL_MARKED_TOTAL, "rows", "Rows confirmed marked in the inbox, by result").label("result", MARK_RESULTS),
        Def::counter(BACKFILL_ABANDONED_TOTAL, "rows", "Rows the backfill abandoned (NOT marked; manual reconciliation), by reason and kind").combos(&["reason", "kind"], abandoned_combos()),
        Def::counter(BACKFILL_TRANSIENT_FAILURES_TOTAL, "rows", "Rows whose inbox mark failed transiently (backed off)"),
        Def::counter(BACKFILL_LOCKED_TOTAL, "rows", "Row tries that found the inbox row held by another session (the DB owner): not written, NOT charged an attempt, retried later"),
        Def::gauge(BACKFILL_LOCKED_ROWS, "rows", "Unmarked rows whose inbox row another session held at their last try; NaN before the first sweep"),
        Def::gauge(BACKFILL_LOCKED_OLDEST_SECONDS, "seconds", "How long the longest-held of those rows has been held (0 when none); NaN before the first sweep"),
        Def::histogram(BACKFILL_SWEEP_SECONDS, "seconds", "Duration of one backfill sweep"),
    ]
}

/// Buckets of this file's histograms.
pub(super) fn histogram_buckets() -> Vec<(&'static str, Vec<f64>)> {
    vec![(
        BACKFILL_SWEEP_SECONDS,
        vec![
            0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
        ],
    )]
}

/// One backfill sweep finished.
pub fn backfill_swept(marked: u64, already_marked: u64, transient: u64, took: Duration) {
    let _whole = super::whole::event();
    counter!(BACKFILL_MARKED_TOTAL, "result" => "marked").increment(marked);
    counter!(BACKFILL_MARKED_TOTAL, "result" => "already_marked").increment(already_marked);
    counter!(BACKFILL_TRANSIENT_FAILURES_TOTAL).increment(transient);
    histogram!(BACKFILL_SWEEP_SECONDS).record(took.as_secs_f64());
    if marked + already_marked + transient > 0 {
        tracing::debug!(
            marked,
            already_marked,
            transient,
            took_ms = took.as_millis() as u64,
            "backfill sweep"
        );
    }
}

/// A row was abandoned by the backfill: `reason` is `MISSING_ROW` or `MAX_ATTEMPTS`; `kind`
/// tells a row never seen (a released hole, a compat id) from one purged after we read it.
pub fn backfill_abandoned(msg_id: i64, reason: &'static str, kind: &'static str, detail: &str) {
    counter!(BACKFILL_ABANDONED_TOTAL, "reason" => reason, "kind" => kind).increment(1);
    tracing::error!(
        msg_id,
        reason,
        kind,
        detail,
        alert = true,
        "backfill abandoned; the inbox row is NOT marked (manual reconciliation)"
    );
}

/// After a sweep: the rows another inbox session held this time (each with its next try), and
/// every row still held as of now. Logged once per sweep — a held row is tried, so logged, at
/// most once per its retry delay (`backfill.retry_initial` growing to `backfill.retry_max`);
/// at ERROR with `alert = true` once the longest hold passes `alert_after`.
pub fn backfill_locked(
    locked: &[(i64, DateTime<Utc>)],
    held_rows: i64,
    oldest: Duration,
    alert_after: Duration,
) {
    counter!(BACKFILL_LOCKED_TOTAL).increment(locked.len() as u64);
    gauge!(BACKFILL_LOCKED_ROWS).set(held_rows as f64);
    gauge!(BACKFILL_LOCKED_OLDEST_SECONDS).set(oldest.as_secs_f64());
    if locked.is_empty() {
        return;
    }
    let ids: Vec<i64> = locked.iter().map(|l| l.0).collect();
    let next_try = locked.iter().map(|l| l.1).min();
    let held_s = oldest.as_secs();
    if oldest >= alert_after {
        tracing::error!(
            rows = %super::ids::IdSummary(&ids),
            held_rows,
            oldest_held_s = held_s,
            next_try = ?next_try,
            alert = true,
            "backfill: inbox rows held by another session (the DB owner's row lock) for longer \
             than backfill.locked_alert_after; NOT marked, not charged, retried later — ask the \
             DB owner which session holds them"
        );
    } else {
        tracing::warn!(
            rows = %super::ids::IdSummary(&ids),
            held_rows,
            oldest_held_s = held_s,
            next_try = ?next_try,
            "backfill: inbox rows held by another session (the DB owner's row lock) were \
             skipped; not charged an attempt, retried later"
        );
    }
}
