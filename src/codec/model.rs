//! What a decoded upstream message is, independent of its wire format (the real SIS format can
//! replace the XML codec without touching the rules that consume this).

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate, Utc};

/// The META header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    /// Sender system (`SNDR`), e.g. AODB, CIIMS.
    pub sender: String,
    /// Receiver (`RCVR`), optional.
    pub receiver: Option<String>,
    /// Sender's sequence number (`SEQN`).
    pub seqn: i64,
    /// Send time (`DDTM`, airport local time converted to UTC): the message's business time,
    /// used for field versions.
    pub sent_at: DateTime<Utc>,
    /// `TYPE`: SCHD, FLOP, FDEL, ADFT.
    pub msg_type: String,
    /// `STYP`: required for SCHD and FLOP; empty string when absent.
    pub subtype: String,
}

/// A flight field a message can carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Field {
    /// Airline code.
    Awcd,
    /// Flight number.
    Flno,
    /// Execution (schedule) date, `YYYYMMDD`.
    Fexd,
    /// `A` arrival / `D` departure.
    Flio,
    /// Scheduled time.
    Stot,
    /// Estimated time.
    Etot,
    /// Actual time.
    Atot,
    /// Gate.
    Gate,
    /// Stand.
    Stnd,
    /// Baggage belt.
    Blts,
    /// Status code.
    Stat,
    /// Master flight id (set on a code-share).
    Mfid,
}

impl Field {
    /// Every field, in document order.
    pub const ALL: [Field; 12] = [
        Field::Awcd,
        Field::Flno,
        Field::Fexd,
        Field::Flio,
        Field::Stot,
        Field::Etot,
        Field::Atot,
        Field::Gate,
        Field::Stnd,
        Field::Blts,
        Field::Stat,
        Field::Mfid,
    ];

    /// The XML element name.
    pub fn tag(self) -> &'static str {
        match self {
            Field::Awcd => "AWCD",
            Field::Flno => "FLNO",
            Field::Fexd => "FEXD",
            Field::Flio => "FLIO",
            Field::Stot => "STOT",
            Field::Etot => "ETOT",
            Field::Atot => "ATOT",
            Field::Gate => "GATE",
            Field::Stnd => "STND",
            Field::Blts => "BLTS",
            Field::Stat => "STAT",
            Field::Mfid => "MFID",
        }
    }

    /// The field for an element name.
    pub fn from_tag(tag: &str) -> Option<Field> {
        Field::ALL.into_iter().find(|f| f.tag() == tag)
    }
}

/// What a message says about one field. A field not in the map is "not carried".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldValue {
    /// Set to this (normalised text; times stay `YYYYMMDDHHMMSS` local as sent).
    Set(String),
    /// Cleared (`<X xsi:nil="true"/>` or `<X>-</X>`).
    Clear,
}

/// One `<FLIGHT>` element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlightRecord {
    /// `FLID`, the flight's identity.
    pub flid: String,
    /// Carried fields (absent = not carried, keep the stored value).
    pub fields: BTreeMap<Field, FieldValue>,
}

/// Which schedule message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScheduleKind {
    /// `SCHD/DNLD`: the daily schedule download.
    Download,
    /// `SCHD/RESP`: the answer to our schedule request.
    Response,
}

/// The body by type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// `SCHD/DNLD` or `SCHD/RESP`: a day's schedule, merged over the current state.
    Schedule {
        /// Download or response.
        kind: ScheduleKind,
        /// The schedule day.
        date: NaiveDate,
        /// The request id a response answers.
        request_id: Option<String>,
        /// The flights.
        flights: Vec<FlightRecord>,
    },
    /// `SCHD/ADFT`: adds one flight to its day's schedule.
    ScheduleAdd(FlightRecord),
    /// `FLOP/<subtype>`: updates carried fields (creates an unknown flight).
    FlightUpdate(FlightRecord),
    /// `FDEL`: deletes a flight (and a master's code-shares).
    FlightDelete {
        /// The flight to delete.
        flid: String,
    },
    /// `ADFT`: adds a flight outside the schedule.
    AddFlight(FlightRecord),
}

/// A decoded message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedMessage {
    /// Header.
    pub meta: Meta,
    /// Body.
    pub body: Body,
}

impl DecodedMessage {
    /// Business identity `SNDR|TYPE|STYP|SEQN`, with the send date appended when
    /// `with_date` (Q11: upstream may reset SEQN periodically).
    pub fn identity_key(&self, with_date: bool, tz: chrono_tz::Tz) -> String {
        let m = &self.meta;
        let base = format!("{}|{}|{}|{}", m.sender, m.msg_type, m.subtype, m.seqn);
        if with_date {
            format!("{base}|{}", m.sent_at.with_timezone(&tz).format("%Y%m%d"))
        } else {
            base
        }
    }
}
