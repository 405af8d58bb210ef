//! `msgexchange dev simulate-upstream`: acts as upstream (AODB/CIIMS) writing into the shared
//! MySQL inbox, the way the real writers do, so the poller's hole rule meets real holes.
//!
//! Several workers, each on its own pooled connection, insert rows at a shared, paced rate.
//! Some transactions stay open for a random delay after the INSERT (their auto-increment id
//! is already taken, so larger ids commit first: a *late commit*), and some roll back (their
//! id is never used: a *permanent hole*). Only the receive-time and message columns are
//! written; the processed-mark columns belong to the service. The service never calls this.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use chrono::{NaiveDateTime, Timelike, Utc};
use chrono_tz::Tz;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::MySqlPool;
use tokio::sync::{watch, Mutex};
use tokio::task::JoinSet;
use tokio::time::Instant;

mod config;
#[cfg(test)]
mod tests;

pub use config::{SimConfig, SimError, SimReport, HUGE_MESSAGE_BYTES};

use crate::devtools::messages::Generator;
use crate::inbox::names::InboxNames;
use crate::inbox::time::utc_to_local;

/// How often progress is logged while the simulation runs.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// State every worker shares.
struct Shared {
    /// Where rows go.
    pool: MySqlPool,
    /// The INSERT, built once from the validated, back-quoted names.
    sql: String,
    /// Airport zone of the receive-time column and of message times.
    tz: Tz,
    /// The run's settings.
    cfg: SimConfig,
    /// One generator for all workers: sequence numbers stay unique and increasing (it is
    /// only locked while rendering, never across an await).
    generator: StdMutex<Generator>,
    /// Start time of the next paced slot (global rate limiter).
    next_slot: Mutex<Instant>,
    /// Pause between slots; None = unpaced.
    interval: Option<Duration>,
    /// When to stop starting messages.
    deadline: Option<Instant>,
    /// Messages claimed so far (bounded by `cfg.total`).
    attempted: AtomicU64,
    /// Progress counters for the log.
    committed: AtomicU64,
    rolled_back: AtomicU64,
    held: AtomicU64,
    late_commits: AtomicU64,
    /// Largest committed id so far, to count late commits.
    max_committed: AtomicI64,
    /// Set when a worker failed: the others stop starting messages.
    abort: AtomicBool,
}

impl Shared {
    /// The run's shared state, the pacing starting at `start`.
    fn new(pool: &MySqlPool, names: &InboxNames, tz: Tz, cfg: &SimConfig, start: Instant) -> Self {
        Shared {
            pool: pool.clone(),
            sql: format!(
                "INSERT INTO {} ({}, {}) VALUES (?, ?)",
                names.table, names.received, names.message
            ),
            tz,
            cfg: cfg.clone(),
            generator: StdMutex::new(Generator::new(cfg.seed)),
            next_slot: Mutex::new(start),
            interval: cfg.interval(),
            deadline: cfg.duration.and_then(|d| start.checked_add(d)),
            attempted: AtomicU64::new(0),
            committed: AtomicU64::new(0),
            rolled_back: AtomicU64::new(0),
            held: AtomicU64::new(0),
            late_commits: AtomicU64::new(0),
            max_committed: AtomicI64::new(i64::MIN),
            abort: AtomicBool::new(false),
        }
    }

    /// Logs the counters and the commit rate since `last` (time, committed); the new `last`.
    fn log_progress(&self, last: (Instant, u64)) -> (Instant, u64) {
        let now = Instant::now();
        let (committed, rolled_back, held, late_commits) = self.progress();
        let window = now.duration_since(last.0).as_secs_f64();
        let rate = if window > 0.0 {
            committed.saturating_sub(last.1) as f64 / window
        } else {
            0.0
        };
        tracing::info!(
            committed,
            rolled_back,
            held,
            late_commits,
            rate = (rate * 10.0).round() / 10.0,
            "simulate-upstream progress"
        );
        (now, committed)
    }

    /// True when no new message may start.
    fn done(&self, stop: &watch::Receiver<bool>) -> bool {
        self.abort.load(Ordering::Relaxed)
            || *stop.borrow()
            || self.deadline.is_some_and(|d| Instant::now() >= d)
            || self
                .cfg
                .total
                .is_some_and(|t| self.attempted.load(Ordering::Relaxed) >= t)
    }

