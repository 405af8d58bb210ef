//! One backfill sweep over the adapters (the actor only decides when to run the next): the
//! PostgreSQL transaction that locks the due rows, the outcomes written back and announced.
//! The inbox part of it (existence check and marks under the locks) is `sweep/pass.rs`.

mod pass;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::rules::{
    after_failure, after_lock, overdue_before, AfterFailure, BackfillRules, MissingKind,
};
use crate::clock::Clock;
use crate::inbox::mark::MarkSql;
use crate::inbox::mark_lock::LockAvoidance;
use crate::inbox::names::InboxNames;
use crate::inbox::Inbox;
use crate::rows::AbandonReason;
use crate::settings::BackfillSettings;
use crate::store::backfill::{BackfillRow, LockedRows, SweepWrite};
use crate::store::{Store, StoreError};
use crate::telemetry;
use crate::telemetry::ids::IdSummary;
use pass::Pass;

/// Extra UPDATE statements one sweep may spend isolating rows whose mark fails with a
/// statement-level error (a trigger, a lock wait): the failing group is split in halves until
/// the failing rows stand alone, so one bad row does not fail its whole batch.
pub const ISOLATION_BUDGET: u32 = 64;

/// How long the inbox COMMIT of a group's marks may take. It is sent right after a PostgreSQL
/// statement of the sweep's transaction (which restarts the server's idle timer), and the
/// settings keep `store.idle_in_transaction_timeout` at least this much above
/// `backfill.mark_budget` ([`crate::settings::MARK_MARGIN`]).
pub const MARK_COMMIT_LIMIT: Duration = crate::settings::MARK_MARGIN;

/// Everything a sweep needs besides the adapters.
#[derive(Debug, Clone)]
pub struct SweepConfig {
    /// Rows per sweep (`backfill.batch`).
    pub batch: u32,
    /// The DB owner's value for the status column (`backfill.mark_value`).
    pub mark_value: String,
    /// Backoff, give-up and R.
    pub rules: BackfillRules,
    /// The inbox statements.
    pub marks: MarkSql,
    /// See [`ISOLATION_BUDGET`].
    pub isolation_budget: u32,
    /// Wall time the inbox part of one sweep (existence check, marks) may take while the
    /// sweep holds its PostgreSQL row locks (`backfill.mark_budget`).
    pub budget: Duration,
    /// How the marks keep off rows another inbox session holds (`backfill.skip_locked`,
    /// `backfill.lock_wait`).
    pub avoid: LockAvoidance,
    /// A row held by another session longer than this is reported at ERROR with an alert
    /// (`backfill.locked_alert_after`).
    pub locked_alert_after: Duration,
}

impl SweepConfig {
    /// From `backfill.*` and the inbox names.
    pub fn new(settings: &BackfillSettings, names: &InboxNames) -> Self {
        Self {
            batch: settings.batch,
            mark_value: settings.mark_value.trim().to_string(),
            rules: BackfillRules {
                retry_initial: settings.retry_initial,
                retry_max: settings.retry_max,
                max_attempts: settings.max_attempts,
                overdue_after: settings.overdue_after,
            },
            marks: MarkSql::new(names),
            isolation_budget: ISOLATION_BUDGET,
            budget: settings.mark_budget,
            avoid: LockAvoidance {
                skip_locked: settings.skip_locked,
                lock_wait: settings.lock_wait,
            },
            locked_alert_after: settings.locked_alert_after,
        }
    }
}

/// What one sweep did (already committed and reported to telemetry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepReport {
    /// Rows the sweep locked.
    pub selected: usize,
    /// Rows our UPDATE marked.
    pub marked: u64,
    /// Rows found marked already (never overwritten).
    pub already_marked: u64,
    /// Every confirmed row (`BACKFILL_AT` set): marked now or already.
    pub confirmed: Vec<i64>,
    /// Rows the existence check found marked, with the value found.
    pub already: Vec<(i64, String)>,
    /// Rows whose inbox row is gone: abandoned `MISSING_ROW` at once.
    pub missing: Vec<(i64, MissingKind)>,
    /// Rows whose inbox row is gone after a mark we confirmed before a replay reopened them
    /// (the owner purged them marked): confirmed, counted in `already_marked`.
    pub gone_after_mark: Vec<i64>,
    /// Transient failures backed off: the row and its next try.
    pub backed_off: Vec<(i64, DateTime<Utc>)>,
    /// Transient failures that reached `max_attempts`: abandoned `MAX_ATTEMPTS`.
    pub abandoned: Vec<i64>,
    /// Rows left untouched for the next sweep: the budget ran out before they were marked.
    pub deferred: Vec<i64>,
    /// Rows another inbox session (the DB owner) held: not written, NOT charged an attempt,
    /// tried again later (the row and its next try).
    pub locked: Vec<(i64, DateTime<Utc>)>,
    /// Rows held by another session in this sweep or an earlier one that are still unmarked
    /// (after this sweep), and since when the oldest of them has been held.
    pub locked_now: LockedRows,
    /// The last transient error seen.
    pub transient_error: Option<String>,
    /// UPDATE statements spent isolating failing rows.
    pub isolation_statements: u32,
    /// Wall time of the sweep.
    pub took: Duration,
}

