//! The ordering guard for late messages: examples and properties (never lowers a version,
//! equals `plan` for a message newer than everything, a late FLOP ends as in send order).

use std::cmp::Ordering;
use std::collections::BTreeMap;

use chrono::{DateTime, Duration, TimeZone, Utc};
use proptest::prelude::*;
use serde_json::json;

use super::guard::{compare, is_newer, REFUSED_CREATE, REFUSED_DELETE};
use super::proptests::{flid_of, loaded, record_of, FIELDS};
use super::tests::{msg, rec, schedule};
use super::*;
use crate::codec::model::{Body, DecodedMessage, Field, FieldValue, FlightRecord};

fn base() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 1, 0, 0).unwrap()
}

/// A message with this body sent `sec` seconds after the base time.
fn at(body: Body, sec: i64) -> DecodedMessage {
    let mut m = msg(body, 0);
    m.meta.sent_at = base() + Duration::seconds(sec);
    m
}

/// The changes of `p`, of which the guard refused nothing.
fn applied(p: &GuardedPlan) -> &[FlightChange] {
    assert!(p.refused.is_empty(), "refused: {:?}", p.refused);
    &p.plan.changes
}

fn v(sec: i64, msg_id: i64) -> FieldVersion {
    FieldVersion {
        at: base() + Duration::seconds(sec),
        msg_id,
    }
}

/// A flight with these `(field, value, version)`s; `None` value: cleared (version only).
fn flight(flid: &str, fields: &[(Field, Option<&str>, FieldVersion)]) -> Flight {
    let mut f = Flight::new(flid);
    for (field, value, version) in fields {
        if let Some(value) = value {
            f.fields.insert(*field, value.to_string());
        }
        f.versions.insert(*field, *version);
    }
    f
}

fn states(flights: Vec<Flight>) -> BTreeMap<String, Flight> {
    flights.into_iter().map(|f| (f.flid.clone(), f)).collect()
}

fn flop(flid: &str, fields: &[(Field, Option<&str>)]) -> Body {
    Body::FlightUpdate(rec(flid, fields))
}

fn refused(p: &GuardedPlan) -> serde_json::Value {
    p.refused.to_json()
}

#[test]
fn versions_order_by_inbox_id_not_send_time() {
    assert_eq!(compare(&v(10, 9), &v(11, 1)), Ordering::Greater);
    assert_eq!(compare(&v(10, 9), &v(10, 3)), Ordering::Greater);
    assert_eq!(compare(&v(10, 3), &v(99, 3)), Ordering::Equal);
    assert!(is_newer(&v(1, 4), &v(10, 3)));
    assert!(!is_newer(&v(10, 3), &v(10, 3)));
}

#[test]
fn a_newer_message_resending_an_unchanged_value_still_wins_over_a_late_one() {
    // id 10 GATE=A1, id 12 re-sends A1, late id 11 GATE=B7: in id order the flight ends at A1.
    let mut st = BTreeMap::new();
    let m10 = at(flop("F1", &[(Field::Gate, Some("A1"))]), 0);
    let m12 = at(flop("F1", &[(Field::Gate, Some("A1"))]), 2);
    let m11 = at(flop("F1", &[(Field::Gate, Some("B7"))]), 1);
    plan(&m10, 10, &st).apply(&mut st);
    plan(&m12, 12, &st).apply(&mut st);
    assert_eq!(st["F1"].versions[&Field::Gate].msg_id, 12, "restamped");
    let p = plan_guarded(&m11, 11, &st, &Tombstones::new());
    assert_eq!(refused(&p), json!({"F1": ["GATE"]}));
    p.plan.apply(&mut st);
    assert_eq!(st["F1"].get(Field::Gate), Some("A1"));
}

