//! Every metric name of the service, each next to the log line that goes with it
//! (Vector's `internal_events` style): one place to read what the service reports.

use std::time::Duration;

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit,
};

mod dispatch;
pub use dispatch::{
    dispatch_backlog, dispatch_failed, dispatch_round, DISPATCH_COMMIT_TO_ACK_SECONDS,
    DISPATCH_DEAD_TOTAL, DISPATCH_OLDEST_PENDING_SECONDS, DISPATCH_PENDING,
    DISPATCH_PRODUCER_RECREATED_TOTAL, DISPATCH_PRODUCE_SECONDS, DISPATCH_RETRIES_TOTAL,
    DISPATCH_ROUND_ERRORS_TOTAL, DISPATCH_SENT_TOTAL,
};
mod reliability;
pub use reliability::{
    lease_renew_failed, lease_standby, lease_tampered, restarts_in_window, supervisor_gave_up,
    verify_result, LEASE_RENEW_FAILURES_TOTAL, LEASE_TAMPERED, SUPERVISOR_GAVE_UP,
    SUPERVISOR_RESTARTS_IN_WINDOW, VERIFY_VIOLATIONS,
};
mod pump;
pub use pump::{pump_group, PUMP_GROUP_SECONDS, PUMP_GROUP_SIZE};
mod procedures;
pub use procedures::{purge_boundary, PURGE_BOUNDARY_ID, PURGE_BOUNDARY_RECEIVED_TIMESTAMP};
mod raw_copy;
pub use raw_copy::{
    raw_copies_purged, raw_copies_written, raw_copy_corrupt, raw_copy_read, replay_source,
    RAW_COPY_CORRUPT_TOTAL, RAW_COPY_PURGED_TOTAL, RAW_COPY_RAW_BYTES_TOTAL, RAW_COPY_READS_TOTAL,
    RAW_COPY_STORED_BYTES_TOTAL, RAW_COPY_WRITTEN_TOTAL, REPLAY_SOURCE_TOTAL,
};
mod outbound;
pub use outbound::{
    outbound_failed, outbound_reconciled, outbound_registered, outbound_sent, outbound_stale,
    OUTBOUND_ERRORS_TOTAL, OUTBOUND_RECONCILED_TOTAL, OUTBOUND_REGISTERED_STALE,
    OUTBOUND_REGISTERED_TOTAL, OUTBOUND_SENT_TOTAL,
};

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
/// Failed poll rounds by stage (`cursor`, `inbox`, `enqueue`).
pub const INBOX_POLL_ERRORS_TOTAL: &str = "msgx_inbox_poll_errors_total";
/// Duration of one poll round.
pub const INBOX_POLL_DURATION_SECONDS: &str = "msgx_inbox_poll_duration_seconds";
/// Ids reported to the late detector (stage-0 receiver counts them).
pub const LATE_WATCH_RECEIVED_TOTAL: &str = "msgx_late_watch_ids_received_total";
/// Processing attempts by outcome (`succeeded`, `skipped`, `dead`, `failed`) and class.
pub const PIPELINE_PROCESSED_TOTAL: &str = "msgx_pipeline_processed_total";
/// Duration of one processing attempt.
pub const PIPELINE_PROCESSING_SECONDS: &str = "msgx_pipeline_processing_seconds";
/// The current head's MSG_ID (0 when idle).
pub const PIPELINE_HEAD_ID: &str = "msgx_pipeline_head_id";
/// Age of the head (receive, else enqueue time → now) when last taken.
pub const PIPELINE_HEAD_AGE_SECONDS: &str = "msgx_pipeline_head_age_seconds";
/// PENDING + FAILED rows.
pub const PIPELINE_UNFINISHED: &str = "msgx_pipeline_unfinished";
/// Age of the oldest unfinished row.
pub const PIPELINE_OLDEST_UNPROCESSED_SECONDS: &str = "msgx_pipeline_oldest_unprocessed_seconds";
/// Pump steps that failed on the store (nothing recorded; retried).
pub const PIPELINE_STEP_ERRORS_TOTAL: &str = "msgx_pipeline_step_errors_total";
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
/// Duration of one sweep.
pub const BACKFILL_SWEEP_SECONDS: &str = "msgx_backfill_sweep_duration_seconds";
/// Released hole ids still watched.
pub const LATE_WATCH_SIZE: &str = "msgx_late_watch_size";
/// Released hole ids that later appeared in the inbox.
pub const LATE_DETECTED_TOTAL: &str = "msgx_pipeline_late_arrival_detected_total";
/// Fields a late message could not apply (a newer message had set them).
pub const LATE_STALE_FIELDS_TOTAL: &str = "msgx_pipeline_late_arrival_stale_fields_total";
/// Operator replays by result (`applied`, `refused`).
pub const REPLAY_TOTAL: &str = "msgx_admin_replay_total";
/// Hole decisions taken on transaction evidence (`released_early`, `held`, `cap_reached`).
pub const HOLE_EVIDENCE_TOTAL: &str = "msgx_inbox_hole_evidence_total";
/// Restarts of a child actor by the supervisor.
pub const ACTOR_RESTARTS_TOTAL: &str = "msgx_actor_restarts_total";
/// G6: unfinished ÷ recent processing rate (+Inf when stalled with a backlog, NaN before the
/// first rate).
pub const PIPELINE_ESTIMATED_DRAIN_SECONDS: &str = "msgx_pipeline_estimated_drain_seconds";
/// 1 while this instance holds the single-instance lease.
pub const INSTANCE_LEASE_HELD: &str = "msgx_instance_lease_held";
/// This instance's fencing epoch (bumped by every instance that takes the lease).
pub const INSTANCE_LEASE_EPOCH: &str = "msgx_instance_lease_epoch";

