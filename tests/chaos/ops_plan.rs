//! A sequence as data: the cutover, if any, and the steps, serialisable so that a regression is
//! kept as the plan it ran (`tests/chaos/regressions/*.json`) and replayed as-is, whatever the
//! generator ([`super::ops_gen`]) becomes. Also the kinds of sequence today's code is known to
//! fail ([`KNOWN_OPEN`]) and how CI defuses them.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use msgx_core::settings::Delivery;

use super::ops_msgs::Msg;

/// A cutover mode of `pipeline.cutover_watermark`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// W below the first stock row: the stock is read.
    Min,
    /// W = 0: the stock is read.
    Zero,
    /// W = the highest stock id: the stock is skipped.
    Max,
    /// W = the stock id at this index (0-based) of the visible stock: the rows up to it skipped.
    At(usize),
    /// W = the inbox head + this many: must be refused (issue 29 item 5).
    AboveHead(i64),
}

/// A cutover on a fresh store with stock in the inbox. Stock row `i` is `Msg::Unknown` when
/// listed in `unknown`, else a `FLOP` of flight `S{i % 4}` with gate `SG{i}`; its `n` is `i + 1`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cutover {
    pub mode: Mode,
    pub stock: usize,
    pub premarked: Vec<usize>,
    pub gap_after: Option<usize>,
    pub unknown: Vec<usize>,
}

impl Cutover {
    /// The message of stock row `i`.
    pub fn msg(&self, i: usize) -> Msg {
        let n = i as i64 + 1;
        if self.unknown.contains(&i) {
            Msg::Unknown { n }
        } else {
            Msg::Flop {
                n,
                flid: format!("S{}", i % 4),
                gate: format!("SG{i}"),
                stnd: None,
            }
        }
    }
}

/// Which store a cut hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StoreKind {
    Pg,
    My,
}

/// One step. Steps run one after another; `Upstream`, `Hold` and the legacy `Write` start
/// background writers that go on writing through the steps after them, and `Overlap` runs an
/// operator action while a fault is live. Messages the runner writes for `Replay`, `Skip`,
/// `RecoverBackfill`, `Requeue` and the legacy `Insert` are numbered from 50_001 in step order
/// (`Seq::n` starts at 50_000, above every number a generated plan draws).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum Step {
    /// A background writer inserting these messages one by one, `gap_ms` apart.
    Upstream {
        msgs: Vec<Msg>,
        gap_ms: u64,
    },
    /// An insert held open `hold_ms` then committed (or rolled back), and right after it is
    /// open, `follow` (same flight, later message) committed.
    Hold {
        held: Msg,
        follow: Msg,
        hold_ms: u64,
        rollback: bool,
    },
    /// The DB owner holds `SELECT … FOR UPDATE` on the first of `msgs` for `hold_ms` while
    /// the rest are written and processed.
    OwnerLock {
        msgs: Vec<Msg>,
        hold_ms: u64,
    },
    /// `fault` (an `Upstream`, `Hold` or `Cut`) starts; `after_ms` later `action` runs while it
    /// lasts.
    Overlap {
        fault: Box<Step>,
        after_ms: u64,
        action: Box<Step>,
    },
    /// Legacy (issue 19 plans): the upstream simulator writes `total` messages.
    Write {
        total: u64,
        sim_seed: u64,
    },
    /// Legacy: the simulator again with an earlier seed (business duplicates).
    Duplicate {
        total: u64,
        sim_seed: u64,
    },
    /// Legacy: `good` inserts, one more held open `hold_ms`.
    Insert {
        good: usize,
        hold_ms: u64,
        rollback: bool,
    },
    /// Two operator actions at once: `first`'s CLI call (a replay, a recover-backfill, a skip
    /// or a requeue, prepared before) runs while `second` (a purge, a rotation, a `cutover
    /// plan`, a takeover, a replay or a requeue) runs; the overlap is checked — for two
    /// mutating actions at the database (`ops_gate`), otherwise by their timed spans. In
    /// skip ∥ replay the skip's range is the replay's rows (its own fields are not used).
    Pair {
        first: Box<Step>,
        second: Box<Step>,
    },
    Kill9,
    Term,
    Cut {
        store: StoreKind,
        ms: u64,
    },
    Replay {
        by_class: bool,
        max_rows: usize,
    },
    Skip {
        followers: usize,
        before: usize,
    },
    RecoverBackfill,
    Purge,
    Rotate,
    Requeue,
    Takeover,
    /// `cutover plan` on the live store: read-only, it reports the seeding as not applicable.
    CutoverPlan,
    /// The broker answers the dispatcher's next `EndTxn` only after `ms`, past its commit
    /// wait (`kafka.transaction_timeout`, [`SLOW_COMMIT_WAIT`] in such plans): the commit in
    /// doubt must be called again, never aborted and its batch sent again (issue 40's commit
    /// timeout; exactly-once on a mock cluster of the plan's own, [`Plan::slow_commits`]).
    SlowCommit {
        ms: u64,
    },
    /// A second deployment (a rebuilt store: its own store and inbox, event numbers from 1
    /// like ours) delivers `msgs` messages' events on this plan's topic; then ours is killed
    /// and started again, its recovery reading past the other's records (`ops_shared_topic`).
    SharedTopic {
        msgs: usize,
    },
    Pause {
        ms: u64,
    },
}

