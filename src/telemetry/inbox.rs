//! Discovery metrics (the inbox poller, holes, the compensation scan), each next to its log
//! line.

use std::time::Duration;

use metrics::{counter, gauge, histogram};

use super::Def;

/// W, the contiguous upper bound of discovered inbox ids.
pub const INBOX_WATERMARK: &str = "msgx_inbox_watermark";
/// Highest id seen in the inbox.
pub const INBOX_HEAD_ID: &str = "msgx_inbox_head_id";
/// Inbox head − W.
pub const INBOX_LAG_IDS: &str = "msgx_inbox_lag_ids";
/// Age of the oldest inbox row not yet enqueued.
pub const INBOX_LAG_SECONDS: &str = "msgx_inbox_lag_seconds";
/// 1 while W waits at a hole.
pub const INBOX_HOLE_OPEN: &str = "msgx_inbox_hole_open";
/// How long the oldest open hole has been open.
pub const INBOX_HOLE_AGE_SECONDS: &str = "msgx_inbox_hole_age_seconds";
/// Open holes (ranges), each aging on its own.
pub const INBOX_HOLES_OPEN: &str = "msgx_inbox_holes_open";
/// Ids missing in the open holes.
pub const INBOX_HOLE_MISSING_IDS: &str = "msgx_inbox_hole_missing_ids";
/// 1 while the inbox head is below W.
pub const INBOX_ID_REGRESSION: &str = "msgx_inbox_id_regression";
/// Times the inbox head was seen falling below W.
pub const INBOX_ID_REGRESSIONS_TOTAL: &str = "msgx_inbox_id_regressions_total";
/// Stored holes dropped because the rows after them vanished.
pub const INBOX_HOLES_DROPPED_TOTAL: &str = "msgx_inbox_holes_dropped_total";
/// Inbox rows at or below W found by the compensation scan, never discovered before.
pub const INBOX_UNSEEN_BELOW_W_TOTAL: &str = "msgx_inbox_unseen_below_w_total";
/// Inbox ids at or below W now holding another row than the one we processed.
pub const INBOX_ID_REUSED_TOTAL: &str = "msgx_inbox_id_reused_total";
/// Duration of one compensation scan over the window behind W.
pub const INBOX_COMPENSATION_SCAN_SECONDS: &str = "msgx_inbox_compensation_scan_seconds";
/// Holes released as permanent.
pub const INBOX_HOLES_RELEASED_TOTAL: &str = "msgx_inbox_permanent_holes_released_total";
/// Ids skipped by those releases.
pub const INBOX_HOLE_IDS_RELEASED_TOTAL: &str = "msgx_inbox_hole_ids_released_total";
/// G7: hole first seen → row visible.
pub const INBOX_HOLE_FILL_SECONDS: &str = "msgx_inbox_hole_fill_seconds";
/// Rows newly enqueued.
pub const INBOX_ENQUEUED_TOTAL: &str = "msgx_inbox_enqueued_total";
/// Failed poll rounds by `stage` (one of [`POLL_STAGES`]).
pub const INBOX_POLL_ERRORS_TOTAL: &str = "msgx_inbox_poll_errors_total";
/// Duration of one poll round.
pub const INBOX_POLL_DURATION_SECONDS: &str = "msgx_inbox_poll_duration_seconds";
/// Hole decisions taken on transaction evidence (`released_early`, `held`, `cap_reached`).
pub const HOLE_EVIDENCE_TOTAL: &str = "msgx_inbox_hole_evidence_total";
/// 1 while start-up waits for `inbox.url` to reach the primary (read-only, a replica or
/// unreachable: a failover in progress), with `late.hole_evidence` on.
pub const INBOX_WAITING_FOR_PRIMARY: &str = "msgx_inbox_waiting_for_primary";
/// Start-up checks that found the inbox server not (yet) the primary, by why.
pub const INBOX_NOT_PRIMARY_TOTAL: &str = "msgx_inbox_not_primary_total";
/// `why` of [`INBOX_NOT_PRIMARY_TOTAL`].
pub const NOT_PRIMARY_WHYS: &[&str] = &["read_only", "replica", "unreachable"];