/// Every metric name above (dashboards and alert rules are checked against it).
pub const ALL: &[&str] = &[
    INBOX_WATERMARK,
    INBOX_HEAD_ID,
    INBOX_LAG_IDS,
    INBOX_LAG_SECONDS,
    INBOX_HOLE_OPEN,
    INBOX_HOLE_AGE_SECONDS,
    INBOX_HOLES_OPEN,
    INBOX_HOLE_MISSING_IDS,
    INBOX_ID_REGRESSION,
    INBOX_ID_REGRESSIONS_TOTAL,
    INBOX_HOLES_DROPPED_TOTAL,
    INBOX_UNSEEN_BELOW_W_TOTAL,
    INBOX_ID_REUSED_TOTAL,
    INBOX_COMPENSATION_SCAN_SECONDS,
    INBOX_HOLES_RELEASED_TOTAL,
    INBOX_HOLE_IDS_RELEASED_TOTAL,
    INBOX_HOLE_FILL_SECONDS,
    INBOX_ENQUEUED_TOTAL,
    INBOX_POLL_ERRORS_TOTAL,
    INBOX_POLL_DURATION_SECONDS,
    LATE_WATCH_RECEIVED_TOTAL,
    PIPELINE_PROCESSED_TOTAL,
    PIPELINE_PROCESSING_SECONDS,
    PIPELINE_HEAD_ID,
    PIPELINE_HEAD_AGE_SECONDS,
    PIPELINE_UNFINISHED,
    PIPELINE_OLDEST_UNPROCESSED_SECONDS,
    PIPELINE_STEP_ERRORS_TOTAL,
    BACKFILL_PENDING,
    BACKFILL_OLDEST_UNMARKED_SECONDS,
    BACKFILL_MARKED_TOTAL,
    BACKFILL_ABANDONED_TOTAL,
    BACKFILL_TRANSIENT_FAILURES_TOTAL,
    BACKFILL_SWEEP_SECONDS,
    LATE_WATCH_SIZE,
    LATE_DETECTED_TOTAL,
    LATE_STALE_FIELDS_TOTAL,
    REPLAY_TOTAL,
    HOLE_EVIDENCE_TOTAL,
    ACTOR_RESTARTS_TOTAL,
    PIPELINE_ESTIMATED_DRAIN_SECONDS,
    INSTANCE_LEASE_HELD,
    INSTANCE_LEASE_EPOCH,
    DISPATCH_PENDING,
    DISPATCH_OLDEST_PENDING_SECONDS,
    DISPATCH_SENT_TOTAL,
    DISPATCH_RETRIES_TOTAL,
    DISPATCH_DEAD_TOTAL,
    DISPATCH_PRODUCE_SECONDS,
    DISPATCH_COMMIT_TO_ACK_SECONDS,
    DISPATCH_PRODUCER_RECREATED_TOTAL,
    DISPATCH_ROUND_ERRORS_TOTAL,
    OUTBOUND_REGISTERED_TOTAL,
    OUTBOUND_SENT_TOTAL,
    OUTBOUND_RECONCILED_TOTAL,
    OUTBOUND_REGISTERED_STALE,
    OUTBOUND_ERRORS_TOTAL,
    SUPERVISOR_RESTARTS_IN_WINDOW,
    SUPERVISOR_GAVE_UP,
    LEASE_RENEW_FAILURES_TOTAL,
    LEASE_TAMPERED,
    VERIFY_VIOLATIONS,
    PUMP_GROUP_SIZE,
    PUMP_GROUP_SECONDS,
    PURGE_BOUNDARY_ID,
    PURGE_BOUNDARY_RECEIVED_TIMESTAMP,
    RAW_COPY_WRITTEN_TOTAL,
    RAW_COPY_RAW_BYTES_TOTAL,
    RAW_COPY_STORED_BYTES_TOTAL,
    RAW_COPY_READS_TOTAL,
    RAW_COPY_CORRUPT_TOTAL,
    RAW_COPY_PURGED_TOTAL,
    REPLAY_SOURCE_TOTAL,
];

