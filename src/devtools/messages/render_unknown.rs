//! Well-formed messages of a `TYPE` the codec does not know (UNSUPPORTED).

use chrono::NaiveDateTime;

use super::generator::Generator;
use super::UNKNOWN_TYPES;

impl Generator {
    pub(super) fn render_unknown(&mut self, now: NaiveDateTime) -> String {
        let type_code = self.pick_str(UNKNOWN_TYPES);
        let styp = self.chance(0.5).then_some("INFO");
        let f = match self.pick(|_| true) {
            Some(i) => self.flights[i].clone(),
            None => self.new_master(now.date()),
        };
        let meta = self.meta_for(now, type_code, styp);
        let mut x = self.start(Some(&meta));
        x.open(type_code);
        self.full_flight(&mut x, &f, true, true);
        x.close(type_code);
        Self::end(x)
    }
}
