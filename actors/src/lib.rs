//! msgexchange actix layer: *when* things happen. One actor per file, the supervisor, the
//! wiring between them, the HTTP surface and the binary's commands. The rules live in
//! `msgx-core`.

pub mod admin;
pub mod app;
pub mod backfill_sweeper;
pub mod cli;
pub mod dispatcher;
pub mod health;
pub mod http;
pub mod inbox_poller;
pub mod late_detector;
pub mod messages;
pub mod next_run;
pub mod pump;
pub mod request;
pub mod schedule_requester;
pub mod supervisor;
pub mod wiring;
