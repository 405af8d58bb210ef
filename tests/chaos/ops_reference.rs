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
//! Three facts are timing, not rules, and the model takes them as observed, after checking
//! they are allowed: which held rows arrived LATE (only a commit held about max_commit_delay
//! or longer may), which rows an approved skip caught (only rows of its range, counted as the
//! skip reported), and which rows the DB owner deleted for a while were missing when the pump
//! read them (only rows it deleted).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use super::ops_msgs::{Body, Msg};

/// A row the test wrote: its id, message, whether it committed, and how long it was held.
#[derive(Debug, Clone)]
pub struct Written {
    pub id: i64,
    pub msg: Msg,
    pub committed: bool,
    pub hold_ms: u64,
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
}

/// The observed timing facts the model accepts (after checking them).
#[derive(Debug, Default)]
pub struct Timing {
    /// Rows whose record came from the late detector.
    pub late: BTreeSet<i64>,
    /// Rows an approved skip caught.
    pub approved: BTreeSet<i64>,
    /// Rows the DB owner deleted for a while that the pump found missing (SPEC §4: inbox row
    /// missing when reading raw → DEAD(MALFORMED)).
    pub missing: BTreeSet<i64>,
    /// Rows an operator replayed: processed again out of id order (SPEC §2), placed like late
    /// rows and under the same field guard.
    pub replayed: BTreeSet<i64>,
    /// Processing order stamps, for placing late rows.
    pub seq: HashMap<i64, i64>,
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
    max_commit_delay_ms: u64,
    problems: &mut Vec<String>,
) -> Expected {
    let mut e = Expected::default();
    let rows: BTreeMap<i64, &Written> = written
        .iter()
        .filter(|w| w.committed)
        .map(|w| (w.id, w))
        .collect();
    for id in &t.late {
        match rows.get(id) {
            // The test times the hold from its own side of the connection: 300 ms of slack.
            Some(w) if w.hold_ms + 300 >= max_commit_delay_ms => {}
            w => problems.push(format!(
                "row {id} processed as LATE but its commit was held {:?} ms (max_commit_delay \
                 {max_commit_delay_ms} ms)",
                w.map(|w| w.hold_ms)
            )),
        }
    }
    for id in stock {
        e.rows.insert(*id, End::Stock);
    }
    let mut bound: HashSet<String> = HashSet::new();
    let mut world = World::default();
    for id in order(&rows, stock, t) {
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

/// Processing order: every row not late in id order (FIFO); a late row right after the last
/// of them processed before it (a replayed row's later stamp does not move it).
fn order(rows: &BTreeMap<i64, &Written>, stock: &BTreeSet<i64>, t: &Timing) -> Vec<i64> {
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
    late.sort_by_key(|id| t.seq.get(id).copied().unwrap_or(i64::MAX));
    for id in late {
        let at_seq = t.seq.get(&id).copied().unwrap_or(i64::MAX);
        let pos = fifo
            .iter()
            .rposition(|f| placing(f) && t.seq.get(f).is_some_and(|s| *s < at_seq))
            .map_or(0, |p| p + 1);
        fifo.insert(pos, id);
    }
    fifo
}

/// Applies one decodable message (`id` its row); the event it raises, if any. A late row
/// (`late`) never overwrites what a newer message set, never recreates a flight a newer
/// delete removed, and never deletes a flight a newer message wrote (SPEC §6 G1).
fn apply(world: &mut World, id: i64, msg: &Msg, late: bool) -> Option<(String, &'static str)> {
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
            world.flights.remove(flid);
            world.tombstones.insert(flid.to_string(), (ddtm, id));
            Some((flid.to_string(), "FLIGHT_DELETED"))
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
                world.flights.insert(flid.to_string(), f);
                return Some((flid.to_string(), "FLIGHT_CREATED"));
            };
            let (mut changed, mut wrote) = (false, false);
            for (k, v) in fields {
                match f.fields.get(k) {
                    Some((_, ver)) if late && newer(ver) => {} // a newer message set it
                    Some((old, _)) => {
                        // Carried again: its version is this message's, changed or not.
                        changed |= *old != v;
                        wrote = true;
                        f.fields.insert(k.to_string(), (v, (ddtm.clone(), id)));
                    }
                    None => {
                        changed = true;
                        wrote = true;
                        f.fields.insert(k.to_string(), (v, (ddtm.clone(), id)));
                    }
                }
            }
            if wrote {
                f.updated_by = id;
            }
            changed.then(|| (flid.to_string(), "FLIGHT_UPDATED"))
        }
    }
}

/// A committed row the test wrote (unit tests).
#[cfg(test)]
fn written_row(id: i64, msg: Msg, hold_ms: u64) -> Written {
    Written {
        id,
        msg,
        committed: true,
        hold_ms,
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
        written_row(1, flop(1, "HG", Some("ST")), 3000),
        written_row(2, flop(2, "FG", None), 0),
        written_row(3, flop(2, "DUP", None), 0),
    ];
    let mut t = Timing::default();
    t.late.insert(1);
    t.seq.extend([(1, 20), (2, 10), (3, 30)]);
    let mut problems = Vec::new();
    let e = predict(&written, &BTreeSet::new(), &t, 2000, &mut problems);
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
    // Held under max_commit_delay: never late.
    t.late.insert(2);
    predict(&written, &BTreeSet::new(), &t, 2000, &mut problems);
    assert_eq!(problems.len(), 1, "{problems:?}");
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
        written_row(1, flop(1, "D1"), 3000),
        written_row(2, flop(2, "D1"), 0),
        written_row(
            3,
            Msg::Fdel {
                n: 3,
                flid: "D1".into(),
            },
            0,
        ),
        written_row(4, flop(4, "D2"), 0),
        written_row(
            5,
            Msg::Fdel {
                n: 5,
                flid: "D2".into(),
            },
            3000,
        ),
        written_row(6, flop(6, "D2"), 0),
    ];
    let mut t = Timing::default();
    t.late.extend([1, 5]);
    t.seq
        .extend([(2, 1), (3, 2), (4, 3), (6, 4), (1, 5), (5, 6)]);
    let mut problems = Vec::new();
    let e = predict(&written, &BTreeSet::new(), &t, 2000, &mut problems);
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
