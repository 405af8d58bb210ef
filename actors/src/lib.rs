//! msgexchange actix layer: *when* things happen. One actor per file, the supervisor, the
//! wiring between them, the HTTP surface and the binary's commands. The rules live in
//! `msgx-core`.
//!
//! The actors are the table [`child::Child`] (each child's module is named after it; the
//! supervisor starts them in [`child::Child::ALL`] order); what each handles and tells is in
//! docs/architecture.md, "Actors", a table a unit test renders from the code.
//!
//! Every cross-actor message is in [`messages`]; senders find receivers in [`wiring::Wiring`]
//! (`Recipient`s, replaced when the supervisor rebuilds a child); a unit of work (a round, a
//! sweep, a step) answers `Result<_, `[`messages::WorkError`]`>` — the core step's typed
//! error, never a string ([`work::atomic`] is that shape). The housekeeper's batches answer
//! nothing: they report to telemetry.

pub mod admin;
pub mod app;
pub mod auth;
pub mod backfill_sweeper;
pub mod child;
pub mod cli;
pub mod cli_ops;
#[cfg(feature = "dev-tools")]
pub mod dev_cli;
pub mod dispatcher;
pub mod first_start;
pub mod health;
pub mod housekeeper;
pub mod http;
pub mod inbox_poller;
pub mod late_detector;
pub mod lifecycle;
pub mod mark_traces;
pub mod messages;
pub mod next_run;
pub mod probe;
pub mod probe_roles;
pub mod pump;
pub mod pump_traces;
pub mod purge_watch;
pub mod refusal;
pub mod request;
pub mod request_id;
pub mod schedule_requester;
pub mod shutdown;
pub mod supervisor;
pub mod traces;
pub mod upgrade_status;
pub mod verify_cmd;
pub mod wiring;
pub mod work;

#[cfg(test)]
mod rendered_docs;
