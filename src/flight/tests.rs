//! Unit tests for the flight rules (examples); see `proptests.rs` for the properties.

use std::collections::BTreeMap;

use chrono::{NaiveDate, TimeZone, Utc};
use serde_json::json;

use super::*;
use crate::codec::model::{
    Body, DecodedMessage, Field, FieldValue, FlightRecord, Meta, ScheduleKind,
};

/// A message with this body, sent at second `sec` of a fixed minute.
pub(super) fn msg(body: Body, sec: u32) -> DecodedMessage {
    let msg_type = match &body {
        Body::Schedule { .. } | Body::ScheduleAdd(_) => "SCHD",
        Body::FlightUpdate(_) => "FLOP",
        Body::FlightDelete { .. } => "FDEL",
        Body::AddFlight(_) => "ADFT",
    };
    DecodedMessage {
        meta: Meta {
            sender: "AODB".into(),
            receiver: None,
            seqn: i64::from(sec),
            sent_at: Utc.with_ymd_and_hms(2026, 11, 30, 1, 30, sec).unwrap(),
            msg_type: msg_type.into(),
            subtype: "UPDT".into(),
        },
        body,
    }
}

/// A record: `Some(v)` sets, `None` clears.
pub(super) fn rec(flid: &str, fields: &[(Field, Option<&str>)]) -> FlightRecord {
    FlightRecord {
        flid: flid.into(),
        fields: fields
            .iter()
            .map(|(f, v)| {
                (
                    *f,
                    v.map_or(FieldValue::Clear, |v| FieldValue::Set(v.into())),
                )
            })
            .collect(),
    }
}

/// A state holding these flights (no versions).
pub(super) fn state(flights: &[(&str, &[(Field, &str)])]) -> BTreeMap<String, Flight> {
    let flight = |(flid, fields): &(&str, &[(Field, &str)])| {
        let mut f = Flight::new(*flid);
        f.fields = fields.iter().map(|(k, v)| (*k, v.to_string())).collect();
        (flid.to_string(), f)
    };
    flights.iter().map(flight).collect()
}

/// The daily schedule download of 2026-11-30 with `flights`.
pub(super) fn schedule(flights: Vec<FlightRecord>) -> Body {
    Body::Schedule {
        kind: ScheduleKind::Download,
        date: NaiveDate::from_ymd_opt(2026, 11, 30).unwrap(),
        request_id: None,
        flights,
    }
}

fn types(p: &Plan) -> Vec<&'static str> {
    p.events.iter().map(|e| e.event_type.as_str()).collect()
}

#[test]
fn schedule_merge_keeps_absent_flights_and_uncarried_fields_and_clears() {
    let mut st = state(&[
        ("F1", &[(Field::Gate, "G1"), (Field::Stnd, "S1")]),
        ("F2", &[(Field::Gate, "G2")]),
    ]);
    let sched = schedule(vec![rec(
        "F1",
        &[(Field::Gate, Some("G9")), (Field::Stnd, None)],
    )]);
    let p = plan(&msg(sched, 1), 7, &st);
    p.apply(&mut st);
    assert_eq!(
        st["F1"].fields,
        BTreeMap::from([(Field::Gate, "G9".into())])
    );
    assert_eq!(st["F2"].get(Field::Gate), Some("G2"), "absent flight kept");
    assert_eq!(types(&p), ["FLIGHT_UPDATED", "SCHEDULE_APPLIED"]);

    // A field the schedule does not carry is kept.
    let p = plan(
        &msg(schedule(vec![rec("F2", &[(Field::Stat, Some("X"))])]), 2),
        8,
        &st,
    );
    p.apply(&mut st);
    assert_eq!(st["F2"].get(Field::Gate), Some("G2"));
    assert_eq!(st["F2"].get(Field::Stat), Some("X"));
}

