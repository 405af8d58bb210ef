//! The operator procedures on the pipeline's rows, each as a site runs it through the real
//! `msgexchange` CLI (replay, approved skip, recover-backfill after the DB owner deleted and
//! restored a row), with the reads of the store they need. Each records what it did in the
//! model. A replay, a skip and a recover are split at their CLI call so that a pair
//! ([`super::ops_pair`]) can run it while another action runs.

use std::collections::{BTreeSet, HashSet};
use std::time::{Duration, Instant};

use super::{KeptRow, Seq, ACTOR, REPLAYABLE, TICKET};
use crate::common::instance::CliOut;
use crate::ops_effect::Predict;
use crate::ops_model::{Replayed, Skip};
use crate::ops_msgs::Msg;

/// The least time an unknown type takes from commit to DEAD(EXHAUSTED) in the test's
/// settings: `processing.max_attempts` 6 (the sequence's own) failed attempts, retried after
/// 100 ms doubling to 500 ms (`processing.retry_*`, no jitter): 100+200+400+500+500 ms.
const EXHAUST_MIN: Duration = Duration::from_millis(1700);

/// Generous time from an unknown type's commit (or replay) to DEAD(EXHAUSTED) when no fault
/// stalls the service: its own retries ([`EXHAUST_MIN`]) behind whatever queued ahead of it in
/// a sequence (held commits released within `max_commit_delay`, other unknown types).
const DEAD_BY: Duration = Duration::from_secs(30);

/// The class the model predicts for a poisoned unknown type (SPEC §4, App. A).
const DEAD_CLASS: &str = "EXHAUSTED";

/// Time left for the skip CLI to start and apply before the blocker could be poisoned.
const SKIP_CLI_MARGIN: Duration = Duration::from_millis(1100);

/// A skip ready to run: its CLI arguments and what the model expects of it.
pub(super) struct SkipPlan {
    pub args: Vec<String>,
    predict: Predict,
    /// The blocker and its followers.
    pub queued: Vec<i64>,
    from: i64,
    to: i64,
    /// Rows of its range the model knows it cannot take (not unfinished when it ran).
    excluded: BTreeSet<i64>,
}

impl SkipPlan {
    /// A skip of `from..=to` with this prediction: it must catch `queued` (when predicted
    /// effective) and cannot take `excluded`.
    pub fn over(
        from: i64,
        to: i64,
        predict: Predict,
        queued: Vec<i64>,
        excluded: BTreeSet<i64>,
    ) -> SkipPlan {
        SkipPlan {
            args: skip_args(from, to),
            predict,
            queued,
            from,
            to,
            excluded,
        }
    }

    /// The skip's CLI starts only once a purge beside it has answered its readiness and
    /// opened its transaction ([`super::ops_pair`]): however young the blocker was when the
    /// skip was prepared, it may be poisoned (and its followers processed) by then, so the
    /// model cannot say which rows the skip catches — its facts decide them at the end
    /// (`ops_timing`), and the skip must still make only unfinished rows of its range
    /// SKIPPED(APPROVED_SKIP).
    pub fn started_late(mut self) -> SkipPlan {
        if matches!(self.predict, Predict::Effective(_)) {
            self.predict = Predict::Either(
                "the skip's CLI waited for the purge beside it to open its transaction: the \
                 blocker may be poisoned meanwhile"
                    .into(),
            );
        }
        self
    }
}

/// A replay ready to run: its CLI arguments and what the model expects of it.
pub(super) struct ReplayPlan {
    pub args: Vec<String>,
    pub expect: BTreeSet<i64>,
    /// Rows the model predicts DEAD.
    predicted: HashSet<i64>,
    by_class: bool,
    /// The highest `processed_seq` before the replay ran.
    seq_before: i64,
    /// How far the owner had purged when the DEAD rows were listed.
    purged_before: i64,
    /// The asked row whose text the DB owner corrected before the replay, and what it was.
    corrected: Option<(i64, Msg)>,
}

