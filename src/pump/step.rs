//! One pump step: find the head, decide, and process it together with the ready heads behind
//! it (group commit): one stamp for the group, raw reads outside any transaction, decode, then
//! the members planned on the group's load written by one outcome statement per batch (the
//! others: a savepoint and their own write, or a one-statement terminal state) — and one
//! commit for the group.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use chrono_tz::Tz;

use super::outcome::{ErrorClass, Outcome, SingleTerminal};
use super::rules::{backoff, decide, HeadDecision, HeadRules, PoisonReason};
use super::stages::{Stage, StageLog, StageTimes};
use crate::clock::SharedClock;
use crate::codec::{Codec, CodecError, DecodedMessage};
use crate::flight::{self, GuardedPlan, Refused};
use crate::inbox::{Inbox, RawMessage};
use crate::late::Source;
use crate::store::batch::{self, PlannedWrite};
use crate::store::{
    BusinessResult, GroupLoad, GroupTx, HeadRow, PendingCopy, Stamp, Store, StoreError, StoredCopy,
};
use crate::telemetry;
use crate::telemetry::ids::IdSummary;

/// Knobs of the pump.
#[derive(Debug, Clone, Copy)]
pub struct PumpConfig {
    /// Poison and backoff rules.
    pub rules: HeadRules,
    /// Larger messages are MALFORMED.
    pub max_message_bytes: u64,
    /// Identity with the send date (Q11).
    pub identity_with_date: bool,
    /// Airport zone (identity date).
    pub tz: Tz,
    /// Raw reads per inbox round trip.
    pub read_ahead: u32,
    /// Most messages per group (one business transaction, one commit); 1 = no grouping.
    pub group_max: u32,
    /// A group takes no new member once it has run this long (bounds the first member's
    /// commit latency).
    pub group_max_wait: Duration,
    /// Write our own compressed copy of each processed message's raw text in the group's
    /// transaction (`retention.raw_copy`). Copies are read back whatever this says.
    pub raw_copy: bool,
}

/// What a step did: the poison reason and the outcome owned (see [`telemetry::PumpStep`]).
pub type StepOutcome = telemetry::PumpStep<String, Outcome>;

impl StepOutcome {
    /// The step's telemetry event.
    pub fn event(&self) -> telemetry::PumpStep<&str, telemetry::Processed<'_>> {
        match self {
            Self::Idle => telemetry::PumpStep::Idle,
            Self::Waiting { msg_id, until } => telemetry::PumpStep::Waiting {
                msg_id: *msg_id,
                until: *until,
            },
            Self::Poisoned { msg_id, reason } => telemetry::PumpStep::Poisoned {
                msg_id: *msg_id,
                reason: reason.as_str(),
            },
            Self::Processed {
                msg_id,
                outcome,
                took,
                head_age,
            } => telemetry::PumpStep::Processed {
                msg_id: *msg_id,
                outcome: outcome.event(),
                took: *took,
                head_age: *head_age,
            },
        }
    }
}

/// The pump's state between steps: a read-ahead buffer of raw texts (reads have no side
/// effects, so losing it is harmless) and the outcomes of a committed group not yet handed out
/// by [`PumpCore::step`].
#[derive(Debug)]
pub struct PumpCore {
    inbox: Inbox,
    store: Store,
    codec: Arc<dyn Codec>,
    clock: SharedClock,
    cfg: PumpConfig,
    /// Raw texts read ahead, by MSG_ID.
    ahead: BTreeMap<i64, RawMessage>,
    /// Why the last read-ahead failed (members whose text it did not bring fail with it).
    ahead_error: Option<String>,
    /// That failure was a store outage ([`crate::outage`]): not the message's fault.
    ahead_outage: bool,
    /// Raw reads failed by an outage in a row: the backoff of [`PumpCore::outage`].
    outages: i32,
    /// Committed outcomes not yet returned by `step` (one at a time).
    done: VecDeque<StepOutcome>,
    /// Time spent per stage by the real steps (benches read it).
    stages: StageLog,
    /// Most members of the next group (≤ `group_max`): what the last group fitted into
    /// `group_max_wait`, so members are not stamped, read and loaded only to be sent back.
    group_cap: u32,
    /// Stamps of a failed group that the store could not take back yet (at most one group's).
    unreturned: Vec<Stamp>,
}

