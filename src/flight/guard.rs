//! The ordering guard for late messages (SPEC §6 G1: "late does not overtake").
//!
//! A message the late detector found below W (`PROC_STATE.SOURCE = 'LATE'`) is processed after
//! messages that upstream sent later. Planned with [`plan_guarded`](super::plan_guarded) it may not overwrite what
//! a newer message already wrote; what it could not apply is returned as [`Refused`] for the
//! processor to record (`proc_state.stale_fields`) and count. Rows in id order keep using
//! [`plan`](super::plan), which this module does not change.
//!
//! "Newer" compares [`FieldVersion`]s by inbox id (`MSG_ID`): the processing order the seed
//! promises (FIFO by id), not the upstream send time. Every field a message carries stamps
//! its version, also when its value does not change (`rules::upsert`), so the stored version
//! of a field is the highest id that carried it. The effective version of a flight's field
//! is the newer of its stored version and the flight's *tombstone* (the newest delete of the
//! flight, read from the event outbox): a deletion versions every field of the flight it
//! removed. The rules:
//!
//! - **field** (set or clear) of a known flight: applied when its value changes and no newer
//!   version exists; otherwise refused (recorded by tag, e.g. `GATE`). A value equal to the
//!   stored one is neither a change nor a refusal (it restamps an older version).
//! - **creation** of an unknown flight: refused when a newer delete removed it (recorded as
//!   `CREATE` followed by the tags of the fields it carried); otherwise created as usual.
//! - **delete** (`FDEL`): refused when any field of the flight (or its tombstone) is newer than
//!   the message — a newer message touched the flight after the delete was sent (recorded as
//!   `DELETE`). The code-share cascade follows only an applied master delete and checks each
//!   code-share the same way.
//!
//! Pure: no I/O, no clock.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use super::model::{FieldVersion, Flight};
use super::plan::Plan;
use crate::codec::model::{Field, FieldValue, FlightRecord};

/// The newest delete of each flight, by `FLID` (from `FLIGHT_DELETED` events).
pub type Tombstones = BTreeMap<String, FieldVersion>;

/// Pseudo-tag recorded when a delete was refused.
pub const REFUSED_DELETE: &str = "DELETE";
/// Pseudo-tag recorded when a creation was refused (a newer delete removed the flight).
pub const REFUSED_CREATE: &str = "CREATE";

/// Orders versions by inbox id: the FIFO processing order.
pub fn compare(a: &FieldVersion, b: &FieldVersion) -> Ordering {
    a.msg_id.cmp(&b.msg_id)
}

/// True when `stored` is strictly newer than `msg`.
pub fn is_newer(stored: &FieldVersion, msg: &FieldVersion) -> bool {
    compare(stored, msg) == Ordering::Greater
}

/// What a guarded plan could not apply: per `FLID`, field tags and the pseudo-tags
/// [`REFUSED_DELETE`] / [`REFUSED_CREATE`], each once, in the order refused.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Refused(BTreeMap<String, Vec<String>>);

impl Refused {
    /// Nothing refused.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Refusals per `FLID`.
    // Tests only: production never asks.
    #[cfg(test)]
    pub fn by_flight(&self) -> &BTreeMap<String, Vec<String>> {
        &self.0
    }

    /// Number of refused entries (fields and row operations).
    pub fn count(&self) -> usize {
        self.0.values().map(Vec::len).sum()
    }

    /// `{"FLID": ["GATE", …]}`, as stored in `proc_state.stale_fields`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!(self.0)
    }

    /// `FLID.TAG` per entry, for logs and metrics.
    pub fn labels(&self) -> Vec<String> {
        self.0
            .iter()
            .flat_map(|(flid, tags)| tags.iter().map(move |t| format!("{flid}.{t}")))
            .collect()
    }

    fn push(&mut self, flid: &str, tag: &str) {
        let tags = self.0.entry(flid.to_string()).or_default();
        if !tags.iter().any(|t| t == tag) {
            tags.push(tag.to_string());
        }
    }
}

/// A plan and what its guard refused.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GuardedPlan {
    /// The changes and events to write (only what was admitted).
    pub plan: Plan,
    /// What was not applied.
    pub refused: Refused,
}

/// Admits or refuses each write a plan is about to make. [`Guard::off`] admits everything
/// (messages processed in id order); [`Guard::late`] applies the rules of this module.
#[derive(Debug)]
pub struct Guard<'a> {
    /// The message's version and the tombstones; `None`: off.
    late: Option<(FieldVersion, &'a Tombstones)>,
    refused: Refused,
}

impl Guard<'static> {
    /// Admits everything.
    pub fn off() -> Self {
        Guard {
            late: None,
            refused: Refused::default(),
        }
    }
}

impl<'a> Guard<'a> {
    /// Guards a late message of this version.
    pub fn late(version: FieldVersion, tombstones: &'a Tombstones) -> Self {
        Guard {
            late: Some((version, tombstones)),
            refused: Refused::default(),
        }
    }

    /// May the message set or clear `field` of the known flight `flid` (stored version
    /// `stored`)? Called only for a write that changes the value.
    pub(super) fn field(
        &mut self,
        flid: &str,
        field: Field,
        stored: Option<&FieldVersion>,
    ) -> bool {
        let Some((msg, tombstones)) = self.late else {
            return true;
        };
        let newer = stored.is_some_and(|v| is_newer(v, &msg))
            || tombstones.get(flid).is_some_and(|t| is_newer(t, &msg));
        if newer {
            self.refused.push(flid, field.tag());
        }
        !newer
    }

    /// May the message create the unknown flight of `record`?
    pub(super) fn create(&mut self, record: &FlightRecord) -> bool {
        let Some((msg, tombstones)) = self.late else {
            return true;
        };
        let deleted_later = tombstones
            .get(&record.flid)
            .is_some_and(|t| is_newer(t, &msg));
        if deleted_later {
            self.refused.push(&record.flid, REFUSED_CREATE);
            for (field, value) in &record.fields {
                if matches!(value, FieldValue::Set(_)) {
                    self.refused.push(&record.flid, field.tag());
                }
            }
        }
        !deleted_later
    }

    /// May the message delete `flight`?
    pub(super) fn delete(&mut self, flight: &Flight) -> bool {
        let Some((msg, tombstones)) = self.late else {
            return true;
        };
        let touched_later = flight.versions.values().any(|v| is_newer(v, &msg))
            || tombstones
                .get(&flight.flid)
                .is_some_and(|t| is_newer(t, &msg));
        if touched_later {
            self.refused.push(&flight.flid, REFUSED_DELETE);
        }
        !touched_later
    }

    /// What was refused.
    pub fn into_refused(self) -> Refused {
        self.refused
    }
}
