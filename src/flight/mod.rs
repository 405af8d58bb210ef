//! Flight state and the pure merge rules: (current state, message) → changes + events
//! (SPEC §4 "domain decisions do no I/O", §12 "Schedule merge", Appendix A).
//!
//! The message processor calls [`flights_to_load`], loads those rows and their code-shares,
//! calls [`plan`] (for a late message: [`plan_guarded`]) and writes the [`Plan`] (row changes,
//! `MSG_EVENT` drafts, the `SCHD_SNAP_LOG` row) in its one business transaction.
//!
//! - [`model`]: [`Flight`] and its per-field [`FieldVersion`]s.
//! - [`change`]: [`FlightChange`], [`ScheduleSnapshot`], [`Plan`].
//! - [`event`]: [`EventDraft`] and [`EventType`].
//! - [`rules`]: [`flights_to_load`] and [`plan`].
//! - [`guard`]: [`plan_guarded`], the ordering guard for late messages (SPEC §6 G1).

pub mod change;
pub mod event;
pub mod guard;
pub mod model;
pub mod rules;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_delete;
#[cfg(test)]
mod tests_guard;

pub use change::{FlightChange, Plan, ScheduleSnapshot};
pub use event::{EventDraft, EventType};
pub use guard::{plan_guarded, GuardedPlan, Refused, Tombstones};
pub use model::{fallback_key, FieldVersion, Flight};
pub use rules::{flights_to_load, plan};