#[test]
fn schedule_applied_counts_and_comes_last() {
    let st = state(&[
        ("F1", &[(Field::Gate, "G1")]),
        ("F2", &[(Field::Gate, "G2")]),
    ]);
    let body = Body::Schedule {
        kind: ScheduleKind::Response,
        date: NaiveDate::from_ymd_opt(2026, 11, 30).unwrap(),
        request_id: Some("RQ1".into()),
        flights: vec![
            rec("F1", &[(Field::Gate, Some("G1"))]),
            rec("F3", &[(Field::Gate, Some("G3")), (Field::Stnd, None)]),
            rec("F2", &[(Field::Gate, Some("G5"))]),
        ],
    };
    let p = plan(&msg(body, 1), 9, &st);
    let snap = p.snapshot.clone().unwrap();
    assert_eq!((snap.created, snap.updated, snap.unchanged), (1, 1, 1));
    assert_eq!(snap.kind, "RESP");
    assert_eq!(snap.flights, ["F1", "F3", "F2"]);
    assert_eq!(
        types(&p),
        ["FLIGHT_CREATED", "FLIGHT_UPDATED", "SCHEDULE_APPLIED"]
    );
    let last = p.events.last().unwrap();
    assert_eq!(last.flight_key, "SCHD:20261130");
    assert_eq!(
        last.payload,
        json!({"msg_id": 9, "date": "20261130", "kind": "RESP", "flights": ["F1", "F3", "F2"],
               "created": 1, "updated": 1, "unchanged": 1, "request_id": "RQ1"})
    );
    // F1 re-sent unchanged: restamped (written, no event), counted as unchanged.
    assert!(p.changes[0].is_restamp(), "{:?}", p.changes[0]);
    // Created with its Set fields only: the Clear on a new flight sets nothing, but versions
    // the field (an older late value may not set it).
    let FlightChange::Created { after } = &p.changes[1] else {
        panic!("{:?}", p.changes[1])
    };
    assert_eq!(after.fields, BTreeMap::from([(Field::Gate, "G3".into())]));
    assert_eq!(after.versions[&Field::Stnd].msg_id, 9);
}

#[test]
fn a_flight_repeated_in_one_schedule_is_applied_once_later_values_winning() {
    let st = state(&[("F2", &[(Field::Gate, "G2")])]);
    let body = schedule(vec![
        rec("F1", &[(Field::Gate, Some("G1")), (Field::Stat, Some("X"))]),
        rec("F2", &[(Field::Gate, Some("G2"))]),
        rec("F1", &[(Field::Stnd, Some("S1")), (Field::Gate, None)]),
    ]);
    let p = plan(&msg(body, 1), 1, &st);
    let snap = p.snapshot.clone().unwrap();
    assert_eq!(snap.flights, ["F1", "F2"]);
    assert_eq!((snap.created, snap.updated, snap.unchanged), (1, 0, 1));
    let FlightChange::Created { after } = &p.changes[0] else {
        panic!("{p:?}")
    };
    let want = BTreeMap::from([(Field::Stat, "X".into()), (Field::Stnd, "S1".into())]);
    assert_eq!(after.fields, want);
    assert_eq!(p.changes.len(), 2, "F1 created, F2 restamped");
    assert!(p.changes[1].is_restamp());
    assert_eq!(
        p.events.len(),
        2,
        "FLIGHT_CREATED and SCHEDULE_APPLIED only"
    );
}

#[test]
fn flop_on_unknown_flight_creates_it() {
    let body = Body::FlightUpdate(rec("F1", &[(Field::Gate, Some("G1")), (Field::Atot, None)]));
    let p = plan(&msg(body, 1), 3, &BTreeMap::new());
    assert_eq!(types(&p), ["FLIGHT_CREATED"]);
    assert_eq!(p.events[0].flight_key, "F1");
    assert_eq!(p.events[0].payload["after"], json!({"GATE": "G1"}));
    assert_eq!(p.events[0].payload["msg_id"], json!(3));
    assert!(p.snapshot.is_none());
}

#[test]
fn flop_without_an_actual_change_restamps_and_raises_nothing() {
    let st = state(&[("F1", &[(Field::Gate, "G1")])]);
    let body = Body::FlightUpdate(rec("F1", &[(Field::Gate, Some("G1")), (Field::Stnd, None)]));
    let m = msg(body, 1);
    let p = plan(&m, 3, &st);
    assert!(p.events.is_empty(), "{p:?}");
    assert_eq!(p.changes.len(), 1);
    assert!(p.changes[0].is_restamp());
    let after = p.changes[0].after().expect("row");
    assert_eq!(after.fields, st["F1"].fields);
    assert_eq!(after.versions[&Field::Gate].msg_id, 3);
    assert_eq!(after.versions[&Field::Stnd].msg_id, 3);
    // Over its own result it is a no-op.
    let mut st = st;
    p.apply(&mut st);
    assert!(plan(&m, 3, &st).is_noop());
}

#[test]
fn update_event_lists_before_and_after_with_null_for_absent() {
    let st = state(&[("F1", &[(Field::Gate, "G1"), (Field::Stnd, "S1")])]);
    let body = Body::FlightUpdate(rec(
        "F1",
        &[
            (Field::Gate, Some("G2")),
            (Field::Stnd, None),
            (Field::Blts, Some("B1")),
        ],
    ));
    let p = plan(&msg(body, 1), 4, &st);
    let FlightChange::Updated { changed, .. } = &p.changes[0] else {
        panic!()
    };
    assert_eq!(changed, &[Field::Gate, Field::Stnd, Field::Blts]);
    assert_eq!(
        p.events[0].payload["changes"],
        json!({"GATE": {"before": "G1", "after": "G2"}, "STND": {"before": "S1", "after": null},
               "BLTS": {"before": null, "after": "B1"}})
    );
    assert_eq!(p.events[0].payload["subtype"], json!("UPDT"));
}

