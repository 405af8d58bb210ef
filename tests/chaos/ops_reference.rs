//! The reference model, written from `/work/shared/SPEC.md` and not from the code: from the
//! rows the test wrote (its ledger) and the operator's actions it predicts each inbox row's
//! final state, each flight's final row (every field, each field's version, who created and
//! last wrote it), the exact events and their order per key.
//!
//! The rules it applies (SPEC section in brackets):
//! - a row committed and visible at a `max`/`<id>` cutover up to W is the previous system's:
//!   no record, no event, its mark untouched (§3);
//! - not well-formed → DEAD(MALFORMED); an unknown type is UNSUPPORTED, retried, and poisoned
//!   to DEAD(EXHAUSTED) — a replay runs it again to the same end (§2, §4, App. A);
//! - a store outage (a cut connection) fails the head FAILED(INFRA) with backoff, never as
//!   the message's own attempt: a decodable row never ends DEAD(EXHAUSTED) for it (§4);
//! - a decodable message binds its identity (sender|type|subtype|seq); the first in processing
//!   order wins, a later one is SKIPPED(DUPLICATE) and changes nothing (§4);
//! - an approved skip makes the unfinished rows of its range SKIPPED(APPROVED_SKIP) (§4);
//! - everything else is SUCCEEDED, applied in id order (FIFO, §4); a late arrival (a held
//!   commit released as a hole after max_commit_delay) is applied when it is found, but never
//!   over a field a newer message set (field versions by message time, §6 G1);
//! - `FLOP` on an absent flight creates it (FLIGHT_CREATED), otherwise updates the fields it
//!   changes (FLIGHT_UPDATED, none if nothing changes); `FDEL` deletes a present flight
//!   (FLIGHT_DELETED) and is a no-op on an absent one (App. A);
//! - a flight row holds the fields set (FLID is its key, no `MFID`: no master); each field's
//!   version is the last message that carried it (its row and `DDTM` as UTC; carried unchanged
//!   counts, §6 G1 "field-level versions by message time"); `created_by` is the message that
//!   created it, `updated_by` the last that wrote a field; a late row's guard also keeps a
//!   newer delete (it does not recreate the flight) and a newer write (it does not delete it);
//! - one flight's events keep processing order on its key (§7);
//! - every terminal row ends marked; nothing ends abandoned (§5: the owner's lock delays one
//!   row, a purge covers only finished rows); skipped stock keeps the mark it had.
//!
//! Three facts are timing, not rules: which held rows arrived LATE, which rows an approved
//! skip caught, which rows the DB owner deleted the pump found missing. The model works each
//! out itself from the ledger's commit times and the operator's record
//! ([`super::ops_timing`]); only where timing allows both answers does the service's side
//! decide. Where a late row goes in processing order is timing too: the model bounds it
//! ([`order`]) and the service's stamps only pick a place inside those bounds.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Instant;

use super::ops_msgs::{Body, Msg};

/// A row the test wrote: its id, message, whether it committed, and when (by the test's
/// clock) its insert ran and its commit returned.
#[derive(Debug, Clone)]
pub struct Written {
    pub id: i64,
    pub msg: Msg,
    pub committed: bool,
    pub opened: Option<Instant>,
    pub committed_at: Option<Instant>,
}

/// A row's predicted end.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum End {
    /// Skipped cutover stock: no record of ours.
    Stock,
    /// `(state, class or reason)`: DEAD by error class, SKIPPED by reason, SUCCEEDED.
    Record(&'static str, Option<&'static str>),
}

