//! What a sequence did, recorded as it runs, and the checks of the operator actions themselves
//! (the rows' and flights' ends are [`super::ops_reference`]'s, checked by
//! [`super::ops_check`]):
//! - no inbox row the model calls unfinished is gone after a purge (checked from the inbox);
//! - every replayed row was processed again, after the replay, the rows of one replay in id
//!   order;
//! - an approved skip made only rows of its range SKIPPED(APPROVED_SKIP), as many as it
//!   reported, and they raised no events;
//! - every process exit was the documented one, and no log ever says `panicked`;
//! - every operator action took the effect the model predicted ([`Model::effect`]).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::os::unix::process::ExitStatusExt as _;
use std::process::ExitStatus;

use crate::common::TestEnv;
use crate::ops_effect::{judge, Predict, Tally};

/// How a process was expected to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// `kill -9`: killed by signal 9.
    Killed,
    /// SIGTERM: exit 0.
    Term,
    /// The old holder, thawed after a takeover: exit 1.
    Fenced,
    /// A failpoint's abort (`MSGEXCHANGE_FAILPOINT`): killed by SIGABRT.
    Aborted,
}

/// One replay as the model saw it.
#[derive(Debug, Clone)]
pub struct Replayed {
    /// Rows the replay applied to, ascending.
    pub ids: Vec<i64>,
    /// The highest `processed_seq` before the replay ran.
    pub seq_before: i64,
}

/// One approved skip as the operator ran it.
#[derive(Debug, Clone)]
pub struct Skip {
    pub from: i64,
    pub to: i64,
    /// Rows the report skipped.
    pub skipped: u64,
    /// The blocker (an unknown type) and its followers.
    pub queued: Vec<i64>,
    /// The skip ran before the blocker could be poisoned: it must catch all of `queued`.
    pub caught_all: bool,
    /// When the skip CLI was started.
    pub at: std::time::Instant,
    /// Rows of its range it cannot have taken (the harness saw them finished when it ran).
    pub excluded: BTreeSet<i64>,
}

/// The record of one sequence.
#[derive(Debug, Default)]
pub struct Model {
    /// Visible stock rows the cutover skipped: never ours.
    pub skipped_stock: BTreeSet<i64>,
    /// Stock rows the previous system had marked.
    pub premarked: BTreeSet<i64>,
    /// A legacy plan's simulator wrote rows the model does not know (judged by invariants).
    pub foreign_writers: bool,
    /// `ce_source`s of other deployments that wrote on the sequence's topic (a rebuilt store,
    /// `ops_shared_topic`): their records are left out of every check of ours.
    pub foreign_sources: Vec<String>,
    /// Duplicate records of our events on the topic.
    pub kafka_duplicates: usize,
    /// The sequence crashed, killed or cut a store: at-least-once may duplicate.
    pub duplicates_allowed: bool,
    /// `kafka.delivery = exactly-once`: no duplicate in the log, whatever the faults.
    pub exactly_once: bool,
    /// Events went DEAD and were requeued by hand: their first sighting may follow later
    /// events of their key (docs/consuming-events.md).
    pub requeued_by_hand: bool,
    /// The W the cutover must seed.
    pub cutover_w: Option<i64>,
    /// Rows the DB owner purged (or dropped in a rotation), up to this id.
    pub purged_to: i64,
    /// Replays.
    pub replays: Vec<Replayed>,
    /// Approved skips.
    pub skips: Vec<Skip>,
    /// Rows the DB owner deleted and restored (a recover-backfill step).
    pub owner_deleted: BTreeSet<i64>,
    /// Of those, the rows that carried their mark when deleted.
    pub deleted_marked: BTreeSet<i64>,
    /// When the service may have been stalled by a fault ([`super::ops_timing::stalled`]).
    pub stalls: super::ops_timing::Stalls,
    /// Held inserts the harness's own sampler saw W pass while they were still open, and
    /// when ([`super::operator_actions`]'s sampler): released holes, so LATE for sure.
    pub passed_open: BTreeMap<i64, std::time::Instant>,
    /// Per record, the sampler's sample in which it was first seen terminal
    /// ([`super::ops_sampler::Outcome::first_done`]).
    pub first_done: std::collections::HashMap<i64, usize>,
    /// The timing facts' counts (must/either), for the sequence's line.
    pub timing_line: String,
    /// Rows `recover-backfill` rescheduled.
    pub recovered: Vec<i64>,
    /// Events requeued.
    pub requeued: BTreeSet<i64>,
    /// Events requeued while a takeover ran (a pair): each reaches the topic once (exactly-once;
    /// at least once otherwise), in event order within its key.
    pub requeued_across_takeover: Vec<i64>,
    /// Process exits: (instance, expected, seen).
    pub exits: Vec<(String, Exit, Option<ExitStatus>)>,
    /// Actions by kind.
    pub actions: BTreeMap<&'static str, usize>,
    /// Actions that found nothing to act on, by kind.
    pub idle: BTreeMap<&'static str, usize>,
    /// Operator actions against the model's prediction of their effect, by kind.
    pub effects: BTreeMap<&'static str, Tally>,
    /// Everything that broke the model or an invariant.
    pub violations: Vec<String>,
}

