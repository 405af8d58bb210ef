//! The supervised pipeline as the service builds it (`PipelineDeps::from_settings`), on a
//! test env's inbox and store.

use actix::dev::ToEnvelope;
use actix::{Actor, Addr, Handler, Message};
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

/// Sends `msg` to the actor and waits for its answer, which must be a success (the mailbox
/// open, the round it asked for not failed).
pub async fn ask<A, M, T, E>(addr: &Addr<A>, msg: M) -> T
where
    A: Actor + Handler<M>,
    A::Context: ToEnvelope<A, M>,
    M: Message<Result = Result<T, E>> + Send + 'static,
    T: Send + 'static,
    E: std::fmt::Debug + Send + 'static,
{
    addr.send(msg)
        .await
        .expect("mailbox")
        .expect("the actor's answer")
}

/// Starts the pipeline on `env` with its manual clock and its settings with these overrides,
/// nothing adjusted: for the tests that only need it running.
pub fn start_with(env: &TestEnv, extra: &[(&str, &str)]) -> Pipeline {
    start(env, &env.settings(extra), super::shared(&env.clock), |_| {})
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
