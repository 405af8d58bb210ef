//! The watermark rule: examples, and property tests against a brute-force model of an inbox
//! whose ids are taken at increasing times and commit late, roll back, or never show.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;

const DELAY: Duration = Duration::from_secs(300);
const CAP: Duration = Duration::from_secs(1800);

fn t(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_790_000_000 + secs, 0).expect("valid time")
}

fn db(secs: i64) -> NaiveDateTime {
    t(secs).naive_utc()
}

fn hole(first: i64, last: i64, seen: i64) -> Hole {
    Hole {
        first,
        last,
        first_seen: t(seen),
        seen_db_at: None,
    }
}

fn round<'a>(w: i64, holes: &'a [Hole], ids: &'a [i64], now: i64) -> Round<'a> {
    Round {
        w,
        holes,
        ids,
        complete: true,
        now: t(now),
        max_commit_delay: DELAY,
        evidence: None,
    }
}

fn released(a: &Advance) -> Vec<(i64, i64)> {
    a.released.iter().map(|r| (r.first, r.last)).collect()
}

fn spans(holes: &[Hole]) -> Vec<(i64, i64, DateTime<Utc>)> {
    holes
        .iter()
        .map(|h| (h.first, h.last, h.first_seen))
        .collect()
}

#[test]
fn contiguous_rows_move_w_to_their_end() {
    let a = advance(round(0, &[], &[1, 2, 3], 0));
    assert_eq!((a.w, a.enqueue, a.hole_since), (3, 3, None));
    assert!(a.released.is_empty() && a.holes.is_empty());
}

#[test]
fn empty_batch_keeps_w() {
    let a = advance(round(7, &[], &[], 0));
    assert_eq!((a.w, a.enqueue, a.hole_since), (7, 0, None));
}

#[test]
fn young_hole_stops_w_and_nothing_after_it_is_enqueued() {
    let a = advance(round(0, &[], &[1, 2, 4, 5], 0));
    assert_eq!((a.w, a.enqueue), (2, 2));
    assert_eq!(a.hole_since, Some(t(0)));
    let open = a.open_hole.expect("hole");
    assert_eq!((open.first_missing, open.next_present), (3, 4));
    assert_eq!(spans(&a.holes), vec![(3, 3, t(0))]);

    let b = advance(round(2, &a.holes, &[4, 5], 299));
    assert_eq!((b.w, b.enqueue, b.hole_since), (2, 0, Some(t(0))));
    assert!(b.released.is_empty());
}

#[test]
fn aged_hole_releases_only_the_hole_and_w_walks_on() {
    let a = advance(round(2, &[hole(3, 5, 0)], &[6, 7], 300));
    assert_eq!(released(&a), vec![(3, 5)]);
    assert_eq!((a.w, a.enqueue, a.hole_since), (7, 2, None));
    assert!(a.holes.is_empty());
}

#[test]
fn holes_seen_together_age_side_by_side() {
    // Ids 3 and 6 missing, both first seen at 0.
    let a = advance(round(0, &[], &[1, 2, 4, 5, 7, 8], 0));
    assert_eq!(spans(&a.holes), vec![(3, 3, t(0)), (6, 6, t(0))]);
    // At 5 min both are due: one round releases both and enqueues every row.
    let b = advance(round(a.w, &a.holes, &[4, 5, 7, 8], 300));
    assert_eq!(released(&b), vec![(3, 3), (6, 6)]);
    assert_eq!((b.w, b.enqueue), (8, 4));
    assert!(b.holes.is_empty() && b.hole_since.is_none());
}

#[test]
fn a_younger_hole_behind_a_due_one_keeps_its_own_age() {
    let stored = [hole(3, 3, 0), hole(6, 6, 200)];
    let a = advance(round(2, &stored, &[4, 5, 7], 300));
    assert_eq!(released(&a), vec![(3, 3)]);
    assert_eq!(a.w, 5, "W waits before the younger hole");
    assert_eq!(spans(&a.holes), vec![(6, 6, t(200))]);
    assert_eq!(a.hole_since, Some(t(200)));
    let b = advance(round(a.w, &a.holes, &[7], 499));
    assert!(b.released.is_empty());
    let c = advance(round(a.w, &a.holes, &[7], 500));
    assert_eq!(released(&c), vec![(6, 6)]);
}

