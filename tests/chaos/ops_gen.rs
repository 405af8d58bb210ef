//! The seeded generator: one `u64` seed → one [`Plan`]. Every plan has background writers, and
//! at least one operator action run while a fault is live ([`Step::Overlap`]): an upstream
//! writer holding a commit, a store's connection cut, or a burst of writes. A plan that failed
//! is kept as its JSON file, so changing this generator never changes an old regression.

use msgx_core::settings::Delivery;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::ops_msgs::Msg;
use super::ops_plan::{Cutover, Mode, Plan, Step, StoreKind};

/// Actions one of which every sequence features (seed modulo their count), so a fixed run of
/// consecutive seeds covers each of them.
const FEATURED: &[&str] = &[
    "cutover", "replay", "skip", "recover", "purge", "rotate", "requeue", "takeover", "lock",
];

/// Hands out message numbers and writer names while a plan is drawn.
struct Gen {
    rng: StdRng,
    n: i64,
    writers: usize,
}

/// The plan of this seed.
pub fn generate(seed: u64) -> Plan {
    let mut g = Gen {
        rng: StdRng::seed_from_u64(seed),
        n: 100,
        writers: 0,
    };
    let featured = FEATURED[(seed % FEATURED.len() as u64) as usize];
    let forced = (featured == "cutover").then_some((seed / FEATURED.len() as u64) as usize);
    let cutover = (forced.is_some() || g.rng.random_bool(0.25)).then(|| g.cutover(forced));
    let dispatch_outage = featured == "requeue" || g.rng.random_bool(0.1);
    let mut steps = vec![g.upstream(10..=25)];
    if dispatch_outage {
        steps.push(Step::Requeue);
    }
    for _ in 0..g.rng.random_range(3..=6) {
        let s = g.step();
        steps.push(s);
    }
    let featured_step = match featured {
        "replay" => Some(g.replay()),
        "skip" => Some(g.skip()),
        "recover" => Some(Step::RecoverBackfill),
        "purge" => Some(Step::Purge),
        "rotate" => Some(Step::Rotate),
        "takeover" => Some(Step::Takeover),
        "lock" => Some(g.lock()),
        _ => None,
    };
    if let Some(s) = featured_step {
        let at = g.rng.random_range(1..=steps.len());
        steps.insert(at, s);
    }
    // At least one action while a fault is live, whatever else was drawn.
    if !steps.iter().any(|s| matches!(s, Step::Overlap { .. })) {
        let at = g.rng.random_range(1..=steps.len());
        let o = g.overlap();
        steps.insert(at, o);
    }
    if let Some((at, pair)) = pair_of(seed, steps.len(), dispatch_outage) {
        // A requeue has DEAD events only until it created the events topic: requeue ∥
        // takeover and replay ∥ requeue take the place of the plan's requeue.
        let requeue = steps.iter().position(|s| matches!(s, Step::Requeue));
        match (&pair, requeue) {
            (Step::Pair { first, second }, Some(i))
                if matches!(**first, Step::Requeue) || matches!(**second, Step::Requeue) =>
            {
                steps[i] = pair
            }
            _ => steps.insert(at, pair),
        }
    }
    let mut plan = Plan {
        seed,
        note: String::new(),
        cutover,
        dispatch_outage,
        delivery: delivery_of(seed),
        steps,
    };
    if let Some((at, slow)) = slow_commit_of(&plan) {
        plan.steps.insert(at, slow);
    }
    if let Some((at, shared)) = shared_topic_of(&plan) {
        plan.steps.insert(at, shared);
    }
    plan
}

/// A rebuilt store on the shared topic in about a quarter of the plans whose events topic is
/// there from the start, at a place among the plan's steps (a stream of its own).
fn shared_topic_of(plan: &Plan) -> Option<(usize, Step)> {
    let mut rng = StdRng::seed_from_u64(plan.seed ^ 0x5348_4152);
    if plan.dispatch_outage || !rng.random_bool(0.25) {
        return None;
    }
    let at = rng.random_range(1..=plan.steps.len());
    let msgs = rng.random_range(5..=15);
    Some((at, Step::SharedTopic { msgs }))
}