impl Seq {
    pub(super) async fn state(&self, id: i64) -> Option<(String, Option<String>, bool)> {
        sqlx::query_as(
            "SELECT state, backfill_abandon_reason, backfill_at IS NOT NULL \
             FROM proc_state WHERE msg_id = $1",
        )
        .bind(id)
        .fetch_optional(self.env.store.pool())
        .await
        .expect("state")
    }

    pub(super) async fn max_seq(&self) -> i64 {
        sqlx::query_scalar("SELECT COALESCE(max(processed_seq), 0) FROM proc_state")
            .fetch_one(self.env.store.pool())
            .await
            .expect("max seq")
    }

    pub(super) async fn in_inbox(&self, ids: &[i64]) -> HashSet<i64> {
        if ids.is_empty() {
            return HashSet::new();
        }
        let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
        sqlx::query_scalar(&format!(
            "SELECT CMINMSGS_ID FROM CMINMSGS WHERE CMINMSGS_ID IN ({list})"
        ))
        .fetch_all(&self.env.owner)
        .await
        .expect("inbox ids")
        .into_iter()
        .collect()
    }

    /// DEAD rows of a replayable class whose raw text is still in the inbox: (id, class).
    pub(super) async fn dead_rows(&self) -> Vec<(i64, String)> {
        let rows: Vec<(i64, String)> = sqlx::query_as(&format!(
            "SELECT msg_id, error_class FROM proc_state WHERE state = 'DEAD' \
               AND error_class IN ({REPLAYABLE}) ORDER BY msg_id"
        ))
        .fetch_all(self.env.store.pool())
        .await
        .expect("dead rows");
        let present = self
            .in_inbox(&rows.iter().map(|r| r.0).collect::<Vec<_>>())
            .await;
        rows.into_iter()
            .filter(|r| present.contains(&r.0))
            .collect()
    }

    /// Rows the model predicts DEAD of a replayable class: every committed unknown type the
    /// test wrote that is ours (not skipped stock) — UNSUPPORTED, retried, poisoned to
    /// DEAD(EXHAUSTED) (SPEC §4, App. A). Nothing else the test writes can end so.
    fn predicted_dead(&self) -> HashSet<i64> {
        self.written()
            .iter()
            .filter(|w| w.committed && matches!(w.msg, Msg::Unknown { .. }))
            .filter(|w| !self.model.skipped_stock.contains(&w.id))
            .map(|w| w.id)
            .collect()
    }

    /// Rows the model says must be DEAD(EXHAUSTED) by now, from its own record: committed
    /// unknown types of the test (not stock, not purged, in no skip's range) whose commit or
    /// last replay is over [`DEAD_BY`] ago with no fault since. None with a legacy simulator
    /// writing (rows the model does not know may queue ahead of them).
    fn surely_dead(&self) -> BTreeSet<i64> {
        if self.model.foreign_writers {
            return BTreeSet::new();
        }
        let now = Instant::now();
        let stalls = self.faults.lock().expect("faults").clone();
        self.written()
            .iter()
            .filter(|w| matches!(w.msg, Msg::Unknown { .. }))
            .filter(|w| w.id > self.model.purged_to && !self.model.skipped_stock.contains(&w.id))
            .filter(|w| {
                !self
                    .model
                    .skips
                    .iter()
                    .any(|s| (s.from..=s.to).contains(&w.id))
            })
            .filter_map(|w| {
                let c = w.committed_at?;
                let since = self.reopened.get(&w.id).map_or(c, |r| (*r).max(c));
                Some((w.id, since))
            })
            .filter(|(_, since)| {
                now.saturating_duration_since(*since) > DEAD_BY
                    && !crate::ops_timing::stalled(&stalls, *since, now)
            })
            .map(|(id, _)| id)
            .collect()
    }