/// Histogram buckets (seconds) per histogram, for the Prometheus exporter.
pub fn histogram_buckets() -> Vec<(&'static str, Vec<f64>)> {
    let mut all = dispatch::histogram_buckets();
    all.extend(pump::histogram_buckets());
    all.extend(vec![
        (
            INBOX_HOLE_FILL_SECONDS,
            vec![
                0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
                1800.0,
            ],
        ),
        (
            PIPELINE_PROCESSING_SECONDS,
            vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
            ],
        ),
        (
            BACKFILL_SWEEP_SECONDS,
            vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
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
    ]);
    all
}

/// Registers descriptions (HELP lines) once at start-up.
pub fn describe() {
    dispatch::describe();
    outbound::describe();
    reliability::describe();
    pump::describe();
    procedures::describe();
    raw_copy::describe();
    describe_gauge!(
        INBOX_WATERMARK,
        "Contiguous watermark W of discovered inbox ids"
    );
    describe_gauge!(INBOX_HEAD_ID, "Highest inbox id seen");
    describe_gauge!(INBOX_LAG_IDS, "Inbox head id minus W");
    describe_gauge!(
        INBOX_LAG_SECONDS,
        Unit::Seconds,
        "Age of the oldest inbox row not yet enqueued"
    );
    describe_gauge!(INBOX_HOLE_OPEN, "1 while any hole is open");
    describe_gauge!(
        INBOX_HOLE_AGE_SECONDS,
        Unit::Seconds,
        "Age of the oldest open hole (each hole ages from its own first sighting)"
    );
    describe_gauge!(INBOX_HOLES_OPEN, "Open holes (id ranges) above W");
    describe_gauge!(
        INBOX_HOLE_MISSING_IDS,
        "Inbox ids missing in the open holes"
    );
    describe_gauge!(
        INBOX_ID_REGRESSION,
        "1 while the inbox head is below W (the inbox went backwards)"
    );
    describe_counter!(
        INBOX_ID_REGRESSIONS_TOTAL,
        "Times the inbox head fell below W"
    );
    describe_counter!(
        INBOX_HOLES_DROPPED_TOTAL,
        "Open holes dropped because the rows after them vanished from the inbox"
    );
    describe_counter!(
        INBOX_UNSEEN_BELOW_W_TOTAL,
        "Inbox rows at or below W found by the compensation scan (never discovered; enqueued LATE)"
    );
    describe_counter!(
        INBOX_ID_REUSED_TOTAL,
        "Inbox ids at or below W that now hold another row than the one processed (receive time differs)"
    );
    describe_histogram!(
        INBOX_COMPENSATION_SCAN_SECONDS,
        Unit::Seconds,
        "Duration of one compensation scan over the window behind W"
    );
    describe_counter!(
        INBOX_HOLES_RELEASED_TOTAL,
        "Holes released as permanent (max-commit-delay, or transaction evidence)"
    );
    describe_counter!(
        INBOX_HOLE_IDS_RELEASED_TOTAL,
        "Inbox ids skipped by permanent-hole releases"
    );
    describe_histogram!(
        INBOX_HOLE_FILL_SECONDS,
        Unit::Seconds,
        "Hole first seen to row visible (G7: choose max-commit-delay from it)"
    );
    describe_counter!(
        INBOX_ENQUEUED_TOTAL,
        "Inbox rows newly enqueued into PROC_STATE"
    );
    describe_counter!(
        INBOX_POLL_ERRORS_TOTAL,
        "Failed poll rounds by stage; W kept"
    );
    describe_histogram!(
        INBOX_POLL_DURATION_SECONDS,
        Unit::Seconds,
        "Duration of one poll round"
    );
    describe_counter!(
        LATE_WATCH_RECEIVED_TOTAL,
        "Released hole ids handed to the late detector"
    );
    describe_counter!(
        ACTOR_RESTARTS_TOTAL,
        "Child actors restarted by the supervisor"
    );
    describe_gauge!(
        PIPELINE_ESTIMATED_DRAIN_SECONDS,
        Unit::Seconds,
        "Unfinished messages divided by the recent processing rate (G6)"
    );
    describe_gauge!(
        INSTANCE_LEASE_HELD,
        "1 while this instance holds the single-instance lease"
    );
    describe_gauge!(
        INSTANCE_LEASE_EPOCH,
        "Fencing epoch of this instance's lease"
    );
}

