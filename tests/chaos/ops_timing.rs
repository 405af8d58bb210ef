//! The three timing facts the reference model needs — which rows arrived LATE, which an
//! approved skip caught, which the pump found missing — worked out from the plan and the
//! writers' own record (what was committed, rolled back or held, and when; which faults
//! stalled the service; what the operator ran and when), with the model's own copy of the
//! rules in `/work/shared/SPEC.md`. Each row gets one of three answers: the fact must hold,
//! it must not, or timing allows both (and the reason says which two and why). The service's
//! answer is then compared with it, never adopted: a `Must` the service did not show or a
//! `Never` it did is a violation, and the model goes on with its own answer; only an `Either`
//! takes the service's side of the two.
//!
//! The rules (SPEC section in brackets):
//! - LATE (§3 step 4, §6): the poller sees a hole only once a row above it is committed; the
//!   hole is released no earlier than `max_commit_delay` after that sighting and at most one
//!   poll round plus slack later; a row is LATE exactly when its commit comes after the
//!   release. So a row committed less than `max_commit_delay` after the first commit above it
//!   is never LATE; one committed more than `max_commit_delay` + [`RELEASE_SLACK_MS`] after
//!   it, with no fault stalling the poller in between, must be; between the two, either.
//! - APPROVED_SKIP (§4): a skip makes the unfinished rows of its range SKIPPED. A row not yet
//!   committed when the skip ran is never caught; the blocker and followers a skip was
//!   predicted to catch ([`super::ops_steps`]: nothing passes an unknown type before its
//!   retries run out) must be; any other row of the range may have been finished before.
//! - missing (§4: inbox row gone when the pump reads it → DEAD(MALFORMED)): only a row the DB
//!   owner deleted while unmarked may be; the pump read it before or after the delete.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use super::ops_model::Model;
use super::ops_reference::Written;

/// Slack past `max_commit_delay` for the release: the sighting waits for a poll round
/// (100 ms), the release for the next one, both under a loaded host.
pub const RELEASE_SLACK_MS: u64 = 1300;

/// Margin under `max_commit_delay` within which a commit is still judged "maybe late": the
/// test times both commits from its own side of the connections.
const EARLY_MARGIN_MS: u64 = 300;

/// The most a late row takes from its commit to its enqueue by the late detector
/// (`late.detect_period` 500 ms in the test's settings, slack for a loaded host), when no
/// fault stalls the service.
pub const LATE_FIND_MAX: Duration = Duration::from_millis(3000);

/// One row's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fact {
    Must(String),
    Never,
    Either(String),
}

/// The model's answers for every row it judged (a row absent is `Never`).
#[derive(Debug, Default)]
pub struct Allowed {
    pub late: BTreeMap<i64, Fact>,
    pub approved: BTreeMap<i64, Fact>,
    pub missing: BTreeMap<i64, Fact>,
}

/// Spans in which the service may have been stalled (killed, stopped, cut off, frozen,
/// taken over, or the inbox renamed under it); an open span lasts until now.
pub type Stalls = Vec<(Instant, Option<Instant>)>;

/// True if a stall overlaps `[from, to]`.
pub fn stalled(stalls: &Stalls, from: Instant, to: Instant) -> bool {
    stalls
        .iter()
        .any(|(s, e)| *s <= to && e.is_none_or(|e| e >= from))
}

/// The model's answers from the ledger and the operator's record.
pub fn allowed(written: &[Written], model: &Model, delay_ms: u64) -> Allowed {
    let mut a = Allowed::default();
    for w in written.iter().filter(|w| w.committed) {
        a.late.insert(w.id, late(written, w, model, delay_ms));
        a.approved.insert(w.id, approved(w, model));
        a.missing.insert(w.id, missing(w, model));
    }
    a
}

