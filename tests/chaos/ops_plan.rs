//! The seeded generator of operator-action sequences: one `u64` seed → one [`Plan`] (the
//! cutover, if any, and the list of steps), so a failing sequence is replayed from its seed
//! alone (`MSGEXCHANGE_OPS_SEED=<n>`).

use std::fmt;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A cutover mode of `pipeline.cutover_watermark`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// W below the first stock row: the stock is read.
    Min,
    /// W = 0: the stock is read.
    Zero,
    /// W = the highest stock id: the stock is skipped.
    Max,
    /// W = the stock id at this index (0-based) of the visible stock: the rows up to it skipped.
    At(usize),
}

/// A cutover on a fresh store with stock in the inbox.
#[derive(Debug, Clone)]
pub struct Cutover {
    /// The mode.
    pub mode: Mode,
    /// Stock rows written before the first start.
    pub stock: usize,
    /// Of those, rows the previous system marked (by index).
    pub premarked: Vec<usize>,
    /// A rolled-back insert after this stock index (a gap in the stock).
    pub gap_after: Option<usize>,
    /// Stock rows of an unknown type (by index): FAILED if read.
    pub unknown: Vec<usize>,
}

/// Which store a cut hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// Our PostgreSQL.
    Pg,
    /// The MySQL inbox.
    My,
}

/// One step of a sequence.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// The upstream simulator writes `total` messages in the background (held commits,
    /// rollbacks, malformed and unknown types).
    Write { total: u64, sim_seed: u64 },
    /// The simulator again with an earlier write's seed: business duplicates.
    Duplicate { total: u64, sim_seed: u64 },
    /// Direct inserts as upstream: good messages, one held open `hold_ms` (then committed or
    /// rolled back).
    Insert {
        good: usize,
        hold_ms: u64,
        rollback: bool,
    },
    /// `kill -9` of the active instance; a new one starts.
    Kill9,
    /// SIGTERM of the active instance (exit 0); a new one starts.
    Term,
    /// A store's connections cut for `ms` (the proxy drops and refuses them).
    Cut { store: StoreKind, ms: u64 },
    /// Replay of DEAD rows: by ids with the state seen, or by class and id range.
    Replay { by_class: bool, max_rows: usize },
    /// Approved skip of a range at or below W around a FIFO head held by an unknown type.
    Skip { followers: usize, before: usize },
    /// The DB owner deletes a processed row before it is marked, restores it, and the operator
    /// runs `recover-backfill`.
    RecoverBackfill,
    /// The DB owner purges up to the READY boundary (`purge-readiness --json`).
    Purge,
    /// Plan B: the DB owner rotates the inbox table (seeded `AUTO_INCREMENT`) while writers run,
    /// dropping rows up to the READY boundary.
    Rotate,
    /// DEAD events (topic missing) requeued after the topic exists.
    Requeue,
    /// A standby waits; the active freezes past its lease; the standby takes over; the old one,
    /// thawed, exits 1.
    Takeover,
    /// Let the pipeline run.
    Pause { ms: u64 },
}

impl Step {
    /// The kind, for the summary.
    pub fn kind(&self) -> &'static str {
        match self {
            Step::Write { .. } => "write",
            Step::Duplicate { .. } => "duplicate",
            Step::Insert { .. } => "insert",
            Step::Kill9 => "kill9",
            Step::Term => "sigterm",
            Step::Cut {
                store: StoreKind::Pg,
                ..
            } => "cut_pg",
            Step::Cut {
                store: StoreKind::My,
                ..
            } => "cut_mysql",
            Step::Replay { .. } => "replay",
            Step::Skip { .. } => "skip",
            Step::RecoverBackfill => "recover_backfill",
            Step::Purge => "purge",
            Step::Rotate => "rotate",
            Step::Requeue => "requeue",
            Step::Takeover => "takeover",
            Step::Pause { .. } => "pause",
        }
    }
}

/// One sequence.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Its seed.
    pub seed: u64,
    /// A cutover before the first start (else a plain fresh start).
    pub cutover: Option<Cutover>,
    /// The events topic is missing at first (DEAD events, requeued by a [`Step::Requeue`]).
    pub dispatch_outage: bool,
    /// The steps, in order.
    pub steps: Vec<Step>,
}

/// Operator actions one of which every sequence features (seed modulo their count), so a
/// fixed set of consecutive seeds covers each of them.
const FEATURED: &[&str] = &[
    "cutover", "replay", "skip", "recover", "purge", "rotate", "requeue", "takeover",
];

