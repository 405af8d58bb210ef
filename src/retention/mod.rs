//! Retention of our own records (seed §8, SPEC §10, issue 13 item 5): one housekeeping job
//! walks its task list — archive PROC_STATE to PROC_STATE_HST, then delete the expired rows of
//! each table — one bounded batch per [`Job::step`], each batch its own transaction. The
//! housekeeping actor runs one step per message with a pause between them, so a job of any
//! size never holds the store for long and a shutdown waits for one batch at most.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::settings::RetentionSettings;
use crate::store::retention::{ArchiveCut, Expiring};
use crate::store::{Store, StoreError};
use crate::telemetry;

pub mod vacuum;
pub use vacuum::{vacuum_step, VacuumPolicy, VacuumReport};

/// The retention periods and the job's pace (`[retention]`).
#[derive(Debug, Clone)]
pub struct RetentionConfig {
    /// `retention.proc_state`.
    pub proc_state: Duration,
    /// `retention.abandoned_grace`.
    pub abandoned_grace: Duration,
    /// `retention.schd_snap_log`.
    pub schd_snap_log: Duration,
    /// `retention.msg_event_sent`.
    pub msg_event_sent: Duration,
    /// `retention.audit_log`.
    pub audit_log: Duration,
    /// `retention.late_watch` (detected arrivals and closed watch ranges).
    pub late_watch: Duration,
    /// `retention.replay_window` (our raw-text copies).
    pub replay_window: Duration,
    /// Rows per batch.
    pub batch: i64,
    /// Batches per task and job.
    pub max_batches: u32,
    /// Pause between two batches.
    pub batch_pause: Duration,
}

impl RetentionConfig {
    /// From the (validated) settings.
    pub fn from_settings(s: &RetentionSettings) -> Self {
        Self {
            proc_state: s.proc_state,
            abandoned_grace: s.abandoned_grace,
            schd_snap_log: s.schd_snap_log,
            msg_event_sent: s.msg_event_sent,
            audit_log: s.audit_log,
            late_watch: s.late_watch,
            replay_window: s.replay_window,
            batch: i64::from(s.batch),
            max_batches: s.max_batches,
            batch_pause: s.batch_pause,
        }
    }

    fn keep(&self, table: Expiring) -> Duration {
        match table {
            Expiring::SchdSnapLog => self.schd_snap_log,
            Expiring::MsgEventSent => self.msg_event_sent,
            Expiring::AuditLog => self.audit_log,
            Expiring::LateWatch | Expiring::LateWatchRange => self.late_watch,
        }
    }
}

/// One entry of the job list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    /// PROC_STATE → PROC_STATE_HST.
    Archive,
    /// Delete the expired rows of a table.
    Expire(Expiring),
    /// Delete our raw-text copies older than `retention.replay_window` (never the copy of a
    /// message waiting for the pump again).
    RawCopies,
    /// Table size estimates for the gauges (one statement, last).
    Sizes,
}

/// The job list, in order. A row with events or a schedule snapshot left is not archived, so
/// those expire first: their rows move in the same job.
pub const TASKS: [Task; 8] = [
    Task::Expire(Expiring::MsgEventSent),
    Task::Expire(Expiring::SchdSnapLog),
    Task::Archive,
    Task::Expire(Expiring::AuditLog),
    Task::Expire(Expiring::LateWatch),
    Task::Expire(Expiring::LateWatchRange),
    Task::RawCopies,
    Task::Sizes,
];

/// What a job did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobReport {
    /// PROC_STATE rows archived.
    pub archived: u64,
    /// Rows deleted, by table.
    pub deleted: BTreeMap<&'static str, u64>,
    /// Batches run (every task).
    pub batches: u32,
    /// Tasks that failed, with the error (the rest of the job ran).
    pub errors: Vec<(&'static str, String)>,
    /// Row estimates of our tables after the job.
    pub sizes: Vec<(String, i64)>,
    /// Wall time of the job (pauses included).
    pub took: Duration,
}

/// A job in progress: the cut-offs are fixed at its start.
#[derive(Debug, Clone)]
pub struct Job {
    /// The job's "now" (injected clock): every cut-off is measured from it.
    pub now: DateTime<Utc>,
    started: Instant,
    task: usize,
    /// The archive's keyset position (the last msg_id moved).
    after: i64,
    /// Batches of the current task.
    batches: u32,
    /// The report so far.
    pub report: JobReport,
}

fn before(now: DateTime<Utc>, keep: Duration) -> DateTime<Utc> {
    // Settings bound every duration to 10 years, so this never saturates in practice.
    chrono::Duration::from_std(keep)
        .ok()
        .and_then(|d| now.checked_sub_signed(d))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// The table of our raw-text copies (`store::raw_copy`).
const RAW_COPY_TABLE: &str = "raw_copy";

fn table_of(task: Task) -> &'static str {
    match task {
        Task::Archive => "proc_state",
        Task::Expire(t) => t.table(),
        Task::RawCopies => RAW_COPY_TABLE,
        Task::Sizes => "pg_class",
    }
}

