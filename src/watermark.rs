//! The watermark rule (SPEC §3, seed §5.1): how far W may move after one poll round.
//!
//! Pure: no I/O, no clock reads. The poller feeds it the cursor, the ids it just read
//! (`id > W`, ascending), "now" and — when `late.hole_evidence` is on — what MySQL's
//! transaction list says about the hole, and writes back what it decides in one transaction.
//! Without evidence the plain timer rule applies (docs/hole-evidence.md).

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
    /// A decision transaction evidence changed compared with the plain timer rule.
    pub evidence: Option<EvidenceDecision>,
}

/// What `information_schema.INNODB_TRX` says about the hole at W+1, read by the poller after
/// the hole's first sighting (on the MySQL server's clock). Only meaningful on the primary.
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

/// Evidence for one round plus the hard cap of holding on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HoleEvidence {
    /// What the transaction list said.
    pub seen: Evidence,
    /// A hole held on [`Evidence::OlderTransactionOpen`] is released (with an alert) once it
    /// is this old; never shorter than `max_commit_delay` (a shorter cap acts as the delay).
    pub cap: Duration,
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
            Self::ReleasedEarly => "released_early",
            Self::Held => "held",
            Self::CapReached => "cap_reached",
        }
    }
}

/// Decides one round. `ids` must be the ascending ids read with `id > cursor.w`.
///
/// - the contiguous run from W+1 is enqueued and W moves to its end;
/// - a gap followed by rows is a hole: W stays before it and nothing after it is enqueued
///   (a late-committing smaller id would otherwise be processed after them);
/// - a hole at W+1 observed for at least `max_commit_delay` is permanent: W jumps to the row
///   after it minus one; only the hole is skipped, never an existing row;
/// - a hole seen in a round where W moved is a new hole: its timer starts now.
///
/// This is the plain timer rule: [`advance_with`] without evidence.
pub fn advance(
    cursor: Cursor,
    ids: &[i64],
    now: DateTime<Utc>,
    max_commit_delay: Duration,
) -> Advance {
    advance_with(cursor, ids, now, max_commit_delay, None)
}

