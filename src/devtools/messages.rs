//! Realistic upstream (AODB/CIIMS) XML messages as SPEC Appendix A assumes them, for the
//! upstream simulator, tests and benchmarks.
//!
//! A [`Generator`] keeps a small pool of flights (masters, some with code-shares) so that
//! updates and deletes hit flights that earlier messages created, the way a real feed does.
//! It is deterministic for a seed: the same seed and the same sequence of calls give the same
//! messages byte for byte. The service never calls this module.

use std::fmt::Write as _;

use chrono::{Duration as ChronoDuration, NaiveDate, NaiveDateTime, Timelike};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The FLOP subtypes the generator draws from (the codec's default list of known subtypes).
pub const FLOP_SUBTYPES: [&str; 7] = ["UPDT", "ARRE", "DEPE", "GATE", "STND", "CANC", "DELY"];

/// Well-formed `TYPE` values that are not in Appendix A, so the codec must answer UNSUPPORTED.
pub const UNKNOWN_TYPES: [&str; 3] = ["XXXX", "BLLS", "CKIN"];

/// `DDTM` / `STOT` / `ETOT` / `ATOT` layout: local airport time, `YYYYMMDDHHMMSS`.
pub const TIME_FORMAT: &str = "%Y%m%d%H%M%S";

/// `FEXD` / schedule `DATE` layout: `YYYYMMDD`.
pub const DATE_FORMAT: &str = "%Y%m%d";

/// Pool size the generator keeps for "today" (enough variety, small enough to hit repeatedly).
const POOL_MIN: usize = 24;
/// Pool cap: the oldest flights are forgotten beyond it (they just stop receiving updates).
const POOL_MAX: usize = 400;
/// How many deleted ids are remembered for idempotent re-deletes.
const DELETED_MAX: usize = 64;
/// Flights a daily schedule download carries at least, beyond those already known.
const SCHEDULE_MIN: usize = 8;

/// How a [`MessageKind::Malformed`] message is broken (SPEC Appendix A, "MALFORMED").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MalformedKind {
    /// Not well-formed XML: a mismatched or missing end tag, or a raw `&` / `<` in text.
    NotWellFormed,
    /// Well-formed, but `<MSG>` has no `<META>`.
    NoMeta,
    /// Well-formed, `<META>` lacks the required `<SEQN>`.
    MissingSeqn,
    /// Well-formed, `<DDTM>` is present but not a valid `YYYYMMDDHHMMSS` time.
    BadDdtm,
    /// Well-formed, the flight (or FDEL body) carries no `<FLID>` at all.
    MissingFlid,
    /// A well-formed message cut off before its end (`</MSG>` never arrives).
    Truncated,
}

impl MalformedKind {
    /// Every malformed kind, for uniform drawing and exhaustive tests.
    pub const ALL: [MalformedKind; 6] = [
        MalformedKind::NotWellFormed,
        MalformedKind::NoMeta,
        MalformedKind::MissingSeqn,
        MalformedKind::BadDdtm,
        MalformedKind::MissingFlid,
        MalformedKind::Truncated,
    ];
}

/// What kind of message to render (SPEC Appendix A "Bodies by type").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageKind {
    /// `SCHD`/`DNLD`: the daily schedule download, several flights of one date.
    SchdDnld,
    /// `SCHD`/`RESP`: the answer to our schedule request, with `<RQID>`.
    SchdResp,
    /// `SCHD`/`ADFT`: one flight added to its day's schedule.
    SchdAdft,
    /// `FLOP`/subtype: a dynamic update of the carried fields of one flight. The subtype is
    /// normally one of [`FLOP_SUBTYPES`]; any other value renders an UNSUPPORTED subtype.
    Flop(&'static str),
    /// `FDEL`: delete one flight (a master's code-shares go with it downstream).
    Fdel,
    /// `ADFT`: a flight added outside the schedule.
    Adft,
    /// Well-formed, with a `TYPE` the codec does not know (one of [`UNKNOWN_TYPES`]).
    UnknownType,
    /// Broken in the named way; the codec must answer MALFORMED.
    Malformed(MalformedKind),
}

