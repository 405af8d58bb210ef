//! One backfill sweep over the adapters (the actor only decides when to run the next).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::rules::{
    after_failure, classify, overdue_before, AfterFailure, BackfillRules, MissingKind,
};
use crate::clock::Clock;
use crate::inbox::mark::MarkSql;
use crate::inbox::names::InboxNames;
use crate::inbox::Inbox;
use crate::settings::BackfillSettings;
use crate::store::backfill::{AbandonReason, BackfillRow, SweepWrite};
use crate::store::{Store, StoreError};
use crate::telemetry;

/// Extra UPDATE statements one sweep may spend isolating rows whose mark fails with a
/// statement-level error (a trigger, a lock wait): the failing group is split in halves until
/// the failing rows stand alone, so one bad row does not fail its whole batch.
pub const ISOLATION_BUDGET: u32 = 64;

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
    /// Transient failures backed off: the row and its next try.
    pub backed_off: Vec<(i64, DateTime<Utc>)>,
    /// Transient failures that reached `max_attempts`: abandoned `MAX_ATTEMPTS`.
    pub abandoned: Vec<i64>,
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
///    statement-level error hits it, within [`ISOLATION_BUDGET`]);
/// 4. write the outcomes and commit — the row locks are held from 1 to 4, so a replay or a
///    poison escalation on these rows waits (lifecycle gate, G5):
///    - marked, or already marked → `BACKFILL_AT` (never overwrite);
///    - no inbox row → abandon `MISSING_ROW` at once, alert with its kind;
///    - timeout / connection / statement failure → `attempts + 1`, next try after backoff
///      (`BACKFILL_ERROR`), or abandon `MAX_ATTEMPTS` at `max_attempts`, alert;
/// 5. report to telemetry (the backlog gauges come from `crate::backlog`, refreshed by the
///    pump with every other backlog).
///
/// An inbox failure is never "missing" and never fails the sweep: it is recorded on the rows.
/// A PostgreSQL failure rolls the sweep back and is returned (marks written in the inbox
/// meanwhile are found "already marked" by the next sweep).
pub async fn sweep_once(
    inbox: &Inbox,
    store: &Store,
    clock: &dyn Clock,
    cfg: &SweepConfig,
) -> Result<SweepReport, StoreError> {
    let started = Instant::now();
    let now = clock.now();
    let sweep = store
        .begin_sweep(now, overdue_before(now, cfg.rules.overdue_after), cfg.batch)
        .await?;
    let rows = sweep.rows().to_vec();
    let mut report = SweepReport {
        selected: rows.len(),
        marked: 0,
        already_marked: 0,
        confirmed: Vec::new(),
        already: Vec::new(),
        missing: Vec::new(),
        backed_off: Vec::new(),
        abandoned: Vec::new(),
        transient_error: None,
        isolation_statements: 0,
        took: Duration::ZERO,
    };
    let mut write = SweepWrite::default();
    if !rows.is_empty() {
        let failed = mark_batch(inbox, cfg, &rows, now, &mut report, &mut write).await;
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
    sweep.finish(&write, now).await?;

    // Committed: now tell the world.
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
    report.took = started.elapsed();
    telemetry::backfill_swept(
        report.marked,
        report.already_marked,
        report.transient() as u64,
        report.took,
    );
    Ok(report)
}

/// Steps 2 and 3 for the locked batch: fills `report` and `write` with confirmed and missing
/// rows; returns the rows that failed transiently, with the error.
async fn mark_batch(
    inbox: &Inbox,
    cfg: &SweepConfig,
    rows: &[BackfillRow],
    now: DateTime<Utc>,
    report: &mut SweepReport,
    write: &mut SweepWrite,
) -> Vec<(i64, String)> {
    let ids: Vec<i64> = rows.iter().map(|r| r.msg_id).collect();
    let found = match inbox.mark_states(&cfg.marks, &ids).await {
        Ok(found) => found,
        Err(e) => {
            let error = format!("existence check: {e}");
            return ids.into_iter().map(|id| (id, error.clone())).collect();
        }
    };
    let checked = classify(&ids, found);
    for (id, value) in &checked.already {
        if value.trim() != cfg.mark_value {
            tracing::info!(
                msg_id = id,
                found = %value,
                "backfill: inbox row carries another mark; kept as is"
            );
        }
        report.already_marked += 1;
        report.confirmed.push(*id);
        write.confirmed.push(*id);
    }
    report.already = checked.already;
    missing(rows, &checked.missing, report, write);

    let mut failed = Vec::new();
    let mut short = Vec::new();
    let mut groups = vec![checked.to_mark];
    let mut budget = cfg.isolation_budget;
    let mut unreachable: Option<String> = None;
    while let Some(group) = groups.pop() {
        if group.is_empty() {
            continue;
        }
        if let Some(error) = &unreachable {
            failed.extend(group.into_iter().map(|id| (id, error.clone())));
            continue;
        }
        match inbox
            .write_marks(&cfg.marks, &group, &cfg.mark_value, now)
            .await
        {
            Ok(n) if n as usize == group.len() => {
                // Seed §4 "marking mid-way": the inbox has the marks, PostgreSQL not yet.
                crate::failpoint::hit("backfill_after_inbox_mark");
                report.marked += n;
                report.confirmed.extend_from_slice(&group);
                write.confirmed.extend_from_slice(&group);
            }
            Ok(n) => {
                report.marked += n;
                short.push((group, n));
            }
            Err(e) if !e.is_connection_level() && group.len() > 1 && budget >= 2 => {
                budget -= 2;
                report.isolation_statements += 2;
                let (a, b) = group.split_at(group.len() / 2);
                groups.push(b.to_vec());
                groups.push(a.to_vec());
            }
            Err(e) => {
                let error = format!("mark: {e}");
                if e.is_connection_level() {
                    unreachable = Some(error.clone());
                }
                failed.extend(group.into_iter().map(|id| (id, error.clone())));
            }
        }
    }
    for (group, written) in short {
        recheck(inbox, cfg, rows, group, written, report, write, &mut failed).await;
    }
    failed
}

/// Rows with no inbox row: abandon `MISSING_ROW` at once.
fn missing(rows: &[BackfillRow], ids: &[i64], report: &mut SweepReport, write: &mut SweepWrite) {
    if ids.is_empty() {
        return;
    }
    let by_id: HashMap<i64, &BackfillRow> = rows.iter().map(|r| (r.msg_id, r)).collect();
    for &id in ids {
        let kind = by_id.get(&id).map_or(MissingKind::NeverSeen, |r| {
            MissingKind::of(&r.source, &r.state)
        });
        report.missing.push((id, kind));
        write
            .abandoned
            .push((id, AbandonReason::MissingRow, kind.detail().to_string()));
    }
}

/// A group whose UPDATE wrote fewer rows than asked (marked or purged by someone else between
/// the check and the write): one more existence check settles each row.
#[allow(clippy::too_many_arguments)]
async fn recheck(
    inbox: &Inbox,
    cfg: &SweepConfig,
    rows: &[BackfillRow],
    group: Vec<i64>,
    written: u64,
    report: &mut SweepReport,
    write: &mut SweepWrite,
    failed: &mut Vec<(i64, String)>,
) {
    let found = match inbox.mark_states(&cfg.marks, &group).await {
        Ok(found) => found,
        Err(e) => {
            let error = format!("existence re-check: {e}");
            failed.extend(group.into_iter().map(|id| (id, error.clone())));
            return;
        }
    };
    let checked = classify(&group, found);
    // The UPDATE wrote `written` of them; the others were marked by somebody else.
    let now_marked = checked.already.len() as u64;
    report.already_marked += now_marked.saturating_sub(written);
    for (id, _) in &checked.already {
        report.confirmed.push(*id);
        write.confirmed.push(*id);
    }
    missing(rows, &checked.missing, report, write);
    failed.extend(
        checked
            .to_mark
            .into_iter()
            .map(|id| (id, "mark: UPDATE left the mark empty".to_string())),
    );
}
