//! Supervisor: starts the children from factories and rebuilds any child whose mailbox closed
//! (a panicking actix actor is not restarted by actix: it just disappears). Children keep no
//! state that matters in memory, so a rebuilt child resumes from PostgreSQL.
//! It also renews the single-instance lease and stops the service when it is lost.
//! [`ChildFactory::of`] (with [`start`]) is how the service's children are built: the actor
//! type names its [`Child`] ([`Supervised`]), which names its `Shutdown` registration.
//!
//! Limits (OTP style): more than `max_restarts` restarts within `restart_window` stop the
//! service with [`Fatal::RestartIntensity`] — a crash loop needs an operator, not more retries.
//! Graceful shutdown: [`ShutdownPipeline`] stops restarting and sends
//! [`crate::messages::Shutdown`] to every child, last started first, each waited for until the
//! deadline. `/readyz` sees every child's state through [`Health`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, Addr, AsyncContext, Context, Handler, ResponseFuture};
use msgx_core::store::{InstanceLock, StoreError};
use msgx_core::telemetry;
use tokio::sync::mpsc;

use crate::child::Child;
use crate::health::Health;
use crate::messages::{Shutdown, ShutdownPipeline, ShutdownReport};
use crate::wiring::{Receivers, Wiring};

/// Says whether a started child's mailbox is still open.
pub type Liveness = Box<dyn Fn() -> bool>;

/// Starts a fresh child instance and rewires it.
pub type StartChild = Box<dyn Fn(&Wiring) -> Liveness>;

/// How a child is (re)built: starts the actor, rewires it, returns a liveness probe. The
/// service's children are built by [`ChildFactory::of`], named by their [`Child`].
pub struct ChildFactory {
    /// Name for logs, metrics, `/readyz` and the shutdown registry.
    pub name: &'static str,
    /// Starts a fresh instance; the returned probe says whether its mailbox is still open.
    pub start: StartChild,
}

struct Running {
    factory: ChildFactory,
    alive: Liveness,
    started_at: Instant,
    /// Consecutive quick failures, for the restart backoff.
    failures: u32,
    /// Not before this instant (backoff).
    restart_after: Option<Instant>,
}

/// An actor the supervisor runs as one of the table's children. It handles [`Shutdown`] (most
/// through [`crate::child_actor!`]).
pub trait Supervised: Actor<Context = Context<Self>> + Handler<Shutdown> {
    /// Which child this actor is.
    const CHILD: Child;
}

/// Starts `actor`, registers its [`Shutdown`] receiver under its child's name, lets `wire`
/// record its other receivers, and returns its liveness probe.
pub fn start<A: Supervised>(
    wiring: &Wiring,
    actor: A,
    wire: impl FnOnce(&mut Receivers, &Addr<A>),
) -> Liveness {
    let addr = actor.start();
    wiring.update(|r| {
        r.set_shutdown(A::CHILD, addr.clone().recipient());
        wire(r, &addr);
    });
    Box::new(move || addr.connected())
}

impl ChildFactory {
    /// How the supervisor (re)builds the child `A`: `build` makes a fresh actor (`None` when it
    /// cannot be built now — the probe then says "down" and the supervisor retries with its
    /// backoff), [`start`] starts and wires it.
    pub fn of<A: Supervised>(
        build: impl Fn(&Wiring) -> Option<A> + 'static,
        wire: impl Fn(&mut Receivers, &Addr<A>) + 'static,
    ) -> Self {
        Self {
            name: A::CHILD.name(),
            start: Box::new(move |wiring: &Wiring| match build(wiring) {
                Some(actor) => start(wiring, actor, &wire),
                None => Box::new(|| false),
            }),
        }
    }
}

/// Declares `$actor` as the table's `$child` ([`Supervised`]) and stops it on [`Shutdown`]: its
/// work is atomic, so by then nothing is in flight; it cancels the timer it keeps in a
/// `next: NextRun` field and stops.
#[macro_export]
macro_rules! child_actor {
    ($actor:ty, $child:expr) => {
        impl $crate::supervisor::Supervised for $actor {
            const CHILD: $crate::child::Child = $child;
        }

        impl actix::Handler<$crate::messages::Shutdown> for $actor {
            type Result = Result<(), $crate::messages::ShutdownError>;

            fn handle(
                &mut self,
                _: $crate::messages::Shutdown,
                ctx: &mut Self::Context,
            ) -> Self::Result {
                $crate::shutdown::stop(ctx, &mut self.next, $child.name());
                Ok(())
            }
        }
    };
}