impl Model {
    /// Counts an action.
    pub fn acted(&mut self, kind: &'static str) {
        *self.actions.entry(kind).or_default() += 1;
    }

    /// Counts an action that had nothing to act on.
    pub fn idle(&mut self, kind: &'static str) {
        *self.idle.entry(kind).or_default() += 1;
    }

    /// Judges an operator action against the model's prediction of its effect
    /// ([`super::ops_effect`]): predicted effective and no effect is a violation.
    pub fn effect(&mut self, kind: &'static str, predict: Predict, took: bool, what: &str) {
        if !took {
            self.idle(kind);
        }
        if let Some(v) = judge(&mut self.effects, kind, &predict, took, what) {
            self.violation(v);
        }
    }

    /// Records a violation.
    pub fn violation(&mut self, what: impl Into<String>) {
        let what = what.into();
        eprintln!("ops: VIOLATION {what}");
        self.violations.push(what);
    }

    /// Records how a process ended.
    pub fn exited(&mut self, name: &str, expected: Exit, seen: Option<ExitStatus>) {
        let ok = match (expected, seen) {
            (Exit::Killed, Some(s)) => s.signal() == Some(9),
            (Exit::Term, Some(s)) => s.code() == Some(0),
            (Exit::Fenced, Some(s)) => s.code() == Some(1),
            (Exit::Aborted, Some(s)) => s.signal() == Some(6),
            (_, None) => false,
        };
        if !ok {
            self.violation(format!("{name}: expected {expected:?}, got {seen:?}"));
        }
        self.exits.push((name.to_string(), expected, seen));
    }

    /// After the DB owner's purge up to `boundary`: every row of the test it deleted carried
    /// its mark when deleted (`deleted`: id and mark, the DB owner's own record read under the
    /// purge's lock, never the service's word), unless it is skipped stock (SPEC §5: marks
    /// before purge).
    pub async fn check_purge(
        &mut self,
        env: &TestEnv,
        boundary: i64,
        deleted: &[(i64, Option<String>)],
        written: &HashSet<i64>,
    ) {
        let unmarked: Vec<i64> = deleted
            .iter()
            .filter(|(id, mark)| mark.is_none() && written.contains(id))
            .map(|(id, _)| *id)
            .filter(|id| !self.skipped_stock.contains(id))
            .collect();
        if !unmarked.is_empty() {
            let states = states_of(env, &unmarked).await;
            self.violation(format!(
                "purge up to READY boundary {boundary} deleted rows that were not marked: \
                 {states}"
            ));
        }
        self.purged_to = self.purged_to.max(boundary);
    }

    /// The operator actions' own checks, once settled.
    pub async fn check_actions(&mut self, env: &TestEnv) {
        self.check_replays(env).await;
        self.check_skips(env).await;
        let confirmed: HashSet<i64> = env
            .column_for(
                "SELECT msg_id FROM proc_state_all WHERE msg_id = ANY($1) \
                   AND backfill_at IS NOT NULL",
                &self.recovered,
            )
            .await
            .into_iter()
            .collect();
        for id in self.recovered.clone() {
            if !confirmed.contains(&id) {
                self.violation(format!("recovered row {id} did not end marked"));
            }
        }
    }

