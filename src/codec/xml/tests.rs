//! Unit tests of the XML codec: the fixtures, the generator's messages and the edge cases of
//! the decoder decisions (docs/message-format.md, "Decoder decisions").

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};

use super::*;
use crate::devtools::messages::{
    Generator, MalformedKind, MessageKind, Mix, FLOP_SUBTYPES, UNKNOWN_TYPES,
};

/// The outcome class of a decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Class {
    Ok,
    Malformed,
    Unsupported,
    Codec,
}

pub(super) fn class(r: &Result<DecodedMessage, CodecError>) -> Class {
    match r {
        Ok(_) => Class::Ok,
        Err(CodecError::Malformed(_)) => Class::Malformed,
        Err(CodecError::Unsupported(_)) => Class::Unsupported,
        Err(CodecError::Codec(_)) => Class::Codec,
    }
}

macro_rules! fixture {
    ($name:literal) => {
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/",
            $name
        ))
    };
}

/// Every fixture with its expected class.
pub(super) const FIXTURES: [(&str, &str, Class); 13] = [
    ("schd_dnld.xml", fixture!("schd_dnld.xml"), Class::Ok),
    ("schd_resp.xml", fixture!("schd_resp.xml"), Class::Ok),
    ("schd_adft.xml", fixture!("schd_adft.xml"), Class::Ok),
    ("flop_updt.xml", fixture!("flop_updt.xml"), Class::Ok),
    ("flop_arre.xml", fixture!("flop_arre.xml"), Class::Ok),
    ("fdel.xml", fixture!("fdel.xml"), Class::Ok),
    ("adft.xml", fixture!("adft.xml"), Class::Ok),
    (
        "unsupported_type.xml",
        fixture!("unsupported_type.xml"),
        Class::Unsupported,
    ),
    (
        "unsupported_flop_subtype.xml",
        fixture!("unsupported_flop_subtype.xml"),
        Class::Unsupported,
    ),
    (
        "malformed_not_well_formed.xml",
        fixture!("malformed_not_well_formed.xml"),
        Class::Malformed,
    ),
    (
        "malformed_no_meta.xml",
        fixture!("malformed_no_meta.xml"),
        Class::Malformed,
    ),
    (
        "malformed_missing_flid.xml",
        fixture!("malformed_missing_flid.xml"),
        Class::Malformed,
    ),
    (
        "malformed_bad_ddtm.xml",
        fixture!("malformed_bad_ddtm.xml"),
        Class::Malformed,
    ),
];

pub(super) fn codec() -> XmlCodec {
    XmlCodec::with_defaults(chrono_tz::Asia::Shanghai)
}

fn decode(raw: &str) -> Result<DecodedMessage, CodecError> {
    codec().decode(raw)
}

fn ok(raw: &str) -> DecodedMessage {
    match decode(raw) {
        Ok(m) => m,
        Err(e) => panic!("expected Ok, got {e:?} for\n{raw}"),
    }
}

fn malformed_msg(raw: &str) -> String {
    match decode(raw) {
        Err(CodecError::Malformed(m)) => m,
        other => panic!("expected Malformed, got {other:?} for\n{raw}"),
    }
}

fn utc(s: &str) -> DateTime<Utc> {
    s.parse().expect("valid RFC 3339 time")
}

fn set(v: &str) -> FieldValue {
    FieldValue::Set(v.to_string())
}

fn fields(pairs: &[(Field, FieldValue)]) -> BTreeMap<Field, FieldValue> {
    pairs.iter().cloned().collect()
}

fn single_flight(m: &DecodedMessage) -> &FlightRecord {
    match &m.body {
        Body::ScheduleAdd(f) | Body::FlightUpdate(f) | Body::AddFlight(f) => f,
        other => panic!("expected a single-flight body, got {other:?}"),
    }
}

/// A FLOP/UPDT around `flight` (the inside of `<FLIGHT>`).
fn flop(flight: &str) -> String {
    format!(
        "<MSG><META><SNDR>AODB</SNDR><SEQN>7</SEQN><DDTM>20261130093000</DDTM>\
         <TYPE>FLOP</TYPE><STYP>UPDT</STYP></META><FLOP><FLIGHT>{flight}</FLIGHT></FLOP></MSG>"
    )
}

/// A message with `meta` (the inside of `<META>`) and `body` after it.
fn msg(meta: &str, body: &str) -> String {
    format!("<MSG><META>{meta}</META>{body}</MSG>")
}

const META_FLOP: &str = "<SNDR>AODB</SNDR><SEQN>7</SEQN><DDTM>20261130093000</DDTM>\
                         <TYPE>FLOP</TYPE><STYP>UPDT</STYP>";
const BODY_FLOP: &str = "<FLOP><FLIGHT><FLID>1</FLID></FLIGHT></FLOP>";

// ---- fixtures --------------------------------------------------------------------------------

#[test]
fn every_fixture_decodes_to_its_class() {
    for (name, raw, expected) in FIXTURES {
        let r = decode(raw);
        assert_eq!(class(&r), expected, "{name}: {r:?}");
    }
}

