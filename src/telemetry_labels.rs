//! The label values the core steps hand to telemetry are the ones `telemetry` registers at
//! start-up (the series exported from zero). Here, not in `telemetry`, which imports no caller.

use std::path::Path;

use crate::pump::{ErrorClass, Outcome};
use crate::telemetry;

#[test]
fn every_processing_outcome_is_a_registered_series() {
    let combos = telemetry::processed_combos();
    let mut outcomes = vec![
        Outcome::Succeeded {
            changes: 1,
            events: 1,
        },
        Outcome::FinishedElsewhere,
    ];
    for class in ErrorClass::ALL.iter().copied() {
        let detail = String::new();
        outcomes.push(Outcome::Skipped {
            reason: class,
            detail: detail.clone(),
        });
        outcomes.push(Outcome::Dead {
            class,
            detail: detail.clone(),
        });
        outcomes.push(Outcome::Failed {
            class,
            detail,
            next_attempt_at: chrono::Utc::now(),
        });
    }
    for o in &outcomes {
        // Exhaustive: a new outcome must be listed above.
        match o {
            Outcome::Succeeded { .. }
            | Outcome::FinishedElsewhere
            | Outcome::Skipped { .. }
            | Outcome::Dead { .. }
            | Outcome::Failed { .. } => {}
        }
        let e = o.event();
        let pair = vec![e.outcome(), e.class()];
        assert!(combos.contains(&pair), "{pair:?} is not registered");
    }
    // A poisoned head is counted as dead/EXHAUSTED.
    assert!(combos.contains(&vec!["dead", ErrorClass::Exhausted.as_str()]));
}

#[test]
fn every_verify_invariant_is_a_registered_series() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/verify");
    let mut found = 0;
    for entry in std::fs::read_dir(&dir).expect("src/verify") {
        let text = std::fs::read_to_string(entry.expect("entry").path()).expect("readable");
        let mut rest = text.as_str();
        while let Some(i) = rest.find("Finding::new(") {
            rest = &rest[i + "Finding::new(".len()..];
            let name = rest
                .trim_start()
                .strip_prefix('"')
                .and_then(|r| r.split('"').next())
                .expect("Finding::new takes the invariant as a literal");
            assert!(
                telemetry::INVARIANTS.contains(&name),
                "invariant {name} is not in telemetry::INVARIANTS"
            );
            found += 1;
        }
    }
    assert!(found >= telemetry::INVARIANTS.len(), "found {found}");
}