/// A group member: its head row and the attempt number just stamped.
#[derive(Debug, Clone, Copy)]
struct Member {
    row: HeadRow,
    attempts: i32,
}

/// How a member is written (see [`PumpCore::route`]).
enum Route {
    /// Planned on the group's load: joins the batch (written alone when it carries a
    /// schedule snapshot).
    Planned(PlannedWrite),
    /// Its identity is held by another message: SKIPPED(DUPLICATE).
    Duplicate {
        holder: i64,
        msg_type: String,
        key: String,
    },
    /// No longer unfinished in the load: nothing to write.
    Elsewhere,
    /// Writes on its own: DEAD, FAILED, or business work with its own load.
    Own(Prepared),
}

/// Planned members waiting for their one outcome statement: their writes, and in member order
/// the provisional outcomes — of each write with its attempt number (for a FAILED outcome in
/// the fallback), and of members finished elsewhere meanwhile (no write: they ride along so
/// the outcomes stay in member order).
#[derive(Default)]
struct Batch {
    writes: Vec<PlannedWrite>,
    members: Vec<(Option<i32>, StepOutcome)>,
}

impl Batch {
    fn push(&mut self, attempts: i32, write: PlannedWrite, step: StepOutcome) {
        self.writes.push(write);
        self.members.push((Some(attempts), step));
    }

    fn ride(&mut self, step: StepOutcome) {
        self.members.push((None, step));
    }

    fn len(&self) -> usize {
        self.members.len()
    }

    fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
}

/// A member routed for its write, with the time its routing took (part of its `took`).
struct Routed {
    member: Member,
    route: Route,
    routing: Duration,
}

/// What the work outside PostgreSQL (raw read, decode) made of a member.
enum Prepared {
    /// A terminal state without business work (DEAD).
    Dead(ErrorClass, String),
    /// FAILED with backoff; the group ends here.
    Fail(ErrorClass, String),
    /// FAILED(INFRA) by a store outage, not charged ([`PumpCore::outage`]); the group ends.
    Outage(String),
    /// Decoded: bind the identity, then the business work.
    Decoded(Box<DecodedMessage>),
}

impl PumpCore {
    /// A pump over these adapters.
    pub fn new(
        inbox: Inbox,
        store: Store,
        codec: Arc<dyn Codec>,
        clock: SharedClock,
        cfg: PumpConfig,
    ) -> Self {
        Self {
            inbox,
            store,
            codec,
            clock,
            cfg,
            ahead: BTreeMap::new(),
            ahead_error: None,
            ahead_outage: false,
            outages: 0,
            done: VecDeque::new(),
            stages: StageLog::default(),
            group_cap: cfg.group_max,
            unreturned: Vec::new(),
        }
    }

    /// The store (metrics, tests).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Time spent per stage so far (benches).
    pub fn stages(&self) -> StageTimes {
        self.stages.snapshot()
    }

    /// One head's outcome: hands out the next outcome of the last committed group, or runs
    /// the next group ([`PumpCore::step_group`]) and returns its first outcome. A store
    /// failure is returned (the caller retries later); everything else is recorded on the row.
    pub async fn step(&mut self) -> Result<StepOutcome, StoreError> {
        if let Some(done) = self.done.pop_front() {
            return Ok(done);
        }
        let mut steps = self.step_group().await?.into_iter();
        let first = steps.next().unwrap_or(StepOutcome::Idle);
        self.done.extend(steps);
        Ok(first)
    }