/// What the model expects.
#[derive(Debug, Default)]
pub struct Expected {
    pub rows: BTreeMap<i64, End>,
    /// Present flights, each as `flight_state` holds it.
    pub flights: BTreeMap<String, FlightEnd>,
    /// `(msg_id, key, event type)` in processing order.
    pub events: Vec<(i64, String, &'static str)>,
    /// Each event's body as the model has it, by message (one event per message here):
    /// `after` (created, updated), `changes` (updated: `{TAG: {before, after}}`, `null` for
    /// absent), `before` (deleted).
    pub bodies: HashMap<i64, serde_json::Value>,
}

/// The observed timing facts the model accepts (after checking them).
#[derive(Debug, Default)]
pub struct Timing {
    /// Rows whose record came from the late detector.
    pub late: BTreeSet<i64>,
    /// Rows an approved skip caught.
    pub approved: BTreeSet<i64>,
    /// Rows the DB owner deleted for a while that the pump found missing until its last read
    /// (SPEC §4: inbox row missing when reading raw → DEAD(MALFORMED); read again first while
    /// `processing.missing_row_grace` and its attempts last).
    pub missing: BTreeSet<i64>,
    /// Rows an operator replayed: processed again out of id order (SPEC §2), placed like late
    /// rows and under the same field guard.
    pub replayed: BTreeSet<i64>,
    /// Processing order stamps: the service's choice of a late row's place, taken only
    /// inside the bounds [`order`] sets.
    pub seq: HashMap<i64, i64>,
    /// Per late row, the rows it must precede: committed after it was surely found
    /// ([`super::ops_timing::precedes`]).
    pub precede: HashMap<i64, BTreeSet<i64>>,
    /// Per record, the harness's sampler's sample in which it was first seen terminal: a row
    /// seen terminal in a snapshot where another was not yet went first (empty: no sampler).
    pub done_in: HashMap<i64, usize>,
}

/// A field's version: the send time (`DDTM`) and row of the message that last set it.
type Version = (String, i64);

/// One flight as the model keeps it.
#[derive(Debug, Clone)]
struct Flight {
    /// Field → (value, version).
    fields: BTreeMap<String, (String, Version)>,
    /// The message that created it (since its last delete).
    created_by: i64,
    /// The last message that wrote it (set or restamped a field).
    updated_by: i64,
}

/// The flights and the newest delete of each (its tombstone).
#[derive(Debug, Default)]
struct World {
    flights: BTreeMap<String, Flight>,
    tombstones: BTreeMap<String, Version>,
}

/// A flight's predicted end: what `flight_state` holds for it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FlightEnd {
    /// `fields`: tag → value.
    pub fields: BTreeMap<String, String>,
    /// `versions`: tag → (message row, its `DDTM` as UTC, RFC 3339).
    pub versions: BTreeMap<String, (i64, String)>,
    /// `master_flid` (our messages carry no `MFID`: none).
    pub master: Option<String>,
    /// `created_by_msg`.
    pub created_by: i64,
    /// `updated_by_msg`.
    pub updated_by: i64,
}

impl Flight {
    fn end(self) -> FlightEnd {
        let utc = |ddtm: &str| {
            chrono::NaiveDateTime::parse_from_str(ddtm, "%Y%m%d%H%M%S")
                .map(|t| {
                    (t - chrono::Duration::hours(8))
                        .format("%Y-%m-%dT%H:%M:%SZ")
                        .to_string()
                })
                .unwrap_or_else(|e| format!("DDTM {ddtm}: {e}"))
        };
        FlightEnd {
            versions: self
                .fields
                .iter()
                .map(|(k, (_, (ddtm, id)))| (k.clone(), (*id, utc(ddtm))))
                .collect(),
            fields: self.fields.into_iter().map(|(k, (v, _))| (k, v)).collect(),
            master: None,
            created_by: self.created_by,
            updated_by: self.updated_by,
        }
    }
}

/// The prediction. `stock` are the ids a cutover skipped; `max_commit_delay_ms` the setting.
pub fn predict(
    written: &[Written],
    stock: &BTreeSet<i64>,
    t: &Timing,
    problems: &mut Vec<String>,
) -> Expected {
    let mut e = Expected::default();
    let rows: BTreeMap<i64, &Written> = written
        .iter()
        .filter(|w| w.committed)
        .map(|w| (w.id, w))
        .collect();
    for id in stock {
        e.rows.insert(*id, End::Stock);
    }
    let mut bound: HashSet<String> = HashSet::new();
    let mut world = World::default();
    for id in order(&rows, stock, t, problems) {
        let w = rows[&id];
        let late = t.late.contains(&id) || t.replayed.contains(&id);
        let end = if t.approved.contains(&id) {
            End::Record("SKIPPED", Some("APPROVED_SKIP"))
        } else if t.missing.contains(&id) {
            End::Record("DEAD", Some("MALFORMED"))
        } else {
            match (&w.msg, w.msg.identity()) {
                (Msg::Malformed { .. }, _) => End::Record("DEAD", Some("MALFORMED")),
                (Msg::Unknown { .. }, _) => End::Record("DEAD", Some("EXHAUSTED")),
                (_, Some(idn)) if !bound.insert(idn.clone()) => {
                    End::Record("SKIPPED", Some("DUPLICATE"))
                }
                _ => {
                    if let Some(ev) = apply(&mut world, id, &w.msg, late) {
                        e.events.push((id, ev.0, ev.1));
                        e.bodies.insert(id, ev.2);
                    }
                    End::Record("SUCCEEDED", None)
                }
            }
        };
        e.rows.insert(id, end);
    }
    e.flights = world
        .flights
        .into_iter()
        .map(|(k, f)| (k, f.end()))
        .collect();
    e
}

