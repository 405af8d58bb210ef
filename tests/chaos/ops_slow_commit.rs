//! A commit left in doubt, as an action kind (issue 40's commit timeout; issue 41 item 6): the
//! broker answers the dispatcher's next `EndTxn` only after the commit wait, so the commit call
//! times out with its outcome unknown. The service must call it again — the batch lands once —
//! never abort it and send the batch again (which the end check's 0 duplicates in exactly-once
//! mode would show), and go on delivering.

use std::time::Duration;

use super::{metric, Seq};
use crate::common::TestEnv;
use crate::ops_effect::Predict;

/// The counter of commit calls made again after one whose outcome was unknown.
const COMMIT_RETRIES: &str = "msgx_dispatch_commit_retries_total";
/// Messages the step writes so that a round has something to commit.
const MESSAGES: usize = 3;

impl Seq {
    /// Delays the broker's next `EndTxn` by `ms`, writes a few messages, and judges: the
    /// commit was called again (the active instance's retry counter rose) and the messages'
    /// events were delivered.
    pub(super) async fn slow_commit(&mut self, ms: u64) {
        let before = match self.commit_retries().await {
            Some(v) => v,
            None => {
                self.model.violation(format!(
                    "{COMMIT_RETRIES} absent from the active instance's /metrics"
                ));
                return;
            }
        };
        if self
            .broker
            .slow_next_commit(Duration::from_millis(ms))
            .is_none()
        {
            self.model
                .violation("harness: slow_commit on a broker that cannot delay a request");
            return;
        }
        let mut ids = Vec::with_capacity(MESSAGES);
        for _ in 0..MESSAGES {
            let m = self.runtime_flop("C");
            ids.push(self.write(m).await);
        }
        let limit = Duration::from_millis(ms) + Duration::from_secs(20);
        let retried = self
            .wait_until(limit, || async {
                self.commit_retries().await.is_some_and(|v| v > before)
            })
            .await;
        let delivered = self
            .wait_until(Duration::from_secs(20), || delivered(&self.env, &ids))
            .await;
        let after = self.commit_retries().await.unwrap_or(before);
        let why = format!(
            "the broker answers EndTxn {ms} ms late, past the commit wait: the commit in doubt \
             is called again"
        );
        let what =
            format!("commit retries {before} → {after}; messages {ids:?} delivered: {delivered}");
        eprintln!("ops: slow commit: {what}");
        self.model
            .effect("slow_commit", Predict::Effective(why), retried, &what);
        if !delivered {
            self.model.violation(format!(
                "after a slow commit, the events of messages {ids:?} were not all SENT"
            ));
        }
    }

    /// The active instance's commit retries so far (None: no instance, or absent).
    async fn commit_retries(&self) -> Option<f64> {
        let a = self.active.as_ref()?;
        metric(&a.metrics().await, COMMIT_RETRIES)
    }
}

/// The messages `ids` of `env`'s store processed (SUCCEEDED) and each of their events SENT.
pub(super) async fn delivered(env: &TestEnv, ids: &[i64]) -> bool {
    sqlx::query_scalar::<_, bool>(
        "SELECT (SELECT count(*) FROM proc_state WHERE msg_id = ANY($1) \
                 AND state = 'SUCCEEDED') = $2 \
            AND NOT EXISTS (SELECT 1 FROM msg_event WHERE msg_id = ANY($1) \
                 AND state <> 'SENT')",
    )
    .bind(ids)
    .bind(ids.len() as i64)
    .fetch_one(env.store.pool())
    .await
    .unwrap_or(false)
}