impl SweepReport {
    /// Rows with a transient failure (backed off or abandoned for it).
    pub fn transient(&self) -> usize {
        self.backed_off.len() + self.abandoned.len()
    }
}

/// One sweep (SPEC §5, seed §5.2):
///
/// 1. open a PostgreSQL transaction and lock up to `batch` due rows `FOR UPDATE SKIP LOCKED`
///    (terminal ∧ unconfirmed ∧ not abandoned ∧ (no intent time ∨ due ∨ received — else
///    enqueued — before now − R)), fair order `backfill_attempts, msg_id`;
/// 2. ONE existence check on the inbox for the batch;
/// 3. ONE conditional UPDATE writing the mark where it is empty (split in halves only when a
///    statement-level error hits it, within [`ISOLATION_BUDGET`]), in an inbox transaction
///    that is committed only after PostgreSQL confirmed, in the sweep's transaction, that the
///    rows are still locked terminal and unmarked — a mark is never written without the lock
///    that guards it (G5);
/// 4. write the outcomes and commit — the row locks are held from 1 to 4, so a replay or a
///    poison escalation on these rows waits (lifecycle gate, G5):
///    - marked, or already marked → `BACKFILL_AT` (never overwrite);
///    - no inbox row → abandon `MISSING_ROW` at once, alert with its kind;
///    - timeout / connection / statement failure → `attempts + 1`, next try after backoff
///      (`BACKFILL_ERROR`), or abandon `MAX_ATTEMPTS` at `max_attempts`, alert;
///    - not tried because the budget ran out → nothing: the next sweep takes them;
/// 5. report to telemetry (the backlog gauges come from `crate::backlog`, refreshed by the
///    pump with every other backlog).
///
/// Steps 2 and 3 together take at most `backfill.mark_budget` (every inbox statement gets
/// what is left of it as its timeout), which the settings hold below
/// `store.idle_in_transaction_timeout`: PostgreSQL never ends the sweep's transaction for
/// idleness while it marks.
///
/// An inbox failure is never "missing" and never fails the sweep: it is recorded on the rows.
/// A PostgreSQL failure rolls the sweep back and is returned (marks committed in the inbox
/// meanwhile were committed under the lock, and are found "already marked" by the next sweep).
pub async fn sweep_once(
    inbox: &Inbox,
    store: &Store,
    clock: &dyn Clock,
    cfg: &SweepConfig,
) -> Result<SweepReport, StoreError> {
    let started = Instant::now();
    let now = clock.now();
    let mut sweep = store
        .begin_sweep(now, overdue_before(now, cfg.rules.overdue_after), cfg.batch)
        .await?;
    // Wall time, not the injected clock: the budget races PostgreSQL's idle timer.
    let deadline = Instant::now() + cfg.budget;
    let rows = sweep.rows().to_vec();
    let mut report = SweepReport {
        selected: rows.len(),
        marked: 0,
        already_marked: 0,
        confirmed: Vec::new(),
        already: Vec::new(),
        missing: Vec::new(),
        gone_after_mark: Vec::new(),
        backed_off: Vec::new(),
        abandoned: Vec::new(),
        deferred: Vec::new(),
        locked: Vec::new(),
        locked_now: LockedRows::default(),
        transient_error: None,
        isolation_statements: 0,
        took: Duration::ZERO,
    };
    let mut write = SweepWrite::default();
    if !rows.is_empty() {
        let mut pass = Pass {
            inbox,
            sweep: &mut sweep,
            cfg,
            rows: &rows,
            now,
            deadline,
            report: &mut report,
            write: &mut write,
            failed: Vec::new(),
            held: Vec::new(),
            skipping: cfg.avoid.skip_locked && inbox.skip_locked_supported().await,
        };
        pass.run().await?;
        let failed = std::mem::take(&mut pass.failed);
        let held = std::mem::take(&mut pass.held);
        record_failures(cfg, &rows, failed, now, &mut report, &mut write);
        record_locked(cfg, &rows, held, now, &mut report, &mut write);
    }
    report.locked_now = sweep.finish(&write, now).await?;
    report.took = started.elapsed();
    announce(cfg, &report, &write, now);
    Ok(report)
}

