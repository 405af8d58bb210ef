//! The watermark rule (SPEC §3, seed §5.1): how far W may move after one poll round.
//!
//! Pure: no I/O, no clock reads. The poller feeds it W, the open holes as stored
//! (`inbox_hole`), the ids it just read (`id > W`, ascending), "now" and — when
//! `late.hole_evidence` is on — what MySQL's transaction list says, and writes back what it
//! decides in one transaction. Without evidence the plain timer rule applies
//! (docs/hole-evidence.md).
//!
//! **Holes age side by side** (beyond the seed, which keeps one `HOLE_SINCE`): every missing
//! id keeps the time it was *first* seen missing with a later row present, stored as ranges
//! ([`Hole`]). The seed's safety rule — an id is given up only after it was seen missing for
//! `max_commit_delay` — holds per id, so k holes seen together cost one delay, not k, and W
//! walks over every due hole in one round.

mod evidence;

use std::time::Duration;

use chrono::{DateTime, NaiveDateTime, Utc};

use evidence::judge;
pub use evidence::{Evidence, EvidenceDecision, TrxEvidence};

/// The durable cursor `(W, HOLE_SINCE)` as read from `INBOX_CURSOR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    /// Every inbox id ≤ W is enqueued or was released as a permanent hole.
    pub w: i64,
    /// The oldest open hole's first sighting (derived from the holes, for operators);
    /// `None` when no hole is open.
    pub hole_since: Option<DateTime<Utc>>,
}

/// An open hole: ids `first..=last` were missing while a later row was present.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hole {
    /// First missing id.
    pub first: i64,
    /// Last missing id (a row with id `last + 1` was present when it was seen).
    pub last: i64,
    /// When these ids were first seen missing (the injected clock): their age counts from here.
    pub first_seen: DateTime<Utc>,
    /// The MySQL server's time of that sighting (`late.hole_evidence`); `None` when not read.
    pub seen_db_at: Option<NaiveDateTime>,
}

impl Hole {
    /// How many ids the hole spans.
    pub fn len(&self) -> i64 {
        self.last - self.first + 1
    }

    /// Never true for a valid hole.
    pub fn is_empty(&self) -> bool {
        self.last < self.first
    }
}

/// Why a stored hole set cannot be used: the poller stops (W stays) and alerts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HoleSetError {
    /// A hole at or below W: W already passed it (the ids are enqueued or released).
    #[error("hole {first}..={last} is not above W={w}")]
    BelowW { first: i64, last: i64, w: i64 },
    /// A hole with `last < first`.
    #[error("hole {first}..={last} is empty")]
    Empty { first: i64, last: i64 },
    /// Two holes overlap or are out of order.
    #[error("holes {a_first}..={a_last} and {b_first}..={b_last} overlap or are out of order")]
    Overlap {
        a_first: i64,
        a_last: i64,
        b_first: i64,
        b_last: i64,
    },
}

/// Checks a stored hole set: sorted, disjoint, non-empty ranges strictly above W.
pub fn check_holes(w: i64, holes: &[Hole]) -> Result<(), HoleSetError> {
    for h in holes {
        if h.is_empty() {
            return Err(HoleSetError::Empty {
                first: h.first,
                last: h.last,
            });
        }
        if h.first <= w {
            return Err(HoleSetError::BelowW {
                first: h.first,
                last: h.last,
                w,
            });
        }
    }
    if let Some(p) = holes.windows(2).find(|p| p[1].first <= p[0].last) {
        return Err(HoleSetError::Overlap {
            a_first: p[0].first,
            a_last: p[0].last,
            b_first: p[1].first,
            b_last: p[1].last,
        });
    }
    Ok(())
}

/// The hole W waits at after the round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenHole {
    /// First missing id (W + 1 after this round).
    pub first_missing: i64,
    /// First id present after the hole.
    pub next_present: i64,
    /// The youngest first sighting among its ids: the hole is due when that one is.
    pub since: DateTime<Utc>,
    /// How long its youngest part has been open by `now`.
    pub age: Duration,
}

/// Ids given up as a permanent hole: `first..=last` never showed up within max-commit-delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// First released id.
    pub first: i64,
    /// Last released id.
    pub last: i64,
}

impl Released {
    /// The released ids.
    pub fn ids(&self) -> std::ops::RangeInclusive<i64> {
        self.first..=self.last
    }

