//! Every action must take effect (issue 41 item 2). Before an operator action runs, the model
//! decides from the plan and what the writers did — never from the service — whether the
//! action must have an effect; an action predicted effective that did nothing fails the
//! sequence, and so does one predicted idle that took effect (issue 52: idle means no-op);
//! where timing allows either outcome the prediction says `Either` and why. Over a run of many
//! plans, each kind must have taken effect in at least its stated share of its actions
//! ([`REQUIRED_SHARE`], counted per action, not per plan), so a `purge-readiness` that never
//! says READY or a skip that skips nothing fails the CI set even where every single plan could
//! call it idle.

use std::collections::BTreeMap;

/// The least share of an action kind's actions that must have taken effect, checked when at
/// least [`SHARE_MIN_PLANS`] plans ran (the CI set and a soak). Measured on the CI set (see the
/// table the run prints); set a little under what a healthy run shows.
pub const REQUIRED_SHARE: &[(&str, f64)] = &[
    // Per action, measured on the CI set on 2026-12-07 (issue 52): replay 27/27, skip 28/28,
    // recover 29/29, purge 25/30, rotate 9/13, requeue 9/9, slow commit 7/7, shared topic 6/6.
    ("replay", 0.9),
    ("skip", 0.8),
    ("recover_backfill", 0.8),
    ("purge", 0.7),
    ("rotate", 0.55),
    ("requeue", 0.9),
    ("slow_commit", 0.9),
    ("shared_topic", 0.9),
];

/// Fewer plans than this (one seed, one plan file) are not judged by share.
pub const SHARE_MIN_PLANS: usize = 20;

/// What the model expects of one action, with the reason it gives.
#[derive(Debug, Clone)]
pub enum Predict {
    /// The action must change something.
    Effective(String),
    /// Nothing to act on: the action must be a no-op (it is not judged further).
    Idle(String),
    /// Timing allows both outcomes (the reason says which two and why).
    Either(String),
}

/// One kind's tally within a plan or a run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tally {
    /// Actions run.
    pub runs: usize,
    /// Predicted effective.
    pub predicted: usize,
    /// Took effect.
    pub took: usize,
    /// Predicted idle.
    pub idle: usize,
    /// Either outcome allowed.
    pub either: usize,
}

/// The verdict of one action: `Some(violation)` when it was predicted effective and did
/// nothing; the tally is counted in `tallies`.
pub fn judge(
    tallies: &mut BTreeMap<&'static str, Tally>,
    kind: &'static str,
    predict: &Predict,
    took: bool,
    what: &str,
) -> Option<String> {
    let t = tallies.entry(kind).or_default();
    t.runs += 1;
    t.took += usize::from(took);
    match predict {
        Predict::Effective(why) => {
            t.predicted += 1;
            if !took {
                return Some(format!(
                    "{kind} predicted effective ({why}) but did nothing: {what}"
                ));
            }
        }
        Predict::Idle(why) => {
            t.idle += 1;
            // Idle means no-op (issue 52 item 2): nothing to act on, so nothing may change.
            if took {
                return Some(format!(
                    "{kind} predicted idle ({why}) but took effect: {what}"
                ));
            }
        }
        Predict::Either(why) => {
            t.either += 1;
            eprintln!("ops: {kind} may or may not take effect ({why}); took effect: {took}");
        }
    }
    None
}

/// Per kind over a run: (plans holding it, plans in which it took effect, the actions' tally).
pub type Shares = BTreeMap<&'static str, (usize, usize, Tally)>;

/// Adds one plan's tallies to the run's.
pub fn add_plan(shares: &mut Shares, plan: &BTreeMap<&'static str, Tally>) {
    for (k, t) in plan {
        let e = shares.entry(k).or_default();
        e.0 += 1;
        e.1 += usize::from(t.took > 0);
        e.2.runs += t.runs;
        e.2.predicted += t.predicted;
        e.2.took += t.took;
        e.2.idle += t.idle;
        e.2.either += t.either;
    }
}

/// The table the run prints, and the kinds below their required share (when judged). The
/// share is per action (issue 52 item 2): of every action of the kind run, how many took
/// effect — a plan whose actions of a kind all did nothing counts each of them against it.
pub fn table(shares: &Shares, plans: usize) -> (String, Vec<String>) {
    let mut out = String::from(
        "ops effect table: kind              plans  actions  effective  share  required  \
         (actions: predicted-effective / took / predicted-idle / either)\n",
    );
    let mut short = Vec::new();
    for (kind, need) in REQUIRED_SHARE {
        let (n, _, t) = shares.get(kind).copied().unwrap_or_default();
        let share = if t.runs == 0 {
            0.0
        } else {
            t.took as f64 / t.runs as f64
        };
        out.push_str(&format!(
            "ops effect table: {kind:<17} {n:>5} {:>8} {:>10} {share:>6.2} {need:>9.2}  \
             ({} / {} / {} / {})\n",
            t.runs, t.took, t.predicted, t.took, t.idle, t.either
        ));
        if plans >= SHARE_MIN_PLANS && (t.runs == 0 || share < *need) {
            short.push(format!(
                "{kind} took effect in {} of {} actions ({share:.2}, required {need:.2})",
                t.took, t.runs
            ));
        }
    }
    (out, short)
}

/// Issue 52 item 2: an action predicted idle that took effect is a violation, not a note.
#[test]
fn an_idle_prediction_that_took_effect_fails() {
    let mut t = BTreeMap::new();
    let v = judge(
        &mut t,
        "purge",
        &Predict::Idle("nothing".into()),
        true,
        "READY up to 9",
    );
    assert!(v.is_some_and(|v| v.contains("predicted idle")));
    let v = judge(
        &mut t,
        "purge",
        &Predict::Idle("nothing".into()),
        false,
        "none",
    );
    assert!(v.is_none());
}

/// Issue 52 item 2: shares are per action. A kind that took effect once in each plan but
/// did nothing in most of its actions is short, although every plan "had an effect".
#[test]
fn shares_count_actions_not_plans() {
    let mut shares = Shares::new();
    let mut plan = BTreeMap::new();
    for took in [true, false, false] {
        judge(&mut plan, "purge", &Predict::Either("t".into()), took, "");
    }
    for _ in 0..SHARE_MIN_PLANS {
        add_plan(&mut shares, &plan);
    }
    let (_, short) = table(&shares, SHARE_MIN_PLANS);
    assert!(
        short
            .iter()
            .any(|s| s.starts_with("purge took effect in 20 of 60 actions")),
        "{short:?}"
    );
}
