//! Late-arrival metrics (released hole ids that appear after all), each next to its log line.

use metrics::{counter, gauge};

use super::Def;

/// Ids reported to the late detector (stage-0 receiver counts them).
pub const LATE_WATCH_RECEIVED_TOTAL: &str = "msgx_late_watch_ids_received_total";
/// Released hole ids still watched.
pub const LATE_WATCH_SIZE: &str = "msgx_late_watch_size";
/// Released hole ids that later appeared in the inbox.
pub const LATE_DETECTED_TOTAL: &str = "msgx_pipeline_late_arrival_detected_total";
/// Fields a late message could not apply (a newer message had set them).
pub const LATE_STALE_FIELDS_TOTAL: &str = "msgx_pipeline_late_arrival_stale_fields_total";

/// The series of this file.
pub(super) fn defs() -> Vec<Def> {
    vec![
        Def::counter(LATE_WATCH_RECEIVED_TOTAL, "ids", "Released hole ids handed to the late detector"),
        Def::gauge(LATE_WATCH_SIZE, "ids", "Released hole ids still watched for a late arrival; NaN before the first detector round"),
        Def::counter(LATE_DETECTED_TOTAL, "rows", "Released hole ids that later appeared in the inbox (late arrivals, enqueued for compensation)"),
        Def::counter(LATE_STALE_FIELDS_TOTAL, "fields", "Fields a late message could not apply (a newer message had set them)"),
    ]
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

/// Released ids reached the late detector.
pub fn late_watch_received(first: i64, last: i64) {
    counter!(LATE_WATCH_RECEIVED_TOTAL).increment((last - first + 1).max(0) as u64);
    tracing::warn!(first, last, "late detector: watching released hole ids");
}