    /// One group: the head and the consecutive ready heads after it (≤ `group_max`, MSG_ID
    /// order) in ONE business transaction, each under its own savepoint, one commit. Returns
    /// at least one outcome, in processing order; all of them are committed.
    pub async fn step_group(&mut self) -> Result<Vec<StepOutcome>, StoreError> {
        if !self.done.is_empty() {
            return Ok(self.done.drain(..).collect());
        }
        self.give_back_pending().await?;
        let limit = self.cfg.group_max.max(self.cfg.read_ahead).max(1);
        let timer = self.stages.time(Stage::Head);
        let candidates = self.store.heads(i64::from(limit)).await?;
        drop(timer);
        let Some(first) = candidates.first().copied() else {
            self.ahead.clear();
            return Ok(vec![StepOutcome::Idle]);
        };
        let head = first.head;
        let now = self.clock.now();
        match decide(&head, now, &self.cfg.rules) {
            HeadDecision::WaitUntil(until) => Ok(vec![StepOutcome::Waiting {
                msg_id: head.msg_id,
                until,
            }]),
            HeadDecision::Poison(reason) => {
                if !self.poison(head.msg_id, reason, now).await? {
                    return Ok(vec![StepOutcome::Idle]); // the row changed meanwhile (a replay): look again
                }
                Ok(vec![StepOutcome::Poisoned {
                    msg_id: head.msg_id,
                    reason: reason.to_string(),
                }])
            }
            HeadDecision::Process => self.process(&candidates, now).await,
        }
    }

    /// Stamps the group's members, reads their texts and runs the group. A group that fails
    /// before its commit gives its stamps back: its members never ran, so neither their
    /// attempt count nor their `head_deadline` may start from it.
    async fn process(
        &mut self,
        candidates: &[HeadRow],
        now: DateTime<Utc>,
    ) -> Result<Vec<StepOutcome>, StoreError> {
        let group = self.group_of(candidates, now);
        let ids: Vec<i64> = group.iter().map(|r| r.head.msg_id).collect();
        let timer = self.stages.time(Stage::Stamp);
        let stamped = self.store.stamp_attempts(&ids, now).await?;
        drop(timer);
        let members: Vec<Member> = group
            .iter()
            .filter_map(|row| {
                stamped
                    .iter()
                    .find(|(id, _)| *id == row.head.msg_id)
                    .map(|(_, attempts)| Member {
                        row: *row,
                        attempts: *attempts,
                    })
            })
            .collect();
        let stamps: Vec<Stamp> = members
            .iter()
            .map(|m| Stamp {
                before: m.row.head,
                attempts: m.attempts,
                at: now,
            })
            .collect();
        if members.first().map(|m| m.row.head.msg_id) != Some(candidates[0].head.msg_id) {
            self.give_back(stamps).await;
            return Ok(vec![StepOutcome::Idle]); // finished elsewhere meanwhile
        }
        let timer = self.stages.time(Stage::RawRead);
        self.read_ahead(candidates, &members).await;
        drop(timer);
        let result = self.run_group(&members, now).await;
        if result.is_err() {
            self.give_back(stamps).await;
        }
        result
    }

    /// Gives a failed group's stamps back ([`Store::give_back_stamps`]). When the store cannot
    /// take them now — the failure was often the store itself — they are kept and given back
    /// before the next group is stamped.
    async fn give_back(&mut self, stamps: Vec<Stamp>) {
        self.unreturned.extend(stamps);
        if let Err(e) = self.give_back_pending().await {
            tracing::warn!(
                error = %e,
                members = self.unreturned.len(),
                "could not give back the attempt stamps of a failed group yet; retrying before the next group"
            );
        }
    }

    /// The stamps kept by [`PumpCore::give_back`], given back now.
    async fn give_back_pending(&mut self) -> Result<(), StoreError> {
        if self.unreturned.is_empty() {
            return Ok(());
        }
        let restored = self.store.give_back_stamps(&self.unreturned).await?;
        let ids: Vec<i64> = self.unreturned.iter().map(|s| s.before.msg_id).collect();
        tracing::info!(
            members = %IdSummary(&ids),
            restored,
            "a group ended before its commit; its attempt stamps were given back"
        );
        self.unreturned.clear();
        Ok(())
    }

