//! The typed messages actors exchange. Each says what happened, never what to do inside
//! another actor: the receiver decides.

use actix::Message;
use chrono::{DateTime, Utc};
use msgx_core::backfill::SweepReport;
use msgx_core::dispatch::RoundReport;
use msgx_core::late::{DetectReport, ScanReport};
use msgx_core::ops::Advance;
use msgx_core::outbound::DailyReport;
use msgx_core::poller::PollReport;
use msgx_core::pump::StepOutcome;

/// The poller moved W: rows up to `w` are enqueued. The pump wakes to look for a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub struct WatermarkMoved {
    /// The new watermark.
    pub w: i64,
}

/// The poller released a permanent hole: these ids were skipped and must be watched for a
/// late commit (the late detector).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub struct HolesReleased {
    /// First released id.
    pub first: i64,
    /// Last released id.
    pub last: i64,
    /// When they were released (injected clock): the start of the watch window.
    pub at: DateTime<Utc>,
}

/// Run one poll round now (the poller's own timer sends it; tests may).
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "Result<RoundSummary, WorkError>")]
pub struct PollNow;

/// What a round did, for whoever asked for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundSummary {
    /// W after the round.
    pub w: i64,
    /// Rows newly enqueued.
    pub enqueued: u64,
    /// The first hole released this round, if any.
    pub released: Option<(i64, i64)>,
    /// W waits at a young hole.
    pub hole_open: bool,
}

impl From<PollReport> for RoundSummary {
    fn from(r: PollReport) -> Self {
        Self {
            w: r.advance.w,
            enqueued: r.enqueued_new,
            released: r.advance.first_released().map(|h| (h.first, h.last)),
            hole_open: r.advance.open_hole.is_some(),
        }
    }
}

/// Run one pump step now (the pump's own timer and wake-ups send it; tests may).
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "Result<Vec<StepOutcome>, WorkError>")]
pub struct Step;

/// Refresh the backlog gauges now (the pump's own five-second timer sends it).
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "()")]
pub struct RefreshBacklog;

/// Run one sweep now (the sweeper's own timer sends it; tests may).
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "Result<SweepReport, WorkError>")]
pub struct SweepNow;

/// Run one detection round now (the detector's own timer and `HolesReleased` send it; tests
/// may).
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "Result<DetectReport, WorkError>")]
pub struct DetectNow;

/// Run one compensation scan now (the detector's own timer sends it; tests may).
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "Result<ScanReport, WorkError>")]
pub struct ScanNow;

/// Run one dispatch round now (the dispatcher's own timer sends it; tests may).
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "Result<DispatchSummary, WorkError>")]
pub struct DispatchNow;

/// The dispatcher's outcome write (a task beside its rounds) ended; the dispatcher takes its
/// result between two rounds.
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "()")]
pub struct WriteEnded;

/// What a dispatch round did, for whoever asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DispatchSummary {
    /// Events read.
    pub selected: usize,
    /// Acknowledged by the broker (written as SENT by the dispatcher's next outcome write).
    pub acked: usize,
    /// Failed sends.
    pub failed: usize,
}

impl From<RoundReport> for DispatchSummary {
    fn from(r: RoundReport) -> Self {
        Self {
            selected: r.selected,
            acked: r.acked,
            failed: r.failed + r.dlq_failed,
        }
    }
}

/// Take one schedule-requester step now (the requester's own timer sends it; tests may).
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "Result<DailyReport, WorkError>")]
pub struct RequestTick;

/// Advance the purge boundary now (the purge watch's own timer sends it; tests may).
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "Result<Advance, WorkError>")]
pub struct RefreshBoundary;

/// A sweep confirmed marks (`backfill_at` set): the purge boundary may move, so the purge
/// watch reads on soon instead of at its next period — during a drain it keeps pace, and the
/// inbox stays quiet once the drain is over (issue 43: idle means idle).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub struct MarksConfirmed {
    /// Rows the sweep confirmed.
    pub rows: usize,
}