#[test]
fn a_partial_fill_splits_the_range_and_keeps_first_seen() {
    let a = advance(round(2, &[hole(3, 6, 0)], &[5, 7], 100));
    assert_eq!(a.fills, vec![Duration::from_secs(100)]);
    assert_eq!(spans(&a.holes), vec![(3, 4, t(0)), (6, 6, t(0))]);
    let b = advance(round(2, &a.holes, &[5, 7], 300));
    assert_eq!(released(&b), vec![(3, 4), (6, 6)]);
    assert_eq!(b.w, 7);
}

#[test]
fn ids_first_seen_later_than_the_rest_of_their_gap_hold_the_gap() {
    // Stored hole 3..=3 since 0; a row that was there at 4 vanished? No: 4 was never seen
    // (the read stopped at 3's successor); now 3..=5 is one gap whose 4..=5 are new.
    let a = advance(round(2, &[hole(3, 3, 0)], &[6], 300));
    assert!(a.released.is_empty(), "4 and 5 are first seen now");
    assert_eq!(spans(&a.holes), vec![(3, 3, t(0)), (4, 5, t(300))]);
    assert_eq!(a.open_hole.expect("open").since, t(300));
    let b = advance(round(2, &a.holes, &[6], 600));
    assert_eq!(released(&b), vec![(3, 5)]);
}

#[test]
fn filled_hole_then_new_hole_gets_its_own_timer() {
    let a = advance(round(0, &[], &[2], 0));
    let b = advance(round(0, &a.holes, &[1, 2, 4], 240));
    assert_eq!((b.w, b.enqueue), (2, 2));
    assert_eq!(b.fills, vec![Duration::from_secs(240)]);
    assert_eq!(spans(&b.holes), vec![(3, 3, t(240))]);
    let c = advance(round(2, &b.holes, &[4], 300));
    assert!(c.released.is_empty());
    let d = advance(round(2, &b.holes, &[4], 540));
    assert_eq!(released(&d), vec![(3, 3)]);
}

#[test]
fn a_cut_read_keeps_the_holes_it_did_not_reach() {
    let stored = [hole(3, 3, 0), hole(10, 12, 50)];
    let r = Round {
        complete: false,
        ..round(2, &stored, &[4, 5], 100)
    };
    let a = advance(r);
    assert_eq!(spans(&a.holes), vec![(3, 3, t(0)), (10, 12, t(50))]);
    assert!(a.dropped.is_empty());
    // The same with a complete read: no row after 10..=12 any more: dropped, reported.
    let b = advance(round(2, &stored, &[4, 5], 100));
    assert_eq!(spans(&b.holes), vec![(3, 3, t(0))]);
    assert_eq!(spans(&b.dropped), vec![(10, 12, t(50))]);
}

#[test]
fn a_fifty_million_id_jump_is_one_range() {
    let a = advance(round(0, &[], &[1, 50_000_002], 0));
    assert_eq!(spans(&a.holes), vec![(2, 50_000_001, t(0))]);
    assert_eq!(a.missing_ids(), 50_000_000);
    let b = advance(round(1, &a.holes, &[50_000_002], 300));
    assert_eq!(released(&b), vec![(2, 50_000_001)]);
    assert_eq!(b.w, 50_000_002);
}

#[test]
fn clock_stepping_back_never_ages_a_hole() {
    let a = advance(round(0, &[hole(1, 1, 1000)], &[2], 0));
    assert!(a.released.is_empty());
    assert_eq!(a.open_hole.expect("hole").age, Duration::ZERO);
}

#[test]
fn stored_holes_are_checked() {
    assert!(check_holes(2, &[hole(3, 3, 0), hole(5, 9, 0)]).is_ok());
    assert_eq!(
        check_holes(3, &[hole(3, 3, 0)]),
        Err(HoleSetError::BelowW {
            first: 3,
            last: 3,
            w: 3
        })
    );
    assert!(matches!(
        check_holes(0, &[hole(4, 3, 0)]),
        Err(HoleSetError::Empty { .. })
    ));
    assert!(matches!(
        check_holes(0, &[hole(3, 5, 0), hole(5, 6, 0)]),
        Err(HoleSetError::Overlap { .. })
    ));
    assert!(matches!(
        check_holes(0, &[hole(7, 8, 0), hole(3, 4, 0)]),
        Err(HoleSetError::Overlap { .. })
    ));
}

fn sighted(first: i64, last: i64, seen: i64) -> Hole {
    Hole {
        seen_db_at: Some(db(seen)),
        ..hole(first, last, seen)
    }
}

fn trx(read_at: i64, oldest: Option<i64>) -> Option<TrxEvidence> {
    Some(TrxEvidence {
        read_at: db(read_at),
        oldest_started: oldest.map(db),
        cap: CAP,
    })
}

