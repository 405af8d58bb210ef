//! Two more pairs of operator actions at once (issue 41 item 3), timed like
//! [`super::ops_pair`]'s: an approved skip's CLI call while `cutover plan` runs on the live
//! store (read-only: it must change nothing, and the skip is judged as when it runs alone),
//! and `events requeue` while a hot standby takes the service over (the call starts once the
//! active instance is frozen; the requeued events must reach the topic once each, in order of
//! their key, sent by the new instance — checked at the end, `ops_check`).

use std::sync::Arc;
use std::time::Instant;

use super::ops_requeue::requeue_args;
use super::Seq;
use crate::common::instance::{cli, CliOut};
use crate::ops_effect::Predict;
use crate::ops_plan::Step;

/// `cutover plan` as the operator runs it on a live store.
const CUTOVER_PLAN: [&str; 5] = ["cutover", "plan", "--mode", "max", "--json"];

/// A CLI call with these variables and arguments, and when it started and ended.
pub(super) async fn timed(
    direct: Vec<(String, String)>,
    args: Vec<String>,
) -> (Instant, Instant, CliOut) {
    let a0 = Instant::now();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = cli(&direct, &args).await;
    (a0, Instant::now(), out)
}

impl Seq {
    /// Skip ∥ `cutover plan`: the skip prepared (blocker, followers, W past them), then both
    /// CLI calls at once.
    pub(super) async fn skip_with_cutover_plan(&mut self, followers: usize, before: usize) {
        self.model.acted("skip");
        self.model.acted("cutover_plan");
        let Some(prep) = self.skip_prepare(followers, before).await else {
            // Judged already (W did not pass); the cutover plan still runs.
            return self.cutover_plan_live().await;
        };
        let snap = self.cutover_snapshot().await;
        let plan_args = CUTOVER_PLAN.map(String::from).to_vec();
        let ((a0, a1, skip), (b0, b1, plan)) = tokio::join!(
            timed(self.direct.clone(), prep.args.clone()),
            timed(self.direct.clone(), plan_args)
        );
        self.judge_spans("skip", (a0, a1), "cutover plan", Some((b0, b1)));
        self.skip_judge(prep, a0, skip).await;
        self.cutover_plan_judge(&plan, &snap).await;
    }

    /// `cutover plan` alone on the live store.
    pub(super) async fn cutover_plan_live(&mut self) {
        let snap = self.cutover_snapshot().await;
        let out = self.cli(&CUTOVER_PLAN).await;
        self.cutover_plan_judge(&out, &snap).await;
    }

    /// `cutover plan` on a store the service runs on answers (exit 0) that the seeding would
    /// not be applied (the store is seeded or not fresh), and changes nothing the cutover owns.
    async fn cutover_plan_judge(&mut self, out: &CliOut, snap: &str) {
        if out.all().contains("panicked") {
            let all = out.all();
            self.model
                .violation(format!("`msgexchange cutover plan` panicked: {all}"));
        }
        let plan = out.json();
        if out.code != Some(0) || plan["refused"].is_null() {
            self.model.violation(format!(
                "cutover plan on the live store: expected exit 0 and the seeding not applicable, \
                 got exit {:?}: {}",
                out.code,
                out.all()
            ));
        }
        if self.cutover_snapshot().await != snap {
            self.model
                .violation("cutover plan on the live store changed the store".to_string());
        }
    }

    /// What a cutover writes and nothing else does on a live store: the seeding's rows, its
    /// gaps, the cursor's seeding time, the cutover's audit entries.
    async fn cutover_snapshot(&self) -> String {
        sqlx::query_scalar(
            "SELECT concat_ws('|', (SELECT row_to_json(c)::text FROM cutover_stock c), \
                    (SELECT string_agg(first_id || '-' || last_id, ',' ORDER BY first_id) \
                       FROM cutover_gap), \
                    (SELECT count(*) FROM audit_log WHERE action ILIKE '%cutover%'))",
        )
        .fetch_one(self.env.store.pool())
        .await
        .expect("cutover snapshot")
    }

    /// Requeue ∥ takeover: with the events topic back and events DEAD, the requeue's CLI call
    /// runs once the takeover froze the active instance. Idle without an outage.
    pub(super) async fn requeue_across_takeover(&mut self) {
        self.model.acted("requeue");
        if !self.plan.dispatch_outage {
            let why = "the events topic was there from the start: nothing goes DEAD".to_string();
            self.model.effect("requeue", Predict::Idle(why), false, "");
            return self.step(&Step::Takeover).await;
        }
        let before = self.model.requeued.len();
        let dead = self.requeue_prepare().await;
        let ids = self.dead_event_ids().await;
        if ids.is_empty() {
            self.step(&Step::Takeover).await;
        } else {
            let frozen = Arc::new(tokio::sync::Notify::new());
            self.on_freeze = Some(frozen.clone());
            let (direct, args) = (self.direct.clone(), requeue_args(&ids));
            let run = async move {
                frozen.notified().await;
                timed(direct, args).await
            };
            let ((a0, a1, out), ()) = tokio::join!(run, self.step(&Step::Takeover));
            let span = self.takeover_span.take();
            self.judge_spans("requeue", (a0, a1), "takeover", span);
            if out.all().contains("panicked") {
                let all = out.all();
                self.model
                    .violation(format!("`msgexchange events requeue` panicked: {all}"));
            }
            let requeued = self.requeue_judge(&out);
            eprintln!("ops: pair: requeued {requeued:?} across the takeover");
            self.model.requeued_across_takeover.extend(requeued);
        }
        self.requeue_until_none_dead().await;
        self.requeue_effect(dead, before, " (across a takeover)");
    }
}
