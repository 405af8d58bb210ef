//! Outbound metrics (requests into `COUTMSGS`, seed §7), each next to its log line.

use chrono::NaiveDate;
use metrics::{counter, gauge};

use super::Def;

/// Requests registered in `REQ_TRACK` (before their `COUTMSGS` insert).
pub const OUTBOUND_REGISTERED_TOTAL: &str = "msgx_outbound_registered_total";
/// Requests inserted and confirmed SENT by the normal path.
pub const OUTBOUND_SENT_TOTAL: &str = "msgx_outbound_sent_total";
/// REGISTERED leftovers completed by the reconciler, by `outcome` (`found`: the row was
/// there; `written`: the reconciler wrote it).
pub const OUTBOUND_RECONCILED_TOTAL: &str = "msgx_outbound_reconciled_total";
/// REGISTERED requests older than a minute (a crash or a failed insert left them).
pub const OUTBOUND_REGISTERED_STALE: &str = "msgx_outbound_registered_stale";
/// Failed outbound work by `stage` (`insert`: a COUTMSGS insert; `step`: any other failure of
/// a schedule requester step, e.g. the floor or the look-up unreadable, PostgreSQL down).
pub const OUTBOUND_ERRORS_TOTAL: &str = "msgx_outbound_errors_total";

/// `stage` of [`OUTBOUND_ERRORS_TOTAL`]: a COUTMSGS insert failed.
pub const OUTBOUND_STAGE_INSERT: &str = "insert";
/// `stage`: any other failure of a schedule requester step.
pub const OUTBOUND_STAGE_STEP: &str = "step";
/// Every `stage` of [`OUTBOUND_ERRORS_TOTAL`].
pub const OUTBOUND_STAGES: &[&str] = &[OUTBOUND_STAGE_INSERT, OUTBOUND_STAGE_STEP];
/// Every `outcome` of [`OUTBOUND_RECONCILED_TOTAL`].
pub const RECONCILE_OUTCOMES: &[&str] = &["found", "written"];

/// The series of this file.
pub(super) fn defs() -> Vec<Def> {
    vec![
        Def::counter(OUTBOUND_REGISTERED_TOTAL, "requests", "Outbound requests registered in REQ_TRACK"),
        Def::counter(OUTBOUND_SENT_TOTAL, "requests", "Outbound requests inserted into COUTMSGS and marked SENT"),
        Def::counter(OUTBOUND_RECONCILED_TOTAL, "requests", "REGISTERED outbound requests completed by the reconciler, by outcome (found / written)").label("outcome", RECONCILE_OUTCOMES),
        Def::gauge(OUTBOUND_REGISTERED_STALE, "requests", "Outbound requests REGISTERED for more than a minute; NaN before the first reconciler round"),
        Def::counter(OUTBOUND_ERRORS_TOTAL, "statements", "Failed outbound statements by stage (the request stays REGISTERED)").label("stage", OUTBOUND_STAGES),
    ]
}

/// A request was registered (step 1).
pub fn outbound_registered(rqid: &str, kind: &str, origin: &str, date: NaiveDate, floor: i64) {
    counter!(OUTBOUND_REGISTERED_TOTAL).increment(1);
    tracing::info!(rqid, kind, origin, %date, floor, "outbound request registered");
}

/// A request landed in the outbound table and is SENT (steps 2 and 3).
pub fn outbound_sent(rqid: &str, out_id: i64) {
    counter!(OUTBOUND_SENT_TOTAL).increment(1);
    tracing::info!(rqid, out_id, "outbound request written and SENT");
}

/// The reconciler completed a REGISTERED leftover.
pub fn outbound_reconciled(rqid: &str, floor: i64, out_id: i64, found: bool) {
    let outcome = if found { "found" } else { "written" };
    counter!(OUTBOUND_RECONCILED_TOTAL, "outcome" => outcome).increment(1);
    tracing::warn!(
        rqid,
        floor,
        out_id,
        outcome,
        "REGISTERED outbound request reconciled"
    );
}

/// REGISTERED requests older than a minute.
pub fn outbound_stale(n: i64) {
    gauge!(OUTBOUND_REGISTERED_STALE).set(n as f64);
}

/// An outbound statement failed; the request (if any) stays REGISTERED.
pub fn outbound_failed(stage: &'static str, rqid: Option<&str>, error: &dyn std::error::Error) {
    counter!(OUTBOUND_ERRORS_TOTAL, "stage" => stage).increment(1);
    tracing::error!(
        stage,
        rqid,
        error = %error,
        "outbound step failed; the request stays REGISTERED and is reconciled later"
    );
}
