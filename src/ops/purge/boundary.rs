//! The purge boundary for the `msgx_purge_boundary_id` gauge, kept current incrementally by
//! the same rule as purge readiness ([`super::rule`]). Each round:
//!
//! 1. **Pull down.** A row at or below the boundary stops being purgeable when its record
//!    leaves "terminal and confirmed" — a replay makes it PENDING again; once processed it is
//!    unconfirmed until the sweep confirms the mark (or gives up: abandoned). One indexed query
//!    finds the lowest such record at or below the boundary (the partial indexes
//!    `proc_state_head_idx`, `proc_state_backfill_idx`, `proc_state_abandoned_idx`); one inbox
//!    query keeps only those whose inbox row still exists (a record whose row is gone holds
//!    nothing); the boundary drops to the inbox row just below the first of them. Archived
//!    records never change, so only live ones are read.
//!    The boundary also drops below the first id that holds the purge without a row
//!    ([`super::ids`]): W + 1, or the first id of a watched released hole.
//! 2. **Read on** from the boundary, in batches judged by the rule, to the first row that is
//!    not purgeable, the first held id (or the row cap).
//!
//! Not seen by the gauge (purge readiness sees it): a mark someone clears below the boundary. The gauge is a guide for
//! the purge job; `purge-readiness --to <boundary>` right before a purge is the check.

use chrono::{DateTime, Utc};

use crate::cutover::CutoverStock;
use crate::inbox::Inbox;
use crate::ops::OpsError;
use crate::store::Store;

use super::rule::{Rule, Verdict};
use super::PURGE_BATCH;

/// Most inbox rows one [`BoundaryWatch::advance`] reads on (a first run over a long history
/// catches up over several calls).
pub const BOUNDARY_MAX_ROWS: u64 = 500_000;

/// Most records one pull-down looks at before it stops trusting the rest (then the boundary
/// drops to just above what it checked: safe, never too high).
pub const PULL_DOWN_MAX_IDS: u64 = 50_000;

/// The purge boundary, kept up to date for the `msgx_purge_boundary_id` gauge (see the module
/// doc; a restart starts again from the first row).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BoundaryWatch {
    /// The boundary found so far: id and DATE_RECEIVED.
    pub boundary: Option<(i64, Option<DateTime<Utc>>)>,
    /// The cutover record, read once (it is written once, before the service starts).
    stock: Option<Option<CutoverStock>>,
}

/// What one advance found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Advance {
    /// Inbox rows read on from the boundary.
    pub rows: u64,
    /// True when it stopped at a row that is not purgeable or the inbox end (false: the row
    /// cap).
    pub caught_up: bool,
    /// True when the boundary was pulled down first (a record at or below it is no longer
    /// finished and confirmed).
    pub pulled_down: bool,
}

/// Where a pull-down leaves the walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pull {
    /// Every record at or below the boundary is finished and confirmed, or has no inbox row.
    Clear,
    /// The lowest id that may hold the purge: the boundary drops below it, the walk stops
    /// before it this round.
    Below(i64),
}

/// Live records at or below `to` (and above `after`) that are not finished and confirmed, or
/// that the sweep abandoned while the row existed (MAX_ATTEMPTS; MISSING_ROW means it was
/// gone), ascending: each branch is one partial index. The unconfirmed branch has no ORDER BY
/// / LIMIT of its own: `proc_state_backfill_idx` is keyed (attempts, msg_id), and an ordered
/// limit makes the planner walk the primary key over every row below the boundary instead
/// (measured at 1M rows: 310 ms against 5.5 ms for the whole partial index, which holds only
/// what the sweep has not confirmed yet).
const UNFINISHED_AT_OR_BELOW: &str = "\
    SELECT msg_id FROM ( \
      (SELECT msg_id FROM proc_state WHERE state IN ('PENDING', 'FAILED') \
         AND msg_id > $1 AND msg_id <= $2 ORDER BY msg_id LIMIT $3) \
      UNION \
      (SELECT msg_id FROM proc_state WHERE state IN ('SUCCEEDED', 'SKIPPED', 'DEAD') \
         AND backfill_at IS NULL AND backfill_abandon_reason IS NULL \
         AND msg_id > $1 AND msg_id <= $2) \
      UNION \
      (SELECT msg_id FROM proc_state WHERE backfill_abandon_reason = 'MAX_ATTEMPTS' \
         AND msg_id > $1 AND msg_id <= $2 ORDER BY msg_id LIMIT $3) \
    ) s ORDER BY msg_id LIMIT $3";

