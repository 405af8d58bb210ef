//! What a finished round tells its caller: the decision, the inbox sight, where the time went
//! ([`PollStages`]) and the round's telemetry event. Separate from the round itself
//! (`poller.rs`) because the actor, the benches and the tests read it without running a round.

use std::time::Duration;

use crate::telemetry;
use crate::watermark::{Advance, Cursor, Evidence, EvidenceDecision};

/// What a successful round did.
#[derive(Debug, Clone)]
pub struct PollReport {
    /// The cursor before the round.
    pub before: Cursor,
    /// The decision that was committed.
    pub advance: Advance,
    /// Rows read from the inbox.
    pub read: usize,
    /// Rows that were not yet in PROC_STATE.
    pub enqueued_new: u64,
    /// The batch was full: more rows are probably waiting, poll again at once.
    pub batch_full: bool,
    /// Head, lag, regression and the oldest hole's age, as the round's event shows them.
    pub sight: telemetry::InboxSight,
    /// Wall time the round took.
    pub duration: Duration,
    /// The transaction evidence the decision used for the hole at W+1; None when evidence is
    /// off, not needed (no hole seen before), or unavailable (the timer rule decided).
    pub hole_evidence: Option<Evidence>,
    /// With evidence on, this round took the sighting of a new hole at W+1 on the server
    /// clock: the next round can already decide it (a rollback is released at once), so it
    /// should not wait a poll interval.
    pub hole_sighted: bool,
    /// When the hole W waits at becomes due by the timer (from now), so the actor can poll
    /// right then instead of up to a poll interval later.
    pub next_due: Option<Duration>,
    /// Where the round's time went, recorded by the round itself (benches sum them).
    pub stages: PollStages,
}

/// Wall time of each stage of one round.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PollStages {
    /// `Store::read_cursor`.
    pub read_cursor: Duration,
    /// The inbox read (ids and receive times above W; the pages read ahead included).
    pub read_rows: Duration,
    /// The decision (pure, plus the transaction evidence when on).
    pub decide: Duration,
    /// The enqueue transaction (rows + cursor), zero when nothing changed.
    pub commit: Duration,
    /// `Inbox::max_id` (after a full batch, or when nothing is above W).
    pub inbox_head: Duration,
}

impl PollStages {
    /// Adds another round's stages.
    pub fn add(&mut self, o: &PollStages) {
        self.read_cursor += o.read_cursor;
        self.read_rows += o.read_rows;
        self.decide += o.decide;
        self.commit += o.commit;
        self.inbox_head += o.inbox_head;
    }
}

impl PollReport {
    /// W moved this round.
    pub fn moved(&self) -> bool {
        self.advance.w != self.before.w
    }

    /// Poll again without waiting: more rows are there, a release made room, or a new hole
    /// can be decided on evidence (at most one such extra round per hole).
    pub fn poll_again_now(&self) -> bool {
        self.batch_full || !self.advance.released.is_empty() || self.hole_sighted
    }

    /// The round's telemetry event.
    pub fn event(&self) -> telemetry::PollRound {
        let a = &self.advance;
        let released = a
            .released
            .iter()
            .map(|r| {
                let decision = a
                    .evidence
                    .iter()
                    .find(|(first, _)| *first == r.first)
                    .map(|(_, d)| *d);
                telemetry::HoleReleased {
                    first: r.first,
                    last: r.last,
                    why: match decision {
                        Some(EvidenceDecision::ReleasedEarly) => telemetry::ReleaseWhy::RolledBack,
                        Some(EvidenceDecision::CapReached) => telemetry::ReleaseWhy::EvidenceCap,
                        _ => telemetry::ReleaseWhy::Timer,
                    },
                }
            })
            .collect();
        telemetry::PollRound {
            w: a.w,
            sight: self.sight,
            enqueued: self.enqueued_new,
            took: self.duration,
            holes_open: a.holes.len(),
            missing_ids: a.missing_ids(),
            waiting: a.open_hole.map(|h| telemetry::WaitingHole {
                first_missing: h.first_missing,
                next_present: h.next_present,
                age: h.age,
            }),
            fills: a.fills.clone(),
            released,
        }
    }
}
