//! The one doubling-backoff rule every retrying part uses (pump heads, inbox marks, event
//! sends, the supervisor's restarts, the start-up store connection): `initial · 2^(n−1)`,
//! capped at `max`.

use std::time::Duration;

/// Delay after the `n`-th failure (1-based; `n ≤ 1` gives `initial`).
pub fn doubling(n: i32, initial: Duration, max: Duration) -> Duration {
    let doublings = u32::try_from(n.saturating_sub(1)).unwrap_or(0).min(30);
    initial
        .checked_mul(1u32 << doublings)
        .unwrap_or(max)
        .min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_then_caps() {
        let (i, m) = (Duration::from_secs(1), Duration::from_secs(300));
        let got: Vec<u64> = (0..12).map(|n| doubling(n, i, m).as_secs()).collect();
        assert_eq!(got, vec![1, 1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(doubling(i32::MAX, i, m), m);
    }
}
