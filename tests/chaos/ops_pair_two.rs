//! Two operator CLI calls of ours at once, their transactions proven open together at the
//! database ([`super::ops_gate::hold_both`], issue 52 item 3):
//!
//! - **skip ∥ replay on the same rows**: the replay's rows (DEAD, by the model) and an approved
//!   skip of exactly their range. Both wait on the pipeline lock the harness holds; PostgreSQL
//!   then grants it in the order they came, which the harness reads from the activity view
//!   (each waiting statement's start). The replay first: its rows are PENDING again when the
//!   skip locks them, so the skip must make every one SKIPPED(APPROVED_SKIP) (no events, even
//!   for the row whose text the DB owner corrected). The skip first: they are DEAD then, the
//!   skip cannot take them, and the replay processes them again. Too close to call: either,
//!   and the end check takes the service's answer only for those rows.
//! - **replay ∥ requeue**: with the events topic back and events DEAD, the replay (waiting on
//!   the pipeline lock) and `events requeue` (waiting on the DEAD events' rows, which it locks
//!   first) at once; each is judged as when it runs alone.

use std::collections::BTreeSet;
use std::time::Duration;

use super::ops_gate::{hold_both, Proof};
use super::ops_pair_more::timed;
use super::ops_requeue::requeue_args;
use super::ops_steps::{skip_args, SkipPlan};
use super::Seq;
use crate::common::instance::CliOut;
use crate::ops_effect::Predict;

/// How much later the second CLI of skip ∥ replay starts.
const STAGGER: Duration = Duration::from_millis(300);

impl Seq {
    /// The variables of a pair's CLI call named `app` in PostgreSQL's activity view.
    fn named(&self, app: &str) -> Vec<(String, String)> {
        let mut direct = self.direct.clone();
        direct.push(("PGAPPNAME".into(), app.to_string()));
        direct
    }

