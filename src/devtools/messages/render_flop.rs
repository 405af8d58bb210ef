//! `FLOP` bodies: the dynamic updates of one flight, by subtype.

use chrono::{Duration as ChronoDuration, NaiveDateTime};
use rand::Rng;

use super::flights::Val;
use super::generator::Generator;
use super::{DATE_FORMAT, TIME_FORMAT};

impl Generator {
    /// The fields a FLOP of `styp` carries about the flight at `i`, applied to the pool.
    fn flop_fields(
        &mut self,
        i: usize,
        styp: &str,
        now: NaiveDateTime,
    ) -> Vec<(&'static str, Val)> {
        let mut fields: Vec<(&'static str, Val)> = Vec::new();
        let stot = self.flights[i].stot;
        match styp {
            "ARRE" | "DEPE" => {
                let stat = if styp == "ARRE" { "ARR" } else { "DEP" };
                self.flights[i].atot = Some(now);
                self.flights[i].stat = stat;
                fields.push(("ATOT", Val::Text(now.format(TIME_FORMAT).to_string())));
                fields.push(("STAT", Val::Text(stat.to_string())));
                if styp == "ARRE" && self.chance(0.5) {
                    let belt = self.belt();
                    self.flights[i].blts = Some(belt.clone());
                    fields.push(("BLTS", Val::Text(belt)));
                }
            }
            "GATE" => {
                // Now and then a shared gate whose name needs escaping.
                let gate = if self.chance(0.05) {
                    format!("{}&{}", self.gate(), self.gate())
                } else {
                    self.gate()
                };
                self.flights[i].gate = Some(gate.clone());
                fields.push(("GATE", Val::Text(gate)));
            }
            "STND" => {
                let stnd = self.stand();
                self.flights[i].stnd = Some(stnd.clone());
                fields.push(("STND", Val::Text(stnd)));
            }
            "CANC" => {
                self.flights[i].stat = "CNL";
                self.flights[i].etot = None;
                fields.push(("STAT", Val::Text("CNL".to_string())));
                let clear = self.clear_or_nil();
                fields.push(("ETOT", clear));
            }
            "DELY" => {
                let etot = stot + ChronoDuration::minutes(self.rng.random_range(3..36) * 5);
                self.flights[i].etot = Some(etot);
                self.flights[i].stat = "DEL";
                fields.push(("ETOT", Val::Text(etot.format(TIME_FORMAT).to_string())));
                fields.push(("STAT", Val::Text("DEL".to_string())));
            }
            // UPDT (and unknown subtypes).
            _ => self.update_fields(i, &mut fields),
        }
        fields
    }

    /// The fields of an UPDT (and of unknown subtypes): an estimate, sometimes a resource,
    /// sometimes a correction that clears the estimate.
    fn update_fields(&mut self, i: usize, fields: &mut Vec<(&'static str, Val)>) {
        if self.chance(0.1) && self.flights[i].etot.is_some() {
            self.flights[i].etot = None;
            let clear = self.clear_or_nil();
            fields.push(("ETOT", clear));
        } else {
            let etot =
                self.flights[i].stot + ChronoDuration::minutes(self.rng.random_range(-3..12) * 5);
            self.flights[i].etot = Some(etot);
            fields.push(("ETOT", Val::Text(etot.format(TIME_FORMAT).to_string())));
        }
        if self.chance(0.3) {
            let stnd = self.stand();
            self.flights[i].stnd = Some(stnd.clone());
            fields.push(("STND", Val::Text(stnd)));
        }
        if self.flights[i].flio == 'D' && self.chance(0.2) {
            let gate = self.gate();
            self.flights[i].gate = Some(gate.clone());
            fields.push(("GATE", Val::Text(gate)));
        }
        if self.chance(0.2) {
            let stat = if self.flights[i].flio == 'D' {
                self.pick_str(["SCH", "BOR", "GCL"])
            } else {
                self.pick_str(["SCH", "ONR", "LND"])
            };
            self.flights[i].stat = stat;
            fields.push(("STAT", Val::Text(stat.to_string())));
        }
    }

    /// How a clearing value is written: mostly `<X>-</X>`, sometimes `xsi:nil`.
    fn clear_or_nil(&mut self) -> Val {
        if self.chance(0.8) {
            Val::Clear
        } else {
            Val::Nil
        }
    }

    pub(super) fn render_flop(&mut self, now: NaiveDateTime, styp: &'static str) -> String {
        let today = now.date();
        let unknown_flight = self.chance(0.03);
        let i = if unknown_flight {
            // A flight we never announced: downstream creates it from the carried fields.
            let f = self.new_master(today);
            self.flights.push(f);
            self.trim();
            self.flights.len() - 1
        } else {
            let want = match styp {
                "ARRE" => Some('A'),
                "DEPE" | "GATE" => Some('D'),
                _ => None,
            };
            let masters_only = self.chance(0.85);
            self.pick(|f| {
                f.fexd >= today
                    && want.is_none_or(|w| f.flio == w)
                    && (!masters_only || f.mfid.is_none())
            })
            .or_else(|| self.pick(|_| true))
            .unwrap_or(0)
        };
        let fields = self.flop_fields(i, styp, now);
        let f = self.flights[i].clone();
        let meta = self.meta_for(now, "FLOP", Some(styp));
        let mut x = self.start(Some(&meta));
        x.open("FLOP");
        x.open("FLIGHT");
        x.text("FLID", &f.flid);
        if unknown_flight || self.chance(0.5) {
            x.text("AWCD", f.awcd);
            x.text("FLNO", &f.flno);
            x.text("FEXD", &f.fexd.format(DATE_FORMAT).to_string());
            x.text("FLIO", &f.flio.to_string());
        }
        if unknown_flight {
            x.text("STOT", &f.stot.format(TIME_FORMAT).to_string());
        }
        let short = self.chance(0.5);
        for (tag, val) in &fields {
            x.leaf(tag, val, short);
        }
        // Some feeds list every field and leave the uncarried ones empty.
        if self.chance(0.3) {
            for tag in ["ETOT", "ATOT", "GATE", "STND", "BLTS", "STAT"] {
                if !fields.iter().any(|(t, _)| *t == tag) {
                    x.leaf(tag, &Val::Empty, short);
                }
            }
        }
        // An element the codec does not know (ignored), with UTF-8 text that needs escaping.
        if self.chance(0.05) {
            x.text("RMRK", "延误 <30min> & 更换登机口 \"待定\"");
        }
        x.close("FLIGHT");
        x.close("FLOP");
        Self::end(x)
    }
}