/// Processing order: every row not late in id order (FIFO); a late row where the service's
/// stamps put it (right after the last row taken in id order processed before it), but only
/// inside the model's bounds (SPEC §4 head rule: the smallest unfinished id goes first):
/// - after every row of a lower id taken in id order: W passed those before it passed the
///   late row's hole, so they were enqueued before it and, being smaller, went first;
/// - before every row committed after the late row was surely found ([`Timing::precede`]):
///   it was enqueued first and is the smaller id;
/// - after every row the harness's sampler saw terminal in a snapshot where the late row was
///   not yet, and before every row it saw unfinished where the late row was already terminal
///   ([`Timing::done_in`]: the harness's own reads, never the service's stamps).
///
/// A place outside the bounds is a problem, and the model goes on with the nearest bound.
fn order(
    rows: &BTreeMap<i64, &Written>,
    stock: &BTreeSet<i64>,
    t: &Timing,
    problems: &mut Vec<String>,
) -> Vec<i64> {
    let out_of_order = |id: &i64| t.late.contains(id) || t.replayed.contains(id);
    let mut fifo: Vec<i64> = rows
        .keys()
        .filter(|id| !stock.contains(id) && !out_of_order(id))
        .copied()
        .collect();
    let mut late: Vec<i64> = rows
        .keys()
        .filter(|id| !stock.contains(id) && out_of_order(id))
        .copied()
        .collect();
    // Only rows the pump took in id order place a late one (an approved skip or
    // a missing row carries the stamp of a later moment).
    let placing = |f: &i64| {
        rows[f].msg.identity().is_some() && !t.approved.contains(f) && !t.missing.contains(f)
    };
    // The bounds are set by rows taken in id order only.
    let taken = |f: &i64| placing(f) && !out_of_order(f);
    let seq = |id: &i64| t.seq.get(id).copied().unwrap_or(i64::MAX);
    late.sort_by_key(seq);
    for id in late {
        let observed = fifo
            .iter()
            .rposition(|f| placing(f) && seq(f) < seq(&id))
            .map_or(0, |p| p + 1);
        let lo = fifo
            .iter()
            .rposition(|f| taken(f) && *f < id)
            .map_or(0, |p| p + 1);
        let must = t.precede.get(&id);
        let hi = fifo
            .iter()
            .position(|f| taken(f) && must.is_some_and(|m| m.contains(f)))
            .unwrap_or(fifo.len())
            .max(lo);
        // The sampler's order: seen done in an earlier sample than the late row → before it;
        // in a later one → after it. Replayed rows were terminal once before: not judged.
        let done = |f: &i64| {
            t.done_in
                .get(f)
                .copied()
                .filter(|_| !t.replayed.contains(f))
        };
        let (seen_lo, seen_hi) = match done(&id) {
            Some(d) => (
                fifo.iter()
                    .rposition(|f| placing(f) && done(f).is_some_and(|x| x < d))
                    .map_or(0, |p| p + 1),
                fifo.iter()
                    .position(|f| placing(f) && done(f).is_some_and(|x| x > d))
                    .unwrap_or(fifo.len()),
            ),
            None => (0, fifo.len()),
        };
        if !(seen_lo..=seen_hi).contains(&observed) {
            problems.push(format!(
                "late row {id} processed at place {observed} of the rows taken in id order \
                 (the service's stamps); the harness's sampler saw it done at {seen_lo}..={seen_hi} \
                 (after the rows it saw terminal first, before those it saw unfinished then)"
            ));
        }
        let pos = observed.clamp(lo, hi);
        if pos != observed {
            problems.push(format!(
                "late row {id} processed at place {observed} of the rows taken in id order; \
                 the model allows {lo}..={hi} (after every lower id, before every row \
                 committed after it was surely found)"
            ));
        }
        fifo.insert(pos, id);
    }
    fifo
}