    /// Claims one attempt within `total`; false when the budget is spent.
    fn claim(&self) -> bool {
        match self.cfg.total {
            None => {
                self.attempted.fetch_add(1, Ordering::Relaxed);
                true
            }
            Some(total) => self
                .attempted
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    (n < total).then_some(n + 1)
                })
                .is_ok(),
        }
    }

    /// Reserves the next paced start time.
    async fn reserve_slot(&self, interval: Duration) -> Instant {
        let mut next = self.next_slot.lock().await;
        // No catch-up bursts: a slot in the past starts now and the schedule moves on.
        let slot = (*next).max(Instant::now());
        *next = slot + interval;
        slot
    }

    fn progress(&self) -> (u64, u64, u64, u64) {
        (
            self.committed.load(Ordering::Relaxed),
            self.rolled_back.load(Ordering::Relaxed),
            self.held.load(Ordering::Relaxed),
            self.late_commits.load(Ordering::Relaxed),
        )
    }
}

/// One worker's share of the report.
#[derive(Default)]
struct WorkerLog {
    committed: Vec<i64>,
    rolled_back: Vec<i64>,
    held: u64,
    late_commits: u64,
}

/// Resolves once `stop` holds `true`; never, if its sender is gone without saying so.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The receive time upstream writes: local airport time, whole seconds (DATETIME(0)).
fn local_now(tz: Tz) -> NaiveDateTime {
    let t = utc_to_local(Utc::now(), tz);
    t.with_nanosecond(0).unwrap_or(t)
}

/// What to do with one message, decided before any I/O.
struct Plan {
    received: Option<NaiveDateTime>,
    text: String,
    hold: Option<Duration>,
    rollback: bool,
}

fn plan(cfg: &SimConfig, tz: Tz, generator: &StdMutex<Generator>, rng: &mut StdRng) -> Plan {
    let now = local_now(tz);
    let received = (!rng.random_bool(cfg.null_received_fraction)).then_some(now);
    let huge = rng.random_bool(cfg.huge_fraction);
    let hold = (rng.random_bool(cfg.hold_fraction) && !cfg.hold_max.is_zero())
        .then(|| cfg.hold_max.mul_f64(rng.random::<f64>()));
    let rollback = rng.random_bool(cfg.rollback_fraction);
    let text = {
        // A poisoned lock only means another worker panicked mid-render; the generator is
        // still usable (and that worker's panic is reported through its JoinError).
        let mut g = generator
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if huge {
            g.render_huge(now, HUGE_MESSAGE_BYTES)
        } else {
            g.next_message(&cfg.mix, now).1
        }
    };
    Plan {
        received,
        text,
        hold,
        rollback,
    }
}

/// Writes messages until the run ends; an open transaction is always finished as decided.
async fn worker(
    shared: Arc<Shared>,
    index: usize,
    mut stop: watch::Receiver<bool>,
) -> Result<WorkerLog, SimError> {
    let result = run_worker(&shared, index, &mut stop).await;
    if result.is_err() {
        shared.abort.store(true, Ordering::Relaxed);
    }
    result
}

