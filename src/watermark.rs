//! The watermark rule (SPEC §3, seed §5.1): how far W may move after one poll round.
//!
//! Pure: no I/O, no clock reads. The poller feeds it the cursor, the ids it just read
//! (`id > W`, ascending) and "now", and writes back what it decides in one transaction.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// The durable cursor `(W, HOLE_SINCE)` as read from `INBOX_CURSOR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    /// Every inbox id ≤ W is enqueued or was released as a permanent hole.
    pub w: i64,
    /// When the hole right after W was first seen; `None` when no hole is open.
    pub hole_since: Option<DateTime<Utc>>,
}

/// A hole that is still young: W waits in front of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenHole {
    /// First missing id (W + 1 after this round).
    pub first_missing: i64,
    /// First id present after the hole.
    pub next_present: i64,
    /// When the hole was first seen (persisted as HOLE_SINCE).
    pub since: DateTime<Utc>,
    /// How long it has been open by `now`.
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
    /// The released ids, for the late detector.
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Advance {
    /// The new watermark.
    pub w: i64,
    /// The new HOLE_SINCE.
    pub hole_since: Option<DateTime<Utc>>,
    /// How many leading ids of the batch to enqueue (exactly those ≤ the new W).
    pub enqueue: usize,
    /// A permanent hole released this round (at most one per round).
    pub released: Option<Released>,
    /// The young hole W is waiting at, if any.
    pub open_hole: Option<OpenHole>,
    /// The hole that was open before this round filled: first seen → visible (G7 evidence).
    pub filled_after: Option<Duration>,
}

/// Decides one round. `ids` must be the ascending ids read with `id > cursor.w`.
///
/// - the contiguous run from W+1 is enqueued and W moves to its end;
/// - a gap followed by rows is a hole: W stays before it and nothing after it is enqueued
///   (a late-committing smaller id would otherwise be processed after them);
/// - a hole at W+1 observed for at least `max_commit_delay` is permanent: W jumps to the row
///   after it minus one; only the hole is skipped, never an existing row;
/// - a hole seen in a round where W moved is a new hole: its timer starts now.
pub fn advance(
    cursor: Cursor,
    ids: &[i64],
    now: DateTime<Utc>,
    max_commit_delay: Duration,
) -> Advance {
    let run = ids
        .iter()
        .enumerate()
        .take_while(|(i, id)| **id == cursor.w + 1 + *i as i64)
        .count();
    let contiguous_end = cursor.w + run as i64;
    let filled_after = match cursor.hole_since {
        Some(since) if run > 0 => Some(elapsed(since, now)),
        _ => None,
    };

    let Some(&next_present) = ids.get(run) else {
        // No row after a gap: no hole, whatever was open before.
        return Advance {
            w: contiguous_end,
            hole_since: None,
            enqueue: run,
            released: None,
            open_hole: None,
            filled_after,
        };
    };

    // Same hole as before only if W did not move (it starts at the same W+1).
    let since = match cursor.hole_since {
        Some(since) if run == 0 => since,
        _ => now,
    };
    let age = elapsed(since, now);
    let first_missing = contiguous_end + 1;

    if run == 0 && cursor.hole_since.is_some() && age >= max_commit_delay {
        return Advance {
            w: next_present - 1,
            hole_since: None,
            enqueue: 0,
            released: Some(Released {
                first: first_missing,
                last: next_present - 1,
            }),
            open_hole: None,
            filled_after: None,
        };
    }

    Advance {
        w: contiguous_end,
        hole_since: Some(since),
        enqueue: run,
        released: None,
        open_hole: Some(OpenHole {
            first_missing,
            next_present,
            since,
            age,
        }),
        filled_after,
    }
}

