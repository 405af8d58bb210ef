//! Rendering shared by every type: the `<MSG>` envelope with its `<META>`, and a flight with
//! all its fields.

use chrono::NaiveDateTime;

use super::flights::{Flight, Val};
use super::generator::Generator;
use super::xml::Xml;
use super::{DATE_FORMAT, TIME_FORMAT};

/// What goes into `<META>`; fields are optional so malformed kinds can drop them.
pub(super) struct Meta {
    pub(super) sndr: String,
    pub(super) seqn: Option<u64>,
    pub(super) ddtm: Option<String>,
    pub(super) type_code: String,
    pub(super) styp: Option<String>,
}

impl Generator {
    pub(super) fn meta_for(
        &mut self,
        now: NaiveDateTime,
        type_code: &str,
        styp: Option<&str>,
    ) -> Meta {
        Meta {
            sndr: self.sender.clone(),
            seqn: Some(self.seq),
            ddtm: Some(now.format(TIME_FORMAT).to_string()),
            type_code: type_code.to_string(),
            styp: styp.map(str::to_string),
        }
    }

    pub(super) fn start(&mut self, meta: Option<&Meta>) -> Xml {
        let prolog = self.chance(0.75);
        let mut x = Xml::new(prolog);
        x.open("MSG");
        if let Some(m) = meta {
            x.open("META");
            x.text("SNDR", &m.sndr);
            x.text("RCVR", "MSGX");
            if let Some(seqn) = m.seqn {
                x.text("SEQN", &seqn.to_string());
            }
            if let Some(ddtm) = &m.ddtm {
                x.text("DDTM", ddtm);
            }
            x.text("TYPE", &m.type_code);
            if let Some(styp) = &m.styp {
                x.text("STYP", styp);
            }
            x.close("META");
        }
        x
    }

    pub(super) fn end(mut x: Xml) -> String {
        x.close("MSG");
        x.finish()
    }

    /// Every field of a flight, as schedules and ADFT carry them. `with_actuals` = false
    /// leaves ETOT/ATOT not carried (a schedule plans, it does not report).
    pub(super) fn full_flight(&mut self, x: &mut Xml, f: &Flight, with_actuals: bool, flid: bool) {
        let short = self.chance(0.5);
        x.open("FLIGHT");
        if flid {
            x.text("FLID", &f.flid);
        }
        x.text("AWCD", f.awcd);
        x.text("FLNO", &f.flno);
        x.text("FEXD", &f.fexd.format(DATE_FORMAT).to_string());
        x.text("FLIO", &f.flio.to_string());
        x.text("STOT", &f.stot.format(TIME_FORMAT).to_string());
        let (etot, atot) = if with_actuals {
            (Val::time(&f.etot), Val::time(&f.atot))
        } else {
            (Val::Empty, Val::Empty)
        };
        x.leaf("ETOT", &etot, short);
        x.leaf("ATOT", &atot, short);
        x.leaf("GATE", &Val::opt(&f.gate), short);
        x.leaf("STND", &Val::opt(&f.stnd), short);
        x.leaf("BLTS", &Val::opt(&f.blts), short);
        x.text("STAT", f.stat);
        x.leaf("MFID", &Val::opt(&f.mfid), short);
        x.close("FLIGHT");
    }
}