/// A flight's fields as an event body carries them: `{TAG: value}`.
fn fields_json(f: &Flight) -> serde_json::Value {
    f.fields
        .iter()
        .map(|(k, (v, _))| (k.clone(), serde_json::Value::String(v.clone())))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// An event the model predicts: key, type, body.
type Event = (String, &'static str, serde_json::Value);

/// Applies one decodable message (`id` its row); the event it raises, if any. A late row
/// (`late`) never overwrites what a newer message set, never recreates a flight a newer
/// delete removed, and never deletes a flight a newer message wrote (SPEC §6 G1).
fn apply(world: &mut World, id: i64, msg: &Msg, late: bool) -> Option<Event> {
    let (flid, body) = msg.body()?;
    let ddtm = msg.ddtm();
    let newer = |v: &Version| v.0 > ddtm;
    match body {
        Body::Delete => {
            let f = world.flights.get(flid)?;
            let touched_later = f.fields.values().any(|(_, v)| newer(v))
                || world.tombstones.get(flid).is_some_and(newer);
            if late && touched_later {
                return None;
            }
            let before = serde_json::json!({ "before": fields_json(f) });
            world.flights.remove(flid);
            world.tombstones.insert(flid.to_string(), (ddtm, id));
            Some((flid.to_string(), "FLIGHT_DELETED", before))
        }
        Body::Update(fields) => {
            let Some(f) = world.flights.get_mut(flid) else {
                if late && world.tombstones.get(flid).is_some_and(newer) {
                    return None;
                }
                let f = Flight {
                    fields: fields
                        .into_iter()
                        .map(|(k, v)| (k.to_string(), (v, (ddtm.clone(), id))))
                        .collect(),
                    created_by: id,
                    updated_by: id,
                };
                let after = serde_json::json!({ "after": fields_json(&f) });
                world.flights.insert(flid.to_string(), f);
                return Some((flid.to_string(), "FLIGHT_CREATED", after));
            };
            let (mut changes, mut wrote) = (serde_json::Map::new(), false);
            for (k, v) in fields {
                match f.fields.get(k) {
                    Some((_, ver)) if late && newer(ver) => {} // a newer message set it
                    old => {
                        // Carried again: its version is this message's, changed or not.
                        let before = old.map(|(o, _)| o.clone());
                        if before.as_ref() != Some(&v) {
                            let pair = serde_json::json!({ "before": before, "after": v });
                            changes.insert(k.to_string(), pair);
                        }
                        wrote = true;
                        f.fields.insert(k.to_string(), (v, (ddtm.clone(), id)));
                    }
                }
            }
            if wrote {
                f.updated_by = id;
            }
            let changed = !changes.is_empty();
            let body = serde_json::json!({ "changes": changes, "after": fields_json(f) });
            changed.then(|| (flid.to_string(), "FLIGHT_UPDATED", body))
        }
    }
}

/// A committed row the test wrote (unit tests).
#[cfg(test)]
fn written_row(id: i64, msg: Msg) -> Written {
    Written {
        id,
        msg,
        committed: true,
        opened: None,
        committed_at: None,
    }
}

#[test]
fn a_late_row_applies_only_what_no_newer_message_set() {
    let flop = |n, gate: &str, stnd: Option<&str>| Msg::Flop {
        n,
        flid: "H1".into(),
        gate: gate.into(),
        stnd: stnd.map(Into::into),
    };
    let written = [
        written_row(1, flop(1, "HG", Some("ST"))),
        written_row(2, flop(2, "FG", None)),
        written_row(3, flop(2, "DUP", None)),
    ];
    let mut t = Timing::default();
    t.late.insert(1);
    t.seq.extend([(1, 20), (2, 10), (3, 30)]);
    let mut problems = Vec::new();
    let e = predict(&written, &BTreeSet::new(), &t, &mut problems);
    assert!(problems.is_empty(), "{problems:?}");
    let h1 = &e.flights["H1"];
    assert_eq!(h1.fields["GATE"], "FG");
    assert_eq!(h1.fields["STND"], "ST");
    assert_eq!(h1.versions["GATE"], (2, "2026-11-30T00:00:02Z".to_string()));
    assert_eq!(h1.versions["STND"], (1, "2026-11-30T00:00:01Z".to_string()));
    assert_eq!((h1.created_by, h1.updated_by), (2, 1));
    let types: Vec<_> = e.events.iter().map(|x| (x.0, x.2)).collect();
    assert_eq!(types, [(2, "FLIGHT_CREATED"), (1, "FLIGHT_UPDATED")]);
    assert_eq!(e.rows[&3], End::Record("SKIPPED", Some("DUPLICATE")));
    // Had 2 been committed after 1 was surely found, 1 must have gone first: the stamps are
    // out of the model's bounds, and the model goes on with its own place.
    t.precede.insert(1, BTreeSet::from([2]));
    let e = predict(&written, &BTreeSet::new(), &t, &mut problems);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(e.flights["H1"].created_by, 1);
}

#[test]
fn a_late_row_neither_recreates_nor_deletes_against_a_newer_message() {
    let flop = |n, flid: &str| Msg::Flop {
        n,
        flid: flid.into(),
        gate: format!("G{n}"),
        stnd: None,
    };
    // D1: created by 2, deleted by 3; the late 1 would recreate it. D2: created by 4, the late
    // delete 5 (sent before 6) arrives after 6 wrote the flight: refused.
    let written = [
        written_row(1, flop(1, "D1")),
        written_row(2, flop(2, "D1")),
        written_row(
            3,
            Msg::Fdel {
                n: 3,
                flid: "D1".into(),
            },
        ),
        written_row(4, flop(4, "D2")),
        written_row(
            5,
            Msg::Fdel {
                n: 5,
                flid: "D2".into(),
            },
        ),
        written_row(6, flop(6, "D2")),
    ];
    let mut t = Timing::default();
    t.late.extend([1, 5]);
    t.seq
        .extend([(2, 1), (3, 2), (4, 3), (6, 4), (1, 5), (5, 6)]);
    let mut problems = Vec::new();
    let e = predict(&written, &BTreeSet::new(), &t, &mut problems);
    assert!(problems.is_empty(), "{problems:?}");
    assert!(!e.flights.contains_key("D1"), "{:?}", e.flights);
    let d2 = &e.flights["D2"];
    assert_eq!(d2.fields["GATE"], "G6");
    assert_eq!((d2.created_by, d2.updated_by), (4, 6));
    let types: Vec<_> = e.events.iter().map(|x| (x.0, x.2)).collect();
    assert_eq!(
        types,
        [
            (2, "FLIGHT_CREATED"),
            (3, "FLIGHT_DELETED"),
            (4, "FLIGHT_CREATED"),
            (6, "FLIGHT_UPDATED")
        ]
    );
}

#[test]
fn a_late_row_placed_against_the_samplers_order_is_a_problem() {
    let flop = |n, flid: &str| Msg::Flop {
        n,
        flid: flid.into(),
        gate: format!("G{n}"),
        stnd: None,
    };
    let written = [
        written_row(1, flop(1, "A")),
        written_row(2, flop(2, "B")),
        written_row(3, flop(3, "C")),
    ];
    let mut t = Timing::default();
    t.late.insert(1);
    // The stamps put the late row 1 after 2 and 3.
    t.seq.extend([(2, 10), (3, 11), (1, 12)]);
    let mut problems = Vec::new();
    predict(&written, &BTreeSet::new(), &t, &mut problems);
    assert!(problems.is_empty(), "{problems:?}");
    // The sampler saw 1 done in sample 4, 2 in sample 3 and 3 only in sample 6: 1 went
    // before 3, whatever the stamps say.
    t.done_in.extend([(1, 4), (2, 3), (3, 6)]);
    predict(&written, &BTreeSet::new(), &t, &mut problems);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("sampler"), "{problems:?}");
    // Seen as the stamps say: no problem.
    problems.clear();
    t.done_in.insert(3, 4);
    t.done_in.insert(1, 5);
    predict(&written, &BTreeSet::new(), &t, &mut problems);
    assert!(problems.is_empty(), "{problems:?}");
}
