//! The merge rules: (current state, message) → [`Plan`]. Pure: no I/O, no clock.

use std::collections::BTreeMap;

use super::change::{FlightChange, ScheduleSnapshot};
use super::event::EventDraft;
use super::guard::{self, Guard, GuardedPlan, Tombstones};
use super::model::{FieldVersion, Flight};
use super::plan::Plan;
use crate::codec::model::{Body, DecodedMessage, FieldValue, FlightRecord, ScheduleKind};

/// The `FLID`s the message names, deduplicated, in message order. Before calling [`plan`] the
/// caller loads the current row of each (when it exists) **and** every row whose `MFID` is one
/// of them (the code-shares a delete cascades to), preferably `FOR UPDATE`.
pub fn flights_to_load(msg: &DecodedMessage) -> Vec<String> {
    let named: Vec<&str> = match &msg.body {
        Body::Schedule { flights, .. } => flights.iter().map(|r| r.flid.as_str()).collect(),
        Body::ScheduleAdd(r) | Body::FlightUpdate(r) | Body::AddFlight(r) => vec![r.flid.as_str()],
        Body::FlightDelete { flid } => vec![flid.as_str()],
    };
    let mut out: Vec<String> = Vec::with_capacity(named.len());
    for flid in named {
        if !out.iter().any(|f| f == flid) {
            out.push(flid.to_string());
        }
    }
    out
}

/// Decides what `msg` (inbox id `msg_id`) does to the flights in `current` (every loaded row,
/// keyed by `FLID`: see [`flights_to_load`]).
///
/// - `SCHD/DNLD`, `SCHD/RESP`: each carried flight is upserted (below); flights the schedule
///   does not carry are kept (SPEC §12); then one `SCHEDULE_APPLIED` event and a snapshot. A
///   flight the schedule repeats is applied once, its records merged (later values win).
/// - `SCHD/ADFT`, `ADFT`, `FLOP/*`: upsert of the one flight.
/// - `FDEL`: deletes the flight and, when it is a master, every loaded flight whose `MFID` is
///   its `FLID` (one level; in `FLID` order, each with its own event). Deleting an absent flight
///   is an empty plan (idempotent re-delete), even if stray code-shares still name it.
///
/// Upsert: an unknown flight is created with the carried `Set` fields (a `Clear` sets nothing);
/// on a known flight `Set` overwrites, `Clear` removes, a field not carried is kept. Values
/// compare as strings: writing the current value (or clearing an absent field) is no change
/// and raises no event, but every carried field gets the message's [`FieldVersion`] (a
/// *restamp*, see `upsert`). A known flight whose versions are already this message's yields
/// no change and no event.
/// Setting `MFID` makes the flight a code-share of that master; nothing else happens.
pub fn plan(msg: &DecodedMessage, msg_id: i64, current: &BTreeMap<String, Flight>) -> Plan {
    plan_with(msg, msg_id, current, &mut Guard::off())
}

/// [`plan`] with every write admitted (or refused) by `guard` (see `guard.rs`).
fn plan_with(
    msg: &DecodedMessage,
    msg_id: i64,
    current: &BTreeMap<String, Flight>,
    guard: &mut Guard<'_>,
) -> Plan {
    let version = FieldVersion {
        at: msg.meta.sent_at,
        msg_id,
    };
    let mut out = Plan::default();
    match &msg.body {
        Body::Schedule {
            kind,
            date,
            request_id,
            flights,
        } => {
            let mut snapshot = ScheduleSnapshot {
                date: *date,
                kind: match kind {
                    ScheduleKind::Download => "DNLD",
                    ScheduleKind::Response => "RESP",
                }
                .to_string(),
                flights: flights_to_load(msg),
                created: 0,
                updated: 0,
                unchanged: 0,
                request_id: request_id.clone(),
            };
            for record in coalesce(flights) {
                match upsert(&record, version, current.get(&record.flid), guard) {
                    Some(change) => {
                        match &change {
                            FlightChange::Created { .. } => snapshot.created += 1,
                            c if c.is_restamp() => snapshot.unchanged += 1,
                            _ => snapshot.updated += 1,
                        }
                        out.changes.push(change);
                    }
                    None => snapshot.unchanged += 1,
                }
            }
            out.snapshot = Some(snapshot);
        }
        Body::ScheduleAdd(record) | Body::FlightUpdate(record) | Body::AddFlight(record) => {
            out.changes
                .extend(upsert(record, version, current.get(&record.flid), guard));
        }
        Body::FlightDelete { flid } => {
            if let Some(master) = current.get(flid).filter(|m| guard.delete(m)) {
                out.changes.push(FlightChange::Deleted {
                    before: master.clone(),
                    cascade_of: None,
                });
                let shares = current
                    .values()
                    .filter(|f| f.flid != *flid && f.master() == Some(flid.as_str()));
                for share in shares.filter(|share| guard.delete(share)) {
                    out.changes.push(FlightChange::Deleted {
                        before: share.clone(),
                        cascade_of: Some(flid.clone()),
                    });
                }
            }
        }
    }
    out.events = out
        .changes
        .iter()
        .filter(|c| !c.is_restamp())
        .map(|c| EventDraft::for_change(c, &msg.meta, msg_id))
        .collect();
    if let Some(snapshot) = &out.snapshot {
        out.events
            .push(EventDraft::schedule_applied(snapshot, msg_id));
    }
    out
}

