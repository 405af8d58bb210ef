//! The assumed upstream XML format (SPEC Appendix A, docs/message-format.md "The message").
//!
//! [`XmlCodec`] decodes one inbox row in two steps: [`parse`] checks that the text is a
//! well-formed XML document and keeps a shallow element tree; this module then reads `META`,
//! dispatches on `TYPE`/`STYP` and reads the body. The outcome classes follow the
//! [`CodecError`] variants:
//!
//! - [`CodecError::Malformed`]: too large, not well-formed, root not `<MSG>`, no `<META>`, a
//!   required META field missing, repeated or unparsable, the body element missing or
//!   repeated, `FLID` missing, a field value not in its format, stray text between elements.
//! - [`CodecError::Unsupported`]: well-formed with valid META, but a `TYPE`, a `SCHD` subtype
//!   or a `FLOP` subtype (not in the configured list) this codec does not know. The body of
//!   such a message is not looked at.
//! - [`CodecError::Codec`]: a well-formed, known message with something this codec cannot
//!   represent yet: a nested element inside a body field element (a flight field, `FLID`,
//!   `DATE`, `RQID`), or several `FLIGHT`s in a single-flight body (`FLOP`, `ADFT`,
//!   `SCHD`/`ADFT`), or several `FLID`s in an `FDEL`. Reported only when nothing in the
//!   message is malformed (MALFORMED wins: a replay could never fix it).
//!
//! The decoder decisions (duplicates, whitespace, CDATA, BOM, `xsi:nil`, …) are listed in
//! docs/message-format.md, "Decoder decisions". The decoder never panics: no indexing, no
//! unwrap, and no recursion over the document (see [`parse`]).

mod fields;
mod parse;

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, NaiveDate, TimeZone, Utc};
use chrono_tz::Tz;

use self::fields::{
    body_element, check_format, cut, is_nil, meta_field, no_stray_text, parse_date8, parse_time14,
    quote, quote_name, single, trim,
};
use self::parse::Node;
use super::model::{Body, DecodedMessage, Field, FieldValue, FlightRecord, Meta, ScheduleKind};
use super::{Codec, CodecError};

/// Default size limit of one message: 4 MiB (a big airport's daily schedule is ~1 MiB).
pub const DEFAULT_MAX_BYTES: usize = 4 * 1024 * 1024;

/// The `FLOP` subtypes the codec knows by default (SPEC Appendix A).
pub const DEFAULT_FLOP_SUBTYPES: [&str; 7] =
    ["UPDT", "ARRE", "DEPE", "GATE", "STND", "CANC", "DELY"];

/// The decoder of the assumed upstream XML format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XmlCodec {
    /// The airport's time zone: `DDTM` is local time in it.
    tz: Tz,
    /// Messages longer than this (in bytes) are MALFORMED without being parsed.
    max_bytes: usize,
    /// The `FLOP` subtypes this codec accepts; others are UNSUPPORTED.
    flop_subtypes: Vec<String>,
}

impl XmlCodec {
    /// A codec reading `DDTM` as local time in `tz`, refusing messages over `max_bytes` bytes
    /// and accepting the `FLOP` subtypes in `flop_subtypes` (compared exactly, case-sensitive).
    pub fn new(tz: Tz, max_bytes: usize, flop_subtypes: Vec<String>) -> Self {
        Self {
            tz,
            max_bytes,
            flop_subtypes,
        }
    }

    /// A codec with the defaults: [`DEFAULT_MAX_BYTES`] and [`DEFAULT_FLOP_SUBTYPES`].
    // Tests only: production never asks.
    #[cfg(test)]
    pub fn with_defaults(tz: Tz) -> Self {
        Self::new(
            tz,
            DEFAULT_MAX_BYTES,
            DEFAULT_FLOP_SUBTYPES
                .iter()
                .map(|s| s.to_string())
                .collect(),
        )
    }

    /// The airport time zone `DDTM` is read in.
    pub fn tz(&self) -> Tz {
        self.tz
    }