#[test]
fn schd_dnld_fixture() {
    let m = ok(fixture!("schd_dnld.xml"));
    assert_eq!(
        m.meta,
        Meta {
            sender: "AODB".into(),
            receiver: Some("MSGX".into()),
            seqn: 102340,
            sent_at: utc("2026-11-29T14:00:00Z"),
            msg_type: "SCHD".into(),
            subtype: "DNLD".into(),
        }
    );
    let Body::Schedule {
        kind,
        date,
        request_id,
        flights,
    } = &m.body
    else {
        panic!("expected a schedule, got {:?}", m.body);
    };
    assert_eq!(*kind, ScheduleKind::Download);
    assert_eq!(Some(*date), NaiveDate::from_ymd_opt(2026, 11, 30));
    assert_eq!(*request_id, None);
    let ids: Vec<&str> = flights.iter().map(|f| f.flid.as_str()).collect();
    assert_eq!(ids, ["30417751", "30417752", "30417760"]);
    assert_eq!(
        flights[0].fields,
        fields(&[
            (Field::Awcd, set("CA")),
            (Field::Flno, set("CA1234")),
            (Field::Fexd, set("20261130")),
            (Field::Flio, set("D")),
            (Field::Stot, set("20261130081500")),
            (Field::Gate, set("C12")),
            (Field::Stnd, set("215")),
            (Field::Stat, set("SCH")),
        ])
    );
    // The code-share names its master; the master's empty MFID is not carried.
    assert_eq!(flights[1].fields.get(&Field::Mfid), Some(&set("30417751")));
    assert_eq!(flights[1].fields.get(&Field::Flno), Some(&set("LH7233")));
    assert_eq!(flights[2].fields.get(&Field::Gate), None);
    assert_eq!(flights[2].fields.get(&Field::Blts), Some(&set("07")));
}

#[test]
fn schd_resp_fixture() {
    let m = ok(fixture!("schd_resp.xml"));
    assert_eq!(m.meta.subtype, "RESP");
    let Body::Schedule {
        kind,
        request_id,
        flights,
        ..
    } = &m.body
    else {
        panic!("expected a schedule, got {:?}", m.body);
    };
    assert_eq!(*kind, ScheduleKind::Response);
    assert_eq!(request_id.as_deref(), Some("418"));
    assert_eq!(flights.len(), 1);
    assert_eq!(flights[0].flid, "30417760");
    assert_eq!(
        flights[0].fields.get(&Field::Etot),
        Some(&set("20261130102500"))
    );
    assert_eq!(flights[0].fields.get(&Field::Stat), Some(&set("DEL")));
    assert_eq!(flights[0].fields.get(&Field::Atot), None);
}

#[test]
fn schd_adft_fixture() {
    let m = ok(fixture!("schd_adft.xml"));
    assert_eq!(
        (m.meta.msg_type.as_str(), m.meta.subtype.as_str()),
        ("SCHD", "ADFT")
    );
    assert!(matches!(m.body, Body::ScheduleAdd(_)));
    let f = single_flight(&m);
    assert_eq!(f.flid, "30417801");
    assert_eq!(f.fields.get(&Field::Flno), Some(&set("CZ3108")));
    assert_eq!(f.fields.get(&Field::Stot), Some(&set("20261130214500")));
    assert_eq!(f.fields.len(), 8);
}

#[test]
fn flop_updt_fixture_empty_dash_nil_and_unknown_elements() {
    let m = ok(fixture!("flop_updt.xml"));
    assert_eq!(
        m.meta,
        Meta {
            sender: "AODB".into(),
            receiver: Some("MSGX".into()),
            seqn: 102345,
            sent_at: utc("2026-11-30T01:30:00Z"),
            msg_type: "FLOP".into(),
            subtype: "UPDT".into(),
        }
    );
    assert!(matches!(m.body, Body::FlightUpdate(_)));
    let f = single_flight(&m);
    assert_eq!(f.flid, "30417751");
    assert_eq!(
        f.fields,
        fields(&[
            (Field::Flno, set("CA1234")),
            (Field::Etot, set("20261130084000")),
            // <ATOT/> is not carried; escaped text is unescaped.
            (Field::Gate, set("C12&C14")),
            (Field::Stnd, FieldValue::Clear),
            (Field::Blts, FieldValue::Clear),
            (Field::Stat, set("DEL")),
        ])
    );
}

#[test]
fn flop_arre_fixture() {
    let m = ok(fixture!("flop_arre.xml"));
    assert_eq!(m.meta.subtype, "ARRE");
    let f = single_flight(&m);
    assert_eq!(
        f.fields,
        fields(&[
            (Field::Awcd, set("MU")),
            (Field::Flno, set("MU5137")),
            (Field::Fexd, set("20261130")),
            (Field::Flio, set("A")),
            (Field::Atot, set("20261130101800")),
            (Field::Blts, set("09")),
            (Field::Stat, set("ARR")),
        ])
    );
}

#[test]
fn fdel_fixture() {
    let m = ok(fixture!("fdel.xml"));
    assert_eq!(m.meta.msg_type, "FDEL");
    assert_eq!(
        m.meta.subtype, "",
        "STYP absent on FDEL is the empty string"
    );
    assert_eq!(
        m.body,
        Body::FlightDelete {
            flid: "30417751".into()
        }
    );
}

#[test]
fn adft_fixture_without_declaration_or_receiver() {
    let m = ok(fixture!("adft.xml"));
    assert_eq!(m.meta.sender, "CIIMS");
    assert_eq!(m.meta.receiver, None);
    assert_eq!(m.meta.seqn, 88123);
    assert!(matches!(m.body, Body::AddFlight(_)));
    let f = single_flight(&m);
    assert_eq!(f.flid, "30417905");
    assert_eq!(f.fields.get(&Field::Fexd), Some(&set("20261201")));
}

