//! What the generator remembers about each flight ([`Flight`]) and how a field value appears
//! in a message ([`Val`]). The pool of them is kept in `pool`.

use chrono::{NaiveDate, NaiveDateTime};

use super::TIME_FORMAT;

/// One flight as the generator remembers it (what upstream last said about it).
#[derive(Debug, Clone)]
pub(super) struct Flight {
    pub(super) flid: String,
    pub(super) awcd: &'static str,
    pub(super) flno: String,
    pub(super) fexd: NaiveDate,
    /// `A` arrival or `D` departure.
    pub(super) flio: char,
    pub(super) stot: NaiveDateTime,
    pub(super) etot: Option<NaiveDateTime>,
    pub(super) atot: Option<NaiveDateTime>,
    pub(super) gate: Option<String>,
    pub(super) stnd: Option<String>,
    pub(super) blts: Option<String>,
    pub(super) stat: &'static str,
    /// Master flight id on a code-share; None on a master.
    pub(super) mfid: Option<String>,
}

/// A field value as it appears in a message.
#[derive(Debug, Clone)]
pub(super) enum Val {
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
    pub(super) fn opt(v: &Option<String>) -> Val {
        v.as_ref().map_or(Val::Empty, |s| Val::Text(s.clone()))
    }

    pub(super) fn time(t: &Option<NaiveDateTime>) -> Val {
        t.map_or(Val::Empty, |t| Val::Text(t.format(TIME_FORMAT).to_string()))
    }
}
