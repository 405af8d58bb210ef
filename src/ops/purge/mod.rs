//! Purge readiness (seed §6): the DB owner purges inbox rows up to a boundary; our duty is that
//! the boundary is explicit and that no row inside it is one we still need. For a range (ids up
//! to `to_id`, or rows received before a time) this walks the inbox in batches of
//! [`PURGE_BATCH`] rows (id, receive time, mark only), judges every row by the purge rule
//! ([`rule`]: marked AND our record terminal and confirmed, or marked skipped cutover stock)
//! and names the reason of every row that holds the purge. The purge boundary is the highest
//! id (and its DATE_RECEIVED) at or below which every inbox row is purgeable by that rule;
//! Ids without a row are judged too ([`ids`]): the boundary never passes an id where a row may
//! still commit (a watched released hole, an open hole, anything above W).
//! [`BoundaryWatch`] keeps it current for the `msgx_purge_boundary_id` gauge.

mod boundary;
mod ids;
mod rule;

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Ops, OpsError};
use crate::inbox::survey::MarkRow;
pub use boundary::{Advance, BoundaryWatch, BOUNDARY_MAX_ROWS, PULL_DOWN_MAX_IDS};
use ids::IdHolds;
pub use ids::ID_REASONS;
use rule::{Rule, Verdict};
pub use rule::{MARKED_REASONS, REASONS};

/// Inbox rows per batch.
pub const PURGE_BATCH: u32 = 5_000;
/// Example ids (or id ranges) kept per reason.
pub const SAMPLE_IDS: usize = 20;

/// The range: up to `to_id`, or up to `received_before`, or both (the lower of the two);
/// neither: the whole inbox.
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

/// The rows that hold the purge for one reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unmarked {
    /// One of [`REASONS`] (in `unmarked`) or [`MARKED_REASONS`] (in `marked_not_purgeable`).
    pub reason: String,
    /// Rows.
    pub count: u64,
    /// The first [`SAMPLE_IDS`] ids.
    pub sample_ids: Vec<i64>,
}

/// The ids without an inbox row that hold the purge for one reason, as ranges.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HeldIds {
    /// One of [`ID_REASONS`].
    pub reason: String,
    /// Ids.
    pub count: u64,
    /// The first [`SAMPLE_IDS`] ranges `[first, last]`.
    pub ranges: Vec<[i64; 2]>,
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
    /// Of those, purgeable by the rule (marked, and finished and confirmed by us or skipped
    /// cutover stock).
    pub purgeable: u64,
    /// True when every row in the range is purgeable: the range may be purged.
    pub ready: bool,
    /// The highest id at or below which every inbox row is purgeable (None: the first is not).
    pub boundary_id: Option<i64>,
    /// Its DATE_RECEIVED (UTC).
    pub boundary_received_at: Option<DateTime<Utc>>,
    /// Unmarked rows by reason (only reasons that occur, in the order of [`REASONS`]).
    pub unmarked: Vec<Unmarked>,
    /// Marked rows the rule does not count as purgeable, by reason (only reasons that occur,
    /// in the order of [`MARKED_REASONS`]).
    pub marked_not_purgeable: Vec<Unmarked>,
    /// Ids without an inbox row where a row may still commit, by reason (only reasons that
    /// occur, in the order of [`ID_REASONS`]).
    pub ids_without_row: Vec<HeldIds>,
    /// Rows in the range without a (readable) DATE_RECEIVED: judged like every other row; a
    /// `received_before` range takes them only by id (they lie below its last id).
    pub received_unknown: u64,
}