fn late(written: &[Written], w: &Written, model: &Model, delay_ms: u64) -> Fact {
    let Some(commit) = w.committed_at else {
        return Fact::Never;
    };
    // The deciding fact, read by the harness's own probe (issue 52 item 1): W passed the id
    // while its insert was still open, so its hole was released before it committed.
    if let Some(at) = model.passed_open.get(&w.id) {
        if *at < commit {
            return Fact::Must(format!(
                "W passed it {} ms before its commit, while its insert was open (sampled)",
                commit.saturating_duration_since(*at).as_millis()
            ));
        }
    }
    // The first commit above it: a legacy simulator's rows are unknown, so at the earliest
    // its own insert.
    let mut above = written
        .iter()
        .filter(|o| o.id > w.id)
        .filter_map(|o| o.committed_at)
        .min();
    if model.foreign_writers {
        above = above.into_iter().chain(w.opened).min();
    }
    let Some(above) = above.filter(|t| *t < commit) else {
        return Fact::Never; // no row above it while it was open: never a hole (§3 step 4)
    };
    let gap = commit.saturating_duration_since(above);
    let ms = gap.as_millis() as u64;
    if ms + EARLY_MARGIN_MS < delay_ms {
        return Fact::Never;
    }
    let sure = ms > delay_ms + RELEASE_SLACK_MS;
    if sure && !stalled(&model.stalls, above, commit) && !model.foreign_writers {
        return Fact::Must(format!(
            "committed {ms} ms after the first row above it (max_commit_delay {delay_ms} ms + \
             {RELEASE_SLACK_MS} ms for the rounds): its hole was released first"
        ));
    }
    Fact::Either(format!(
        "committed {ms} ms after the first row above it (max_commit_delay {delay_ms} ms){}: \
         the release may come before or after the commit",
        if sure {
            ", a fault stalled the poller meanwhile"
        } else {
            ""
        }
    ))
}

fn approved(w: &Written, model: &Model) -> Fact {
    let mut fact = Fact::Never;
    for s in model
        .skips
        .iter()
        .filter(|s| (s.from..=s.to).contains(&w.id))
    {
        let committed_before = w.committed_at.is_some_and(|c| c < s.at);
        if !committed_before || s.excluded.contains(&w.id) {
            // Not there when the skip ran (§4: only enqueued rows are skipped), or finished
            // then by the harness's own record (`Skip::excluded`).
            continue;
        }
        if s.caught_all && s.queued.contains(&w.id) {
            return Fact::Must(format!(
                "queued behind the blocker {} the skip {}..{} ran before it could be \
                 poisoned",
                s.queued[0], s.from, s.to
            ));
        }
        fact = Fact::Either(format!(
            "in skip {}..{}: it may have been finished before the skip ran or not",
            s.from, s.to
        ));
    }
    fact
}

fn missing(w: &Written, model: &Model) -> Fact {
    if !model.owner_deleted.contains(&w.id) || model.deleted_marked.contains(&w.id) {
        return Fact::Never;
    }
    Fact::Either(
        "the DB owner deleted it unmarked (and restores it only once it is marked or \
         abandoned): the pump read its text before the delete (its own end) or after, on \
         every attempt (DEAD(MALFORMED))"
            .into(),
    )
}

/// The facts the model goes on with: `Must` rows, plus `Either` rows the service showed;
/// every disagreement with the service (`observed`) is a problem.
pub fn resolve(
    facts: &BTreeMap<i64, Fact>,
    observed: &BTreeSet<i64>,
    what: &str,
    problems: &mut Vec<String>,
) -> BTreeSet<i64> {
    let mut out = BTreeSet::new();
    for (id, fact) in facts {
        let seen = observed.contains(id);
        match fact {
            Fact::Must(why) => {
                if !seen {
                    problems.push(format!(
                        "row {id}: the model predicts {what} ({why}); the service did not"
                    ));
                }
                out.insert(*id);
            }
            Fact::Either(_) if seen => {
                out.insert(*id);
            }
            Fact::Either(_) => {}
            Fact::Never if seen => problems.push(format!(
                "row {id}: the service shows it {what}; the model rules it out"
            )),
            Fact::Never => {}
        }
    }
    out
}

/// `kind must/either` counts, for the sequence's line.
pub fn summary(a: &Allowed) -> String {
    let count = |m: &BTreeMap<i64, Fact>| {
        let must = m.values().filter(|f| matches!(f, Fact::Must(_))).count();
        let either = m.values().filter(|f| matches!(f, Fact::Either(_))).count();
        format!("{must}/{either}")
    };
    format!(
        "must/either late {} approved {} missing {}",
        count(&a.late),
        count(&a.approved),
        count(&a.missing)
    )
}