    /// How many ids were released.
    pub fn len(&self) -> i64 {
        self.last - self.first + 1
    }

    /// Never true: a release covers at least one id.
    pub fn is_empty(&self) -> bool {
        self.last < self.first
    }
}

/// What one round decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advance {
    /// The new watermark.
    pub w: i64,
    /// The new HOLE_SINCE: the oldest open hole's first sighting.
    pub hole_since: Option<DateTime<Utc>>,
    /// How many leading ids of the batch to enqueue (exactly those ≤ the new W).
    pub enqueue: usize,
    /// Permanent holes released this round, ascending (every due hole W reached).
    pub released: Vec<Released>,
    /// The open holes after the round, ascending, all above the new W (to store).
    pub holes: Vec<Hole>,
    /// The hole W is waiting at, if any.
    pub open_hole: Option<OpenHole>,
    /// For each stored hole that (partly) filled this round: first seen → visible (G7).
    pub fills: Vec<Duration>,
    /// Stored holes dropped because no row follows them any more (rows above W vanished:
    /// the inbox went backwards). Their ids are missing again from "now" if they reappear.
    pub dropped: Vec<Hole>,
    /// Decisions that transaction evidence changed compared with the timer rule, by the
    /// first id of the hole they are about.
    pub evidence: Vec<(i64, EvidenceDecision)>,
}

impl Advance {
    /// The first hole released this round.
    pub fn first_released(&self) -> Option<Released> {
        self.released.first().copied()
    }

    /// The evidence decision about the first hole it changed.
    // Tests only: production reads every decision.
    #[cfg(test)]
    pub fn front_evidence(&self) -> Option<EvidenceDecision> {
        self.evidence.first().map(|(_, d)| *d)
    }

    /// Ids missing in the open holes (the `msgx_inbox_hole_missing_ids` gauge).
    pub fn missing_ids(&self) -> i64 {
        self.holes.iter().map(Hole::len).sum()
    }
}

/// The input of one round.
#[derive(Debug, Clone, Copy)]
pub struct Round<'a> {
    /// W as read.
    pub w: i64,
    /// The open holes as stored: checked with [`check_holes`], ascending, above W.
    pub holes: &'a [Hole],
    /// The ids read with `id > W`, ascending.
    pub ids: &'a [i64],
    /// `ids` are all rows above W (the read was not cut by its limit): a stored hole after
    /// the last row is no hole any more.
    pub complete: bool,
    /// The injected clock's now.
    pub now: DateTime<Utc>,
    /// How long an id must have been seen missing before it is given up.
    pub max_commit_delay: Duration,
    /// The transaction list, when `late.hole_evidence` is on and it could be read.
    pub evidence: Option<TrxEvidence>,
}

/// Decides one round.
///
/// - the contiguous run from W+1 is enqueued and W moves to its end;
/// - a gap followed by a row is a hole; each of its ids keeps the first sighting it has in the
///   stored holes, ids not in them are first seen now;
/// - W jumps over a hole only when every id in it is due: seen missing for at least
///   `max_commit_delay` (or shown rolled back by evidence); then it walks on over the next
///   run and the next due hole — k holes seen together cost one delay;
/// - a hole that is not due stops W, and nothing after it is enqueued (a late-committing
///   smaller id would otherwise be processed after them); the holes after it keep aging;
/// - only holes are skipped, never an existing row.
pub fn advance(round: Round<'_>) -> Advance {
    let Walk {
        w,
        enqueue,
        released,
        mut holes,
        open_hole,
        evidence,
    } = walk(round);
    let dropped = settle_beyond(round, &mut holes);
    Advance {
        w,
        hole_since: holes.iter().map(|h| h.first_seen).min(),
        enqueue,
        released,
        holes,
        open_hole,
        fills: fills(round.holes, round.ids, round.now),
        dropped,
        evidence,
    }
}

/// Where the walk from W over the ids read stopped, and what it saw on the way.
struct Walk {
    /// The new W.
    w: i64,
    /// How many leading ids are ≤ the new W.
    enqueue: usize,
    released: Vec<Released>,
    /// The holes above the new W among the ids read, ascending.
    holes: Vec<Hole>,
    open_hole: Option<OpenHole>,
    evidence: Vec<(i64, EvidenceDecision)>,
}

