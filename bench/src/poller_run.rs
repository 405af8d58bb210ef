//! Phase 4, the real thing: `poll_once` in a loop until W reaches the inbox head, timing every
//! round and sampling the RSS every 10 % of progress.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use msgx_core::clock::SystemClock;
use msgx_core::inbox::Inbox;
use msgx_core::poller::{poll_once, PollConfig, PollStages};
use msgx_core::store::Store;

use super::Loaded;

/// The poller phase.
#[derive(Debug)]
pub(super) struct PollPhase {
    /// Wall time from the first round to W at the inbox head.
    pub(super) elapsed: Duration,
    /// Wall time of every round.
    pub(super) latencies: Vec<Duration>,
    /// Sum of the rounds' newly enqueued rows.
    pub(super) enqueued_new: u64,
    /// `count(*)` of proc_state afterwards.
    pub(super) proc_state_rows: i64,
    /// RSS samples: start, every 10 % of progress, end.
    pub(super) rss: Vec<(String, Option<f64>)>,
    /// The rounds' stage timings as `poll_once` recorded them, summed.
    pub(super) stages: PollStages,
}

/// `poll_once` until W reaches the inbox head.
pub(super) async fn poll_phase(
    inbox: &Inbox,
    store: &Store,
    cfg: PollConfig,
    load: &Loaded,
) -> anyhow::Result<PollPhase> {
    let clock = SystemClock;
    let total = u64::try_from(load.max_id - load.min_id + 1).context("id range")?;
    let expected_rounds = total.div_ceil(u64::from(cfg.claim_batch)) as usize + 8;
    // Allocated up front so the samples themselves do not grow the RSS.
    let mut latencies: Vec<Duration> = Vec::with_capacity(expected_rounds);
    let mut rss: Vec<(String, Option<f64>)> = Vec::with_capacity(12);
    rss.push(("start".to_string(), rss_mib()));
    let mut enqueued_new: u64 = 0;
    let mut stages = PollStages::default();
    let mut next_tenth: u64 = 1;
    let mut w = store
        .read_cursor()
        .await
        .context("reading the fresh cursor")?
        .cursor
        .w;
    let started = Instant::now();
    while w < load.max_id {
        let round_started = Instant::now();
        let report = poll_once(inbox, store, &clock, cfg)
            .await
            .with_context(|| format!("poll round {} at W={w}", latencies.len() + 1))?;
        latencies.push(round_started.elapsed());
        enqueued_new += report.enqueued_new;
        stages.add(&report.stages);
        anyhow::ensure!(
            report.moved(),
            "W did not move from {w} in round {} (read {} rows, inbox head {}); the bench loads \
             contiguous ids, so this should not happen",
            latencies.len(),
            report.read,
            load.max_id
        );
        w = report.advance.w;
        let done = u64::try_from(w - load.min_id + 1).unwrap_or(0);
        while next_tenth <= 9 && done * 10 >= next_tenth * total {
            let sample = rss_mib();
            eprintln!(
                "bench enqueue: {:>3}% W={w} after {:.1}s, {} rounds, RSS {}",
                next_tenth * 10,
                started.elapsed().as_secs_f64(),
                latencies.len(),
                sample.map_or_else(|| "n/a".to_string(), |v| format!("{v:.1} MiB"))
            );
            rss.push((format!("{}%", next_tenth * 10), sample));
            next_tenth += 1;
        }
    }
    let elapsed = started.elapsed();
    rss.push(("end".to_string(), rss_mib()));
    let proc_state_rows = store
        .proc_state_count()
        .await
        .context("counting proc_state")?;
    anyhow::ensure!(
        u64::try_from(proc_state_rows).ok() == Some(total),
        "proc_state holds {proc_state_rows} rows after the run, expected {total}"
    );
    Ok(PollPhase {
        elapsed,
        latencies,
        enqueued_new,
        proc_state_rows,
        rss,
        stages,
    })
}

/// Resident set size of this process in MiB (Linux `/proc/self/status`), None elsewhere.
pub fn rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}