impl MessageKind {
    /// The META `TYPE` this kind carries when it is one of Appendix A's types.
    pub fn type_code(&self) -> Option<&'static str> {
        match self {
            MessageKind::SchdDnld | MessageKind::SchdResp | MessageKind::SchdAdft => Some("SCHD"),
            MessageKind::Flop(_) => Some("FLOP"),
            MessageKind::Fdel => Some("FDEL"),
            MessageKind::Adft => Some("ADFT"),
            MessageKind::UnknownType | MessageKind::Malformed(_) => None,
        }
    }

    /// The META `STYP` this kind carries (SCHD and FLOP only).
    pub fn subtype(&self) -> Option<&'static str> {
        match self {
            MessageKind::SchdDnld => Some("DNLD"),
            MessageKind::SchdResp => Some("RESP"),
            MessageKind::SchdAdft => Some("ADFT"),
            MessageKind::Flop(s) => Some(*s),
            _ => None,
        }
    }

    /// True for [`MessageKind::Malformed`].
    pub fn is_malformed(&self) -> bool {
        matches!(self, MessageKind::Malformed(_))
    }
}

/// Relative weights of the message kinds [`Generator::next_kind`] draws. Weights need not sum
/// to 1; negative or non-finite weights count as 0; all zero means "FLOP/UPDT only".
#[derive(Debug, Clone, PartialEq)]
pub struct Mix {
    /// Broken messages (uniform over [`MalformedKind::ALL`]); exercises DEAD(MALFORMED).
    pub malformed: f64,
    /// Well-formed messages of an unknown `TYPE`; exercises UNSUPPORTED.
    pub unknown_type: f64,
    /// Daily schedule downloads (large, rare).
    pub schd_dnld: f64,
    /// Schedule answers to our requests.
    pub schd_resp: f64,
    /// Single flights added to a day's schedule.
    pub schd_adft: f64,
    /// Dynamic flight updates: the bulk of an airport feed. The subtype is drawn from a fixed
    /// realistic distribution (mostly UPDT, then DELY, GATE, STND, ARRE, DEPE, rarely CANC).
    pub flop: f64,
    /// Flight deletes (some on masters with code-shares, some on already deleted flights).
    pub fdel: f64,
    /// Flights added outside the schedule.
    pub adft: f64,
}

impl Default for Mix {
    /// A realistic airport day: ~93% FLOP updates, a daily schedule rarely, ~2% malformed,
    /// ~1% unknown type.
    fn default() -> Self {
        Self {
            malformed: 0.02,
            unknown_type: 0.01,
            schd_dnld: 0.001,
            schd_resp: 0.004,
            schd_adft: 0.01,
            flop: 0.93,
            fdel: 0.01,
            adft: 0.015,
        }
    }
}

impl Mix {
    /// The default mix without malformed or unknown-type messages: every message is one the
    /// codec accepts, for runs that measure the happy path.
    pub fn well_formed() -> Self {
        Self {
            malformed: 0.0,
            unknown_type: 0.0,
            ..Self::default()
        }
    }
}

/// FLOP subtypes and their relative frequency in a busy airport feed.
const FLOP_WEIGHTS: [(&str, f64); 7] = [
    ("UPDT", 40.0),
    ("DELY", 15.0),
    ("GATE", 12.0),
    ("STND", 10.0),
    ("ARRE", 10.0),
    ("DEPE", 10.0),
    ("CANC", 3.0),
];

const DOMESTIC: [&str; 10] = ["CA", "MU", "CZ", "HU", "3U", "ZH", "FM", "MF", "KN", "SC"];
const PARTNERS: [&str; 8] = ["KE", "SQ", "NH", "LH", "AF", "DL", "QF", "CX"];

/// One flight as the generator remembers it (what upstream last said about it).
#[derive(Debug, Clone)]
struct Flight {
    flid: String,
    awcd: &'static str,
    flno: String,
    fexd: NaiveDate,
    /// `A` arrival or `D` departure.
    flio: char,
    stot: NaiveDateTime,
    etot: Option<NaiveDateTime>,
    atot: Option<NaiveDateTime>,
    gate: Option<String>,
    stnd: Option<String>,
    blts: Option<String>,
    stat: &'static str,
    /// Master flight id on a code-share; None on a master.
    mfid: Option<String>,
}

/// A field value as it appears in a message.
#[derive(Debug, Clone)]
enum Val {
    /// Carried with this text (escaped on output).
    Text(String),
    /// Empty element: not carried, the field keeps its value.
    Empty,
    /// `<X>-</X>`: clears the field.
    Clear,
    /// `<X xsi:nil="true"/>`: clears the field (namespace declared on the element).
    Nil,
}

impl Val {
    fn opt(v: &Option<String>) -> Val {
        v.as_ref().map_or(Val::Empty, |s| Val::Text(s.clone()))
    }