    /// A pair's pause point inside the second action's open window (`during`, begun at
    /// `opened`), if a pair set one: the gate's row lock, held until the first action's
    /// transaction is seen waiting on it (proof said or recorded); release it when the window
    /// closes.
    pub(super) async fn pause_for_pair(
        &mut self,
        opened: std::time::Instant,
        during: &str,
    ) -> Option<sqlx::Transaction<'static, sqlx::Postgres>> {
        let gate = self.gate.take()?;
        let (lock, proof) = gate
            .hold_until_seen(self.env.store.pool(), opened, during)
            .await;
        self.proven(proof);
        lock
    }

    /// A pair's proof, said or recorded as a harness failure.
    fn proven(&mut self, proof: Proof) {
        match proof {
            Proof::Seen(line) => eprintln!("ops: pair proven at the database: {line}"),
            Proof::Missed(why) => self.model.violation(format!(
                "harness: pair overlap not proven at the database: {why}"
            )),
        }
    }

    fn no_panic(&mut self, what: &str, out: &CliOut) {
        if out.all().contains("panicked") {
            let all = out.all();
            self.model
                .violation(format!("`msgexchange {what}` panicked: {all}"));
        }
    }

    /// Skip ∥ replay on the replay's rows (see the module's text).
    pub(super) async fn skip_with_replay(&mut self, by_class: bool, max_rows: usize) {
        self.model.acted("skip");
        self.model.acted("replay");
        let Some(r) = self.replay_prepare(by_class, max_rows).await else {
            return; // judged already: no row went DEAD
        };
        let (Some(from), Some(to)) = (r.expect.first().copied(), r.expect.last().copied()) else {
            return;
        };
        let apps = [
            format!("msgx-pair-{}-skip", self.tag),
            format!("msgx-pair-{}-replay", self.tag),
        ];
        let (da, db) = (self.named(&apps[0]), self.named(&apps[1]));
        let (sa, ra) = (skip_args(from, to), r.args.clone());
        // One CLI starts a little after the other (which one alternates with the plan), so
        // that the order is usually clear; the harness still reads it from the database.
        let (wa, wb) = if max_rows % 2 == 1 {
            (STAGGER, Duration::ZERO)
        } else {
            (Duration::ZERO, STAGGER)
        };
        let later = |wait: Duration, direct: Vec<(String, String)>, args: Vec<String>| async move {
            tokio::time::sleep(wait).await;
            timed(direct, args).await
        };
        let run = async { tokio::join!(later(wa, da, sa), later(wb, db, ra)) };
        let pool = self.env.store.pool().clone();
        let ((skip, replay), proof, first) = hold_both(&pool, [&apps[0], &apps[1]], &[], run).await;
        self.proven(proof);
        self.no_panic("skip", &skip.2);
        self.no_panic("replay", &replay.2);
        let asked: BTreeSet<i64> = r.expect.clone();
        let applied = self.replay_judge(r, replay.2);
        let plan = match first {
            Some(1) => SkipPlan::over(
                from,
                to,
                Predict::Effective(format!(
                    "the replay took the pipeline lock first (it waited first): its rows \
                     {applied:?} are PENDING when the skip locks them"
                )),
                applied,
                BTreeSet::new(),
            ),
            Some(_) => SkipPlan::over(
                from,
                to,
                Predict::Either(
                    "the skip took the pipeline lock first: the replay's rows were DEAD then; \
                     other rows of the range may be unfinished"
                        .into(),
                ),
                Vec::new(),
                asked,
            ),
            None => SkipPlan::over(
                from,
                to,
                Predict::Either("both waited within the margin: their order is unknown".into()),
                Vec::new(),
                BTreeSet::new(),
            ),
        };
        eprintln!(
            "ops: pair: skip {from}..{to} ∥ replay, first to wait: {}",
            first.map_or("unknown", |i| if i == 0 { "skip" } else { "replay" })
        );
        self.skip_judge(plan, skip.0, skip.2).await;
    }

    /// Replay ∥ `events requeue` (see the module's text). Without an outage the requeue is
    /// idle and the replay runs alone.
    pub(super) async fn replay_with_requeue(&mut self, by_class: bool, max_rows: usize) {
        self.model.acted("replay");
        self.model.acted("requeue");
        if !self.plan.dispatch_outage {
            let why = "the events topic was there from the start: nothing goes DEAD".to_string();
            self.model.effect("requeue", Predict::Idle(why), false, "");
            return self.replay(by_class, max_rows).await;
        }
        let before = self.model.requeued.len();
        let dead = self.requeue_prepare().await;
        let Some(r) = self.replay_prepare(by_class, max_rows).await else {
            self.requeue_until_none_dead().await;
            return self.requeue_effect(dead, before, "");
        };
        let ids = self.dead_event_ids().await;
        if ids.is_empty() {
            let args: Vec<&str> = r.args.iter().map(String::as_str).collect();
            let out = self.cli(&args).await;
            self.replay_judge(r, out);
        } else {
            let events: Vec<i64> = ids.iter().filter_map(|i| i.parse().ok()).collect();
            let apps = [
                format!("msgx-pair-{}-replay", self.tag),
                format!("msgx-pair-{}-requeue", self.tag),
            ];
            let (da, db) = (self.named(&apps[0]), self.named(&apps[1]));
            let (ra, qa) = (r.args.clone(), requeue_args(&ids));
            let run = async { tokio::join!(timed(da, ra), timed(db, qa)) };
            let pool = self.env.store.pool().clone();
            let ((replay, requeue), proof, _) =
                hold_both(&pool, [&apps[0], &apps[1]], &events, run).await;
            self.proven(proof);
            self.no_panic("replay", &replay.2);
            self.no_panic("events requeue", &requeue.2);
            self.replay_judge(r, replay.2);
            let requeued = self.requeue_judge(&requeue.2);
            eprintln!("ops: pair: requeued {requeued:?} beside a replay");
        }
        self.requeue_until_none_dead().await;
        self.requeue_effect(dead, before, " (beside a replay)");
    }
}
