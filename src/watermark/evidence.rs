//! The hole-evidence rule (`late.hole_evidence`, docs/hole-evidence.md): what MySQL's
//! transaction list says about a hole ([`Evidence`], read as [`TrxEvidence`]), the decisions
//! it changes ([`EvidenceDecision`]), and the verdict on one gap under the timer rule or the
//! evidence. Separate from the walk of W (`watermark.rs`) because it is the one part that
//! weighs the transaction list; with evidence off only its timer half runs.

use std::time::Duration;

use chrono::{DateTime, NaiveDateTime, Utc};

use super::{elapsed, Hole};

/// What `information_schema.INNODB_TRX` says about the missing ids of one hole, read by the
/// poller after the hole's first sighting (on the MySQL server's clock). Only meaningful on
/// the primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evidence {
    /// No transaction that started at or before the sighting is still open, and a read made
    /// after the transaction list still showed the hole: the transaction that took the missing
    /// id has ended without committing it (rolled back), so the row can never appear.
    NoOlderTransaction,
    /// A transaction that started at or before the sighting is still open: it may still
    /// commit the missing row.
    OlderTransactionOpen,
}

/// One read of the transaction list, with the cap of holding on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrxEvidence {
    /// Server time the list was read at.
    pub read_at: NaiveDateTime,
    /// Start of the oldest transaction still open; `None` when none is.
    pub oldest_started: Option<NaiveDateTime>,
    /// A hole held on [`Evidence::OlderTransactionOpen`] is released (with an alert) once it
    /// is this old; never shorter than `max_commit_delay` (a shorter cap acts as the delay).
    pub cap: Duration,
}

impl TrxEvidence {
    /// The evidence about a hole sighted at `seen` (server time); `None` when the hole was not
    /// sighted on the server clock or the clock stepped back since (that proves nothing).
    pub fn about(&self, seen: Option<NaiveDateTime>) -> Option<Evidence> {
        let seen = seen?;
        if self.read_at < seen {
            return None;
        }
        Some(if self.oldest_started.is_some_and(|s| s <= seen) {
            Evidence::OlderTransactionOpen
        } else {
            Evidence::NoOlderTransaction
        })
    }
}

/// A decision taken on evidence that the timer rule alone would have taken differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvidenceDecision {
    /// Released before `max_commit_delay`: the missing id's transaction rolled back.
    ReleasedEarly,
    /// Kept past `max_commit_delay`: an older transaction is still open.
    Held,
    /// Released at the cap although an older transaction is still open (alert).
    CapReached,
}

impl EvidenceDecision {
    /// Metric label (`telemetry::hole_evidence`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReleasedEarly => crate::telemetry::HOLE_RELEASED_EARLY,
            Self::Held => crate::telemetry::HOLE_HELD,
            Self::CapReached => crate::telemetry::HOLE_CAP_REACHED,
        }
    }
}

/// Whether a gap may be released now, and what evidence changed about it.
pub(super) struct Verdict {
    pub(super) due: bool,
    pub(super) decision: Option<EvidenceDecision>,
}

/// The verdict on one gap (its parts as stored): due when every part is past
/// `max_commit_delay` (timer rule), or as the transaction list says when it says anything.
pub(super) fn judge(
    gap: &[Hole],
    now: DateTime<Utc>,
    max_commit_delay: Duration,
    evidence: Option<TrxEvidence>,
) -> Verdict {
    let mut due = true;
    let (mut early, mut capped, mut held) = (false, false, false);
    for part in gap {
        let age = elapsed(part.first_seen, now);
        let expired = age >= max_commit_delay;
        match evidence.and_then(|e| e.about(part.seen_db_at).map(|seen| (seen, e.cap))) {
            None => due &= expired,
            Some((Evidence::NoOlderTransaction, _)) => early |= !expired,
            Some((Evidence::OlderTransactionOpen, cap)) => {
                if age >= cap.max(max_commit_delay) {
                    capped = true;
                } else {
                    due = false;
                    held |= expired;
                }
            }
        }
    }
    let decision = if due {
        if capped {
            Some(EvidenceDecision::CapReached)
        } else if early {
            Some(EvidenceDecision::ReleasedEarly)
        } else {
            None
        }
    } else {
        held.then_some(EvidenceDecision::Held)
    };
    Verdict { due, decision }
}
