//! What to render: the [`MessageKind`]s (with the [`MalformedKind`]s of broken messages) and
//! the [`Mix`] of them a [`Generator`](super::Generator) draws from.

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
    ///
    /// [`FLOP_SUBTYPES`]: super::FLOP_SUBTYPES
    Flop(&'static str),
    /// `FDEL`: delete one flight (a master's code-shares go with it downstream).
    Fdel,
    /// `ADFT`: a flight added outside the schedule.
    Adft,
    /// Well-formed, with a `TYPE` the codec does not know (one of [`UNKNOWN_TYPES`]).
    ///
    /// [`UNKNOWN_TYPES`]: super::UNKNOWN_TYPES
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
    // Tests only: production never asks.
    #[cfg(test)]
    pub fn is_malformed(&self) -> bool {
        matches!(self, MessageKind::Malformed(_))
    }

    /// Every kind but [`MessageKind::Malformed`], FLOP once with each of the
    /// [`FLOP_SUBTYPES`]: the well-formed kinds exhaustive tests render.
    ///
    /// [`FLOP_SUBTYPES`]: super::FLOP_SUBTYPES
    // Tests only: production never asks.
    #[cfg(test)]
    pub fn all_but_malformed() -> Vec<MessageKind> {
        let mut kinds = vec![
            MessageKind::SchdDnld,
            MessageKind::SchdResp,
            MessageKind::SchdAdft,
            MessageKind::Fdel,
            MessageKind::Adft,
            MessageKind::UnknownType,
        ];
        kinds.extend(super::FLOP_SUBTYPES.map(MessageKind::Flop));
        kinds
    }
}

/// Relative weights of the message kinds [`Generator::next_kind`] draws. Weights need not sum
/// to 1; negative or non-finite weights count as 0; all zero means "FLOP/UPDT only".
///
/// [`Generator::next_kind`]: super::Generator::next_kind
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