impl Step {
    /// The kind, for the summary and [`KNOWN_OPEN`].
    pub fn kind(&self) -> &'static str {
        match self {
            Step::Upstream { .. } => "upstream",
            Step::Hold { .. } => "hold",
            Step::OwnerLock { .. } => "owner_row_lock",
            Step::Overlap { fault, action, .. } => match (fault.as_ref(), action.as_ref()) {
                (Step::Hold { hold_ms, .. }, Step::Purge | Step::Rotate) if *hold_ms > 1500 => {
                    "purge_during_held_commit"
                }
                _ => "overlap",
            },
            Step::Write { .. } => "write",
            Step::Duplicate { .. } => "duplicate",
            Step::Insert { .. } => "insert",
            Step::Pair { .. } => "pair",
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
            Step::CutoverPlan => "cutover_plan",
            Step::SlowCommit { .. } => "slow_commit",
            Step::SharedTopic { .. } => "shared_topic",
            Step::Pause { .. } => "pause",
        }
    }

    /// This step and the steps inside it.
    pub fn flatten(&self) -> Vec<&Step> {
        match self {
            Step::Overlap { fault, action, .. } => {
                let mut v = vec![self];
                v.extend(fault.flatten());
                v.extend(action.flatten());
                v
            }
            Step::Pair { first, second } => {
                let mut v = vec![self];
                v.extend(first.flatten());
                v.extend(second.flatten());
                v
            }
            s => vec![s],
        }
    }
}

/// One sequence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The generator's seed (or 0 for a hand-written plan); names its databases and topics.
    pub seed: u64,
    /// Why it is kept (regression plans).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
    pub cutover: Option<Cutover>,
    /// The events topic is missing at first (DEAD events, requeued by a [`Step::Requeue`]).
    pub dispatch_outage: bool,
    /// `kafka.delivery` of the sequence (absent in older plan files: at-least-once); it picks
    /// the broker too (`ops_broker`).
    #[serde(default)]
    pub delivery: Delivery,
    pub steps: Vec<Step>,
}

/// Kinds of sequence today's main code fails, each waiting for a fix in another branch. CI
/// defuses them ([`Plan::defused`]); `MSGEXCHANGE_OPS_OPEN=1` runs them as planned (empty: the
/// purge, owner-lock and cutover fixes of issue 29 are merged, and the exactly-once takeover
/// runs on a broker that fences a zombie producer, [`Plan::on_tansu`]; a new kind waiting for a
/// fix goes here).
pub const KNOWN_OPEN: &[(&str, &str)] = &[];