/// A round committed: W, hole, lag, releases, fills.
pub fn poll_round(report: &crate::poller::PollReport) {
    let a = &report.advance;
    gauge!(INBOX_WATERMARK).set(a.w as f64);
    match report.inbox_head {
        Some(head) => {
            gauge!(INBOX_HEAD_ID).set(head as f64);
            // Negative when the inbox head is below W (id regression, or the DB owner purged
            // the newest rows): never a reassuring 0 then.
            gauge!(INBOX_LAG_IDS).set((head - a.w) as f64);
        }
        // An empty table (purged) with the next id above W: caught up.
        None if !report.regressed && report.lag == Some(Duration::ZERO) => {
            gauge!(INBOX_LAG_IDS).set(0.0);
        }
        None => {}
    }
    if let Some(lag) = report.lag {
        gauge!(INBOX_LAG_SECONDS).set(lag.as_secs_f64());
    }
    id_regression(report.regressed, a.w, report.inbox_head);
    counter!(INBOX_ENQUEUED_TOTAL).increment(report.enqueued_new);
    histogram!(INBOX_POLL_DURATION_SECONDS).record(report.duration.as_secs_f64());
    gauge!(INBOX_HOLE_OPEN).set(if a.holes.is_empty() { 0.0 } else { 1.0 });
    gauge!(INBOX_HOLES_OPEN).set(a.holes.len() as f64);
    gauge!(INBOX_HOLE_MISSING_IDS).set(a.missing_ids() as f64);
    gauge!(INBOX_HOLE_AGE_SECONDS).set(report.oldest_hole_age.map_or(0.0, |d| d.as_secs_f64()));
    if let Some(h) = a.open_hole {
        if h.age.is_zero() {
            tracing::info!(
                watermark = a.w,
                first_missing = h.first_missing,
                next_present = h.next_present,
                holes_open = a.holes.len(),
                "hole opened; waiting for a late commit"
            );
        } else {
            tracing::debug!(
                watermark = a.w,
                first_missing = h.first_missing,
                age_s = h.age.as_secs(),
                holes_open = a.holes.len(),
                "hole still open"
            );
        }
    }
    for filled in &a.fills {
        histogram!(INBOX_HOLE_FILL_SECONDS).record(filled.as_secs_f64());
        tracing::info!(
            watermark = a.w,
            fill_s = filled.as_secs_f64(),
            "hole filled"
        );
    }
    for r in &a.released {
        counter!(INBOX_HOLES_RELEASED_TOTAL).increment(1);
        counter!(INBOX_HOLE_IDS_RELEASED_TOTAL).increment(r.len() as u64);
        // Why it was released: the timer, or transaction evidence (early / at the cap).
        let decision = a
            .evidence
            .iter()
            .find(|(first, _)| *first == r.first)
            .map(|(_, d)| *d);
        let why = match decision {
            Some(crate::watermark::EvidenceDecision::ReleasedEarly) => {
                "no older transaction open (rolled back)"
            }
            Some(crate::watermark::EvidenceDecision::CapReached) => "hole evidence cap reached",
            _ => "max-commit-delay reached",
        };
        tracing::warn!(
            watermark = a.w,
            first = r.first,
            last = r.last,
            why,
            "permanent hole released; ids handed to the late detector"
        );
    }
    if report.enqueued_new > 0 {
        tracing::debug!(watermark = a.w, enqueued = report.enqueued_new, "enqueued");
    }
}