    /// The head and the ready heads right behind it: fresh (PENDING, never attempted) rows
    /// that the rules would process now. A head that was attempted before (it failed, or a
    /// crash interrupted it — maybe it kills the process) runs alone, so a crash mid-group
    /// costs the other members one attempt at most and only a killer keeps counting toward
    /// poison. With `max_attempts` < 2 that one attempt would poison them: groups of one.
    fn group_of(&self, candidates: &[HeadRow], now: DateTime<Utc>) -> Vec<HeadRow> {
        let mut group = vec![candidates[0]];
        let fresh = |r: &HeadRow| !r.head.failed && r.head.attempts == 0;
        if self.cfg.rules.max_attempts < 2 || !fresh(&candidates[0]) {
            return group;
        }
        for row in &candidates[1..] {
            if group.len() >= self.cfg.group_max.min(self.group_cap).max(1) as usize
                || !fresh(row)
                || decide(&row.head, now, &self.cfg.rules) != HeadDecision::Process
            {
                break;
            }
            group.push(*row);
        }
        group
    }

    /// Makes sure the raw texts of the members are buffered: one inbox round trip for the
    /// members not buffered yet and the candidates after them (up to `read_ahead`). Outside
    /// any PostgreSQL transaction; a failure is kept and fails the first member it left out.
    async fn read_ahead(&mut self, candidates: &[HeadRow], members: &[Member]) {
        self.ahead_error = None;
        self.ahead_outage = false;
        let Some(missing) = members
            .iter()
            .map(|m| m.row.head.msg_id)
            .find(|id| !self.ahead.contains_key(id))
        else {
            return;
        };
        if missing == members[0].row.head.msg_id {
            self.ahead.clear();
        }
        let want = (self.cfg.read_ahead as usize).max(members.len());
        let ids: Vec<i64> = candidates
            .iter()
            .map(|r| r.head.msg_id)
            .filter(|id| *id >= missing)
            .take(want)
            .collect();
        match self
            .inbox
            .raw_messages(&ids, self.cfg.max_message_bytes)
            .await
        {
            Ok(texts) => {
                self.outages = 0;
                let gone: Vec<i64> = texts
                    .iter()
                    .filter(|(_, raw)| *raw == RawMessage::Missing)
                    .map(|(id, _)| *id)
                    .collect();
                self.ahead.extend(texts);
                if !gone.is_empty() {
                    self.read_copies(&gone).await;
                }
            }
            Err(e) => {
                self.ahead_outage = e.is_outage();
                self.ahead_error = Some(e.to_string());
            }
        }
    }

    /// Inbox rows that are gone (the DB owner purged them): their text from our raw copy
    /// where one exists (a replay after the purge). A copy that does not read back leaves the
    /// row `Missing`; a store failure fails the members like an inbox failure (INFRA), never
    /// "missing".
    async fn read_copies(&mut self, gone: &[i64]) {
        match self
            .store
            .raw_copies(gone, self.cfg.max_message_bytes)
            .await
        {
            Ok(copies) => {
                for (id, copy) in copies {
                    match copy {
                        StoredCopy::Found(raw) => {
                            if let RawMessage::Text(text) = &raw {
                                telemetry::raw_copy_read(id, text.len() as u64);
                            }
                            self.ahead.insert(id, raw);
                        }
                        StoredCopy::Corrupt(error) => telemetry::raw_copy_corrupt(id, &error),
                    }
                }
            }
            Err(e) => {
                for id in gone {
                    self.ahead.remove(id);
                }
                self.ahead_outage = e.is_outage();
                self.ahead_error = Some(format!("reading raw copies: {e}"));
            }
        }
    }

    /// The copies of the members' raw texts (compressed here, outside the transaction), when
    /// `raw_copy` is on.
    fn copies_of(&self, members: &[Member]) -> Result<Vec<PendingCopy>, StoreError> {
        let mut copies = Vec::new();
        if !self.cfg.raw_copy {
            return Ok(copies);
        }
        for m in members {
            let id = m.row.head.msg_id;
            if let Some(RawMessage::Text(text)) = self.ahead.get(&id) {
                copies.extend(PendingCopy::of(id, text)?);
            }
        }
        Ok(copies)
    }