/// `kafka.transaction_timeout` (the dispatcher's commit wait) in a plan with a slow commit:
/// the slow `EndTxn` is answered after it, within a second call.
pub const SLOW_COMMIT_WAIT: &str = "5s";

/// True when sequences of this kind run as planned.
pub fn runs_open(kind: &str) -> bool {
    std::env::var("MSGEXCHANGE_OPS_OPEN").is_ok_and(|v| v == "1")
        || !KNOWN_OPEN.iter().any(|(k, _)| *k == kind)
}

impl Plan {
    /// Every kind this plan holds (cutover above head included).
    pub fn kinds(&self) -> Vec<&'static str> {
        let mut k: Vec<&'static str> = self
            .steps
            .iter()
            .flat_map(Step::flatten)
            .map(Step::kind)
            .collect();
        if matches!(
            self.cutover.as_ref().map(|c| c.mode),
            Some(Mode::AboveHead(_))
        ) {
            k.push("cutover_above_head");
        }
        k
    }

    /// A plan with a slow commit: its broker (a mock cluster) delays the next `EndTxn`, which
    /// only the plan's own producer may send, so it gets a mock cluster of its own.
    pub fn slow_commits(&self) -> bool {
        self.kinds().contains(&"slow_commit")
    }

    /// Whether the sequence runs on tansu rather than the mock cluster (`ops_broker`): every
    /// at-least-once plan, and an exactly-once plan with a takeover — the mock cluster hands a
    /// second producer of one `transactional.id` a new producer id instead of bumping the
    /// epoch, so the frozen holder, thawed, still appends and commits (`scripts/tansu_txn_repro.py`).
    pub fn on_tansu(&self) -> bool {
        self.delivery == Delivery::AtLeastOnce || self.kinds().contains(&"takeover")
    }

    /// The plan with its [`KNOWN_OPEN`] parts defused (unless they run open): a cutover above
    /// the head becomes `max`, an owner's lock becomes plain writes, a purge overlapping a held
    /// commit waits for the commit. Also the list of what was defused.
    pub fn defused(&self) -> (Plan, Vec<&'static str>) {
        let mut p = self.clone();
        let mut done = Vec::new();
        if let Some(c) = p.cutover.as_mut() {
            if matches!(c.mode, Mode::AboveHead(_)) && !runs_open("cutover_above_head") {
                c.mode = Mode::Max;
                done.push("cutover_above_head");
            }
        }
        for s in &mut p.steps {
            let kind = s.kind();
            if runs_open(kind) {
                continue;
            }
            match s {
                Step::OwnerLock { msgs, .. } => {
                    *s = Step::Upstream {
                        msgs: std::mem::take(msgs),
                        gap_ms: 20,
                    };
                }
                Step::Overlap {
                    after_ms, fault, ..
                } => {
                    if let Step::Hold { hold_ms, .. } = fault.as_ref() {
                        *after_ms = *hold_ms + 300;
                    }
                }
                _ => continue,
            }
            done.push(kind);
        }
        (p, done)
    }

    /// The plan as pretty JSON (a regression file).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("plan to json")
    }

    /// The regression plans kept in `tests/chaos/regressions/`, by file name.
    pub fn regressions() -> Vec<(String, Plan)> {
        let dir = regressions_dir();
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        files.sort();
        files.iter().map(|f| (file_name(f), load(f))).collect()
    }
}

/// `tests/chaos/regressions`.
pub fn regressions_dir() -> PathBuf {
    msgx_testkit::repo_root().join("tests/chaos/regressions")
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// A plan file; a relative path is taken from the repository's root (the test itself runs
/// in `actors/`).
pub fn load(path: &Path) -> Plan {
    let root = msgx_testkit::repo_root();
    let path = &if path.is_relative() && !path.exists() {
        root.join(path)
    } else {
        path.to_path_buf()
    };
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "sequence seed {} ({}):",
            self.seed,
            self.delivery.as_str()
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
            let text = format!("{s:?}");
            let short: String = text.chars().take(160).collect();
            writeln!(f, "  {:>2}. {short}", i + 1)?;
        }
        Ok(())
    }
}