    async fn check_replays(&mut self, env: &TestEnv) {
        let approved: HashSet<i64> = env
            .column("SELECT msg_id FROM proc_state WHERE terminal_reason = 'APPROVED_SKIP'")
            .await
            .into_iter()
            .collect();
        for r in self.replays.clone() {
            let rows: Vec<(i64, String, Option<i64>)> = sqlx::query_as(
                "SELECT msg_id, state, processed_seq FROM proc_state_all \
                 WHERE msg_id = ANY($1) ORDER BY msg_id",
            )
            .bind(&r.ids)
            .fetch_all(env.store.pool())
            .await
            .expect("replayed rows");
            let mut last: Option<(i64, i64)> = None;
            for (id, state, seq) in rows {
                if approved.contains(&id) {
                    continue; // an approved skip finished it after the replay
                }
                match seq {
                    Some(seq) if seq > r.seq_before && state != "PENDING" && state != "FAILED" => {
                        if let Some((prev_id, prev)) = last {
                            if prev > seq {
                                self.violation(format!(
                                    "replayed rows out of order: {prev_id} (seq {prev}) after \
                                     {id} (seq {seq})"
                                ));
                            }
                        }
                        last = Some((id, seq));
                    }
                    _ => self.violation(format!(
                        "replayed row {id} not processed again (state {state}, seq {seq:?}, \
                         replayed after seq {})",
                        r.seq_before
                    )),
                }
            }
        }
    }

    async fn check_skips(&mut self, env: &TestEnv) {
        let rows: Vec<(i64, bool, Option<i64>)> = env
            .rows(
                "SELECT p.msg_id, EXISTS (SELECT 1 FROM msg_event e WHERE e.msg_id = p.msg_id), \
                    p.processed_seq \
             FROM proc_state p WHERE p.terminal_reason = 'APPROVED_SKIP'",
            )
            .await;
        let reported: u64 = self.skips.iter().map(|s| s.skipped).sum();
        if rows.len() as u64 != reported {
            self.violation(format!(
                "approved skips reported {reported} rows, the store has {} SKIPPED(APPROVED_SKIP)",
                rows.len()
            ));
        }
        for (id, evented, _) in rows {
            if !self.skips.iter().any(|s| (s.from..=s.to).contains(&id)) {
                self.violation(format!(
                    "row {id} SKIPPED(APPROVED_SKIP) outside every skip"
                ));
            }
            if evented {
                self.violation(format!("approved-skipped row {id} raised events"));
            }
        }
    }

    /// One line: actions by kind (idle ones in brackets).
    pub fn actions_line(&self) -> String {
        self.actions
            .iter()
            .map(|(k, n)| match self.idle.get(k) {
                Some(i) => format!("{k}={n} ({i} idle)"),
                None => format!("{k}={n}"),
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// `(msg_id, state, error_class, terminal_reason, mark confirmed)`.
type StateRow = (i64, String, Option<String>, Option<String>, bool);

/// `id:STATE/class/reason/mark` of these rows, for violation messages.
async fn states_of(env: &TestEnv, ids: &[i64]) -> String {
    let rows: Vec<StateRow> = sqlx::query_as(
        "SELECT msg_id, state, error_class, terminal_reason, backfill_at IS NOT NULL \
         FROM proc_state_all WHERE msg_id = ANY($1) ORDER BY msg_id",
    )
    .bind(ids)
    .fetch_all(env.store.pool())
    .await
    .expect("states");
    let known: HashSet<i64> = rows.iter().map(|r| r.0).collect();
    let mut parts: Vec<String> = rows
        .into_iter()
        .map(|(id, st, class, reason, confirmed)| {
            format!(
                "{id}:{st}/{}/{}/{}",
                class.unwrap_or_default(),
                reason.unwrap_or_default(),
                if confirmed {
                    "confirmed"
                } else {
                    "unconfirmed"
                }
            )
        })
        .collect();
    parts.extend(
        ids.iter()
            .filter(|i| !known.contains(i))
            .map(|i| format!("{i}:no record")),
    );
    parts.join(", ")
}