#[test]
fn fixture_errors_name_the_problem() {
    let m = malformed_msg(fixture!("malformed_bad_ddtm.xml"));
    assert!(
        m.contains("DDTM") && m.contains("2026-11-30 11:23:00"),
        "{m}"
    );
    let m = malformed_msg(fixture!("malformed_missing_flid.xml"));
    assert!(m.contains("FLID"), "{m}");
    let m = malformed_msg(fixture!("malformed_no_meta.xml"));
    assert!(m.contains("META"), "{m}");
    let m = malformed_msg(fixture!("malformed_not_well_formed.xml"));
    assert!(m.contains("not well-formed"), "{m}");
    match decode(fixture!("unsupported_flop_subtype.xml")) {
        Err(CodecError::Unsupported(m)) => assert!(m.contains("BRDG"), "{m}"),
        other => panic!("{other:?}"),
    }
    match decode(fixture!("unsupported_type.xml")) {
        Err(CodecError::Unsupported(m)) => assert!(m.contains("CKIN"), "{m}"),
        other => panic!("{other:?}"),
    }
}

// ---- META ------------------------------------------------------------------------------------

#[test]
fn ddtm_is_airport_local_time_converted_to_utc() {
    let m = ok(&flop("<FLID>1</FLID>"));
    assert_eq!(m.meta.sent_at, utc("2026-11-30T01:30:00Z"));
    // The same text read in another zone gives another instant.
    let berlin = XmlCodec::with_defaults(chrono_tz::Europe::Berlin);
    let m = berlin.decode(&flop("<FLID>1</FLID>")).expect("decodes");
    assert_eq!(m.meta.sent_at, utc("2026-11-30T08:30:00Z"));
}

#[test]
fn ddtm_in_a_dst_gap_is_malformed_and_a_fold_reads_the_earlier_instant() {
    let berlin = XmlCodec::with_defaults(chrono_tz::Europe::Berlin);
    let with = |ddtm: &str| {
        msg(
            &format!("<SNDR>A</SNDR><SEQN>1</SEQN><DDTM>{ddtm}</DDTM><TYPE>FDEL</TYPE>"),
            "<FDEL><FLID>1</FLID></FDEL>",
        )
    };
    match berlin.decode(&with("20260329023000")) {
        Err(CodecError::Malformed(m)) => assert!(m.contains("DDTM"), "{m}"),
        other => panic!("{other:?}"),
    }
    let m = berlin.decode(&with("20261025023000")).expect("decodes");
    assert_eq!(m.meta.sent_at, utc("2026-10-25T00:30:00Z"));
}

#[test]
fn bad_ddtm_values_are_malformed() {
    for bad in [
        "2026113009300",
        "202611300930000",
        "20261345256199",
        "20260230093000",
        "20261130246000",
        "20261130235960",
        "N/A",
        "+2026113009300",
        "２０２６１１３００９３０００",
    ] {
        let raw = msg(
            &format!("<SNDR>A</SNDR><SEQN>1</SEQN><DDTM>{bad}</DDTM><TYPE>FDEL</TYPE>"),
            "<FDEL><FLID>1</FLID></FDEL>",
        );
        let m = malformed_msg(&raw);
        assert!(m.contains("DDTM"), "{bad}: {m}");
    }
}

#[test]
fn required_meta_fields_missing_empty_or_unparsable_are_malformed() {
    let full = [
        ("SNDR", "AODB"),
        ("SEQN", "7"),
        ("DDTM", "20261130093000"),
        ("TYPE", "FLOP"),
        ("STYP", "UPDT"),
    ];
    for (drop, _) in full {
        for replacement in [
            "",
            "<X></X>",
            "<X/>",
            "<X>  \n </X>",
            "<X xsi:nil=\"true\"/>",
        ] {
            let meta: String = full
                .iter()
                .map(|(t, v)| {
                    if *t == drop {
                        replacement.replace('X', t)
                    } else {
                        format!("<{t}>{v}</{t}>")
                    }
                })
                .collect();
            let m = malformed_msg(&msg(&meta, BODY_FLOP));
            assert!(m.contains(drop), "{drop} / {replacement}: {m}");
        }
    }
    for seqn in ["12a", "1.5", "99999999999999999999", "- 1"] {
        let meta = META_FLOP.replace("<SEQN>7</SEQN>", &format!("<SEQN>{seqn}</SEQN>"));
        let m = malformed_msg(&msg(&meta, BODY_FLOP));
        assert!(m.contains("SEQN"), "{m}");
    }
}