    /// Replay of DEAD rows (an unknown type of the runner's own, poisoned to DEAD(EXHAUSTED),
    /// if there is none). Predicted effective always: either DEAD rows are there, or the
    /// runner's unknown type must go DEAD within the bound. The service's DEAD list must be
    /// rows the model predicts DEAD, and what the replay applied is compared with what was
    /// asked (by ids: exactly those; by class and range: those, plus only rows the model
    /// predicts DEAD that went DEAD between the listing and the CLI).
    pub(super) async fn replay(&mut self, by_class: bool, max_rows: usize) {
        let Some(r) = self.replay_prepare(by_class, max_rows).await else {
            return;
        };
        let args: Vec<&str> = r.args.iter().map(String::as_str).collect();
        let out = self.cli(&args).await;
        self.replay_judge(r, out);
    }

    /// Everything of a replay up to its CLI call: a DEAD row to replay (the runner's own if
    /// there is none), the arguments, and what the model expects it to apply. `None`: the
    /// replay was judged already (no row went DEAD).
    pub(super) async fn replay_prepare(
        &mut self,
        by_class: bool,
        max_rows: usize,
    ) -> Option<ReplayPlan> {
        // The rows the model says must be DEAD by now, from its own record (issue 52 item 1);
        // the service's list is read only to be checked against it.
        let mut surely = self.surely_dead();
        let mut dead = self.dead_rows().await;
        if surely.is_empty() && (!self.model.foreign_writers || dead.is_empty()) {
            let m = self.runtime_unknown();
            let id = self.write(m).await;
            let dead_now = self
                .wait_until(Duration::from_secs(40), || async {
                    self.state(id).await.is_some_and(|s| s.0 == "DEAD")
                })
                .await;
            if !dead_now {
                let why = "the runner's own unknown type must end DEAD(EXHAUSTED), SPEC §4";
                let what = format!("row {id} not DEAD within 40s");
                self.model
                    .effect("replay", Predict::Effective(why.into()), false, &what);
                return None;
            }
            surely.insert(id);
            dead = self.dead_rows().await;
        }
        let predicted = self.predicted_dead();
        if !self.model.foreign_writers {
            for (id, class) in dead.iter().filter(|r| !predicted.contains(&r.0)) {
                self.model.violation(format!(
                    "the service lists row {id} DEAD({class}); the model predicts no such end"
                ));
            }
            let listed: HashSet<i64> = dead.iter().map(|r| r.0).collect();
            let unlisted: Vec<&i64> = surely.iter().filter(|i| !listed.contains(i)).collect();
            if !unlisted.is_empty() {
                self.model.violation(format!(
                    "rows {unlisted:?}: the model predicts them DEAD(EXHAUSTED) by now (an \
                     unknown type committed or replayed over {DEAD_BY:?} ago, no fault since); \
                     the service does not list them DEAD"
                ));
            }
            // The rows asked for are the model's, never the service's list.
            dead = surely
                .iter()
                .map(|id| (*id, DEAD_CLASS.to_string()))
                .collect();
        }
        let chosen: Vec<(i64, String)> = dead.iter().rev().take(max_rows).cloned().collect();
        let ids: Vec<String> = chosen.iter().map(|r| r.0.to_string()).collect();
        let (from, to) = (
            chosen.iter().map(|r| r.0).min().unwrap_or(0),
            chosen.iter().map(|r| r.0).max().unwrap_or(0),
        );
        let class = chosen[0].1.clone();
        // A replay also takes a row that raises events (issue 52 item 2): the DB owner corrects
        // the newest asked row's text first (upstream sent it again as a known type), and the
        // replay, which reads the inbox's text, must process it to the model's end — SUCCEEDED
        // with the FLIGHT_CREATED of its flight — where a row replayed without a fresh start
        // (its attempts kept) would only be poisoned again. With a legacy simulator writing the
        // asked rows are the service's list: left as they are.
        let corrected = if self.model.foreign_writers {
            None
        } else {
            let id = chosen[0].0;
            let was = self.correct_text(id).await;
            if was.is_some() {
                eprintln!("ops: replay: the DB owner corrected row {id}'s text to a FLOP");
            }
            was.map(|m| (id, m))
        };
        // What the replay must apply: the asked ids, or by class every listed row in range.
        let expect: BTreeSet<i64> = if by_class {
            dead.iter()
                .filter(|r| r.1 == class && (from..=to).contains(&r.0))
                .map(|r| r.0)
                .collect()
        } else {
            chosen.iter().map(|r| r.0).collect()
        };
        // The sampler lets these rows reopen with their first run's mark (SPEC §6 replay).
        {
            let mut replayed = self.shared.replayed.lock().expect("replayed");
            replayed.extend(expect.iter().copied());
            if by_class {
                replayed.extend(from..=to);
            }
        }
        let seq_before = self.max_seq().await;
        let mut args = vec!["replay", "--actor", ACTOR, "--reason", "ops test replay"];
        args.extend(["--ticket", TICKET, "--json"]);
        let (ids_arg, from_arg, to_arg) = (ids.join(","), from.to_string(), to.to_string());
        if by_class {
            args.extend(["--class", &class, "--from", &from_arg, "--to", &to_arg]);
            args.extend(["--state", "DEAD"]);
        } else {
            args.extend(["--ids", &ids_arg, "--expect-state", "DEAD"]);
        }
        Some(ReplayPlan {
            args: args.into_iter().map(String::from).collect(),
            expect,
            predicted,
            by_class,
            seq_before,
            purged_before: self.model.purged_to,
            corrected,
        })
    }

