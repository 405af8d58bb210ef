//! One pump step: find the head, decide, and process it together with the ready heads behind
//! it (group commit): one stamp for the group, raw reads outside any transaction, decode, then
//! the members planned on the group's load written by one outcome statement per batch (the
//! others: a savepoint and their own write, or a one-statement terminal state) — and one
//! commit for the group.
//!
//! This file owns the group flow: the head's decision (wait, poison, process), which ready
//! heads join the group, their attempt stamps (given back when the group fails before its
//! commit) and the order of a group's stages. The stages live beside it:
//! - [`read_ahead`]: raw texts read ahead of the group (inbox, else our raw copy) and decoded;
//! - [`route`]: each member's route on the group's load, and the batch planned members join;
//! - [`write`]: the write stage (batches, their one-by-one fallback) and the commit;
//! - [`member`]: the members that write on their own (business work with its own load, a
//!   duplicate, DEAD, FAILED with backoff).

mod member;
mod read_ahead;
mod route;
mod write;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use chrono_tz::Tz;

use self::read_ahead::TextRead;
use super::outcome::Outcome;
use super::rules::{decide, HeadDecision, HeadRules, PoisonReason};
use super::stages::{Stage, StageLog, StageTimes};
use crate::clock::SharedClock;
use crate::codec::Codec;
use crate::inbox::{Inbox, RawMessage};
use crate::store::{HeadRow, Stamp, Store, StoreError};
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

/// The pump's state between groups: a read-ahead buffer of raw texts (reads have no side
/// effects, so losing it is harmless), the size of the next group and the stamps of a failed
/// group not given back yet.
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
    /// Time spent per stage by the real steps (benches read it).
    stages: StageLog,
    /// Most members of the next group (≤ `group_max`): what the last group fitted into
    /// `group_max_wait`, so members are not stamped, read and loaded only to be sent back.
    group_cap: u32,
    /// Stamps of a failed group that the store could not take back yet (at most one group's).
    unreturned: Vec<Stamp>,
    /// On a backlog, the texts of the rows after the last group, read while it ran
    /// ([`PumpCore::read_behind`]).
    behind: Option<tokio::task::JoinHandle<TextRead>>,
}

/// A group member: its head row and the attempt number just stamped.
#[derive(Debug, Clone, Copy)]
struct Member {
    row: HeadRow,
    attempts: i32,
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
            stages: StageLog::default(),
            group_cap: cfg.group_max,
            unreturned: Vec::new(),
            behind: None,
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

    /// One group: the head and the consecutive ready heads after it (≤ `group_max`, MSG_ID
    /// order) in ONE business transaction, each under its own savepoint, one commit. Returns
    /// at least one outcome, in processing order; all of them are committed.
    pub async fn step_group(&mut self) -> Result<Vec<StepOutcome>, StoreError> {
        self.give_back_pending().await?;
        let limit = self.cfg.group_max.max(self.cfg.read_ahead).max(1);
        let timer = self.stages.time(Stage::Head);
        let candidates = self.store.heads(i64::from(limit)).await?;
        drop(timer);
        let Some(first) = candidates.first().copied() else {
            self.forget_texts();
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
            HeadDecision::Process => {
                let backlog = candidates.len() >= limit as usize;
                self.process(&candidates, backlog, now).await
            }
        }
    }

    /// Stamps the group's members, reads their texts and runs the group. A group that fails
    /// before its commit gives its stamps back: its members never ran, so neither their
    /// attempt count nor their `head_deadline` may start from it.
    async fn process(
        &mut self,
        candidates: &[HeadRow],
        backlog: bool,
        now: DateTime<Utc>,
    ) -> Result<Vec<StepOutcome>, StoreError> {
        let group = self.group_of(candidates, now);
        let ids: Vec<i64> = group.iter().map(|r| r.head.msg_id).collect();
        self.take_behind();
        // The texts are read beside the stamp: two servers, two round trips at once. A text
        // read for a member that then is not stamped stays buffered, as read-ahead does.
        let read_ids = self.ahead_ids(candidates, &ids);
        let timer = self.stages.time(Stage::Stamp);
        let (stamped, texts) = futures::join!(
            self.store.stamp_attempts(&ids, now),
            self.read_texts(&read_ids)
        );
        drop(timer);
        let stamped = stamped?;
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
        self.take_texts(texts).await;
        drop(timer);
        if let (true, Some(&last)) = (backlog, ids.last()) {
            self.read_behind(last, candidates.len());
        }
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
    /// written together by one outcome statement per batch, and so are the terminal rows of
    /// DEAD members and duplicates; the others (FAILED, LATE rows, schedules) write on their
    /// own, after the batch before them.
    async fn run_group(
        &mut self,
        members: &[Member],
        now: DateTime<Utc>,
    ) -> Result<Vec<StepOutcome>, StoreError> {
        let group_started = Instant::now();
        let (prepared, copies) = self.prepare_stage(members, now)?;
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
}
