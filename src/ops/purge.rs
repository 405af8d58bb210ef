//! Purge readiness (seed §6): the DB owner purges inbox rows up to a boundary; our duty is that
//! the boundary is explicit and that no row inside it is unmarked. For a range (ids up to
//! `to_id`, or rows received before a time) this walks the inbox in batches of
//! [`PURGE_BATCH`] rows (id, receive time, mark only), looks every unmarked row up in
//! PROC_STATE and the released-hole ranges, and names its reason. The purge boundary is the
//! highest id (and its DATE_RECEIVED) at or below which every inbox row is marked.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Ops, OpsError};

/// Inbox rows per batch.
pub const PURGE_BATCH: u32 = 5_000;
/// Example ids kept per reason.
pub const SAMPLE_IDS: usize = 20;

/// The reasons an inbox row is not marked, in the order they are reported.
pub const REASONS: &[&str] = &[
    "pending",
    "failed",
    "awaiting_sweep",
    "abandoned_missing_row",
    "abandoned_max_attempts",
    "confirmed_mark_gone",
    "released_hole",
    "never_enqueued",
    "beyond_watermark",
];

/// The range: `to_id`, or `received_before`; neither: the whole inbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PurgeRequest {
    /// Up to this id (inclusive).
    #[serde(default)]
    pub to_id: Option<i64>,
    /// Up to the highest id received before this time (RFC 3339).
    #[serde(default)]
    pub received_before: Option<DateTime<Utc>>,
}

/// Unmarked rows of one reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unmarked {
    /// One of [`REASONS`].
    pub reason: String,
    /// Rows.
    pub count: u64,
    /// The first [`SAMPLE_IDS`] ids.
    pub sample_ids: Vec<i64>,
}

/// The report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PurgeReadiness {
    /// The end of the range checked (None: the inbox had nothing in range).
    pub to_id: Option<i64>,
    /// W when the check started.
    pub w: i64,
    /// Inbox rows checked.
    pub rows: u64,
    /// Of those, marked.
    pub marked: u64,
    /// True when every row in the range is marked: the range may be purged.
    pub ready: bool,
    /// The highest id at or below which every inbox row is marked (None: the first is not).
    pub boundary_id: Option<i64>,
    /// Its DATE_RECEIVED (UTC).
    pub boundary_received_at: Option<DateTime<Utc>>,
    /// Unmarked rows by reason (only reasons that occur).
    pub unmarked: Vec<Unmarked>,
}

type StateRow = (i64, String, Option<DateTime<Utc>>, Option<String>);

fn reason_of(state: Option<&StateRow>, in_hole: bool, id: i64, w: i64) -> &'static str {
    match state {
        Some((_, s, _, _)) if s == "PENDING" => "pending",
        Some((_, s, _, _)) if s == "FAILED" => "failed",
        Some((_, _, _, Some(a))) if a == "MISSING_ROW" => "abandoned_missing_row",
        Some((_, _, _, Some(_))) => "abandoned_max_attempts",
        Some((_, _, None, None)) => "awaiting_sweep",
        Some((_, _, Some(_), None)) => "confirmed_mark_gone",
        None if in_hole => "released_hole",
        None if id > w => "beyond_watermark",
        None => "never_enqueued",
    }
}