    fn time(t: &Option<NaiveDateTime>) -> Val {
        t.map_or(Val::Empty, |t| Val::Text(t.format(TIME_FORMAT).to_string()))
    }
}

/// Escapes text content and attribute values.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// A tiny indenting XML writer; all text goes through [`escape`].
struct Xml {
    out: String,
    depth: usize,
}

impl Xml {
    fn new(prolog: bool) -> Self {
        let mut out = String::with_capacity(1024);
        if prolog {
            out.push_str("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        }
        Self { out, depth: 0 }
    }

    fn indent(&mut self) {
        for _ in 0..self.depth {
            self.out.push_str("  ");
        }
    }

    fn open(&mut self, tag: &str) {
        self.indent();
        let _ = writeln!(self.out, "<{tag}>");
        self.depth += 1;
    }

    fn close(&mut self, tag: &str) {
        self.depth = self.depth.saturating_sub(1);
        self.indent();
        let _ = writeln!(self.out, "</{tag}>");
    }

    fn text(&mut self, tag: &str, text: &str) {
        self.indent();
        let _ = writeln!(self.out, "<{tag}>{}</{tag}>", escape(text));
    }

    /// Writes text verbatim, unescaped: only for deliberately broken messages.
    fn raw_line(&mut self, line: &str) {
        self.indent();
        self.out.push_str(line);
        self.out.push('\n');
    }

    fn leaf(&mut self, tag: &str, val: &Val, short_empty: bool) {
        match val {
            Val::Text(t) => self.text(tag, t),
            Val::Empty if short_empty => self.raw_line(&format!("<{tag}/>")),
            Val::Empty => self.raw_line(&format!("<{tag}></{tag}>")),
            Val::Clear => self.text(tag, "-"),
            Val::Nil => self.raw_line(&format!(
                "<{tag} xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\" xsi:nil=\"true\"/>"
            )),
        }
    }

    fn finish(self) -> String {
        self.out
    }
}

/// What goes into `<META>`; fields are optional so malformed kinds can drop them.
struct Meta {
    sndr: String,
    seqn: Option<u64>,
    ddtm: Option<String>,
    type_code: String,
    styp: Option<String>,
}

/// Deterministic generator of upstream messages (see the module docs).
#[derive(Debug, Clone)]
pub struct Generator {
    /// Every random decision comes from here, so a seed reproduces a run.
    rng: StdRng,
    /// Last `SEQN` issued; incremented for every message (the sender numbers all it sends).
    seq: u64,
    /// `SNDR` of every message; identity is sender + type + subtype + sequence.
    sender: String,
    /// Known flights (masters and code-shares), oldest first, so updates and deletes hit them.
    flights: Vec<Flight>,
    /// Recently deleted ids, for idempotent re-deletes of absent flights.
    deleted: Vec<String>,
    /// Next `FLID` to hand out; ids are never reused.
    next_flid: u64,
    /// Next `RQID` for `SCHD`/`RESP`.
    next_rqid: u64,
}

impl Generator {
    /// A generator sending as `AODB`, its sequence and flight ids derived from `seed`.
    pub fn new(seed: u64) -> Self {
        Self::with_sender(seed, "AODB")
    }

    /// A generator sending as `sender` (e.g. `CIIMS`).
    pub fn with_sender(seed: u64, sender: impl Into<String>) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        // Seed-derived starting points keep runs with different seeds from colliding on
        // identity (sender + type + subtype + sequence) in the same inbox.
        let seq = rng.random_range(100_000..900_000_000u64);
        let next_flid = rng.random_range(10_000_000..90_000_000u64);
        let next_rqid = rng.random_range(1_000..900_000u64);
        Self {
            rng,
            seq,
            sender: sender.into(),
            flights: Vec::new(),
            deleted: Vec::new(),
            next_flid,
            next_rqid,
        }
    }

    /// The `SNDR` this generator writes.
    pub fn sender(&self) -> &str {
        &self.sender
    }

    /// The `SEQN` of the last rendered message (the next one gets a larger number).
    pub fn last_seqn(&self) -> u64 {
        self.seq
    }

    /// Draws the next message kind from `mix`.
    pub fn next_kind(&mut self, mix: &Mix) -> MessageKind {
        let w = |x: f64| if x.is_finite() && x > 0.0 { x } else { 0.0 };
        let table = [
            (w(mix.malformed), 0u8),
            (w(mix.unknown_type), 1),
            (w(mix.schd_dnld), 2),
            (w(mix.schd_resp), 3),
            (w(mix.schd_adft), 4),
            (w(mix.flop), 5),
            (w(mix.fdel), 6),
            (w(mix.adft), 7),
        ];
        let total: f64 = table.iter().map(|(x, _)| x).sum();
        if total <= 0.0 {
            return MessageKind::Flop("UPDT");
        }
        let mut r = self.rng.random::<f64>() * total;
        let mut pick = 5;
        for (weight, id) in table {
            if weight > 0.0 && r < weight {
                pick = id;
                break;
            }
            r -= weight;
        }
        match pick {
            0 => {
                let i = self.rng.random_range(0..MalformedKind::ALL.len());
                MessageKind::Malformed(MalformedKind::ALL[i])
            }
            1 => MessageKind::UnknownType,
            2 => MessageKind::SchdDnld,
            3 => MessageKind::SchdResp,
            4 => MessageKind::SchdAdft,
            6 => MessageKind::Fdel,
            7 => MessageKind::Adft,
            _ => MessageKind::Flop(self.flop_subtype()),
        }
    }

    /// Draws and renders one message: the kind and its XML text.
    pub fn next_message(&mut self, mix: &Mix, now_local: NaiveDateTime) -> (MessageKind, String) {
        let kind = self.next_kind(mix);
        let text = self.render(kind, now_local);
        (kind, text)
    }

    /// Renders one UTF-8 XML message of `kind`, sent at `now_local` (airport local time).
    /// Well-formed kinds update the flight pool the way the downstream state would change.
    pub fn render(&mut self, kind: MessageKind, now_local: NaiveDateTime) -> String {
        let now = now_local.with_nanosecond(0).unwrap_or(now_local);
        self.top_up(now);
        self.seq += 1;
        match kind {
            MessageKind::SchdDnld => self.render_schedule(now, false, 0),
            MessageKind::SchdResp => self.render_schedule(now, true, 0),
            MessageKind::SchdAdft => self.render_add(now, true),
            MessageKind::Flop(styp) => self.render_flop(now, styp),
            MessageKind::Fdel => self.render_fdel(now),
            MessageKind::Adft => self.render_add(now, false),
            MessageKind::UnknownType => self.render_unknown(now),
            MessageKind::Malformed(m) => self.render_malformed(now, m),
        }
    }

    /// Renders a well-formed `SCHD`/`DNLD` of at least `min_bytes` (e.g. 1 MiB): a big
    /// airport's full-day schedule, to exercise large `LONGTEXT` rows. The extra flights are
    /// not kept in the pool.
    pub fn render_huge(&mut self, now_local: NaiveDateTime, min_bytes: usize) -> String {
        let now = now_local.with_nanosecond(0).unwrap_or(now_local);
        self.top_up(now);
        self.seq += 1;
        self.render_schedule(now, false, min_bytes)
    }

    // ---- drawing helpers -------------------------------------------------------------------

    fn flop_subtype(&mut self) -> &'static str {
        let total: f64 = FLOP_WEIGHTS.iter().map(|(_, w)| w).sum();
        let mut r = self.rng.random::<f64>() * total;
        for (s, w) in FLOP_WEIGHTS {
            if r < w {
                return s;
            }
            r -= w;
        }
        "UPDT"
    }