    /// A replay's CLI answer against the model: exactly the asked rows applied (by class, also
    /// rows the model predicts DEAD that went DEAD after the listing).
    pub(super) fn replay_judge(&mut self, mut r: ReplayPlan, out: CliOut) -> Vec<i64> {
        let corrected = r.corrected.take();
        let applied = self.replay_judge_cli(r, out);
        // A corrected row the replay did not take stays the unknown type it was.
        if let Some((id, was)) = corrected {
            if !applied.contains(&id) {
                self.uncorrect(id, was);
            }
        }
        applied
    }

    /// [`Seq::replay_judge`] of the CLI's answer; the rows it applied.
    fn replay_judge_cli(&mut self, r: ReplayPlan, out: CliOut) -> Vec<i64> {
        if out.code != Some(0) {
            self.model
                .violation(format!("replay failed: {}", out.all()));
            return Vec::new();
        }
        let report = out.json();
        let mut applied: Vec<i64> = report["rows"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["result"] == "applied")
            .filter_map(|r| r["msg_id"].as_i64())
            .collect();
        applied.sort_unstable();
        let got: BTreeSet<i64> = applied.iter().copied().collect();
        // By class, a row of the range that went DEAD after the listing (a late or replayed row
        // poisoned meanwhile) is rightly applied too: allowed only if the model predicts it DEAD.
        let extra_ok =
            |id: &i64| r.by_class && (r.predicted.contains(id) || self.model.foreign_writers);
        // A row the owner's purge (run beside the replay) deleted after the listing may have
        // been gone when the CLI read the inbox texts: with no raw copy (retention.raw_copy is
        // off in these plans) the replay rightly refuses it for want of text. Either outcome,
        // only for rows the purge deleted and only with that refusal.
        let no_text = refused_for_no_text(&report);
        let purged_meanwhile = |id: &i64| *id > r.purged_before && *id <= self.model.purged_to;
        let (excused, missing): (BTreeSet<i64>, BTreeSet<i64>) = r
            .expect
            .difference(&got)
            .partition(|id| purged_meanwhile(id) && no_text.contains(id));
        if !excused.is_empty() {
            eprintln!("ops: replay: rows {excused:?} purged beside it, refused for no raw text");
        }
        let extra: Vec<&i64> = got.difference(&r.expect).filter(|i| !extra_ok(i)).collect();
        if !missing.is_empty() || !extra.is_empty() {
            self.model.violation(format!(
                "replay applied {got:?}, the model expected {:?} (missing {missing:?}, \
                 unexpected {extra:?})",
                r.expect
            ));
        }
        let what = format!("applied {applied:?}");
        let predict = if excused.len() == r.expect.len() {
            Predict::Either(format!(
                "every asked row ({excused:?}) was purged beside the replay: applied from the \
                 text read first, or refused for no raw text"
            ))
        } else {
            Predict::Effective(format!("{} DEAD row(s) asked for", r.expect.len()))
        };
        self.model
            .effect("replay", predict, !applied.is_empty(), &what);
        let now = Instant::now();
        for id in &applied {
            self.reopened.insert(*id, now);
        }
        self.model.replays.push(Replayed {
            ids: applied.clone(),
            seq_before: r.seq_before,
        });
        applied
    }