/// `stage` of [`INBOX_POLL_ERRORS_TOTAL`]: the store (PostgreSQL) failed.
pub const POLL_STAGE_STORE: &str = "store";
/// `stage`: the inbox could not be read, or returned ids out of order.
pub const POLL_STAGE_INBOX: &str = "inbox";
/// `stage`: the stored hole set is corrupt.
pub const POLL_STAGE_HOLES: &str = "holes";
/// Every `stage` of [`INBOX_POLL_ERRORS_TOTAL`] (`PollError::stage` returns only these).
pub const POLL_STAGES: &[&str] = &[POLL_STAGE_STORE, POLL_STAGE_INBOX, POLL_STAGE_HOLES];

/// `decision` of [`HOLE_EVIDENCE_TOTAL`]: released before max-commit-delay (rolled back).
pub const HOLE_RELEASED_EARLY: &str = "released_early";
/// `decision`: kept past max-commit-delay (an older transaction is still open).
pub const HOLE_HELD: &str = "held";
/// `decision`: released at the evidence cap although an older transaction is open (alert).
pub const HOLE_CAP_REACHED: &str = "cap_reached";
/// Every `decision` of [`HOLE_EVIDENCE_TOTAL`] (`EvidenceDecision::as_str` returns only these).
pub const HOLE_DECISIONS: &[&str] = &[HOLE_RELEASED_EARLY, HOLE_HELD, HOLE_CAP_REACHED];

/// The series of this file.
pub(super) fn defs() -> Vec<Def> {
    vec![
        Def::gauge(INBOX_WATERMARK, "id", "Contiguous watermark W of discovered inbox ids; NaN before the first round"),
        Def::gauge(INBOX_HEAD_ID, "id", "Highest inbox id seen; NaN before the first round"),
        Def::gauge(INBOX_LAG_IDS, "ids", "Inbox head id minus W (negative while the head is below W); NaN before the first round"),
        Def::gauge(INBOX_LAG_SECONDS, "seconds", "Age of the oldest inbox row not yet enqueued; NaN before the first round"),
        Def::gauge(INBOX_HOLE_OPEN, "1 = yes", "1 while any hole is open; NaN before the first round"),
        Def::gauge(INBOX_HOLE_AGE_SECONDS, "seconds", "Age of the oldest open hole (each hole ages from its own first sighting); NaN before the first round"),
        Def::gauge(INBOX_HOLES_OPEN, "holes", "Open holes (id ranges) above W; NaN before the first round"),
        Def::gauge(INBOX_HOLE_MISSING_IDS, "ids", "Inbox ids missing in the open holes; NaN before the first round"),
        Def::gauge(INBOX_ID_REGRESSION, "1 = yes", "1 while the inbox head is below W (the inbox went backwards); NaN before the first round"),
        Def::counter(INBOX_ID_REGRESSIONS_TOTAL, "events", "Times the inbox head fell below W"),
        Def::counter(INBOX_HOLES_DROPPED_TOTAL, "holes", "Open holes dropped because the rows after them vanished from the inbox"),
        Def::counter(INBOX_UNSEEN_BELOW_W_TOTAL, "rows", "Inbox rows at or below W found by the compensation scan (never discovered; enqueued LATE)"),
        Def::counter(INBOX_ID_REUSED_TOTAL, "ids", "Inbox ids at or below W that now hold another row than the one processed (receive time differs)"),
        Def::histogram(INBOX_COMPENSATION_SCAN_SECONDS, "seconds", "Duration of one compensation scan over the window behind W"),
        Def::counter(INBOX_HOLES_RELEASED_TOTAL, "holes", "Holes released as permanent (max-commit-delay, or transaction evidence)"),
        Def::counter(INBOX_HOLE_IDS_RELEASED_TOTAL, "ids", "Inbox ids skipped by permanent-hole releases"),
        Def::histogram(INBOX_HOLE_FILL_SECONDS, "seconds", "Hole first seen to row visible (G7: choose max-commit-delay from it)"),
        Def::counter(INBOX_ENQUEUED_TOTAL, "rows", "Inbox rows newly enqueued into PROC_STATE"),
        Def::counter(INBOX_POLL_ERRORS_TOTAL, "rounds", "Failed poll rounds by stage (store, inbox, holes); W kept").label("stage", POLL_STAGES),
        Def::histogram(INBOX_POLL_DURATION_SECONDS, "seconds", "Duration of one poll round"),
        Def::counter(HOLE_EVIDENCE_TOTAL, "decisions", "Hole decisions taken on transaction evidence (released_early, held, cap_reached)").label("decision", HOLE_DECISIONS),
        Def::gauge(INBOX_WAITING_FOR_PRIMARY, "1 = yes", "1 while start-up waits for inbox.url to reach a writable primary (late.hole_evidence = true; a failover in progress)").starts_at(0.0),
        Def::counter(INBOX_NOT_PRIMARY_TOTAL, "checks", "Start-up checks that found the inbox server read-only, a replica or unreachable (retried)").label("why", NOT_PRIMARY_WHYS),
    ]
}

