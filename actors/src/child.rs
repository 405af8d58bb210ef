//! The actor table as code: every child the supervisor runs is a [`Child`], and its
//! [`Child::name`] is the one spelling telemetry (`msgx_actor_restarts_total{child}`), the
//! shutdown registry in `Wiring` and the supervisor (logs, `/readyz`) use. An actor type says
//! which child it is (`supervisor::Supervised::CHILD`, like kameo's `Actor::name`), and
//! `supervisor::ChildFactory::of` is the one way the service starts a child. A leaf module:
//! the wiring and the supervisor both name children.

use msgx_core::telemetry;

/// A child actor of the service's supervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    /// Every child in start order: receivers first, so the poller's first round can report to
    /// them. Graceful shutdown runs it backwards (the poller stops discovering, the pump
    /// finishes its group, the dispatcher writes SENT for what the broker acknowledged).
    pub const ALL: [Child; 8] = [
        Child::LateDetector,
        Child::BackfillSweeper,
        Child::Dispatcher,
        Child::ScheduleRequester,
        Child::PurgeWatch,
        Child::Housekeeper,
        Child::Pump,
        Child::InboxPoller,
    ];

    /// The child's name in metrics, logs, `/readyz` and the shutdown registry; also the name of
    /// its module (`actors/src/<name>.rs`).
    pub fn name(self) -> &'static str {
        match self {
            Child::LateDetector => telemetry::CHILD_LATE_DETECTOR,
            Child::BackfillSweeper => telemetry::CHILD_BACKFILL_SWEEPER,
            Child::Dispatcher => telemetry::CHILD_DISPATCHER,
            Child::ScheduleRequester => telemetry::CHILD_SCHEDULE_REQUESTER,
            Child::PurgeWatch => telemetry::CHILD_PURGE_WATCH,
            Child::Housekeeper => telemetry::CHILD_HOUSEKEEPER,
            Child::Pump => telemetry::CHILD_PUMP,
            Child::InboxPoller => telemetry::CHILD_INBOX_POLLER,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`Child::ALL`] holds each variant at the place this exhaustive match gives it (a new
    /// variant does not compile here without one), and its names are exactly the `child`
    /// values telemetry registers at 0 — a new child registered there fails here until it is
    /// in `ALL`.
    #[test]
    fn the_table_lists_every_child_once_by_its_registered_name() {
        for (i, child) in Child::ALL.iter().enumerate() {
            let place = match child {
                Child::LateDetector => 0,
                Child::BackfillSweeper => 1,
                Child::Dispatcher => 2,
                Child::ScheduleRequester => 3,
                Child::PurgeWatch => 4,
                Child::Housekeeper => 5,
                Child::Pump => 6,
                Child::InboxPoller => 7,
            };
            assert_eq!(place, i, "{child:?} out of place in Child::ALL");
        }
        let mut names: Vec<_> = Child::ALL.iter().map(|c| c.name()).collect();
        let mut registered = telemetry::CHILDREN.to_vec();
        names.sort_unstable();
        registered.sort_unstable();
        assert_eq!(names, registered);
    }
}

#[cfg(test)]
mod doc_table;