/// A slow commit in about half of the exactly-once plans that run on the mock cluster (no
/// takeover) with the events topic there from the start (an abort on the missing topic would
/// take the delay), at a place among the plan's steps: drawn from a stream of its own, so the
/// other steps of a seed stay what they were.
fn slow_commit_of(plan: &Plan) -> Option<(usize, Step)> {
    let mut rng = StdRng::seed_from_u64(plan.seed ^ 0x534C_4F57);
    let fits = plan.delivery == Delivery::ExactlyOnce && !plan.dispatch_outage && !plan.on_tansu();
    if !fits || !rng.random_bool(0.5) {
        return None;
    }
    let at = rng.random_range(1..=plan.steps.len());
    Some((at, Step::SlowCommit { ms: 7000 }))
}

/// Two operator actions at once in every other seed and every seed whose events topic is
/// missing at first (replay ∥ purge, recover ∥ purge, skip ∥ `cutover plan`, skip ∥ purge,
/// skip ∥ replay on the replay's rows, recover ∥ rotate; where the topic is missing, so that
/// a requeue has DEAD events, requeue ∥ takeover and replay ∥ requeue), at a place among
/// `steps` steps: drawn from a stream of its own, so the other steps of a seed stay what they
/// were.
fn pair_of(seed: u64, steps: usize, dispatch_outage: bool) -> Option<(usize, Step)> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5041_4952);
    // The kinds take turns by seed, so that a run of consecutive seeds covers them all: the
    // two requeue pairs where a requeue has work (the seeds featuring it are 9 apart), the
    // six others on the even seeds.
    let kind = if dispatch_outage {
        6 + (seed / FEATURED.len() as u64) % 2
    } else if seed.is_multiple_of(2) {
        (seed / 2) % 6
    } else {
        return None;
    };
    let (first, second) = match kind {
        0 => (
            Step::Replay {
                by_class: rng.random_bool(0.4),
                max_rows: rng.random_range(1..=3),
            },
            Step::Purge,
        ),
        1 => (Step::RecoverBackfill, Step::Purge),
        2 => (
            Step::Skip {
                followers: rng.random_range(1..=4),
                before: rng.random_range(0..=3),
            },
            Step::CutoverPlan,
        ),
        3 => (
            Step::Skip {
                followers: rng.random_range(1..=4),
                before: rng.random_range(0..=3),
            },
            Step::Purge,
        ),
        // The skip's range is the replay's rows (its own fields are not used).
        4 => (
            Step::Skip {
                followers: 0,
                before: 0,
            },
            Step::Replay {
                by_class: rng.random_bool(0.4),
                max_rows: rng.random_range(1..=3),
            },
        ),
        5 => (Step::RecoverBackfill, Step::Rotate),
        6 => (
            Step::Replay {
                by_class: rng.random_bool(0.4),
                max_rows: rng.random_range(1..=3),
            },
            Step::Requeue,
        ),
        _ => (Step::Requeue, Step::Takeover),
    };
    let pair = Step::Pair {
        first: Box::new(first),
        second: Box::new(second),
    };
    Some((rng.random_range(1..=steps), pair))
}

/// The delivery mode of a seed: about half the seeds each, by a hash of the seed that draws
/// nothing from the generator's stream (the steps of a seed stay what they were) and does not
/// follow the featured kind (`seed % FEATURED.len()`).
pub fn delivery_of(seed: u64) -> Delivery {
    if seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 63 == 1 {
        Delivery::ExactlyOnce
    } else {
        Delivery::AtLeastOnce
    }
}

impl Gen {
    fn next(&mut self) -> i64 {
        self.n += 1;
        self.n
    }