    fn chance(&mut self, p: f64) -> bool {
        self.rng.random_bool(p.clamp(0.0, 1.0))
    }

    fn pick_str<const N: usize>(&mut self, from: [&'static str; N]) -> &'static str {
        from[self.rng.random_range(0..N)]
    }

    /// A random index among flights matching `pred`.
    fn pick(&mut self, pred: impl Fn(&Flight) -> bool) -> Option<usize> {
        let idx: Vec<usize> = (0..self.flights.len())
            .filter(|&i| pred(&self.flights[i]))
            .collect();
        if idx.is_empty() {
            None
        } else {
            Some(idx[self.rng.random_range(0..idx.len())])
        }
    }

    fn new_flid(&mut self) -> String {
        self.next_flid += 1;
        self.next_flid.to_string()
    }

    fn gate(&mut self) -> String {
        let pier = self.pick_str(["A", "B", "C", "D"]);
        format!("{pier}{}", self.rng.random_range(1..40))
    }

    fn stand(&mut self) -> String {
        self.rng.random_range(101..330).to_string()
    }

    fn belt(&mut self) -> String {
        format!("{:02}", self.rng.random_range(1..24))
    }

    /// A new master flight on `date` (not added to the pool).
    fn new_master(&mut self, date: NaiveDate) -> Flight {
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
    fn code_share(&mut self, master: &Flight) -> Flight {
        let awcd = self.pick_str(PARTNERS);
        let mut f = master.clone();
        f.flid = self.new_flid();
        f.awcd = awcd;
        f.flno = format!("{awcd}{}", self.rng.random_range(100..9899));
        f.mfid = Some(master.flid.clone());
        f
    }

    /// A master and, for about a third of them, one or two code-shares.
    fn new_group(&mut self, date: NaiveDate) -> Vec<Flight> {
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
    fn top_up(&mut self, now: NaiveDateTime) {
        let today = now.date();
        let yesterday = today.pred_opt().unwrap_or(today);
        self.flights.retain(|f| f.fexd >= yesterday);
        while self.flights.iter().filter(|f| f.fexd >= today).count() < POOL_MIN {
            let group = self.new_group(today);
            self.flights.extend(group);
        }
        self.trim();
    }

    fn trim(&mut self) {
        if self.flights.len() > POOL_MAX {
            let excess = self.flights.len() - POOL_MAX;
            self.flights.drain(..excess);
        }
    }

    fn remember_deleted(&mut self, flid: String) {
        self.deleted.push(flid);
        if self.deleted.len() > DELETED_MAX {
            self.deleted.remove(0);
        }
    }

    // ---- rendering -------------------------------------------------------------------------

    fn meta_for(&mut self, now: NaiveDateTime, type_code: &str, styp: Option<&str>) -> Meta {
        Meta {
            sndr: self.sender.clone(),
            seqn: Some(self.seq),
            ddtm: Some(now.format(TIME_FORMAT).to_string()),
            type_code: type_code.to_string(),
            styp: styp.map(str::to_string),
        }
    }

    fn start(&mut self, meta: Option<&Meta>) -> Xml {
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

    fn end(mut x: Xml) -> String {
        x.close("MSG");
        x.finish()
    }

    /// Every field of a flight, as schedules and ADFT carry them. `with_actuals` = false
    /// leaves ETOT/ATOT not carried (a schedule plans, it does not report).
    fn full_flight(&mut self, x: &mut Xml, f: &Flight, with_actuals: bool, flid: bool) {
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

    /// `SCHD`/`DNLD` (or `RESP` with `<RQID>`). `min_bytes` > 0 pads with transient flights.
    fn render_schedule(&mut self, now: NaiveDateTime, resp: bool, min_bytes: usize) -> String {
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
    fn render_add(&mut self, now: NaiveDateTime, in_schedule: bool) -> String {
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
                let clear = if self.chance(0.8) {
                    Val::Clear
                } else {
                    Val::Nil
                };
                fields.push(("ETOT", clear));
            }
            "DELY" => {
                let etot = stot + ChronoDuration::minutes(self.rng.random_range(3..36) * 5);
                self.flights[i].etot = Some(etot);
                self.flights[i].stat = "DEL";
                fields.push(("ETOT", Val::Text(etot.format(TIME_FORMAT).to_string())));
                fields.push(("STAT", Val::Text("DEL".to_string())));
            }
            _ => {
                // UPDT (and unknown subtypes): an estimate, sometimes a resource, sometimes a
                // correction that clears the estimate.
                if self.chance(0.1) && self.flights[i].etot.is_some() {
                    self.flights[i].etot = None;
                    let clear = if self.chance(0.8) {
                        Val::Clear
                    } else {
                        Val::Nil
                    };
                    fields.push(("ETOT", clear));
                } else {
                    let etot = stot + ChronoDuration::minutes(self.rng.random_range(-3..12) * 5);
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
        }
        fields
    }

    fn render_flop(&mut self, now: NaiveDateTime, styp: &'static str) -> String {
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

    fn render_fdel(&mut self, now: NaiveDateTime) -> String {
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

    fn render_unknown(&mut self, now: NaiveDateTime) -> String {
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

    fn render_malformed(&mut self, now: NaiveDateTime, kind: MalformedKind) -> String {
        match kind {
            MalformedKind::NotWellFormed => {
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
            MalformedKind::MissingFlid => match self.rng.random_range(0..3) {
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
            },
            MalformedKind::Truncated => {
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> NaiveDateTime {
        NaiveDate::from_ymd_opt(2026, 11, 30)
            .and_then(|d| d.and_hms_opt(9, 30, 0))
            .expect("valid time")
    }

    /// Minimal well-formedness check: balanced, matching tags, one root, valid entities, no
    /// raw `<` in text. Enough for what the generator writes (no CDATA, comments or DTDs).
    fn well_formed(s: &str) -> Result<(), String> {
        let b = s.as_bytes();
        let mut i = 0;
        let mut stack: Vec<String> = Vec::new();
        let mut roots = 0;
        while i < b.len() {
            match b[i] {
                b'<' => {
                    let close = s[i..].find('>').ok_or("unterminated tag")? + i;
                    let inner = &s[i + 1..close];
                    if let Some(pi) = inner.strip_prefix('?') {
                        if !pi.ends_with('?') || i != 0 {
                            return Err("bad processing instruction".into());
                        }
                    } else if let Some(name) = inner.strip_prefix('/') {
                        let open = stack.pop().ok_or("end tag without start")?;
                        if open != name.trim() {
                            return Err(format!("</{name}> closes <{open}>"));
                        }
                    } else {
                        let self_closing = inner.ends_with('/');
                        let body = inner.trim_end_matches('/');
                        let name = body.split_whitespace().next().unwrap_or("");
                        let valid = name
                            .chars()
                            .next()
                            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                            && name
                                .chars()
                                .all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c));
                        if !valid {
                            return Err(format!("bad tag <{inner}>"));
                        }
                        if stack.is_empty() {
                            roots += 1;
                        }
                        if !self_closing {
                            stack.push(name.to_string());
                        }
                    }
                    i = close + 1;
                }
                b'&' => {
                    let rest = &s[i..];
                    let ok = ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"]
                        .iter()
                        .any(|e| rest.starts_with(e));
                    if !ok {
                        return Err("raw &".into());
                    }
                    i += 1;
                }
                c => {
                    if stack.is_empty() && !c.is_ascii_whitespace() {
                        return Err("text outside the root".into());
                    }
                    i += 1;
                }
            }
        }
        if !stack.is_empty() {
            return Err(format!("unclosed {stack:?}"));
        }
        if roots != 1 {
            return Err(format!("{roots} roots"));
        }
        Ok(())
    }

    /// Text of the first `<tag>…</tag>`.
    fn text_of<'a>(s: &'a str, tag: &str) -> Option<&'a str> {
        let open = format!("<{tag}>");
        let start = s.find(&open)? + open.len();
        let end = s[start..].find(&format!("</{tag}>"))? + start;
        Some(&s[start..end])
    }

    fn well_formed_kinds() -> Vec<MessageKind> {
        let mut v = vec![
            MessageKind::SchdDnld,
            MessageKind::SchdResp,
            MessageKind::SchdAdft,
            MessageKind::Fdel,
            MessageKind::Adft,
            MessageKind::UnknownType,
        ];
        v.extend(FLOP_SUBTYPES.into_iter().map(MessageKind::Flop));
        v
    }

    #[test]
    fn well_formed_kinds_have_msg_and_meta() {
        let mut g = Generator::new(7);
        for _ in 0..20 {
            for kind in well_formed_kinds() {
                let m = g.render(kind, now());
                well_formed(&m).unwrap_or_else(|e| panic!("{kind:?}: {e}\n{m}"));
                assert!(m.contains("<MSG>"), "{kind:?}");
                assert!(m.trim_end().ends_with("</MSG>"), "{kind:?}");
                let meta = text_of(&m, "META").expect("META");
                assert_eq!(text_of(meta, "SNDR"), Some("AODB"));
                assert_eq!(text_of(meta, "RCVR"), Some("MSGX"));
                assert!(text_of(meta, "SEQN").expect("SEQN").parse::<u64>().is_ok());
                assert_eq!(text_of(meta, "DDTM"), Some("20261130093000"));
                let ty = text_of(meta, "TYPE").expect("TYPE");
                match kind.type_code() {
                    Some(t) => assert_eq!(ty, t),
                    None => assert!(UNKNOWN_TYPES.contains(&ty)),
                }
                if let Some(st) = kind.subtype() {
                    assert_eq!(text_of(meta, "STYP"), Some(st), "{kind:?}");
                }
                // The body element of the type follows META.
                assert!(m.contains(&format!("<{ty}>")), "{kind:?}: {m}");
            }
        }
    }

    #[test]
    fn bodies_follow_appendix_a() {
        let mut g = Generator::new(11);
        let (mut masters, mut shares) = (false, false);
        for _ in 0..5 {
            let dnld = g.render(MessageKind::SchdDnld, now());
            let schd = text_of(&dnld, "SCHD").expect("SCHD");
            assert!(text_of(schd, "DATE").is_some());
            assert!(schd.matches("<FLIGHT>").count() >= 3, "several flights");
            masters |= schd.contains("<MFID/>") || schd.contains("<MFID></MFID>");
            shares |= schd
                .split("<MFID>")
                .skip(1)
                .any(|r| !r.starts_with("</MFID>"));
        }
        assert!(
            masters && shares,
            "masters with empty MFID, code-shares carrying one"
        );
        let resp = g.render(MessageKind::SchdResp, now());
        assert!(text_of(&resp, "RQID").is_some());
        assert!(text_of(&resp, "FLIGHTS").is_some());
        let adft = g.render(MessageKind::SchdAdft, now());
        assert!(text_of(&adft, "SCHD").is_some_and(|b| b.contains("<FLIGHT>")));
        assert!(!adft.contains("<FLIGHTS>"));
        let fdel = g.render(MessageKind::Fdel, now());
        assert!(text_of(&fdel, "FDEL")
            .and_then(|b| text_of(b, "FLID"))
            .is_some());
        let a = g.render(MessageKind::Adft, now());
        assert!(text_of(&a, "ADFT")
            .and_then(|b| text_of(b, "FLID"))
            .is_some());
        for s in FLOP_SUBTYPES {
            let m = g.render(MessageKind::Flop(s), now());
            let flight = text_of(&m, "FLOP")
                .and_then(|b| text_of(b, "FLIGHT"))
                .expect("FLIGHT");
            assert!(
                text_of(flight, "FLID").is_some_and(|f| !f.is_empty()),
                "{s}"
            );
        }
    }

    #[test]
    fn flop_uses_not_carried_and_clear() {
        let mut g = Generator::new(3);
        let mut empty = false;
        let mut clear = false;
        for _ in 0..400 {
            let m = g.render(MessageKind::Flop("UPDT"), now());
            let m2 = g.render(MessageKind::Flop("CANC"), now());
            for s in [&m, &m2] {
                empty |= s.contains("/>") && !s.contains("xsi:nil") || s.contains("></");
                clear |= s.contains(">-</");
            }
        }
        assert!(empty && clear);
    }

    #[test]
    fn seqn_increases() {
        let mut g = Generator::new(1);
        let mix = Mix::well_formed();
        let mut last = 0;
        for _ in 0..500 {
            let (_, m) = g.next_message(&mix, now());
            let seqn: u64 = text_of(&m, "SEQN").expect("SEQN").parse().expect("integer");
            assert!(seqn > last);
            assert_eq!(seqn, g.last_seqn());
            last = seqn;
        }
    }

    #[test]
    fn malformed_kinds_lack_what_they_claim() {
        let mut g = Generator::new(5);
        for _ in 0..60 {
            for kind in MalformedKind::ALL {
                let m = g.render(MessageKind::Malformed(kind), now());
                match kind {
                    MalformedKind::NotWellFormed => {
                        assert!(well_formed(&m).is_err(), "{m}");
                        assert!(m.contains("<META>"), "only the XML is broken");
                    }
                    MalformedKind::Truncated => {
                        assert!(well_formed(&m).is_err(), "{m}");
                        assert!(!m.contains("</MSG>"));
                        assert!(!m.is_empty());
                    }
                    MalformedKind::NoMeta => {
                        well_formed(&m).expect("well-formed");
                        assert!(!m.contains("<META"));
                        assert!(m.contains("<FLOP>"));
                    }
                    MalformedKind::MissingSeqn => {
                        well_formed(&m).expect("well-formed");
                        let meta = text_of(&m, "META").expect("META");
                        assert!(!meta.contains("SEQN"));
                        assert!(text_of(meta, "DDTM").is_some());
                    }
                    MalformedKind::BadDdtm => {
                        well_formed(&m).expect("well-formed");
                        let ddtm = text_of(&m, "DDTM").expect("DDTM present");
                        assert!(
                            NaiveDateTime::parse_from_str(ddtm, TIME_FORMAT).is_err(),
                            "{ddtm}"
                        );
                    }
                    MalformedKind::MissingFlid => {
                        well_formed(&m).expect("well-formed");
                        assert!(!m.contains("FLID"), "{m}");
                        assert!(text_of(&m, "SEQN").is_some());
                    }
                }
            }
        }
    }

    #[test]
    fn fdel_hits_masters_with_code_shares_and_cascades() {
        let mut g = Generator::new(9);
        let mut master_deletes = 0;
        let mut absent_deletes = 0;
        for _ in 0..300 {
            let before = g.flights.clone();
            let m = g.render(MessageKind::Fdel, now());
            let flid = text_of(&m, "FLID").expect("FLID").to_string();
            let known = before.iter().any(|f| f.flid == flid);
            if before
                .iter()
                .any(|f| f.mfid.as_deref() == Some(flid.as_str()))
            {
                master_deletes += 1;
            }
            if !known {
                absent_deletes += 1;
            }
            assert!(g
                .flights
                .iter()
                .all(|f| f.flid != flid && f.mfid.as_deref() != Some(flid.as_str())));
            // Keep masters with code-shares coming.
            let _ = g.render(MessageKind::SchdDnld, now());
        }
        assert!(master_deletes > 20, "{master_deletes}");
        assert!(absent_deletes > 5, "{absent_deletes}");
    }

    #[test]
    fn deterministic_for_a_seed() {
        let run = |seed| {
            let mut g = Generator::new(seed);
            let mix = Mix::default();
            (0..300)
                .map(|_| g.next_message(&mix, now()))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
    }

    #[test]
    fn default_mix_is_realistic() {
        let mut g = Generator::new(2);
        let mix = Mix::default();
        let n = 20_000;
        let kinds: Vec<_> = (0..n).map(|_| g.next_kind(&mix)).collect();
        let count = |p: &dyn Fn(&MessageKind) -> bool| kinds.iter().filter(|k| p(k)).count();
        let flop = count(&|k| matches!(k, MessageKind::Flop(_)));
        let malformed = count(&|k| k.is_malformed());
        let unknown = count(&|k| *k == MessageKind::UnknownType);
        assert!(flop > n * 88 / 100, "{flop}");
        assert!((n / 100..n * 3 / 100).contains(&malformed), "{malformed}");
        assert!((n / 200..n * 2 / 100).contains(&unknown), "{unknown}");
        assert!(count(&|k| *k == MessageKind::Flop("UPDT")) > flop / 3);
        let zero = Mix {
            malformed: 0.0,
            unknown_type: 0.0,
            schd_dnld: 0.0,
            schd_resp: 0.0,
            schd_adft: 0.0,
            flop: 0.0,
            fdel: -1.0,
            adft: f64::NAN,
        };
        assert_eq!(g.next_kind(&zero), MessageKind::Flop("UPDT"));
        let wf = Mix::well_formed();
        assert!((0..2000).all(|_| {
            let k = g.next_kind(&wf);
            !k.is_malformed() && k != MessageKind::UnknownType
        }));
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(
            escape("A1&A2 <x> \"q\" 'a'"),
            "A1&amp;A2 &lt;x&gt; &quot;q&quot; &apos;a&apos;"
        );
        let mut g = Generator::new(4);
        let mut escaped = false;
        for _ in 0..2000 {
            let m = g.render(MessageKind::Flop("GATE"), now());
            well_formed(&m).unwrap_or_else(|e| panic!("{e}\n{m}"));
            escaped |= m.contains("&amp;");
        }
        assert!(escaped, "a gate with & shows up escaped");
    }

    #[test]
    fn huge_schedule_is_large_and_well_formed() {
        let mut g = Generator::new(6);
        let m = g.render_huge(now(), 1 << 20);
        assert!(m.len() >= 1 << 20);
        well_formed(&m).expect("well-formed");
        assert!(g.flights.len() <= POOL_MAX);
        assert_eq!(text_of(&m, "STYP"), Some("DNLD"));
    }

    #[test]
    fn zz_print_samples() {
        let mut g = Generator::new(12);
        for k in [MessageKind::Flop("UPDT"), MessageKind::Flop("CANC"), MessageKind::Fdel, MessageKind::SchdResp, MessageKind::Malformed(MalformedKind::Truncated)] {
            println!("{}\n-----", g.render(k, now()));
        }
    }

    #[test]
    fn unsupported_flop_subtype_renders() {
        let mut g = Generator::with_sender(8, "CIIMS");
        let m = g.render(MessageKind::Flop("ZZZZ"), now());
        well_formed(&m).expect("well-formed");
        assert_eq!(text_of(&m, "STYP"), Some("ZZZZ"));
        assert_eq!(text_of(&m, "SNDR"), Some("CIIMS"));
    }
}
