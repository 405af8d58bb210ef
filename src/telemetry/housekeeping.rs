//! Retention metrics (issue 13 item 5): what the housekeeping actor archived and deleted, how
//! long its jobs take, and how big our tables are.

use std::time::Duration;

use metrics::{counter, gauge, histogram};

use super::Def;

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

/// VACUUM / ANALYZE runs of our tables by the housekeeper, by `table` and `kind`.
pub const VACUUM_RUNS_TOTAL: &str = "msgx_vacuum_runs_total";
/// Duration of one VACUUM / ANALYZE of one table.
pub const VACUUM_SECONDS: &str = "msgx_vacuum_seconds";
/// VACUUM / ANALYZE runs (or counter reads) that failed.
pub const VACUUM_ERRORS_TOTAL: &str = "msgx_vacuum_errors_total";
/// Dead tuples of one of our tables at the last check (`pg_stat_user_tables.n_dead_tup`).
pub const STORE_DEAD_TUPLES: &str = "msgx_store_dead_tuples";
/// 1 when the server's autovacuum runs, 0 when it is off.
pub const STORE_SERVER_AUTOVACUUM: &str = "msgx_store_server_autovacuum";

/// Histogram buckets (seconds).
pub(super) fn histogram_buckets() -> Vec<(&'static str, Vec<f64>)> {
    let buckets = vec![
        0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
    ];
    vec![
        (RETENTION_JOB_SECONDS, buckets.clone()),
        (VACUUM_SECONDS, buckets),
    ]
}

/// `table` of the vacuum series: the tables the housekeeper maintains (`store::MAINTAINED_TABLES`
/// is this list).
pub const VACUUM_TABLES: &[&str] = &[
    "proc_state",
    "msg_event",
    "flight_state",
    "raw_copy",
    "inbox_cursor",
    "inbox_hole",
    "inbox_unseen",
    "instance_lease",
    "late_watch",
    "late_watch_range",
    "req_track",
    "schd_snap_log",
    "audit_log",
    "proc_state_hst",
];
/// `kind` of [`VACUUM_RUNS_TOTAL`].
pub const VACUUM_KINDS: &[&str] = &["vacuum", "analyze"];

/// `table` of [`RETENTION_DELETED_TOTAL`]: every table retention deletes from.
pub const RETENTION_TABLES: &[&str] = &[
    "schd_snap_log",
    "msg_event",
    "audit_log",
    "late_watch",
    "late_watch_range",
    "raw_copy",
];
/// `table` of [`RETENTION_ERRORS_TOTAL`]: those, the archive and the size estimate.
pub const RETENTION_ERROR_TABLES: &[&str] =
    &joined::<8>(&[&["proc_state"], RETENTION_TABLES, &["pg_class"]]);
/// `table` of [`STORE_TABLE_ROWS`]: the tables whose size the housekeeping job reports (the
/// store reads exactly these).
pub const SIZED_TABLES: &[&str] =
    &joined::<8>(&[&["proc_state", "proc_state_hst"], RETENTION_TABLES]);

/// The table lists above as one array each, so the tables retention deletes from are named
/// once (a wrong `N` fails the build).
const fn joined<const N: usize>(parts: &[&[&'static str]]) -> [&'static str; N] {
    let mut out = [""; N];
    let (mut n, mut p) = (0, 0);
    while p < parts.len() {
        let mut i = 0;
        while i < parts[p].len() {
            out[n] = parts[p][i];
            n += 1;
            i += 1;
        }
        p += 1;
    }
    assert!(n == N, "the parts do not fill the array");
    out
}

/// The series of this file.
pub(super) fn defs() -> Vec<Def> {
    vec![
        Def::counter(RETENTION_ARCHIVED_TOTAL, "rows", "PROC_STATE rows moved to PROC_STATE_HST by retention"),
        Def::counter(RETENTION_DELETED_TOTAL, "rows", "Rows deleted by retention, by table").label("table", RETENTION_TABLES),
        Def::histogram(RETENTION_JOB_SECONDS, "seconds", "Duration of one housekeeping job over every table"),
        Def::counter(RETENTION_ERRORS_TOTAL, "errors", "Housekeeping table jobs that failed on the store, by table (retried at the next job)").label("table", RETENTION_ERROR_TABLES),
        Def::gauge(RETENTION_LAST_SUCCESS_TIMESTAMP, "Unix seconds", "Unix time of the last housekeeping job that finished without error; NaN before the first"),
        Def::gauge(STORE_TABLE_ROWS, "rows", "Row estimate of one of our PostgreSQL tables (pg_class.reltuples), by table; NaN before the first housekeeping job").label("table", SIZED_TABLES),
        Def::counter(VACUUM_RUNS_TOTAL, "runs", "VACUUM (ANALYZE) or ANALYZE of one of our tables run by the housekeeper (retention.vacuum), by table and kind").labels_product(&["table", "kind"], &[VACUUM_TABLES, VACUUM_KINDS]),
        Def::histogram(VACUUM_SECONDS, "seconds", "Duration of one VACUUM or ANALYZE of one of our tables"),
        Def::counter(VACUUM_ERRORS_TOTAL, "errors", "Vacuum checks or table maintenance runs that failed on the store (retried at the next check)"),
        Def::gauge(STORE_DEAD_TUPLES, "tuples", "Dead tuples of one of our tables at the last vacuum check (pg_stat_user_tables.n_dead_tup), by table; NaN before the first check").label("table", VACUUM_TABLES),
        Def::gauge(STORE_SERVER_AUTOVACUUM, "flag", "1 when the PostgreSQL server's autovacuum runs, 0 when it is off (retention.vacuum = auto then vacuums our tables itself); NaN before the first check"),
    ]
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
    let _whole = super::whole::event();
    histogram!(RETENTION_JOB_SECONDS).record(took.as_secs_f64());
    if clean {
        gauge!(RETENTION_LAST_SUCCESS_TIMESTAMP).set(at as f64);
    }
}

/// A table's row estimate.
pub fn table_rows(table: String, rows: i64) {
    gauge!(STORE_TABLE_ROWS, "table" => table).set(rows as f64);
}

/// The server's autovacuum was read at a vacuum check.
pub fn server_autovacuum(on: bool) {
    gauge!(STORE_SERVER_AUTOVACUUM).set(if on { 1.0 } else { 0.0 });
}

/// A table's dead tuples at a vacuum check.
pub fn dead_tuples(table: &str, dead: i64) {
    gauge!(STORE_DEAD_TUPLES, "table" => table.to_string()).set(dead.max(0) as f64);
}

/// The housekeeper ran `kind` (vacuum / analyze) on `table`.
pub fn vacuumed(table: &str, kind: &'static str, took: Duration) {
    counter!(VACUUM_RUNS_TOTAL, "table" => table.to_string(), "kind" => kind).increment(1);
    histogram!(VACUUM_SECONDS).record(took.as_secs_f64());
}

/// A vacuum check or one table's maintenance failed (`table`: "" when the counters could not
/// be read).
pub fn vacuum_failed(table: &str, error: &str) {
    counter!(VACUUM_ERRORS_TOTAL).increment(1);
    tracing::warn!(table, error, "vacuum failed; retried at the next check");
}