/// Merges the records of a flight the schedule repeats into one at its first position, later
/// carried values winning (so a schedule is applied as a whole and stays idempotent).
fn coalesce(records: &[FlightRecord]) -> Vec<FlightRecord> {
    let mut out: Vec<FlightRecord> = Vec::with_capacity(records.len());
    let mut at: BTreeMap<&str, usize> = BTreeMap::new();
    for record in records {
        match at.get(record.flid.as_str()) {
            Some(&i) => out[i].fields.extend(record.fields.clone()),
            None => {
                at.insert(&record.flid, out.len());
                out.push(record.clone());
            }
        }
    }
    out
}

/// One flight record over the flight's current row (`None`: unknown). `None` = nothing to write.
///
/// Every field the message carries stamps its version, also when the value does not change
/// (a *restamp*: the row is written, no event is raised), so a late message older than this
/// one can never overwrite it (SPEC §6 G1, versions compare by `MSG_ID`). A restamp never
/// lowers a version (an operator replay of an old message does not make fields look older).
fn upsert(
    record: &FlightRecord,
    version: FieldVersion,
    current: Option<&Flight>,
    guard: &mut Guard<'_>,
) -> Option<FlightChange> {
    let Some(before) = current else {
        if !guard.create(record) {
            return None;
        }
        let mut after = Flight::new(record.flid.clone());
        for (field, value) in &record.fields {
            if let FieldValue::Set(v) = value {
                after.fields.insert(*field, v.clone());
            }
            // A carried clear versions the field too: an older late value may not set it.
            after.versions.insert(*field, version);
        }
        return Some(FlightChange::Created { after });
    };
    let mut after = before.clone();
    let mut changed = Vec::new();
    for (field, value) in &record.fields {
        let new = match value {
            FieldValue::Set(v) => Some(v.as_str()),
            FieldValue::Clear => None,
        };
        let stored = before.versions.get(field);
        if before.get(*field) == new {
            if stored.is_none_or(|v| guard::is_newer(&version, v)) {
                after.versions.insert(*field, version);
            }
            continue;
        }
        if !guard.field(&before.flid, *field, stored) {
            continue;
        }
        match new {
            Some(v) => after.fields.insert(*field, v.to_string()),
            None => after.fields.remove(field),
        };
        after.versions.insert(*field, version);
        changed.push(*field);
    }
    (after != *before).then(|| FlightChange::Updated {
        before: before.clone(),
        after,
        changed,
    })
}

/// [`plan`] for a late message (`PROC_STATE.SOURCE = 'LATE'`): the same rules,
/// except that no write may replace a newer version (see the `guard` module docs). `tombstones` are
/// the newest deletes of the loaded and named flights. A guarded plan never lowers a field's
/// version; with a message newer than every stored version and tombstone it equals `plan`.
pub fn plan_guarded(
    msg: &DecodedMessage,
    msg_id: i64,
    current: &BTreeMap<String, Flight>,
    tombstones: &Tombstones,
) -> GuardedPlan {
    let version = FieldVersion {
        at: msg.meta.sent_at,
        msg_id,
    };
    let mut guard = Guard::late(version, tombstones);
    let plan = plan_with(msg, msg_id, current, &mut guard);
    GuardedPlan {
        plan,
        refused: guard.into_refused(),
    }
}