/// Transient failures: back off, or abandon `MAX_ATTEMPTS` at `max_attempts`.
fn record_failures(
    cfg: &SweepConfig,
    rows: &[BackfillRow],
    failed: Vec<(i64, String)>,
    now: DateTime<Utc>,
    report: &mut SweepReport,
    write: &mut SweepWrite,
) {
    let attempts: HashMap<i64, i32> = rows
        .iter()
        .map(|r| (r.msg_id, r.backfill_attempts))
        .collect();
    for (msg_id, error) in failed {
        let Some(&before) = attempts.get(&msg_id) else {
            continue;
        };
        match after_failure(before, now, &cfg.rules) {
            AfterFailure::RetryAt(at) => {
                report.backed_off.push((msg_id, at));
                write.backed_off.push((msg_id, at, error.clone()));
            }
            AfterFailure::Abandon => {
                report.abandoned.push(msg_id);
                write
                    .abandoned
                    .push((msg_id, AbandonReason::MaxAttempts, error.clone()));
            }
        }
        report.transient_error = Some(error);
    }
}

/// Rows another session held: retried after a delay that grows with how long the row has been
/// held (`after_lock`), never charged an attempt.
fn record_locked(
    cfg: &SweepConfig,
    rows: &[BackfillRow],
    held: Vec<i64>,
    now: DateTime<Utc>,
    report: &mut SweepReport,
    write: &mut SweepWrite,
) {
    let since: HashMap<i64, Option<DateTime<Utc>>> =
        rows.iter().map(|r| (r.msg_id, r.locked_since)).collect();
    for msg_id in held {
        let Some(&since) = since.get(&msg_id) else {
            continue;
        };
        let at = after_lock(since.unwrap_or(now), now, &cfg.rules);
        report.locked.push((msg_id, at));
        write.locked.push((msg_id, at, LOCKED_ERROR.to_string()));
    }
}

/// `BACKFILL_ERROR` of a row another session held.
pub const LOCKED_ERROR: &str =
    "locked: another inbox session (the DB owner) holds the row; not charged, retried later";

/// Committed: now tell the world.
fn announce(cfg: &SweepConfig, report: &SweepReport, write: &SweepWrite, now: DateTime<Utc>) {
    for (msg_id, kind) in &report.missing {
        telemetry::backfill_abandoned(
            *msg_id,
            AbandonReason::MissingRow.as_str(),
            kind.as_str(),
            kind.detail(),
        );
    }
    for (msg_id, _, error) in write
        .abandoned
        .iter()
        .filter(|a| a.1 == AbandonReason::MaxAttempts)
    {
        let detail = format!(
            "{} transient failures (backfill.max_attempts); last: {error}",
            cfg.rules.max_attempts
        );
        telemetry::backfill_abandoned(
            *msg_id,
            AbandonReason::MaxAttempts.as_str(),
            telemetry::KIND_TRANSIENT,
            &detail,
        );
    }
    if let Some(error) = &report.transient_error {
        tracing::warn!(
            rows = report.transient(),
            error = %error,
            "backfill: inbox marks failed transiently; backing off"
        );
    }
    if !report.deferred.is_empty() {
        tracing::warn!(
            rows = %IdSummary(&report.deferred),
            budget_ms = cfg.budget.as_millis() as u64,
            "backfill: the sweep's inbox budget (backfill.mark_budget) ran out; \
             the rows left are taken by the next sweep"
        );
    }
    telemetry::backfill_locked(
        &report.locked,
        report.locked_now.rows,
        report.locked_now.oldest_age(now),
        cfg.locked_alert_after,
    );
    telemetry::backfill_swept(
        report.marked,
        report.already_marked,
        report.transient() as u64,
        report.took,
    );
}

/// The sweep runs on spawned tasks (tests, tools): its future must stay `Send` for any
/// lifetime of its arguments (a compile-time check).
#[cfg(test)]
#[allow(dead_code)]
fn sweep_future_is_send(
    inbox: Inbox,
    store: Store,
    clock: std::sync::Arc<dyn Clock>,
    cfg: SweepConfig,
) {
    fn is_send<T: Send + 'static>(_: T) {}
    is_send(async move { sweep_once(&inbox, &store, clock.as_ref(), &cfg).await });
}
