//! Reading one element or value of a message, each check saying what is malformed: a META
//! field, the body element, a single child, `xsi:nil`, stray text, a field's format (dates,
//! times), XML white space; and the quoting and cutting of values in error texts. Separate
//! from the message's structure (`xml.rs`: META, the dispatch on `TYPE`/`STYP`, the bodies)
//! because these rules hold for every element wherever it stands.

use chrono::{NaiveDate, NaiveDateTime};

use super::malformed;
use super::parse::{is_xml_space, Node};
use crate::codec::model::Field;
use crate::codec::CodecError;

/// How long a quoted value may be in an error message before it is cut.
const QUOTE_MAX_CHARS: usize = 48;

/// How long an XML-level error message may be (it can quote names and references of any
/// length) before it is cut.
const PARSE_ERROR_MAX_CHARS: usize = 240;

/// A META field: `None` when absent, empty or `xsi:nil`. Repeated or structured → malformed
/// (the header identifies the message and must be unambiguous).
pub(super) fn meta_field(meta: &Node, tag: &str) -> Result<Option<String>, CodecError> {
    let mut found = meta.children_named(tag);
    let Some(node) = found.next() else {
        return Ok(None);
    };
    if found.next().is_some() {
        return Err(malformed(format!("META/{tag} appears more than once")));
    }
    if node.has_child_elements {
        return Err(malformed(format!(
            "META/{tag} holds nested elements instead of text"
        )));
    }
    if is_nil(node, &format!("META/{tag}"))? {
        return Ok(None);
    }
    let v = trim(&node.text);
    Ok((!v.is_empty()).then(|| v.to_string()))
}

/// The body element `<tag>` of a `msg_type` message: exactly one.
pub(super) fn body_element<'n>(
    root: &'n Node,
    tag: &str,
    msg_type: &str,
) -> Result<&'n Node, CodecError> {
    let body = single(root, tag, "MSG")?
        .ok_or_else(|| malformed(format!("TYPE={msg_type} but <MSG> has no <{tag}> body")))?;
    no_stray_text(body, tag)?;
    Ok(body)
}

/// The child `<tag>` of `parent`, if any; malformed if there are several.
pub(super) fn single<'n>(
    parent: &'n Node,
    tag: &str,
    parent_name: &str,
) -> Result<Option<&'n Node>, CodecError> {
    let mut found = parent.children_named(tag);
    let first = found.next();
    if found.next().is_some() {
        return Err(malformed(format!(
            "<{parent_name}> has more than one <{tag}>"
        )));
    }
    Ok(first)
}

/// Whether the element carries `xsi:nil="true"` (or `1`); a nil element with content, or an
/// `xsi:nil` value that is not an XML Schema boolean, is malformed.
pub(super) fn is_nil(node: &Node, what: &str) -> Result<bool, CodecError> {
    let Some(value) = &node.nil else {
        return Ok(false);
    };
    match trim(value) {
        "true" | "1" => {
            let text = trim(&node.text);
            if text.is_empty() {
                Ok(true)
            } else {
                Err(malformed(format!(
                    "{what} is xsi:nil but has the content {}",
                    quote(text)
                )))
            }
        }
        "false" | "0" => Ok(false),
        other => Err(malformed(format!(
            "{what} has the xsi:nil value {}, not a boolean",
            quote(other)
        ))),
    }
}

/// Text directly inside a structural element (not in a child) is malformed.
pub(super) fn no_stray_text(node: &Node, what: &str) -> Result<(), CodecError> {
    let text = trim(&node.text);
    if text.is_empty() {
        Ok(())
    } else {
        Err(malformed(format!(
            "unexpected text {} directly inside <{what}>",
            quote(text)
        )))
    }
}

/// Checks a carried value against its field's format (SPEC: bad field values → MALFORMED).
pub(super) fn check_format(field: Field, v: &str, label: &str) -> Result<(), CodecError> {
    let expected = match field {
        Field::Fexd if parse_date8(v).is_none() => "a YYYYMMDD date",
        Field::Stot | Field::Etot | Field::Atot if parse_time14(v).is_none() => {
            "a YYYYMMDDHHMMSS time"
        }
        Field::Flio if v != "A" && v != "D" => "A or D",
        _ => return Ok(()),
    };
    Err(malformed(format!(
        "{label}/{} {} is not {expected}",
        field.tag(),
        quote(v)
    )))
}

/// `YYYYMMDD`, exactly eight ASCII digits naming a real day.
pub(super) fn parse_date8(v: &str) -> Option<NaiveDate> {
    let [y, m, d] = [v.get(0..4)?, v.get(4..6)?, v.get(6..8)?];
    if v.len() != 8 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    NaiveDate::from_ymd_opt(y.parse().ok()?, m.parse().ok()?, d.parse().ok()?)
}

/// `YYYYMMDDHHMMSS`, exactly fourteen ASCII digits naming a real local time (no leap second).
pub(super) fn parse_time14(v: &str) -> Option<NaiveDateTime> {
    if v.len() != 14 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let date = parse_date8(v.get(0..8)?)?;
    let [h, mi, s] = [v.get(8..10)?, v.get(10..12)?, v.get(12..14)?];
    date.and_hms_opt(h.parse().ok()?, mi.parse().ok()?, s.parse().ok()?)
}

/// Trims XML white space (space, tab, CR, LF) only: other Unicode spaces are data.
pub(super) fn trim(s: &str) -> &str {
    s.trim_matches(is_xml_space)
}

/// A value for an error message: quoted, escaped and cut to [`QUOTE_MAX_CHARS`] characters.
pub(super) fn quote(v: &str) -> String {
    match v.char_indices().nth(QUOTE_MAX_CHARS) {
        Some((cut, _)) => format!("{:?}…", v.get(..cut).unwrap_or(v)),
        None => format!("{v:?}"),
    }
}

/// An XML-level error message cut to [`PARSE_ERROR_MAX_CHARS`] characters.
pub(super) fn cut(why: String) -> String {
    match why.char_indices().nth(PARSE_ERROR_MAX_CHARS) {
        Some((at, _)) => format!("{}…", why.get(..at).unwrap_or(&why)),
        None => why,
    }
}

/// An element name for an error message, cut like [`quote`] but unquoted.
pub(super) fn quote_name(v: &str) -> String {
    match v.char_indices().nth(QUOTE_MAX_CHARS) {
        Some((cut, _)) => format!("{}…", v.get(..cut).unwrap_or(v)),
        None => v.to_string(),
    }
}