#[test]
fn no_older_transaction_releases_a_young_hole_early_and_only_the_hole() {
    let stored = [sighted(3, 4, 0)];
    let a = advance(Round {
        evidence: trx(3, Some(1)),
        ..round(2, &stored, &[5, 6], 3)
    });
    assert_eq!(released(&a), vec![(3, 4)]);
    assert_eq!((a.w, a.enqueue, a.hole_since), (6, 2, None));
    assert_eq!(a.front_evidence(), Some(EvidenceDecision::ReleasedEarly));
    // Past the delay the timer would have released it anyway: no evidence decision.
    let b = advance(Round {
        evidence: trx(300, None),
        ..round(2, &stored, &[5, 6], 300)
    });
    assert_eq!(released(&b), vec![(3, 4)]);
    assert!(b.evidence.is_empty());
}

#[test]
fn older_transaction_holds_past_the_delay_until_the_cap() {
    let stored = [sighted(3, 3, 0)];
    let at = |now: i64| {
        advance(Round {
            evidence: trx(now, Some(0)),
            ..round(2, &stored, &[4], now)
        })
    };
    let young = at(10);
    assert!(young.released.is_empty() && young.evidence.is_empty());
    let held = at(300);
    assert!(held.released.is_empty());
    assert_eq!(held.front_evidence(), Some(EvidenceDecision::Held));
    assert_eq!(held.hole_since, Some(t(0)), "the timer keeps running");
    assert!(at(1799).released.is_empty());
    let capped = at(1800);
    assert_eq!(released(&capped), vec![(3, 3)]);
    assert_eq!(capped.front_evidence(), Some(EvidenceDecision::CapReached));
}

#[test]
fn one_transaction_list_decides_each_hole_by_its_own_sighting() {
    // Hole 3 sighted at 0, hole 6 sighted at 20; the oldest open transaction started at 10:
    // it is older than 6's sighting (may still commit 6) but newer than 3's.
    let stored = [sighted(3, 3, 0), sighted(6, 6, 20)];
    let a = advance(Round {
        evidence: trx(30, Some(10)),
        ..round(2, &stored, &[4, 5, 7], 30)
    });
    assert_eq!(released(&a), vec![(3, 3)]);
    assert_eq!(a.w, 5);
    assert_eq!(a.front_evidence(), Some(EvidenceDecision::ReleasedEarly));
}

#[test]
fn evidence_counts_only_for_holes_sighted_on_the_server_clock() {
    let a = advance(Round {
        evidence: trx(5, None),
        ..round(0, &[hole(1, 1, 0)], &[2], 5)
    });
    assert!(a.released.is_empty(), "no server sighting: timer rule");
    // A server clock that stepped back since the sighting proves nothing.
    let b = advance(Round {
        evidence: trx(5, None),
        ..round(0, &[sighted(1, 1, 10)], &[2], 12)
    });
    assert!(b.released.is_empty());
}

// ---- the model ----------------------------------------------------------------------------

/// One upstream transaction: takes the next id `gap` seconds after the previous one, stays
/// open `open` seconds, then commits (visible) or rolls back (never visible).
fn txs() -> impl Strategy<Value = Vec<(u64, u64, bool)>> {
    prop::collection::vec(
        (
            0u64..8,
            prop_oneof![4 => 0u64..5, 1 => 0u64..1200],
            prop::bool::weighted(0.8),
        ),
        1..70,
    )
}

const AHEAD: usize = 100;

struct Model {
    started: Vec<u64>,
    ended: Vec<u64>,
    visible_at: Vec<Option<u64>>,
}

impl Model {
    fn new(txs: &[(u64, u64, bool)]) -> Self {
        let mut at = 0;
        let started: Vec<u64> = txs
            .iter()
            .map(|(gap, _, _)| {
                at += gap;
                at
            })
            .collect();
        let ended: Vec<u64> = txs
            .iter()
            .zip(&started)
            .map(|((_, d, _), s)| s + d)
            .collect();
        let visible_at = txs
            .iter()
            .zip(&ended)
            .map(|((_, _, commit), e)| commit.then_some(*e))
            .collect();
        Self {
            started,
            ended,
            visible_at,
        }
    }

    fn n(&self) -> i64 {
        self.visible_at.len() as i64
    }

    fn visible(&self, id: i64, now: u64) -> bool {
        self.visible_at[(id - 1) as usize].is_some_and(|v| v <= now)
    }