/// Walks W over the contiguous runs and the due holes of [`advance`]'s rules, up to the first
/// hole that is not due (or the last id read).
fn walk(round: Round<'_>) -> Walk {
    let Round {
        w,
        holes: stored,
        ids,
        now,
        max_commit_delay,
        evidence,
        ..
    } = round;
    let mut segs = Segments::new(stored, now);
    let mut pos = w;
    let mut i = 0;
    let mut released = Vec::new();
    let mut decisions = Vec::new();
    let mut open_hole = None;
    let mut holes = Vec::new();

    loop {
        while i < ids.len() && ids[i] == pos + 1 {
            pos += 1;
            i += 1;
        }
        let Some(&next_present) = ids.get(i) else {
            break;
        };
        let gap = segs.cover(pos + 1, next_present - 1);
        let verdict = judge(&gap, now, max_commit_delay, evidence);
        if let Some(d) = verdict.decision {
            decisions.push((pos + 1, d));
        }
        if verdict.due {
            released.push(Released {
                first: pos + 1,
                last: next_present - 1,
            });
            pos = next_present - 1;
            continue;
        }
        let since = gap.iter().map(|h| h.first_seen).max().unwrap_or(now);
        open_hole = Some(OpenHole {
            first_missing: pos + 1,
            next_present,
            since,
            age: elapsed(since, now),
        });
        holes.extend(gap);
        segs.cover_gaps(&ids[i..], &mut holes);
        break;
    }
    Walk {
        w: pos,
        enqueue: i,
        released,
        holes,
        open_hole,
        evidence: decisions,
    }
}

/// Stored holes beyond the last row read: unobserved when the read was cut by its limit
/// (kept as they are, appended to `holes`); with a complete read no row follows them any
/// more, so they are returned as dropped.
fn settle_beyond(round: Round<'_>, holes: &mut Vec<Hole>) -> Vec<Hole> {
    let last_read = round.ids.last().copied().unwrap_or(round.w);
    let beyond: Vec<Hole> = round
        .holes
        .iter()
        .filter(|h| h.last > last_read)
        .map(|h| Hole {
            first: h.first.max(last_read + 1),
            ..*h
        })
        .collect();
    if round.complete {
        beyond
    } else {
        holes.extend(beyond);
        Vec::new()
    }
}

/// For each stored hole with at least one id now present: how long it was open.
fn fills(stored: &[Hole], ids: &[i64], now: DateTime<Utc>) -> Vec<Duration> {
    stored
        .iter()
        .filter(|h| {
            let from = ids.partition_point(|id| *id < h.first);
            ids.get(from).is_some_and(|id| *id <= h.last)
        })
        .map(|h| elapsed(h.first_seen, now))
        .collect()
}

/// Splits gaps into parts by the stored holes they overlap: each part keeps the stored first
/// sighting, parts no stored hole covers are first seen now. Gaps are asked for in ascending
/// order, so one pass over the stored holes serves the round.
struct Segments<'a> {
    stored: &'a [Hole],
    at: usize,
    now: DateTime<Utc>,
}

impl<'a> Segments<'a> {
    fn new(stored: &'a [Hole], now: DateTime<Utc>) -> Self {
        Self { stored, at: 0, now }
    }

    /// The holes between consecutive `ids` (ascending, beyond where W stopped), appended to
    /// `holes`: they keep aging on their own.
    fn cover_gaps(&mut self, ids: &[i64], holes: &mut Vec<Hole>) {
        for pair in ids.windows(2) {
            if pair[1] > pair[0] + 1 {
                holes.extend(self.cover(pair[0] + 1, pair[1] - 1));
            }
        }
    }

    fn cover(&mut self, first: i64, last: i64) -> Vec<Hole> {
        let fresh = |first, last| Hole {
            first,
            last,
            first_seen: self.now,
            seen_db_at: None,
        };
        while self.at < self.stored.len() && self.stored[self.at].last < first {
            self.at += 1;
        }
        let mut out = Vec::new();
        let mut pos = first;
        for h in self.stored[self.at..]
            .iter()
            .take_while(|h| h.first <= last)
        {
            if h.first > pos {
                out.push(fresh(pos, h.first - 1));
            }
            let end = h.last.min(last);
            out.push(Hole {
                first: h.first.max(pos),
                last: end,
                ..*h
            });
            pos = end + 1;
        }
        if pos <= last {
            out.push(fresh(pos, last));
        }
        out
    }
}

/// `now - since`, zero when the clock stepped back (never ages a hole by a clock jump back).
fn elapsed(since: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
    (now - since).to_std().unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests;
