//! Flight state and the pure merge rules: (current state, message) → changes + events
//! (SPEC §4 "domain decisions do no I/O", §12 "Schedule merge", Appendix A).
//!
//! The message processor calls [`flights_to_load`], loads those rows and their code-shares,
//! calls [`plan`] and writes the [`Plan`] (row changes, `MSG_EVENT` drafts, the
//! `SCHD_SNAP_LOG` row) in its one business transaction.
//!
//! - [`model`]: [`Flight`] and its per-field [`FieldVersion`]s.
//! - [`change`]: [`FlightChange`], [`ScheduleSnapshot`], [`Plan`].
//! - [`event`]: [`EventDraft`] and [`EventType`].
//! - [`rules`]: [`flights_to_load`] and [`plan`].

pub mod change;
pub mod event;
pub mod model;
pub mod rules;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_delete;

pub use change::{FlightChange, Plan, ScheduleSnapshot};
pub use event::{EventDraft, EventType};
pub use model::{fallback_key, FieldVersion, Flight};
pub use rules::{flights_to_load, plan};
