//! Supervisor metrics (child restarts, restart intensity), each next to its log line.

use std::time::Duration;

use metrics::{counter, gauge};

use super::Def;

/// Restarts of a child actor by the supervisor, by `child` (a [`Child`]).
pub const ACTOR_RESTARTS_TOTAL: &str = "msgx_actor_restarts_total";
/// Child restarts within `supervisor.restart_window` (the restart intensity's count).
pub const SUPERVISOR_RESTARTS_IN_WINDOW: &str = "msgx_supervisor_restarts_in_window";
/// 1 once the supervisor gave up (restart intensity exceeded; the process exits).
pub const SUPERVISOR_GAVE_UP: &str = "msgx_supervisor_gave_up";

/// A child actor of the service's supervisor: the `child` label of
/// [`ACTOR_RESTARTS_TOTAL`], and the actor table (`msgx_actors::child`, which says what each
/// one does). Declared in start order: receivers first, so the poller's first round can report
/// to them; graceful shutdown runs it backwards (the poller stops discovering, the pump
/// finishes its group, the dispatcher writes SENT for what the broker acknowledged).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::VariantArray, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Child {
    /// Watches released holes for late commits; runs the compensation scan.
    LateDetector,
    /// Writes the inbox marks.
    BackfillSweeper,
    /// Delivers events to Kafka.
    Dispatcher,
    /// Asks upstream for the daily schedule.
    ScheduleRequester,
    /// Keeps the purge boundary gauge current.
    PurgeWatch,
    /// Retention and vacuum of our tables.
    Housekeeper,
    /// The single FIFO head: processing.
    Pump,
    /// Discovery: moves W.
    InboxPoller,
}

impl Child {
    /// Every child, in start order.
    pub const ALL: &'static [Child] = <Child as strum::VariantArray>::VARIANTS;

    /// The child's name in metrics, logs, `/readyz` and the shutdown registry; also the name of
    /// its module (`actors/src/<name>.rs`).
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// The series of this file.
pub(super) fn defs() -> Vec<Def> {
    vec![
        Def::counter(
            ACTOR_RESTARTS_TOTAL,
            "restarts",
            "Child actors restarted by the supervisor, by child",
        )
        .label(
            "child",
            &Child::ALL.iter().map(|c| c.name()).collect::<Vec<_>>(),
        ),
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
