//! A rebuilt store on the shared topic, as an action kind (issue 40's first sequence; issue 41
//! item 6). A second deployment — its own store and inbox, its own `ce_source` and
//! `transactional.id` — delivers on this plan's events topic, its event numbers started where
//! ours go next, so the numbers of both collide. Then ours crashes right after committing a
//! round of its own before recording it SENT (`MSGEXCHANGE_FAILPOINT=dispatch_after_ack`), and
//! the next instance's recovery must find its own records among the other's with the same
//! numbers: taking one of the other's for ours would record an offset holding another event
//! (`verify --kafka` fails) and leave ours unsent (missing from the topic).
//!
//! Judged: the other's events are each on the topic (once in exactly-once mode); ours as
//! always, with the other's records left out by `ce_source` ([`Seq::consumed`](super::Seq)).

use std::collections::HashMap;
use std::time::Duration;

use super::ops_slow_commit::delivered;
use super::ops_writers::insert;
use super::Seq;
use crate::common::instance::{off_runtime, set_var, Instance};
use crate::common::kafka::consume;
use crate::common::TestEnv;
use crate::ops_effect::Predict;
use crate::ops_model::Exit;
use crate::ops_msgs::Msg;

/// The other deployment's `kafka.client_id` (ours is the default): its `transactional.id`
/// differs from ours, as two deployments' must.
const OTHER_CLIENT: &str = "rebuilt-store";
/// Messages of ours the crashing instance commits a round of.
const OURS: usize = 3;

impl Seq {
    /// The second deployment writes `msgs` messages' events on our topic, numbered like ours
    /// next; then ours crashes after a commit and starts again.
    pub(super) async fn shared_topic(&mut self, msgs: usize) {
        let other = TestEnv::new("ops_rebuilt").await;
        let source = format!("//{}.test/msgexchange", other.db);
        self.model.foreign_sources.push(source.clone());
        let next: i64 = sqlx::query_scalar("SELECT COALESCE(max(event_id), 0) + 1 FROM msg_event")
            .fetch_one(self.env.store.pool())
            .await
            .expect("our next event number");
        sqlx::query(&format!(
            "SELECT setval(pg_get_serial_sequence('msg_event', 'event_id'), {next}, false)"
        ))
        .execute(other.store.pool())
        .await
        .expect("the other's numbers start at ours");
        let sent = self.run_other(&other, &source, msgs).await;
        let theirs = events_of(&other).await;
        self.crash_after_commit().await;
        let on_topic = self.their_copies(&source, theirs.len()).await;
        self.judge_shared_topic(sent, next, &theirs, &on_topic);
        other.cleanup().await;
    }

    /// The other deployment: `msgs` messages in its inbox, its instance until they are
    /// processed and every event is SENT (true) or 40 s passed, then SIGTERM.
    async fn run_other(&mut self, other: &TestEnv, source: &str, msgs: usize) -> bool {
        let mut vars = self.direct.clone();
        set_var(&mut vars, "MSGX_STORE__URL", &other.pg_url);
        set_var(&mut vars, "MSGX_INBOX__URL", &other.my_url);
        set_var(&mut vars, "MSGX_KAFKA__CE_SOURCE", source);
        set_var(&mut vars, "MSGX_KAFKA__CLIENT_ID", OTHER_CLIENT);
        let mut ids = Vec::with_capacity(msgs);
        for i in 0..msgs {
            let m = Msg::Flop {
                n: i as i64 + 1,
                flid: format!("R{}", i % 3),
                gate: format!("RG{i}"),
                stnd: None,
            };
            ids.push(insert(&other.owner, &m).await);
        }
        let name = self.name("rebuilt");
        let mut inst = Instance::spawn(&vars, &name, &[]);
        inst.wait_ready(Duration::from_secs(40)).await;
        let sent = self
            .wait_until(Duration::from_secs(40), || delivered(other, &ids))
            .await;
        inst.signal("-TERM");
        let st = inst.exited_within(Duration::from_secs(15)).await;
        self.model.exited(&name, Exit::Term, st);
        sent
    }

    /// Ours is killed; an instance armed to abort right after its first committed round gets
    /// a few messages of ours (their events numbered where the other's went); then a plain
    /// instance starts, whose recovery must find those records among the other's.
    async fn crash_after_commit(&mut self) {
        self.harvest_metrics().await;
        self.fault_start();
        let a = self.active.take().expect("an active instance");
        let name = a.name.clone();
        let st = a.kill9();
        self.model.exited(&name, Exit::Killed, st);
        for _ in 0..OURS {
            let m = self.runtime_flop("C");
            self.write(m).await;
        }
        let name = self.name("after-ack");
        let fp = [("MSGEXCHANGE_FAILPOINT", "dispatch_after_ack")];
        let mut inst = Instance::spawn(&self.vars, &name, &fp);
        match inst.exited_within(Duration::from_secs(40)).await {
            Some(st) => self.model.exited(&name, Exit::Aborted, Some(st)),
            None => {
                self.model.violation(format!(
                    "{name} committed no round of our new messages within 40 s (a recovery \
                     that took them for delivered, or a stalled pipeline)"
                ));
                inst.kill9();
            }
        }
        self.start(&[]).await;
        self.fault_end();
    }

    /// Each of the other deployment's records on the topic: copies per `ce_id`.
    async fn their_copies(&self, source: &str, at_least: usize) -> HashMap<String, usize> {
        let (b, t) = (self.broker.bootstrap().to_string(), self.topic.clone());
        let all = off_runtime(move || consume(&b, &t, 3, at_least)).await;
        let mut n = HashMap::new();
        for r in all
            .iter()
            .filter(|r| r.headers.get("ce_source").map(String::as_str) == Some(source))
        {
            *n.entry(r.ce_id().to_string()).or_insert(0) += 1;
        }
        n
    }

    /// The other deployment's events against what the topic holds of its source.
    fn judge_shared_topic(
        &mut self,
        sent: bool,
        from: i64,
        theirs: &[String],
        on_topic: &HashMap<String, usize>,
    ) {
        let missing = theirs
            .iter()
            .filter(|id| !on_topic.contains_key(*id))
            .count();
        let doubled = on_topic.values().filter(|n| **n > 1).count();
        let what = format!(
            "the other deployment: {} events numbered from {from}, all SENT: {sent}; on the \
             topic {} (missing {missing}, doubled {doubled})",
            theirs.len(),
            on_topic.len()
        );
        eprintln!("ops: shared topic: {what}");
        let took = sent && !theirs.is_empty() && missing == 0;
        let why = "a second deployment's events on our topic, numbered like ours".to_string();
        self.model
            .effect("shared_topic", Predict::Effective(why), took, &what);
        if self.model.exactly_once && doubled > 0 {
            self.model.violation(format!(
                "shared topic: {doubled} of the other deployment's events twice on the topic"
            ));
        }
    }
}

/// The `ce_id`s of the other deployment's events.
async fn events_of(env: &TestEnv) -> Vec<String> {
    sqlx::query_scalar("SELECT ce_id::text FROM msg_event ORDER BY event_id")
        .fetch_all(env.store.pool())
        .await
        .expect("the other deployment's events")
}
