//! What `msgx-bench discovery` measured and prints: discovery lags (enqueued_at − commit) per
//! minute of commit time and overall, rows enqueued late or missing, and when W reached the last
//! committed row, beside the bound `max_commit_delay + 2 × poll_interval`.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{DiscoveryBenchArgs, Outcome};
use crate::report::percentile;

/// Discovery lags (enqueued_at − commit) of the rows the poller enqueued, per minute of
/// commit time and overall, with the rows enqueued late and those missing.
pub(super) struct Lags {
    pub(super) per_minute: BTreeMap<i64, Vec<Duration>>,
    pub(super) all: Vec<Duration>,
    pub(super) late: u64,
    pub(super) missing: u64,
}

/// Reads what the poller enqueued and computes the lags.
pub(super) async fn lags(
    store: &msgx_core::store::Store,
    commits: &BTreeMap<i64, DateTime<Utc>>,
    start_wall: DateTime<Utc>,
) -> anyhow::Result<Lags> {
    let enqueued: Vec<(i64, DateTime<Utc>, String)> =
        sqlx::query_as("SELECT msg_id, enqueued_at, source FROM proc_state ORDER BY msg_id")
            .fetch_all(store.pool())
            .await?;
    let mut per_minute: BTreeMap<i64, Vec<Duration>> = BTreeMap::new();
    let mut all = Vec::with_capacity(enqueued.len());
    let mut late = 0u64;
    for (id, at, source) in &enqueued {
        let Some(committed) = commits.get(id) else {
            continue;
        };
        if source != "POLL" {
            late += 1;
            continue;
        }
        let lag = (*at - *committed).to_std().unwrap_or(Duration::ZERO);
        let minute = (*committed - start_wall).num_seconds().max(0) / 60;
        per_minute.entry(minute).or_default().push(lag);
        all.push(lag);
    }
    let missing = commits.len() as u64 - all.len() as u64 - late;
    all.sort_unstable();
    Ok(Lags {
        per_minute,
        all,
        late,
        missing,
    })
}

/// Prints the written rows, the lags per minute and overall, and when W reached the end.
pub(super) async fn report(
    store: &msgx_core::store::Store,
    args: &DiscoveryBenchArgs,
    outcome: Outcome,
    bound: Duration,
) -> anyhow::Result<()> {
    let start_wall = outcome.start_wall;
    let commits = &outcome.commits;
    let mut l = lags(store, commits, start_wall).await?;
    println!(
        "  written               : {} committed ({:.1} msg/s), {} rolled back, in {:.0}s",
        commits.len(),
        commits.len() as f64 / args.duration.as_secs_f64(),
        outcome.rolled_back,
        args.duration.as_secs_f64()
    );
    println!("  minute | committed | lag p50 | lag p99 | lag max | open holes (max)");
    for (minute, lags) in &mut l.per_minute {
        lags.sort_unstable();
        println!(
            "  {:>6} | {:>9} | {:>6.2}s | {:>6.2}s | {:>6.2}s | {:>5}",
            minute,
            lags.len(),
            percentile(lags, 0.50).as_secs_f64(),
            percentile(lags, 0.99).as_secs_f64(),
            lags.last().copied().unwrap_or_default().as_secs_f64(),
            outcome
                .holes_by_minute
                .get(&(*minute as u64))
                .copied()
                .unwrap_or(0),
        );
    }
    print_overall(&l.all, outcome.reached, bound);
    println!(
        "  not enqueued by POLL  : {} late (LATE source), {} missing",
        l.late, l.missing
    );
    Ok(())
}

/// The overall lag against the bound, and when W reached the last committed row.
pub(super) fn print_overall(all: &[Duration], reached: Option<Duration>, bound: Duration) {
    let p99 = percentile(all, 0.99);
    println!(
        "  overall               : lag p50 {:.2}s  p99 {:.2}s  max {:.2}s   (bound {:.1}s; p99 {} the bound)",
        percentile(all, 0.50).as_secs_f64(),
        p99.as_secs_f64(),
        all.last().copied().unwrap_or_default().as_secs_f64(),
        bound.as_secs_f64(),
        if p99 <= bound { "within" } else { "OVER" }
    );
    match reached {
        Some(d) => println!(
            "  W at the end          : reached the last committed row {:.1}s after the writers stopped (bound {:.1}s)",
            d.as_secs_f64(),
            bound.as_secs_f64()
        ),
        None => println!(
            "  W at the end          : did NOT reach the last committed row within {:.0}s",
            (3 * bound + Duration::from_secs(30)).as_secs_f64()
        ),
    }
}