#[test]
fn meta_optional_fields_and_styp_rules() {
    let m = ok(&msg(
        "<SNDR> AODB </SNDR><RCVR/><SEQN> 42 </SEQN><DDTM>20261130093000</DDTM><TYPE>ADFT</TYPE>",
        "<ADFT><FLIGHT><FLID>9</FLID></FLIGHT></ADFT>",
    ));
    assert_eq!(m.meta.sender, "AODB");
    assert_eq!(m.meta.receiver, None);
    assert_eq!(m.meta.seqn, 42);
    assert_eq!(m.meta.subtype, "");
    // STYP is kept when a type that does not need it carries it.
    let m = ok(&msg(
        "<SNDR>A</SNDR><SEQN>1</SEQN><DDTM>20261130093000</DDTM><TYPE>FDEL</TYPE><STYP>X</STYP>",
        "<FDEL><FLID>1</FLID></FDEL>",
    ));
    assert_eq!(m.meta.subtype, "X");
    // SCHD without STYP is malformed, not unsupported.
    let m = malformed_msg(&msg(
        "<SNDR>A</SNDR><SEQN>1</SEQN><DDTM>20261130093000</DDTM><TYPE>SCHD</TYPE>",
        "<SCHD/>",
    ));
    assert!(m.contains("STYP"), "{m}");
}

#[test]
fn meta_duplicates_and_structure_are_malformed() {
    let dup = META_FLOP.replace("<SEQN>7</SEQN>", "<SEQN>7</SEQN><SEQN>8</SEQN>");
    assert!(malformed_msg(&msg(&dup, BODY_FLOP)).contains("SEQN"));
    let nested = META_FLOP.replace("<SNDR>AODB</SNDR>", "<SNDR><ID>AODB</ID></SNDR>");
    assert!(malformed_msg(&msg(&nested, BODY_FLOP)).contains("SNDR"));
    let raw = format!("<MSG><META>{META_FLOP}</META><META>{META_FLOP}</META>{BODY_FLOP}</MSG>");
    assert!(malformed_msg(&raw).contains("META"));
    let stray = format!("<MSG><META>AODB {META_FLOP}</META>{BODY_FLOP}</MSG>");
    assert!(malformed_msg(&stray).contains("META"));
}

#[test]
fn unknown_types_and_subtypes_are_unsupported_but_bad_meta_wins() {
    let meta = |t: &str, s: &str| {
        format!("<SNDR>A</SNDR><SEQN>1</SEQN><DDTM>20261130093000</DDTM><TYPE>{t}</TYPE><STYP>{s}</STYP>")
    };
    for (t, s) in [
        ("BLLS", ""),
        ("flop", "UPDT"),
        ("SCHD", "XXXX"),
        ("FLOP", "updt"),
        ("FLOP", "BRDG"),
    ] {
        let r = decode(&msg(&meta(t, s), "<WHATEVER><FLIGHT/></WHATEVER>"));
        assert_eq!(class(&r), Class::Unsupported, "{t}/{s}: {r:?}");
    }
    // A malformed header is malformed whatever the type.
    let raw = msg(
        "<SNDR>A</SNDR><DDTM>20261130093000</DDTM><TYPE>BLLS</TYPE>",
        "",
    );
    assert!(malformed_msg(&raw).contains("SEQN"));
    // The FLOP subtype list is configurable.
    let narrow = XmlCodec::new(
        chrono_tz::Asia::Shanghai,
        DEFAULT_MAX_BYTES,
        vec!["GATE".into()],
    );
    assert_eq!(
        class(&narrow.decode(&flop("<FLID>1</FLID>"))),
        Class::Unsupported
    );
    let m = narrow
        .decode(&msg(&meta("FLOP", "GATE"), BODY_FLOP))
        .expect("GATE is configured");
    assert_eq!(m.meta.subtype, "GATE");
}

#[test]
fn root_and_body_problems_are_malformed() {
    assert!(malformed_msg("<MESSAGE><META/></MESSAGE>").contains("MSG"));
    assert!(malformed_msg(&msg(META_FLOP, "")).contains("FLOP"));
    assert!(malformed_msg(&msg(META_FLOP, "<FLOP/>")).contains("FLIGHT"));
    assert!(malformed_msg(&msg(META_FLOP, "<FLOP><FLIGHT/></FLOP>")).contains("FLID"));
    assert!(malformed_msg(&msg(META_FLOP, &format!("{BODY_FLOP}{BODY_FLOP}"))).contains("FLOP"));
    let m = malformed_msg(&msg(
        META_FLOP,
        "<FLOP><FLIGHT>CA1234<FLID>1</FLID></FLIGHT></FLOP>",
    ));
    assert!(m.contains("CA1234"), "{m}");
    // The body of another type is not the body.
    assert!(malformed_msg(&msg(
        META_FLOP,
        "<ADFT><FLIGHT><FLID>1</FLID></FLIGHT></ADFT>"
    ))
    .contains("<FLOP>"));
    let fdel = "<SNDR>A</SNDR><SEQN>1</SEQN><DDTM>20261130093000</DDTM><TYPE>FDEL</TYPE>";
    assert!(malformed_msg(&msg(fdel, "<FDEL/>")).contains("FLID"));
    assert!(malformed_msg(&msg(fdel, "<FDEL><FLID> </FLID></FDEL>")).contains("FLID"));
    assert!(malformed_msg(&msg(fdel, "<FDEL><FLID>-</FLID></FDEL>")).contains("FLID"));
}

// ---- flight fields ---------------------------------------------------------------------------

