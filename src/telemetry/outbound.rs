//! Outbound metrics (requests into `COUTMSGS`, seed §7), each next to its log line.

use chrono::NaiveDate;
use metrics::{counter, describe_counter, describe_gauge, gauge};

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

/// HELP lines.
pub fn describe() {
    describe_counter!(
        OUTBOUND_REGISTERED_TOTAL,
        "Outbound requests registered in REQ_TRACK"
    );
    describe_counter!(
        OUTBOUND_SENT_TOTAL,
        "Outbound requests inserted into COUTMSGS and marked SENT"
    );
    describe_counter!(
        OUTBOUND_RECONCILED_TOTAL,
        "REGISTERED outbound requests completed by the reconciler (found / written)"
    );
    describe_gauge!(
        OUTBOUND_REGISTERED_STALE,
        "Outbound requests REGISTERED for more than a minute"
    );
    describe_counter!(
        OUTBOUND_ERRORS_TOTAL,
        "Failed outbound statements by stage (the request stays REGISTERED)"
    );
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outbound_names_are_listed_in_all() {
        for name in [
            OUTBOUND_REGISTERED_TOTAL,
            OUTBOUND_SENT_TOTAL,
            OUTBOUND_RECONCILED_TOTAL,
            OUTBOUND_REGISTERED_STALE,
            OUTBOUND_ERRORS_TOTAL,
        ] {
            assert!(super::super::ALL.contains(&name), "{name}");
        }
    }
}
