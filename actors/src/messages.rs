//! The typed messages actors exchange. Each says what happened, never what to do inside
//! another actor: the receiver decides.

use actix::Message;
use chrono::{DateTime, Utc};

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

/// Run one poll round now (the poller's own timer sends it; tests and the admin surface may).
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "Result<RoundSummary, String>")]
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
