//! Writes: the write stage of a group — members planned on the load written by one outcome
//! statement per batch (one by one under savepoints when that statement fails), the others on
//! their own after the batch before them — and the finish: raw copies, stamps of members that
//! did not run taken back, one commit.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::member::{terminal_outcome, write_terminal};
use super::route::{Batch, Pending, Route, Routed};
use super::{Member, PumpCore, StepOutcome};
use crate::pump::outcome::{ErrorClass, Outcome};
use crate::pump::stages::Stage;
use crate::store::batch::{self, BatchRows, PlannedWrite};
use crate::store::{GroupTx, PendingCopy, StoreError};
use crate::telemetry;

impl PumpCore {
    /// Writes the routed members in order until one is not terminal (FAILED) or the group
    /// has run `group_max_wait`; a member joining the batch is written with it, everything
    /// else after the batch before it. Returns the outcomes of the members that ran, in order,
    /// every one written in the transaction.
    pub(super) async fn write_stage(
        &mut self,
        tx: &mut GroupTx,
        routed: Vec<Routed>,
        now: DateTime<Utc>,
        group_started: Instant,
    ) -> Result<Vec<StepOutcome>, StoreError> {
        let mut done = Vec::with_capacity(routed.len());
        let mut pending = Batch::default();
        for Routed {
            member: m,
            route,
            routing,
        } in routed
        {
            let ran = done.len() + pending.len();
            if ran > 0 && group_started.elapsed() >= self.cfg.group_max_wait {
                break;
            }
            let started = Instant::now();
            let flush_first = match &route {
                Route::Elsewhere | Route::Terminal(_) => false,
                Route::Planned(w) if w.plan.snapshot.is_none() => {
                    !batch::joins(&pending.writes, &w.plan)
                }
                _ => true,
            };
            if flush_first && self.flush(tx, &mut pending, &mut done).await? {
                return Ok(done);
            }
            let head_age = (now - m.row.since).to_std().unwrap_or(Duration::ZERO);
            let step = |outcome, took: Duration| StepOutcome::Processed {
                msg_id: m.row.head.msg_id,
                outcome,
                took: took + routing,
                head_age,
            };
            let outcome = match route {
                Route::Planned(w) if w.plan.snapshot.is_none() => {
                    let outcome = Outcome::Succeeded {
                        changes: w.plan.changes.len(),
                        events: w.plan.events.len(),
                    };
                    pending.push(m.attempts, w, step(outcome, started.elapsed()));
                    None
                }
                Route::Elsewhere if !pending.is_empty() => {
                    pending.ride(step(Outcome::FinishedElsewhere, started.elapsed()));
                    None
                }
                // Ending without business work: a row of the batch statement, so a malformed
                // message or a duplicate does not split the batch around it.
                Route::Terminal(row) => {
                    let outcome = terminal_outcome(row.clone());
                    pending.terminal(row, step(outcome, started.elapsed()));
                    None
                }
                route => Some(self.write_own(tx, &m, route).await?),
            };
            if let Some(outcome) = outcome {
                let stop = !outcome.is_terminal();
                done.push(step(outcome, started.elapsed()));
                if stop {
                    return Ok(done);
                }
            }
            if done.len() + pending.len() == 2 {
                crate::failpoint::hit("pump_mid_group");
            }
        }
        self.flush(tx, &mut pending, &mut done).await?;
        Ok(done)
    }

    /// A member that does not join the batch, written now (nothing for one finished
    /// elsewhere).
    async fn write_own(
        &mut self,
        tx: &mut GroupTx,
        m: &Member,
        route: Route,
    ) -> Result<Outcome, StoreError> {
        match route {
            Route::Elsewhere => Ok(Outcome::FinishedElsewhere),
            Route::Planned(w) => self.write_alone(tx, &w, m.attempts).await,
            Route::Terminal(row) => write_terminal(tx, row).await,
            Route::Own(p) => self.member(tx, m, p).await,
        }
    }

