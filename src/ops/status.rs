//! `msgexchange status` / `GET /admin/status`: the pipeline at a glance, from the stores alone
//! (W, the open hole, the FIFO head, the backlog, the drain estimate, backfill, dispatch, the
//! lease). Every query is on an index or a bounded scan, so `status --watch` is cheap.

use chrono::{DateTime, Utc};
use serde::Serialize;

mod render;

use super::{Ops, OpsError};

/// Rows looked at for the processing rate (the newest by processing order).
const RATE_SAMPLE: i64 = 10_000;

/// The whole answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Status {
    /// When it was read (the caller's clock).
    pub as_of: DateTime<Utc>,
    /// The contiguous watermark.
    pub watermark: WatermarkStatus,
    /// The hole W waits at, if any.
    pub holes: HoleStatus,
    /// The FIFO head (smallest unfinished id ≤ W), if any.
    pub head: Option<HeadStatus>,
    /// Unfinished rows.
    pub backlog: BacklogStatus,
    /// How long the backlog takes at the recent rate (G6).
    pub drain: DrainStatus,
    /// Terminal rows not yet marked in the inbox.
    pub backfill: BackfillStatus,
    /// Events not yet acknowledged by Kafka.
    pub dispatch: DispatchStatus,
    /// The single-instance lease.
    pub lease: LeaseStatus,
}

/// W.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WatermarkStatus {
    /// Every inbox id ≤ w is enqueued or released as a hole.
    pub w: i64,
    /// When cutover seeding set W, if ever.
    pub seeded_at: Option<DateTime<Utc>>,
    /// Last cursor write.
    pub updated_at: DateTime<Utc>,
}

/// The open hole at W+1.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HoleStatus {
    /// Open holes (id ranges above W), each aging on its own.
    pub open: i64,
    /// Ids missing in them.
    pub missing_ids: i64,
    /// The first id W waits at, if a hole is open there.
    pub first_missing: Option<i64>,
    /// When the oldest open hole was first seen.
    pub oldest_since: Option<DateTime<Utc>>,
    /// Its age.
    pub oldest_age_seconds: Option<f64>,
}

/// The FIFO head.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HeadStatus {
    /// Its id.
    pub msg_id: i64,
    /// PENDING or FAILED.
    pub state: String,
    /// Attempts so far.
    pub attempts: i32,
    /// Receive (else enqueue) time.
    pub since: DateTime<Utc>,
    /// Age from `since`.
    pub age_seconds: f64,
    /// The last failure's class, if FAILED.
    pub error_class: Option<String>,
    /// The last failure's text.
    pub last_error: Option<String>,
    /// When a FAILED head is due again.
    pub next_attempt_at: Option<DateTime<Utc>>,
}

/// Unfinished rows by state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BacklogStatus {
    /// PENDING rows.
    pub pending: i64,
    /// FAILED rows (backing off).
    pub failed: i64,
    /// PENDING + FAILED.
    pub unfinished: i64,
    /// Of them, registered beyond W (compat entry): they wait until W catches up.
    pub beyond_w: i64,
    /// Oldest receive (else enqueue) time among them.
    pub oldest_at: Option<DateTime<Utc>>,
    /// Its age.
    pub oldest_age_seconds: Option<f64>,
}

/// The drain estimate: unfinished ÷ messages finished per second over the window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DrainStatus {
    /// `processing.drain_rate_window`.
    pub window_seconds: f64,
    /// Messages that reached a terminal state in the window (among the newest 10,000).
    pub finished_in_window: i64,
    /// Per second.
    pub rate_per_second: f64,
    /// `empty` (nothing to drain), `stalled` (a backlog and no progress) or `seconds`.
    pub estimate: &'static str,
    /// Seconds to drain at that rate (with `seconds`).
    pub estimated_seconds: Option<f64>,
}

/// Marking.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BackfillStatus {
    /// Terminal rows not marked and not abandoned.
    pub pending: i64,
    /// Oldest terminal time among them.
    pub oldest_at: Option<DateTime<Utc>>,
    /// Its age.
    pub oldest_age_seconds: Option<f64>,
    /// Abandoned `MISSING_ROW` (recover with `recover-backfill`).
    pub abandoned_missing_row: i64,
    /// Abandoned `MAX_ATTEMPTS`.
    pub abandoned_max_attempts: i64,
}

/// Delivery.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DispatchStatus {
    /// PENDING events.
    pub pending: i64,
    /// Oldest pending creation time.
    pub oldest_at: Option<DateTime<Utc>>,
    /// Its age.
    pub oldest_age_seconds: Option<f64>,
    /// DEAD events (`events list-dead`, `events requeue`).
    pub dead: i64,
}

