//! The reference model of what the operator actions mean, recorded as a sequence runs and
//! checked at the moments that matter (a purge) and after it settled:
//! - skipped cutover stock is never processed (no PROC_STATE row, no event);
//! - nothing is purged that was not finished (terminal, mark confirmed) or skipped stock;
//! - every replayed row was processed again, after the replay, the rows of one replay in id
//!   order;
//! - an approved skip made only unfinished rows of its range SKIPPED(APPROVED_SKIP), never
//!   processed;
//! - every terminal row is marked or abandoned with a reason; every inbox row left that is ours
//!   carries the mark (or its record is abandoned); recovered rows end marked;
//! - every event was delivered (a consumer read every `msg_event` id back);
//! - every process exit was the documented one, and no log ever says `panicked`.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::os::unix::process::ExitStatusExt as _;
use std::process::ExitStatus;

use crate::common::TestEnv;

/// How a process was expected to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// `kill -9`: killed by signal 9.
    Killed,
    /// SIGTERM: exit 0.
    Term,
    /// The old holder, thawed after a takeover: exit 1.
    Fenced,
}

/// One replay as the model saw it.
#[derive(Debug, Clone)]
pub struct Replayed {
    /// Rows the replay applied to, ascending.
    pub ids: Vec<i64>,
    /// The highest `processed_seq` before the replay ran.
    pub seq_before: i64,
}