/// [`advance`] with transaction evidence about the hole at W+1. Evidence only counts for a
/// hole already seen in an earlier round (W did not move, HOLE_SINCE is set); otherwise, and
/// when `evidence` is None, the timer rule decides alone.
///
/// - [`Evidence::NoOlderTransaction`]: the hole is released now, even before
///   `max_commit_delay` ([`EvidenceDecision::ReleasedEarly`] when that is earlier);
/// - [`Evidence::OlderTransactionOpen`]: the hole is held, also past `max_commit_delay`
///   ([`EvidenceDecision::Held`]), until it is `cap` old; then it is released
///   ([`EvidenceDecision::CapReached`]).
///
/// Either way only the hole is released, never an existing row, and at most one per round.
pub fn advance_with(
    cursor: Cursor,
    ids: &[i64],
    now: DateTime<Utc>,
    max_commit_delay: Duration,
    evidence: Option<HoleEvidence>,
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
            evidence: None,
        };
    };

    // Same hole as before only if W did not move (it starts at the same W+1).
    let since = match cursor.hole_since {
        Some(since) if run == 0 => since,
        _ => now,
    };
    let age = elapsed(since, now);
    let first_missing = contiguous_end + 1;

    let same_hole = run == 0 && cursor.hole_since.is_some();
    let timer_expired = age >= max_commit_delay;
    let (release, decision) = match evidence.filter(|_| same_hole) {
        None => (same_hole && timer_expired, None),
        Some(HoleEvidence {
            seen: Evidence::NoOlderTransaction,
            ..
        }) => (
            true,
            (!timer_expired).then_some(EvidenceDecision::ReleasedEarly),
        ),
        Some(HoleEvidence {
            seen: Evidence::OlderTransactionOpen,
            cap,
        }) => {
            if age >= cap.max(max_commit_delay) {
                (true, Some(EvidenceDecision::CapReached))
            } else {
                (false, timer_expired.then_some(EvidenceDecision::Held))
            }
        }
    };

    if release {
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
            evidence: decision,
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
        evidence: decision,
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

    fn ev(seen: Evidence) -> Option<HoleEvidence> {
        Some(HoleEvidence { seen, cap: CAP })
    }

    const CAP: Duration = Duration::from_secs(1800);

    #[test]
    fn no_older_transaction_releases_a_young_hole_early_and_only_the_hole() {
        let c = cur(2, Some(t(0)));
        let a = advance_with(c, &[5, 6], t(3), DELAY, ev(Evidence::NoOlderTransaction));
        assert_eq!(a.released, Some(Released { first: 3, last: 4 }));
        assert_eq!((a.w, a.enqueue, a.hole_since), (4, 0, None));
        assert_eq!(a.evidence, Some(EvidenceDecision::ReleasedEarly));
        // Past the delay the timer would have released it anyway: no evidence decision.
        let b = advance_with(c, &[5, 6], t(300), DELAY, ev(Evidence::NoOlderTransaction));
        assert_eq!(b.released, Some(Released { first: 3, last: 4 }));
        assert_eq!(b.evidence, None);
    }

    #[test]
    fn older_transaction_holds_past_the_delay_until_the_cap() {
        let c = cur(2, Some(t(0)));
        let open = ev(Evidence::OlderTransactionOpen);
        let young = advance_with(c, &[4], t(10), DELAY, open);
        assert_eq!(
            (young.released, young.evidence),
            (None, None),
            "timer holds too"
        );
        let held = advance_with(c, &[4], t(300), DELAY, open);
        assert_eq!(held.released, None);
        assert_eq!(held.evidence, Some(EvidenceDecision::Held));
        assert_eq!(held.hole_since, Some(t(0)), "the timer keeps running");
        assert_eq!(held.open_hole.expect("hole").age, Duration::from_secs(300));
        let last = advance_with(c, &[4], t(1799), DELAY, open);
        assert_eq!(last.released, None);
        let capped = advance_with(c, &[4], t(1800), DELAY, open);
        assert_eq!(capped.released, Some(Released { first: 3, last: 3 }));
        assert_eq!(capped.evidence, Some(EvidenceDecision::CapReached));
        assert_eq!((capped.w, capped.hole_since), (3, None));
    }

    #[test]
    fn a_cap_shorter_than_the_delay_acts_as_the_delay() {
        let c = cur(0, Some(t(0)));
        let short = Some(HoleEvidence {
            seen: Evidence::OlderTransactionOpen,
            cap: Duration::from_secs(10),
        });
        assert_eq!(advance_with(c, &[2], t(299), DELAY, short).released, None);
        let a = advance_with(c, &[2], t(300), DELAY, short);
        assert_eq!(a.evidence, Some(EvidenceDecision::CapReached));
    }

    #[test]
    fn evidence_counts_only_for_a_hole_seen_in_an_earlier_round() {
        // First sighting: no HOLE_SINCE yet.
        let a = advance_with(
            cur(0, None),
            &[2],
            t(0),
            DELAY,
            ev(Evidence::NoOlderTransaction),
        );
        assert_eq!((a.released, a.evidence), (None, None));
        assert_eq!(a.hole_since, Some(t(0)));
        // W moved this round: the hole after the run is new, whatever the evidence said.
        let b = advance_with(
            cur(0, Some(t(0))),
            &[1, 3],
            t(5),
            DELAY,
            ev(Evidence::NoOlderTransaction),
        );
        assert_eq!((b.w, b.released, b.hole_since), (1, None, Some(t(5))));
        // Filled: rows are enqueued as usual, the evidence is moot.
        let c = advance_with(
            cur(0, Some(t(0))),
            &[1, 2],
            t(700),
            DELAY,
            ev(Evidence::OlderTransactionOpen),
        );
        assert_eq!((c.w, c.enqueue, c.evidence), (2, 2, None));
        assert_eq!(c.filled_after, Some(Duration::from_secs(700)));
        // The re-read after "no older transaction" found the row committed meanwhile: a
        // normal fill, nothing released.
        let d = advance_with(
            cur(0, Some(t(0))),
            &[1, 2],
            t(3),
            DELAY,
            ev(Evidence::NoOlderTransaction),
        );
        assert_eq!((d.w, d.enqueue, d.released, d.evidence), (2, 2, None, None));
    }

    #[test]
    fn no_evidence_is_the_timer_rule() {
        for (ids, age) in [(&[4_i64][..], 299), (&[4][..], 300), (&[3, 4][..], 900)] {
            let c = cur(2, Some(t(0)));
            assert_eq!(
                advance_with(c, ids, t(age), DELAY, None),
                advance(c, ids, t(age), DELAY)
            );
        }
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
        /// Evidence never releases a hole while an older transaction is open (until the cap),
        /// never releases an id that exists, and without evidence changes nothing.
        #[test]
        fn evidence_never_releases_under_an_open_transaction_nor_an_existing_row(
            (present, w0, limit) in inbox(),
            hole_age in 0u64..2400,
            had_hole in any::<bool>(),
            seen in prop::option::of(prop::bool::ANY),
            cap_s in 0u64..2000,
        ) {
            let w0 = w0.min(present.len() as i64);
            let ids: Vec<i64> = (w0 + 1..=present.len() as i64)
                .filter(|id| present[(*id - 1) as usize])
                .take(limit)
                .collect();
            let now = t(10_000);
            let since = had_hole.then(|| now - chrono::Duration::seconds(hole_age as i64));
            let cap = Duration::from_secs(cap_s);
            let evidence = seen.map(|no_older| HoleEvidence {
                seen: if no_older { Evidence::NoOlderTransaction } else { Evidence::OlderTransactionOpen },
                cap,
            });
            let c = cur(w0, since);
            let a = advance_with(c, &ids, now, DELAY, evidence);
            let plain = advance(c, &ids, now, DELAY);

            // The enqueued run and the new hole never depend on evidence.
            prop_assert_eq!(a.enqueue, plain.enqueue);
            prop_assert!(ids[..a.enqueue].iter().all(|id| *id <= a.w));
            prop_assert!(ids[a.enqueue..].iter().all(|id| *id > a.w));
            if let Some(r) = a.released {
                prop_assert_eq!(a.enqueue, 0);
                prop_assert!(had_hole);
                prop_assert!(r.ids().all(|id| !ids.contains(&id)), "released an existing row");
                prop_assert!(ids.contains(&(r.last + 1)));
                prop_assert_eq!(r.first, w0 + 1);
            }
            match evidence.map(|e| e.seen) {
                None => prop_assert_eq!(a, plain),
                Some(Evidence::OlderTransactionOpen) => {
                    if a.released.is_some() {
                        prop_assert!(hole_age >= cap_s.max(DELAY.as_secs()));
                        prop_assert_eq!(a.evidence, Some(EvidenceDecision::CapReached));
                    }
                    prop_assert!(a.evidence != Some(EvidenceDecision::ReleasedEarly));
                }
                Some(Evidence::NoOlderTransaction) => {
                    // A hole seen before is released; anything else is as without evidence.
                    if plain.open_hole.is_some() && plain.enqueue == 0 && had_hole {
                        prop_assert!(a.released.is_some());
                        prop_assert_eq!(a.evidence, Some(EvidenceDecision::ReleasedEarly));
                    } else {
                        prop_assert_eq!(a, plain);
                    }
                }
            }
            if a.evidence == Some(EvidenceDecision::Held) {
                prop_assert!(a.released.is_none() && hole_age >= DELAY.as_secs());
            }
        }

        /// Many rounds over upstream transactions that take an id at increasing times, stay
        /// open a random while, then commit or roll back; the poller's evidence is derived from
        /// them the way `poll_once` reads it (an open transaction that started at or before the
        /// hole's first sighting). Ids released on evidence never commit later, FIFO holds,
        /// and every id ≤ W is enqueued or released.
        #[test]
        fn evidence_rounds_release_only_rolled_back_ids(
            txs in prop::collection::vec(
                (0u64..10, prop_oneof![3 => 0u64..5, 1 => 0u64..1500], prop::bool::weighted(0.8)),
                1..60,
            ),
            limit in 1usize..30,
            step in 1u64..20,
            cap_extra in 0u64..900,
        ) {
            let cap = DELAY + Duration::from_secs(cap_extra);
            let mut started = Vec::with_capacity(txs.len());
            let mut at = 0u64;
            for (gap, _, _) in &txs {
                at += gap;
                started.push(at);
            }
            let ended: Vec<u64> = txs.iter().zip(&started).map(|((_, d, _), s)| s + d).collect();
            let visible_at: Vec<Option<u64>> = txs
                .iter()
                .zip(&ended)
                .map(|((_, _, commit), e)| commit.then_some(*e))
                .collect();
            let n = txs.len() as i64;
            let last_end = *ended.iter().max().expect("one tx");

            let mut c = cur(0, None);
            let mut seen_at: Option<u64> = None; // hole_seen_db_at
            let mut enqueued: Vec<i64> = Vec::new();
            let mut released: Vec<(i64, Option<EvidenceDecision>)> = Vec::new();
            let mut now_s = 0u64;
            for _ in 0..5000 {
                let ids: Vec<i64> = (c.w + 1..=n)
                    .filter(|id| visible_at[(*id - 1) as usize].is_some_and(|v| v <= now_s))
                    .take(limit)
                    .collect();
                let continuing = c.hole_since.is_some() && ids.first().is_some_and(|f| *f > c.w + 1);
                let evidence = seen_at.filter(|_| continuing).map(|s| {
                    let older_open = (0..txs.len()).any(|j| started[j] <= s && ended[j] > now_s);
                    HoleEvidence {
                        seen: if older_open { Evidence::OlderTransactionOpen } else { Evidence::NoOlderTransaction },
                        cap,
                    }
                });
                let a = advance_with(c, &ids, t(now_s as i64), DELAY, evidence);
                enqueued.extend_from_slice(&ids[..a.enqueue]);
                if let Some(r) = a.released {
                    for id in r.ids() {
                        prop_assert!(visible_at[(id - 1) as usize].is_none_or(|v| v > now_s));
                        released.push((id, a.evidence));
                    }
                    if let Some(e) = evidence {
                        if e.seen == Evidence::OlderTransactionOpen {
                            prop_assert_eq!(a.evidence, Some(EvidenceDecision::CapReached));
                        }
                    }
                }
                seen_at = match a.hole_since {
                    None => None,
                    Some(_) if a.w == c.w && a.hole_since == c.hole_since => seen_at.or(Some(now_s)),
                    Some(_) => Some(now_s),
                };
                c = Cursor { w: a.w, hole_since: a.hole_since };
                let idle = a.enqueue == 0 && a.released.is_none() && a.open_hole.is_none();
                if now_s > last_end && idle {
                    break;
                }
                now_s += if now_s > last_end { DELAY.as_secs() } else { step };
            }
            prop_assert!(enqueued.windows(2).all(|p| p[0] < p[1]), "FIFO broken: {:?}", enqueued);
            for (id, decision) in &released {
                prop_assert!(!enqueued.contains(id));
                if *decision != Some(EvidenceDecision::CapReached) {
                    // Released on "no older transaction" (or the timer after it): rolled back.
                    prop_assert!(visible_at[(*id - 1) as usize].is_none(), "id {} released but committed later", id);
                }
            }
            let enq: BTreeSet<i64> = enqueued.iter().copied().collect();
            for id in 1..=c.w {
                prop_assert!(enq.contains(&id) || released.iter().any(|(r, _)| *r == id));
            }
            let last_visible = (1..=n).rev().find(|id| visible_at[(*id - 1) as usize].is_some());
            prop_assert_eq!(c.w, last_visible.unwrap_or(0));
        }
    }
}