    /// What the poller reads: a page of `limit` rows, and while the rows read are not
    /// contiguous from W+1 more pages, up to `AHEAD` (`pipeline.hole_sight_ahead`).
    fn rows_after(&self, w: i64, now: u64, limit: usize) -> (Vec<i64>, bool) {
        let all: Vec<i64> = (w + 1..=self.n())
            .filter(|id| self.visible(*id, now))
            .collect();
        let mut take = limit.min(all.len());
        let gap = |k: usize| k > 0 && all[k - 1] != w + k as i64;
        while take < all.len() && take < limit * AHEAD && gap(take) {
            take = (take + limit).min(all.len());
        }
        (all[..take].to_vec(), take == all.len())
    }

    /// The oldest open transaction at `now` (what `INNODB_TRX` shows).
    fn oldest_open(&self, now: u64) -> Option<u64> {
        (0..self.started.len())
            .filter(|j| self.started[*j] <= now && self.ended[*j] > now)
            .map(|j| self.started[j])
            .min()
    }

    fn last_end(&self) -> u64 {
        self.ended.iter().copied().max().unwrap_or(0)
    }
}

/// What the committed rounds of [`per_hole_aging_matches_the_model`] left in the store, and
/// what they did over the run.
#[derive(Default)]
struct Durable {
    w: i64,
    holes: Vec<Hole>,
    enqueued: Vec<i64>,
    /// Released id → when.
    released: BTreeMap<i64, u64>,
    /// First durable sighting of each id as missing with a later row present.
    first_missing: BTreeMap<i64, u64>,
}

impl Durable {
    /// A round's commit: its enqueued rows, releases, holes and W become durable.
    fn commit(
        &mut self,
        a: &Advance,
        ids: &[i64],
        now: u64,
        with_evidence: bool,
    ) -> Result<(), TestCaseError> {
        self.enqueued.extend_from_slice(&ids[..a.enqueue]);
        for rel in &a.released {
            for id in rel.ids() {
                self.released.insert(id, now);
            }
        }
        for h in &a.holes {
            for id in h.first..=h.last {
                self.first_missing.entry(id).or_insert(now);
                // The stored sighting is never later than the model's first one.
                prop_assert!(h.first_seen <= t(self.first_missing[&id] as i64));
            }
        }
        self.w = a.w;
        // The evidence sighting: server time read after the rows, for new holes.
        self.holes = a
            .holes
            .iter()
            .map(|h| Hole {
                seen_db_at: h.seen_db_at.or(with_evidence.then(|| db(now as i64))),
                ..*h
            })
            .collect();
        Ok(())
    }
}

/// Every id a round releases is invisible, and is released before its own delay only on
/// evidence, and then its transaction has ended (rolled back): it never commits later.
fn check_releases(
    m: &Model,
    a: &Advance,
    first_missing: &BTreeMap<i64, u64>,
    now: u64,
    with_evidence: bool,
) -> Result<(), TestCaseError> {
    for r in &a.released {
        for id in r.ids() {
            prop_assert!(!m.visible(id, now), "released a visible id {}", id);
            let seen = first_missing.get(&id).copied();
            let by_timer = seen.is_some_and(|s| now - s >= DELAY.as_secs());
            if !by_timer {
                prop_assert!(
                    with_evidence,
                    "id {} released at {} seen {:?}",
                    id,
                    now,
                    seen
                );
                let j = (id - 1) as usize;
                let capped = seen.is_some_and(|s| now - s >= CAP.as_secs());
                prop_assert!(
                    capped || (m.ended[j] <= now && m.visible_at[j].is_none()),
                    "id {} released on evidence but its transaction is open or committed",
                    id
                );
            }
        }
    }
    Ok(())
}

/// FIFO holds, and every id ≤ W was either enqueued (and committed) or released, never both.
fn check_outcome(m: &Model, d: &Durable) -> Result<(), TestCaseError> {
    prop_assert!(
        d.enqueued.windows(2).all(|p| p[0] < p[1]),
        "FIFO broken: {:?}",
        d.enqueued
    );
    let enq: BTreeSet<i64> = d.enqueued.iter().copied().collect();
    for id in 1..=d.w {
        prop_assert!(
            enq.contains(&id) != d.released.contains_key(&id),
            "id {}",
            id
        );
        if enq.contains(&id) {
            prop_assert!(m.visible_at[(id - 1) as usize].is_some());
        }
    }
    Ok(())
}