    async fn poison(
        &self,
        msg_id: i64,
        reason: PoisonReason,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let started_before = crate::clock::minus(now, self.cfg.rules.head_deadline);
        self.store
            .poison(
                msg_id,
                self.cfg.rules.max_attempts,
                started_before,
                &reason.to_string(),
                now,
            )
            .await
    }

    /// The members one after another in one transaction; stops after a FAILED one or when
    /// the group has run `group_max_wait` — and closes as soon as its members are done: it
    /// never waits for heads that are not there. Stages: prepare (texts, decode, copies),
    /// load, route (plan on the load, no I/O), write (batches and own writes), finish (copies,
    /// stamps of members that did not run, commit). Members planned on the group's load are
    /// written together by one outcome statement per batch; the others (DEAD, FAILED,
    /// duplicates, LATE rows, schedules) write on their own, after the batch before them.
    async fn run_group(
        &mut self,
        members: &[Member],
        now: DateTime<Utc>,
    ) -> Result<Vec<StepOutcome>, StoreError> {
        let group_started = Instant::now();
        let (prepared, copies) = self.prepare_stage(members)?;
        let mut tx = self.store.begin_group().await?;
        let timer = self.stages.time(Stage::Load);
        let load = self.load_group(&mut tx, members, &prepared).await?;
        drop(timer);
        let routed = self.route_stage(members, prepared, load);
        let steps = self
            .write_stage(&mut tx, routed, now, group_started)
            .await?;
        self.finish_stage(tx, members, steps, copies, now, group_started)
            .await
    }

    /// Raw texts and decoding first (no I/O: read ahead), up to the first member that fails
    /// there (the group ends with it); then the copies of their texts, when kept.
    fn prepare_stage(
        &mut self,
        members: &[Member],
    ) -> Result<(Vec<Prepared>, Vec<PendingCopy>), StoreError> {
        let mut timer = self.stages.time(Stage::Decode);
        let mut prepared = Vec::with_capacity(members.len());
        for m in members {
            let p = self.prepare(m.row.head.msg_id);
            let stop = matches!(p, Prepared::Fail(..) | Prepared::Outage(_));
            prepared.push(p);
            if stop {
                break;
            }
        }
        timer.calls(prepared.len() as u64);
        drop(timer);
        // The compressing counts toward the copies' one call (their write, at the finish).
        let mut timer = self.cfg.raw_copy.then(|| self.stages.time(Stage::RawCopy));
        if let Some(t) = timer.as_mut() {
            t.calls(0);
        }
        let copies = self.copies_of(&members[..prepared.len()])?;
        Ok((prepared, copies))
    }

    /// Every prepared member's route, in order (pure: planning on the load applies each plan
    /// to it for the members after).
    fn route_stage(
        &mut self,
        members: &[Member],
        prepared: Vec<Prepared>,
        mut load: Option<GroupLoad>,
    ) -> Vec<Routed> {
        members
            .iter()
            .zip(prepared)
            .map(|(m, p)| {
                let started = Instant::now();
                let route = self.route(m, p, &mut load);
                Routed {
                    member: *m,
                    route,
                    routing: started.elapsed(),
                }
            })
            .collect()
    }