#[test]
fn a_late_flop_keeps_newer_fields_and_applies_older_and_unset_ones() {
    let st = states(vec![flight(
        "F1",
        &[
            (Field::Gate, Some("B2"), v(20, 3)),
            (Field::Stnd, Some("S1"), v(5, 1)),
        ],
    )]);
    let late = at(
        flop(
            "F1",
            &[
                (Field::Gate, Some("A1")),
                (Field::Stnd, Some("S5")),
                (Field::Blts, Some("7")),
            ],
        ),
        10,
    );
    let p = plan_guarded(&late, 2, &st, &Tombstones::new());
    assert_eq!(refused(&p), json!({"F1": ["GATE"]}));
    assert_eq!(p.refused.labels(), ["F1.GATE"]);
    assert_eq!(p.refused.count(), 1);
    let [FlightChange::Updated { after, changed, .. }] = p.plan.changes.as_slice() else {
        panic!("{:?}", p.plan.changes)
    };
    assert_eq!(changed, &[Field::Stnd, Field::Blts]);
    assert_eq!(after.get(Field::Gate), Some("B2"), "newer value kept");
    assert_eq!(after.versions[&Field::Gate], v(20, 3), "and its version");
    assert_eq!(after.get(Field::Stnd), Some("S5"));
    assert_eq!(after.versions[&Field::Stnd], v(10, 2));
    assert_eq!(after.get(Field::Blts), Some("7"));
    // The event tells only what was applied.
    assert_eq!(
        p.plan.events[0].payload["changes"],
        json!({"STND": {"before": "S1", "after": "S5"}, "BLTS": {"before": null, "after": "7"}})
    );
}

#[test]
fn a_newer_clear_is_not_undone_and_a_late_clear_does_not_remove_a_newer_value() {
    let st = states(vec![flight(
        "F1",
        &[
            (Field::Gate, None, v(20, 3)),
            (Field::Stnd, Some("S9"), v(20, 3)),
        ],
    )]);
    let late = at(
        flop("F1", &[(Field::Gate, Some("A1")), (Field::Stnd, None)]),
        10,
    );
    let p = plan_guarded(&late, 2, &st, &Tombstones::new());
    assert!(p.plan.is_noop(), "{:?}", p.plan);
    assert_eq!(refused(&p), json!({"F1": ["GATE", "STND"]}));
}

#[test]
fn an_unchanged_value_is_neither_a_change_nor_a_refusal() {
    let st = states(vec![flight("F1", &[(Field::Gate, Some("A1"), v(20, 3))])]);
    let p = plan_guarded(
        &at(flop("F1", &[(Field::Gate, Some("A1"))]), 10),
        2,
        &st,
        &Tombstones::new(),
    );
    assert!(p.plan.is_noop());
    assert!(p.refused.is_empty());
}

#[test]
fn equal_send_times_fall_back_to_inbox_id_order() {
    let st = states(vec![flight("F1", &[(Field::Gate, Some("B2"), v(10, 5))])]);
    let late = at(flop("F1", &[(Field::Gate, Some("A1"))]), 10);
    let older_id = plan_guarded(&late, 3, &st, &Tombstones::new());
    assert_eq!(refused(&older_id), json!({"F1": ["GATE"]}));
    let newer_id = plan_guarded(&late, 7, &st, &Tombstones::new());
    assert!(newer_id.refused.is_empty());
    assert_eq!(newer_id.plan.changes.len(), 1);
}

#[test]
fn a_late_delete_of_a_flight_touched_later_is_refused_and_recorded() {
    let st = states(vec![flight(
        "F1",
        &[
            (Field::Flno, Some("5101"), v(1, 1)),
            (Field::Gate, Some("B2"), v(20, 3)),
        ],
    )]);
    let del = Body::FlightDelete { flid: "F1".into() };
    let p = plan_guarded(&at(del.clone(), 10), 2, &st, &Tombstones::new());
    assert!(p.plan.is_noop());
    assert_eq!(refused(&p), json!({"F1": [REFUSED_DELETE]}));
    // With an id after every write to the flight: applied (whatever its send time).
    let p = plan_guarded(&at(del, 0), 4, &st, &Tombstones::new());
    assert!(matches!(applied(&p), [FlightChange::Deleted { .. }]));
}

