//! The idle phase of `msgx-bench e2e`, after the drain: nothing arrives for `--idle`; the
//! statements the service sends the inbox in that time, per second and per `poll_interval`
//! (`inbox_stats`: counted by MariaDB for the service's own inbox user), with `--idle-trace`
//! also which ones by shape. A stage of its own: idle cost is judged apart from any load.

use std::time::{Duration, Instant};

use super::steady::split;
use crate::inbox_stats::InboxStats;

/// The idle phase: inbox statements while nothing arrives; with `trace`, also which ones, by
/// shape (MariaDB's general log, on for the phase only).
pub(super) async fn idle(
    stats: &InboxStats,
    length: Duration,
    poll_interval: Duration,
    trace: bool,
) -> anyhow::Result<()> {
    let tracing = if trace {
        Some(stats.trace_start().await?)
    } else {
        None
    };
    let before = stats.read().await?;
    let began = Instant::now();
    tokio::time::sleep(length).await;
    let ran = stats.read().await?.since(&before);
    let secs = began.elapsed().as_secs_f64();
    println!(
        "  idle {:.0}s              : inbox statements {:.2}/s = {:.2} per poll_interval {poll_interval:?} ({})",
        secs,
        ran.total() as f64 / secs,
        ran.total() as f64 / secs * poll_interval.as_secs_f64(),
        split(&ran, secs)
    );
    if let Some(t) = tracing {
        for (shape, n) in stats.trace_end(t).await? {
            println!("    {n:>5} x {shape}");
        }
    }
    Ok(())
}
