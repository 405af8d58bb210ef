//! The events side of a sequence: with the events topic missing, DEAD events requeued by
//! hand once it is there (also across a restart in exactly-once mode).

use std::time::{Duration, Instant};

use super::{Seq, ACTOR, TICKET};
use crate::common::instance::{off_runtime, CliOut};
use crate::ops_effect::Predict;
use crate::ops_model::Exit;

/// The longest a requeue loop runs once the events topic is there: events in flight fail
/// within 2 attempts of 2 s, each requeued one is sent at the next dispatch round.
const REQUEUE_LIMIT: Duration = Duration::from_secs(60);

impl Seq {
    /// The events topic was missing: wait for DEAD events, create it, requeue until none is
    /// left DEAD.
    pub(super) async fn requeue(&mut self) {
        if !self.plan.dispatch_outage {
            let why = "the events topic was there from the start: nothing goes DEAD".to_string();
            self.model.effect("requeue", Predict::Idle(why), false, "");
            return;
        }
        let dead = self.requeue_prepare().await;
        let before = self.model.requeued.len();
        if self.plan.delivery == msgx_core::settings::Delivery::ExactlyOnce && dead {
            self.requeue_across_a_restart().await;
        }
        self.requeue_until_none_dead().await;
        self.requeue_effect(dead, before, "");
    }

    /// The requeue's effect, judged against the prediction: the topic is missing and events
    /// exist (the runner wrote one if none had come), so every send fails, 2 attempts of 2 s,
    /// and the event goes DEAD (SPEC §7) — a requeue must then have requeued some. `how` is
    /// added to the report (e.g. " (across a takeover)").
    pub(super) fn requeue_effect(&mut self, dead: bool, before: usize, how: &str) {
        let why = "events raised while the events topic is missing go DEAD".to_string();
        let took = dead && self.model.requeued.len() > before;
        let what = format!(
            "DEAD events seen: {dead}; requeued {}{how}",
            self.model.requeued.len() - before
        );
        self.model
            .effect("requeue", Predict::Effective(why), took, &what);
    }

    /// Events raised while the topic is missing (the runner writes one if none came), DEAD
    /// ones waited for, then the topic created. True when some went DEAD.
    pub(super) async fn requeue_prepare(&mut self) -> bool {
        let pool = self.env.store.pool().clone();
        let count = |sql: &'static str| {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, i64>(sql)
                    .fetch_one(&pool)
                    .await
                    .expect("count")
            }
        };
        if !self
            .wait_until(Duration::from_secs(5), || async {
                count("SELECT count(*) FROM msg_event").await > 0
            })
            .await
        {
            let m = self.runtime_flop("Q");
            self.write(m).await;
        }
        let dead = self
            .wait_until(Duration::from_secs(30), || async {
                count("SELECT count(*) FROM msg_event WHERE state = 'DEAD'").await > 0
            })
            .await;
        let (a, t) = (self.broker.clone(), self.topic.clone());
        off_runtime(move || a.create_topic(&t, 3)).await;
        dead
    }

    /// Issue 40, a requeue across a restart: the active instance frozen (so its dispatcher
    /// sends nothing), the DEAD events requeued, the instance killed and a new one started.
    /// The new start's exactly-once recovery reads the dead-letter topic, where the requeued
    /// events' old copies lie: it must not take the requeue back (the events must still reach
    /// the topic, which the end's event check demands of every requeued event).
    async fn requeue_across_a_restart(&mut self) {
        self.harvest_metrics().await;
        if let Some(a) = &self.active {
            a.signal("-STOP");
        }
        let ids = self.dead_event_ids().await;
        if !ids.is_empty() {
            self.requeue_ids(&ids).await;
        }
        let a = self.active.take().expect("an active instance");
        let name = a.name.clone();
        let st = a.kill9();
        self.model.exited(&name, Exit::Killed, st);
        self.start(&[]).await;
        // The topic is there now: each requeued event is sent (SENT), never DEAD again.
        let ids: Vec<i64> = ids.iter().filter_map(|i| i.parse().ok()).collect();
        let pool = self.env.store.pool().clone();
        let states = || {
            let (pool, ids) = (pool.clone(), ids.clone());
            async move {
                sqlx::query_as::<_, (i64, String)>(
                    "SELECT event_id, state FROM msg_event WHERE event_id = ANY($1)",
                )
                .bind(&ids)
                .fetch_all(&pool)
                .await
                .expect("states")
            }
        };
        self.wait_until(Duration::from_secs(30), || async {
            states().await.iter().all(|(_, st)| st != "PENDING")
        })
        .await;
        let back: Vec<i64> = states()
            .await
            .into_iter()
            .filter(|(_, st)| st == "DEAD")
            .map(|(id, _)| id)
            .collect();
        if !back.is_empty() {
            self.model.violation(format!(
                "requeue taken back by the restart's recovery: events {back:?} DEAD again"
            ));
        }
    }

    /// The ids `events list-dead` lists.
    pub(super) async fn dead_event_ids(&mut self) -> Vec<String> {
        let out = self
            .cli(&["events", "list-dead", "--limit", "1000", "--json"])
            .await;
        out.json()["events"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["event_id"].as_i64())
            .map(|i| i.to_string())
            .collect()
    }

    /// `events list-dead` and `events requeue` until no event is DEAD any more and events that
    /// were in flight when the topic came back had time to fail (2 attempts of 2 s), within
    /// [`REQUEUE_LIMIT`]: events still going DEAD past it with the topic there are a
    /// violation, not a hang.
    pub(super) async fn requeue_until_none_dead(&mut self) {
        let since = Instant::now();
        loop {
            let ids = self.dead_event_ids().await;
            if ids.is_empty() {
                if since.elapsed() > Duration::from_secs(7) {
                    break;
                }
            } else if since.elapsed() > REQUEUE_LIMIT {
                self.model.violation(format!(
                    "events {ids:?} still DEAD {REQUEUE_LIMIT:?} after the events topic came \
                     back and every DEAD event was requeued"
                ));
                break;
            } else {
                self.requeue_ids(&ids).await;
            }
            tokio::time::sleep(Duration::from_millis(700)).await;
        }
    }

    /// `events requeue` of `ids`, audited; a refusal is a violation.
    async fn requeue_ids(&mut self, ids: &[String]) {
        let args = requeue_args(ids);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = self.cli(&args).await;
        self.requeue_judge(&out);
    }

    /// An `events requeue` call's answer: a refusal is a violation; what it requeued goes to
    /// the model. The requeued ids.
    pub(super) fn requeue_judge(&mut self, out: &CliOut) -> Vec<i64> {
        let r = out.json();
        if out.code != Some(0) || r["refused"].as_array().is_some_and(|a| !a.is_empty()) {
            self.model
                .violation(format!("events requeue: {}", out.all()));
        }
        let ids: Vec<i64> = r["requeued"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_i64())
            .collect();
        self.model.requeued.extend(ids.iter().copied());
        ids
    }
}

/// `events requeue` of `ids`, audited.
pub(super) fn requeue_args(ids: &[String]) -> Vec<String> {
    [
        "events",
        "requeue",
        "--ids",
        &ids.join(","),
        "--actor",
        ACTOR,
        "--reason",
        "the events topic is back",
        "--ticket",
        TICKET,
        "--json",
    ]
    .map(String::from)
    .to_vec()
}
