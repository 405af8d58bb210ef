//! When the next discovery round starts (issue 21): adaptive, so a committed row waits about
//! `min_poll_gap` for its round under traffic instead of up to a whole `poll_interval`, while an
//! idle inbox still sees one round per `poll_interval`.
//!
//! - A round that must be followed at once ([`PollReport::poll_again_now`]: a full batch, a
//!   release, a hole to decide on evidence) is followed at once, as before.
//! - A round that found something new — W moved, rows were enqueued, or the inbox head grew
//!   (rows arrived behind a hole W waits at) — is followed by the next one `min_poll_gap` after
//!   its start: under traffic a round gathers what arrived meanwhile (about `rate × min_poll_gap`
//!   rows) instead of one row per round, and the shared database never sees a busy loop.
//! - An empty round doubles the gap, up to `poll_interval`: a short lull in the traffic costs
//!   one more short round, not a whole interval, and after a few empty rounds (from 20 ms:
//!   40, 80, … ms, about 2 s in all with a 1 s interval) the idle inbox sees one round per
//!   `poll_interval`. A failed round waits the whole `poll_interval`.
//! - The hole W waits at coming due sooner wakes the poller then.
//!
//! Gaps run from round start to round start, read on the injected clock, so a round slower
//! than the gap is followed at once (and tests move time by hand).

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::PollReport;

/// The poller's pacing state between rounds.
#[derive(Debug, Clone)]
pub struct Pace {
    /// Shortest gap between two round starts (`pipeline.min_poll_gap`).
    min_gap: Duration,
    /// Longest gap (`pipeline.poll_interval`): the idle rate.
    interval: Duration,
    /// The gap after the last round (doubles while rounds come back empty).
    gap: Duration,
    /// The inbox head after the last round that knew it.
    head: Option<i64>,
    /// When a round last read pages ahead (`pipeline.hole_sight_ahead`).
    read_ahead_at: Option<DateTime<Utc>>,
    /// The last round read no row: the next one reads the inbox head first and the rows only
    /// if it moved past W, so an idle inbox costs one statement a round.
    idle: bool,
}

/// The pages ahead of a hole are read at most this often even with a shorter `poll_interval`:
/// they are up to `claim_batch × hole_sight_ahead` ids, and a short interval is chosen for
/// discovery latency, not to sight holes sooner (a hole's age runs from its first sighting).
pub const READ_AHEAD_EVERY_MIN: Duration = Duration::from_secs(1);

impl Pace {
    /// Pacing between `min_gap` and `interval` (`min_gap` is capped at `interval`); the
    /// poller starts as if idle.
    pub fn new(min_gap: Duration, interval: Duration) -> Self {
        Self {
            min_gap: min_gap.min(interval),
            interval,
            gap: interval,
            head: None,
            read_ahead_at: None,
            idle: false,
        }
    }

    /// Whether the round starting at `now` may read pages ahead: a full window re-polls at
    /// once, so while W waits at a hole the pages ahead are read at most once per
    /// `poll_interval` (and at most once per [`READ_AHEAD_EVERY_MIN`]) and the back-to-back
    /// rounds between read one page.
    pub fn may_read_ahead(&self, now: DateTime<Utc>) -> bool {
        let every = self.interval.max(READ_AHEAD_EVERY_MIN);
        self.read_ahead_at.is_none_or(|at| since(at, now) >= every)
    }

    /// Whether the next round should probe the inbox head before reading rows
    /// ([`crate::poller::PollConfig::probe_head`]): the last round read no row.
    pub fn probe_head(&self) -> bool {
        self.idle
    }

    /// The round that started at `started` read pages ahead.
    pub fn read_ahead(&mut self, started: DateTime<Utc>) {
        self.read_ahead_at = Some(started);
    }

    /// How long after `now` the next round starts, given how the round that started at
    /// `started` went (None: it failed).
    pub fn after_round(
        &mut self,
        report: Option<&PollReport>,
        started: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Duration {
        let Some(r) = report else {
            self.gap = self.interval;
            self.idle = false;
            return self.interval;
        };
        self.idle = r.read == 0;
        let head_grew = matches!((self.head, r.sight.head), (Some(a), Some(b)) if b > a);
        if r.sight.head.is_some() {
            self.head = r.sight.head;
        }
        if r.poll_again_now() {
            self.gap = self.min_gap;
            return Duration::ZERO;
        }
        let found = r.moved() || r.enqueued_new > 0 || head_grew;
        self.gap = if found {
            self.min_gap
        } else {
            self.gap
                .saturating_mul(2)
                .clamp(self.min_gap, self.interval)
        };
        let wait = self.gap.saturating_sub(since(started, now));
        // The hole W waits at comes due sooner. (One already due but not released is held by
        // evidence: the gap, no spin.)
        match r.next_due.filter(|d| !d.is_zero()) {
            Some(due) => wait.min(due),
            None => wait,
        }
    }
}

fn since(at: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
    (now - at).to_std().unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::poller::PollStages;
    use crate::telemetry::InboxSight;
    use crate::watermark::{Advance, Cursor};

    const GAP: Duration = Duration::from_millis(20);
    const INTERVAL: Duration = Duration::from_secs(1);

    fn t0() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-12-02T01:00:00Z")
            .expect("valid")
            .with_timezone(&Utc)
    }

