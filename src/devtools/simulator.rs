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

use crate::devtools::messages::{Generator, Mix};
use crate::inbox::names::InboxNames;
use crate::inbox::time::utc_to_local;

/// Minimum size of a "huge" message (a big airport's full daily schedule): just over 1 MiB,
/// so large `LONGTEXT` rows and the reader's size handling are exercised.
pub const HUGE_MESSAGE_BYTES: usize = (1 << 20) + 4096;

/// How often progress is logged while the simulation runs.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// What the simulated upstream does; every knob has a realistic default.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// Target messages per second over all connections (INSERTs started, paced evenly).
    /// `<= 0` means as fast as the connections allow. Held transactions occupy their worker,
    /// so the reachable rate is about `connections / (write latency + hold_fraction ×
    /// hold_max / 2)`; the progress log shows the rate actually reached.
    pub rate_per_sec: f64,
    /// Concurrent writers, each with its own transaction on its own pooled connection.
    /// Concurrency is what lets a smaller id commit after a larger one. The pool must allow
    /// at least this many connections, or writers queue on the pool.
    pub connections: usize,
    /// Stop after this many attempted messages (committed + rolled back); None = no limit.
    pub total: Option<u64>,
    /// Stop starting new messages after this long; None = no limit.
    pub duration: Option<Duration>,
    /// Fraction of transactions held open after the INSERT: the source of late commits.
    pub hold_fraction: f64,
    /// Upper bound of a hold (uniform in `0..hold_max`). Compare with the service's
    /// `max-commit-delay`: holds shorter than it are waited for, longer ones become late rows.
    pub hold_max: Duration,
    /// Fraction of transactions rolled back: their ids become permanent holes.
    pub rollback_fraction: f64,
    /// Fraction of rows written with a NULL receive time (the column is nullable; SPEC G4).
    pub null_received_fraction: f64,
    /// Fraction of messages that are a huge daily schedule of ≥ [`HUGE_MESSAGE_BYTES`].
    pub huge_fraction: f64,
    /// The kinds of messages written (FLOP updates, schedules, deletes, malformed, …).
    pub mix: Mix,
    /// Seeds the message generator and every worker's decisions, so message content and each
    /// worker's choices repeat for a seed (the interleaving of workers does not). The
    /// generator's sequence numbers derive from it: reusing a seed on the same inbox repeats
    /// message identities, which the service treats as business duplicates.
    pub seed: u64,
}

impl Default for SimConfig {
    /// 100 msg/s from 8 connections, 5% held up to 3 s, 1% rolled back, 0.5% NULL receive
    /// time, 0.1% huge, the default [`Mix`], no end (stop by signal), and a seed from the wall
    /// clock so repeated runs do not repeat message identities.
    ///
    /// 8 connections (not fewer) so that the default holds still leave room for 100 msg/s,
    /// while staying under sqlx's default pool size of 10.
    fn default() -> Self {
        Self {
            rate_per_sec: 100.0,
            connections: 8,
            total: None,
            duration: None,
            hold_fraction: 0.05,
            hold_max: Duration::from_secs(3),
            rollback_fraction: 0.01,
            null_received_fraction: 0.005,
            huge_fraction: 0.001,
            mix: Mix::default(),
            seed: clock_seed(),
        }
    }
}

/// A seed from the wall clock (nanoseconds since the epoch; 0 if the clock is before it).
fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

impl SimConfig {
    /// Checks the configuration before any connection is used.
    pub fn validate(&self) -> Result<(), SimError> {
        if self.connections == 0 {
            return Err(SimError::Config("connections must be at least 1".into()));
        }
        if !self.rate_per_sec.is_finite() {
            return Err(SimError::Config(format!(
                "rate_per_sec must be a number (<= 0 for unpaced), got {}",
                self.rate_per_sec
            )));
        }
        for (name, v) in [
            ("hold_fraction", self.hold_fraction),
            ("rollback_fraction", self.rollback_fraction),
            ("null_received_fraction", self.null_received_fraction),
            ("huge_fraction", self.huge_fraction),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(SimError::Config(format!(
                    "{name} must be within 0..=1, got {v}"
                )));
            }
        }
        Ok(())
    }

    /// The pause between two paced INSERT starts; None when unpaced.
    fn interval(&self) -> Option<Duration> {
        (self.rate_per_sec > 0.0)
            .then(|| Duration::try_from_secs_f64(1.0 / self.rate_per_sec).ok())
            .flatten()
            .filter(|d| !d.is_zero())
    }
}

/// What the simulation did, exactly: every attempted row is in one of the two id lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimReport {
    /// Ids of committed rows, ascending: the rows the service must eventually process.
    pub committed_ids: Vec<i64>,
    /// Ids taken by rolled-back transactions, ascending: permanent holes that never fill.
    pub rolled_back_ids: Vec<i64>,
    /// Transactions held open after their INSERT (committed or rolled back afterwards).
    pub held: u64,
    /// Commits of an id smaller than one already committed (as observed by the simulator):
    /// the late commits the poller's hole rule has to wait for.
    pub late_commits: u64,
    /// Wall time from start until the last worker finished.
    pub elapsed: Duration,
}

