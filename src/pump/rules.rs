//! The pump's pure rules: what to do with the head (process, wait, poison) and how long to
//! back off after a failure. No I/O, no clock reads.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// Knobs of the head rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadRules {
    /// A head older than this (from its first processing attempt) is poison.
    pub head_deadline: Duration,
    /// A head with this many attempts started is poison.
    pub max_attempts: i32,
    /// First retry delay.
    pub retry_initial: Duration,
    /// Longest retry delay.
    pub retry_max: Duration,
    /// How long after its first attempt a message whose inbox row is missing is still read
    /// again ([`missing_row_is_final`]).
    pub missing_row_grace: Duration,
}

pub use crate::rows::Head;

/// What to do with the head now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadDecision {
    /// Process it.
    Process,
    /// A FAILED head not yet due: everything behind it waits until then.
    WaitUntil(DateTime<Utc>),
    /// Escalate to DEAD(EXHAUSTED).
    Poison(PoisonReason),
}

/// Why a head is poison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoisonReason {
    /// `attempts ≥ max_attempts`.
    Attempts(i32),
    /// `now − PROCESSING_STARTED_AT ≥ head_deadline`.
    Deadline(Duration),
}

impl std::fmt::Display for PoisonReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Attempts(n) => write!(f, "{n} attempts exhausted"),
            Self::Deadline(age) => write!(f, "head stuck for {}s", age.as_secs()),
        }
    }
}

/// Decides about the head (seed §3 flow ②).
///
/// A FAILED head is poison when its attempts are exhausted or it has been the head for
/// `head_deadline` since its first attempt; otherwise it waits until due. A PENDING head is
/// processed — unless it already started `max_attempts` attempts without finishing any (a
/// message that kills the process every time), which is poison too.
pub fn decide(head: &Head, now: DateTime<Utc>, rules: &HeadRules) -> HeadDecision {
    if head.attempts >= rules.max_attempts {
        return HeadDecision::Poison(PoisonReason::Attempts(head.attempts));
    }
    if head.failed {
        if let Some(started) = head.processing_started_at {
            let age = (now - started).to_std().unwrap_or(Duration::ZERO);
            if age >= rules.head_deadline {
                return HeadDecision::Poison(PoisonReason::Deadline(age));
            }
        }
        if let Some(due) = head.next_attempt_at {
            if due > now {
                return HeadDecision::WaitUntil(due);
            }
        }
    }
    HeadDecision::Process
}

/// Delay before retry number `attempts + 1`: initial × 2^(attempts − 1), capped.
pub fn backoff(attempts: i32, rules: &HeadRules) -> Duration {
    crate::backoff::doubling(attempts, rules.retry_initial, rules.retry_max)
}

/// Whether attempt `attempts` of a message whose inbox row is missing (and has no raw copy)
/// ends it DEAD(MALFORMED) (SPEC §4) or fails it to be read again with the backoff. A row can
/// be gone for a moment — a table rotation between its `RENAME` and its catch-up copy — and a
/// DEAD(MALFORMED) message is not replayable, so it is read again while `missing_row_grace`
/// since its first attempt (`started`; none: this is the first) lasts. Its last attempt —
/// `max_attempts`, or one whose retry would fall at or past `head_deadline` — is final too,
/// so a missing row never ends DEAD(EXHAUSTED).
pub fn missing_row_is_final(
    attempts: i32,
    started: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    rules: &HeadRules,
) -> bool {
    let age = started.map_or(Duration::ZERO, |s| {
        (now - s).to_std().unwrap_or(Duration::ZERO)
    });
    attempts >= rules.max_attempts
        || age >= rules.missing_row_grace
        || age.saturating_add(backoff(attempts, rules)) >= rules.head_deadline
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: HeadRules = HeadRules {
        head_deadline: Duration::from_secs(600),
        max_attempts: 5,
        retry_initial: Duration::from_secs(5),
        retry_max: Duration::from_secs(60),
        missing_row_grace: Duration::from_secs(60),
    };

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_790_000_000 + s, 0).expect("time")
    }

    fn head(failed: bool, attempts: i32, due: Option<i64>, started: Option<i64>) -> Head {
        Head {
            msg_id: 1,
            failed,
            attempts,
            next_attempt_at: due.map(t),
            processing_started_at: started.map(t),
        }
    }

    #[test]
    fn pending_head_is_processed() {
        assert_eq!(
            decide(&head(false, 0, None, None), t(0), &RULES),
            HeadDecision::Process
        );
        // A PENDING head is never aged out (a restart after downtime is no poison).
        assert_eq!(
            decide(&head(false, 1, None, Some(0)), t(10_000), &RULES),
            HeadDecision::Process
        );
    }

    #[test]
    fn failed_head_waits_until_due_then_is_processed() {
        let h = head(true, 1, Some(30), Some(0));
        assert_eq!(decide(&h, t(29), &RULES), HeadDecision::WaitUntil(t(30)));
        assert_eq!(decide(&h, t(30), &RULES), HeadDecision::Process);
    }

    #[test]
    fn poison_by_attempts_or_deadline() {
        assert_eq!(
            decide(&head(true, 5, Some(100), Some(0)), t(1), &RULES),
            HeadDecision::Poison(PoisonReason::Attempts(5))
        );
        assert_eq!(
            decide(&head(false, 5, None, Some(0)), t(1), &RULES),
            HeadDecision::Poison(PoisonReason::Attempts(5)),
            "a message that never finishes an attempt is poison too"
        );
        assert_eq!(
            decide(&head(true, 2, Some(700), Some(0)), t(600), &RULES),
            HeadDecision::Poison(PoisonReason::Deadline(Duration::from_secs(600)))
        );
        assert_eq!(
            decide(&head(true, 2, Some(700), Some(0)), t(599), &RULES),
            HeadDecision::WaitUntil(t(700))
        );
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let d: Vec<u64> = (1..=6).map(|a| backoff(a, &RULES).as_secs()).collect();
        assert_eq!(d, vec![5, 10, 20, 40, 60, 60]);
        assert_eq!(backoff(0, &RULES).as_secs(), 5);
        assert_eq!(backoff(i32::MAX, &RULES).as_secs(), 60);
    }

    #[test]
    fn a_missing_row_is_read_again_within_its_grace() {
        // First attempt (not stamped before), then retries 5 s, 10 s, 20 s apart.
        assert!(!missing_row_is_final(1, None, t(0), &RULES));
        assert!(!missing_row_is_final(2, Some(t(0)), t(5), &RULES));
        assert!(!missing_row_is_final(3, Some(t(0)), t(59), &RULES));
        assert!(
            missing_row_is_final(4, Some(t(0)), t(60), &RULES),
            "grace over"
        );
        assert!(
            missing_row_is_final(5, Some(t(0)), t(1), &RULES),
            "last attempt"
        );
        let short = HeadRules {
            head_deadline: Duration::from_secs(30),
            ..RULES
        };
        assert!(!missing_row_is_final(2, Some(t(0)), t(14), &short));
        assert!(
            missing_row_is_final(3, Some(t(0)), t(15), &short),
            "its retry (20 s on) would fall past the head deadline: DEAD(MALFORMED), not EXHAUSTED"
        );
        let none = HeadRules {
            missing_row_grace: Duration::ZERO,
            ..RULES
        };
        assert!(
            missing_row_is_final(1, None, t(0), &none),
            "0s: DEAD at once"
        );
    }
}