/// Start-up found the inbox server not the primary (`why`: one of [`NOT_PRIMARY_WHYS`]) and
/// retries in `retry_in`; `error` is what it said.
pub fn inbox_not_primary(
    why: &'static str,
    error: &dyn std::error::Error,
    attempt: i32,
    retry_in: std::time::Duration,
) {
    counter!(INBOX_NOT_PRIMARY_TOTAL, "why" => why).increment(1);
    gauge!(INBOX_WAITING_FOR_PRIMARY).set(1.0);
    tracing::warn!(
        why,
        attempt,
        error = %error,
        retry_in_s = retry_in.as_secs(),
        "the inbox server at inbox.url is not a writable primary (a failover?); \
         late.hole_evidence needs it: retrying"
    );
}

/// The inbox server is the primary: start-up goes on.
pub fn inbox_primary_found() {
    gauge!(INBOX_WAITING_FOR_PRIMARY).set(0.0);
}

/// Buckets of this file's histograms.
pub(super) fn histogram_buckets() -> Vec<(&'static str, Vec<f64>)> {
    vec![
        (
            INBOX_HOLE_FILL_SECONDS,
            vec![
                0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
                1800.0,
            ],
        ),
        (
            INBOX_COMPENSATION_SCAN_SECONDS,
            vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0],
        ),
        (
            INBOX_POLL_DURATION_SECONDS,
            vec![
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
            ],
        ),
    ]
}

/// Why a permanent hole was released (the log line says it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseWhy {
    /// `max_commit_delay` passed.
    Timer,
    /// Transaction evidence: no older transaction is open (the missing id rolled back).
    RolledBack,
    /// The evidence cap was reached with an older transaction still open.
    EvidenceCap,
}

impl ReleaseWhy {
    fn as_str(self) -> &'static str {
        match self {
            Self::Timer => "max-commit-delay reached",
            Self::RolledBack => "no older transaction open (rolled back)",
            Self::EvidenceCap => "hole evidence cap reached",
        }
    }
}

/// The hole W waits at after a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitingHole {
    /// First missing id (W + 1).
    pub first_missing: i64,
    /// First id present after it.
    pub next_present: i64,
    /// How long it has been open (zero: opened this round).
    pub age: Duration,
}

/// A hole released as permanent this round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HoleReleased {
    /// First released id.
    pub first: i64,
    /// Last released id.
    pub last: i64,
    /// Why.
    pub why: ReleaseWhy,
}

/// What a poll round saw of the inbox around W: the poller's report holds it and the round's
/// event shows it as is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InboxSight {
    /// Highest inbox id known after the round (None when unknown, e.g. an empty table).
    pub head: Option<i64>,
    /// Age of the oldest row left behind W (zero when caught up; None when unknown).
    pub lag: Option<Duration>,
    /// The inbox went backwards (id regression): its head is below W and its next
    /// `AUTO_INCREMENT` id is at or below W (new rows would reuse ids W already passed).
    pub regressed: bool,
    /// `late.compensation_window`: the ids below W a regression's reused ids are found in
    /// (told in the id-regression log line).
    pub compensation_window: u64,
    /// Age of the oldest open hole by the round's clock.
    pub oldest_hole_age: Option<Duration>,
}

/// A poll round committed: W, head, lag, holes, releases, fills.
#[derive(Debug, Clone, PartialEq)]
pub struct PollRound {
    /// The new watermark.
    pub w: i64,
    /// Head, lag, regression and the oldest hole's age.
    pub sight: InboxSight,
    /// Rows newly enqueued.
    pub enqueued: u64,
    /// Wall time of the round.
    pub took: Duration,
    /// Open holes (ranges) after the round.
    pub holes_open: usize,
    /// Ids missing in them.
    pub missing_ids: i64,
    /// The hole W waits at.
    pub waiting: Option<WaitingHole>,
    /// Stored holes that filled this round: first seen → visible (G7).
    pub fills: Vec<Duration>,
    /// Holes released as permanent this round.
    pub released: Vec<HoleReleased>,
}