impl Job {
    /// A job starting at `now`.
    pub fn new(now: DateTime<Utc>) -> Self {
        Self {
            now,
            started: Instant::now(),
            task: 0,
            after: 0,
            batches: 0,
            report: JobReport::default(),
        }
    }

    /// The task the next step runs (None: the job is done).
    pub fn current(&self) -> Option<Task> {
        TASKS.get(self.task).copied()
    }

    fn next_task(&mut self) {
        self.task += 1;
        self.after = 0;
        self.batches = 0;
    }

    /// Runs one batch of the current task (`now` stamps `archived_at`); true while the job
    /// has more to do. A failing task is reported and skipped: the next job retries it.
    pub async fn step(&mut self, store: &Store, cfg: &RetentionConfig, now: DateTime<Utc>) -> bool {
        let Some(task) = self.current() else {
            return false;
        };
        let result = self.run_batch(task, store, cfg, now).await;
        self.report.batches += 1;
        self.batches += 1;
        match result {
            // A full batch: more may be left, unless the task used up its batches.
            Ok(n) if task != Task::Sizes && n >= cfg.batch as u64 => {
                if self.batches >= cfg.max_batches {
                    tracing::info!(
                        table = table_of(task),
                        batches = self.batches,
                        "retention: max_batches reached; the rest waits for the next job"
                    );
                    self.next_task();
                }
            }
            Ok(_) => self.next_task(),
            Err(e) => {
                telemetry::retention_failed(table_of(task), &e.to_string());
                self.report.errors.push((table_of(task), e.to_string()));
                self.next_task();
            }
        }
        if self.current().is_none() {
            self.finish();
            return false;
        }
        true
    }

    /// One batch of `task`, counted in the report and the metrics; how many rows it moved or
    /// deleted (0 for [`Task::Sizes`]).
    async fn run_batch(
        &mut self,
        task: Task,
        store: &Store,
        cfg: &RetentionConfig,
        now: DateTime<Utc>,
    ) -> Result<u64, StoreError> {
        match task {
            Task::Archive => {
                let cut = ArchiveCut {
                    terminal_before: before(self.now, cfg.proc_state),
                    abandoned_before: before(self.now, cfg.abandoned_grace),
                };
                store
                    .archive_batch(cut, self.after, cfg.batch, now)
                    .await
                    .map(|b| {
                        self.report.archived += b.moved;
                        telemetry::retention_archived(b.moved);
                        if let Some(last) = b.last {
                            self.after = last;
                        }
                        b.moved
                    })
            }
            Task::Expire(table) => store
                .expire_batch(table, before(self.now, cfg.keep(table)), cfg.batch)
                .await
                .inspect(|n| {
                    *self.report.deleted.entry(table.table()).or_default() += n;
                    telemetry::retention_deleted(table.table(), *n);
                }),
            Task::RawCopies => crate::store::purge_expired_raw_copies(
                store.pool(),
                before(self.now, cfg.replay_window),
                cfg.batch,
            )
            .await
            .inspect(|n| {
                *self.report.deleted.entry(RAW_COPY_TABLE).or_default() += n;
                telemetry::retention_deleted(RAW_COPY_TABLE, *n);
            }),
            Task::Sizes => store.table_estimates().await.map(|sizes| {
                for (t, n) in &sizes {
                    telemetry::table_rows(t.clone(), *n);
                }
                self.report.sizes = sizes;
                0
            }),
        }
    }

    /// Stamps the job's duration and reports it (metrics and the log).
    fn finish(&mut self) {
        self.report.took = self.started.elapsed();
        telemetry::retention_job(
            self.report.took,
            self.report.errors.is_empty(),
            self.now.timestamp(),
        );
        tracing::info!(
            archived = self.report.archived,
            deleted = ?self.report.deleted,
            batches = self.report.batches,
            errors = self.report.errors.len(),
            took_ms = self.report.took.as_millis() as u64,
            "retention job finished"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `table` label the job emits is registered at start-up (telemetry cannot import
    /// the store's lists: it is a leaf).
    #[test]
    fn retention_tables_are_registered_label_values() {
        for task in TASKS {
            assert!(
                telemetry::RETENTION_ERROR_TABLES.contains(&table_of(task)),
                "{task:?}"
            );
            if let Task::Expire(t) = task {
                assert!(telemetry::RETENTION_TABLES.contains(&t.table()), "{t:?}");
            }
            if task == Task::RawCopies {
                assert!(telemetry::RETENTION_TABLES.contains(&RAW_COPY_TABLE));
            }
        }
        assert_eq!(
            crate::store::retention::SIZED_TABLES.as_slice(),
            telemetry::SIZED_TABLES
        );
    }
}
