//! Flight state and the pure merge rules: (current state, message) → changes + events
//! (SPEC §4 "domain decisions do no I/O", §12 "Schedule merge", Appendix A).
//!
//! The message processor calls [`flights_to_load`], loads those rows and their code-shares,
//! calls [`plan`] (for a late message: [`plan_guarded`]) and writes the [`Plan`] (row changes,
//! `MSG_EVENT` drafts, the `SCHD_SNAP_LOG` row) in its one business transaction.
//!
//! - [`model`]: [`Flight`] and its per-field [`FieldVersion`]s.
//! - [`change`]: [`FlightChange`] and [`ScheduleSnapshot`].
//! - [`event`]: [`EventDraft`] and [`EventType`].
//! - [`plan`](mod@plan): [`Plan`], the changes and events of one message.
//! - [`rules`]: [`flights_to_load`], [`plan`] and [`plan_guarded`].
//! - [`guard`]: the ordering guard for late messages (SPEC §6 G1) [`plan_guarded`] applies.

pub mod change;
pub mod event;
pub mod guard;
pub mod model;
pub mod plan;
pub mod rules;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_delete;
#[cfg(test)]
mod tests_guard;

pub use change::{FlightChange, ScheduleSnapshot};
pub use event::{EventDraft, EventType};
pub use guard::{GuardedPlan, Refused, Tombstones};
pub use model::{fallback_key, FieldVersion, Flight};
pub use plan::Plan;
pub use rules::{flights_to_load, plan, plan_guarded};
