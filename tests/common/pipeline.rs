//! The supervised pipeline as the service builds it (`PipelineDeps::from_settings`), on a
//! test env's inbox and store.

use actix::Addr;
use msgx_actors::app::{start_pipeline, PipelineDeps};
use msgx_actors::supervisor::{Fatal, Supervisor};
use msgx_actors::wiring::Wiring;
use msgx_core::clock::SharedClock;
use msgx_core::settings::Settings;
use tokio::sync::mpsc::UnboundedReceiver;

use super::TestEnv;

/// A running pipeline: dropped, its supervisor stops with the test's system.
pub struct Pipeline {
    /// The supervisor.
    pub sup: Addr<Supervisor>,
    /// Its wiring (the poller's address, the probes' recipients).
    pub wiring: Wiring,
    /// Fatal conditions the children report (kept open while the test runs).
    pub fatal: UnboundedReceiver<Fatal>,
}

/// Starts the pipeline from these settings on `env`'s inbox and store, with this clock;
/// `adjust` changes the deps before the start (e.g. adds housekeeping).
pub fn start(
    env: &TestEnv,
    settings: &Settings,
    clock: SharedClock,
    adjust: impl FnOnce(&mut PipelineDeps),
) -> Pipeline {
    let (fatal_tx, fatal) = tokio::sync::mpsc::unbounded_channel();
    let mut deps = PipelineDeps::from_settings(
        settings,
        env.inbox.clone(),
        env.store.clone(),
        clock,
        fatal_tx,
    )
    .expect("pipeline deps");
    adjust(&mut deps);
    let wiring = deps.wiring.clone();
    Pipeline {
        sup: start_pipeline(deps),
        wiring,
        fatal,
    }
}
