//! The reference model, written from `/work/shared/SPEC.md` and not from the code: from the
//! rows the test wrote (its ledger) and the operator's actions it predicts each inbox row's
//! final state, each flight's final fields, the exact events and their order per key.
//!
//! The rules it applies (SPEC section in brackets):
//! - a row committed and visible at a `max`/`<id>` cutover up to W is the previous system's:
//!   no record, no event, its mark untouched (§3);
//! - not well-formed → DEAD(MALFORMED); an unknown type is UNSUPPORTED, retried, and poisoned
//!   to DEAD(EXHAUSTED) — a replay runs it again to the same end (§2, §4, App. A);
//! - a decodable message binds its identity (sender|type|subtype|seq); the first in processing
//!   order wins, a later one is SKIPPED(DUPLICATE) and changes nothing (§4);
//! - an approved skip makes the unfinished rows of its range SKIPPED(APPROVED_SKIP) (§4);
//! - everything else is SUCCEEDED, applied in id order (FIFO, §4); a late arrival (a held
//!   commit released as a hole after max_commit_delay) is applied when it is found, but never
//!   over a field a newer message set (field versions by message time, §6 G1);
//! - `FLOP` on an absent flight creates it (FLIGHT_CREATED), otherwise updates the fields it
//!   changes (FLIGHT_UPDATED, none if nothing changes); `FDEL` deletes a present flight
//!   (FLIGHT_DELETED) and is a no-op on an absent one (App. A);
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
    /// Present flights and their fields.
    pub flights: BTreeMap<String, BTreeMap<String, String>>,
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
    /// Decodable rows poisoned to DEAD(EXHAUSTED) while a store was cut: SPEC §2 counts a
    /// FAILED(INFRA) head's attempts like any other's (accepted only in sequences with a cut).
    pub poisoned: BTreeSet<i64>,
    /// Rows an operator replayed: processed again out of id order (SPEC §2), placed like late
    /// rows and under the same field guard.
    pub replayed: BTreeSet<i64>,
    /// Processing order stamps, for placing late rows.
    pub seq: HashMap<i64, i64>,
}

/// One flight: field → (value, message time that set it).
type Flight = BTreeMap<String, (String, String)>;

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
    let mut flights: BTreeMap<String, Flight> = BTreeMap::new();
    for id in order(&rows, stock, t) {
        let w = rows[&id];
        let late = t.late.contains(&id) || t.replayed.contains(&id);
        let end = if t.approved.contains(&id) {
            End::Record("SKIPPED", Some("APPROVED_SKIP"))
        } else if t.missing.contains(&id) {
            End::Record("DEAD", Some("MALFORMED"))
        } else if t.poisoned.contains(&id) {
            End::Record("DEAD", Some("EXHAUSTED"))
        } else {
            match (&w.msg, w.msg.identity()) {
                (Msg::Malformed { .. }, _) => End::Record("DEAD", Some("MALFORMED")),
                (Msg::Unknown { .. }, _) => End::Record("DEAD", Some("EXHAUSTED")),
                (_, Some(idn)) if !bound.insert(idn.clone()) => {
                    End::Record("SKIPPED", Some("DUPLICATE"))
                }
                _ => {
                    if let Some(ev) = apply(&mut flights, &w.msg, late) {
                        e.events.push((id, ev.0, ev.1));
                    }
                    End::Record("SUCCEEDED", None)
                }
            }
        };
        e.rows.insert(id, end);
    }
    e.flights = flights
        .into_iter()
        .map(|(k, f)| (k, f.into_iter().map(|(n, (v, _))| (n, v)).collect()))
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
    // Only rows the pump took in id order place a late one (an approved skip, a poisoned or
    // a missing row carries the stamp of a later moment).
    let placing = |f: &i64| {
        rows[f].msg.identity().is_some()
            && !t.approved.contains(f)
            && !t.missing.contains(f)
            && !t.poisoned.contains(f)
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

/// Applies one decodable message; the event it raises, if any.
fn apply(
    flights: &mut BTreeMap<String, Flight>,
    msg: &Msg,
    late: bool,
) -> Option<(String, &'static str)> {
    let (flid, body) = msg.body()?;
    let ddtm = msg.ddtm();
    match body {
        Body::Delete => flights
            .remove(flid)
            .map(|_| (flid.to_string(), "FLIGHT_DELETED")),
        Body::Update(fields) => {
            let Some(f) = flights.get_mut(flid) else {
                let f = fields
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), (v, ddtm.clone())))
                    .collect();
                flights.insert(flid.to_string(), f);
                return Some((flid.to_string(), "FLIGHT_CREATED"));
            };
            let mut changed = false;
            for (k, v) in fields {
                match f.get(k) {
                    Some((_, ver)) if late && *ver > ddtm => {} // a newer message set it
                    Some((old, _)) if *old == v => {}
                    _ => {
                        f.insert(k.to_string(), (v, ddtm.clone()));
                        changed = true;
                    }
                }
            }
            changed.then(|| (flid.to_string(), "FLIGHT_UPDATED"))
        }
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
    let w = |id, msg, hold_ms| Written {
        id,
        msg,
        committed: true,
        hold_ms,
    };
    let written = [
        w(1, flop(1, "HG", Some("ST")), 3000),
        w(2, flop(2, "FG", None), 0),
        w(3, flop(2, "DUP", None), 0),
    ];
    let mut t = Timing::default();
    t.late.insert(1);
    t.seq.extend([(1, 20), (2, 10), (3, 30)]);
    let mut problems = Vec::new();
    let e = predict(&written, &BTreeSet::new(), &t, 2000, &mut problems);
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(e.flights["H1"]["GATE"], "FG");
    assert_eq!(e.flights["H1"]["STND"], "ST");
    let types: Vec<_> = e.events.iter().map(|x| (x.0, x.2)).collect();
    assert_eq!(types, [(2, "FLIGHT_CREATED"), (1, "FLIGHT_UPDATED")]);
    assert_eq!(e.rows[&3], End::Record("SKIPPED", Some("DUPLICATE")));
    // Held under max_commit_delay: never late.
    t.late.insert(2);
    predict(&written, &BTreeSet::new(), &t, 2000, &mut problems);
    assert_eq!(problems.len(), 1, "{problems:?}");
}
