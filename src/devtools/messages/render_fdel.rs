//! `FDEL` bodies: deletes of known masters (with their code-shares), other flights, or
//! flights already gone.

use chrono::NaiveDateTime;
use rand::Rng;

use super::flights::Flight;
use super::generator::Generator;

impl Generator {
    pub(super) fn render_fdel(&mut self, now: NaiveDateTime) -> String {
        let roll = self.rng.random::<f64>();
        let has_shares = |fs: &[Flight], id: &str| fs.iter().any(|c| c.mfid.as_deref() == Some(id));
        let flid = if roll < 0.1 {
            // Deleting an absent flight: a no-op downstream.
            if self.deleted.is_empty() {
                self.new_flid()
            } else {
                let k = self.rng.random_range(0..self.deleted.len());
                self.deleted[k].clone()
            }
        } else {
            let flights = self.flights.clone();
            let master = if roll < 0.55 {
                self.pick(|f| f.mfid.is_none() && has_shares(&flights, &f.flid))
            } else {
                None
            };
            match master.or_else(|| self.pick(|_| true)) {
                Some(i) => self.flights[i].flid.clone(),
                None => self.new_flid(),
            }
        };
        // Cascade: a master takes its code-shares with it.
        let before = self.flights.len();
        self.flights
            .retain(|f| f.flid != flid && f.mfid.as_deref() != Some(flid.as_str()));
        if self.flights.len() != before {
            self.remember_deleted(flid.clone());
        }
        let meta = self.meta_for(now, "FDEL", None);
        let mut x = self.start(Some(&meta));
        x.open("FDEL");
        x.text("FLID", &flid);
        x.close("FDEL");
        Self::end(x)
    }
}