impl Plan {
    /// The plan of this seed.
    pub fn generate(seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let featured = FEATURED[(seed % FEATURED.len() as u64) as usize];
        let forced = (featured == "cutover").then_some((seed / FEATURED.len() as u64) as usize);
        let cutover = (forced.is_some() || rng.random_bool(0.3)).then(|| cutover(&mut rng, forced));
        let dispatch_outage = featured == "requeue" || rng.random_bool(0.1);
        let mut steps = vec![write(&mut rng, seed, 1)];
        if dispatch_outage {
            steps.push(Step::Requeue);
        }
        let featured_step = match featured {
            "replay" => Some(replay(&mut rng)),
            "skip" => Some(skip(&mut rng)),
            "recover" => Some(Step::RecoverBackfill),
            "purge" => Some(Step::Purge),
            "rotate" => Some(Step::Rotate),
            "takeover" => Some(Step::Takeover),
            _ => None,
        };
        let n = rng.random_range(4..=7);
        let mut writes = 1;
        for _ in 0..n {
            let step = match rng.random_range(0..100) {
                0..=14 => {
                    writes += 1;
                    write(&mut rng, seed, writes)
                }
                15..=19 => Step::Duplicate {
                    total: 15,
                    sim_seed: sim_seed(seed, rng.random_range(1..=writes)),
                },
                20..=29 => Step::Insert {
                    good: rng.random_range(1..=4),
                    hold_ms: rng.random_range(200..3500),
                    rollback: rng.random_bool(0.3),
                },
                30..=37 => Step::Kill9,
                38..=41 => Step::Term,
                42..=51 => Step::Cut {
                    store: if rng.random_bool(0.5) {
                        StoreKind::Pg
                    } else {
                        StoreKind::My
                    },
                    ms: rng.random_range(300..2000),
                },
                52..=61 => replay(&mut rng),
                62..=69 => skip(&mut rng),
                70..=75 => Step::RecoverBackfill,
                76..=83 => Step::Purge,
                84..=87 => Step::Rotate,
                88..=91 => Step::Takeover,
                _ => Step::Pause {
                    ms: rng.random_range(200..1500),
                },
            };
            steps.push(step);
        }
        if let Some(s) = featured_step {
            let at = rng.random_range(1..=steps.len());
            steps.insert(at, s);
            // Issue 19's second regression: a purge right after a replay, while the replayed
            // row (still carrying its old mark) waits for the pump.
            if featured == "purge" && rng.random_bool(0.5) {
                steps.insert(at, replay(&mut rng));
            }
        }
        Self {
            seed,
            cutover,
            dispatch_outage,
            steps,
        }
    }
}

fn sim_seed(seed: u64, n: u64) -> u64 {
    seed * 1_000 + n
}

fn write(rng: &mut StdRng, seed: u64, n: u64) -> Step {
    Step::Write {
        total: rng.random_range(10..=30),
        sim_seed: sim_seed(seed, n),
    }
}

fn replay(rng: &mut StdRng) -> Step {
    Step::Replay {
        by_class: rng.random_bool(0.4),
        max_rows: rng.random_range(1..=3),
    }
}

fn skip(rng: &mut StdRng) -> Step {
    Step::Skip {
        followers: rng.random_range(1..=4),
        before: rng.random_range(0..=3),
    }
}

/// A cutover; `forced` picks the mode (modulo 4) for the sequences that feature it.
fn cutover(rng: &mut StdRng, forced: Option<usize>) -> Cutover {
    let stock = rng.random_range(8..=20);
    let drawn = rng.random_range(0..4);
    let mode = match forced.map_or(drawn, |f| f % 4) {
        0 => Mode::Min,
        1 => Mode::Zero,
        2 => Mode::Max,
        _ => Mode::At(rng.random_range(1..stock - 1)),
    };
    let premarked = (0..stock).filter(|_| rng.random_bool(0.5)).collect();
    let unknown = (0..stock).filter(|_| rng.random_bool(0.1)).collect();
    let gap_after = rng.random_bool(0.5).then(|| rng.random_range(0..stock - 1));
    Cutover {
        mode,
        stock,
        premarked,
        gap_after,
        unknown,
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "sequence seed {} (MSGEXCHANGE_OPS_SEED={}):",
            self.seed, self.seed
        )?;
        if let Some(c) = &self.cutover {
            writeln!(
                f,
                "  cutover {:?}: {} stock rows, premarked {:?}, unknown {:?}, gap after {:?}",
                c.mode, c.stock, c.premarked, c.unknown, c.gap_after
            )?;
        }
        if self.dispatch_outage {
            writeln!(f, "  events topic missing at start (DEAD events)")?;
        }
        for (i, s) in self.steps.iter().enumerate() {
            writeln!(f, "  {:>2}. {s:?}", i + 1)?;
        }
        Ok(())
    }
}

#[test]
fn a_seed_makes_the_same_plan_and_the_fixed_set_covers_every_action() {
    let a = Plan::generate(7);
    let b = Plan::generate(7);
    assert_eq!(a.steps, b.steps);
    let kinds: std::collections::HashSet<&str> = (1..=25u64)
        .flat_map(|s| Plan::generate(s).steps)
        .map(|s| s.kind())
        .collect();
    for k in [
        "write",
        "replay",
        "skip",
        "recover_backfill",
        "purge",
        "rotate",
        "requeue",
        "takeover",
        "kill9",
        "cut_pg",
        "cut_mysql",
    ] {
        assert!(kinds.contains(k), "{k} missing from seeds 1..=25");
    }
    let modes: std::collections::HashSet<String> = (1..=25u64)
        .filter_map(|s| Plan::generate(s).cutover)
        .map(|c| format!("{:?}", c.mode).chars().take(2).collect())
        .collect();
    assert_eq!(modes.len(), 4, "cutover modes in seeds 1..=25: {modes:?}");
}