#[test]
fn a_late_master_delete_checks_each_code_share() {
    let st = states(vec![
        flight("M1", &[(Field::Flno, Some("5101"), v(1, 1))]),
        flight("S1", &[(Field::Mfid, Some("M1"), v(1, 1))]),
        flight(
            "S2",
            &[
                (Field::Mfid, Some("M1"), v(1, 1)),
                (Field::Gate, Some("B2"), v(20, 3)),
            ],
        ),
    ]);
    let del = at(Body::FlightDelete { flid: "M1".into() }, 10);
    let p = plan_guarded(&del, 2, &st, &Tombstones::new());
    let deleted: Vec<&str> = p.plan.changes.iter().map(FlightChange::flid).collect();
    assert_eq!(deleted, ["M1", "S1"]);
    assert_eq!(refused(&p), json!({"S2": [REFUSED_DELETE]}));

    // A refused master keeps its code-shares (the cascade follows an applied delete only).
    let mut st = st;
    st.get_mut("M1")
        .unwrap()
        .versions
        .insert(Field::Stat, v(20, 3));
    let p = plan_guarded(&del, 2, &st, &Tombstones::new());
    assert!(p.plan.is_noop());
    assert_eq!(refused(&p), json!({"M1": [REFUSED_DELETE]}));
}

#[test]
fn a_late_message_does_not_resurrect_a_flight_deleted_by_a_newer_message() {
    let late = at(
        flop("F1", &[(Field::Gate, Some("A1")), (Field::Stnd, None)]),
        10,
    );
    let deleted_later = Tombstones::from([("F1".to_string(), v(20, 3))]);
    let p = plan_guarded(&late, 2, &BTreeMap::new(), &deleted_later);
    assert!(p.plan.is_noop());
    assert_eq!(refused(&p), json!({"F1": [REFUSED_CREATE, "GATE"]}));
    // Deleted before the late message was sent: created as in id order.
    let deleted_before = Tombstones::from([("F1".to_string(), v(5, 1))]);
    let p = plan_guarded(&late, 2, &BTreeMap::new(), &deleted_before);
    assert!(matches!(applied(&p), [FlightChange::Created { .. }]));
}

#[test]
fn a_newer_delete_protects_every_field_of_a_flight_created_again() {
    // Deleted at 20, created again at 30 without GATE: the late GATE (10) belongs to the
    // flight that was deleted.
    let st = states(vec![flight("F1", &[(Field::Stnd, Some("S1"), v(30, 4))])]);
    let tomb = Tombstones::from([("F1".to_string(), v(20, 3))]);
    let late = at(flop("F1", &[(Field::Gate, Some("A1"))]), 10);
    let p = plan_guarded(&late, 2, &st, &tomb);
    assert!(p.plan.is_noop());
    assert_eq!(refused(&p), json!({"F1": ["GATE"]}));
    let del = plan_guarded(
        &at(Body::FlightDelete { flid: "F1".into() }, 25),
        2,
        &st,
        &tomb,
    );
    assert_eq!(refused(&del), json!({"F1": [REFUSED_DELETE]}));
}

#[test]
fn a_late_schedule_is_applied_field_by_field_and_still_announced() {
    let st = states(vec![
        flight("F1", &[(Field::Gate, Some("B2"), v(20, 3))]),
        flight("F2", &[(Field::Gate, Some("G2"), v(1, 1))]),
    ]);
    let body = schedule(vec![
        rec("F1", &[(Field::Gate, Some("A1"))]),
        rec("F2", &[(Field::Gate, Some("G5"))]),
        rec("F3", &[(Field::Gate, Some("G3"))]),
    ]);
    let p = plan_guarded(&at(body, 10), 2, &st, &Tombstones::new());
    let snap = p.plan.snapshot.clone().unwrap();
    assert_eq!((snap.created, snap.updated, snap.unchanged), (1, 1, 1));
    assert_eq!(refused(&p), json!({"F1": ["GATE"]}));
    let types: Vec<&str> = p
        .plan
        .events
        .iter()
        .map(|e| e.event_type.as_str())
        .collect();
    assert_eq!(
        types,
        ["FLIGHT_UPDATED", "FLIGHT_CREATED", "SCHEDULE_APPLIED"]
    );
}

