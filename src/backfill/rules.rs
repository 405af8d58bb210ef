//! The backfill's pure rules: which rows are due, what an existence check means, how long to
//! back off, when to give up, and how to name a missing row. No I/O, no clock reads.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::inbox::mark::MarkState;
use crate::rows::{ProcState, Source};

/// Knobs of the rules (from `backfill.*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackfillRules {
    /// First delay after a transient failure (doubles per failure).
    pub retry_initial: Duration,
    /// Longest delay.
    pub retry_max: Duration,
    /// The failure that reaches this count abandons the row (`MAX_ATTEMPTS`).
    pub max_attempts: i32,
    /// R: a row received (else enqueued, G4) longer ago than this is due every sweep,
    /// whatever its backoff says.
    pub overdue_after: Duration,
}

/// The R bound for "now": rows received (else enqueued) before it are overdue (never before
/// 1970: an absurd R means "nothing is overdue").
pub fn overdue_before(now: DateTime<Utc>, overdue_after: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(overdue_after)
        .ok()
        .and_then(|r| now.checked_sub_signed(r))
        .map_or(DateTime::UNIX_EPOCH, |t| t.max(DateTime::UNIX_EPOCH))
}

/// Latest time we store, 9999-12-31T23:59:59Z (PostgreSQL's range ends long after): an absurd
/// backoff setting schedules "never" instead of failing the statement.
fn far_future() -> DateTime<Utc> {
    DateTime::from_timestamp(253_402_300_799, 0).unwrap_or(DateTime::UNIX_EPOCH)
}

/// Delay after the `failures`-th transient failure (1-based): `retry_initial · 2^(failures−1)`,
/// capped at `retry_max` (30 s, 60 s, 120 s, … 15 min with the defaults).
pub fn backoff(failures: i32, rules: &BackfillRules) -> Duration {
    crate::backoff::doubling(failures, rules.retry_initial, rules.retry_max)
}

/// What follows a transient failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFailure {
    /// Try again at this time (`backfill_attempts + 1`).
    RetryAt(DateTime<Utc>),
    /// This failure reached `max_attempts`: abandon (`MAX_ATTEMPTS`) and alert.
    Abandon,
}

/// Decides after a transient failure of a row that had `attempts_before` failures.
pub fn after_failure(
    attempts_before: i32,
    now: DateTime<Utc>,
    rules: &BackfillRules,
) -> AfterFailure {
    let failures = attempts_before.saturating_add(1);
    if failures >= rules.max_attempts {
        return AfterFailure::Abandon;
    }
    let at = chrono::Duration::from_std(backoff(failures, rules))
        .ok()
        .and_then(|d| now.checked_add_signed(d))
        .map_or_else(far_future, |t| t.min(far_future()));
    AfterFailure::RetryAt(at)
}

/// When a row another inbox session held is tried again: after as long as it has been held
/// so far (`now − since`), within `retry_initial..=retry_max`. Never an attempt of its own: a
/// row the DB owner holds for hours is tried (and logged) ever more rarely, at most once per
/// `retry_max`, and is never abandoned for it.
pub fn after_lock(
    since: DateTime<Utc>,
    now: DateTime<Utc>,
    rules: &BackfillRules,
) -> DateTime<Utc> {
    let held = (now - since).to_std().unwrap_or(Duration::ZERO);
    let wait = held.clamp(
        rules.retry_initial,
        rules.retry_max.max(rules.retry_initial),
    );
    chrono::Duration::from_std(wait)
        .ok()
        .and_then(|d| now.checked_add_signed(d))
        .map_or_else(far_future, |t| t.min(far_future()))
}

/// Which missing inbox row this is (the `kind` label of the abandon alert).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MissingKind {
    /// We never saw the row: registered by the compat entry (or an id released as a hole)
    /// and never read. Reconcile with upstream.
    NeverSeen,
    /// Discovery (or the pump) read the row and it vanished before we could mark it: a breach
    /// of the DB owner's contract (marks before purge, §11).
    PurgedBeforeMark,
}

impl MissingKind {
    /// `never_seen` / `purged_before_mark`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NeverSeen => crate::telemetry::KIND_NEVER_SEEN,
            Self::PurgedBeforeMark => crate::telemetry::KIND_PURGED_BEFORE_MARK,
        }
    }

    /// POLL and LATE rows were read from the inbox by discovery. A COMPAT row that SUCCEEDED
    /// had its text read and applied by the pump. Any other row may never have existed.
    pub fn of(source: Source, state: ProcState) -> Self {
        match (source, state) {
            (Source::Poll | Source::Late, _) | (_, ProcState::Succeeded) => Self::PurgedBeforeMark,
            _ => Self::NeverSeen,
        }
    }

    /// The alert text.
    pub fn detail(self) -> &'static str {
        match self {
            Self::NeverSeen => {
                "inbox row does not exist and was never read by discovery (compat id or released hole)"
            }
            Self::PurgedBeforeMark => {
                "inbox row was read earlier and is gone before it was marked (purged before mark: DB owner's contract)"
            }
        }
    }
}

/// The batch as the existence check found it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checked {
    /// Mark empty: ours to write.
    pub to_mark: Vec<i64>,
    /// Marked already (any non-blank value): confirm, never overwrite.
    pub already: Vec<(i64, String)>,
    /// No row.
    pub missing: Vec<i64>,
}