proptest! {
    /// Rounds at random steps over random allocation / commit / rollback schedules, with
    /// rounds whose commit is lost (a crash before it, or an asynchronous commit lost in a
    /// restart): every release respects its own age, released ids were invisible when
    /// released, FIFO holds, the enqueued rows are exactly the committed ones ≤ W (less those
    /// that committed only after their release: the late detector's case), and once upstream
    /// is quiet W reaches the last row within one delay.
    #[test]
    fn per_hole_aging_matches_the_model(
        txs in txs(),
        limit in 1usize..40,
        step in 1u64..40,
        lost in prop::collection::vec(prop::bool::weighted(0.1), 64),
        with_evidence in any::<bool>(),
    ) {
        let m = Model::new(&txs);
        let mut d = Durable::default();
        let quiet = m.last_end();
        let mut now = 0u64;
        let mut reached_at = None;
        for r in 0..4000usize {
            let (ids, complete) = m.rows_after(d.w, now, limit);
            let evidence = with_evidence.then(|| TrxEvidence {
                read_at: db(now as i64),
                oldest_started: m.oldest_open(now).map(|s| db(s as i64)),
                cap: CAP,
            });
            let a = advance(Round {
                w: d.w,
                holes: &d.holes,
                ids: &ids,
                complete,
                now: t(now as i64),
                max_commit_delay: DELAY,
                evidence,
            });
            prop_assert!(check_holes(a.w, &a.holes).is_ok(), "{:?}", a.holes);
            check_releases(&m, &a, &d.first_missing, now, with_evidence)?;
            let persisted = !lost[r % lost.len()];
            if persisted {
                d.commit(&a, &ids, now, with_evidence)?;
            }
            let last_visible = (1..=m.n()).rev().find(|id| m.visible(*id, now)).unwrap_or(0);
            if now >= quiet && d.w == last_visible && reached_at.is_none() {
                reached_at = Some(now);
            }
            if reached_at.is_some() {
                break;
            }
            now += step;
        }
        check_outcome(&m, &d)?;
        // Liveness: k holes cost one delay, not k. Rounds come every `step`; a lost round,
        // a cut read and a hole first seen only at the quiet moment add rounds, never delays.
        let reached = reached_at.expect("W reached the last row");
        let rounds_needed = (m.n() as u64 / limit as u64 + 2) * step;
        let lost_rounds = 64 * step;
        prop_assert!(
            reached <= quiet + DELAY.as_secs() + rounds_needed + lost_rounds + step,
            "W reached the end at {} (quiet at {})", reached, quiet
        );
    }

    /// W never passes an existing row, never enqueues after a hole that is not due, and keeps
    /// every stored sighting it does not release.
    #[test]
    fn one_round_is_safe(
        present in prop::collection::vec(prop::bool::weighted(0.8), 1..120),
        w0 in 0i64..30,
        limit in 1usize..40,
        ages in prop::collection::vec(0u64..600, 0..10),
    ) {
        let n = present.len() as i64;
        let w0 = w0.min(n);
        let all: Vec<i64> = (w0 + 1..=n).filter(|id| present[(*id - 1) as usize]).collect();
        let complete = all.len() <= limit;
        let ids: Vec<i64> = all.iter().copied().take(limit).collect();
        // Stored holes: some of the missing ids above W, with random ages.
        let missing: Vec<i64> = (w0 + 1..=n).filter(|id| !present[(*id - 1) as usize]).collect();
        let now = 10_000i64;
        let stored: Vec<Hole> = missing
            .iter()
            .zip(&ages)
            .map(|(id, age)| hole(*id, *id, now - *age as i64))
            .collect();
        let a = advance(Round {
            w: w0,
            holes: &stored,
            ids: &ids,
            complete,
            now: t(now),
            max_commit_delay: DELAY,
            evidence: None,
        });
        prop_assert!(a.w >= w0);
        prop_assert!(ids[..a.enqueue].iter().all(|id| *id <= a.w));
        prop_assert!(ids[a.enqueue..].iter().all(|id| *id > a.w));
        // Every id ≤ new W is enqueued this round, present before, or released this round.
        for id in w0 + 1..=a.w {
            let in_release = a.released.iter().any(|r| r.ids().contains(&id));
            prop_assert!(ids[..a.enqueue].contains(&id) != in_release, "id {}", id);
        }
        for r in &a.released {
            for id in r.ids() {
                let h = stored.iter().find(|h| h.first == id);
                prop_assert!(h.is_some_and(|h| t(now) - h.first_seen >= chrono::Duration::seconds(300)));
            }
        }
        if let Some(open) = a.open_hole {
            prop_assert_eq!(open.first_missing, a.w + 1);
            prop_assert!(open.age < DELAY);
        }
        prop_assert!(check_holes(a.w, &a.holes).is_ok());
    }
}