    /// The size limit in bytes.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// The accepted `FLOP` subtypes.
    pub fn flop_subtypes(&self) -> &[String] {
        &self.flop_subtypes
    }
}

impl Codec for XmlCodec {
    fn decode(&self, raw: &str) -> Result<DecodedMessage, CodecError> {
        if raw.len() > self.max_bytes {
            return Err(CodecError::Malformed(format!(
                "message of {} bytes exceeds the {}-byte limit",
                raw.len(),
                self.max_bytes
            )));
        }
        let root = parse::parse(raw).map_err(|why| CodecError::Malformed(cut(why)))?;
        let mut decoding = Decoding {
            codec: self,
            deferred: None,
        };
        let message = decoding.message(&root)?;
        match decoding.deferred {
            Some(why) => Err(CodecError::Codec(why)),
            None => Ok(message),
        }
    }
}

/// One decode: the codec's settings and the first CODEC_ERROR found, which is reported only
/// if nothing malformed turns up in the rest of the message.
struct Decoding<'a> {
    codec: &'a XmlCodec,
    deferred: Option<String>,
}

/// What a body leaf element says.
enum Leaf {
    /// Empty or white space only: not carried.
    Missing,
    /// `-` or `xsi:nil="true"`.
    Clear,
    /// Trimmed, unescaped text.
    Value(String),
    /// Holds nested elements (a CODEC_ERROR has been deferred).
    Nested,
}

fn malformed(why: impl Into<String>) -> CodecError {
    CodecError::Malformed(why.into())
}