impl SimReport {
    /// Number of committed rows.
    pub fn committed(&self) -> u64 {
        self.committed_ids.len() as u64
    }

    /// Number of rolled-back rows (permanent holes).
    pub fn rolled_back(&self) -> u64 {
        self.rolled_back_ids.len() as u64
    }

    /// Rows attempted: committed + rolled back.
    pub fn attempted(&self) -> u64 {
        self.committed() + self.rolled_back()
    }

    /// Committed rows per second over the whole run (0 for an instant run).
    pub fn commit_rate(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.committed() as f64 / secs
        } else {
            0.0
        }
    }

    /// The highest id taken (committed or rolled back), if any.
    pub fn max_id(&self) -> Option<i64> {
        let c = self.committed_ids.last().copied();
        let r = self.rolled_back_ids.last().copied();
        c.max(r)
    }
}

/// Why a simulation stopped early.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The configuration cannot be run (nothing was written).
    #[error("invalid simulator configuration: {0}")]
    Config(String),
    /// A database operation failed; the failing worker's open transaction was rolled back
    /// and the other workers finished theirs before returning.
    #[error("inbox write failed: {0}")]
    Db(#[from] sqlx::Error),
    /// A worker task panicked or was cancelled.
    #[error("simulator worker failed: {0}")]
    Join(#[from] tokio::task::JoinError),
    /// MySQL returned an auto-increment id that does not fit BIGINT (a misconfigured table).
    #[error("inbox returned id {0}, beyond the BIGINT range")]
    IdOutOfRange(u64),
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_sane() {
        let cfg = SimConfig::default();
        cfg.validate().expect("default config is valid");
        assert_eq!(cfg.rate_per_sec, 100.0);
        assert!(
            cfg.connections >= 2,
            "concurrency is what produces late commits"
        );
        assert!(cfg.hold_fraction > 0.0 && cfg.rollback_fraction > 0.0);
        assert!(cfg.hold_max > Duration::ZERO);
        assert!(cfg.huge_fraction < cfg.null_received_fraction);
        assert_eq!(cfg.interval(), Some(Duration::from_millis(10)));
        // Holds must not make the default rate unreachable.
        let per_msg = 0.005 + cfg.hold_fraction * cfg.hold_max.as_secs_f64() / 2.0;
        assert!(cfg.connections as f64 / per_msg >= cfg.rate_per_sec * 0.9);
    }

    #[test]
    fn validation_rejects_nonsense() {
        let ok = SimConfig {
            seed: 1,
            ..SimConfig::default()
        };
        let bad = [
            SimConfig {
                connections: 0,
                ..ok.clone()
            },
            SimConfig {
                rate_per_sec: f64::NAN,
                ..ok.clone()
            },
            SimConfig {
                hold_fraction: 1.5,
                ..ok.clone()
            },
            SimConfig {
                rollback_fraction: -0.1,
                ..ok.clone()
            },
            SimConfig {
                null_received_fraction: f64::NAN,
                ..ok.clone()
            },
            SimConfig {
                huge_fraction: 2.0,
                ..ok.clone()
            },
        ];
        for cfg in bad {
            assert!(
                matches!(cfg.validate(), Err(SimError::Config(_))),
                "{cfg:?}"
            );
        }
        let unpaced = SimConfig {
            rate_per_sec: 0.0,
            ..ok
        };
        unpaced.validate().expect("unpaced is valid");
        assert_eq!(unpaced.interval(), None);
    }

    #[test]
    fn report_counts() {
        let r = SimReport {
            committed_ids: vec![1, 2, 4],
            rolled_back_ids: vec![3, 5],
            held: 1,
            late_commits: 1,
            elapsed: Duration::from_secs(2),
        };
        assert_eq!(r.committed(), 3);
        assert_eq!(r.rolled_back(), 2);
        assert_eq!(r.attempted(), 5);
        assert_eq!(r.max_id(), Some(5));
        assert!((r.commit_rate() - 1.5).abs() < 1e-9);
        assert_eq!(SimReport::default().commit_rate(), 0.0);
        assert_eq!(SimReport::default().max_id(), None);
    }

    #[test]
    fn plans_follow_the_fractions() {
        // No database: only the planning step (generator + decisions).
        let cfg = SimConfig {
            hold_fraction: 1.0,
            rollback_fraction: 0.0,
            null_received_fraction: 1.0,
            huge_fraction: 0.0,
            seed: 3,
            ..SimConfig::default()
        };
        let tz: Tz = "Asia/Shanghai".parse().expect("zone");
        let generator = StdMutex::new(Generator::new(cfg.seed));
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..50 {
            let p = plan(&cfg, tz, &generator, &mut rng);
            assert!(p.received.is_none());
            assert!(!p.rollback);
            assert!(p.hold.is_some_and(|h| h < cfg.hold_max));
            assert!(p.text.contains("<MSG"));
        }
        let huge = SimConfig {
            huge_fraction: 1.0,
            ..cfg
        };
        let p = plan(&huge, tz, &generator, &mut rng);
        assert!(p.text.len() >= HUGE_MESSAGE_BYTES);
    }
}