/// The pump committed a terminal state (with its backfill intent): a sweep may come early
/// (the backfill sweeper).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub struct TerminalCommitted {
    /// The row that became terminal.
    pub msg_id: i64,
}

/// The pump committed a message that raised events: a round may come now (the dispatcher).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub struct EventsQueued {
    /// The message whose events were committed.
    pub msg_id: i64,
}

/// Graceful shutdown (SIGTERM/SIGINT), sent by the supervisor to every child, last started
/// first. The receiver stops taking work, finishes what is in flight (its step runs as an
/// `AtomicResponse`, so this message is handled only after it), writes what it owes the store
/// (the dispatcher: SENT for acknowledged events, within `deadline`) and stops. Work still
/// running at `deadline` is abandoned: it rolls back and is redone by the next holder.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Result<(), ShutdownError>")]
pub struct Shutdown {
    /// When the whole service must be gone (`supervisor.shutdown_grace` after the signal).
    pub deadline: std::time::Instant,
}

/// Why an actor could not finish its shutdown cleanly (it stops anyway; nothing is lost, the
/// unwritten part is redone by the next instance).
#[derive(Debug, thiserror::Error)]
pub enum ShutdownError {
    /// Writing what the actor owed the store failed.
    #[error("{actor}: could not write its last outcome: {source}")]
    Store {
        actor: &'static str,
        #[source]
        source: msgx_core::store::StoreError,
    },
    /// The deadline came before the actor had written what it owed.
    #[error("{actor}: the shutdown deadline passed before its last outcome was written")]
    Deadline { actor: &'static str },
}

/// The supervisor's answer to [`Shutdown`]: which children stopped in time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Children that confirmed their stop.
    pub stopped: Vec<&'static str>,
    /// Children that were still busy at the deadline, or failed their last write.
    pub unclean: Vec<&'static str>,
}

/// Ask the supervisor to shut the pipeline down (see [`Shutdown`]).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "ShutdownReport")]
pub struct ShutdownPipeline {
    /// When the whole service must be gone.
    pub deadline: std::time::Instant,
}

/// Why an actor's unit of work (a round, a sweep, a step) failed, as its caller receives it:
/// the core step's own error, typed, never a string.
#[derive(Debug, thiserror::Error)]
pub enum WorkError {
    /// A poll round.
    #[error(transparent)]
    Poll(#[from] msgx_core::poller::PollError),
    /// A late-detection round.
    #[error(transparent)]
    Detect(#[from] msgx_core::late::DetectError),
    /// A backfill sweep or a pump step (PostgreSQL).
    #[error(transparent)]
    Store(#[from] msgx_core::store::StoreError),
    /// A purge-boundary round.
    #[error(transparent)]
    Purge(#[from] msgx_core::ops::OpsError),
    /// A schedule-requester step.
    #[error(transparent)]
    Outbound(#[from] msgx_core::outbound::OutboundError),
    /// A dispatch round.
    #[error(transparent)]
    Dispatch(#[from] msgx_core::dispatch::DispatchError),
    /// The dispatcher's producer is out (a round panicked; the supervisor rebuilds it).
    #[error("the kafka producer is unavailable")]
    ProducerUnavailable,
}

/// Start a housekeeping (retention) job now unless one is running (the housekeeper's own timer
/// sends it every `retention.period`; tests and tools may). Answers whether a job started.
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "bool")]
pub struct HousekeepNow;

/// Run the next batch of the job in progress (the housekeeper sends it to itself after
/// `retention.batch_pause`, so its mailbox — and a [`Shutdown`] — waits one batch at most).
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "()")]
pub struct HousekeepingStep;

/// Read our tables' dead-tuple counts and vacuum the ones past `retention.vacuum_threshold`
/// (the housekeeper sends it to itself every `retention.vacuum_check`).
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "()")]
pub struct VacuumCheck;

/// The last finished housekeeping job and how many jobs finished so far (tests, tools).
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "(u64, Option<msgx_core::retention::JobReport>)")]
pub struct LastHousekeeping;