    /// Approved skip: an unknown type holds the FIFO head, rows queue behind it; the range from
    /// `before` rows below it to its last follower is skipped once W passed it. The blocker
    /// cannot be poisoned before its retries ran out ([`EXHAUST_MIN`]); a skip that starts well
    /// inside that time must catch the blocker and every follower (FIFO: nothing passes the
    /// head). Later, the blocker may already be DEAD and the followers done: either outcome.
    pub(super) async fn skip(&mut self, followers: usize, before: usize) {
        let Some(prep) = self.skip_prepare(followers, before).await else {
            return;
        };
        let at = Instant::now();
        let args: Vec<&str> = prep.args.iter().map(String::as_str).collect();
        let out = self.cli(&args).await;
        self.skip_judge(prep, at, out).await;
    }

    /// The blocker and its followers written, W past them, the prediction made: the skip's
    /// CLI call ready to run (None: judged already, W did not pass).
    pub(super) async fn skip_prepare(
        &mut self,
        followers: usize,
        before: usize,
    ) -> Option<SkipPlan> {
        let written_at = Instant::now();
        // A skip whose range starts at the blocker gets a guard first: another unknown type
        // right below the range, the FIFO head, unfinished (retried) while the skip runs and
        // outside its range — the skip must leave it alone (a range taken from one id too low
        // would catch it: `Seq::check_skips`, the model's approved facts).
        if before == 0 {
            let g = self.runtime_unknown();
            self.write(g).await;
        }
        let m = self.runtime_unknown();
        let blocker = self.write(m).await;
        let mut to = blocker;
        let mut queued = vec![blocker];
        for _ in 0..followers {
            let m = self.runtime_flop("K");
            to = self.write(m).await;
            queued.push(to);
        }
        let from = (blocker - before as i64).max(1);
        let passed = self
            .wait_until(Duration::from_secs(20), || async {
                self.env.cursor().await.0 >= to
            })
            .await;
        if !passed {
            // W must pass committed rows with no hole below them (SPEC §3).
            let what = format!("W did not reach {to} within 20s");
            let why = "W passes committed rows, SPEC §3".to_string();
            self.model
                .effect("skip", Predict::Effective(why), false, &what);
            return None;
        }
        let age = written_at.elapsed();
        let predict = if age + SKIP_CLI_MARGIN < EXHAUST_MIN {
            Predict::Effective(format!(
                "blocker {blocker} written {age:?} before the skip, cannot be DEAD before \
                 {EXHAUST_MIN:?}: it and its {followers} follower(s) are unfinished"
            ))
        } else {
            Predict::Either(format!(
                "blocker written {age:?} before the skip: it may have been poisoned already \
                 ({EXHAUST_MIN:?} of retries) and its followers processed"
            ))
        };
        Some(SkipPlan::over(from, to, predict, queued, BTreeSet::new()))
    }

    /// The skip's CLI call (started at `at`) judged against the model's prediction.
    pub(super) async fn skip_judge(&mut self, p: SkipPlan, at: Instant, out: CliOut) {
        let SkipPlan {
            predict,
            queued,
            from,
            to,
            excluded,
            ..
        } = p;
        if out.code != Some(0) {
            self.model
                .violation(format!("skip {from}..{to} failed: {}", out.all()));
            return;
        }
        let skipped = out.json()["skipped"].as_u64().unwrap_or(0);
        if matches!(predict, Predict::Effective(_)) {
            self.check_skip_caught(&queued, skipped).await;
        }
        let caught_all = matches!(predict, Predict::Effective(_));
        let what = format!("skip {from}..{to} skipped {skipped}");
        self.model.effect("skip", predict, skipped > 0, &what);
        self.model.skips.push(Skip {
            from,
            to,
            skipped,
            queued,
            caught_all,
            at,
            excluded,
        });
    }