impl PollRound {
    /// Metrics and log lines of the round.
    pub fn emit(&self) {
        let _whole = super::whole::event();
        let (w, sight) = (self.w, self.sight);
        gauge!(INBOX_WATERMARK).set(w as f64);
        match sight.head {
            Some(head) => {
                gauge!(INBOX_HEAD_ID).set(head as f64);
                // Negative when the inbox head is below W (id regression, or the DB owner
                // purged the newest rows): never a reassuring 0 then.
                gauge!(INBOX_LAG_IDS).set((head - w) as f64);
            }
            // An empty table (purged) with the next id above W: caught up.
            None if !sight.regressed && sight.lag == Some(Duration::ZERO) => {
                gauge!(INBOX_LAG_IDS).set(0.0);
            }
            None => {}
        }
        if let Some(lag) = sight.lag {
            gauge!(INBOX_LAG_SECONDS).set(lag.as_secs_f64());
        }
        id_regression(w, sight);
        counter!(INBOX_ENQUEUED_TOTAL).increment(self.enqueued);
        histogram!(INBOX_POLL_DURATION_SECONDS).record(self.took.as_secs_f64());
        gauge!(INBOX_HOLE_OPEN).set(if self.holes_open == 0 { 0.0 } else { 1.0 });
        gauge!(INBOX_HOLES_OPEN).set(self.holes_open as f64);
        gauge!(INBOX_HOLE_MISSING_IDS).set(self.missing_ids as f64);
        gauge!(INBOX_HOLE_AGE_SECONDS).set(sight.oldest_hole_age.map_or(0.0, |d| d.as_secs_f64()));
        if let Some(h) = self.waiting {
            if h.age.is_zero() {
                tracing::info!(
                    watermark = w,
                    first_missing = h.first_missing,
                    next_present = h.next_present,
                    holes_open = self.holes_open,
                    "hole opened; waiting for a late commit"
                );
            } else {
                tracing::debug!(
                    watermark = w,
                    first_missing = h.first_missing,
                    age_s = h.age.as_secs(),
                    holes_open = self.holes_open,
                    "hole still open"
                );
            }
        }
        for filled in &self.fills {
            histogram!(INBOX_HOLE_FILL_SECONDS).record(filled.as_secs_f64());
            tracing::info!(watermark = w, fill_s = filled.as_secs_f64(), "hole filled");
        }
        for r in &self.released {
            counter!(INBOX_HOLES_RELEASED_TOTAL).increment(1);
            counter!(INBOX_HOLE_IDS_RELEASED_TOTAL).increment((r.last - r.first + 1).max(0) as u64);
            tracing::warn!(
                watermark = w,
                first = r.first,
                last = r.last,
                why = r.why.as_str(),
                "permanent hole released; ids handed to the late detector"
            );
        }
        if self.enqueued > 0 {
            tracing::debug!(watermark = w, enqueued = self.enqueued, "enqueued");
        }
    }
}

/// The inbox head is below W (or not): the gauge follows every round, the ERROR line is
/// logged when it starts. It says what happens to new rows meanwhile: W holds (it never moves
/// back and never passes a row), so discovery waits until the head passes W again; rows under
/// reused ids at or below W are found only by the compensation scan, and only within
/// `compensation_window` ids below W (`compensation_floor`..=W); below that, only the DB owner
/// moving them (re-inserting them above W) brings them in. The runbook entry is the procedure.
fn id_regression(w: i64, sight: InboxSight) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static ACTIVE: AtomicBool = AtomicBool::new(false);
    let InboxSight {
        head,
        regressed,
        compensation_window: window,
        ..
    } = sight;
    gauge!(INBOX_ID_REGRESSION).set(if regressed { 1.0 } else { 0.0 });
    let was = ACTIVE.swap(regressed, Ordering::Relaxed);
    if regressed && !was {
        counter!(INBOX_ID_REGRESSIONS_TOTAL).increment(1);
        let floor = compensation_floor(w, window);
        tracing::error!(
            alert = true,
            watermark = w,
            inbox_head = head,
            compensation_window = window,
            compensation_floor = floor,
            auto_increment_seed = w.saturating_add(1),
            "inbox id regression: the inbox head is below W and its next AUTO_INCREMENT id is at \
             or below W (table rotated without the AUTO_INCREMENT seed, or restored?); W holds \
             and new rows wait until the head passes W again; rows under reused ids from \
             compensation_floor to W are enqueued LATE by the compensation scan, rows below \
             compensation_floor are not found; the DB owner must set AUTO_INCREMENT to \
             auto_increment_seed and re-insert the rows under reused ids \
             (docs/operations.md, \"The inbox went backwards\")"
        );
    } else if !regressed && was {
        tracing::info!(
            watermark = w,
            inbox_head = head,
            "inbox head is above W again"
        );
    }
}

