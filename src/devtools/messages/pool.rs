//! The generator's flight pool: keeping it stocked, bounded and linked (masters and their
//! code-shares), and picking flights from it.

use chrono::{Duration as ChronoDuration, NaiveDate, NaiveDateTime};
use rand::Rng;

use super::flights::Flight;
use super::generator::Generator;

/// Pool size the generator keeps for "today" (enough variety, small enough to hit repeatedly).
const POOL_MIN: usize = 24;
/// Pool cap: the oldest flights are forgotten beyond it (they just stop receiving updates).
pub(super) const POOL_MAX: usize = 400;
/// How many deleted ids are remembered for idempotent re-deletes.
const DELETED_MAX: usize = 64;

const DOMESTIC: [&str; 10] = ["CA", "MU", "CZ", "HU", "3U", "ZH", "FM", "MF", "KN", "SC"];
const PARTNERS: [&str; 8] = ["KE", "SQ", "NH", "LH", "AF", "DL", "QF", "CX"];

impl Generator {
    /// A random index among flights matching `pred`.
    pub(super) fn pick(&mut self, pred: impl Fn(&Flight) -> bool) -> Option<usize> {
        let idx: Vec<usize> = (0..self.flights.len())
            .filter(|&i| pred(&self.flights[i]))
            .collect();
        if idx.is_empty() {
            None
        } else {
            Some(idx[self.rng.random_range(0..idx.len())])
        }
    }

    pub(super) fn new_flid(&mut self) -> String {
        self.next_flid += 1;
        self.next_flid.to_string()
    }

    /// A new master flight on `date` (not added to the pool).
    pub(super) fn new_master(&mut self, date: NaiveDate) -> Flight {
        let awcd = self.pick_str(DOMESTIC);
        let flno = format!("{awcd}{}", self.rng.random_range(1001..9899));
        let minutes = self.rng.random_range(72..288u32) * 5; // 06:00..23:55, 5-min slots
        let stot = date.and_hms_opt(0, 0, 0).unwrap_or_default()
            + ChronoDuration::minutes(i64::from(minutes));
        let flio = if self.chance(0.5) { 'A' } else { 'D' };
        let gate = (flio == 'D').then(|| self.gate());
        let blts = (flio == 'A').then(|| self.belt());
        let stnd = Some(self.stand());
        Flight {
            flid: self.new_flid(),
            awcd,
            flno,
            fexd: date,
            flio,
            stot,
            etot: None,
            atot: None,
            gate,
            stnd,
            blts,
            stat: "SCH",
            mfid: None,
        }
    }

    /// A code-share of `master`: its own id and designator, the master's operation.
    pub(super) fn code_share(&mut self, master: &Flight) -> Flight {
        let awcd = self.pick_str(PARTNERS);
        let mut f = master.clone();
        f.flid = self.new_flid();
        f.awcd = awcd;
        f.flno = format!("{awcd}{}", self.rng.random_range(100..9899));
        f.mfid = Some(master.flid.clone());
        f
    }

    /// A master and, for about a third of them, one or two code-shares.
    pub(super) fn new_group(&mut self, date: NaiveDate) -> Vec<Flight> {
        let master = self.new_master(date);
        let mut group = vec![master.clone()];
        if self.chance(0.35) {
            let n = self.rng.random_range(1..=2);
            for _ in 0..n {
                let cs = self.code_share(&master);
                group.push(cs);
            }
        }
        group
    }

    /// Keeps the pool stocked for today and bounded.
    pub(super) fn top_up(&mut self, now: NaiveDateTime) {
        let today = now.date();
        let yesterday = today.pred_opt().unwrap_or(today);
        self.flights.retain(|f| f.fexd >= yesterday);
        while self.flights.iter().filter(|f| f.fexd >= today).count() < POOL_MIN {
            let group = self.new_group(today);
            self.flights.extend(group);
        }
        self.trim();
    }

    pub(super) fn trim(&mut self) {
        if self.flights.len() > POOL_MAX {
            let excess = self.flights.len() - POOL_MAX;
            self.flights.drain(..excess);
        }
    }

    pub(super) fn remember_deleted(&mut self, flid: String) {
        self.deleted.push(flid);
        if self.deleted.len() > DELETED_MAX {
            self.deleted.remove(0);
        }
    }
}
