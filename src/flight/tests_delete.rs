//! Unit tests for deletes and code-shares (cascade, idempotent re-delete, MFID).

use serde_json::json;

use super::tests::{msg, rec, state};
use super::*;
use crate::codec::model::{Body, Field};

fn types(p: &Plan) -> Vec<&'static str> {
    p.events.iter().map(|e| e.event_type.as_str()).collect()
}

#[test]
fn deleting_a_master_cascades_to_its_two_code_shares() {
    let st = state(&[
        ("M1", &[(Field::Flno, "5101")]),
        ("S2", &[(Field::Mfid, "M1")]),
        ("S1", &[(Field::Mfid, "M1")]),
        ("X1", &[(Field::Mfid, "OTHER")]),
    ]);
    let p = plan(&msg(Body::FlightDelete { flid: "M1".into() }, 1), 5, &st);
    let deleted: Vec<(&str, Option<&str>)> = p
        .changes
        .iter()
        .map(|c| match c {
            FlightChange::Deleted { before, cascade_of } => {
                (before.flid.as_str(), cascade_of.as_deref())
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        deleted,
        [("M1", None), ("S1", Some("M1")), ("S2", Some("M1"))]
    );
    assert_eq!(types(&p), ["FLIGHT_DELETED"; 3]);
    assert_eq!(p.events[0].payload["cascade_of"], json!(null));
    assert_eq!(p.events[0].payload["before"], json!({"FLNO": "5101"}));
    assert_eq!(p.events[2].payload["cascade_of"], json!("M1"));
    assert_eq!(p.events[2].flight_key, "S2");
}

#[test]
fn re_deleting_an_absent_flight_is_a_noop() {
    let st = state(&[("S1", &[(Field::Mfid, "M1")])]);
    let p = plan(&msg(Body::FlightDelete { flid: "M1".into() }, 1), 5, &st);
    assert!(p.is_noop());
    assert_eq!(p, Plan::default());
}

#[test]
fn deleting_a_code_share_leaves_its_master() {
    let mut st = state(&[("M1", &[]), ("S1", &[(Field::Mfid, "M1")])]);
    let p = plan(&msg(Body::FlightDelete { flid: "S1".into() }, 1), 5, &st);
    assert_eq!(p.changes.len(), 1);
    p.apply(&mut st);
    assert_eq!(st.keys().collect::<Vec<_>>(), ["M1"]);
}

#[test]
fn setting_mfid_makes_a_code_share() {
    let mut st = state(&[("M1", &[]), ("S1", &[])]);
    let set = msg(
        Body::FlightUpdate(rec("S1", &[(Field::Mfid, Some("M1"))])),
        1,
    );
    let p = plan(&set, 1, &st);
    assert_eq!(p.changes.len(), 1, "only the share's row changes");
    p.apply(&mut st);
    assert_eq!(st["S1"].master(), Some("M1"));
    let del = plan(&msg(Body::FlightDelete { flid: "M1".into() }, 2), 2, &st);
    del.apply(&mut st);
    assert!(st.is_empty());
}
