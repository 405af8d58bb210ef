//! Steps 2 and 3 of a sweep ([`sweep_once`](super::sweep_once)): the inbox pass over one
//! locked batch — the existence check, the marks group by group (isolating failing rows within
//! the budget), the G5 lock re-check before each inbox COMMIT, and the re-check of a group that
//! wrote fewer rows than asked. Separate from the sweep's frame (`sweep.rs`: the PostgreSQL
//! transaction, the outcomes and their telemetry) because this is the part that talks to the
//! inbox while the locks are held.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::{SweepConfig, SweepReport, MARK_COMMIT_LIMIT};
use crate::backfill::rules::{classify, Checked, MissingKind};
use crate::inbox::{Inbox, InboxError};
use crate::rows::AbandonReason;
use crate::store::backfill::{BackfillRow, SweepTx, SweepWrite};
use crate::store::StoreError;
use crate::telemetry::ids::IdSummary;

/// Steps 2 and 3 for one locked batch, within the sweep's budget: fills the report and the
/// write with confirmed and missing rows, and `failed` with the rows that failed transiently.
pub(super) struct Pass<'a> {
    pub(super) inbox: &'a Inbox,
    pub(super) sweep: &'a mut SweepTx,
    pub(super) cfg: &'a SweepConfig,
    pub(super) rows: &'a [BackfillRow],
    pub(super) now: DateTime<Utc>,
    pub(super) deadline: Instant,
    pub(super) report: &'a mut SweepReport,
    pub(super) write: &'a mut SweepWrite,
    pub(super) failed: Vec<(i64, String)>,
    /// Rows another inbox session held (not written, not charged).
    pub(super) held: Vec<i64>,
    /// The marks skip held rows (`SKIP LOCKED`); else they wait at most `lock_wait`.
    pub(super) skipping: bool,
}

/// How one group's mark ended.
enum Marked {
    /// Committed: this many rows written, of the group less the rows another session held
    /// (skipped, listed here).
    Written(u64, Vec<i64>),
    /// Failed before or at the commit (nothing written, or not known): the error.
    Failed(InboxError),
    /// Not written because the rows are no longer the sweep's (a bug guard): nothing written.
    NotHeld,
}

