//! Unit tests of the simulator's configuration, report and per-row plan (no database).

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