    /// Writes the pending batch in one statement, its members' outcomes then joining `done`
    /// (terminal rows without a planned member: one statement each, the batch statement costs
    /// more). When that statement fails (a constraint, a trigger), its members are written one
    /// by one (the planned ones under their own savepoints), exactly as without batching: the
    /// first that fails takes its FAILED outcome, the group ends with it (the members after it
    /// did not run) and `true` is returned.
    async fn flush(
        &mut self,
        tx: &mut GroupTx,
        batch: &mut Batch,
        done: &mut Vec<StepOutcome>,
    ) -> Result<bool, StoreError> {
        let Batch {
            writes,
            terminals,
            members,
        } = std::mem::take(batch);
        if writes.is_empty() {
            for row in terminals {
                write_terminal(tx, row).await?;
            }
            done.extend(members.into_iter().map(|(_, step)| step));
            return Ok(false);
        }
        let count = (writes.len() + terminals.len()) as u64;
        let mut timer = self.stages.time(Stage::Rows);
        timer.calls(count);
        let rows = BatchRows::of(&writes, &terminals);
        drop(timer);
        let mut timer = self.stages.time(Stage::Business);
        timer.calls(count);
        self.stages.batch();
        let written = match rows {
            Ok(rows) => tx.write_batch(&rows).await?,
            Err(e) => Err(e), // a flight that does not serialize: one by one finds its member
        };
        drop(timer);
        let Err(e) = written else {
            done.extend(members.into_iter().map(|(_, step)| step));
            return Ok(false);
        };
        tracing::warn!(
            error = %e,
            members = members.len(),
            first = writes[0].msg_id,
            "batch outcome statement failed; writing its members one by one"
        );
        let (mut next_write, mut next_terminal) = (writes.iter(), terminals.into_iter());
        for (pending, mut step) in members {
            let (attempts, w) = match pending {
                Pending::Planned(attempts) => {
                    let Some(w) = next_write.next() else {
                        done.push(step); // cannot be: one planned write per planned member
                        continue;
                    };
                    (attempts, w)
                }
                Pending::Terminal => {
                    if let Some(row) = next_terminal.next() {
                        write_terminal(tx, row).await?;
                    }
                    done.push(step);
                    continue;
                }
                Pending::Rides => {
                    done.push(step); // finished elsewhere: nothing to write
                    continue;
                }
            };
            let outcome = self.write_alone(tx, w, attempts).await?;
            let stop = !outcome.is_terminal();
            if stop {
                if let StepOutcome::Processed { outcome: o, .. } = &mut step {
                    *o = outcome;
                }
            }
            done.push(step);
            if stop {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// A planned member written on its own under its savepoint; a failure rolls back to it
    /// and the member is FAILED (retried later, nothing partial remains).
    async fn write_alone(
        &mut self,
        tx: &mut GroupTx,
        w: &PlannedWrite,
        attempts: i32,
    ) -> Result<Outcome, StoreError> {
        let timer = self.stages.time(Stage::Savepoint);
        tx.savepoint().await?;
        drop(timer);
        let timer = self.stages.time(Stage::Business);
        let written = tx
            .write_planned(w.msg_id, &w.msg_type, &w.identity, &w.plan, w.now)
            .await;
        drop(timer);
        match written {
            Ok(()) => Ok(Outcome::Succeeded {
                changes: w.plan.changes.len(),
                events: w.plan.events.len(),
            }),
            Err(e) => {
                tx.rollback_message().await?;
                self.fail(tx, w.msg_id, attempts, ErrorClass::Infra, e.to_string())
                    .await
            }
        }
    }

    /// The members that ran leave the read-ahead buffer and size the next group; their copies
    /// are written and the stamps of the members that did not run taken back in the group's
    /// transaction, which then commits.
    pub(super) async fn finish_stage(
        &mut self,
        mut tx: GroupTx,
        members: &[Member],
        steps: Vec<StepOutcome>,
        copies: Vec<PendingCopy>,
        now: DateTime<Utc>,
        group_started: Instant,
    ) -> Result<Vec<StepOutcome>, StoreError> {
        let ran = steps.len();
        for m in &members[..ran] {
            self.ahead.remove(&m.row.head.msg_id);
        }
        // The next group's size: what fitted in group_max_wait, plus a quarter to grow into.
        self.group_cap = if ran < members.len()
            && steps.last().is_some_and(
                |s| matches!(s, StepOutcome::Processed { outcome, .. } if outcome.is_terminal()),
            ) {
            (ran + ran / 4 + 1) as u32
        } else {
            self.cfg.group_max
        };
        // The copies of the members that ran, in the transaction that records their outcome:
        // committed with it or not at all.
        let copy_timer = self.cfg.raw_copy.then(|| self.stages.time(Stage::RawCopy));
        let copies: Vec<PendingCopy> = copies
            .into_iter()
            .filter(|c| steps.iter().any(|s| recorded(s, c.msg_id)))
            .collect();
        tx.write_raw_copies(&copies, now).await?;
        drop(copy_timer);
        let timer = self.stages.time(Stage::Commit);
        let not_run: Vec<i64> = members[ran..].iter().map(|m| m.row.head.msg_id).collect();
        if !not_run.is_empty() {
            tx.unstamp(&not_run).await?;
        }
        crate::failpoint::hit("pump_group_before_commit");
        tx.commit().await?;
        // Seed §4 "committed, mark not written" (and events not yet delivered).
        crate::failpoint::hit("pump_after_business_commit");
        drop(timer);
        self.stages.group(ran as u64);
        telemetry::pump_group(ran, group_started.elapsed());
        if !copies.is_empty() {
            let raw: u64 = copies.iter().map(|c| c.raw_bytes as u64).sum();
            let stored: u64 = copies.iter().map(|c| c.body.len() as u64).sum();
            telemetry::raw_copies_written(copies.len(), raw, stored);
        }
        Ok(steps)
    }
}

/// Whether this step recorded an outcome for `msg_id` in the group (a row another path had
/// finished meanwhile gets none, and no copy).
fn recorded(step: &StepOutcome, msg_id: i64) -> bool {
    matches!(step, StepOutcome::Processed { msg_id: id, outcome, .. }
        if *id == msg_id && !matches!(outcome, Outcome::FinishedElsewhere))
}