#[test]
fn refusals_are_recorded_once_per_field() {
    let st = states(vec![flight("F1", &[(Field::Gate, Some("B2"), v(20, 3))])]);
    let body = schedule(vec![
        rec("F1", &[(Field::Gate, Some("A1"))]),
        rec("F1", &[(Field::Gate, Some("A2"))]),
    ]);
    let p = plan_guarded(&at(body, 10), 2, &st, &Tombstones::new());
    assert_eq!(refused(&p), json!({"F1": ["GATE"]}));
}

// ---- properties ----------------------------------------------------------------------------

/// A flight's values and the `MSG_ID` versions of its fields.
type FieldsAndVersions = (BTreeMap<Field, String>, BTreeMap<Field, i64>);

const FLIDS: [&str; 3] = ["F1", "F2", "F3"];

fn body() -> impl Strategy<Value = Body> {
    prop_oneof![
        prop::collection::vec(record_of(&FLIDS), 0..4).prop_map(schedule),
        record_of(&FLIDS).prop_map(Body::FlightUpdate),
        record_of(&FLIDS).prop_map(Body::AddFlight),
        flid_of(&FLIDS).prop_map(|flid| Body::FlightDelete { flid }),
    ]
}

/// A history processed in id order (send times need not ascend: upstream clocks drift) and
/// the tombstones its deletes left, as the store derives them from `FLIGHT_DELETED` events.
fn history() -> impl Strategy<Value = (BTreeMap<String, Flight>, Tombstones)> {
    prop::collection::vec((body(), 0i64..40), 0..8).prop_map(|msgs| {
        let mut st = BTreeMap::new();
        let mut tombs = Tombstones::new();
        for (i, (b, sec)) in msgs.into_iter().enumerate() {
            let id = 100 + i as i64;
            let p = plan(&at(b, sec), id, &st);
            for c in &p.changes {
                if let FlightChange::Deleted { before, .. } = c {
                    let t = tombs.entry(before.flid.clone()).or_insert(v(sec, id));
                    if is_newer(&v(sec, id), t) {
                        *t = v(sec, id);
                    }
                }
            }
            p.apply(&mut st);
        }
        (st, tombs)
    })
}

