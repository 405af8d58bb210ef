//! Housekeeper (issue 13 item 5): applies `[retention]` — PROC_STATE → PROC_STATE_HST, then
//! the expired rows of SCHD_SNAP_LOG, MSG_EVENT (SENT), AUDIT_LOG and LATE_WATCH — as jobs of
//! [`msgx_core::retention::Job`] steps. A child of its own beside the pump and the sweeper:
//! it shares no mailbox with them, each step is one bounded batch in its own transaction, and
//! steps are `retention.batch_pause` apart, so a long job never delays marking or processing
//! (tests/housekeeping.rs measures the sweep period beside a large job).
//!
//! Timing: a job starts `first_delay` after start (then every `retention.period` after the
//! previous one finished) or on [`HousekeepNow`]; cut-offs come from the injected clock.
//!
//! It also vacuums our tables where the server's autovacuum does not ([`VacuumCheck`] every
//! `retention.vacuum_check`, `msgx_core::retention::vacuum`). Both handlers are atomic, so a
//! VACUUM and a retention batch never run at once.

use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, ActorFutureExt, AtomicResponse, Context, Handler, WrapFuture};
use msgx_core::clock::SharedClock;
use msgx_core::retention::{vacuum_step, Job, JobReport, RetentionConfig, VacuumPolicy};
use msgx_core::settings::VacuumMode;
use msgx_core::store::Store;

use crate::child::Child;
use crate::messages::{HousekeepNow, HousekeepingStep, LastHousekeeping, VacuumCheck};
use crate::next_run::NextRun;

/// The first job waits at most this long after start (a service restarted more often than
/// `retention.period` still runs its jobs).
pub const FIRST_DELAY_MAX: Duration = Duration::from_secs(60);

/// The housekeeping actor.
pub struct Housekeeper {
    store: Store,
    clock: SharedClock,
    cfg: Arc<RetentionConfig>,
    /// Pause from the end of one job to the start of the next.
    period: Duration,
    /// Pause from start to the first job.
    first_delay: Duration,
    /// The job in progress (taken out while its step runs).
    job: Option<Job>,
    /// A step is running (the job is out of `job`).
    stepping: bool,
    /// Jobs finished so far and the last one's report.
    finished: (u64, Option<JobReport>),
    /// The pending timer: the next step while a job runs, else the next job.
    next: NextRun,
    /// `retention.vacuum*`.
    vacuum: VacuumPolicy,
    /// `retention.vacuum_check`.
    vacuum_every: Duration,
    /// The next vacuum check.
    vacuum_next: NextRun,
}

impl Housekeeper {
    /// A housekeeper; its first job starts `min(period, FIRST_DELAY_MAX)` after start.
    pub fn new(store: Store, clock: SharedClock, cfg: RetentionConfig, period: Duration) -> Self {
        Self {
            store,
            clock,
            cfg: Arc::new(cfg),
            period,
            first_delay: period.min(FIRST_DELAY_MAX),
            job: None,
            stepping: false,
            finished: (0, None),
            next: NextRun::default(),
            vacuum: VacuumPolicy {
                mode: VacuumMode::Off,
                threshold: 0.0,
                scale_factor: 0.0,
            },
            vacuum_every: Duration::from_secs(15),
            vacuum_next: NextRun::default(),
        }
    }

    /// Vacuums our tables by `policy`, checking every `every` (`retention.vacuum*`; off
    /// unless set).
    pub fn with_vacuum(mut self, policy: VacuumPolicy, every: Duration) -> Self {
        self.vacuum = policy;
        self.vacuum_every = every;
        self
    }
}

impl Actor for Housekeeper {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        tracing::info!(
            period = ?self.period,
            batch = self.cfg.batch,
            vacuum = ?self.vacuum.mode,
            vacuum_check = ?self.vacuum_every,
            "housekeeper started"
        );
        self.next.arm(ctx, HousekeepNow, self.first_delay, false);
        if self.vacuum.mode != VacuumMode::Off {
            self.vacuum_next
                .arm(ctx, VacuumCheck, self.vacuum_every, false);
        }
    }
}

impl Handler<HousekeepNow> for Housekeeper {
    type Result = bool;

    fn handle(&mut self, _: HousekeepNow, ctx: &mut Self::Context) -> bool {
        if self.job.is_some() || self.stepping {
            return false;
        }
        let job = Job::new(self.clock.now());
        tracing::info!(now = %job.now, "retention job started");
        self.job = Some(job);
        self.next.arm(ctx, HousekeepingStep, Duration::ZERO, false);
        true
    }
}

impl Handler<HousekeepingStep> for Housekeeper {
    type Result = AtomicResponse<Self, ()>;

    fn handle(&mut self, _: HousekeepingStep, ctx: &mut Self::Context) -> Self::Result {
        self.next.cancel(ctx);
        let Some(mut job) = self.job.take() else {
            return AtomicResponse::new(Box::pin(actix::fut::ready(())));
        };
        self.stepping = true;
        let (store, clock, cfg) = (self.store.clone(), self.clock.clone(), self.cfg.clone());
        let step = async move {
            let more = job.step(&store, &cfg, clock.now()).await;
            (job, more)
        };
        AtomicResponse::new(Box::pin(step.into_actor(self).map(
            |(job, more), act, ctx| {
                act.stepping = false;
                if more {
                    act.job = Some(job);
                    act.next
                        .arm(ctx, HousekeepingStep, act.cfg.batch_pause, false);
                } else {
                    act.finished = (act.finished.0 + 1, Some(job.report));
                    act.next.arm(ctx, HousekeepNow, act.period, false);
                }
            },
        )))
    }
}

impl Handler<VacuumCheck> for Housekeeper {
    type Result = AtomicResponse<Self, ()>;

    fn handle(&mut self, _: VacuumCheck, ctx: &mut Self::Context) -> Self::Result {
        self.vacuum_next.cancel(ctx);
        let (store, policy) = (self.store.clone(), self.vacuum);
        let check = async move {
            if let Err(e) = vacuum_step(&store, &policy).await {
                msgx_core::telemetry::vacuum_failed("", &e.to_string());
            }
        };
        AtomicResponse::new(Box::pin(check.into_actor(self).map(|(), act, ctx| {
            act.vacuum_next
                .arm(ctx, VacuumCheck, act.vacuum_every, false);
        })))
    }
}

impl Handler<LastHousekeeping> for Housekeeper {
    type Result = actix::MessageResult<LastHousekeeping>;

    fn handle(&mut self, _: LastHousekeeping, _: &mut Self::Context) -> Self::Result {
        actix::MessageResult(self.finished.clone())
    }
}

// A shutdown is handled between two steps (each step is atomic): the job stops there; its
// batches so far are committed, the rest is the next instance's job.
crate::child_actor!(Housekeeper, Child::Housekeeper);
