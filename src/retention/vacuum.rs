//! Which of our tables need a VACUUM or an ANALYZE now (`retention.vacuum`), and the step that
//! runs them. The rule is PostgreSQL's own autovacuum rule (dead tuples past
//! `threshold + scale_factor × live`), applied only where the server's autovacuum does not
//! already do it (mode `auto`): on this project's CI host `autovacuum = off`, and a
//! million-message backlog then leaves PROC_STATE with two dead versions per live row and
//! FLIGHT_STATE with nine (docs/performance.md).

use std::time::{Duration, Instant};

use crate::settings::{RetentionSettings, VacuumMode};
use crate::store::{Maintenance, Store, StoreError, TableActivity};
use crate::telemetry;

/// `retention.vacuum*`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VacuumPolicy {
    /// `retention.vacuum`.
    pub mode: VacuumMode,
    /// `retention.vacuum_threshold`.
    pub threshold: f64,
    /// `retention.vacuum_scale_factor`.
    pub scale_factor: f64,
}

impl VacuumPolicy {
    /// From the (validated) settings.
    pub fn from_settings(s: &RetentionSettings) -> Self {
        Self {
            mode: s.vacuum,
            threshold: f64::from(s.vacuum_threshold),
            scale_factor: s.vacuum_scale_factor,
        }
    }

    /// What `t` needs now, given whether the server's autovacuum runs. A table past the dead
    /// tuple bound is vacuumed (with ANALYZE); one that only changed much since its last
    /// analyze (a growing, rarely updated table) is analyzed, so plans see its size.
    pub fn due(&self, server_autovacuum: bool, t: &TableActivity) -> Option<Maintenance> {
        match self.mode {
            VacuumMode::Off => return None,
            VacuumMode::Auto if server_autovacuum && t.autovacuum_enabled => return None,
            VacuumMode::Auto | VacuumMode::Always => {}
        }
        let bound = self.threshold + self.scale_factor * t.live.max(0) as f64;
        if t.dead as f64 > bound {
            Some(Maintenance::Vacuum)
        } else if t.modified as f64 > bound {
            Some(Maintenance::Analyze)
        } else {
            None
        }
    }
}

/// What one check did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VacuumReport {
    /// The server's autovacuum was on.
    pub server_autovacuum: bool,
    /// Tables maintained, with what ran and how long it took.
    pub done: Vec<(String, Maintenance, Duration)>,
    /// Tables whose maintenance failed, with the error (retried at the next check).
    pub failed: Vec<(String, String)>,
}

/// One check: read the counters, then maintain every table that is due, one after another
/// (the biggest backlog of dead tuples first). An error on one table is reported and the rest
/// still run; only failing to read the counters fails the step.
pub async fn vacuum_step(store: &Store, policy: &VacuumPolicy) -> Result<VacuumReport, StoreError> {
    let mut report = VacuumReport::default();
    if policy.mode == VacuumMode::Off {
        return Ok(report);
    }
    report.server_autovacuum = store.server_autovacuum().await?;
    telemetry::server_autovacuum(report.server_autovacuum);
    let mut tables = store.table_activity().await?;
    for t in &tables {
        telemetry::dead_tuples(&t.table, t.dead);
    }
    tables.sort_by_key(|t| std::cmp::Reverse(t.dead));
    for t in &tables {
        let Some(what) = policy.due(report.server_autovacuum, t) else {
            continue;
        };
        let started = Instant::now();
        match store.maintain_table(&t.table, what).await {
            Ok(()) => {
                let took = started.elapsed();
                telemetry::vacuumed(&t.table, what.label(), took);
                tracing::info!(
                    table = %t.table,
                    what = what.label(),
                    live = t.live,
                    dead = t.dead,
                    modified = t.modified,
                    took_ms = took.as_millis() as u64,
                    "vacuum: table maintained"
                );
                report.done.push((t.table.clone(), what, took));
            }
            Err(e) => {
                telemetry::vacuum_failed(&t.table, &e.to_string());
                report.failed.push((t.table.clone(), e.to_string()));
            }
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(mode: VacuumMode) -> VacuumPolicy {
        VacuumPolicy {
            mode,
            threshold: 1000.0,
            scale_factor: 0.1,
        }
    }

    fn table(live: i64, dead: i64, modified: i64, autovacuum_enabled: bool) -> TableActivity {
        TableActivity {
            table: "proc_state".into(),
            live,
            dead,
            modified,
            autovacuum_enabled,
        }
    }

    #[test]
    fn vacuum_past_the_bound_only() {
        let p = policy(VacuumMode::Always);
        // bound = 1000 + 0.1 × 1,000,000 = 101,000
        assert_eq!(p.due(false, &table(1_000_000, 101_000, 0, true)), None);
        assert_eq!(
            p.due(false, &table(1_000_000, 101_001, 0, true)),
            Some(Maintenance::Vacuum)
        );
        // A growing table with few dead tuples is analyzed alone.
        assert_eq!(
            p.due(false, &table(1_000_000, 10, 200_000, true)),
            Some(Maintenance::Analyze)
        );
        // A small table waits for the absolute threshold.
        assert_eq!(p.due(false, &table(1, 999, 999, true)), None);
        // Negative estimates (never analyzed) count as empty.
        assert_eq!(
            p.due(false, &table(-1, 1_001, 0, true)),
            Some(Maintenance::Vacuum)
        );
    }

    #[test]
    fn auto_leaves_covered_tables_to_the_server() {
        let p = policy(VacuumMode::Auto);
        let bloated = table(1000, 1_000_000, 0, true);
        assert_eq!(p.due(true, &bloated), None);
        assert_eq!(p.due(false, &bloated), Some(Maintenance::Vacuum));
        // A table that opts out of autovacuum is ours even when the server runs it.
        let opted_out = table(1000, 1_000_000, 0, false);
        assert_eq!(p.due(true, &opted_out), Some(Maintenance::Vacuum));
        assert_eq!(
            policy(VacuumMode::Always).due(true, &bloated),
            Some(Maintenance::Vacuum)
        );
        assert_eq!(policy(VacuumMode::Off).due(false, &opted_out), None);
    }
}