/// The lease.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LeaseStatus {
    /// `host:pid` of the last instance that took it.
    pub holder: Option<String>,
    /// Its fencing epoch.
    pub epoch: i64,
    /// When it was taken.
    pub acquired_at: Option<DateTime<Utc>>,
    /// Whether an instance holds the lock right now (the service runs).
    pub held: bool,
}

fn age(now: DateTime<Utc>, t: Option<DateTime<Utc>>) -> Option<f64> {
    t.map(|t| ((now - t).num_milliseconds().max(0)) as f64 / 1000.0)
}

/// `w, hole_since, seeded_at, updated_at`.
type CursorTuple = (
    i64,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
    DateTime<Utc>,
);

/// `msg_id, state, attempts, since, error_class, error_text, next_attempt_at`.
type HeadTuple = (
    i64,
    String,
    i32,
    DateTime<Utc>,
    Option<String>,
    Option<String>,
    Option<DateTime<Utc>>,
);

impl Ops {
    /// Reads the status as of `now`.
    pub async fn status(&self, now: DateTime<Utc>) -> Result<Status, OpsError> {
        let (watermark, holes) = self.watermark_and_holes(now).await?;
        let head = self.head_status(watermark.w, now).await?;
        let backlog = self.backlog_status(watermark.w, now).await?;
        let drain = self.drain_status(backlog.unfinished, now).await?;
        Ok(Status {
            as_of: now,
            watermark,
            holes,
            head,
            backlog,
            drain,
            backfill: self.backfill_status(now).await?,
            dispatch: self.dispatch_status(now).await?,
            lease: self.lease_status().await?,
        })
    }

    /// W and the holes above it.
    async fn watermark_and_holes(
        &self,
        now: DateTime<Utc>,
    ) -> Result<(WatermarkStatus, HoleStatus), OpsError> {
        let pool = self.store.pool();
        let (w, hole_since, seeded_at, updated_at): CursorTuple = sqlx::query_as(
            "SELECT w, hole_since, seeded_at, updated_at FROM inbox_cursor WHERE id = 1",
        )
        .fetch_one(pool)
        .await?;
        let (open, missing_ids, first_missing): (i64, i64, Option<i64>) = sqlx::query_as(
            "SELECT count(*), COALESCE(sum(last_id - first_id + 1), 0)::bigint, \
                    min(first_id) FILTER (WHERE first_id = $1 + 1) \
             FROM inbox_hole",
        )
        .bind(w)
        .fetch_one(pool)
        .await?;
        let watermark = WatermarkStatus {
            w,
            seeded_at,
            updated_at,
        };
        let holes = HoleStatus {
            open,
            missing_ids,
            first_missing,
            oldest_since: hole_since,
            oldest_age_seconds: age(now, hole_since),
        };
        Ok((watermark, holes))
    }

    /// The FIFO head at or below W.
    async fn head_status(
        &self,
        w: i64,
        now: DateTime<Utc>,
    ) -> Result<Option<HeadStatus>, OpsError> {
        let head: Option<HeadTuple> = sqlx::query_as(
            "SELECT msg_id, state, attempts, COALESCE(received_at, enqueued_at), error_class, \
                    error_text, next_attempt_at \
             FROM proc_state WHERE state IN ('PENDING', 'FAILED') AND msg_id <= $1 \
             ORDER BY msg_id LIMIT 1",
        )
        .bind(w)
        .fetch_optional(self.store.pool())
        .await?;
        Ok(head.map(
            |(msg_id, state, attempts, since, error_class, last_error, next)| HeadStatus {
                msg_id,
                state,
                attempts,
                since,
                age_seconds: age(now, Some(since)).unwrap_or(0.0),
                error_class,
                last_error,
                next_attempt_at: next,
            },
        ))
    }

    /// Unfinished rows by state.
    async fn backlog_status(&self, w: i64, now: DateTime<Utc>) -> Result<BacklogStatus, OpsError> {
        let (pending, failed, beyond_w, oldest): (i64, i64, i64, Option<DateTime<Utc>>) =
            sqlx::query_as(
                "SELECT count(*) FILTER (WHERE state = 'PENDING'), \
                        count(*) FILTER (WHERE state = 'FAILED'), \
                        count(*) FILTER (WHERE msg_id > $1), \
                        min(COALESCE(received_at, enqueued_at)) \
                 FROM proc_state WHERE state IN ('PENDING', 'FAILED')",
            )
            .bind(w)
            .fetch_one(self.store.pool())
            .await?;
        Ok(BacklogStatus {
            pending,
            failed,
            unfinished: pending + failed,
            beyond_w,
            oldest_at: oldest,
            oldest_age_seconds: age(now, oldest),
        })
    }