/// The lowest id the compensation scan re-reads, `(W − window, W]` (seed §5.1 stage 1); W + 1
/// when the scan is off (window 0): nothing at or below W is found.
fn compensation_floor(w: i64, window: u64) -> i64 {
    let window = i64::try_from(window).unwrap_or(i64::MAX);
    if window == 0 {
        return w.saturating_add(1);
    }
    w.saturating_sub(window).max(0).saturating_add(1)
}

/// Stored holes no row follows any more (rows above W vanished): dropped, their ids re-aged.
/// `dropped` holds each hole's `(first, last)` missing id.
pub fn holes_dropped(w: i64, dropped: &[(i64, i64)]) {
    counter!(INBOX_HOLES_DROPPED_TOTAL).increment(dropped.len() as u64);
    for (first, last) in dropped {
        tracing::error!(
            alert = true,
            watermark = w,
            first,
            last,
            "rows that followed an open hole vanished from the inbox (the inbox went \
             backwards); the hole is dropped and its ids are missing again from now"
        );
    }
}

/// The compensation scan found inbox rows below W that discovery never saw: enqueued LATE.
pub fn unseen_below_w(w: i64, ids: &[i64]) {
    counter!(INBOX_UNSEEN_BELOW_W_TOTAL).increment(ids.len() as u64);
    tracing::error!(
        alert = true,
        watermark = w,
        count = ids.len(),
        ids = %crate::telemetry::ids::IdSummary(ids),
        "inbox rows at or below W were never discovered (id reuse after a rotation, a \
         restore?); enqueued as LATE under the ordering guard"
    );
}

/// The compensation scan found rows under ids we enqueued for another row (other receive time).
pub fn id_reused(w: i64, ids: &[i64]) {
    counter!(INBOX_ID_REUSED_TOTAL).increment(ids.len() as u64);
    tracing::error!(
        alert = true,
        watermark = w,
        count = ids.len(),
        ids = %crate::telemetry::ids::IdSummary(ids),
        "inbox ids reused by different rows (their receive time differs from the row we \
         processed under that id): these rows cannot be processed under the same id; ask the DB \
         owner to seed AUTO_INCREMENT above W and re-insert them"
    );
}

/// One compensation scan finished.
pub fn compensation_scan(from: i64, to: i64, checked: u64, took: Duration) {
    histogram!(INBOX_COMPENSATION_SCAN_SECONDS).record(took.as_secs_f64());
    tracing::debug!(
        from,
        to,
        checked,
        took_ms = took.as_millis() as u64,
        "compensation scan"
    );
}

/// A round failed; W is unchanged.
pub fn poll_failed(stage: &'static str, error: &dyn std::error::Error, watermark: Option<i64>) {
    counter!(INBOX_POLL_ERRORS_TOTAL, "stage" => stage).increment(1);
    tracing::error!(stage, watermark, error = %error, "poll round failed; watermark kept");
}

/// A hole decision taken on transaction evidence.
pub fn hole_evidence(decision: &'static str, first_missing: i64) {
    counter!(HOLE_EVIDENCE_TOTAL, "decision" => decision).increment(1);
    if decision == "cap_reached" {
        tracing::error!(
            first_missing,
            decision,
            alert = true,
            "hole held past the evidence cap; released"
        );
    } else {
        tracing::info!(
            first_missing,
            decision,
            "hole decided on transaction evidence"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::compensation_floor;

    #[test]
    fn the_compensation_floor_is_the_lowest_id_the_scan_rereads() {
        assert_eq!(compensation_floor(500, 100), 401);
        assert_eq!(compensation_floor(500, 100_000), 1);
        assert_eq!(compensation_floor(500, u64::MAX), 1);
        // Off: nothing at or below W is re-read.
        assert_eq!(compensation_floor(500, 0), 501);
    }
}
