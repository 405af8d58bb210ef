//! Supervisor: starts the children from factories and rebuilds any child whose mailbox closed
//! (a panicking actix actor is not restarted by actix: it just disappears). Children keep no
//! state that matters in memory, so a rebuilt child resumes from PostgreSQL.
//! It also watches the single-instance lock and stops the service when it is lost.

use std::time::{Duration, Instant};

use actix::{Actor, AsyncContext, Context};
use msgx_core::store::InstanceLock;
use msgx_core::telemetry;
use tokio::sync::mpsc;

use crate::wiring::Wiring;

/// Says whether a started child's mailbox is still open.
pub type Liveness = Box<dyn Fn() -> bool>;

/// Starts a fresh child instance and rewires it.
pub type StartChild = Box<dyn Fn(&Wiring) -> Liveness>;

/// How a child is (re)built: starts the actor, rewires it, returns a liveness probe.
pub struct ChildFactory {
    /// Name for logs and metrics.
    pub name: &'static str,
    /// Starts a fresh instance; the returned probe says whether its mailbox is still open.
    pub start: StartChild,
}

struct Child {
    factory: ChildFactory,
    alive: Liveness,
    started_at: Instant,
    /// Consecutive quick failures, for the restart backoff.
    failures: u32,
    /// Not before this instant (backoff).
    restart_after: Option<Instant>,
}

/// Why the service must stop.
#[derive(Debug)]
pub enum Fatal {
    /// The single-instance lock was lost.
    LockLost(String),
}

/// The supervisor actor.
pub struct Supervisor {
    /// Shared receivers, rewired on restart.
    wiring: Wiring,
    /// Factories waiting to be started (moved into `children` at start).
    pending: Vec<ChildFactory>,
    children: Vec<Child>,
    /// Held for the life of the process; None in tests that run several pipelines.
    lock: Option<InstanceLock>,
    /// Where a fatal condition is reported (the binary exits non-zero).
    fatal: mpsc::UnboundedSender<Fatal>,
    /// How often children are checked.
    check_every: Duration,
}

/// A child that lived this long is considered healthy again.
const STABLE_AFTER: Duration = Duration::from_secs(60);
/// Restart backoff bounds.
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

impl Supervisor {
    /// A supervisor for these children.
    pub fn new(
        wiring: Wiring,
        children: Vec<ChildFactory>,
        lock: Option<InstanceLock>,
        fatal: mpsc::UnboundedSender<Fatal>,
    ) -> Self {
        Self {
            wiring,
            pending: children,
            children: Vec::new(),
            lock,
            fatal,
            check_every: Duration::from_millis(250),
        }
    }

    fn check_children(&mut self) {
        let now = Instant::now();
        for child in &mut self.children {
            if (child.alive)() {
                continue;
            }
            match child.restart_after {
                None => {
                    if now.duration_since(child.started_at) >= STABLE_AFTER {
                        child.failures = 0;
                    }
                    let backoff = backoff(child.failures);
                    child.failures += 1;
                    child.restart_after = Some(now + backoff);
                    telemetry::actor_restarted(child.factory.name, backoff);
                }
                Some(at) if now >= at => {
                    child.alive = (child.factory.start)(&self.wiring);
                    child.started_at = now;
                    child.restart_after = None;
                    tracing::info!(child = child.factory.name, "child actor restarted");
                }
                Some(_) => {}
            }
        }
    }

    fn check_lock(&mut self, ctx: &mut Context<Self>) {
        let Some(lock) = self.lock.clone() else {
            return;
        };
        let fatal = self.fatal.clone();
        let fut = async move {
            if let Err(e) = lock.check().await {
                let _ = fatal.send(Fatal::LockLost(e.to_string()));
            }
        };
        ctx.spawn(actix::fut::wrap_future(fut));
    }
}

fn backoff(failures: u32) -> Duration {
    BACKOFF_MIN
        .saturating_mul(2u32.saturating_pow(failures.min(16)))
        .min(BACKOFF_MAX)
}

impl Actor for Supervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        for factory in std::mem::take(&mut self.pending) {
            let alive = (factory.start)(&self.wiring);
            tracing::info!(child = factory.name, "child actor started");
            self.children.push(Child {
                factory,
                alive,
                started_at: Instant::now(),
                failures: 0,
                restart_after: None,
            });
        }
        ctx.run_interval(self.check_every, |act, _| act.check_children());
        ctx.run_interval(Duration::from_secs(5), |act, ctx| act.check_lock(ctx));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(0), Duration::from_millis(200));
        assert_eq!(backoff(1), Duration::from_millis(400));
        assert_eq!(backoff(20), BACKOFF_MAX);
    }
}
