//! Broken messages, one way per [`MalformedKind`] (SPEC Appendix A, "MALFORMED").

use chrono::{Duration as ChronoDuration, NaiveDateTime};
use rand::Rng;

use super::generator::Generator;
use super::kind::MalformedKind;
use super::xml::Xml;
use super::TIME_FORMAT;

impl Generator {
    /// A plain, valid FLOP body for the malformed variants (does not touch the pool).
    fn plain_flop_body(&mut self, x: &mut Xml, now: NaiveDateTime, flid: bool) {
        let f = match self.pick(|_| true) {
            Some(i) => self.flights[i].clone(),
            None => self.new_master(now.date()),
        };
        x.open("FLOP");
        x.open("FLIGHT");
        if flid {
            x.text("FLID", &f.flid);
        }
        x.text("FLNO", &f.flno);
        x.text(
            "ETOT",
            &(f.stot + ChronoDuration::minutes(15))
                .format(TIME_FORMAT)
                .to_string(),
        );
        x.close("FLIGHT");
        x.close("FLOP");
    }

    pub(super) fn render_malformed(&mut self, now: NaiveDateTime, kind: MalformedKind) -> String {
        match kind {
            MalformedKind::NotWellFormed => self.not_well_formed(now),
            MalformedKind::NoMeta => {
                let mut x = self.start(None);
                self.plain_flop_body(&mut x, now, true);
                Self::end(x)
            }
            MalformedKind::MissingSeqn => {
                let mut meta = self.meta_for(now, "FLOP", Some("UPDT"));
                meta.seqn = None;
                let mut x = self.start(Some(&meta));
                self.plain_flop_body(&mut x, now, true);
                Self::end(x)
            }
            MalformedKind::BadDdtm => {
                let mut meta = self.meta_for(now, "FLOP", Some("UPDT"));
                meta.ddtm = Some(match self.rng.random_range(0..3) {
                    0 => now.format("%Y-%m-%d %H:%M:%S").to_string(),
                    1 => format!("{}1345256199", now.format("%Y")),
                    _ => "N/A".to_string(),
                });
                let mut x = self.start(Some(&meta));
                self.plain_flop_body(&mut x, now, true);
                Self::end(x)
            }
            MalformedKind::MissingFlid => self.missing_flid(now),
            MalformedKind::Truncated => self.truncated(now),
        }
    }

    /// A FLOP whose XML is broken: a mismatched end tag, raw `&` and `<`, or an unclosed
    /// element.
    fn not_well_formed(&mut self, now: NaiveDateTime) -> String {
        let meta = self.meta_for(now, "FLOP", Some("UPDT"));
        let mut x = self.start(Some(&meta));
        let f = match self.pick(|_| true) {
            Some(i) => self.flights[i].clone(),
            None => self.new_master(now.date()),
        };
        x.open("FLOP");
        x.open("FLIGHT");
        x.text("FLID", &f.flid);
        match self.rng.random_range(0..3) {
            0 => {
                // Mismatched end tag.
                x.raw_line(&format!("<FLNO>{}</FLON>", f.flno));
                x.close("FLIGHT");
            }
            1 => {
                // A raw ampersand and a raw '<' in text.
                x.raw_line("<GATE>A1 & A2 <temp></GATE>");
                x.close("FLIGHT");
            }
            _ => {
                // FLIGHT never closed.
                x.text("FLNO", &f.flno);
                x.depth = x.depth.saturating_sub(1);
            }
        }
        x.close("FLOP");
        Self::end(x)
    }

    /// A FLOP, ADFT or FDEL without the `FLID` it needs.
    fn missing_flid(&mut self, now: NaiveDateTime) -> String {
        match self.rng.random_range(0..3) {
            0 => {
                let meta = self.meta_for(now, "FLOP", Some("UPDT"));
                let mut x = self.start(Some(&meta));
                self.plain_flop_body(&mut x, now, false);
                Self::end(x)
            }
            1 => {
                let meta = self.meta_for(now, "ADFT", None);
                let f = self.new_master(now.date());
                let mut x = self.start(Some(&meta));
                x.open("ADFT");
                self.full_flight(&mut x, &f, false, false);
                x.close("ADFT");
                Self::end(x)
            }
            _ => {
                let meta = self.meta_for(now, "FDEL", None);
                let mut x = self.start(Some(&meta));
                x.open("FDEL");
                x.close("FDEL");
                Self::end(x)
            }
        }
    }

    /// A valid schedule or FLOP cut off somewhere after its first quarter.
    fn truncated(&mut self, now: NaiveDateTime) -> String {
        let whole = match self.rng.random_range(0..3) {
            0 => self.render_schedule(now, true, 0),
            _ => {
                let styp = self.flop_subtype();
                self.render_flop(now, styp)
            }
        };
        let end = whole.rfind("</MSG>").unwrap_or(whole.len());
        let lo = (end / 4).max(1);
        let mut cut = if lo < end {
            self.rng.random_range(lo..end)
        } else {
            lo
        };
        while cut > 0 && !whole.is_char_boundary(cut) {
            cut -= 1;
        }
        whole[..cut].to_string()
    }
}