/// Why the service must stop.
#[derive(Debug)]
pub enum Fatal {
    /// The single-instance lock was lost.
    LockLost(String),
    /// The lease row was edited by hand: refuse to act.
    LeaseTampered(String),
    /// Children crashed more often than the restart intensity allows.
    RestartIntensity {
        /// The child whose crash crossed the limit.
        child: &'static str,
        /// Restarts within the window.
        restarts: usize,
        /// `supervisor.restart_window`.
        window: Duration,
    },
}

impl std::fmt::Display for Fatal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fatal::LockLost(why) => write!(f, "single-instance lock lost: {why}"),
            Fatal::LeaseTampered(why) => write!(f, "refusing to act: {why}"),
            Fatal::RestartIntensity {
                child,
                restarts,
                window,
            } => write!(
                f,
                "restart intensity exceeded: {restarts} child restarts within {} (last: {child}); \
                 stopping instead of crash-looping (supervisor.max_restarts)",
                humantime::format_duration(*window)
            ),
        }
    }
}

/// Restart intensity: more than `max_restarts` within `window` is fatal.
#[derive(Debug, Clone, Copy)]
pub struct Intensity {
    /// Allowed restarts in the window.
    pub max_restarts: u32,
    /// The window.
    pub window: Duration,
}

impl Default for Intensity {
    fn default() -> Self {
        Self {
            max_restarts: 10,
            window: Duration::from_secs(60),
        }
    }
}