    /// A skip predicted to catch the blocker and its followers did: each is
    /// SKIPPED(APPROVED_SKIP), and the report counts at least them.
    async fn check_skip_caught(&mut self, queued: &[i64], skipped: u64) {
        let caught: HashSet<i64> = self
            .env
            .column_for(
                "SELECT msg_id FROM proc_state WHERE msg_id = ANY($1) \
                   AND terminal_reason = 'APPROVED_SKIP'",
                queued,
            )
            .await
            .into_iter()
            .collect();
        let not: Vec<&i64> = queued.iter().filter(|i| !caught.contains(i)).collect();
        if !not.is_empty() || skipped < queued.len() as u64 {
            self.model.violation(format!(
                "skip predicted to catch the blocker and its followers {queued:?}: not \
                 SKIPPED(APPROVED_SKIP): {not:?}; report says {skipped}"
            ));
        }
    }

    /// The DB owner deletes a row we enqueued and restores it later; the operator recovers the
    /// abandoned backfill. The model predicts from the inbox row as the owner deleted it: not
    /// marked then → the mark can never land on it → abandoned MISSING_ROW (SPEC §5), and the
    /// recover must apply; already marked → nothing to recover (idle).
    pub(super) async fn recover(&mut self) {
        let Some((id, predict)) = self.recover_prepare().await else {
            return;
        };
        let args = recover_args(id);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = self.cli(&args).await;
        self.recover_judge(id, predict, out);
    }

    /// Everything of a recover-backfill up to its CLI call: the row the DB owner deleted and
    /// restored, and the model's prediction. `None`: judged already (it never went MISSING_ROW).
    pub(super) async fn recover_prepare(&mut self) -> Option<(i64, Predict)> {
        let m = self.runtime_flop("V");
        let id = self.write(m).await;
        let enqueued = self
            .wait_until(Duration::from_secs(20), || async {
                self.state(id).await.is_some()
            })
            .await;
        if !enqueued {
            let why = "a committed row below no hole is enqueued, SPEC §3".to_string();
            let what = format!("row {id} not enqueued within 20s");
            self.model
                .effect("recover_backfill", Predict::Effective(why), false, &what);
            return None;
        }
        // The row as it is when deleted (locked, so no mark lands between copy and delete).
        let mut tx = self.env.owner.begin().await.expect("begin");
        let kept: KeptRow = sqlx::query_as(
            "SELECT CMINMSGS_ID, CMINMSGS_DATE_RECEIVED, CMINMSGS_CLOB_MSG, \
                    CMINMSGS_DATE_PROCESSED, CMINMSGS_STATUS \
             FROM CMINMSGS WHERE CMINMSGS_ID = ? FOR UPDATE",
        )
        .bind(id)
        .fetch_one(&mut *tx)
        .await
        .expect("row to delete");
        sqlx::query("DELETE FROM CMINMSGS WHERE CMINMSGS_ID = ?")
            .bind(id)
            .execute(&mut *tx)
            .await
            .expect("delete");
        tx.commit().await.expect("commit delete");
        self.model.owner_deleted.insert(id);
        if kept.4.is_some() {
            self.model.deleted_marked.insert(id);
        }
        let predict = if kept.4.is_none() {
            Predict::Effective(format!(
                "row {id} deleted unmarked: its mark finds it gone → MISSING_ROW (SPEC §5)"
            ))
        } else {
            Predict::Idle(format!("row {id} was marked before the owner deleted it"))
        };
        let settled = self
            .wait_until(Duration::from_secs(30), || async {
                self.state(id)
                    .await
                    .is_some_and(|(_, abandon, marked)| abandon.is_some() || marked)
            })
            .await;
        sqlx::query(
            "INSERT INTO CMINMSGS (CMINMSGS_ID, CMINMSGS_DATE_RECEIVED, CMINMSGS_CLOB_MSG, \
                    CMINMSGS_DATE_PROCESSED, CMINMSGS_STATUS) VALUES (?, ?, ?, ?, ?)",
        )
        .bind(kept.0)
        .bind(kept.1)
        .bind(kept.2)
        .bind(kept.3)
        .bind(kept.4)
        .execute(&self.env.owner)
        .await
        .expect("restore");
        let abandoned = self.state(id).await.and_then(|s| s.1);
        if !settled || abandoned.as_deref() != Some("MISSING_ROW") {
            let what = format!("row {id}: settled {settled}, abandoned {abandoned:?}");
            self.model.effect("recover_backfill", predict, false, &what);
            return None;
        }
        Some((id, predict))
    }