async fn run_worker(
    shared: &Shared,
    index: usize,
    stop: &mut watch::Receiver<bool>,
) -> Result<WorkerLog, SimError> {
    let stream = (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut rng = StdRng::seed_from_u64(shared.cfg.seed ^ stream);
    let mut log = WorkerLog::default();
    loop {
        if shared.done(stop) {
            break;
        }
        if let Some(interval) = shared.interval {
            let slot = shared.reserve_slot(interval).await;
            let wake = shared.deadline.map_or(slot, |d| slot.min(d));
            tokio::select! {
                _ = tokio::time::sleep_until(wake) => {}
                _ = stopped(stop) => break,
            }
            if shared.done(stop) {
                break;
            }
        }
        if !shared.claim() {
            break;
        }
        let p = plan(&shared.cfg, shared.tz, &shared.generator, &mut rng);

        let mut tx = shared.pool.begin().await?;
        let done = sqlx::query(&shared.sql)
            .bind(p.received)
            .bind(p.text)
            .execute(&mut *tx)
            .await?;
        let raw_id = done.last_insert_id();
        let id = i64::try_from(raw_id).map_err(|_| SimError::IdOutOfRange(raw_id))?;

        if let Some(hold) = p.hold {
            log.held += 1;
            shared.held.fetch_add(1, Ordering::Relaxed);
            // A stop request cuts the hold short; the transaction still ends as decided.
            tokio::select! {
                _ = tokio::time::sleep(hold) => {}
                _ = stopped(stop) => {}
            }
        }

        if p.rollback {
            tx.rollback().await?;
            log.rolled_back.push(id);
            shared.rolled_back.fetch_add(1, Ordering::Relaxed);
        } else {
            tx.commit().await?;
            log.committed.push(id);
            shared.committed.fetch_add(1, Ordering::Relaxed);
            if shared.max_committed.fetch_max(id, Ordering::Relaxed) > id {
                log.late_commits += 1;
                shared.late_commits.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    Ok(log)
}

/// Runs the simulated upstream against `names.table` until `cfg.total` messages were
/// attempted, `cfg.duration` elapsed, or `stop` turns true, whichever comes first.
///
/// Rows get the receive time `utc_to_local(now, tz)` (or NULL) and a generated message; the
/// processed-mark columns are never written. Each worker finishes its open transaction
/// before exiting, so the report lists exactly the committed and the rolled-back ids.
/// On a database error the other workers stop starting messages, finish theirs, and the
/// first error is returned. Dropping the returned future aborts the workers; their open
/// transactions then roll back.
pub async fn simulate(
    pool: &MySqlPool,
    names: &InboxNames,
    tz: Tz,
    cfg: &SimConfig,
    stop: watch::Receiver<bool>,
) -> Result<SimReport, SimError> {
    cfg.validate()?;
    let start = Instant::now();
    let shared = Arc::new(Shared::new(pool, names, tz, cfg, start));
    tracing::info!(
        table = names.table.as_str(),
        rate_per_sec = cfg.rate_per_sec,
        connections = cfg.connections,
        total = ?cfg.total,
        duration = ?cfg.duration,
        seed = cfg.seed,
        "simulate-upstream started"
    );
    let mut workers = JoinSet::new();
    for index in 0..cfg.connections {
        workers.spawn(worker(Arc::clone(&shared), index, stop.clone()));
    }
    let (mut report, first_error) = collect(&mut workers, &shared, start).await;
    report.elapsed = start.elapsed();
    if let Some(e) = first_error {
        tracing::warn!(error = %e, "simulate-upstream failed");
        return Err(e);
    }
    report.committed_ids.sort_unstable();
    report.rolled_back_ids.sort_unstable();
    tracing::info!(
        committed = report.committed(),
        rolled_back = report.rolled_back(),
        held = report.held,
        late_commits = report.late_commits,
        elapsed_s = (report.elapsed.as_secs_f64() * 10.0).round() / 10.0,
        rate = (report.commit_rate() * 10.0).round() / 10.0,
        "simulate-upstream finished"
    );
    Ok(report)
}

/// Gathers the workers' logs as they end, logging progress every [`PROGRESS_EVERY`]; a failed
/// worker stops the others from starting messages. The report and the first error.
async fn collect(
    workers: &mut JoinSet<Result<WorkerLog, SimError>>,
    shared: &Shared,
    start: Instant,
) -> (SimReport, Option<SimError>) {
    let mut tick = tokio::time::interval_at(start + PROGRESS_EVERY, PROGRESS_EVERY);
    let mut last = (start, 0u64);
    let mut report = SimReport::default();
    let mut first_error: Option<SimError> = None;
    loop {
        tokio::select! {
            joined = workers.join_next() => match joined {
                None => break,
                Some(Ok(Ok(log))) => {
                    report.committed_ids.extend(log.committed);
                    report.rolled_back_ids.extend(log.rolled_back);
                    report.held += log.held;
                    report.late_commits += log.late_commits;
                }
                Some(Ok(Err(e))) => {
                    shared.abort.store(true, Ordering::Relaxed);
                    first_error.get_or_insert(e);
                }
                Some(Err(e)) => {
                    shared.abort.store(true, Ordering::Relaxed);
                    first_error.get_or_insert(SimError::Join(e));
                }
            },
            _ = tick.tick() => last = shared.log_progress(last),
        }
    }
    (report, first_error)
}
