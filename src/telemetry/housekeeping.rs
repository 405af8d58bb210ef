//! Retention metrics (issue 13 item 5): what the housekeeping actor archived and deleted, how
//! long its jobs take, and how big our tables are.

use std::time::Duration;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};

/// PROC_STATE rows moved to PROC_STATE_HST.
pub const RETENTION_ARCHIVED_TOTAL: &str = "msgx_retention_archived_total";
/// Rows deleted by retention, by `table`.
pub const RETENTION_DELETED_TOTAL: &str = "msgx_retention_deleted_total";
/// Duration of one housekeeping job (every table).
pub const RETENTION_JOB_SECONDS: &str = "msgx_retention_job_seconds";
/// Jobs (or one table's part) that failed, by `table`.
pub const RETENTION_ERRORS_TOTAL: &str = "msgx_retention_errors_total";
/// Unix time of the last job that finished without error.
pub const RETENTION_LAST_SUCCESS_TIMESTAMP: &str = "msgx_retention_last_success_timestamp_seconds";
/// Row estimate of one of our tables (`pg_class.reltuples`), by `table`.
pub const STORE_TABLE_ROWS: &str = "msgx_store_table_rows_estimate";

/// Histogram buckets (seconds).
pub(super) fn histogram_buckets() -> Vec<(&'static str, Vec<f64>)> {
    vec![(
        RETENTION_JOB_SECONDS,
        vec![
            0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
        ],
    )]
}

/// HELP lines.
pub fn describe() {
    describe_counter!(
        RETENTION_ARCHIVED_TOTAL,
        "PROC_STATE rows moved to PROC_STATE_HST by retention"
    );
    describe_counter!(
        RETENTION_DELETED_TOTAL,
        "Rows deleted by retention, by table (schd_snap_log, msg_event, audit_log, late_watch, late_watch_range)"
    );
    describe_histogram!(
        RETENTION_JOB_SECONDS,
        metrics::Unit::Seconds,
        "Duration of one housekeeping job over every table"
    );
    describe_counter!(
        RETENTION_ERRORS_TOTAL,
        "Housekeeping table jobs that failed on the store, by table"
    );
    describe_gauge!(
        RETENTION_LAST_SUCCESS_TIMESTAMP,
        "Unix time of the last housekeeping job that finished without error"
    );
    describe_gauge!(
        STORE_TABLE_ROWS,
        "Row estimate of one of our PostgreSQL tables (pg_class.reltuples), by table"
    );
}

/// One archive batch moved `rows`.
pub fn retention_archived(rows: u64) {
    counter!(RETENTION_ARCHIVED_TOTAL).increment(rows);
}

/// One delete batch of `table` removed `rows`.
pub fn retention_deleted(table: &'static str, rows: u64) {
    counter!(RETENTION_DELETED_TOTAL, "table" => table).increment(rows);
}

/// A table's part of a job failed.
pub fn retention_failed(table: &'static str, error: &str) {
    counter!(RETENTION_ERRORS_TOTAL, "table" => table).increment(1);
    tracing::warn!(
        table,
        error,
        "retention step failed; retried at the next job"
    );
}

/// A job ended after `took`; `clean` when no table failed (`at`: Unix seconds).
pub fn retention_job(took: Duration, clean: bool, at: i64) {
    histogram!(RETENTION_JOB_SECONDS).record(took.as_secs_f64());
    if clean {
        gauge!(RETENTION_LAST_SUCCESS_TIMESTAMP).set(at as f64);
    }
}

/// A table's row estimate.
pub fn table_rows(table: String, rows: i64) {
    gauge!(STORE_TABLE_ROWS, "table" => table).set(rows as f64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn housekeeping_names_are_listed_in_all() {
        for name in [
            RETENTION_ARCHIVED_TOTAL,
            RETENTION_DELETED_TOTAL,
            RETENTION_JOB_SECONDS,
            RETENTION_ERRORS_TOTAL,
            RETENTION_LAST_SUCCESS_TIMESTAMP,
            STORE_TABLE_ROWS,
        ] {
            assert!(super::super::ALL.contains(&name), "{name}");
        }
    }
}