    /// A recover-backfill's CLI answer: it must apply to the restored row.
    pub(super) fn recover_judge(&mut self, id: i64, predict: Predict, out: CliOut) {
        let applied = out.code == Some(0) && out.json()["applied"] == 1;
        if !applied {
            self.model
                .violation(format!("recover-backfill {id}: {}", out.all()));
        }
        let what = format!("recover-backfill {id}: {}", out.stdout.trim());
        self.model
            .effect("recover_backfill", predict, applied, &what);
        if applied {
            self.model.recovered.push(id);
        }
    }
}

/// An approved skip of `from..=to`, as the operator runs it.
pub(super) fn skip_args(from: i64, to: i64) -> Vec<String> {
    let (from, to) = (from.to_string(), to.to_string());
    let args = [
        "skip",
        "--from",
        &from,
        "--to",
        &to,
        "--approver",
        "ops-lead",
        "--reason",
        "ops test skip",
        "--ticket",
        "CHG-19",
        "--json",
    ];
    args.into_iter().map(String::from).collect()
}

/// `recover-backfill` of one row, as the operator runs it.
pub(super) fn recover_args(id: i64) -> Vec<String> {
    let ids = id.to_string();
    let args = [
        "recover-backfill",
        "--ids",
        &ids,
        "--actor",
        ACTOR,
        "--reason",
        "the DB owner restored the row",
        "--ticket",
        TICKET,
        "--json",
    ];
    args.into_iter().map(String::from).collect()
}

/// The rows a replay's `--json` report refused for want of raw text. The CLI appends where
/// the DB owner's purge stands to that refusal ("; the DB owner's purge: …"), so the reason
/// starts with [`NO_RAW_TEXT`](msgx_core::store::replay::NO_RAW_TEXT) rather than equals it
/// (`procedures::raw_copy` holds the service to that prefix).
fn refused_for_no_text(report: &serde_json::Value) -> BTreeSet<i64> {
    report["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["result"] == "refused")
        .filter(|r| {
            r["reason"]
                .as_str()
                .is_some_and(|why| why.starts_with(msgx_core::store::replay::NO_RAW_TEXT))
        })
        .filter_map(|r| r["msg_id"].as_i64())
        .collect()
}

/// CI stop 50: the CLI's refusal carried the purge note, the oracle compared the whole reason,
/// and a row the purge beside the replay deleted was reported missing.
#[test]
fn a_refusal_for_no_text_is_recognised_with_the_purge_note_and_nothing_else_is() {
    use msgx_core::store::replay::NO_RAW_TEXT;
    let with_note = format!("{NO_RAW_TEXT}; the DB owner's purge: the inbox now starts at id 24");
    let report = serde_json::json!({ "rows": [
        { "msg_id": 23, "result": "refused", "reason": with_note },
        { "msg_id": 24, "result": "refused", "reason": "the row moved since it was seen" },
        { "msg_id": 25, "result": "applied", "reason": null },
        { "msg_id": 26, "result": "refused", "reason": NO_RAW_TEXT },
    ]});
    let got: Vec<i64> = refused_for_no_text(&report).into_iter().collect();
    assert_eq!(got, vec![23, 26]);
}