/// The record of one sequence.
#[derive(Debug, Default)]
pub struct Model {
    /// Visible stock rows the cutover skipped: never ours.
    pub skipped_stock: BTreeSet<i64>,
    /// The W the cutover must seed.
    pub cutover_w: Option<i64>,
    /// Stock rows the cutover left to be read.
    pub read_stock: BTreeSet<i64>,
    /// Rows the DB owner purged (or dropped in a rotation), up to this id.
    pub purged_to: i64,
    /// Replays.
    pub replays: Vec<Replayed>,
    /// Approved skips: (from, to, rows the report skipped).
    pub skips: Vec<(i64, i64, u64)>,
    /// Rows `recover-backfill` rescheduled.
    pub recovered: Vec<i64>,
    /// Events requeued.
    pub requeued: BTreeSet<i64>,
    /// Process exits: (instance, expected, seen).
    pub exits: Vec<(String, Exit, Option<ExitStatus>)>,
    /// Actions by kind.
    pub actions: BTreeMap<&'static str, usize>,
    /// Actions that found nothing to act on, by kind.
    pub idle: BTreeMap<&'static str, usize>,
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
            (_, None) => false,
        };
        if !ok {
            self.violation(format!("{name}: expected {expected:?}, got {seen:?}"));
        }
        self.exits.push((name.to_string(), expected, seen));
    }

    /// At the moment the DB owner purges `ids` (inbox rows up to a READY boundary): each must be
    /// finished — terminal with its mark confirmed — or skipped cutover stock.
    pub async fn check_purge(&mut self, env: &TestEnv, boundary: i64, ids: &[i64]) {
        let finished: HashSet<i64> = env
            .column_for(
                "SELECT msg_id FROM proc_state_all WHERE msg_id = ANY($1) \
               AND state IN ('SUCCEEDED','SKIPPED','DEAD') AND backfill_at IS NOT NULL",
                ids,
            )
            .await
            .into_iter()
            .collect();
        let unfinished: Vec<i64> = ids
            .iter()
            .filter(|id| !finished.contains(id) && !self.skipped_stock.contains(id))
            .copied()
            .collect();
        if !unfinished.is_empty() {
            let states = states_of(env, &unfinished).await;
            self.violation(format!(
                "purge up to READY boundary {boundary} takes rows that are not finished: {states}"
            ));
        }
        self.purged_to = self.purged_to.max(boundary);
    }

    /// Every check that needs the settled end state.
    pub async fn check_settled(&mut self, env: &TestEnv, consumed: &HashSet<i64>) {
        self.check_stock(env).await;
        self.check_replays(env).await;
        self.check_skips(env).await;
        self.check_marks(env).await;
        self.check_events(env, consumed).await;
    }

    async fn check_stock(&mut self, env: &TestEnv) {
        let stock: Vec<i64> = self.skipped_stock.iter().copied().collect();
        let processed: Vec<i64> = env
            .column_for(
                "SELECT msg_id FROM proc_state_all WHERE msg_id = ANY($1)",
                &stock,
            )
            .await;
        if !processed.is_empty() {
            let states = states_of(env, &processed).await;
            self.violation(format!("skipped cutover stock was processed: {states}"));
        }
        let read: Vec<i64> = self.read_stock.iter().copied().collect();
        let done: HashSet<i64> = env
            .column_for(
                "SELECT msg_id FROM proc_state_all WHERE msg_id = ANY($1) \
               AND state IN ('SUCCEEDED','SKIPPED','DEAD')",
                &read,
            )
            .await
            .into_iter()
            .collect();
        let missing: Vec<i64> = read.into_iter().filter(|i| !done.contains(i)).collect();
        if !missing.is_empty() {
            self.violation(format!(
                "stock the cutover reads was not processed: {missing:?}"
            ));
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
        let reported: u64 = self.skips.iter().map(|s| s.2).sum();
        if rows.len() as u64 != reported {
            self.violation(format!(
                "approved skips reported {reported} rows, the store has {} SKIPPED(APPROVED_SKIP)",
                rows.len()
            ));
        }
        for (id, evented, _) in rows {
            if !self.skips.iter().any(|(f, t, _)| (*f..=*t).contains(&id)) {
                self.violation(format!(
                    "row {id} SKIPPED(APPROVED_SKIP) outside every skip"
                ));
            }
            if evented {
                self.violation(format!("approved-skipped row {id} raised events"));
            }
        }
    }

    async fn check_marks(&mut self, env: &TestEnv) {
        let unconfirmed: Vec<i64> = env
            .column(
                "SELECT msg_id FROM proc_state WHERE state IN ('SUCCEEDED','SKIPPED','DEAD') \
               AND backfill_at IS NULL AND backfill_abandon_reason IS NULL ORDER BY msg_id",
            )
            .await;
        if !unconfirmed.is_empty() {
            self.violation(format!(
                "terminal rows neither marked nor abandoned: {unconfirmed:?}"
            ));
        }
        let open: Vec<i64> = env
            .column(
                "SELECT msg_id FROM proc_state WHERE state IN ('PENDING','FAILED') ORDER BY msg_id",
            )
            .await;
        if !open.is_empty() {
            self.violation(format!("rows never finished: {open:?}"));
        }
        let inbox: Vec<(i64, Option<String>)> = sqlx::query_as(
            "SELECT CMINMSGS_ID, CAST(CMINMSGS_STATUS AS CHAR) FROM CMINMSGS ORDER BY 1",
        )
        .fetch_all(&env.owner)
        .await
        .expect("inbox");
        let abandoned: HashSet<i64> = env
            .column("SELECT msg_id FROM proc_state WHERE backfill_abandon_reason IS NOT NULL")
            .await
            .into_iter()
            .collect();
        let unmarked: Vec<i64> = inbox
            .iter()
            .filter(|(id, st)| {
                st.as_deref() != Some("PROCESSED")
                    && !self.skipped_stock.contains(id)
                    && !abandoned.contains(id)
            })
            .map(|r| r.0)
            .collect();
        if !unmarked.is_empty() {
            self.violation(format!("inbox rows of ours left unmarked: {unmarked:?}"));
        }
        for id in self.recovered.clone() {
            if abandoned.contains(&id) {
                self.violation(format!("recovered row {id} is abandoned again"));
            }
        }
    }

    async fn check_events(&mut self, env: &TestEnv, consumed: &HashSet<i64>) {
        let events: Vec<(i64, String)> = env
            .rows("SELECT event_id, state FROM msg_event ORDER BY event_id")
            .await;
        let undelivered: Vec<String> = events
            .iter()
            .filter(|(id, st)| st != "SENT" || !consumed.contains(id))
            .map(|(id, st)| format!("{id}:{st}"))
            .collect();
        if !undelivered.is_empty() {
            self.violation(format!(
                "events not delivered (id:state, not read back by a consumer): {undelivered:?}"
            ));
        }
        for id in self.requeued.clone() {
            if !consumed.contains(&id) {
                self.violation(format!("requeued event {id} never reached the topic"));
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
