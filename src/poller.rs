//! One discovery round (SPEC §3): read the cursor, read `id > W`, decide, commit. The actor
//! only decides when to call it again.

use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::inbox::{Inbox, InboxError};
use crate::store::{EnqueueRow, RoundWrite, Store, StoreError};
use crate::watermark::{advance, Advance, Cursor};

/// Knobs of a round.
#[derive(Debug, Clone, Copy)]
pub struct PollConfig {
    /// Rows read per round.
    pub claim_batch: u32,
    /// Hole aging threshold.
    pub max_commit_delay: Duration,
    /// Enqueue commit without WAL flush wait.
    pub async_commit: bool,
    /// How long released hole ids stay watched for a late commit.
    pub watch_window: Duration,
}

/// What a successful round did.
#[derive(Debug, Clone)]
pub struct PollReport {
    /// The cursor before the round.
    pub before: Cursor,
    /// The decision that was committed.
    pub advance: Advance,
    /// Rows read from the inbox.
    pub read: usize,
    /// Rows that were not yet in PROC_STATE.
    pub enqueued_new: u64,
    /// The batch was full: more rows are probably waiting, poll again at once.
    pub batch_full: bool,
    /// Highest inbox id known after the round (None when unknown).
    pub inbox_head: Option<i64>,
    /// Age of the oldest row left behind W (zero when caught up; None when unknown).
    pub lag: Option<Duration>,
    /// Wall time the round took.
    pub duration: Duration,
}

impl PollReport {
    /// W moved this round.
    pub fn moved(&self) -> bool {
        self.advance.w != self.before.w
    }

    /// Poll again without waiting: more rows are there, or a release made room.
    pub fn poll_again_now(&self) -> bool {
        self.batch_full || self.advance.released.is_some()
    }
}

/// Why a round failed. In every case W stays where it was.
#[derive(Debug, thiserror::Error)]
pub enum PollError {
    /// Reading the cursor or committing the round failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The inbox could not be read: an infrastructure failure, never "no new rows".
    #[error("inbox: {0}")]
    Inbox(#[from] InboxError),
    /// The inbox returned ids that are not ascending and above W.
    #[error("inbox returned ids out of order after W={w}: {detail}")]
    Unordered { w: i64, detail: String },
}

impl PollError {
    /// Stage label for metrics.
    pub fn stage(&self) -> &'static str {
        match self {
            Self::Store(_) => "store",
            Self::Inbox(_) | Self::Unordered { .. } => "inbox",
        }
    }
}

/// Runs one round.
pub async fn poll_once(
    inbox: &Inbox,
    store: &Store,
    clock: &dyn Clock,
    cfg: PollConfig,
) -> Result<PollReport, PollError> {
    let started = Instant::now();
    let before = store.read_cursor().await?.cursor;
    let rows = inbox.rows_after(before.w, cfg.claim_batch).await?;
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    if let Some(bad) = ids
        .iter()
        .zip(std::iter::once(&before.w).chain(ids.iter()))
        .find(|(id, prev)| id <= prev)
    {
        return Err(PollError::Unordered {
            w: before.w,
            detail: format!("{} after {}", bad.0, bad.1),
        });
    }
    let now = clock.now();
    let batch_full = rows.len() as u64 >= u64::from(cfg.claim_batch);
    let decision = advance(before, &ids, now, cfg.max_commit_delay);

    let enqueue: Vec<EnqueueRow> = rows[..decision.enqueue]
        .iter()
        .map(|r| EnqueueRow {
            msg_id: r.id,
            received_at: r.received_at,
        })
        .collect();
    let after = Cursor {
        w: decision.w,
        hole_since: decision.hole_since,
    };
    let enqueued_new = if enqueue.is_empty() && after == before {
        0 // nothing to write: spare the store an empty transaction every second
    } else {
        store
            .commit_round(RoundWrite {
                expected_w: before.w,
                cursor: after,
                rows: &enqueue,
                now,
                async_commit: cfg.async_commit,
                released: decision.released.map(|r| {
                    let window = chrono::Duration::from_std(cfg.watch_window)
                        .unwrap_or(chrono::Duration::MAX);
                    (r.ids(), now + window)
                }),
            })
            .await?
    };

    let inbox_head = match (rows.last(), batch_full) {
        (_, true) => inbox.max_id().await.ok().flatten(),
        (Some(last), false) => Some(last.id),
        (None, false) => Some(before.w),
    };
    let lag = match rows.get(decision.enqueue) {
        Some(waiting) => waiting
            .received_at
            .map(|t| (now - t).to_std().unwrap_or(Duration::ZERO)),
        None if !batch_full => Some(Duration::ZERO),
        None => None,
    };
    Ok(PollReport {
        before,
        advance: decision,
        read: rows.len(),
        enqueued_new,
        batch_full,
        inbox_head,
        lag,
        duration: started.elapsed(),
    })
}