impl Decoding<'_> {
    fn defer(&mut self, why: String) {
        if self.deferred.is_none() {
            self.deferred = Some(why);
        }
    }

    fn message(&mut self, root: &Node) -> Result<DecodedMessage, CodecError> {
        if root.name != "MSG" {
            return Err(malformed(format!(
                "the root element is <{}>, not <MSG>",
                quote_name(&root.name)
            )));
        }
        no_stray_text(root, "MSG")?;
        let meta_node =
            single(root, "META", "MSG")?.ok_or_else(|| malformed("no <META> in <MSG>"))?;
        let meta = self.meta(meta_node)?;
        let body = match (meta.msg_type.as_str(), meta.subtype.as_str()) {
            ("SCHD", "DNLD") => self.schedule(root, ScheduleKind::Download)?,
            ("SCHD", "RESP") => self.schedule(root, ScheduleKind::Response)?,
            ("SCHD", "ADFT") => Body::ScheduleAdd(self.single_flight(root, "SCHD", "SCHD")?),
            ("SCHD", other) => {
                return Err(CodecError::Unsupported(format!(
                    "SCHD subtype {} is not supported",
                    quote(other)
                )))
            }
            ("FLOP", styp) if self.codec.flop_subtypes.iter().any(|k| k == styp) => {
                Body::FlightUpdate(self.single_flight(root, "FLOP", "FLOP")?)
            }
            ("FLOP", other) => {
                return Err(CodecError::Unsupported(format!(
                    "FLOP subtype {} is not in the configured list",
                    quote(other)
                )))
            }
            ("FDEL", _) => self.flight_delete(root)?,
            ("ADFT", _) => Body::AddFlight(self.single_flight(root, "ADFT", "ADFT")?),
            (other, _) => {
                return Err(CodecError::Unsupported(format!(
                    "message TYPE {} is not supported",
                    quote(other)
                )))
            }
        };
        Ok(DecodedMessage { meta, body })
    }

    fn meta(&mut self, node: &Node) -> Result<Meta, CodecError> {
        no_stray_text(node, "META")?;
        let required = |tag: &str| -> Result<String, CodecError> {
            meta_field(node, tag)?
                .ok_or_else(|| malformed(format!("META/{tag} is missing or empty")))
        };
        let sender = required("SNDR")?;
        let receiver = meta_field(node, "RCVR")?;
        let seqn_text = required("SEQN")?;
        let seqn = seqn_text
            .parse::<i64>()
            .map_err(|_| malformed(format!("META/SEQN {} is not an integer", quote(&seqn_text))))?;
        let ddtm = required("DDTM")?;
        let sent_at = self.sent_at(&ddtm)?;
        let msg_type = required("TYPE")?;
        let subtype = match meta_field(node, "STYP")? {
            Some(s) => s,
            None if msg_type == "SCHD" || msg_type == "FLOP" => {
                return Err(malformed(format!(
                    "META/STYP is missing or empty (required for TYPE={msg_type})"
                )))
            }
            None => String::new(),
        };
        Ok(Meta {
            sender,
            receiver,
            seqn,
            sent_at,
            msg_type,
            subtype,
        })
    }

    /// `DDTM`, local airport time, in UTC. An ambiguous local time (a daylight-saving fold)
    /// is read as the earlier instant; a local time in a daylight-saving gap is malformed.
    fn sent_at(&self, ddtm: &str) -> Result<DateTime<Utc>, CodecError> {
        let local = parse_time14(ddtm).ok_or_else(|| {
            malformed(format!(
                "META/DDTM {} is not a YYYYMMDDHHMMSS time",
                quote(ddtm)
            ))
        })?;
        self.codec
            .tz
            .from_local_datetime(&local)
            .earliest()
            .map(|t| t.with_timezone(&Utc))
            .ok_or_else(|| {
                malformed(format!(
                    "META/DDTM {} does not exist in {} (daylight-saving gap)",
                    quote(ddtm),
                    self.codec.tz
                ))
            })
    }

    /// `SCHD`/`DNLD` and `SCHD`/`RESP`.
    fn schedule(&mut self, root: &Node, kind: ScheduleKind) -> Result<Body, CodecError> {
        let schd = body_element(root, "SCHD", "SCHD")?;
        let date = match single(schd, "DATE", "SCHD")? {
            None => return Err(malformed("SCHD/DATE is missing")),
            Some(n) => match self.leaf(n, "SCHD/DATE")? {
                Leaf::Missing | Leaf::Clear => {
                    return Err(malformed("SCHD/DATE is empty or cleared"))
                }
                Leaf::Nested => NaiveDate::default(),
                Leaf::Value(v) => parse_date8(&v).ok_or_else(|| {
                    malformed(format!("SCHD/DATE {} is not a YYYYMMDD date", quote(&v)))
                })?,
            },
        };
        let request_id = match single(schd, "RQID", "SCHD")? {
            None => None,
            Some(n) => match self.leaf(n, "SCHD/RQID")? {
                Leaf::Value(v) => Some(v),
                Leaf::Missing | Leaf::Clear | Leaf::Nested => None,
            },
        };
        let list =
            single(schd, "FLIGHTS", "SCHD")?.ok_or_else(|| malformed("SCHD/FLIGHTS is missing"))?;
        no_stray_text(list, "SCHD/FLIGHTS")?;
        let mut flights: Vec<FlightRecord> = Vec::new();
        let mut by_flid: HashMap<String, usize> = HashMap::new();
        for (i, node) in list.children_named("FLIGHT").enumerate() {
            let flight = self.flight(node, &format!("SCHD/FLIGHTS/FLIGHT[{}]", i + 1))?;
            // A FLID listed twice: one record, at the first position, fields merged in
            // document order (a later carried value wins).
            match by_flid.get(&flight.flid).and_then(|&k| flights.get_mut(k)) {
                Some(earlier) => earlier.fields.extend(flight.fields),
                None => {
                    by_flid.insert(flight.flid.clone(), flights.len());
                    flights.push(flight);
                }
            }
        }
        Ok(Body::Schedule {
            kind,
            date,
            request_id,
            flights,
        })
    }

    /// A body with exactly one `<FLIGHT>` (`FLOP`, `ADFT`, `SCHD`/`ADFT`).
    fn single_flight(
        &mut self,
        root: &Node,
        tag: &str,
        msg_type: &str,
    ) -> Result<FlightRecord, CodecError> {
        let body = body_element(root, tag, msg_type)?;
        let nodes: Vec<&Node> = body.children_named("FLIGHT").collect();
        let mut first = None;
        for (i, node) in nodes.iter().enumerate() {
            let what = if nodes.len() == 1 {
                format!("{tag}/FLIGHT")
            } else {
                format!("{tag}/FLIGHT[{}]", i + 1)
            };
            let flight = self.flight(node, &what)?;
            first.get_or_insert(flight);
        }
        if nodes.len() > 1 {
            self.defer(format!(
                "<{tag}> carries {} FLIGHTs; this codec represents one flight per message",
                nodes.len()
            ));
        }
        first.ok_or_else(|| malformed(format!("<{tag}> has no <FLIGHT>")))
    }

    fn flight_delete(&mut self, root: &Node) -> Result<Body, CodecError> {
        let body = body_element(root, "FDEL", "FDEL")?;
        let mut flid = None;
        let mut count = 0usize;
        for node in body.children_named("FLID") {
            count += 1;
            let id = match self.leaf(node, "FDEL/FLID")? {
                Leaf::Missing | Leaf::Clear => {
                    return Err(malformed("FDEL/FLID is empty or cleared"))
                }
                Leaf::Nested => String::new(),
                Leaf::Value(v) => v,
            };
            flid.get_or_insert(id);
        }
        if count > 1 {
            self.defer(format!(
                "<FDEL> carries {count} FLIDs; this codec represents one delete per message"
            ));
        }
        let flid = flid.ok_or_else(|| malformed("FDEL/FLID is missing"))?;
        Ok(Body::FlightDelete { flid })
    }

    /// One `<FLIGHT>`; `what` names it in error messages.
    fn flight(&mut self, node: &Node, what: &str) -> Result<FlightRecord, CodecError> {
        no_stray_text(node, what)?;
        let mut ids = node.children_named("FLID");
        let flid = match ids.next() {
            None => return Err(malformed(format!("{what} has no FLID"))),
            Some(n) => match self.leaf(n, &format!("{what}/FLID"))? {
                Leaf::Missing | Leaf::Clear => {
                    return Err(malformed(format!("{what}/FLID is empty or cleared")))
                }
                Leaf::Nested => String::new(),
                Leaf::Value(v) => v,
            },
        };
        if ids.next().is_some() {
            return Err(malformed(format!("{what} has more than one FLID")));
        }
        let label = format!("{what} (FLID {})", quote(&flid));
        let mut fields = BTreeMap::new();
        for child in &node.children {
            let Some(field) = Field::from_tag(&child.name) else {
                continue; // FLID (read above) or an unknown element: ignored.
            };
            let value = match self.leaf(child, &format!("{label}/{}", field.tag()))? {
                Leaf::Missing | Leaf::Nested => continue,
                Leaf::Clear => FieldValue::Clear,
                Leaf::Value(v) => {
                    check_format(field, &v, &label)?;
                    FieldValue::Set(v)
                }
            };
            // A field repeated: the last carried occurrence wins (empty ones carry nothing).
            fields.insert(field, value);
        }
        Ok(FlightRecord { flid, fields })
    }

    /// Reads a body leaf element (a flight field, `FLID`, `DATE`, `RQID`).
    fn leaf(&mut self, node: &Node, what: &str) -> Result<Leaf, CodecError> {
        if node.has_child_elements {
            self.defer(format!(
                "{what} holds nested elements; structured values are not supported"
            ));
            return Ok(Leaf::Nested);
        }
        if is_nil(node, what)? {
            return Ok(Leaf::Clear);
        }
        let v = trim(&node.text);
        Ok(if v.is_empty() {
            Leaf::Missing
        } else if v == "-" {
            Leaf::Clear
        } else {
            Leaf::Value(v.to_string())
        })
    }
}

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;