/// `now - since`, zero when the clock stepped back (never ages a hole by a clock jump back).
fn elapsed(since: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
    (now - since).to_std().unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    const DELAY: Duration = Duration::from_secs(300);

    fn t(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_790_000_000 + secs, 0).expect("valid time")
    }

    fn cur(w: i64, hole_since: Option<DateTime<Utc>>) -> Cursor {
        Cursor { w, hole_since }
    }

    #[test]
    fn contiguous_rows_move_w_to_their_end() {
        let a = advance(cur(0, None), &[1, 2, 3], t(0), DELAY);
        assert_eq!((a.w, a.enqueue, a.hole_since), (3, 3, None));
        assert_eq!(a.released, None);
    }

    #[test]
    fn empty_batch_keeps_w() {
        let a = advance(cur(7, None), &[], t(0), DELAY);
        assert_eq!((a.w, a.enqueue, a.hole_since), (7, 0, None));
    }

    #[test]
    fn young_hole_stops_w_and_nothing_after_it_is_enqueued() {
        let a = advance(cur(0, None), &[1, 2, 4, 5], t(0), DELAY);
        assert_eq!((a.w, a.enqueue), (2, 2));
        assert_eq!(a.hole_since, Some(t(0)));
        let hole = a.open_hole.expect("hole");
        assert_eq!((hole.first_missing, hole.next_present), (3, 4));

        // Still young one second before the delay.
        let b = advance(cur(2, a.hole_since), &[4, 5], t(299), DELAY);
        assert_eq!((b.w, b.enqueue, b.hole_since), (2, 0, Some(t(0))));
    }

    #[test]
    fn aged_hole_releases_only_the_hole() {
        let a = advance(cur(2, Some(t(0))), &[6, 7], t(300), DELAY);
        assert_eq!(a.w, 5);
        assert_eq!(a.enqueue, 0);
        assert_eq!(a.hole_since, None);
        assert_eq!(a.released, Some(Released { first: 3, last: 5 }));
        // The next round enqueues the rows after it.
        let b = advance(cur(5, None), &[6, 7], t(300), DELAY);
        assert_eq!((b.w, b.enqueue), (7, 2));
    }

    #[test]
    fn filled_hole_then_new_hole_restarts_the_timer() {
        let a = advance(cur(0, None), &[2], t(0), DELAY);
        assert_eq!(a.hole_since, Some(t(0)));
        // At 4m the hole fills; a new hole at 3 (row 4 exists): new timer from 4m.
        let b = advance(cur(0, a.hole_since), &[1, 2, 4], t(240), DELAY);
        assert_eq!((b.w, b.enqueue), (2, 2));
        assert_eq!(b.hole_since, Some(t(240)));
        assert_eq!(b.filled_after, Some(Duration::from_secs(240)));
        // At 5m (old timer would have expired) the new hole is still young.
        let c = advance(cur(2, b.hole_since), &[4], t(300), DELAY);
        assert_eq!((c.w, c.released), (2, None));
        // At 4m + 5m it is released.
        let d = advance(cur(2, b.hole_since), &[4], t(540), DELAY);
        assert_eq!(d.released, Some(Released { first: 3, last: 3 }));
    }

    #[test]
    fn clock_stepping_back_never_ages_a_hole() {
        let a = advance(cur(0, Some(t(1000))), &[2], t(0), DELAY);
        assert_eq!(a.released, None);
        assert_eq!(a.open_hole.expect("hole").age, Duration::ZERO);
    }

    /// A random inbox: ids 1..=n, each present or not (rolled back / not yet committed).
    fn inbox() -> impl Strategy<Value = (Vec<bool>, i64, usize)> {
        (
            prop::collection::vec(prop::bool::weighted(0.8), 1..120),
            0i64..30,
            1usize..40,
        )
    }

    proptest! {
        /// W never passes an existing row that was not enqueued in the same decision, and
        /// never enqueues past a young hole.
        #[test]
        fn w_never_passes_an_existing_row((present, w0, limit) in inbox(), hole_age in 0u64..600, had_hole in any::<bool>()) {
            let w0 = w0.min(present.len() as i64);
            let ids: Vec<i64> = (w0 + 1..=present.len() as i64)
                .filter(|id| present[(*id - 1) as usize])
                .take(limit)
                .collect();
            let now = t(10_000);
            let since = had_hole.then(|| now - chrono::Duration::seconds(hole_age as i64));
            let a = advance(cur(w0, since), &ids, now, DELAY);

            prop_assert!(a.w >= w0);
            // Everything enqueued is ≤ new W, everything ≤ new W that exists is enqueued.
            prop_assert!(ids[..a.enqueue].iter().all(|id| *id <= a.w));
            prop_assert!(ids[a.enqueue..].iter().all(|id| *id > a.w));
            // The enqueued ids are a contiguous run from W+1 (nothing after a gap).
            for (i, id) in ids[..a.enqueue].iter().enumerate() {
                prop_assert_eq!(*id, w0 + 1 + i as i64);
            }
            if let Some(r) = a.released {
                prop_assert_eq!(a.enqueue, 0);
                prop_assert!(r.ids().all(|id| !ids.contains(&id)));
                prop_assert!(ids.contains(&(r.last + 1)));
                prop_assert!(hole_age >= DELAY.as_secs() && had_hole);
            }
            if let Some(h) = a.open_hole {
                prop_assert!(ids.contains(&h.next_present));
                prop_assert_eq!(h.first_missing, a.w + 1);
                prop_assert!(h.age < DELAY);
            }
            // A round that moved W starts any hole's timer now.
            if a.enqueue > 0 {
                prop_assert!(a.hole_since.is_none() || a.hole_since == Some(now));
            }
        }

        /// Many rounds over an inbox whose rows become visible at random times (late commits)
        /// or never (rollbacks): ids are enqueued in ascending order, each at most once; a
        /// released id was invisible when released; every visible id ≤ W is enqueued
        /// unless it became visible only after its release (the late detector's case).
        #[test]
        fn rounds_keep_fifo_and_release_only_invisible_ids(
            visible_at in prop::collection::vec(prop::option::weighted(0.85, 0u64..900), 1..80),
            limit in 1usize..30,
            step in 1u64..120,
        ) {
            let n = visible_at.len() as i64;
            let mut c = cur(0, None);
            let mut enqueued: Vec<i64> = Vec::new();
            let mut released: BTreeSet<i64> = BTreeSet::new();
            let mut now_s = 0u64;
            // First rows appear while we poll every `step`; then time runs on in big steps
            // until nothing is left to discover.
            for _ in 0..2000 {
                let ids: Vec<i64> = (c.w + 1..=n)
                    .filter(|id| visible_at[(*id - 1) as usize].is_some_and(|v| v <= now_s))
                    .take(limit)
                    .collect();
                let a = advance(c, &ids, t(now_s as i64), DELAY);
                enqueued.extend_from_slice(&ids[..a.enqueue]);
                if let Some(r) = a.released {
                    for id in r.ids() {
                        prop_assert!(visible_at[(id - 1) as usize].is_none_or(|v| v > now_s));
                        released.insert(id);
                    }
                }
                c = Cursor { w: a.w, hole_since: a.hole_since };
                let idle = a.enqueue == 0 && a.released.is_none() && a.open_hole.is_none();
                if now_s > 900 && idle {
                    break;
                }
                now_s += if now_s > 900 { DELAY.as_secs() } else { step };
            }
            prop_assert!(enqueued.windows(2).all(|p| p[0] < p[1]), "FIFO broken: {:?}", enqueued);
            prop_assert!(enqueued.iter().all(|id| !released.contains(id)));
            let enq: BTreeSet<i64> = enqueued.iter().copied().collect();
            for id in 1..=c.w {
                prop_assert!(enq.contains(&id) || released.contains(&id), "id {} neither enqueued nor released", id);
            }
            // Drained: W ends at the last visible row (trailing never-visible ids are no hole).
            let last_visible = (1..=n).rev().find(|id| visible_at[(*id - 1) as usize].is_some());
            prop_assert_eq!(c.w, last_visible.unwrap_or(0));
        }
    }
}
