//! Driving the core by hand, one round at a time: discovery up to an id, backfill sweeps
//! until nothing is due, the pump until it is idle.

use msgx_core::backfill::{sweep_once, SweepConfig};
use msgx_core::pump::{Outcome, PumpCore, StepOutcome};

use super::TestEnv;

impl TestEnv {
    /// Polls until W reaches `last`; panics after 50 rounds.
    pub async fn discover(&self, last: i64) {
        for _ in 0..50 {
            if self.cursor().await.0 >= last {
                return;
            }
            self.poll(self.poll_cfg(2000)).await;
        }
        panic!("W did not reach {last}");
    }

    /// Sweeps (default backfill settings) until a sweep selects nothing.
    pub async fn sweep_all(&self) {
        let settings = self.settings(&[]);
        self.sweep_until_idle(&SweepConfig::new(&settings.backfill, &self.names))
            .await;
    }

    /// Sweeps with `cfg` until a sweep selects nothing.
    pub async fn sweep_until_idle(&self, cfg: &SweepConfig) {
        while sweep_once(&self.inbox, &self.store, &self.clock, cfg)
            .await
            .expect("sweep")
            .selected
            > 0
        {}
    }
}

/// Steps the pump until idle; each processed head with its outcome, in order. Any other step
/// (a poison, a wait) panics.
pub async fn drain_processed(pump: &mut PumpCore) -> Vec<(i64, Outcome)> {
    let mut done = Vec::new();
    loop {
        match pump.step().await.expect("step") {
            StepOutcome::Idle => return done,
            StepOutcome::Processed {
                msg_id, outcome, ..
            } => done.push((msg_id, outcome)),
            other => panic!("unexpected step {other:?}"),
        }
    }
}