#[cfg(test)]
fn row(id: i64, opened: Instant, commit_ms: Option<u64>) -> Written {
    Written {
        id,
        msg: super::ops_msgs::Msg::Unknown { n: id },
        committed: commit_ms.is_some(),
        opened: Some(opened),
        committed_at: commit_ms.map(|ms| opened + Duration::from_millis(ms)),
    }
}

#[test]
fn late_is_predicted_from_the_commits_not_the_service() {
    let t0 = Instant::now();
    let model = Model::default();
    // 1 is held 4 s with 2 committed at once above it: must be late. 3 held 1 s: never.
    // 5 held 3.2 s: either. 7 held 5 s, nothing above it until after: never.
    let written = [
        row(1, t0, Some(4000)),
        row(2, t0, Some(10)),
        row(3, t0, Some(1000)),
        row(4, t0, Some(20)),
        row(5, t0, Some(3200)),
        row(6, t0, Some(30)),
        row(7, t0 + Duration::from_secs(10), Some(5000)),
    ];
    let a = allowed(&written, &model, 2000);
    assert!(matches!(a.late[&1], Fact::Must(_)), "{:?}", a.late[&1]);
    assert_eq!(a.late[&3], Fact::Never);
    assert!(matches!(a.late[&5], Fact::Either(_)), "{:?}", a.late[&5]);
    assert_eq!(a.late[&7], Fact::Never);
    let mut problems = Vec::new();
    // The service shows 3 late and not 1: both are problems; the model keeps 1, drops 3.
    let got = resolve(&a.late, &BTreeSet::from([3, 5]), "LATE", &mut problems);
    assert_eq!(got, BTreeSet::from([1, 5]));
    assert_eq!(problems.len(), 2, "{problems:?}");
}

#[test]
fn a_stall_between_the_commits_leaves_either() {
    let t0 = Instant::now();
    let mut model = Model::default();
    model.stalls.push((t0 + Duration::from_secs(1), None));
    let written = [row(1, t0, Some(4000)), row(2, t0, Some(10))];
    let a = allowed(&written, &model, 2000);
    assert!(matches!(a.late[&1], Fact::Either(_)), "{:?}", a.late[&1]);
}

/// Per late row, the rows it must precede in processing order: rows above it committed (and
/// not late themselves) after it was surely enqueued — its commit plus [`LATE_FIND_MAX`], no
/// fault between — so it was the smaller unfinished id when they came (SPEC §4 head rule).
pub fn precedes(
    written: &[Written],
    late: &BTreeSet<i64>,
    stalls: &Stalls,
) -> HashMap<i64, BTreeSet<i64>> {
    let mut out = HashMap::new();
    for l in written.iter().filter(|w| late.contains(&w.id)) {
        let Some(found) = l.committed_at.map(|c| c + LATE_FIND_MAX) else {
            continue;
        };
        let after: BTreeSet<i64> = written
            .iter()
            .filter(|f| f.id > l.id && !late.contains(&f.id))
            .filter(|f| {
                f.committed_at
                    .is_some_and(|c| c > found && !stalled(stalls, found - LATE_FIND_MAX, c))
            })
            .map(|f| f.id)
            .collect();
        out.insert(l.id, after);
    }
    out
}

/// Each skip's reported count against the model's: at least the rows it must have caught, at
/// most the rows of its range committed before it ran (a legacy simulator's rows aside).
pub fn skip_counts(written: &[Written], model: &Model) -> Vec<String> {
    let mut problems = Vec::new();
    for s in &model.skips {
        let must = if s.caught_all { s.queued.len() } else { 0 } as u64;
        let may = written
            .iter()
            .filter(|w| (s.from..=s.to).contains(&w.id))
            .filter(|w| w.committed_at.is_some_and(|c| c < s.at))
            .count() as u64;
        let over = s.skipped > may && !model.foreign_writers;
        if s.skipped < must || over {
            problems.push(format!(
                "skip {}..{} reported {} rows; the model allows {must}..={may} (caught by \
                 prediction ..= committed in its range before it ran)",
                s.from, s.to, s.skipped
            ));
        }
    }
    problems
}
