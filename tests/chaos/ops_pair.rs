//! Two operator actions at once (issue 41 item 3; skip ∥ `cutover plan` and requeue ∥
//! takeover are in [`super::ops_pair_more`]): a replay, a recover-backfill or an approved
//! skip, prepared first, has its CLI call run while the DB owner's purge runs
//! (`purge-readiness`, then the delete up to its READY boundary), inside the purge's open
//! transaction ([`super::ops_gate`]). Both are timed; the overlap must have happened (a pair
//! whose two spans did not meet is a failure of the harness, not a pass), and each action is
//! judged as when it runs alone — the purge against the model's bounds and the marks of what
//! it deleted, the replay against the rows it was asked for, the recover against the row the
//! owner restored — while the end check judges every row they touched.

use std::time::{Duration, Instant};

use super::ops_gate::Gate;
use super::ops_steps::{recover_args, ReplayPlan, SkipPlan};
use super::Seq;
use crate::common::instance::cli;
use crate::ops_plan::Step;

/// The first action of a pair, ready to run.
enum First {
    Replay(ReplayPlan),
    Recover(i64, crate::ops_effect::Predict),
    Skip(SkipPlan),
}

impl Seq {
    pub(super) async fn pair(&mut self, first: &Step, second: &Step) {
        match (first, second) {
            (Step::Skip { followers, before }, Step::CutoverPlan) => {
                return self.skip_with_cutover_plan(*followers, *before).await;
            }
            (Step::Requeue, Step::Takeover) => return self.requeue_across_takeover().await,
            (Step::Skip { .. }, Step::Replay { by_class, max_rows }) => {
                return self.skip_with_replay(*by_class, *max_rows).await;
            }
            (Step::Replay { by_class, max_rows }, Step::Requeue) => {
                return self.replay_with_requeue(*by_class, *max_rows).await;
            }
            _ => {}
        }
        self.model.acted(first.kind());
        // A held commit of an earlier step would make the purge wait first, past the other
        // action: it ends before the pair starts.
        self.holds_done().await;
        let prepared = match first {
            Step::Replay { by_class, max_rows } => self
                .replay_prepare(*by_class, *max_rows)
                .await
                .map(First::Replay),
            Step::RecoverBackfill => self
                .recover_prepare()
                .await
                .map(|(id, p)| First::Recover(id, p)),
            Step::Skip { followers, before } => self
                .skip_prepare(*followers, *before)
                .await
                .map(|p| First::Skip(p.started_late())),
            other => panic!("a pair's first action is a replay, a recover or a skip: {other:?}"),
        };
        let Some(prepared) = prepared else {
            // Judged idle or failed already; the purge still runs.
            self.step(second).await;
            return;
        };
        let (args, rows) = match &prepared {
            First::Replay(r) => (r.args.clone(), r.expect.iter().copied().collect()),
            First::Recover(id, _) => (recover_args(*id), vec![*id]),
            First::Skip(p) => (p.args.clone(), p.queued.clone()),
        };
        let purged_before = self.model.purged_to;
        let mut direct = self.direct.clone();
        // The pause point (issue 52 item 3): the first action starts once the purge's inbox
        // transaction is open, and is proven to run inside it at the database.
        let gate = matches!(second, Step::Purge | Step::Rotate).then(|| {
            let g = Gate::new(rows, &self.tag);
            if matches!(prepared, First::Skip(_)) {
                g.with_pipeline_lock()
            } else {
                g
            }
        });
        if let Some(g) = &gate {
            direct.push(("PGAPPNAME".into(), g.app.clone()));
        }
        let go = gate.as_ref().map(|g| g.go.clone());
        self.gate = gate;
        let run_first = async move {
            if let Some(go) = go {
                // The purge tells when (its transaction open, or nothing to delete).
                let _ = tokio::time::timeout(Duration::from_secs(120), go.notified()).await;
            }
            let a0 = Instant::now();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = cli(&direct, &args).await;
            (a0, Instant::now(), out)
        };
        self.pair_running = true;
        let second_then_open = async {
            self.step(second).await;
            // A purge that deleted nothing never opened its transaction: the first action
            // starts now, after it (nothing ran beside it to judge).
            let idle = self.gate.take();
            if let Some(g) = &idle {
                g.go.notify_one();
            }
            idle.is_some()
        };
        let ((a0, a1, out), purge_idle) = tokio::join!(run_first, second_then_open);
        self.pair_running = false;
        if purge_idle {
            self.purge_span = None;
            eprintln!(
                "ops: pair: the purge found nothing to delete; {} ran after it",
                first.kind()
            );
        } else {
            self.judge_overlap(first.kind(), (a0, a1), second.kind());
        }
        if out.all().contains("panicked") {
            self.model
                .violation(format!("`msgexchange` panicked: {}", out.all()));
        }
        match prepared {
            First::Replay(r) => {
                self.replay_judge(r, out);
                self.replayed_under_purge(purged_before);
            }
            First::Recover(id, p) => self.recover_judge(id, p, out),
            First::Skip(p) => self.skip_judge(p, a0, out).await,
        }
    }

    /// A row the replay took back that the purge deleted — READY when `purge-readiness`
    /// answered (DEAD and marked), PENDING again by the time the DB owner deleted it, marked
    /// all along — is processed again from our raw copy and its new sweep finds the row gone:
    /// confirmed, as any row purged after its mark (the replay kept when the mark was
    /// confirmed, migration 0021); never abandoned MISSING_ROW (the check of every row).
    fn replayed_under_purge(&mut self, purged_before: i64) {
        let to = self.model.purged_to;
        let Some(r) = self.model.replays.last() else {
            return;
        };
        let covered: Vec<i64> = r
            .ids
            .iter()
            .copied()
            .filter(|id| *id > purged_before && *id <= to)
            .collect();
        if !covered.is_empty() {
            eprintln!("ops: pair: replayed rows {covered:?} under the purge up to {to}");
        }
    }

    /// The first action's CLI span against the purge's (its readiness call to its delete): they
    /// must meet.
    fn judge_overlap(&mut self, first: &str, a: (Instant, Instant), second: &str) {
        let span = self.purge_span.take();
        self.judge_spans(first, a, second, span);
    }

    /// Two actions' spans (`second`'s as it recorded it, if it did): they must meet.
    pub(super) fn judge_spans(
        &mut self,
        first: &str,
        (a0, a1): (Instant, Instant),
        second: &str,
        span: Option<(Instant, Instant)>,
    ) {
        let Some((b0, b1)) = span else {
            self.model.violation(format!(
                "harness: pair {first} ∥ {second}: the {second} recorded no span"
            ));
            return;
        };
        let at = |t: Instant| t.saturating_duration_since(a0.min(b0)).as_millis();
        let what = format!(
            "{first} {}..{} ms, {second} {}..{} ms",
            at(a0),
            at(a1),
            at(b0),
            at(b1)
        );
        if a0 < b1 && b0 < a1 {
            eprintln!("ops: pair overlapped: {what}");
        } else {
            self.model.violation(format!(
                "harness: pair {first} ∥ {second} did not overlap: {what}"
            ));
        }
    }
}
