//! Supervisor metrics (child restarts, restart intensity), each next to its log line.

use std::time::Duration;

use metrics::{counter, gauge};

use super::Def;

/// Restarts of a child actor by the supervisor, by `child` (one of [`CHILDREN`]).
pub const ACTOR_RESTARTS_TOTAL: &str = "msgx_actor_restarts_total";
/// Child restarts within `supervisor.restart_window` (the restart intensity's count).
pub const SUPERVISOR_RESTARTS_IN_WINDOW: &str = "msgx_supervisor_restarts_in_window";
/// 1 once the supervisor gave up (restart intensity exceeded; the process exits).
pub const SUPERVISOR_GAVE_UP: &str = "msgx_supervisor_gave_up";

/// The inbox poller (discovery).
pub const CHILD_INBOX_POLLER: &str = "inbox_poller";
/// The pump (processing).
pub const CHILD_PUMP: &str = "pump";
/// The dispatcher (Kafka delivery).
pub const CHILD_DISPATCHER: &str = "dispatcher";
/// The late detector.
pub const CHILD_LATE_DETECTOR: &str = "late_detector";
/// The backfill sweeper (inbox marks).
pub const CHILD_BACKFILL_SWEEPER: &str = "backfill_sweeper";
/// The purge-boundary watch.
pub const CHILD_PURGE_WATCH: &str = "purge_watch";
/// The schedule requester (outbound).
pub const CHILD_SCHEDULE_REQUESTER: &str = "schedule_requester";
/// Every supervised child (`ChildFactory::name` of the service's children).
pub const CHILDREN: &[&str] = &[
    CHILD_INBOX_POLLER,
    CHILD_PUMP,
    CHILD_DISPATCHER,
    CHILD_LATE_DETECTOR,
    CHILD_BACKFILL_SWEEPER,
    CHILD_PURGE_WATCH,
    CHILD_SCHEDULE_REQUESTER,
];

/// The series of this file.
pub(super) fn defs() -> Vec<Def> {
    vec![
        Def::counter(
            ACTOR_RESTARTS_TOTAL,
            "restarts",
            "Child actors restarted by the supervisor, by child",
        )
        .label("child", CHILDREN),
        Def::gauge(
            SUPERVISOR_RESTARTS_IN_WINDOW,
            "restarts",
            "Child restarts within supervisor.restart_window (the restart intensity)",
        )
        .starts_at(0.0),
        Def::gauge(
            SUPERVISOR_GAVE_UP,
            "1 = yes",
            "1 once the restart intensity was exceeded and the service stops",
        )
        .starts_at(0.0),
    ]
}

/// A child actor was rebuilt.
pub fn actor_restarted(child: &'static str, after: Duration) {
    counter!(ACTOR_RESTARTS_TOTAL, "child" => child).increment(1);
    tracing::error!(
        child,
        backoff_ms = after.as_millis() as u64,
        "child actor stopped unexpectedly; restarting"
    );
}

/// The restart intensity's current count.
pub fn restarts_in_window(n: usize) {
    gauge!(SUPERVISOR_RESTARTS_IN_WINDOW).set(n as f64);
}

/// The supervisor gives up: the service stops non-zero.
pub fn supervisor_gave_up(why: &str) {
    gauge!(SUPERVISOR_GAVE_UP).set(1.0);
    tracing::error!(
        why,
        alert = true,
        "supervisor gave up; stopping the service"
    );
}
