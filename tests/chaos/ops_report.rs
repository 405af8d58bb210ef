//! The run's report: what each sequence came to ([`Outcome`]), one line per sequence, the
//! failing plans (written as plan files) and their violations by kind, and the totals per
//! delivery mode.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::instance::log_dir;
use crate::ops_plan::Plan;
use msgx_core::settings::Delivery;

/// What one sequence came to.
pub(super) struct Outcome {
    pub(super) tag: String,
    pub(super) plan: Plan,
    pub(super) secs: f64,
    pub(super) actions: BTreeMap<&'static str, usize>,
    pub(super) idle: BTreeMap<&'static str, usize>,
    /// The operator actions against the model's predictions of their effect.
    pub(super) effects: BTreeMap<&'static str, crate::ops_effect::Tally>,
    pub(super) line: String,
    pub(super) duplicates: usize,
    pub(super) violations: Vec<String>,
    /// The delivery mode it ran in.
    pub(super) delivery: Delivery,
}

/// The summary: one line per sequence, the failing plans and violations by kind, the totals.
pub(super) fn report(outcomes: &[Outcome], took: Duration, concurrency: usize) {
    let mut totals: BTreeMap<&'static str, (usize, usize)> = BTreeMap::new();
    for o in outcomes {
        for (k, n) in &o.actions {
            totals.entry(k).or_default().0 += n;
        }
        for (k, n) in &o.idle {
            totals.entry(k).or_default().1 += n;
        }
    }
    let mut sorted: Vec<&Outcome> = outcomes.iter().collect();
    sorted.sort_by(|a, b| a.tag.cmp(&b.tag));
    let mut kinds: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for o in &sorted {
        eprintln!(
            "ops: {:>11} {:>13} {:>6.1}s {:>2} violations {:>3} duplicates  {}",
            o.tag,
            o.delivery.as_str(),
            o.secs,
            o.violations.len(),
            o.duplicates,
            o.line
        );
        if o.violations.is_empty() {
            continue;
        }
        let path = log_dir().join(format!("plan-{}.json", o.tag));
        let _ = std::fs::write(&path, o.plan.to_json());
        eprintln!("{}  (plan file {})", o.plan, path.display());
        for v in &o.violations {
            eprintln!("    violation: {v}");
            kinds.entry(violation_kind(v)).or_default().push(&o.tag);
        }
    }
    for (k, tags) in &kinds {
        eprintln!("ops: violations of kind {k}: {} ({tags:?})", tags.len());
    }
    let violations: usize = outcomes.iter().map(|o| o.violations.len()).sum();
    let failed = outcomes.iter().filter(|o| !o.violations.is_empty()).count();
    let modes: Vec<String> = [Delivery::AtLeastOnce, Delivery::ExactlyOnce]
        .into_iter()
        .map(|d| {
            let of: Vec<&Outcome> = outcomes.iter().filter(|o| o.delivery == d).collect();
            let dups: usize = of.iter().map(|o| o.duplicates).sum();
            let bad = of.iter().filter(|o| !o.violations.is_empty()).count();
            format!(
                "{}: {} sequences, {bad} failed, {dups} duplicate records",
                d.as_str(),
                of.len()
            )
        })
        .collect();
    eprintln!(
        "ops summary: {} sequences in {:.1}s ({concurrency} at a time), {violations} violations \
         in {failed} sequences ({}); actions: {}",
        outcomes.len(),
        took.as_secs_f64(),
        modes.join("; "),
        totals
            .iter()
            .map(|(k, (n, idle))| match idle {
                0 => format!("{k}={n}"),
                i => format!("{k}={n} ({i} idle)"),
            })
            .collect::<Vec<_>>()
            .join(" ")
    );
}

/// A violation's kind, for the summary (the first words that say what broke).
fn violation_kind(v: &str) -> &'static str {
    let verify_fail = |inv: &str| v.starts_with("verify") && v.contains(&format!("FAIL {inv}"));
    if v.starts_with("purge up to READY boundary") {
        "purge_unfinished"
    } else if v.contains("above the inbox head") {
        "cutover_above_head"
    } else if v.starts_with("rows abandoned") {
        "abandoned"
    } else if v.contains("panicked at") {
        "process_panicked"
    } else if verify_fail("inbox_row_present") {
        "verify_inbox_row_present"
    } else if v.starts_with("verify") {
        "verify_other"
    } else if ["Killed", "Term", "Fenced", "Aborted"]
        .iter()
        .any(|e| v.contains(&format!(": expected {e}, got")))
    {
        "exit_not_documented"
    } else if v.starts_with("panicked") {
        "sequence_panicked"
    } else {
        "model"
    }
}