proptest! {
    #[test]
    fn a_guarded_plan_never_lowers_a_field_version(
        (st, tombs) in history(), b in body(), sec in 0i64..40,
    ) {
        let late = at(b, sec);
        let mine = v(sec, 50);
        let cur = loaded(&late, &st);
        let p = plan_guarded(&late, 50, &cur, &tombs);
        for change in &p.plan.changes {
            match change {
                FlightChange::Updated { before, after, changed } => {
                    for (f, old) in &before.versions {
                        let new = after.versions.get(f);
                        prop_assert!(
                            new.is_some_and(|n| compare(n, old) != Ordering::Less),
                            "{} {:?}: {:?} -> {:?}", before.flid, f, old, new
                        );
                    }
                    for f in changed {
                        prop_assert_eq!(after.versions[f], mine);
                    }
                }
                FlightChange::Created { after } => {
                    prop_assert!(!tombs.get(&after.flid).is_some_and(|t| is_newer(t, &mine)));
                }
                FlightChange::Deleted { before, .. } => {
                    prop_assert!(!before.versions.values().any(|x| is_newer(x, &mine)));
                    prop_assert!(!tombs.get(&before.flid).is_some_and(|t| is_newer(t, &mine)));
                }
            }
        }
        // Every refusal names a newer version.
        for (flid, tags) in p.refused.by_flight() {
            let tomb_newer = tombs.get(flid).is_some_and(|t| is_newer(t, &mine));
            for tag in tags {
                let justified = match Field::from_tag(tag) {
                    Some(f) => tomb_newer
                        || cur.get(flid).and_then(|c| c.versions.get(&f)).is_some_and(|x| is_newer(x, &mine)),
                    None if tag == REFUSED_DELETE => tomb_newer
                        || cur[flid].versions.values().any(|x| is_newer(x, &mine)),
                    None => tag == REFUSED_CREATE && tomb_newer,
                };
                prop_assert!(justified, "{}.{} refused without a newer version", flid, tag);
            }
        }
    }

    #[test]
    fn a_message_newer_than_everything_plans_exactly_as_in_order(
        (st, tombs) in history(), b in body(),
    ) {
        let m = at(b, 100);
        let cur = loaded(&m, &st);
        let p = plan_guarded(&m, 500, &cur, &tombs);
        prop_assert!(p.refused.is_empty());
        prop_assert_eq!(p.plan, plan(&m, 500, &cur));
    }

    /// FLOPs carrying fresh values (so every carried field changes and is versioned): one of
    /// them processed last under the guard ends exactly as processing all in send order.
    #[test]
    fn a_late_flop_ends_as_in_send_order(
        flops in prop::collection::vec(
            (flid_of(&FLIDS), prop::collection::btree_set(prop::sample::select(&FIELDS[..3]), 1..3)),
            1..10,
        ),
        pick in any::<prop::sample::Index>(),
    ) {
        let msgs: Vec<DecodedMessage> = flops
            .iter()
            .enumerate()
            .map(|(i, (flid, fields))| {
                let fields = fields
                    .iter()
                    .map(|f| (*f, FieldValue::Set(format!("v{i}"))))
                    .collect();
                at(Body::FlightUpdate(FlightRecord { flid: flid.clone(), fields }), i as i64)
            })
            .collect();
        let mut in_order = BTreeMap::new();
        for (i, m) in msgs.iter().enumerate() {
            plan(m, i as i64, &loaded(m, &in_order)).apply(&mut in_order);
        }
        let k = pick.index(msgs.len());
        let mut late_last = BTreeMap::new();
        for (i, m) in msgs.iter().enumerate().filter(|(i, _)| *i != k) {
            plan(m, i as i64, &loaded(m, &late_last)).apply(&mut late_last);
        }
        let late = &msgs[k];
        plan_guarded(late, k as i64, &loaded(late, &late_last), &Tombstones::new())
            .plan
            .apply(&mut late_last);
        // Values and versions alike.
        prop_assert_eq!(late_last, in_order);
    }

    /// Random FLOP/ADFT sequences (values from a small set, so re-sends of unchanged values
    /// and clears are common) with a random subset arriving late — processed after all the
    /// others, in a random order among themselves, under the guard — end, field by field
    /// (values and versions), exactly as processing strictly in `MSG_ID` order.
    #[test]
    fn late_arrivals_end_as_in_id_order(
        msgs in prop::collection::vec((prop::bool::ANY, record_of(&FLIDS), 0i64..40), 1..14),
        late_mask in prop::collection::vec(prop::bool::weighted(0.3), 14),
        late_order in Just(()).prop_perturb(|_, mut rng| rng.random::<u64>()),
    ) {
        let msgs: Vec<(i64, DecodedMessage)> = msgs
            .into_iter()
            .enumerate()
            .map(|(i, (adft, r, sec))| {
                let body = if adft { Body::AddFlight(r) } else { Body::FlightUpdate(r) };
                (100 + i as i64, at(body, sec))
            })
            .collect();
        let mut in_order = BTreeMap::new();
        for (id, m) in &msgs {
            plan(m, *id, &loaded(m, &in_order)).apply(&mut in_order);
        }
        let (late, on_time): (Vec<_>, Vec<_>) =
            msgs.iter().enumerate().partition(|(i, _)| late_mask[*i]);
        let mut st = BTreeMap::new();
        for (_, (id, m)) in &on_time {
            plan(m, *id, &loaded(m, &st)).apply(&mut st);
        }
        let mut late: Vec<_> = late.into_iter().map(|(_, x)| x).collect();
        // A deterministic shuffle from the drawn seed.
        let mut seed = late_order;
        for i in (1..late.len()).rev() {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            late.swap(i, (seed >> 33) as usize % (i + 1));
        }
        for (id, m) in late {
            plan_guarded(m, *id, &loaded(m, &st), &Tombstones::new()).plan.apply(&mut st);
        }
        let ids = |s: &BTreeMap<String, Flight>| -> BTreeMap<String, FieldsAndVersions> {
            s.iter()
                .map(|(k, f)| (k.clone(), (f.fields.clone(), f.versions.iter().map(|(fd, v)| (*fd, v.msg_id)).collect())))
                .collect()
        };
        prop_assert_eq!(ids(&st), ids(&in_order));
    }
}