/// Splits the batch by the existence check's answer (ids absent from it are missing).
pub fn classify(batch: &[i64], found: Vec<(i64, MarkState)>) -> Checked {
    let mut found: HashMap<i64, MarkState> = found.into_iter().collect();
    let mut out = Checked::default();
    for &id in batch {
        match found.remove(&id) {
            Some(MarkState::Empty) => out.to_mark.push(id),
            Some(MarkState::Marked(v)) => out.already.push((id, v)),
            None => out.missing.push(id),
        }
    }
    out
}

/// The actor sweeps again at once when the batch came back full and every row made progress
/// (a backlog is draining); a batch with transient failures waits for the period, so rows kept
/// due by R cannot spin.
pub fn sweep_again_now(selected: usize, batch: u32, transient: usize) -> bool {
    selected > 0 && selected >= batch as usize && transient == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(max_attempts: i32) -> BackfillRules {
        BackfillRules {
            retry_initial: Duration::from_secs(30),
            retry_max: Duration::from_secs(15 * 60),
            max_attempts,
            overdue_after: Duration::from_secs(30 * 24 * 3600),
        }
    }

    fn t0() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-30T01:00:00Z")
            .expect("time")
            .with_timezone(&Utc)
    }

    #[test]
    fn backfill_backoff_doubles_from_30s_to_15m() {
        let r = rules(20);
        let secs: Vec<u64> = (1..=8).map(|n| backoff(n, &r).as_secs()).collect();
        assert_eq!(secs, vec![30, 60, 120, 240, 480, 900, 900, 900]);
        assert_eq!(backoff(1000, &r), Duration::from_secs(900), "no overflow");
        assert_eq!(backoff(0, &r), Duration::from_secs(30));
    }

    #[test]
    fn backfill_abandons_at_max_attempts() {
        let r = rules(3);
        assert_eq!(
            after_failure(0, t0(), &r),
            AfterFailure::RetryAt(t0() + chrono::Duration::seconds(30))
        );
        assert_eq!(
            after_failure(1, t0(), &r),
            AfterFailure::RetryAt(t0() + chrono::Duration::seconds(60))
        );
        assert_eq!(after_failure(2, t0(), &r), AfterFailure::Abandon);
        assert_eq!(after_failure(7, t0(), &r), AfterFailure::Abandon);
        assert_eq!(after_failure(0, t0(), &rules(1)), AfterFailure::Abandon);
        let huge = BackfillRules {
            retry_initial: Duration::from_secs(u64::MAX / 4),
            retry_max: Duration::from_secs(u64::MAX / 2),
            ..rules(5)
        };
        assert_eq!(
            after_failure(0, t0(), &huge),
            AfterFailure::RetryAt(far_future()),
            "no overflow"
        );
    }

    #[test]
    fn backfill_a_held_row_waits_as_long_as_it_was_held_within_the_retry_bounds() {
        let r = rules(3);
        let secs = |held: i64| {
            (after_lock(t0() - chrono::Duration::seconds(held), t0(), &r) - t0()).num_seconds()
        };
        assert_eq!(secs(0), 30, "first time: retry_initial");
        assert_eq!(secs(-5), 30, "a clock step back never shortens it");
        assert_eq!(secs(100), 100);
        assert_eq!(secs(7200), 900, "capped at retry_max");
    }

    #[test]
    fn backfill_overdue_bound_is_now_minus_r() {
        let r = rules(3);
        assert_eq!(
            overdue_before(t0(), r.overdue_after),
            t0() - chrono::Duration::days(30)
        );
        // A huge R never panics and stays storable: nothing is overdue.
        assert_eq!(
            overdue_before(t0(), Duration::from_secs(u64::MAX)),
            DateTime::UNIX_EPOCH
        );
    }

    #[test]
    fn backfill_missing_kind_tells_read_rows_from_never_seen() {
        use MissingKind::{NeverSeen, PurgedBeforeMark};
        for (source, state, kind) in [
            (Source::Poll, ProcState::Dead, PurgedBeforeMark),
            (Source::Late, ProcState::Skipped, PurgedBeforeMark),
            (Source::Compat, ProcState::Succeeded, PurgedBeforeMark),
            (Source::Compat, ProcState::Dead, NeverSeen),
        ] {
            assert_eq!(MissingKind::of(source, state), kind, "{source:?} {state:?}");
        }
        assert_eq!(MissingKind::NeverSeen.as_str(), "never_seen");
        assert_eq!(MissingKind::PurgedBeforeMark.as_str(), "purged_before_mark");
    }

    #[test]
    fn backfill_classify_splits_by_existence_and_mark() {
        let found = vec![
            (3, MarkState::Marked("PROCESSED".into())),
            (1, MarkState::Empty),
            (4, MarkState::Marked("LEGACY".into())),
        ];
        let c = classify(&[1, 2, 3, 4, 5], found);
        assert_eq!(c.to_mark, vec![1]);
        assert_eq!(
            c.already,
            vec![(3, "PROCESSED".into()), (4, "LEGACY".into())]
        );
        assert_eq!(c.missing, vec![2, 5]);
    }

    #[test]
    fn backfill_sweeps_again_only_when_full_and_clean() {
        assert!(sweep_again_now(1000, 1000, 0));
        assert!(!sweep_again_now(999, 1000, 0));
        assert!(!sweep_again_now(1000, 1000, 1));
        assert!(!sweep_again_now(0, 1000, 0));
    }
}
