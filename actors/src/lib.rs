//! msgexchange actix layer: *when* things happen. One actor per file, the supervisor, the
//! wiring between them, the HTTP surface and the binary's commands. The rules live in
//! `msgx-core`.
//!
//! | actor | handles | tells | core step |
//! |---|---|---|---|
//! | [`inbox_poller::InboxPoller`] | `PollNow`, `Shutdown` | pump `WatermarkMoved`, late detector `HolesReleased`; `Health` | `poller::poll_once` |
//! | [`pump::Pump`] | `Step`, `WatermarkMoved`, `Shutdown` | sweeper `TerminalCommitted`, dispatcher `EventsQueued` | `pump::PumpCore::step_group` |
//! | [`late_detector::LateDetector`] | `DetectNow`, `ScanNow`, `HolesReleased`, `Shutdown` | — | `late::detect_once`, `late::compensation_scan` |
//! | [`backfill_sweeper::BackfillSweeper`] | `SweepNow`, `TerminalCommitted`, `Shutdown` | — | `backfill::sweep_once` |
//! | [`dispatcher::Dispatcher`] | `DispatchNow`, `EventsQueued`, `Shutdown` (writes SENT for acks) | — | `dispatch::dispatch_once`, `dispatch::flush` |
//! | [`schedule_requester::ScheduleRequester`] | `RequestTick`, `Shutdown` | — | `outbound::daily_step` |
//! | [`purge_watch::PurgeWatch`] | `RefreshBoundary`, `Shutdown` | — | `ops::BoundaryWatch::advance` |
//! | [`housekeeper::Housekeeper`] | `HousekeepNow`, `HousekeepingStep`, `VacuumCheck`, `LastHousekeeping`, `Shutdown` | — | `retention::Job::step`, `retention::vacuum_step` |
//! | [`supervisor::Supervisor`] | `ShutdownPipeline` | every child `Shutdown`; `Fatal` to the binary; `Health` | `store::InstanceLock::check` (lease renewal) |
//!
//! Every cross-actor message is in [`messages`]; senders find receivers in [`wiring::Wiring`]
//! (`Recipient`s, replaced when the supervisor rebuilds a child); work results carry
//! [`messages::WorkError`], never strings.

pub mod admin;
pub mod app;
pub mod auth;
pub mod backfill_sweeper;
pub mod cli;
pub mod cli_ops;
pub mod dispatcher;
pub mod health;
pub mod housekeeper;
pub mod http;
pub mod inbox_poller;
pub mod late_detector;
pub mod lifecycle;
pub mod messages;
pub mod next_run;
pub mod pump;
pub mod purge_watch;
pub mod request;
pub mod schedule_requester;
pub mod shutdown;
pub mod supervisor;
pub mod verify_cmd;
pub mod wiring;
