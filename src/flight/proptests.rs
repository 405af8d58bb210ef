//! Properties of the flight rules: idempotence, FLOP folding, plan shape.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::tests::{msg, rec, schedule};
use super::*;
use crate::codec::model::{Body, DecodedMessage, Field, FieldValue, FlightRecord};

const FLIDS: [&str; 4] = ["F1", "F2", "F3", "F4"];
/// The fields the properties carry (MFID values are flids).
pub(super) const FIELDS: [Field; 4] = [Field::Gate, Field::Stnd, Field::Stat, Field::Mfid];

/// One of `flids`.
pub(super) fn flid_of(flids: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop::sample::select(flids).prop_map(str::to_string)
}

fn flid() -> impl Strategy<Value = String> {
    flid_of(&FLIDS)
}

/// A carried value: a small value set (MFID values are flids) or a clear.
fn field_value() -> impl Strategy<Value = (Field, Option<String>)> {
    (
        prop::sample::select(&FIELDS[..]),
        prop::option::of(prop::sample::select(&["A", "B", "F1", "F2"][..])),
    )
        .prop_map(|(f, v)| (f, v.map(str::to_string)))
}

/// A record of one of `flids` carrying up to four values or clears.
pub(super) fn record_of(flids: &'static [&'static str]) -> impl Strategy<Value = FlightRecord> {
    (flid_of(flids), prop::collection::vec(field_value(), 0..5)).prop_map(|(flid, fields)| {
        let fields: Vec<(Field, Option<&str>)> =
            fields.iter().map(|(f, v)| (*f, v.as_deref())).collect();
        rec(&flid, &fields)
    })
}

fn record() -> impl Strategy<Value = FlightRecord> {
    record_of(&FLIDS)
}

fn body() -> impl Strategy<Value = Body> {
    prop_oneof![
        prop::collection::vec(record(), 0..6).prop_map(schedule),
        record().prop_map(Body::ScheduleAdd),
        record().prop_map(Body::FlightUpdate),
        record().prop_map(Body::AddFlight),
        flid().prop_map(|flid| Body::FlightDelete { flid }),
    ]
}

/// A random state built by applying random messages to an empty one.
fn state() -> impl Strategy<Value = BTreeMap<String, Flight>> {
    prop::collection::vec(body(), 0..6).prop_map(|bodies| {
        let mut st = BTreeMap::new();
        for (i, b) in bodies.into_iter().enumerate() {
            plan(&msg(b, i as u32), i as i64, &st).apply(&mut st);
        }
        st
    })
}

/// What the processor loads for `m`: the named flights and their code-shares.
pub(super) fn loaded(
    m: &DecodedMessage,
    st: &BTreeMap<String, Flight>,
) -> BTreeMap<String, Flight> {
    let named = flights_to_load(m);
    st.iter()
        .filter(|(k, f)| {
            named.contains(k) || f.master().is_some_and(|ms| named.iter().any(|n| n == ms))
        })
        .map(|(k, f)| (k.clone(), f.clone()))
        .collect()
}

proptest! {
    #[test]
    fn planning_the_same_message_over_its_result_changes_nothing(st in state(), b in body()) {
        let m = msg(b, 50);
        let mut st = st;
        plan(&m, 100, &loaded(&m, &st)).apply(&mut st);
        let again = plan(&m, 100, &loaded(&m, &st));
        prop_assert!(again.changes.is_empty(), "{:?}", again.changes);
        prop_assert!(again.events.iter().all(|e| e.event_type == EventType::ScheduleApplied));
        if let Some(snap) = &again.snapshot {
            prop_assert_eq!(snap.unchanged, snap.flights.len());
            prop_assert_eq!(again.events.len(), 1);
        } else {
            prop_assert!(again.is_noop());
        }
    }

    #[test]
    fn flop_sequences_fold_the_carried_values_in_order(records in prop::collection::vec(record(), 0..20)) {
        let mut st = BTreeMap::new();
        let mut expected: BTreeMap<String, BTreeMap<Field, String>> = BTreeMap::new();
        let mut expected_versions: BTreeMap<(String, Field), i64> = BTreeMap::new();
        for (i, r) in records.iter().enumerate() {
            let m = msg(Body::FlightUpdate(r.clone()), i as u32);
            plan(&m, i as i64, &loaded(&m, &st)).apply(&mut st);
            let fields = expected.entry(r.flid.clone()).or_default();
            for (f, v) in &r.fields {
                match v {
                    FieldValue::Set(s) => { fields.insert(*f, s.clone()); }
                    FieldValue::Clear => { fields.remove(f); }
                }
                // Every carried field is versioned, changed or not (late messages compare
                // against it).
                expected_versions.insert((r.flid.clone(), *f), i as i64);
            }
        }
        let got: BTreeMap<String, BTreeMap<Field, String>> =
            st.iter().map(|(k, f)| (k.clone(), f.fields.clone())).collect();
        prop_assert_eq!(got, expected);
        let got_versions: BTreeMap<(String, Field), i64> = st
            .iter()
            .flat_map(|(k, f)| f.versions.iter().map(move |(fd, v)| ((k.clone(), *fd), v.msg_id)))
            .collect();
        prop_assert_eq!(got_versions, expected_versions);
    }

    #[test]
    fn plans_are_deterministic_and_well_formed(st in state(), b in body()) {
        let m = msg(b, 50);
        let p = plan(&m, 100, &loaded(&m, &st));
        prop_assert_eq!(&p, &plan(&m, 100, &loaded(&m, &st)));
        let flight_events = p.events.len() - usize::from(p.snapshot.is_some());
        let evented: Vec<&FlightChange> = p.changes.iter().filter(|c| !c.is_restamp()).collect();
        prop_assert_eq!(flight_events, evented.len());
        for (change, event) in evented.iter().zip(&p.events) {
            prop_assert_eq!(event.flight_key.as_str(), change.flid());
        }
        for change in &p.changes {
            if let FlightChange::Updated { before, after, changed } = change {
                prop_assert!(before != after, "an update writes something");
                for f in Field::ALL {
                    prop_assert_eq!(before.get(f) != after.get(f), changed.contains(&f));
                }
            }
        }
        if let Some(snap) = &p.snapshot {
            prop_assert_eq!(snap.created + snap.updated + snap.unchanged, snap.flights.len());
            prop_assert_eq!(p.events.last().map(|e| e.event_type), Some(EventType::ScheduleApplied));
        }
    }
}
