//! Pure delivery rules.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::store::events::PendingEvent;

/// Retry policy for failed sends (`[dispatch]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryRules {
    /// First retry delay.
    pub retry_initial: Duration,
    /// Longest retry delay.
    pub retry_max: Duration,
    /// Failed sends before the event goes to the dead-letter topic.
    pub max_attempts: i32,
}

/// What a failed send leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFailure {
    /// Try again at this time; later events of the key wait.
    RetryAt(DateTime<Utc>),
    /// Attempts exhausted: copy to the dead-letter topic next (due now).
    Exhausted,
}

/// After the `attempts`-th failed send (1-based) at `now`.
pub fn after_failure(attempts: i32, now: DateTime<Utc>, rules: &RetryRules) -> AfterFailure {
    if attempts >= rules.max_attempts {
        return AfterFailure::Exhausted;
    }
    let delay = crate::backoff::doubling(attempts, rules.retry_initial, rules.retry_max);
    AfterFailure::RetryAt(add(now, delay))
}

/// `at + d`, saturating instead of panicking on absurd durations.
pub fn add(at: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(d)
        .ok()
        .and_then(|d| at.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// True when the event already used up its attempts: it goes to the dead-letter topic.
pub fn is_exhausted(ev: &PendingEvent, rules: &RetryRules) -> bool {
    ev.attempts >= rules.max_attempts
}

/// Splits a batch (in event order) into per-key chains, each in event order, chains ordered by
/// their first event. Different chains go out concurrently; a chain goes one event after the
/// other and stops at its first failure.
pub fn chains(batch: Vec<PendingEvent>) -> Vec<Vec<PendingEvent>> {
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut out: Vec<Vec<PendingEvent>> = Vec::new();
    for ev in batch {
        match index.get(&ev.flight_key) {
            Some(&i) => out[i].push(ev),
            None => {
                index.insert(ev.flight_key.clone(), out.len());
                out.push(vec![ev]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ev(id: i64, key: &str) -> PendingEvent {
        PendingEvent {
            event_id: id,
            ce_id: format!("00000000-0000-4000-8000-{id:012}"),
            msg_id: id,
            flight_key: key.into(),
            event_type: "FLIGHT_UPDATED".into(),
            payload: "{}".into(),
            attempts: 0,
            created_at: DateTime::UNIX_EPOCH,
            last_error: None,
            dead_ce_id: format!("00000000-0000-4000-9000-{id:012}"),
            trace_parent: None,
            trace_state: None,
        }
    }

    fn rules() -> RetryRules {
        RetryRules {
            retry_initial: Duration::from_secs(1),
            retry_max: Duration::from_secs(60),
            max_attempts: 4,
        }
    }

    #[test]
    fn failures_back_off_then_exhaust() {
        let now = DateTime::UNIX_EPOCH;
        let at = |n| match after_failure(n, now, &rules()) {
            AfterFailure::RetryAt(t) => Some((t - now).num_seconds()),
            AfterFailure::Exhausted => None,
        };
        assert_eq!(
            [at(1), at(2), at(3), at(4)],
            [Some(1), Some(2), Some(4), None]
        );
    }

    #[test]
    fn chains_keep_key_order_and_first_seen_order() {
        let got = chains(vec![
            ev(1, "A"),
            ev(2, "B"),
            ev(3, "A"),
            ev(4, "C"),
            ev(5, "B"),
        ]);
        let ids: Vec<Vec<i64>> = got
            .iter()
            .map(|c| c.iter().map(|e| e.event_id).collect())
            .collect();
        assert_eq!(ids, vec![vec![1, 3], vec![2, 5], vec![4]]);
    }

    proptest! {
        /// Every event lands in exactly one chain, a chain has one key, and each chain is in
        /// event order.
        #[test]
        fn chains_partition_the_batch(keys in proptest::collection::vec(0u8..6, 0..200)) {
            let batch: Vec<PendingEvent> = keys
                .iter()
                .enumerate()
                .map(|(i, k)| ev(i as i64, &format!("K{k}")))
                .collect();
            let n = batch.len();
            let got = chains(batch);
            prop_assert_eq!(got.iter().map(Vec::len).sum::<usize>(), n);
            let mut seen = std::collections::HashSet::new();
            for c in &got {
                prop_assert!(seen.insert(c[0].flight_key.clone()));
                prop_assert!(c.iter().all(|e| e.flight_key == c[0].flight_key));
                prop_assert!(c.windows(2).all(|w| w[0].event_id < w[1].event_id));
            }
        }
    }
}