    /// The recent processing rate and how long `unfinished` takes at it.
    async fn drain_status(
        &self,
        unfinished: i64,
        now: DateTime<Utc>,
    ) -> Result<DrainStatus, OpsError> {
        let window = chrono::Duration::from_std(self.drain_window)
            .unwrap_or_else(|_| chrono::Duration::minutes(5));
        let (finished, first): (i64, Option<DateTime<Utc>>) = sqlx::query_as(
            "SELECT count(*), min(terminal_at) FROM ( \
                 SELECT terminal_at FROM proc_state WHERE processed_seq IS NOT NULL \
                 ORDER BY processed_seq DESC LIMIT $2) t \
             WHERE terminal_at >= $1 AND terminal_at <= $3",
        )
        .bind(now - window)
        .bind(RATE_SAMPLE)
        .bind(now)
        .fetch_one(self.store.pool())
        .await?;
        let window_s = self.drain_window.as_secs_f64().max(1.0);
        // A full sample covers less than the window: its own span is the rate's base.
        let span = match first {
            Some(t) if finished >= RATE_SAMPLE => age(now, Some(t)).unwrap_or(window_s).max(1.0),
            _ => window_s,
        };
        let rate = finished as f64 / span;
        let (estimate, estimated_seconds) = if unfinished == 0 {
            ("empty", None)
        } else if rate <= 0.0 {
            ("stalled", None)
        } else {
            ("seconds", Some(unfinished as f64 / rate))
        };
        Ok(DrainStatus {
            window_seconds: window_s,
            finished_in_window: finished,
            rate_per_second: rate,
            estimate,
            estimated_seconds,
        })
    }

    /// Terminal rows waiting for their inbox mark, and the abandoned ones.
    async fn backfill_status(&self, now: DateTime<Utc>) -> Result<BackfillStatus, OpsError> {
        let backfill = self.store.backfill_backlog().await?;
        let (missing_row, max_attempts): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE backfill_abandon_reason = 'MISSING_ROW'), \
                    count(*) FILTER (WHERE backfill_abandon_reason = 'MAX_ATTEMPTS') \
             FROM proc_state WHERE backfill_abandon_reason IS NOT NULL",
        )
        .fetch_one(self.store.pool())
        .await?;
        Ok(BackfillStatus {
            pending: backfill.pending,
            oldest_at: backfill.oldest,
            oldest_age_seconds: age(now, backfill.oldest),
            abandoned_missing_row: missing_row,
            abandoned_max_attempts: max_attempts,
        })
    }

    /// Events waiting for Kafka, and the dead ones.
    async fn dispatch_status(&self, now: DateTime<Utc>) -> Result<DispatchStatus, OpsError> {
        let events = self.store.event_backlog().await?;
        let dead: i64 = sqlx::query_scalar("SELECT count(*) FROM msg_event WHERE state = 'DEAD'")
            .fetch_one(self.store.pool())
            .await?;
        Ok(DispatchStatus {
            pending: events.pending,
            oldest_at: events.oldest,
            oldest_age_seconds: age(now, events.oldest),
            dead,
        })
    }

    /// The lease row and whether a live instance holds it.
    async fn lease_status(&self) -> Result<LeaseStatus, OpsError> {
        let pool = self.store.pool();
        let (epoch, holder, acquired_at): (i64, Option<String>, Option<DateTime<Utc>>) =
            sqlx::query_as("SELECT epoch, holder, acquired_at FROM instance_lease WHERE id = 1")
                .fetch_one(pool)
                .await?;
        // Held = an unexpired lease renewed by a live session (the lease of store/lease.rs).
        let held: bool = sqlx::query_scalar(
            "SELECT COALESCE(holder IS NOT NULL AND backend_pid IS NOT NULL \
                    AND expires_at > clock_timestamp() \
                    AND EXISTS (SELECT 1 FROM pg_stat_activity a \
                                WHERE a.pid = instance_lease.backend_pid), false) \
             FROM instance_lease WHERE id = 1",
        )
        .fetch_one(pool)
        .await?;
        Ok(LeaseStatus {
            holder,
            epoch,
            acquired_at,
            held,
        })
    }
}