#[test]
fn empty_dash_nil_and_whitespace() {
    let m = ok(&flop(
        "<FLID> 1 </FLID><GATE/><STND></STND><BLTS>  \n\t </BLTS><STAT>-</STAT>\
         <ETOT xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\" xsi:nil=\"true\"/>\
         <ATOT xsi:nil=\"1\"></ATOT><MFID xsi:nil=\"false\">30417751</MFID>\
         <AWCD>\u{3000}CA\u{3000}</AWCD><FLNO> -- </FLNO>",
    ));
    let f = single_flight(&m);
    assert_eq!(f.flid, "1");
    assert_eq!(
        f.fields,
        fields(&[
            (Field::Awcd, set("\u{3000}CA\u{3000}")),
            (Field::Flno, set("--")),
            (Field::Etot, FieldValue::Clear),
            (Field::Atot, FieldValue::Clear),
            (Field::Stat, FieldValue::Clear),
            (Field::Mfid, set("30417751")),
        ])
    );
}

#[test]
fn xsi_nil_is_resolved_by_namespace() {
    // Another prefix bound to the XSI namespace clears.
    let m = ok(&flop(
        "<FLID>1</FLID><GATE xmlns:i=\"http://www.w3.org/2001/XMLSchema-instance\" i:nil=\"true\"/>",
    ));
    assert_eq!(
        single_flight(&m).fields.get(&Field::Gate),
        Some(&FieldValue::Clear)
    );
    // `xsi` bound to another namespace is not XML Schema's nil: the empty element is not carried.
    let m = ok(&flop(
        "<FLID>1</FLID><GATE xmlns:xsi=\"urn:other\" xsi:nil=\"true\"/>",
    ));
    assert_eq!(single_flight(&m).fields.get(&Field::Gate), None);
    // An unprefixed nil attribute is just an attribute.
    let m = ok(&flop("<FLID>1</FLID><GATE nil=\"true\">C1</GATE>"));
    assert_eq!(single_flight(&m).fields.get(&Field::Gate), Some(&set("C1")));
    // Nil with content, or a non-boolean nil, is malformed.
    assert!(
        malformed_msg(&flop("<FLID>1</FLID><GATE xsi:nil=\"true\">C1</GATE>")).contains("GATE")
    );
    assert!(malformed_msg(&flop("<FLID>1</FLID><GATE xsi:nil=\"yes\"/>")).contains("GATE"));
}

#[test]
fn field_formats_are_validated() {
    for (tag, bad) in [
        ("FEXD", "2026-11-30"),
        ("FEXD", "20261131"),
        ("FEXD", "202611300"),
        ("STOT", "20261130 0815"),
        ("ETOT", "202611300815"),
        ("ATOT", "20261130250000"),
        ("FLIO", "a"),
        ("FLIO", "ARR"),
        ("FLIO", "X"),
    ] {
        let m = malformed_msg(&flop(&format!("<FLID>30417751</FLID><{tag}>{bad}</{tag}>")));
        assert!(
            m.contains(tag) && m.contains(bad) && m.contains("30417751"),
            "{m}"
        );
    }
    // Clears and not-carried need no format.
    let m = ok(&flop(
        "<FLID>1</FLID><FEXD>-</FEXD><FLIO/><STOT xsi:nil=\"true\"/>",
    ));
    assert_eq!(
        single_flight(&m).fields,
        fields(&[
            (Field::Fexd, FieldValue::Clear),
            (Field::Stot, FieldValue::Clear)
        ])
    );
}

#[test]
fn repeated_fields_last_carried_wins() {
    let m = ok(&flop(
        "<FLID>1</FLID><GATE>C1</GATE><GATE>C2</GATE><GATE/><STND>-</STND><STND>201</STND>",
    ));
    assert_eq!(
        single_flight(&m).fields,
        fields(&[(Field::Gate, set("C2")), (Field::Stnd, set("201"))])
    );
    // A bad value is malformed even when a later one would replace it.
    assert_eq!(
        class(&decode(&flop("<FLID>1</FLID><FLIO>X</FLIO><FLIO>A</FLIO>"))),
        Class::Malformed
    );
    // A flight has one identity.
    assert!(malformed_msg(&flop("<FLID>1</FLID><FLID>2</FLID>")).contains("FLID"));
}

#[test]
fn repeated_flight_in_a_schedule_is_merged_in_document_order() {
    let raw = msg(
        "<SNDR>A</SNDR><SEQN>1</SEQN><DDTM>20261130093000</DDTM><TYPE>SCHD</TYPE><STYP>DNLD</STYP>",
        "<SCHD><DATE>20261130</DATE><FLIGHTS>\
         <FLIGHT><FLID>1</FLID><GATE>C1</GATE><STND>201</STND></FLIGHT>\
         <FLIGHT><FLID>2</FLID></FLIGHT>\
         <FLIGHT><FLID>1</FLID><GATE>C9</GATE><STND/><STAT>DEL</STAT></FLIGHT>\
         </FLIGHTS></SCHD>",
    );
    let m = ok(&raw);
    let Body::Schedule { flights, .. } = &m.body else {
        panic!("{:?}", m.body);
    };
    assert_eq!(flights.len(), 2);
    assert_eq!(flights[0].flid, "1");
    assert_eq!(
        flights[0].fields,
        fields(&[
            (Field::Gate, set("C9")),
            (Field::Stnd, set("201")),
            (Field::Stat, set("DEL")),
        ])
    );
    assert_eq!(flights[1].flid, "2");
}