/// Applies `m` as message `msg_id` to `st`; the version it gives the fields it carries.
fn apply_as(m: &DecodedMessage, msg_id: i64, st: &mut BTreeMap<String, Flight>) -> FieldVersion {
    plan(m, msg_id, st).apply(st);
    FieldVersion {
        at: m.meta.sent_at,
        msg_id,
    }
}

#[test]
fn every_carried_field_is_versioned_changed_or_not() {
    let mut st = BTreeMap::new();
    let m1 = msg(
        Body::AddFlight(rec(
            "F1",
            &[(Field::Gate, Some("G1")), (Field::Stnd, Some("S1"))],
        )),
        1,
    );
    let v1 = apply_as(&m1, 10, &mut st);
    assert_eq!(
        st["F1"].versions,
        BTreeMap::from([(Field::Gate, v1), (Field::Stnd, v1)])
    );

    let m2 = msg(
        Body::FlightUpdate(rec(
            "F1",
            &[
                (Field::Gate, Some("G1")),
                (Field::Stnd, None),
                (Field::Etot, None),
            ],
        )),
        2,
    );
    let v2 = apply_as(&m2, 11, &mut st);
    // GATE re-sent unchanged and STND cleared get v2 (kept as a tombstone); so does ETOT,
    // cleared while absent: a late older message may not set any of them.
    assert_eq!(
        st["F1"].versions,
        BTreeMap::from([(Field::Gate, v2), (Field::Stnd, v2), (Field::Etot, v2)])
    );
    assert_ne!(v1, v2);
    assert_eq!(
        st["F1"].fields,
        BTreeMap::from([(Field::Gate, "G1".into())])
    );
}

#[test]
fn flights_to_load_is_deduplicated_in_message_order() {
    let body = schedule(vec![rec("F2", &[]), rec("F1", &[]), rec("F2", &[])]);
    assert_eq!(flights_to_load(&msg(body, 1)), ["F2", "F1"]);
    let del = msg(Body::FlightDelete { flid: "M1".into() }, 1);
    assert_eq!(flights_to_load(&del), ["M1"]);
}

#[test]
fn flight_json_uses_tags_and_round_trips() {
    let mut st = BTreeMap::new();
    let m = msg(Body::AddFlight(rec("F1", &[(Field::Mfid, Some("M1"))])), 1);
    plan(&m, 10, &st).apply(&mut st);
    let value = serde_json::to_value(&st["F1"]).unwrap();
    assert_eq!(value["fields"], json!({"MFID": "M1"}));
    assert_eq!(value["versions"]["MFID"]["msg_id"], json!(10));
    let back: Flight = serde_json::from_value(value).unwrap();
    assert_eq!(back, st["F1"]);
    let bad = json!({"flid": "F", "fields": {"NOPE": "x"}, "versions": {}});
    assert!(serde_json::from_value::<Flight>(bad).is_err());
}

#[test]
fn names_keys_and_masters() {
    for t in [
        EventType::FlightCreated,
        EventType::FlightUpdated,
        EventType::FlightDeleted,
        EventType::ScheduleApplied,
    ] {
        assert_eq!(serde_json::to_value(t).unwrap(), json!(t.as_str()));
    }
    assert_eq!(
        fallback_key("MU", "5101", "20261130", "D"),
        "MU|5101|20261130|D"
    );
    let st = state(&[("S1", &[(Field::Mfid, "")])]);
    assert_eq!(st["S1"].master(), None);
    assert_eq!(st["S1"].key(), "S1");
}

/// The outcome statement's JSON text of a flight is what its serde form holds under
/// `fields` and `versions` (the store keeps those two objects).
#[test]
fn columns_json_is_the_serde_form() {
    let mut f = Flight::new("F1");
    f.fields.insert(Field::Gate, "A12".into());
    f.fields.insert(Field::Mfid, "F0".into());
    let at = Utc.with_ymd_and_hms(2026, 11, 30, 1, 30, 5).unwrap();
    f.versions
        .insert(Field::Gate, FieldVersion { at, msg_id: 7 });
    f.versions
        .insert(Field::Stnd, FieldVersion { at, msg_id: 8 });
    let (fields, versions) = f.columns_json().expect("json");
    let whole = serde_json::to_value(&f).expect("value");
    let parse = |s: &str| serde_json::from_str::<serde_json::Value>(s).expect("parse");
    assert_eq!(parse(&fields), whole["fields"]);
    assert_eq!(parse(&versions), whole["versions"]);
    assert_eq!(parse(&fields), json!({"GATE": "A12", "MFID": "F0"}));
}