    /// Writes the routed members in order until one is not terminal (FAILED) or the group
    /// has run `group_max_wait`; a member joining the batch is written with it, everything
    /// else after the batch before it. Returns the outcomes of the members that ran, in order,
    /// every one written in the transaction.
    async fn write_stage(
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
                Route::Elsewhere => false,
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
            Route::Duplicate {
                holder,
                msg_type,
                key,
            } => {
                self.duplicate(tx, m.row.head.msg_id, holder, &msg_type, &key)
                    .await
            }
            Route::Own(p) => self.member(tx, m, p).await,
        }
    }

    /// The members that ran leave the read-ahead buffer and size the next group; their copies
    /// are written and the stamps of the members that did not run taken back in the group's
    /// transaction, which then commits.
    async fn finish_stage(
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

    /// Writes the pending batch in one statement, its members' outcomes then joining `done`.
    /// When that statement fails (a constraint, a trigger), its members are written one by one
    /// under their own savepoints, exactly as without batching: the first that fails takes its
    /// FAILED outcome, the group ends with it (the members after it did not run) and `true` is
    /// returned.
    async fn flush(
        &mut self,
        tx: &mut GroupTx,
        batch: &mut Batch,
        done: &mut Vec<StepOutcome>,
    ) -> Result<bool, StoreError> {
        if batch.writes.is_empty() {
            return Ok(false);
        }
        let Batch { writes, members } = std::mem::take(batch);
        let mut timer = self.stages.time(Stage::Business);
        timer.calls(writes.len() as u64);
        let written = tx.write_batch(&writes).await?;
        drop(timer);
        let Err(e) = written else {
            done.extend(members.into_iter().map(|(_, step)| step));
            return Ok(false);
        };
        tracing::warn!(
            error = %e,
            members = writes.len(),
            first = writes[0].msg_id,
            "batch outcome statement failed; writing its members one by one"
        );
        let mut next_write = writes.iter();
        for (attempts, mut step) in members {
            let (Some(attempts), Some(w)) = (attempts, attempts.and_then(|_| next_write.next()))
            else {
                done.push(step); // finished elsewhere: nothing to write
                continue;
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

    /// A business duplicate: SKIPPED(DUPLICATE), naming the holder of its identity.
    async fn duplicate(
        &mut self,
        tx: &mut GroupTx,
        msg_id: i64,
        holder: i64,
        msg_type: &str,
        key: &str,
    ) -> Result<Outcome, StoreError> {
        let detail = format!("identity {key} already bound to message {holder}");
        let now = self.clock.now();
        tx.finish_single(
            msg_id,
            SingleTerminal::Skipped,
            ErrorClass::Duplicate,
            &detail,
            Some(msg_type),
            now,
        )
        .await?;
        Ok(Outcome::Skipped {
            reason: ErrorClass::Duplicate,
            detail,
        })
    }

    /// How a member is written, decided on the group's load without I/O: a decoded member
    /// that is not `LATE` is checked (still unfinished, identity free) and planned on the
    /// load, which then holds its changes for the members after it.
    fn route(&mut self, m: &Member, prepared: Prepared, cache: &mut Option<GroupLoad>) -> Route {
        let msg_id = m.row.head.msg_id;
        if m.row.source.is_late() {
            // A LATE row loads for itself (guarded path), and so do the members after it.
            *cache = None;
        }
        let (Prepared::Decoded(msg), Some(load)) = (&prepared, cache.as_mut()) else {
            return Route::Own(prepared);
        };
        if !load.states.get(&msg_id).is_some_and(|s| s.is_unfinished()) {
            return Route::Elsewhere;
        }
        let msg_type = type_label(msg);
        let key = msg.identity_key(self.cfg.identity_with_date, self.cfg.tz);
        if let Some(&holder) = load.holders.get(&key).filter(|h| **h != msg_id) {
            return Route::Duplicate {
                holder,
                msg_type,
                key,
            };
        }
        let timer = self.stages.time(Stage::Plan);
        let current = load.current(&flight::flights_to_load(msg));
        let plan = flight::plan(msg, msg_id, &current);
        load.apply(msg_id, &key, &plan);
        drop(timer);
        Route::Planned(PlannedWrite {
            msg_id,
            msg_type,
            identity: key,
            plan,
            now: self.clock.now(),
        })
    }

    /// One load for the decoded members before the first `LATE` one (those take the guarded
    /// path with a load of their own); None when there is none.
    async fn load_group(
        &self,
        tx: &mut GroupTx,
        members: &[Member],
        prepared: &[Prepared],
    ) -> Result<Option<GroupLoad>, StoreError> {
        let (mut ids, mut keys, mut flids) = (Vec::new(), Vec::new(), Vec::<String>::new());
        for (m, p) in members.iter().zip(prepared) {
            if m.row.source.is_late() {
                break;
            }
            if let Prepared::Decoded(msg) = p {
                ids.push(m.row.head.msg_id);
                keys.push(msg.identity_key(self.cfg.identity_with_date, self.cfg.tz));
                for f in flight::flights_to_load(msg) {
                    if !flids.contains(&f) {
                        flids.push(f);
                    }
                }
            }
        }
        if ids.is_empty() {
            return Ok(None);
        }
        Ok(Some(tx.load_group(&ids, &keys, &flids).await?))
    }

    /// A member that writes on its own inside the group transaction (DEAD, FAILED, or the
    /// business work with a load of its own: `LATE` rows are applied with the ordering
    /// guard); returns how it ended (written, not yet committed).
    async fn member(
        &mut self,
        tx: &mut GroupTx,
        m: &Member,
        prepared: Prepared,
    ) -> Result<Outcome, StoreError> {
        let msg_id = m.row.head.msg_id;
        let msg = match prepared {
            Prepared::Dead(class, detail) => return self.dead(tx, msg_id, class, detail).await,
            Prepared::Fail(class, detail) => {
                return self.fail(tx, msg_id, m.attempts, class, detail).await
            }
            Prepared::Outage(detail) => return self.outage(tx, m, detail).await,
            Prepared::Decoded(msg) => msg,
        };
        let msg_type = type_label(&msg);
        let key = msg.identity_key(self.cfg.identity_with_date, self.cfg.tz);
        let timer = self.stages.time(Stage::Savepoint);
        tx.savepoint().await?;
        drop(timer);
        let timer = self.stages.time(Stage::Business);
        let result = self
            .business(tx, msg_id, &msg, &msg_type, &key, m.row.source)
            .await;
        drop(timer);
        match result {
            Ok(BusinessResult::Committed { changes, events }) => {
                Ok(Outcome::Succeeded { changes, events })
            }
            Ok(BusinessResult::NotUnfinished) => Ok(Outcome::FinishedElsewhere),
            Ok(BusinessResult::Duplicate { holder }) => {
                self.duplicate(tx, msg_id, holder, &msg_type, &key).await
            }
            // Back to the savepoint: retry later, nothing partial of this message remains.
            Err(e) => {
                tx.rollback_message().await?;
                self.fail(tx, msg_id, m.attempts, ErrorClass::Infra, e.to_string())
                    .await
            }
        }
    }

    /// Raw text and decode of a member (no I/O: the text was read ahead).
    fn prepare(&self, msg_id: i64) -> Prepared {
        let raw = match self.ahead.get(&msg_id) {
            Some(raw) => raw,
            None => {
                let detail = self
                    .ahead_error
                    .clone()
                    .unwrap_or_else(|| "raw message not read".into());
                if self.ahead_outage {
                    return Prepared::Outage(detail);
                }
                return Prepared::Fail(ErrorClass::Infra, detail);
            }
        };
        let text = match raw {
            RawMessage::Text(text) => text,
            RawMessage::Missing => {
                return Prepared::Dead(
                    ErrorClass::Malformed,
                    "inbox row missing when reading the raw message".into(),
                )
            }
            RawMessage::Empty => {
                return Prepared::Dead(
                    ErrorClass::Malformed,
                    "inbox row has no message text".into(),
                )
            }
            RawMessage::TooLarge(len) => {
                let detail = format!(
                    "message of {len} bytes exceeds processing.max_message_bytes {}",
                    self.cfg.max_message_bytes
                );
                return Prepared::Dead(ErrorClass::Malformed, detail);
            }
        };
        match self.codec.decode(text) {
            Ok(msg) => Prepared::Decoded(Box::new(msg)),
            Err(CodecError::Malformed(d)) => Prepared::Dead(ErrorClass::Malformed, d),
            Err(CodecError::Unsupported(d)) => Prepared::Fail(ErrorClass::Unsupported, d),
            Err(CodecError::Codec(d)) => Prepared::Fail(ErrorClass::CodecError, d),
        }
    }

    async fn business(
        &mut self,
        tx: &mut GroupTx,
        msg_id: i64,
        msg: &DecodedMessage,
        msg_type: &str,
        identity: &str,
        source: Source,
    ) -> Result<BusinessResult, StoreError> {
        let load = flight::flights_to_load(msg);
        let now = self.clock.now();
        if source.is_late() {
            // Out of id order by design: newer messages were applied first; the guard keeps
            // what they wrote and the refusals are recorded on the row.
            let (result, refused) = tx
                .business(
                    msg_id,
                    msg_type,
                    &load,
                    identity,
                    true,
                    |current, tombstones| flight::plan_guarded(msg, msg_id, current, tombstones),
                    now,
                )
                .await?;
            if !refused.is_empty() {
                let labels = refused.labels();
                let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
                telemetry::late_stale_fields(msg_id, &labels);
            }
            Ok(result)
        } else {
            let (result, _) = tx
                .business(
                    msg_id,
                    msg_type,
                    &load,
                    identity,
                    false,
                    |current, _| GuardedPlan {
                        plan: flight::plan(msg, msg_id, current),
                        refused: Refused::default(),
                    },
                    now,
                )
                .await?;
            Ok(result)
        }
    }

    async fn dead(
        &self,
        tx: &mut GroupTx,
        msg_id: i64,
        class: ErrorClass,
        detail: String,
    ) -> Result<Outcome, StoreError> {
        let now = self.clock.now();
        tx.finish_single(msg_id, SingleTerminal::Dead, class, &detail, None, now)
            .await?;
        Ok(Outcome::Dead { class, detail })
    }

    async fn fail(
        &mut self,
        tx: &mut GroupTx,
        msg_id: i64,
        attempts: i32,
        class: ErrorClass,
        detail: String,
    ) -> Result<Outcome, StoreError> {
        self.ahead.clear();
        let now = self.clock.now();
        let delay = backoff(attempts, &self.cfg.rules);
        let next = crate::clock::plus(now, delay);
        tx.mark_failed(msg_id, class, &detail, next, now).await?;
        Ok(Outcome::Failed {
            class,
            detail,
            next_attempt_at: next,
        })
    }
}

impl PumpCore {
    /// The head's raw text could not be read because a store is out (SPEC §4: FAILED(INFRA)
    /// with backoff). The failure is not the message's: its attempt is not charged and its
    /// head deadline does not age while the store is out (`processing_started_at` cleared:
    /// it starts again at the next attempt). Counting either would poison good heads one after
    /// another during an outage — the next head fails the same way, so nothing is unblocked —
    /// while `head_deadline` exists to unblock the FIFO from a message that fails by itself.
    /// The backoff doubles per outage failure in a row (kept here: it belongs to the outage,
    /// not to the row).
    async fn outage(
        &mut self,
        tx: &mut GroupTx,
        m: &Member,
        detail: String,
    ) -> Result<Outcome, StoreError> {
        self.ahead.clear();
        self.outages = self.outages.saturating_add(1);
        let now = self.clock.now();
        let next = crate::clock::plus(now, backoff(self.outages, &self.cfg.rules));
        let head = m.row.head;
        tx.mark_failed_uncharged(head.msg_id, &detail, next, now, head.attempts)
            .await?;
        tracing::warn!(
            msg_id = head.msg_id,
            attempts = head.attempts,
            outages = self.outages,
            error = %detail,
            "store outage reading the head's raw text: FAILED(INFRA), attempt not charged"
        );
        Ok(Outcome::Failed {
            class: ErrorClass::Infra,
            detail,
            next_attempt_at: next,
        })
    }
}

/// Whether this step recorded an outcome for `msg_id` in the group (a row another path had
/// finished meanwhile gets none, and no copy).
fn recorded(step: &StepOutcome, msg_id: i64) -> bool {
    matches!(step, StepOutcome::Processed { msg_id: id, outcome, .. }
        if *id == msg_id && !matches!(outcome, Outcome::FinishedElsewhere))
}

/// `TYPE` or `TYPE-STYP`, for the row and logs.
fn type_label(msg: &DecodedMessage) -> String {
    if msg.meta.subtype.is_empty() {
        msg.meta.msg_type.clone()
    } else {
        format!("{}-{}", msg.meta.msg_type, msg.meta.subtype)
    }
}