    /// A round that left W at `w_before` → `w`, enqueued `new` rows, saw the head at `head`.
    fn report(w_before: i64, w: i64, new: u64, head: Option<i64>) -> PollReport {
        PollReport {
            before: Cursor {
                w: w_before,
                hole_since: None,
            },
            advance: Advance {
                w,
                hole_since: None,
                enqueue: new as usize,
                released: Vec::new(),
                holes: Vec::new(),
                open_hole: None,
                fills: Vec::new(),
                dropped: Vec::new(),
                evidence: Vec::new(),
            },
            read: new as usize,
            enqueued_new: new,
            batch_full: false,
            sight: InboxSight {
                head,
                lag: Some(Duration::ZERO),
                ..InboxSight::default()
            },
            duration: Duration::ZERO,
            hole_evidence: None,
            hole_sighted: false,
            next_due: None,
            stages: PollStages::default(),
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn at(n: u64) -> DateTime<Utc> {
        crate::clock::plus(t0(), ms(n))
    }

    #[test]
    fn an_idle_inbox_is_read_once_per_poll_interval() {
        let mut pace = Pace::new(GAP, INTERVAL);
        let empty = report(5, 5, 0, Some(5));
        for _ in 0..5 {
            assert_eq!(pace.after_round(Some(&empty), t0(), t0()), INTERVAL);
        }
    }

    #[test]
    fn a_round_that_found_rows_is_followed_after_the_min_gap_not_the_interval() {
        let mut pace = Pace::new(GAP, INTERVAL);
        pace.after_round(Some(&report(5, 5, 0, Some(5))), t0(), t0());
        let found = report(5, 8, 3, Some(8));
        assert_eq!(pace.after_round(Some(&found), at(0), at(5)), ms(15));
        // A round slower than the gap: the next starts at once.
        let found = report(8, 9, 1, Some(9));
        assert_eq!(
            pace.after_round(Some(&found), at(0), at(30)),
            Duration::ZERO
        );
    }

    #[test]
    fn rows_behind_a_hole_keep_the_pace_while_w_waits() {
        let mut pace = Pace::new(GAP, INTERVAL);
        pace.after_round(Some(&report(5, 5, 0, Some(7))), t0(), t0());
        // W stays at 5 (6 is missing), but 8 arrived: the fill is looked for soon.
        let grew = report(5, 5, 0, Some(8));
        assert_eq!(pace.after_round(Some(&grew), t0(), t0()), GAP);
        // Nothing new since: back off.
        assert_eq!(pace.after_round(Some(&grew), t0(), t0()), 2 * GAP);
    }

    #[test]
    fn empty_rounds_back_off_doubling_to_the_interval() {
        let mut pace = Pace::new(GAP, INTERVAL);
        pace.after_round(Some(&report(5, 6, 1, Some(6))), t0(), t0());
        let empty = report(6, 6, 0, Some(6));
        let waits: Vec<Duration> = (0..8)
            .map(|_| pace.after_round(Some(&empty), t0(), t0()))
            .collect();
        let expect: Vec<Duration> = [40, 80, 160, 320, 640, 1000, 1000, 1000]
            .into_iter()
            .map(ms)
            .collect();
        assert_eq!(waits, expect);
    }

    #[test]
    fn more_waiting_is_read_at_once_and_a_failure_waits_the_interval() {
        let mut pace = Pace::new(GAP, INTERVAL);
        let full = PollReport {
            batch_full: true,
            ..report(5, 1005, 1000, Some(5000))
        };
        assert_eq!(pace.after_round(Some(&full), t0(), t0()), Duration::ZERO);
        assert_eq!(pace.after_round(None, t0(), t0()), INTERVAL);
    }

    #[test]
    fn a_hole_coming_due_sooner_wakes_the_poller_then() {
        let mut pace = Pace::new(GAP, INTERVAL);
        let waiting = PollReport {
            next_due: Some(ms(300)),
            ..report(5, 5, 0, Some(9))
        };
        assert_eq!(pace.after_round(Some(&waiting), t0(), t0()), ms(300));
    }

    #[test]
    fn pages_ahead_are_read_once_per_interval() {
        let mut pace = Pace::new(GAP, INTERVAL);
        assert!(pace.may_read_ahead(t0()));
        pace.read_ahead(t0());
        assert!(!pace.may_read_ahead(at(999)));
        assert!(pace.may_read_ahead(at(1000)));
    }

    #[test]
    fn a_short_interval_does_not_read_pages_ahead_more_often_than_once_a_second() {
        let mut pace = Pace::new(GAP, ms(250));
        pace.read_ahead(t0());
        assert!(!pace.may_read_ahead(at(250)));
        assert!(!pace.may_read_ahead(at(999)));
        assert!(pace.may_read_ahead(at(1000)));
    }

    #[test]
    fn only_a_round_after_an_empty_one_probes_the_head_first() {
        let mut pace = Pace::new(GAP, INTERVAL);
        assert!(!pace.probe_head(), "the first round reads the rows");
        pace.after_round(Some(&report(5, 5, 0, Some(5))), t0(), t0());
        assert!(pace.probe_head());
        pace.after_round(Some(&report(5, 7, 2, Some(7))), t0(), t0());
        assert!(!pace.probe_head());
        pace.after_round(Some(&report(7, 7, 0, Some(7))), t0(), t0());
        pace.after_round(None, t0(), t0());
        assert!(
            !pace.probe_head(),
            "a failed round proves nothing about the inbox"
        );
    }
}
