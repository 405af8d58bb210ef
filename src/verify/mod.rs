//! `verify`: the pipeline's invariants (SPEC §11; for operators `docs/operations.md`,
//! "Verifying the stores") checked against the stores themselves (MySQL inbox, PostgreSQL,
//! optionally Kafka), in bounded batches (keyset pages of `batch` rows), so it runs at any
//! size next to a live service. One [`Finding`] per invariant with counts, example ids and
//! its scope (what was read, what is excluded and why). The checks only read; a violation is
//! reported, never repaired.
//!
//! Every check is race-free against a running service: each compares facts written in an
//! order the pipeline never reverses (a row is enqueued before W passes it, terminal before
//! marked, acknowledged before SENT).
//!
//! Groups: [`inbox_scan`] (coverage below W, marks), [`state_scan`] (inbox row present, FIFO,
//! marking), [`identity`], [`events`], [`fencing`], [`kafka`].

mod events;
mod fencing;
mod identity;
mod inbox_scan;
pub mod kafka;
mod state_scan;

use serde::Serialize;

use crate::inbox::names::InboxNames;
use crate::inbox::{Inbox, InboxError};
use crate::store::{Store, StoreError};

/// Most example ids kept per finding.
pub const EXAMPLES: usize = 10;

/// Why a verification could not run (exit code 2): not a violation, an error.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// PostgreSQL failed.
    #[error("verify: store: {0}")]
    Store(#[from] StoreError),
    /// The inbox failed.
    #[error("verify: inbox: {0}")]
    Inbox(#[from] InboxError),
    /// A statement failed.
    #[error("verify: {0}")]
    Db(#[from] sqlx::Error),
    /// The Kafka read-back failed.
    #[error("verify: kafka: {0}")]
    Kafka(String),
}

/// What the checks need.
#[derive(Debug, Clone)]
pub struct VerifyInput {
    /// The shared inbox.
    pub inbox: Inbox,
    /// Its names (mark columns).
    pub names: InboxNames,
    /// Our PostgreSQL.
    pub store: Store,
    /// The DB owner's mark value (`backfill.mark_value`).
    pub mark_value: String,
    /// Rows per page.
    pub batch: u32,
    /// Read SENT events back from Kafka (`--kafka`): broker list and topic.
    pub kafka: Option<kafka::KafkaCheck>,
}

/// One invariant's result.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Finding {
    /// Short stable name.
    pub invariant: &'static str,
    /// What must hold, and the exceptions the rule allows (each counted in `notes`).
    pub rule: &'static str,
    /// What this run covered: the rows or ids read, and what was left out and why.
    pub scope: String,
    /// Rows (ids, events, identities) looked at.
    pub checked: u64,
    /// Rows breaking it.
    pub violations: u64,
    /// Up to [`EXAMPLES`] of them.
    pub examples: Vec<i64>,
    /// Allowed exceptions the rule names (e.g. LATE rows, pending marks), counted and listed.
    pub notes: Vec<Note>,
    /// Not run (e.g. Kafka without `--kafka`).
    pub skipped: bool,
}

/// A counted, listed exception that is not a violation.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Note {
    /// What they are.
    pub what: &'static str,
    /// How many.
    pub count: u64,
    /// Up to [`EXAMPLES`] ids.
    pub examples: Vec<i64>,
}

impl Finding {
    fn new(invariant: &'static str, rule: &'static str) -> Self {
        Self {
            invariant,
            rule,
            scope: String::new(),
            checked: 0,
            violations: 0,
            examples: Vec::new(),
            notes: Vec::new(),
            skipped: false,
        }
    }

    fn violation(&mut self, id: i64) {
        self.violations += 1;
        if self.examples.len() < EXAMPLES {
            self.examples.push(id);
        }
    }

    fn note(&mut self, what: &'static str, id: i64) {
        let n = match self.notes.iter_mut().find(|n| n.what == what) {
            Some(n) => n,
            None => {
                self.notes.push(Note {
                    what,
                    count: 0,
                    examples: Vec::new(),
                });
                self.notes.last_mut().expect("just pushed")
            }
        };
        n.count += 1;
        if n.examples.len() < EXAMPLES {
            n.examples.push(id);
        }
    }

    /// True when it holds (or was skipped).
    pub fn ok(&self) -> bool {
        self.violations == 0
    }
}

/// Every finding.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Report {
    /// One per invariant, in a fixed order.
    pub findings: Vec<Finding>,
}

impl Report {
    /// True when no invariant is violated.
    pub fn ok(&self) -> bool {
        self.findings.iter().all(Finding::ok)
    }

    /// One line per invariant: `OK|FAIL|SKIP name checked=… violations=… [examples] notes —
    /// rule [scope: …]`.
    pub fn lines(&self) -> Vec<String> {
        self.findings
            .iter()
            .map(|f| {
                let status = if f.skipped {
                    "SKIP"
                } else if f.ok() {
                    "OK  "
                } else {
                    "FAIL"
                };
                let mut line = format!(
                    "{status} {:<22} checked={} violations={}",
                    f.invariant, f.checked, f.violations
                );
                if !f.examples.is_empty() {
                    line.push_str(&format!(" e.g. {:?}", f.examples));
                }
                for n in &f.notes {
                    line.push_str(&format!("; {} {} e.g. {:?}", n.count, n.what, n.examples));
                }
                line.push_str(&format!("  — {}", f.rule));
                if !f.scope.is_empty() {
                    line.push_str(&format!(" [scope: {}]", f.scope));
                }
                line
            })
            .collect()
    }
}

/// Runs every check.
pub async fn verify(input: &VerifyInput) -> Result<Report, VerifyError> {
    let batch = input.batch.clamp(1, 10_000) as i64;
    // Tests stand in a long, thread-holding verify here (`verify_stall`).
    crate::failpoint::stall("verify_stall");
    let mut findings = Vec::new();
    findings.extend(inbox_scan::run(input, batch).await?);
    findings.extend(state_scan::run(input, batch).await?);
    findings.push(identity::run(&input.store, batch).await?);
    let (events, sent) = events::run(&input.store, batch).await?;
    findings.push(events);
    findings.push(fencing::run(&input.store).await?);
    findings.push(match &input.kafka {
        Some(k) => kafka::run(&input.store, k, batch, sent).await?,
        None => kafka::skipped(),
    });
    for f in &findings {
        crate::telemetry::verify_result(f.invariant, f.violations);
    }
    Ok(Report { findings })
}
