//! Phase 5, where the time goes: the poller's rounds replayed step by step, each step timed
//! apart, with the inbox read and with the rows made in memory (the store side alone).

use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::Utc;
use msgx_core::clock::{Clock, SystemClock};
use msgx_core::inbox::{Inbox, InboxRow};
use msgx_core::poller::PollConfig;
use msgx_core::store::{EnqueueRow, RoundWrite, Store};
use msgx_core::watermark::Cursor;

use super::{checkpoint, spread_received_at, Loaded};

/// Per-step wall time of the replayed rounds.
#[derive(Debug, Default)]
pub(super) struct Breakdown {
    /// Replayed rounds.
    pub(super) rounds: u32,
    /// Wall time of the whole replay.
    pub(super) elapsed: Duration,
    /// `Store::read_cursor`.
    pub(super) read_cursor: Duration,
    /// `Inbox::rows_after`.
    pub(super) rows_after: Duration,
    /// `Store::commit_round` (BEGIN, SET LOCAL, INSERT … UNNEST, cursor UPDATE, COMMIT).
    pub(super) commit_round: Duration,
    /// `Inbox::max_id` after a full batch.
    pub(super) max_id: Duration,
}

/// Where a round's time goes: after the real run, empties the queue, rewinds W and replays the
/// rounds with the same public calls `poll_once` makes, in the same order, timing each apart
/// (the ids are contiguous, so the watermark rule reduces to "W = last id read"). Without
/// `read_inbox` the rows are made in memory instead: the store side of the rounds alone.
pub(super) async fn round_breakdown(
    inbox: &Inbox,
    store: &Store,
    cfg: PollConfig,
    load: &Loaded,
    read_inbox: bool,
) -> anyhow::Result<Breakdown> {
    let pool = store.pool();
    sqlx::query("TRUNCATE proc_state CASCADE")
        .execute(pool)
        .await
        .context("emptying proc_state for the replay")?;
    sqlx::query("UPDATE inbox_cursor SET w = $1, hole_since = NULL WHERE id = 1")
        .bind(load.min_id - 1)
        .execute(pool)
        .await
        .context("rewinding W for the replay")?;
    checkpoint(pool).await;

    let clock = SystemClock;
    let mut b = Breakdown::default();
    let started = Instant::now();
    let mut w = load.min_id - 1;
    while w < load.max_id {
        let t0 = Instant::now();
        let before = store
            .read_cursor()
            .await
            .context("replay: read_cursor")?
            .cursor;
        let t1 = Instant::now();
        let rows = if read_inbox {
            inbox
                .rows_after(before.w, cfg.claim_batch)
                .await
                .with_context(|| format!("replay: rows_after {}", before.w))?
        } else {
            synthetic_rows(
                before.w,
                i64::from(cfg.claim_batch).min(load.max_id - before.w),
            )
        };
        let t2 = Instant::now();
        let Some(last) = rows.last() else {
            anyhow::bail!(
                "replay: no inbox rows after {} below the head {}",
                before.w,
                load.max_id
            );
        };
        let enqueue: Vec<EnqueueRow> = rows
            .iter()
            .map(|r| EnqueueRow {
                msg_id: r.id,
                received_at: r.received_at,
            })
            .collect();
        store
            .commit_round(RoundWrite {
                expected_w: before.w,
                cursor: Cursor {
                    w: last.id,
                    hole_since: None,
                },
                rows: &enqueue,
                now: clock.now(),
                async_commit: cfg.async_commit,
                holes: &[],
                released: &[],
                watch_until: clock.now(),
            })
            .await
            .context("replay: commit_round")?;
        let t3 = Instant::now();
        if read_inbox && rows.len() >= cfg.claim_batch as usize {
            inbox.max_id().await.context("replay: max_id")?;
        }
        let t4 = Instant::now();
        b.read_cursor += t1 - t0;
        b.rows_after += t2 - t1;
        b.commit_round += t3 - t2;
        b.max_id += t4 - t3;
        b.rounds += 1;
        w = last.id;
    }
    b.elapsed = started.elapsed();
    Ok(b)
}

/// The inbox rows `after+1 ..= after+n` as `rows_after` would return them, made in memory.
fn synthetic_rows(after: i64, n: i64) -> Vec<InboxRow> {
    let now = Utc::now();
    (after + 1..=after + n)
        .map(|id| InboxRow {
            id,
            received_at: Some(spread_received_at(now, id)),
        })
        .collect()
}