/// The supervisor actor.
pub struct Supervisor {
    /// Shared receivers, rewired on restart.
    wiring: Wiring,
    /// Factories waiting to be started (moved into `children` at start).
    pending: Vec<ChildFactory>,
    children: Vec<Running>,
    /// Held for the life of the process; None in tests that run several pipelines.
    lock: Option<InstanceLock>,
    /// Where a fatal condition is reported (the binary exits non-zero).
    fatal: mpsc::UnboundedSender<Fatal>,
    /// How often children are checked.
    check_every: Duration,
    /// How often the lease is renewed.
    lease_every: Duration,
    /// Readiness facts (`/readyz`).
    health: Health,
    /// The restart limit.
    intensity: Intensity,
    /// Recent restarts (for the limit).
    restarts: VecDeque<Instant>,
    /// Shutting down (or given up): no more restarts.
    stopping: bool,
    /// A lease renewal is in flight (they never overlap).
    renewing: Arc<AtomicBool>,
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
            lease_every: Duration::from_secs(2),
            health: Health::default(),
            intensity: Intensity::default(),
            restarts: VecDeque::new(),
            stopping: false,
            renewing: Arc::default(),
        }
    }

    /// Reports every child's state to this `Health` (`/readyz`).
    pub fn with_health(mut self, health: Health) -> Self {
        self.health = health;
        self
    }

    /// Sets the restart limit.
    pub fn with_intensity(mut self, intensity: Intensity) -> Self {
        self.intensity = intensity;
        self
    }

    /// Sets how often the lease is renewed (`lease.renew_every`).
    pub fn with_lease_every(mut self, every: Duration) -> Self {
        self.lease_every = every;
        self
    }

    /// Counts one restart; true when it crosses the limit.
    fn restart_exceeds_limit(&mut self, now: Instant) -> bool {
        self.restarts.push_back(now);
        while self
            .restarts
            .front()
            .is_some_and(|t| now.duration_since(*t) > self.intensity.window)
        {
            self.restarts.pop_front();
        }
        telemetry::restarts_in_window(self.restarts.len());
        self.restarts.len() > self.intensity.max_restarts as usize
    }

    fn check_children(&mut self) {
        if self.stopping {
            return;
        }
        let now = Instant::now();
        let mut crossed = None;
        for child in &mut self.children {
            let alive = (child.alive)();
            self.health.child(child.factory.name, alive);
            if alive {
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
                    crossed = crossed.or(Some(child.factory.name));
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
        if let Some(child) = crossed {
            if self.restart_exceeds_limit(now) {
                let fatal = Fatal::RestartIntensity {
                    child,
                    restarts: self.restarts.len(),
                    window: self.intensity.window,
                };
                telemetry::supervisor_gave_up(&fatal.to_string());
                self.stopping = true;
                let _ = self.fatal.send(fatal);
            }
        }
    }

    /// Renews the lease (never two renewals at once). Taken over or edited by hand: fatal at
    /// once. A failed renewal is retried; no renewal for a whole ttl is fatal (a standby may
    /// own the lease by now — our writes are fenced anyway).
    fn check_lock(&mut self, ctx: &mut Context<Self>) {
        let Some(lock) = self.lock.clone() else {
            return;
        };
        // Renewals go on while shutting down: the lease stays ours until it is released.
        if self.renewing.swap(true, Ordering::AcqRel) {
            return;
        }
        let (fatal, health, renewing) = (
            self.fatal.clone(),
            self.health.clone(),
            self.renewing.clone(),
        );
        let fut = async move {
            match lock.check().await {
                Ok(()) => health.lease(true),
                Err(StoreError::LeaseTampered(why)) => {
                    health.lease(false);
                    let _ = fatal.send(Fatal::LeaseTampered(why));
                }
                Err(e @ StoreError::LeaseTakenOver { .. }) => {
                    health.lease(false);
                    let _ = fatal.send(Fatal::LockLost(e.to_string()));
                }
                Err(e) if lock.expired_locally() => {
                    health.lease(false);
                    let _ = fatal.send(Fatal::LockLost(format!(
                        "no lease renewal succeeded for a whole lease.ttl (last error: {e})"
                    )));
                }
                Err(e) => telemetry::lease_renew_failed(&e.to_string()),
            }
            renewing.store(false, Ordering::Release);
        };
        ctx.spawn(actix::fut::wrap_future(fut));
    }
}

impl Handler<ShutdownPipeline> for Supervisor {
    type Result = ResponseFuture<ShutdownReport>;

    fn handle(&mut self, msg: ShutdownPipeline, _: &mut Self::Context) -> Self::Result {
        self.stopping = true;
        // Last started first: the poller stops discovering, the pump finishes its step, the
        // dispatcher (started before them) writes SENT for what the broker acknowledged.
        let order: Vec<_> = self
            .children
            .iter()
            .rev()
            .map(|c| (c.factory.name, self.wiring.shutdown_of(c.factory.name)))
            .collect();
        let health = self.health.clone();
        Box::pin(async move {
            let mut report = ShutdownReport::default();
            for (name, recipient) in order {
                health.child(name, false);
                let Some(r) = recipient else {
                    report.unclean.push(name);
                    continue;
                };
                let left = msg.deadline.saturating_duration_since(Instant::now());
                match tokio::time::timeout(
                    left,
                    r.send(Shutdown {
                        deadline: msg.deadline,
                    }),
                )
                .await
                {
                    Ok(Ok(Ok(()))) => report.stopped.push(name),
                    // Already gone (crashed, or stopped before): nothing in flight.
                    Ok(Err(actix::MailboxError::Closed)) => report.stopped.push(name),
                    Ok(Ok(Err(e))) => {
                        tracing::warn!(child = name, error = %e, "child stopped uncleanly");
                        report.unclean.push(name);
                    }
                    Ok(Err(actix::MailboxError::Timeout)) | Err(_) => {
                        tracing::warn!(child = name, "child still busy at the shutdown deadline");
                        report.unclean.push(name);
                    }
                }
            }
            report
        })
    }
}

/// The wait before rebuilding a child that failed `failures` times in a row before this one.
fn backoff(failures: u32) -> Duration {
    let nth = i32::try_from(failures.saturating_add(1)).unwrap_or(i32::MAX);
    msgx_core::backoff::doubling(nth, BACKOFF_MIN, BACKOFF_MAX)
}

impl Actor for Supervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        for factory in std::mem::take(&mut self.pending) {
            let alive = (factory.start)(&self.wiring);
            tracing::info!(child = factory.name, "child actor started");
            self.health.child(factory.name, true);
            self.children.push(Running {
                factory,
                alive,
                started_at: Instant::now(),
                failures: 0,
                restart_after: None,
            });
        }
        ctx.run_interval(self.check_every, |act, _| act.check_children());
        ctx.run_interval(self.lease_every, |act, ctx| act.check_lock(ctx));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intensity_counts_restarts_within_the_window_only() {
        let (fatal, _rx) = mpsc::unbounded_channel();
        let mut s =
            Supervisor::new(Wiring::default(), vec![], None, fatal).with_intensity(Intensity {
                max_restarts: 2,
                window: Duration::from_secs(10),
            });
        let t0 = Instant::now();
        assert!(!s.restart_exceeds_limit(t0));
        assert!(!s.restart_exceeds_limit(t0 + Duration::from_secs(1)));
        // Both fell out of the window: one, then two, then three within 10 s.
        assert!(!s.restart_exceeds_limit(t0 + Duration::from_secs(12)));
        assert!(!s.restart_exceeds_limit(t0 + Duration::from_secs(13)));
        assert!(s.restart_exceeds_limit(t0 + Duration::from_secs(14)));
    }

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(0), Duration::from_millis(200));
        assert_eq!(backoff(1), Duration::from_millis(400));
        assert_eq!(backoff(20), BACKOFF_MAX);
    }
}
