//! The upstream messages a plan writes, as data: what the plan file stores for each inbox row
//! the test writes itself, how the row's text is rendered (SPEC Appendix A), and what the
//! reference model reads from it (identity, message time, the fields it carries).

use serde::{Deserialize, Serialize};

/// One message as a plan stores it. `n` is the sender's sequence number (`SEQN`); the send
/// time `DDTM` is 2026-11-30 08:00:00 plus `n` seconds, so a later `n` is a later message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "m", rename_all = "snake_case")]
pub enum Msg {
    /// `FLOP`/`UPDT` carrying `GATE` (and `STND` when given).
    Flop {
        n: i64,
        flid: String,
        gate: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stnd: Option<String>,
    },
    /// `FDEL` of a flight.
    Fdel { n: i64, flid: String },
    /// A well-formed message of a type nobody knows (UNSUPPORTED, retried until poisoned).
    Unknown { n: i64 },
    /// A truncated message (not well-formed XML: MALFORMED).
    Malformed { n: i64 },
}

/// What the model needs of a decodable message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// Fields to set on the flight, by tag.
    Update(Vec<(&'static str, String)>),
    /// Delete the flight.
    Delete,
}

impl Msg {
    /// The sequence number.
    pub fn n(&self) -> i64 {
        match self {
            Msg::Flop { n, .. }
            | Msg::Fdel { n, .. }
            | Msg::Unknown { n }
            | Msg::Malformed { n } => *n,
        }
    }

    /// The message time as `YYYYMMDDHHMMSS` (orders like `n`).
    pub fn ddtm(&self) -> String {
        let s = 8 * 3600 + self.n();
        format!("20261130{:02}{:02}{:02}", s / 3600, (s / 60) % 60, s % 60)
    }

    /// SPEC §12: identity = sender + type + subtype + sequence; only a decoded message has one.
    pub fn identity(&self) -> Option<String> {
        match self {
            Msg::Flop { n, .. } => Some(format!("AODB|FLOP|UPDT|{n}")),
            Msg::Fdel { n, .. } => Some(format!("AODB|FDEL||{n}")),
            _ => None,
        }
    }

    /// The flight and what the message does to it (None: not decodable).
    pub fn body(&self) -> Option<(&str, Body)> {
        match self {
            Msg::Flop {
                flid, gate, stnd, ..
            } => {
                let mut f = vec![("GATE", gate.clone())];
                if let Some(s) = stnd {
                    f.push(("STND", s.clone()));
                }
                Some((flid, Body::Update(f)))
            }
            Msg::Fdel { flid, .. } => Some((flid, Body::Delete)),
            _ => None,
        }
    }

    /// The row's text (SPEC Appendix A).
    pub fn render(&self) -> String {
        let meta = |ty: &str, styp: &str| {
            let styp = if styp.is_empty() {
                String::new()
            } else {
                format!("<STYP>{styp}</STYP>")
            };
            format!(
                "<META><SNDR>AODB</SNDR><RCVR>MSGX</RCVR><SEQN>{}</SEQN><DDTM>{}</DDTM>\
                 <TYPE>{ty}</TYPE>{styp}</META>",
                self.n(),
                self.ddtm()
            )
        };
        match self {
            Msg::Flop {
                flid, gate, stnd, ..
            } => {
                let stnd = stnd
                    .as_ref()
                    .map(|s| format!("<STND>{s}</STND>"))
                    .unwrap_or_default();
                format!(
                    "<MSG>{}<FLOP><FLIGHT><FLID>{flid}</FLID><GATE>{gate}</GATE>{stnd}\
                     </FLIGHT></FLOP></MSG>",
                    meta("FLOP", "UPDT")
                )
            }
            Msg::Fdel { flid, .. } => {
                format!(
                    "<MSG>{}<FDEL><FLID>{flid}</FLID></FDEL></MSG>",
                    meta("FDEL", "")
                )
            }
            Msg::Unknown { .. } => format!("<MSG>{}<XXXX/></MSG>", meta("XXXX", "")),
            Msg::Malformed { .. } => format!("<MSG>{}<FLOP><FLIGHT><FLID>", meta("FLOP", "UPDT")),
        }
    }
}
