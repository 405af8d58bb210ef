//! The upstream side of `msgx-bench discovery`: concurrent writers offering `--rate` together,
//! each on its own connection and transaction, rolling back or holding their commit as asked,
//! and recording the wall time each COMMIT returned. Apart from the poller's side (started and
//! observed in `discovery.rs`) because it is the load, not the thing measured.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use msgx_core::settings::Settings;
use rand::{Rng, SeedableRng};
use sqlx::Connection;

use super::DiscoveryBenchArgs;

/// Commit wall times by id, written by the writers.
pub(super) type Commits = Arc<Mutex<BTreeMap<i64, DateTime<Utc>>>>;

/// The writers, running: their tasks (each returns how many it rolled back) and commits.
pub(super) struct Writers {
    pub(super) tasks: tokio::task::JoinSet<anyhow::Result<u64>>,
    pub(super) commits: Commits,
    pub(super) started: Instant,
    pub(super) start_wall: DateTime<Utc>,
}

/// Starts the writers: together they offer `--rate`, each on its own connection and
/// transaction, rolling back or holding their commit as asked.
pub(super) fn spawn_writers(
    settings: &Settings,
    args: &DiscoveryBenchArgs,
    pool: &sqlx::MySqlPool,
) -> anyhow::Result<Writers> {
    let names = settings.inbox_names();
    let commits: Commits = Arc::default();
    let started = Instant::now();
    let start_wall = Utc::now();
    let interval = Duration::from_secs_f64(args.writers as f64 / args.rate);
    let sql = format!(
        "INSERT INTO {} ({}, {}) VALUES (NOW(), ?)",
        names.table, names.received, names.message
    );
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..args.writers {
        let (pool, commits, sql) = (pool.clone(), commits.clone(), sql.clone());
        let (rollback, hold, hold_max, duration) =
            (args.rollback, args.hold, args.hold_max, args.duration);
        tasks.spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(w as u64 + 1);
            // Writers start staggered and pace themselves: together they offer `rate`.
            let mut next = Instant::now() + interval.mul_f64(w as f64 / 8.0_f64.max(1.0));
            let mut rolled = 0u64;
            while started.elapsed() < duration {
                tokio::time::sleep_until(next.into()).await;
                next += interval;
                let mut conn = pool.acquire().await?;
                let mut tx = conn.begin().await?;
                let id = sqlx::query(&sql)
                    .bind("<MSG/>")
                    .execute(&mut *tx)
                    .await?
                    .last_insert_id() as i64;
                if rng.random_bool(rollback) {
                    tx.rollback().await?;
                    rolled += 1;
                    continue;
                }
                if rng.random_bool(hold) {
                    tokio::time::sleep(hold_max.mul_f64(rng.random::<f64>())).await;
                }
                tx.commit().await?;
                commits
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(id, Utc::now());
            }
            anyhow::Ok(rolled)
        });
    }
    Ok(Writers {
        tasks,
        commits,
        started,
        start_wall,
    })
}