#[test]
fn schedule_rules() {
    let meta = |s: &str| {
        format!("<SNDR>A</SNDR><SEQN>1</SEQN><DDTM>20261130093000</DDTM><TYPE>SCHD</TYPE><STYP>{s}</STYP>")
    };
    // An empty day is a valid schedule; DNLD keeps an RQID if it carries one.
    let m = ok(&msg(
        &meta("DNLD"),
        "<SCHD><RQID>5</RQID><DATE>20261130</DATE><FLIGHTS/></SCHD>",
    ));
    assert!(matches!(
        &m.body,
        Body::Schedule { flights, request_id: Some(r), .. } if flights.is_empty() && r == "5"
    ));
    let m = ok(&msg(
        &meta("RESP"),
        "<SCHD><DATE>20261130</DATE><RQID/><FLIGHTS/></SCHD>",
    ));
    assert!(matches!(
        &m.body,
        Body::Schedule {
            request_id: None,
            kind: ScheduleKind::Response,
            ..
        }
    ));
    for (body, needle) in [
        ("<SCHD><FLIGHTS/></SCHD>", "DATE"),
        ("<SCHD><DATE/><FLIGHTS/></SCHD>", "DATE"),
        ("<SCHD><DATE>2026113</DATE><FLIGHTS/></SCHD>", "DATE"),
        ("<SCHD><DATE>20261130</DATE></SCHD>", "FLIGHTS"),
        (
            "<SCHD><DATE>20261130</DATE><FLIGHTS/><FLIGHTS/></SCHD>",
            "FLIGHTS",
        ),
        (
            "<SCHD><DATE>20261130</DATE><FLIGHTS><FLIGHT/></FLIGHTS></SCHD>",
            "FLID",
        ),
        (
            "<SCHD><DATE>20261130</DATE><FLIGHT><FLID>1</FLID></FLIGHT></SCHD>",
            "FLIGHTS",
        ),
    ] {
        let m = malformed_msg(&msg(&meta("DNLD"), body));
        assert!(m.contains(needle), "{body}: {m}");
    }
    assert!(malformed_msg(&msg(&meta("ADFT"), "<SCHD><FLIGHTS/></SCHD>")).contains("FLIGHT"));
}

// ---- CODEC_ERROR -----------------------------------------------------------------------------

#[test]
fn structures_the_model_cannot_hold_are_codec_errors() {
    let codec_err = |raw: &str| match decode(raw) {
        Err(CodecError::Codec(m)) => m,
        other => panic!("expected Codec, got {other:?} for\n{raw}"),
    };
    assert!(codec_err(&flop(
        "<FLID>1</FLID><GATE><PIER>C</PIER><NO>12</NO></GATE>"
    ))
    .contains("GATE"));
    assert!(codec_err(&flop("<FLID><ID>1</ID></FLID>")).contains("FLID"));
    let two = msg(
        META_FLOP,
        "<FLOP><FLIGHT><FLID>1</FLID></FLIGHT><FLIGHT><FLID>2</FLID></FLIGHT></FLOP>",
    );
    assert!(codec_err(&two).contains("2 FLIGHTs"));
    let fdel = "<SNDR>A</SNDR><SEQN>1</SEQN><DDTM>20261130093000</DDTM><TYPE>FDEL</TYPE>";
    assert!(codec_err(&msg(fdel, "<FDEL><FLID>1</FLID><FLID>2</FLID></FDEL>")).contains("FLID"));
    let schd =
        "<SNDR>A</SNDR><SEQN>1</SEQN><DDTM>20261130093000</DDTM><TYPE>SCHD</TYPE><STYP>DNLD</STYP>";
    assert!(codec_err(&msg(
        schd,
        "<SCHD><DATE><D>20261130</D></DATE><FLIGHTS/></SCHD>"
    ))
    .contains("DATE"));
    // Malformed wins over a CODEC_ERROR anywhere in the message.
    let both = msg(
        META_FLOP,
        "<FLOP><FLIGHT><FLID>1</FLID><GATE><X/></GATE></FLIGHT><FLIGHT><GATE>C1</GATE></FLIGHT></FLOP>",
    );
    assert_eq!(class(&decode(&both)), Class::Malformed);
    let both = flop("<FLID>1</FLID><GATE><X/></GATE><FEXD>2026</FEXD>");
    assert_eq!(class(&decode(&both)), Class::Malformed);
    // Unknown elements may nest freely.
    let m = ok(&flop(
        "<FLID>1</FLID><EXTRA><A><B><C>x</C></B></A></EXTRA><GATE>C1</GATE>",
    ));
    assert_eq!(single_flight(&m).fields.len(), 1);
}

// ---- XML level -------------------------------------------------------------------------------

