//! Driving the core by hand, one round at a time: discovery up to an id, backfill sweeps
//! until nothing is due, the pump until it is idle.

use msgx_core::backfill::{sweep_once, SweepConfig};
use msgx_core::devtools::simulator::{simulate, SimConfig, SimReport};
use msgx_core::late::{compensation_scan, DetectConfig, ScanReport};
use msgx_core::poller::PollConfig;
use msgx_core::pump::{Outcome, PumpCore, StepOutcome};

use super::TestEnv;

impl TestEnv {
    /// A new env (tagged `tag`) with the default poll knobs at this claim batch.
    pub async fn polling(tag: &str, claim_batch: u32) -> (Self, PollConfig) {
        let env = Self::new(tag).await;
        let cfg = env.poll_cfg(claim_batch);
        (env, cfg)
    }

    /// Inserts and commits `n` rows and discovers them in one round of `cfg`; their ids.
    pub async fn discovered_rows(&self, n: usize, cfg: PollConfig) -> Vec<i64> {
        let ids = self.insert_rows(n).await;
        self.poll(cfg).await;
        ids
    }

    /// One compensation scan below W, its config from the settings with these overrides.
    pub async fn compensation_scan(&self, extra: &[(&str, &str)]) -> ScanReport {
        let scan = DetectConfig::from_settings(&self.settings(extra)).scan();
        compensation_scan(&self.inbox, &self.store, &self.clock, &scan)
            .await
            .expect("compensation scan")
    }

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

    /// Runs the upstream simulator as the DB owner until it has written its `total` (never
    /// stopped early); what it wrote.
    pub async fn simulate(&self, cfg: &SimConfig) -> SimReport {
        let (_stop, stop_rx) = tokio::sync::watch::channel(false);
        simulate(&self.owner, &self.names, self.tz, cfg, stop_rx)
            .await
            .expect("simulate")
    }

    /// The pump's next step escalates its FAILED head to poison, and `dead` is then
    /// DEAD(EXHAUSTED).
    pub async fn step_poisons(&self, pump: &mut PumpCore, dead: i64) {
        let step = pump.step().await.expect("step");
        assert!(matches!(step, StepOutcome::Poisoned { .. }), "{step:?}");
        assert_eq!(
            self.state_of(dead).await,
            ("DEAD".into(), Some("EXHAUSTED".into()))
        );
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
