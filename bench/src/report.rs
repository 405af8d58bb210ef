//! The printed report: rates, per-round times and percentiles of what the phases measured.

use std::time::Duration;

use super::{EnqueueBenchArgs, Measured};

/// Prints the bare limits, the poller run, the round breakdowns and the RSS samples.
pub(super) fn print_measured(
    args: &EnqueueBenchArgs,
    claim_batch: u32,
    async_commit: bool,
    m: &Measured,
) {
    let sync_note = if async_commit {
        "SET LOCAL synchronous_commit = off"
    } else {
        "synchronous_commit as configured on the server"
    };
    let unnest_rate = rate(2 * args.rows, m.bare_unnest_before + m.bare_unnest_after);
    println!(
        "  bare PG UNNEST insert : {unnest_rate:.0} rows/s  (before the poller {:.0}, after {:.0}; \
         {claim_batch} rows per tx, {sync_note})",
        rate(args.rows, m.bare_unnest_before),
        rate(args.rows, m.bare_unnest_after),
    );
    let values_rate = rate(args.rows, m.bare_values);
    println!(
        "  bare PG VALUES insert : {values_rate:.0} rows/s  (same transactions, before the poller)"
    );
    let poll_rate = rate(args.rows, m.poll.elapsed);
    let mut sorted = m.poll.latencies.clone();
    sorted.sort_unstable();
    println!(
        "  poller enqueue        : {:.0} rows/s  ({:.1}% of bare UNNEST, {:.1}% of bare VALUES)   \
         rounds {}, round p50 {} p99 {} max {}",
        poll_rate,
        100.0 * poll_rate / unnest_rate,
        100.0 * poll_rate / values_rate,
        sorted.len(),
        ms(percentile(&sorted, 0.50)),
        ms(percentile(&sorted, 0.99)),
        ms(sorted.last().copied().unwrap_or_default()),
    );
    println!(
        "  poller detail         : {} rows in {:.1}s, {} newly enqueued, proc_state holds {}",
        args.rows,
        m.poll.elapsed.as_secs_f64(),
        m.poll.enqueued_new,
        m.poll.proc_state_rows
    );
    let st = &m.poll.stages;
    let rounds = m.poll.latencies.len().max(1) as u32;
    let per_round = |d: Duration| ms(d / rounds);
    let bare_txs = u32::try_from(args.rows.div_ceil(u64::from(claim_batch))).unwrap_or(u32::MAX);
    println!(
        "  round stages          : recorded by poll_once itself, per round: read_cursor {} + \
         inbox read {} + decide {} + enqueue commit {} + inbox max_id {} (bare UNNEST tx {})",
        per_round(st.read_cursor),
        per_round(st.read_rows),
        per_round(st.decide),
        per_round(st.commit),
        per_round(st.inbox_head),
        ms((m.bare_unnest_before + m.bare_unnest_after) / bare_txs.max(1).saturating_mul(2)),
    );
    let rss: Vec<String> = m
        .poll
        .rss
        .iter()
        .map(|(label, mib)| match mib {
            Some(v) => format!("{label} {v:.1}"),
            None => format!("{label} n/a"),
        })
        .collect();
    println!("  RSS MiB               : {}", rss.join(", "));
}

/// Nearest-rank percentile of an ascending slice (`p` in 0..=1); zero when empty.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Rows per second.
pub(super) fn rate(rows: u64, took: Duration) -> f64 {
    rows as f64 / took.as_secs_f64().max(1e-9)
}

/// A duration as milliseconds with one decimal.
fn ms(d: Duration) -> String {
    format!("{:.1}ms", d.as_secs_f64() * 1e3)
}

/// Paces `total` units in 10 ms ticks: `per_tick` units fall due every tick (fractions carry
/// over), so a steady offered rate holds on the wall clock without drift.
pub(super) struct Pacer {
    interval: tokio::time::Interval,
    per_tick: f64,
    due: f64,
    made: u64,
    total: u64,
}

impl Pacer {
    /// The tick.
    pub(super) const TICK: Duration = Duration::from_millis(10);

    /// `rate` units per second for `length` (at least `min_per_tick` per tick).
    pub(super) fn new(rate: f64, length: Duration, min_per_tick: f64) -> Self {
        Self {
            interval: tokio::time::interval(Self::TICK),
            per_tick: (rate * Self::TICK.as_secs_f64()).max(min_per_tick),
            due: 0.0,
            made: 0,
            total: (rate * length.as_secs_f64()) as u64,
        }
    }

    /// Units in all.
    pub(super) fn total(&self) -> u64 {
        self.total
    }

    /// Waits for the next tick and returns `(made before it, due in it)`; None when all
    /// `total` are made.
    pub(super) async fn next(&mut self) -> Option<(u64, u64)> {
        if self.made >= self.total {
            return None;
        }
        self.interval.tick().await;
        self.due += self.per_tick;
        let n = (self.due.floor() as u64).min(self.total - self.made);
        self.due -= n as f64;
        let before = self.made;
        self.made += n;
        Some((before, n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 0.50), Duration::from_millis(50));
        assert_eq!(percentile(&v, 0.99), Duration::from_millis(99));
        assert_eq!(percentile(&v, 1.0), Duration::from_millis(100));
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
    }
}
