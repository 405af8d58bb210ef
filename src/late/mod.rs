//! Late arrivals (SPEC §6, seed §5.1, G1): inbox ids the poller released as permanent holes
//! that commit after all.
//!
//! - The poller writes every released hole as one range into the durable watch
//!   (`late_watch_range`) in the same transaction that moves W past it, and wakes the late
//!   detector.
//! - [`detect_once`] is one detection round: the watched ranges, in pages, against the inbox
//!   ([`Inbox::ids_in_ranges`](crate::inbox::Inbox::ids_in_ranges), `id BETWEEN` range
//!   queries, bounded). A hit is recorded as detected **and** enqueued as a `LATE`
//!   `PROC_STATE` row in one PostgreSQL transaction that splits its range (G1: never silently
//!   lost), counted and alerted. An absent range whose watch window has passed is closed
//!   (deleted) — only after that final, successful check.
//! - [`compensation_scan`] (seed §5.1 "补偿扫描"): a bounded walk over a window behind W for
//!   inbox rows that are neither enqueued nor inside a watched range (id reuse after a table
//!   rotation, a restored inbox); each is enqueued as `LATE` the same way.
//! - The pump processes a `LATE` row at once (it is below W, so it is the head): out of id
//!   order by design, and with the ordering guard ([`crate::flight::plan_guarded`]) so it never
//!   overwrites what a newer message wrote.
//!
//! What this guarantees and what it does not: `docs/late-arrivals.md`.

mod compensation;
mod detect;
mod inbox_check;

pub use compensation::{compensation_scan, ScanConfig, ScanReport};
pub use detect::{detect_once, DetectConfig, DetectError, DetectReport, LateHit};

/// Where a `PROC_STATE` row came from (`proc_state.source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// Discovered by the poller, in id order.
    Poll,
    /// Registered by the compat HTTP entry (waits for W).
    Compat,
    /// A released hole id found in the inbox later: processed with the ordering guard.
    Late,
}

impl Source {
    /// The stored value.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Poll => "POLL",
            Source::Compat => "COMPAT",
            Source::Late => "LATE",
        }
    }

    /// Parses the stored value.
    pub fn from_db(s: &str) -> Option<Source> {
        [Source::Poll, Source::Compat, Source::Late]
            .into_iter()
            .find(|x| x.as_str() == s)
    }

    /// True for rows processed out of id order, under the ordering guard.
    pub fn is_late(self) -> bool {
        self == Source::Late
    }
}

#[cfg(test)]
mod tests {
    use super::Source;

    #[test]
    fn late_source_round_trips_and_only_late_is_guarded() {
        for s in [Source::Poll, Source::Compat, Source::Late] {
            assert_eq!(Source::from_db(s.as_str()), Some(s));
        }
        assert_eq!(Source::from_db("late"), None);
        assert!(Source::Late.is_late());
        assert!(!Source::Poll.is_late() && !Source::Compat.is_late());
    }
}