#[test]
fn xml_prolog_bom_comments_cdata_and_references() {
    let plain = flop("<FLID>1</FLID><GATE>C1</GATE>");
    let expected = ok(&plain);
    for variant in [
        format!("\u{feff}{plain}"),
        format!("\u{feff}<?xml version=\"1.0\" encoding=\"GB2312\"?>\n{plain}"),
        format!("\n  <?xml version=\"1.0\"?>{plain}\n<!-- trailer -->\n"),
        format!("<!-- head --><?pi data?>{plain}<?pi after?>"),
        plain.replace("C1", "<![CDATA[C1]]>"),
        plain.replace("C1", "C<!-- comment -->1"),
        plain.replace("C1", "&#67;&#x31;"),
        plain.replace("<MSG>", "<MSG xmlns=\"urn:aodb\" version=\"2\">"),
        plain
            .replace("<META>", "\r\n<META>\r\n")
            .replace("</FLOP>", "</FLOP >"),
    ] {
        assert_eq!(decode(&variant), Ok(expected.clone()), "{variant}");
    }
    let m = ok(&flop(
        "<FLID>1</FLID><GATE><![CDATA[C1 & <C2>]]></GATE><STND>&lt;&gt;&amp;&apos;&quot;</STND>",
    ));
    let f = single_flight(&m);
    assert_eq!(f.fields.get(&Field::Gate), Some(&set("C1 & <C2>")));
    assert_eq!(f.fields.get(&Field::Stnd), Some(&set("<>&'\"")));
    let m = ok(&flop(
        "<FLID>1</FLID><GATE><![CDATA[-]]></GATE><STND><![CDATA[ ]]></STND>",
    ));
    assert_eq!(
        single_flight(&m).fields,
        fields(&[(Field::Gate, FieldValue::Clear)])
    );
    let m = ok(&flop("<FLID>1</FLID><GATE>C1\r\nC2</GATE>"));
    assert_eq!(
        single_flight(&m).fields.get(&Field::Gate),
        Some(&set("C1\nC2"))
    );
}

#[test]
fn not_well_formed_documents_are_malformed() {
    let good = flop("<FLID>1</FLID><GATE>C1</GATE>");
    let cases: Vec<String> = vec![
        String::new(),
        "   \n".into(),
        "<!-- only a comment -->".into(),
        "plain text".into(),
        good.replace("</GATE>", "</GAT>"),
        good.replace("C1", "C1 & C2"),
        good.replace("C1", "C1 < C2"),
        good.replace("C1", "&nbsp;"),
        good.replace("C1", "&#0;"),
        good.replace("C1", "&#xD800;"),
        good.replace("C1", "&#x1;"),
        good.replace("C1", "&#xZZ;"),
        good.replace("C1", "&#;"),
        good.replace("C1", "C1]]>"),
        good.replace("C1", "C\u{1}1"),
        good.replace("C1", "C\u{fffe}1"),
        good.replace("</MSG>", ""),
        good.replace("</MSG>", "</MSG"),
        format!("{good}<MSG/>"),
        format!("{good}trailing"),
        format!("junk{good}"),
        format!("{good}&amp;"),
        format!("{good}<![CDATA[x]]>"),
        format!("{good}</MSG>"),
        format!("{good}<?xml version=\"1.0\"?>"),
        format!("<!-- c --><?xml version=\"1.0\"?>{good}"),
        format!("\u{feff}\u{feff}{good}"),
        format!("<!DOCTYPE MSG [<!ENTITY e \"x\">]>{good}"),
        good.replace("<GATE>", "<GATE a=\"1\" a=\"2\">"),
        good.replace("<GATE>", "<GATE a=1>"),
        good.replace("<GATE>", "<GATE a=\"<\">"),
        good.replace("<GATE>", "<GATE a=\"&bogus;\">"),
        good.replace("<GATE>C1</GATE>", "<1GATE>C1</1GATE>"),
        good.replace("<GATE>C1</GATE>", "< GATE/>"),
        good.replace("<GATE>C1</GATE>", "<!-- a -- b -->"),
        good.replace("<GATE>C1</GATE>", "<EXTRA><DEEP></EXTRA></DEEP>"),
    ];
    for raw in cases {
        let r = decode(&raw);
        assert_eq!(class(&r), Class::Malformed, "{raw:?} → {r:?}");
    }
}

#[test]
fn deep_nesting_neither_overflows_nor_stores_the_depth() {
    let depth = 200_000;
    let deep = format!("{}x{}", "<X>".repeat(depth), "</X>".repeat(depth));
    let raw = flop(&format!("<FLID>1</FLID>{deep}<GATE>C1</GATE>"));
    assert!(raw.len() < DEFAULT_MAX_BYTES);
    let m = ok(&raw);
    assert_eq!(
        single_flight(&m).fields,
        fields(&[(Field::Gate, set("C1"))])
    );
    // Unclosed deep nesting is truncated, not a crash.
    let raw = flop(&format!("<FLID>1</FLID>{}", "<X>".repeat(depth)));
    assert_eq!(class(&decode(&raw)), Class::Malformed);
}