impl Pass<'_> {
    /// What is left of the budget.
    fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// No budget left for another mark: spent, or (without `SKIP LOCKED`) less than one lock
    /// wait — a mark started now could outlast the budget on a held row, and that timeout
    /// would look like a broken connection.
    fn out_of_budget(&self) -> bool {
        let rest = self.remaining();
        rest.is_zero() || (!self.skipping && rest <= self.cfg.avoid.lock_wait)
    }

    /// Which of `ids` exist and how they are marked, within what is left of the budget. When
    /// the inbox does not answer, each of them failed (`what: error`) and None comes back.
    async fn check(&mut self, ids: &[i64], what: &str) -> Option<Checked> {
        match self
            .inbox
            .mark_states_within(&self.cfg.marks, ids, self.remaining())
            .await
        {
            Ok(found) => Some(classify(ids, found)),
            Err(e) => {
                let error = format!("{what}: {e}");
                self.failed
                    .extend(ids.iter().map(|id| (*id, error.clone())));
                None
            }
        }
    }

    /// The existence check, then the marks group by group. `Err` only for PostgreSQL.
    pub(super) async fn run(&mut self) -> Result<(), StoreError> {
        let ids: Vec<i64> = self.rows.iter().map(|r| r.msg_id).collect();
        let Some(checked) = self.check(&ids, "existence check").await else {
            return Ok(());
        };
        for (id, value) in &checked.already {
            if value.trim() != self.cfg.mark_value {
                tracing::info!(
                    msg_id = id,
                    found = %value,
                    "backfill: inbox row carries another mark; kept as is"
                );
            }
            self.report.already_marked += 1;
            self.confirmed(*id);
        }
        self.report.already = checked.already;
        missing(self.rows, &checked.missing, self.report, self.write);
        let short = self.mark_groups(checked.to_mark).await?;
        for (group, written) in short {
            self.recheck(group, written).await;
        }
        Ok(())
    }

    /// A committed group: `n` rows written of the group less the `skipped` (held) ones. The
    /// rows tried come back when the UPDATE wrote fewer of them than asked.
    fn written(&mut self, group: Vec<i64>, n: u64, skipped: Vec<i64>) -> Option<Vec<i64>> {
        let tried: Vec<i64> = group
            .into_iter()
            .filter(|id| !skipped.contains(id))
            .collect();
        self.held.extend(skipped);
        self.report.marked += n;
        if n as usize != tried.len() {
            return Some(tried);
        }
        if !tried.is_empty() {
            // Seed §4 "marking mid-way": the inbox has the marks, PostgreSQL not yet.
            crate::failpoint::hit("backfill_after_inbox_mark");
        }
        for id in tried {
            self.confirmed(id);
        }
        None
    }

    fn confirmed(&mut self, id: i64) {
        self.report.confirmed.push(id);
        self.write.confirmed.push(id);
    }

    /// Marks `to_mark`, splitting a group that hits a statement-level error; returns the
    /// groups whose UPDATE wrote fewer rows than asked.
    async fn mark_groups(&mut self, to_mark: Vec<i64>) -> Result<Vec<(Vec<i64>, u64)>, StoreError> {
        let mut short = Vec::new();
        let mut groups = vec![to_mark];
        let mut budget = self.cfg.isolation_budget;
        let mut unreachable: Option<String> = None;
        while let Some(group) = groups.pop() {
            if group.is_empty() {
                continue;
            }
            if self.out_of_budget() {
                self.report.deferred.extend(group);
                continue;
            }
            if let Some(error) = &unreachable {
                self.failed
                    .extend(group.into_iter().map(|id| (id, error.clone())));
                continue;
            }
            match self.mark_group(&group).await? {
                Marked::Written(n, skipped) => {
                    if let Some(tried) = self.written(group, n, skipped) {
                        short.push((tried, n));
                    }
                }
                Marked::NotHeld => self.report.deferred.extend(group),
                Marked::Failed(e) if !e.is_connection_level() && group.len() > 1 && budget >= 2 => {
                    budget -= 2;
                    self.report.isolation_statements += 2;
                    let (a, b) = group.split_at(group.len() / 2);
                    groups.push(b.to_vec());
                    groups.push(a.to_vec());
                }
                // A lock wait that ended in the server's lock wait timeout: the group (one row,
                // or the rest of the isolation budget) is held by another session, not failing.
                Marked::Failed(e) if e.is_lock_conflict() => self.held.extend(group),
                Marked::Failed(e) => {
                    let error = format!("mark: {e}");
                    if e.is_connection_level() {
                        unreachable = Some(error.clone());
                    }
                    self.failed
                        .extend(group.into_iter().map(|id| (id, error.clone())));
                }
            }
        }
        Ok(short)
    }

    /// One group: the UPDATE in an inbox transaction, the lock re-checked in PostgreSQL, then
    /// the inbox COMMIT. `Err` when PostgreSQL failed (the sweep's transaction, and with it the
    /// locks, may be gone): the inbox transaction is rolled back, nothing is marked.
    async fn mark_group(&mut self, group: &[i64]) -> Result<Marked, StoreError> {
        let staged = match self
            .inbox
            .stage_marks(
                &self.cfg.marks,
                group,
                &self.cfg.mark_value,
                self.now,
                self.remaining(),
                self.cfg.avoid,
            )
            .await
        {
            Ok(staged) => staged,
            Err(e) => return Ok(Marked::Failed(e)),
        };
        // G5: the rows must still be ours, locked terminal and unmarked, right before the
        // mark becomes visible. This statement also restarts PostgreSQL's idle timer, so the
        // COMMIT below (bounded by MARK_COMMIT_LIMIT) happens while the lock is held.
        let held = match self.sweep.held(group).await {
            Ok(held) => held,
            Err(e) => {
                staged.rollback().await;
                return Err(e);
            }
        };
        if held != group.len() {
            tracing::error!(
                rows = %IdSummary(group),
                held,
                "backfill: rows locked by the sweep are no longer terminal and unmarked; \
                 their marks are rolled back"
            );
            staged.rollback().await;
            return Ok(Marked::NotHeld);
        }
        let skipped = staged.skipped().to_vec();
        Ok(match staged.commit(MARK_COMMIT_LIMIT).await {
            Ok(n) => Marked::Written(n, skipped),
            Err(e) => Marked::Failed(e),
        })
    }

    /// A group whose UPDATE wrote fewer rows than asked (marked or purged by someone else
    /// between the check and the write): one more existence check settles each row.
    async fn recheck(&mut self, group: Vec<i64>, written: u64) {
        if self.remaining().is_zero() {
            // The marks we wrote are committed; the next sweep finds them "already marked".
            self.report.deferred.extend(group);
            return;
        }
        let Some(checked) = self.check(&group, "existence re-check").await else {
            return;
        };
        // The UPDATE wrote `written` of them; the others were marked by somebody else.
        let now_marked = checked.already.len() as u64;
        self.report.already_marked += now_marked.saturating_sub(written);
        for (id, _) in &checked.already {
            self.confirmed(*id);
        }
        missing(self.rows, &checked.missing, self.report, self.write);
        self.failed.extend(
            checked
                .to_mark
                .into_iter()
                .map(|id| (id, "mark: UPDATE left the mark empty".to_string())),
        );
    }
}

/// Rows with no inbox row: abandon `MISSING_ROW` at once — unless we had confirmed the row's
/// mark before a replay reopened it: the owner purged a marked row (its right, §6), which
/// confirms it.
fn missing(rows: &[BackfillRow], ids: &[i64], report: &mut SweepReport, write: &mut SweepWrite) {
    if ids.is_empty() {
        return;
    }
    let by_id: HashMap<i64, &BackfillRow> = rows.iter().map(|r| (r.msg_id, r)).collect();
    for &id in ids {
        let row = by_id.get(&id);
        if let Some(at) = row.and_then(|r| r.marked_before_replay_at) {
            tracing::info!(
                msg_id = id,
                marked_at = %at,
                "backfill: inbox row purged after the mark confirmed before its replay; confirmed"
            );
            report.already_marked += 1;
            report.gone_after_mark.push(id);
            report.confirmed.push(id);
            write.confirmed.push(id);
            continue;
        }
        let kind = row.map_or(MissingKind::NeverSeen, |r| {
            MissingKind::of(r.source, r.state)
        });
        report.missing.push((id, kind));
        write
            .abandoned
            .push((id, AbandonReason::MissingRow, kind.detail().to_string()));
    }
}