impl Ops {
    /// Checks the range (see the module doc).
    pub async fn purge_readiness(&self, req: &PurgeRequest) -> Result<PurgeReadiness, OpsError> {
        let to = match (req.to_id, req.received_before) {
            (Some(_), Some(_)) => {
                return Err(OpsError::Invalid(
                    "give to_id or received_before, not both".into(),
                ))
            }
            (Some(t), None) if t < 1 => {
                return Err(OpsError::Invalid(format!("to_id {t} is below 1")))
            }
            (Some(t), None) => Some(t),
            (None, Some(t)) => self.inbox.max_id_received_before(t).await?,
            (None, None) => self.inbox.max_id().await?,
        };
        let w = self.store.read_cursor().await?.cursor.w;
        let mut report = PurgeReadiness {
            to_id: to,
            w,
            rows: 0,
            marked: 0,
            ready: true,
            boundary_id: None,
            boundary_received_at: None,
            unmarked: Vec::new(),
        };
        let Some(to) = to else {
            return Ok(report);
        };
        let mut by_reason: BTreeMap<&'static str, (u64, Vec<i64>)> = BTreeMap::new();
        let mut boundary_open = true;
        let mut after = 0i64;
        loop {
            let rows = self.inbox.mark_rows(after, to, PURGE_BATCH).await?;
            let Some(last) = rows.last() else { break };
            after = last.id;
            let unmarked: Vec<i64> = rows.iter().filter(|r| !r.marked).map(|r| r.id).collect();
            let (states, holes) = if unmarked.is_empty() {
                (Vec::new(), Vec::new())
            } else {
                let states: Vec<StateRow> = sqlx::query_as(
                    // Archived rows (migration 0014) keep their reason: an abandoned row past the
                    // grace is still "abandoned", never "never enqueued".
                    "SELECT msg_id, state, backfill_at, backfill_abandon_reason FROM proc_state_all \
                     WHERE msg_id = ANY($1)",
                )
                .bind(&unmarked)
                .fetch_all(self.store.pool())
                .await?;
                (states, self.store.late_watch_covering(&unmarked).await?)
            };
            let states: BTreeMap<i64, StateRow> = states.into_iter().map(|s| (s.0, s)).collect();
            for r in &rows {
                report.rows += 1;
                if r.marked {
                    report.marked += 1;
                    if boundary_open {
                        report.boundary_id = Some(r.id);
                        report.boundary_received_at = r.received_at;
                    }
                    continue;
                }
                boundary_open = false;
                report.ready = false;
                let reason = reason_of(states.get(&r.id), holes.contains(&r.id), r.id, w);
                let e = by_reason.entry(reason).or_default();
                e.0 += 1;
                if e.1.len() < SAMPLE_IDS {
                    e.1.push(r.id);
                }
            }
        }
        report.unmarked = REASONS
            .iter()
            .filter_map(|r| {
                by_reason.remove(r).map(|(count, sample_ids)| Unmarked {
                    reason: (*r).into(),
                    count,
                    sample_ids,
                })
            })
            .collect();
        Ok(report)
    }
}

impl PurgeReadiness {
    /// For people.
    pub fn render(&self) -> String {
        let mut out = format!(
            "purge readiness up to id {} (W={}): {} rows, {} marked — {}\n",
            self.to_id.map_or("-".into(), |v| v.to_string()),
            self.w,
            self.rows,
            self.marked,
            if self.ready { "READY" } else { "NOT READY" }
        );
        out.push_str(&format!(
            "purge boundary: {}{}\n",
            self.boundary_id
                .map_or("none (the first row is unmarked)".into(), |v| format!(
                    "id {v}"
                )),
            self.boundary_received_at
                .map(|t| format!(" received {}", t.to_rfc3339()))
                .unwrap_or_default()
        ));
        for u in &self.unmarked {
            out.push_str(&format!(
                "  {:<24} {:>8}  e.g. {:?}\n",
                u.reason, u.count, u.sample_ids
            ));
        }
        out
    }
}

/// Most inbox rows one [`BoundaryWatch::advance`] reads (a first run over a long marked
/// history catches up over several calls).
pub const BOUNDARY_MAX_ROWS: u64 = 500_000;

/// The purge boundary, kept up to date incrementally for the `msgx_purge_boundary_id` gauge:
/// each call reads on from the last boundary until the first unmarked row (marks are never
/// revoked by us, so the boundary only moves up; a restart starts again from the first row).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BoundaryWatch {
    /// The boundary found so far: id and DATE_RECEIVED.
    pub boundary: Option<(i64, Option<DateTime<Utc>>)>,
}

/// What one advance found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Advance {
    /// Rows read.
    pub rows: u64,
    /// True when it stopped at an unmarked row or the inbox end (false: the row cap).
    pub caught_up: bool,
}

impl BoundaryWatch {
    /// Reads on from the boundary (at most `max_rows` rows) and publishes the gauges.
    pub async fn advance(
        &mut self,
        inbox: &crate::inbox::Inbox,
        max_rows: u64,
    ) -> Result<Advance, OpsError> {
        let mut read = 0u64;
        let caught_up = 'scan: loop {
            if read >= max_rows {
                break false;
            }
            let after = self.boundary.map_or(0, |b| b.0);
            let rows = inbox.mark_rows(after, i64::MAX, PURGE_BATCH).await?;
            if rows.is_empty() {
                break true;
            }
            for r in &rows {
                read += 1;
                if !r.marked {
                    break 'scan true;
                }
                self.boundary = Some((r.id, r.received_at));
            }
        };
        if let Some((id, at)) = self.boundary {
            crate::telemetry::purge_boundary(id, at);
        }
        Ok(Advance {
            rows: read,
            caught_up,
        })
    }
}