    fn step(&mut self) -> Step {
        match self.rng.random_range(0..100) {
            0..=14 => self.upstream(10..=30),
            15..=24 => self.hold(200..3500),
            25..=31 => Step::Kill9,
            32..=35 => Step::Term,
            36..=43 => self.cut(),
            44..=51 => self.replay(),
            52..=57 => self.skip(),
            58..=62 => Step::RecoverBackfill,
            63..=69 => Step::Purge,
            70..=72 => Step::Rotate,
            73..=75 => Step::Takeover,
            76..=91 => self.overlap(),
            _ => Step::Pause {
                ms: self.rng.random_range(200..1500),
            },
        }
    }

    /// A writer of its own four flights: updates, deletes, unknown types, malformed rows and
    /// business duplicates of its own earlier updates (written after them, so SKIPPED).
    fn upstream(&mut self, count: std::ops::RangeInclusive<usize>) -> Step {
        self.writers += 1;
        let w = self.writers;
        let mut msgs: Vec<Msg> = Vec::new();
        for _ in 0..self.rng.random_range(count) {
            let flid = format!("W{w}F{}", self.rng.random_range(0..4));
            let earlier: Vec<Msg> = msgs
                .iter()
                .filter(|m| matches!(m, Msg::Flop { .. }))
                .cloned()
                .collect();
            let m = match self.rng.random_range(0..100) {
                0..=7 => Msg::Fdel {
                    n: self.next(),
                    flid,
                },
                8..=10 => Msg::Unknown { n: self.next() },
                11..=16 => Msg::Malformed { n: self.next() },
                17..=23 if !earlier.is_empty() => {
                    match earlier[self.rng.random_range(0..earlier.len())].clone() {
                        Msg::Flop { n, flid, .. } => Msg::Flop {
                            n,
                            flid,
                            gate: format!("DUP{n}"),
                            stnd: None,
                        },
                        other => other,
                    }
                }
                _ => {
                    let n = self.next();
                    Msg::Flop {
                        n,
                        flid,
                        gate: format!("G{n}"),
                        stnd: None,
                    }
                }
            };
            msgs.push(m);
        }
        Step::Upstream {
            msgs,
            gap_ms: self.rng.random_range(20..120),
        }
    }

    /// A held commit of its own flight, with a later update of that flight behind it.
    fn hold(&mut self, ms: std::ops::Range<u64>) -> Step {
        let (h, f) = (self.next(), self.next());
        let flid = format!("H{h}");
        Step::Hold {
            held: Msg::Flop {
                n: h,
                flid: flid.clone(),
                gate: format!("HG{h}"),
                stnd: Some(format!("ST{h}")),
            },
            follow: Msg::Flop {
                n: f,
                flid,
                gate: format!("FG{f}"),
                stnd: None,
            },
            hold_ms: self.rng.random_range(ms),
            rollback: self.rng.random_bool(0.25),
        }
    }

    fn cut(&mut self) -> Step {
        Step::Cut {
            store: if self.rng.random_bool(0.5) {
                StoreKind::Pg
            } else {
                StoreKind::My
            },
            ms: self.rng.random_range(300..2000),
        }
    }

    fn replay(&mut self) -> Step {
        Step::Replay {
            by_class: self.rng.random_bool(0.4),
            max_rows: self.rng.random_range(1..=3),
        }
    }

    fn skip(&mut self) -> Step {
        Step::Skip {
            followers: self.rng.random_range(1..=4),
            before: self.rng.random_range(0..=3),
        }
    }

    /// The DB owner locks the first of 20 rows for longer than the sweep's whole budget of
    /// attempts (20 × up to 1 s backoff and 1 s mark budget in the test's settings).
    fn lock(&mut self) -> Step {
        self.writers += 1;
        let w = self.writers;
        let msgs = (0..20)
            .map(|i| {
                let n = self.next();
                Msg::Flop {
                    n,
                    flid: format!("W{w}F{}", i % 4),
                    gate: format!("G{n}"),
                    stnd: None,
                }
            })
            .collect();
        Step::OwnerLock {
            msgs,
            hold_ms: 45_000,
        }
    }

