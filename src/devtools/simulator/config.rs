//! What a simulation is asked to do ([`SimConfig`], every knob with a realistic default and
//! checked before anything is written) and what it reports back ([`SimReport`], [`SimError`]).
//! Separate from the run itself (`simulator.rs`: the paced workers and their transactions)
//! because the dev CLI and the tests build and check these without touching a database.

use std::time::Duration;

use crate::devtools::messages::Mix;

/// Minimum size of a "huge" message (a big airport's full daily schedule): just over 1 MiB,
/// so large `LONGTEXT` rows and the reader's size handling are exercised.
pub const HUGE_MESSAGE_BYTES: usize = (1 << 20) + 4096;

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
    pub(super) fn interval(&self) -> Option<Duration> {
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
