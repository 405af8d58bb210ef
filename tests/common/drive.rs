//! Driving the core by hand, one round at a time: discovery up to an id, backfill sweeps
//! until nothing is due, the pump until it is idle.

use std::collections::VecDeque;

use msgx_core::backfill::{sweep_once, SweepConfig};
use msgx_core::devtools::simulator::{simulate, SimConfig, SimReport};
use msgx_core::late::{compensation_scan, DetectConfig, ScanReport};
use msgx_core::poller::PollConfig;
use msgx_core::pump::{Outcome, PumpCore, StepOutcome};
use msgx_core::store::StoreError;

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
    pub async fn step_poisons(&self, pump: &mut Stepper, dead: i64) {
        let step = pump.step().await.expect("step");
        assert!(matches!(step, StepOutcome::Poisoned { .. }), "{step:?}");
        assert_eq!(
            self.state_of(dead).await,
            ("DEAD".into(), Some("EXHAUSTED".into()))
        );
    }

    /// A [`Stepper`] over [`TestEnv::pump`] with these overrides.
    pub fn stepper(&self, extra: &[(&str, &str)]) -> Stepper {
        Stepper::new(self.pump(extra))
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

/// Runs the pump's groups (`PumpCore::step_group`, the call the `Pump` actor makes) until
/// idle; each processed head with its outcome, in order. Any other step (a poison, a wait)
/// panics.
pub async fn drain_processed(pump: &mut PumpCore) -> Vec<(i64, Outcome)> {
    let mut done = Vec::new();
    loop {
        for step in pump.step_group().await.expect("group") {
            match step {
                StepOutcome::Idle => return done,
                StepOutcome::Processed {
                    msg_id, outcome, ..
                } => done.push((msg_id, outcome)),
                other => panic!("unexpected step {other:?}"),
            }
        }
    }
}

/// The pump as a test steps it one head at a time: each group runs through production's
/// `PumpCore::step_group`, and its committed outcomes are handed out one by one so a test can
/// assert on each (the core itself keeps none between groups).
#[derive(Debug)]
pub struct Stepper {
    /// The core, stepped only through `step_group`.
    core: PumpCore,
    /// Outcomes of the last group not handed out yet.
    done: VecDeque<StepOutcome>,
}

impl Stepper {
    /// A stepper over this core.
    pub fn new(core: PumpCore) -> Self {
        Self {
            core,
            done: VecDeque::new(),
        }
    }

    /// The next outcome of the last group, or the first of a new one. A store failure is
    /// returned as the group returned it.
    pub async fn step(&mut self) -> Result<StepOutcome, StoreError> {
        if self.done.is_empty() {
            self.done.extend(self.core.step_group().await?);
        }
        Ok(self.done.pop_front().unwrap_or(StepOutcome::Idle))
    }

    /// The outcomes of the last group not handed out yet, or a new group's.
    pub async fn step_group(&mut self) -> Result<Vec<StepOutcome>, StoreError> {
        if self.done.is_empty() {
            return self.core.step_group().await;
        }
        Ok(self.done.drain(..).collect())
    }

    /// The core (its store, its stage timings).
    pub fn core(&self) -> &PumpCore {
        &self.core
    }
}