    /// An operator action while a fault is live. A long held commit under a purge is the
    /// issue-29 loss (a [`super::ops_plan::KNOWN_OPEN`] kind).
    fn overlap(&mut self) -> Step {
        let fault = match self.rng.random_range(0..3) {
            0 => self.hold(300..4000),
            1 => self.cut(),
            _ => self.upstream(15..=30),
        };
        let action = match self.rng.random_range(0..6) {
            0 => self.replay(),
            1 => self.skip(),
            2 => Step::RecoverBackfill,
            3 => Step::Rotate,
            4 => Step::Kill9,
            _ => Step::Purge,
        };
        let after_ms = match &fault {
            Step::Hold { hold_ms, .. } => hold_ms.saturating_sub(1200).max(100),
            _ => self.rng.random_range(100..600),
        };
        Step::Overlap {
            fault: Box::new(fault),
            after_ms,
            action: Box::new(action),
        }
    }

    /// A cutover; `forced` picks the mode (modulo 5) for the sequences that feature it.
    fn cutover(&mut self, forced: Option<usize>) -> Cutover {
        let stock = self.rng.random_range(8..=20);
        let drawn = self.rng.random_range(0..5);
        let mode = match forced.map_or(drawn, |f| f % 5) {
            0 => Mode::Min,
            1 => Mode::Zero,
            2 => Mode::Max,
            3 => Mode::At(self.rng.random_range(1..stock - 1)),
            _ => Mode::AboveHead(self.rng.random_range(10..200_000)),
        };
        let premarked = (0..stock).filter(|_| self.rng.random_bool(0.5)).collect();
        let unknown = (0..stock).filter(|_| self.rng.random_bool(0.1)).collect();
        let gap_after = self
            .rng
            .random_bool(0.5)
            .then(|| self.rng.random_range(0..stock - 1));
        Cutover {
            mode,
            stock,
            premarked,
            gap_after,
            unknown,
        }
    }
}

#[test]
fn a_seed_makes_the_same_plan_and_the_ci_seeds_cover_every_action() {
    assert_eq!(generate(7), generate(7));
    let plans: Vec<Plan> = (1..=super::operator_actions::CI_SEEDS)
        .map(generate)
        .collect();
    let kinds: std::collections::HashSet<&str> = plans.iter().flat_map(Plan::kinds).collect();
    for k in [
        "upstream",
        "hold",
        "overlap",
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
        "owner_row_lock",
        "purge_during_held_commit",
        "pair",
        "slow_commit",
        "shared_topic",
    ] {
        assert!(kinds.contains(k), "{k} missing from the CI seeds");
    }
    let pairs: std::collections::HashSet<(&str, &str)> = plans
        .iter()
        .flat_map(|p| &p.steps)
        .filter_map(|s| match s {
            Step::Pair { first, second } => Some((first.kind(), second.kind())),
            _ => None,
        })
        .collect();
    for pair in [
        ("replay", "purge"),
        ("recover_backfill", "purge"),
        ("skip", "cutover_plan"),
        ("skip", "purge"),
        ("skip", "replay"),
        ("recover_backfill", "rotate"),
        ("replay", "requeue"),
        ("requeue", "takeover"),
    ] {
        assert!(
            pairs.contains(&pair),
            "pair {pair:?} missing from the CI seeds"
        );
    }
    for mode in [Delivery::AtLeastOnce, Delivery::ExactlyOnce] {
        let n = plans.iter().filter(|p| p.delivery == mode).count();
        assert!(n >= 10, "{n} CI seeds in {mode:?}");
    }
    for p in &plans {
        assert!(
            p.steps.iter().any(|s| matches!(s, Step::Overlap { .. })),
            "seed {}: no action overlaps a fault",
            p.seed
        );
        let back: Plan = serde_json::from_str(&p.to_json()).expect("json round trip");
        assert_eq!(&back, p);
    }
}