impl BoundaryWatch {
    /// One round (see the module doc): pulls the boundary down if needed, reads on (at most
    /// `max_rows` inbox rows) and publishes the gauges (0 when no row may be purged).
    pub async fn advance(
        &mut self,
        inbox: &Inbox,
        store: &Store,
        max_rows: u64,
    ) -> Result<Advance, OpsError> {
        let rule = self.rule(store).await?;
        // W is read (in `rule`) before the watched ranges: see `ids`.
        let held = super::ids::first_held_id(store, rule.w).await?;
        let below_held = self.below_held(inbox, held).await?;
        let pull = self.pull_down(inbox, store).await?;
        let pulled_down = below_held || pull != Pull::Clear;
        let ceiling = match pull {
            Pull::Clear => i64::MAX,
            Pull::Below(id) => id - 1,
        }
        .min(held - 1);
        let mut read = 0u64;
        let caught_up = 'scan: loop {
            if read >= max_rows {
                break false;
            }
            let after = self.boundary.map_or(0, |b| b.0);
            let rows = inbox.mark_rows(after, ceiling, PURGE_BATCH).await?;
            if rows.is_empty() {
                break true;
            }
            let verdicts = rule.judge(store, &rows).await?;
            for (r, v) in rows.iter().zip(verdicts) {
                read += 1;
                if v != Verdict::Purgeable {
                    break 'scan true;
                }
                self.boundary = Some((r.id, r.received_at));
            }
        };
        let (id, at) = self.boundary.unwrap_or((0, None));
        crate::telemetry::purge_boundary(id, at);
        Ok(Advance {
            rows: read,
            caught_up,
            pulled_down,
        })
    }

    /// W now and the cutover record (read once).
    async fn rule(&mut self, store: &Store) -> Result<Rule, OpsError> {
        if self.stock.is_none() {
            self.stock = Some(store.cutover_stock().await?);
        }
        Ok(Rule {
            w: store.read_cursor().await?.cursor.w,
            stock: self.stock.clone().flatten(),
        })
    }

    /// Drops the boundary below `held` (the first id that holds the purge without a row) when
    /// it reached it; true when it did.
    async fn below_held(&mut self, inbox: &Inbox, held: i64) -> Result<bool, OpsError> {
        let Some((boundary, _)) = self.boundary.filter(|b| b.0 >= held) else {
            return Ok(false);
        };
        let new = inbox
            .mark_row_before(held)
            .await?
            .map(|r| (r.id, r.received_at));
        tracing::info!(
            boundary,
            new_boundary = new.map(|b| b.0),
            held_id = held,
            "purge boundary pulled down: an id at or below it may still get a row (a watched \
             released hole, or above W)"
        );
        self.boundary = new;
        Ok(true)
    }

    /// Step 1 of a round: finds the lowest record at or below the boundary that holds the
    /// purge and still has its inbox row, and drops the boundary to the row just below it.
    async fn pull_down(&mut self, inbox: &Inbox, store: &Store) -> Result<Pull, OpsError> {
        let Some((boundary, _)) = self.boundary else {
            return Ok(Pull::Clear);
        };
        let (mut after, mut seen) = (0i64, 0u64);
        let below = loop {
            let ids: Vec<i64> = sqlx::query_scalar(UNFINISHED_AT_OR_BELOW)
                .bind(after)
                .bind(boundary)
                .bind(i64::from(PURGE_BATCH))
                .fetch_all(store.pool())
                .await?;
            let Some(&last) = ids.last() else {
                return Ok(Pull::Clear);
            };
            if let Some(first) = inbox.mark_rows_of(&ids).await?.first() {
                break first.id;
            }
            seen += ids.len() as u64;
            if ids.len() < PURGE_BATCH as usize {
                return Ok(Pull::Clear);
            }
            after = last;
            if seen >= PULL_DOWN_MAX_IDS {
                // Everything up to `after` is checked; above it, not: stop trusting it.
                break after + 1;
            }
        };
        let before = inbox.mark_row_before(below).await?;
        let new = before.map(|r| (r.id, r.received_at));
        tracing::info!(
            boundary,
            new_boundary = new.map(|b| b.0),
            msg_id = below,
            "purge boundary pulled down: a record at or below it is no longer finished and \
             confirmed (replayed?)"
        );
        self.boundary = new;
        Ok(Pull::Below(below))
    }
}