/// The inbox head is below W (or not): the gauge follows every round, the ERROR line is
/// logged when it starts.
fn id_regression(regressed: bool, w: i64, head: Option<i64>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static ACTIVE: AtomicBool = AtomicBool::new(false);
    gauge!(INBOX_ID_REGRESSION).set(if regressed { 1.0 } else { 0.0 });
    let was = ACTIVE.swap(regressed, Ordering::Relaxed);
    if regressed && !was {
        counter!(INBOX_ID_REGRESSIONS_TOTAL).increment(1);
        tracing::error!(
            alert = true,
            watermark = w,
            inbox_head = head,
            "inbox id regression: the inbox head is below W (table rotated without the \
             AUTO_INCREMENT seed, or restored?); rows reusing ids at or below W are found by \
             the compensation scan"
        );
    } else if !regressed && was {
        tracing::info!(
            watermark = w,
            inbox_head = head,
            "inbox head is above W again"
        );
    }
}

/// Stored holes no row follows any more (rows above W vanished): dropped, their ids re-aged.
pub fn holes_dropped(w: i64, dropped: &[crate::watermark::Hole]) {
    counter!(INBOX_HOLES_DROPPED_TOTAL).increment(dropped.len() as u64);
    for h in dropped {
        tracing::error!(
            alert = true,
            watermark = w,
            first = h.first,
            last = h.last,
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
        ids = ?ids,
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
        ids = ?ids,
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

/// A pump step ended.
pub fn pump_step(step: &crate::pump::StepOutcome) {
    use crate::pump::{Outcome, StepOutcome};
    match step {
        StepOutcome::Idle => gauge!(PIPELINE_HEAD_ID).set(0.0),
        StepOutcome::Waiting { msg_id, until } => {
            gauge!(PIPELINE_HEAD_ID).set(*msg_id as f64);
            tracing::debug!(msg_id, due = %until, "head FAILED and not due; the queue waits");
        }
        StepOutcome::Poisoned { msg_id, reason } => {
            gauge!(PIPELINE_HEAD_ID).set(*msg_id as f64);
            counter!(PIPELINE_PROCESSED_TOTAL, "outcome" => "dead", "class" => "EXHAUSTED")
                .increment(1);
            tracing::error!(msg_id, reason = %reason, alert = true, "poison head escalated to DEAD(EXHAUSTED)");
        }
        StepOutcome::Processed {
            msg_id,
            outcome,
            took,
            head_age,
        } => {
            gauge!(PIPELINE_HEAD_ID).set(*msg_id as f64);
            gauge!(PIPELINE_HEAD_AGE_SECONDS).set(head_age.as_secs_f64());
            histogram!(PIPELINE_PROCESSING_SECONDS).record(took.as_secs_f64());
            counter!(PIPELINE_PROCESSED_TOTAL, "outcome" => outcome.label(), "class" => outcome.class()).increment(1);
            match outcome {
                Outcome::Succeeded { changes, events } => {
                    tracing::debug!(msg_id, changes, events, "processed")
                }
                Outcome::FinishedElsewhere => {
                    tracing::info!(msg_id, "finished elsewhere before the business transaction")
                }
                Outcome::Skipped { reason, detail } => {
                    tracing::info!(msg_id, reason = reason.as_str(), detail = %detail, "skipped")
                }
                Outcome::Dead { class, detail } => {
                    tracing::warn!(msg_id, class = class.as_str(), detail = %detail, "dead on arrival")
                }
                Outcome::Failed {
                    class,
                    detail,
                    next_attempt_at,
                } => tracing::warn!(
                    msg_id, class = class.as_str(), detail = %detail, retry_at = %next_attempt_at,
                    "processing failed; the head waits for its retry"
                ),
            }
        }
    }
}

/// A pump step failed on the store; nothing was recorded.
pub fn pump_step_failed(error: &dyn std::error::Error) {
    counter!(PIPELINE_STEP_ERRORS_TOTAL).increment(1);
    tracing::error!(error = %error, "pump step failed on the store; retrying");
}

/// Backlog facts refreshed.
pub fn backlog(unfinished: i64, oldest_age: Option<Duration>) {
    gauge!(PIPELINE_UNFINISHED).set(unfinished as f64);
    gauge!(PIPELINE_OLDEST_UNPROCESSED_SECONDS).set(oldest_age.map_or(0.0, |a| a.as_secs_f64()));
}

/// One backfill sweep finished.
pub fn backfill_swept(marked: u64, already_marked: u64, transient: u64, took: Duration) {
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

/// Backlog of the backfill.
pub fn backfill_state(pending: i64, oldest_unmarked: Option<Duration>) {
    gauge!(BACKFILL_PENDING).set(pending as f64);
    gauge!(BACKFILL_OLDEST_UNMARKED_SECONDS).set(oldest_unmarked.map_or(0.0, |a| a.as_secs_f64()));
}

/// A released hole id appeared in the inbox after all.
pub fn late_detected(msg_id: i64) {
    counter!(LATE_DETECTED_TOTAL).increment(1);
    tracing::error!(
        msg_id,
        alert = true,
        "late arrival: a released hole id is in the inbox now; enqueued for compensation"
    );
}

/// Size of the watch list.
pub fn late_watch_size(open: i64) {
    gauge!(LATE_WATCH_SIZE).set(open as f64);
}

/// A late message could not apply some fields.
pub fn late_stale_fields(msg_id: i64, fields: &[&str]) {
    counter!(LATE_STALE_FIELDS_TOTAL).increment(fields.len() as u64);
    tracing::warn!(msg_id, fields = ?fields, "late message: fields set by newer messages were not overwritten");
}

/// An operator replay was applied or refused; `source`: where an applied replay's raw text is
/// (`inbox`, `raw_copy`), when checked.
pub fn replay(msg_id: i64, applied: bool, reason: &str, source: Option<&'static str>) {
    let result = if applied { "applied" } else { "refused" };
    counter!(REPLAY_TOTAL, "result" => result).increment(1);
    if let (true, Some(source)) = (applied, source) {
        raw_copy::replay_source(msg_id, source);
    }
    tracing::warn!(
        msg_id,
        result,
        reason,
        source = source.unwrap_or("-"),
        "operator replay"
    );
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

/// Released ids reached the late detector.
pub fn late_watch_received(first: i64, last: i64) {
    counter!(LATE_WATCH_RECEIVED_TOTAL).increment((last - first + 1).max(0) as u64);
    tracing::warn!(first, last, "late detector: watching released hole ids");
}

/// The estimated drain time was recomputed.
pub fn drain_estimate(e: crate::pump::drain::DrainEstimate) {
    use crate::pump::drain::DrainEstimate;
    let v = match e {
        DrainEstimate::Empty => 0.0,
        DrainEstimate::Unknown => f64::NAN,
        DrainEstimate::Stalled => f64::INFINITY,
        DrainEstimate::Seconds(s) => s,
    };
    gauge!(PIPELINE_ESTIMATED_DRAIN_SECONDS).set(v);
}

/// The lease was taken with this fencing epoch.
pub fn lease_held(epoch: i64) {
    gauge!(INSTANCE_LEASE_HELD).set(1.0);
    gauge!(INSTANCE_LEASE_EPOCH).set(epoch as f64);
}

/// The lease was lost (the process stops).
pub fn lease_lost(why: &str) {
    gauge!(INSTANCE_LEASE_HELD).set(0.0);
    tracing::error!(why, alert = true, "single-instance lease lost; stopping");
}

/// A child actor was rebuilt.
pub fn actor_restarted(child: &'static str, after: Duration) {
    counter!(ACTOR_RESTARTS_TOTAL, "child" => child).increment(1);
    tracing::error!(
        child,
        backoff_ms = after.as_millis() as u64,
        "child actor stopped unexpectedly; restarting"
    );
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// Names a dashboard or alert rule uses, without the histogram suffixes.
    fn referenced(text: &str) -> Vec<String> {
        let mut names = Vec::new();
        let bytes = text.as_bytes();
        let mut i = 0;
        while let Some(pos) = text[i..].find("msgx_") {
            let start = i + pos;
            let mut end = start;
            while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
                end += 1;
            }
            let name = &text[start..end];
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            // `msgx_bench_*` and the like are database names, not metrics.
            if !base.ends_with('_') {
                names.push(base.to_string());
            }
            i = end;
        }
        names
    }

    #[test]
    fn dashboards_and_alerts_use_only_known_metrics() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut checked = 0;
        for file in [
            "prometheus/alerts.yml",
            "grafana/dashboards/msgexchange.json",
            "docs/operations.md",
        ] {
            let text = std::fs::read_to_string(root.join(file)).expect("readable");
            for name in referenced(&text) {
                assert!(
                    ALL.contains(&name.as_str()),
                    "{file} uses unknown metric {name}"
                );
                checked += 1;
            }
        }
        assert!(checked > 10, "the files reference our metrics");
    }

    #[test]
    fn raw_copy_metrics_are_listed() {
        for name in raw_copy::NAMES {
            assert!(ALL.contains(&name), "{name} missing from ALL");
        }
    }

    #[test]
    fn every_histogram_has_buckets() {
        let with_buckets: Vec<&str> = histogram_buckets().iter().map(|(n, _)| *n).collect();
        for name in [
            INBOX_HOLE_FILL_SECONDS,
            INBOX_POLL_DURATION_SECONDS,
            PIPELINE_PROCESSING_SECONDS,
        ] {
            assert!(with_buckets.contains(&name));
        }
    }
}