#[test]
fn size_limit_is_checked_before_parsing() {
    let raw = fixture!("fdel.xml");
    let exact = XmlCodec::new(chrono_tz::Asia::Shanghai, raw.len(), vec![]);
    assert!(exact.decode(raw).is_ok());
    let small = XmlCodec::new(chrono_tz::Asia::Shanghai, raw.len() - 1, vec![]);
    assert_eq!(
        small.decode(raw),
        Err(CodecError::Malformed(format!(
            "message of {} bytes exceeds the {}-byte limit",
            raw.len(),
            raw.len() - 1
        )))
    );
    // Over the limit is malformed even when the text is not XML at all.
    let junk = "x".repeat(DEFAULT_MAX_BYTES + 1);
    match decode(&junk) {
        Err(CodecError::Malformed(m)) => assert!(m.contains("exceeds"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn defaults() {
    let c = codec();
    assert_eq!(c.tz(), chrono_tz::Asia::Shanghai);
    assert_eq!(c.max_bytes(), 4 * 1024 * 1024);
    assert_eq!(c.flop_subtypes(), FLOP_SUBTYPES.map(String::from));
    assert_eq!(DEFAULT_FLOP_SUBTYPES, FLOP_SUBTYPES);
}

#[test]
fn error_messages_cut_long_values() {
    let long = "9".repeat(10_000);
    let name = format!("N{}", "名".repeat(10_000));
    for raw in [
        flop(&format!("<FLID>1</FLID><FEXD>{long}</FEXD>")),
        flop(&format!("<FLID>{long}</FLID><FLIO>{long}</FLIO>")),
        format!("{}<{name}/>", flop("<FLID>1</FLID>")),
        flop(&format!("<FLID>1</FLID><{name}></{name}x>")),
        flop(&format!("<FLID>1</FLID><GATE>&{name};</GATE>")),
        format!("<{name}/>"),
    ] {
        let m = malformed_msg(&raw);
        assert!(m.chars().count() < 400, "{m}");
    }
    let meta = META_FLOP.replace("UPDT", &long);
    match decode(&msg(&meta, BODY_FLOP)) {
        Err(CodecError::Unsupported(m)) => assert!(m.len() < 200, "{m}"),
        other => panic!("{other:?}"),
    }
}

// ---- the upstream simulator's messages -------------------------------------------------------

fn now() -> NaiveDateTime {
    NaiveDate::from_ymd_opt(2026, 11, 30)
        .and_then(|d| d.and_hms_opt(9, 30, 0))
        .expect("valid time")
}

/// Checks a decoded generated message against its kind.
fn check_generated(kind: MessageKind, raw: &str, r: &Result<DecodedMessage, CodecError>) {
    match kind {
        MessageKind::Malformed(_) => {
            assert_eq!(class(r), Class::Malformed, "{kind:?}\n{raw}\n{r:?}")
        }
        MessageKind::UnknownType => {
            assert_eq!(class(r), Class::Unsupported, "{kind:?}\n{raw}\n{r:?}")
        }
        MessageKind::Flop(s) if !FLOP_SUBTYPES.contains(&s) => {
            assert_eq!(class(r), Class::Unsupported, "{kind:?}\n{raw}\n{r:?}")
        }
        _ => {
            let m = match r {
                Ok(m) => m,
                Err(e) => panic!("{kind:?} → {e:?}\n{raw}"),
            };
            assert_eq!(Some(m.meta.msg_type.as_str()), kind.type_code(), "{raw}");
            assert_eq!(
                m.meta.subtype.as_str(),
                kind.subtype().unwrap_or(""),
                "{raw}"
            );
            assert_eq!(m.meta.sender, "AODB");
            assert_eq!(m.meta.sent_at, utc("2026-11-30T01:30:00Z"));
            let ok_body = match (&kind, &m.body) {
                (
                    MessageKind::SchdDnld,
                    Body::Schedule {
                        kind: ScheduleKind::Download,
                        flights,
                        ..
                    },
                ) => !flights.is_empty(),
                (
                    MessageKind::SchdResp,
                    Body::Schedule {
                        kind: ScheduleKind::Response,
                        request_id,
                        flights,
                        ..
                    },
                ) => request_id.is_some() && !flights.is_empty(),
                (MessageKind::SchdAdft, Body::ScheduleAdd(_))
                | (MessageKind::Flop(_), Body::FlightUpdate(_))
                | (MessageKind::Fdel, Body::FlightDelete { .. })
                | (MessageKind::Adft, Body::AddFlight(_)) => true,
                _ => false,
            };
            assert!(ok_body, "{kind:?} decoded to {:?}", m.body);
        }
    }
}

#[test]
fn every_generated_kind_decodes_to_its_class() {
    let mut kinds = MessageKind::all_but_malformed();
    kinds.push(MessageKind::Flop("BRDG"));
    kinds.extend(MalformedKind::ALL.map(MessageKind::Malformed));
    let codec = codec();
    let mut count = 0;
    for seed in 0..24 {
        let mut g = Generator::new(seed);
        for &kind in &kinds {
            let raw = g.render(kind, now());
            check_generated(kind, &raw, &codec.decode(&raw));
            count += 1;
        }
    }
    assert!(count >= 400, "{count}");
    assert!(!UNKNOWN_TYPES.is_empty());
}

#[test]
fn a_generated_feed_decodes_message_by_message() {
    let codec = codec();
    let mix = Mix {
        malformed: 0.15,
        unknown_type: 0.05,
        schd_dnld: 0.02,
        schd_resp: 0.05,
        schd_adft: 0.05,
        ..Mix::default()
    };
    let mut g = Generator::with_sender(7, "AODB");
    let mut seen = std::collections::HashSet::new();
    for _ in 0..600 {
        let (kind, raw) = g.next_message(&mix, now());
        check_generated(kind, &raw, &codec.decode(&raw));
        seen.insert(std::mem::discriminant(&kind));
    }
    assert!(seen.len() >= 7, "the mix reached {} kinds", seen.len());
}

#[test]
fn a_huge_generated_schedule_decodes_within_the_default_limit_only() {
    let mut g = Generator::new(11);
    let raw = g.render_huge(now(), 1 << 20);
    let m = codec().decode(&raw).expect("a 1 MiB schedule decodes");
    assert!(matches!(&m.body, Body::Schedule { flights, .. } if flights.len() > 1000));
    let small = XmlCodec::new(chrono_tz::Asia::Shanghai, 512 * 1024, vec![]);
    assert_eq!(class(&small.decode(&raw)), Class::Malformed);
}