/// Held rows (samples: ids) or ids without a row (samples: id ranges) by reason while the
/// walk runs: a count and the first [`SAMPLE_IDS`] samples each.
#[derive(Debug)]
struct Tally<S>(BTreeMap<&'static str, (u64, Vec<S>)>);

impl<S> Default for Tally<S> {
    fn default() -> Self {
        Self(BTreeMap::new())
    }
}

impl<S> Tally<S> {
    /// The reasons of `order` that occurred, in that order, each made a report row by `row`
    /// from its reason, count and samples.
    fn into_list<T>(
        mut self,
        order: &[&'static str],
        row: impl Fn(String, u64, Vec<S>) -> T,
    ) -> Vec<T> {
        order
            .iter()
            .filter_map(|r| {
                self.0
                    .remove(r)
                    .map(|(n, samples)| row((*r).into(), n, samples))
            })
            .collect()
    }
}

impl Tally<i64> {
    fn add(&mut self, reason: &'static str, id: i64) {
        let e = self.0.entry(reason).or_default();
        e.0 += 1;
        if e.1.len() < SAMPLE_IDS {
            e.1.push(id);
        }
    }
}

impl Tally<[i64; 2]> {
    fn add_range(&mut self, reason: &'static str, first: i64, last: i64) {
        let e = self.0.entry(reason).or_default();
        e.0 += (last - first) as u64 + 1;
        let len = e.1.len();
        match e.1.last_mut() {
            // Adjacent pieces (a gap split by nothing) read as one range.
            Some(prev) if prev[1].checked_add(1) == Some(first) => prev[1] = last,
            _ if len < SAMPLE_IDS => e.1.push([first, last]),
            _ => {}
        }
    }
}

/// One readiness walk in id order: rows and the gaps between them.
#[derive(Debug)]
struct Walk {
    unmarked: Tally<i64>,
    held: Tally<i64>,
    ids: Tally<[i64; 2]>,
    /// No held row or id seen yet: the boundary still moves.
    open: bool,
}

impl Default for Walk {
    fn default() -> Self {
        Self {
            unmarked: Tally::default(),
            held: Tally::default(),
            ids: Tally::default(),
            open: true,
        }
    }
}

impl Walk {
    /// The ids `from..=to`, none with a row: each held piece closes the boundary.
    fn gap(&mut self, holds: &IdHolds, from: i64, to: i64, report: &mut PurgeReadiness) {
        for (reason, a, b) in holds.classify(from, to) {
            self.open = false;
            report.ready = false;
            self.ids.add_range(reason, a, b);
        }
    }

    /// One row and its verdict.
    fn row(&mut self, r: &MarkRow, v: Verdict, report: &mut PurgeReadiness) {
        report.rows += 1;
        report.marked += u64::from(r.marked);
        report.received_unknown += u64::from(r.received_at.is_none());
        match v {
            Verdict::Purgeable => {
                report.purgeable += 1;
                if self.open {
                    report.boundary_id = Some(r.id);
                    report.boundary_received_at = r.received_at;
                }
            }
            Verdict::Held(reason) => {
                self.open = false;
                report.ready = false;
                let tally = if r.marked {
                    &mut self.held
                } else {
                    &mut self.unmarked
                };
                tally.add(reason, r.id);
            }
        }
    }
}

impl Ops {
    /// Checks the range (see the module doc).
    pub async fn purge_readiness(&self, req: &PurgeRequest) -> Result<PurgeReadiness, OpsError> {
        let to = self.purge_range_end(req).await?;
        let mut report = PurgeReadiness {
            to_id: to,
            w: 0,
            rows: 0,
            marked: 0,
            purgeable: 0,
            ready: true,
            boundary_id: None,
            boundary_received_at: None,
            unmarked: Vec::new(),
            marked_not_purgeable: Vec::new(),
            ids_without_row: Vec::new(),
            received_unknown: 0,
        };
        let Some(to) = to else {
            report.w = self.store.read_cursor().await?.cursor.w;
            return Ok(report);
        };
        // W (with the open holes) first, then the ranges and the cutover record; the rule
        // judges with the same W.
        let holds = IdHolds::load(&self.store, to).await?;
        let mut rule = Rule::load(&self.store).await?;
        rule.w = holds.w;
        report.w = holds.w;
        let mut walk = Walk::default();
        let mut after = 0i64;
        loop {
            let rows = self.inbox.mark_rows(after, to, PURGE_BATCH).await?;
            if rows.is_empty() {
                break;
            }
            let verdicts = rule.judge(&self.store, &rows).await?;
            for (r, v) in rows.iter().zip(verdicts) {
                walk.gap(&holds, after + 1, r.id - 1, &mut report);
                after = r.id;
                walk.row(r, v, &mut report);
            }
        }
        walk.gap(&holds, after + 1, to, &mut report);
        let unmarked = |reason, count, sample_ids| Unmarked {
            reason,
            count,
            sample_ids,
        };
        report.unmarked = walk.unmarked.into_list(REASONS, unmarked);
        report.marked_not_purgeable = walk.held.into_list(MARKED_REASONS, unmarked);
        report.ids_without_row = walk
            .ids
            .into_list(ID_REASONS, |reason, count, ranges| HeldIds {
                reason,
                count,
                ranges,
            });
        Ok(report)
    }

    /// The last id of the requested range (None: the inbox has nothing in it).
    async fn purge_range_end(&self, req: &PurgeRequest) -> Result<Option<i64>, OpsError> {
        if let Some(t) = req.to_id.filter(|t| *t < 1) {
            return Err(OpsError::Invalid(format!("to_id {t} is below 1")));
        }
        // Both bounds: the range ends at the lower one (each alone ends a prefix of the ids).
        Ok(match (req.to_id, req.received_before) {
            (Some(t), Some(before)) => self
                .inbox
                .max_id_received_before(before)
                .await?
                .map(|r| r.min(t)),
            (Some(t), None) => Some(t),
            (None, Some(t)) => self.inbox.max_id_received_before(t).await?,
            (None, None) => self.inbox.max_id().await?,
        })
    }
}

impl PurgeReadiness {
    /// For people.
    pub fn render(&self) -> String {
        let mut out = format!(
            "purge readiness up to id {} (W={}): {} rows, {} marked, {} purgeable — {}\n",
            self.to_id.map_or("-".into(), |v| v.to_string()),
            self.w,
            self.rows,
            self.marked,
            self.purgeable,
            if self.ready { "READY" } else { "NOT READY" }
        );
        out.push_str(&format!(
            "purge boundary: {}{}\n",
            self.boundary_id
                .map_or("none (the first row is not purgeable)".into(), |v| format!(
                    "id {v}"
                )),
            self.boundary_received_at
                .map(|t| format!(" received {}", t.to_rfc3339()))
                .unwrap_or_default()
        ));
        for (title, list) in [
            ("unmarked", &self.unmarked),
            ("marked, not purgeable", &self.marked_not_purgeable),
        ] {
            if list.is_empty() {
                continue;
            }
            out.push_str(&format!("{title}:\n"));
            for u in list {
                out.push_str(&format!(
                    "  {:<30} {:>8}  e.g. {:?}\n",
                    u.reason, u.count, u.sample_ids
                ));
            }
        }
        if !self.ids_without_row.is_empty() {
            out.push_str("ids without a row where one may still commit:\n");
            for h in &self.ids_without_row {
                let ranges: Vec<String> = h
                    .ranges
                    .iter()
                    .map(|[a, b]| {
                        if a == b {
                            a.to_string()
                        } else {
                            format!("{a}-{b}")
                        }
                    })
                    .collect();
                out.push_str(&format!(
                    "  {:<30} {:>8}  e.g. [{}]\n",
                    h.reason,
                    h.count,
                    ranges.join(", ")
                ));
            }
        }
        if self.received_unknown > 0 {
            out.push_str(&format!(
                "rows without DATE_RECEIVED: {} (judged by id like the others)\n",
                self.received_unknown
            ));
        }
        out
    }
}
