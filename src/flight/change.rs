//! What the rules decide about rows: flight row changes and the schedule snapshot (the
//! [`Plan`](super::Plan) gathers them with the events they raise).

use chrono::NaiveDate;
use serde::{Deserialize, Serialize};

use super::model::Flight;
use crate::codec::model::Field;

/// One flight row to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlightChange {
    /// A new flight: insert `after`.
    Created {
        /// The new row.
        after: Flight,
    },
    /// An existing flight with at least one field actually changed: replace `before` by `after`.
    Updated {
        /// The row as loaded.
        before: Flight,
        /// The row to write (changed fields carry the message's version).
        after: Flight,
        /// The fields whose value changed (set, overwritten or cleared), in [`Field`] order;
        /// empty for a restamp (only versions changed).
        changed: Vec<Field>,
    },
    /// A deleted flight: delete the row.
    Deleted {
        /// The row as loaded.
        before: Flight,
        /// The master's `FLID` when this row is deleted as a code-share of that master;
        /// `None` for the flight the message names.
        cascade_of: Option<String>,
    },
}

impl FlightChange {
    /// The `FLID` of the flight this change writes.
    pub fn flid(&self) -> &str {
        match self {
            FlightChange::Created { after } | FlightChange::Updated { after, .. } => &after.flid,
            FlightChange::Deleted { before, .. } => &before.flid,
        }
    }

    /// An update that changes no value, only field versions (a carried value re-sent
    /// unchanged): the row is written, no event is raised.
    pub fn is_restamp(&self) -> bool {
        matches!(self, FlightChange::Updated { changed, .. } if changed.is_empty())
    }

    /// The row after the change (`None` for a delete).
    pub fn after(&self) -> Option<&Flight> {
        match self {
            FlightChange::Created { after } | FlightChange::Updated { after, .. } => Some(after),
            FlightChange::Deleted { .. } => None,
        }
    }
}

/// One applied schedule (`SCHD/DNLD` or `SCHD/RESP`): a row for `SCHD_SNAP_LOG`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleSnapshot {
    /// The schedule day (`<DATE>`).
    pub date: NaiveDate,
    /// `DNLD` or `RESP`.
    pub kind: String,
    /// The `FLID`s the message carried, in message order, each once.
    pub flights: Vec<String>,
    /// Flights created.
    pub created: usize,
    /// Known flights with at least one field changed.
    pub updated: usize,
    /// Known flights left as they were. `created + updated + unchanged == flights.len()`.
    pub unchanged: usize,
    /// The request id (`<RQID>`) a response answers.
    pub request_id: Option<String>,
}
