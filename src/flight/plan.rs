//! Everything one message does to the flight state: the row changes, the events they raise and
//! the schedule snapshot, for the processor to write in its one business transaction.

use std::collections::BTreeMap;

use super::change::{FlightChange, ScheduleSnapshot};
use super::event::EventDraft;
use super::model::Flight;

/// Everything one message does to the flight state.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Row changes, in the order to write them; at most one per flight.
    pub changes: Vec<FlightChange>,
    /// Events to queue in `MSG_EVENT`, in order: per flight in message order, cascaded deletes
    /// right after their master's delete, `SCHEDULE_APPLIED` last.
    pub events: Vec<EventDraft>,
    /// The snapshot row for an applied schedule.
    pub snapshot: Option<ScheduleSnapshot>,
}

impl Plan {
    /// True when the message changes nothing and raises nothing (the transaction then only
    /// records the terminal state).
    // Tests only: production never asks.
    #[cfg(test)]
    pub fn is_noop(&self) -> bool {
        self.changes.is_empty() && self.events.is_empty() && self.snapshot.is_none()
    }

    /// Applies the changes to an in-memory state keyed by `FLID` (what the processor's
    /// transaction does to the table; used by tests and tools).
    pub fn apply(&self, state: &mut BTreeMap<String, Flight>) {
        for change in &self.changes {
            match change {
                FlightChange::Created { after } | FlightChange::Updated { after, .. } => {
                    state.insert(after.flid.clone(), after.clone());
                }
                FlightChange::Deleted { before, .. } => {
                    state.remove(&before.flid);
                }
            }
        }
    }
}
