//! `SCHD` bodies (`DNLD`, `RESP`, `ADFT`) and the plain `ADFT`.

use chrono::NaiveDateTime;
use rand::Rng;

use super::flights::Flight;
use super::generator::Generator;
use super::DATE_FORMAT;

/// Flights a daily schedule download carries at least, beyond those already known.
const SCHEDULE_MIN: usize = 8;

impl Generator {
    /// `SCHD`/`DNLD` (or `RESP` with `<RQID>`). `min_bytes` > 0 pads with transient flights.
    pub(super) fn render_schedule(
        &mut self,
        now: NaiveDateTime,
        resp: bool,
        min_bytes: usize,
    ) -> String {
        let today = now.date();
        let date = if resp || min_bytes > 0 || self.chance(0.3) {
            today
        } else {
            today.succ_opt().unwrap_or(today)
        };
        let styp = if resp { "RESP" } else { "DNLD" };
        let meta = self.meta_for(now, "SCHD", Some(styp));
        let mut flights: Vec<Flight> = if resp {
            // An answer about a few flights of that date.
            let n = self.rng.random_range(1..=5);
            let mut v: Vec<Flight> = Vec::new();
            for _ in 0..n {
                if let Some(i) = self.pick(|f| f.fexd == date) {
                    if v.iter().all(|f| f.flid != self.flights[i].flid) {
                        v.push(self.flights[i].clone());
                    }
                }
            }
            v
        } else {
            // A download announces new flights of that date and repeats the known ones.
            let mut added = 0;
            while added < SCHEDULE_MIN
                || self.flights.iter().filter(|f| f.fexd == date).count() < SCHEDULE_MIN
            {
                let group = self.new_group(date);
                added += group.len();
                self.flights.extend(group);
            }
            self.trim();
            self.flights
                .iter()
                .filter(|f| f.fexd == date)
                .cloned()
                .collect()
        };
        if flights.is_empty() {
            let group = self.new_group(date);
            self.flights.extend(group.iter().cloned());
            flights = group;
        }

        let mut x = self.start(Some(&meta));
        x.open("SCHD");
        if resp {
            self.next_rqid += 1;
            x.text("RQID", &self.next_rqid.to_string());
        }
        x.text("DATE", &date.format(DATE_FORMAT).to_string());
        x.open("FLIGHTS");
        for f in &flights {
            self.full_flight(&mut x, f, resp, true);
        }
        while x.out.len() < min_bytes {
            for f in self.new_group(date) {
                self.full_flight(&mut x, &f, false, true);
            }
        }
        x.close("FLIGHTS");
        x.close("SCHD");
        Self::end(x)
    }

    /// `SCHD`/`ADFT` (`in_schedule`) or `ADFT`: one new flight, sometimes a code-share of a
    /// known master.
    pub(super) fn render_add(&mut self, now: NaiveDateTime, in_schedule: bool) -> String {
        let today = now.date();
        let flight = match self.pick(|f| f.mfid.is_none() && f.fexd >= today) {
            Some(i) if self.chance(0.2) => {
                let master = self.flights[i].clone();
                self.code_share(&master)
            }
            _ => {
                let date = if self.chance(0.7) {
                    today
                } else {
                    today.succ_opt().unwrap_or(today)
                };
                self.new_master(date)
            }
        };
        self.flights.push(flight.clone());
        self.trim();
        let (type_code, styp, body) = if in_schedule {
            ("SCHD", Some("ADFT"), "SCHD")
        } else {
            ("ADFT", None, "ADFT")
        };
        let meta = self.meta_for(now, type_code, styp);
        let mut x = self.start(Some(&meta));
        x.open(body);
        self.full_flight(&mut x, &flight, false, true);
        x.close(body);
        Self::end(x)
    }
}
