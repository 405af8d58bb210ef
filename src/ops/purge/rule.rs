//! The purge rule (seed §6, issue 19): which inbox rows count as purgeable, read from both
//! stores. A mark alone proves nothing about our record: a replayed row keeps the mark of its
//! earlier outcome while it is PENDING again, and another writer (the legacy system during a
//! parallel run) may mark a row we have not finished. So a row counts as purgeable only when
//! it is marked AND
//!
//! - (a) our record (`proc_state_all`, live or archived) is terminal (SUCCEEDED, SKIPPED or
//!   DEAD) and confirmed (`backfill_at`: the sweep saw the mark), or
//! - (b) it has no record and is a stock row an explicit cutover skipped
//!   ([`CutoverStock::skips`]): the previous system's, never ours.
//!
//! Nothing else is "not ours": every other row is held, by a reason. A record always wins over
//! the stock rule (a stock row we hold a record for is judged by that record).

use std::collections::{HashMap, HashSet};

use crate::cutover::CutoverStock;
use crate::inbox::survey::MarkRow;
use crate::ops::OpsError;
use crate::rows::ProcState;
use crate::store::Store;

/// Reasons an UNMARKED inbox row holds the purge, in the order they are reported.
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
    "stock_unmarked",
];

/// Reasons a MARKED inbox row does not count as purgeable, in the order they are reported.
pub const MARKED_REASONS: &[&str] = &[
    "marked_pending",
    "marked_failed",
    "marked_awaiting_confirmation",
    "marked_abandoned",
    "marked_in_released_hole",
    "marked_never_enqueued",
    "marked_beyond_watermark",
];

/// Our record of one message, as the rule reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    /// `state`.
    pub state: ProcState,
    /// `backfill_at` is set: the sweep confirmed the mark.
    pub confirmed: bool,
    /// `backfill_abandon_reason`.
    pub abandoned: Option<String>,
}

/// What the rule says about one inbox row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// It may be purged.
    Purgeable,
    /// It holds the purge: one of [`REASONS`] (unmarked) or [`MARKED_REASONS`] (marked).
    Held(&'static str),
}

/// Where a row without a record lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unrecorded {
    /// Skipped cutover stock.
    Stock,
    /// Inside a released hole range (the late detector will enqueue it).
    ReleasedHole,
    /// Above W: not discovered yet.
    BeyondWatermark,
    /// At or below W, no record, no watch.
    NeverEnqueued,
}

/// The verdict for one row (pure: the reads are done by [`Rule::judge`]).
pub(crate) fn verdict(marked: bool, record: Option<&Record>, unrecorded: Unrecorded) -> Verdict {
    let held = match (record, marked) {
        (Some(r), true) => match r.state {
            ProcState::Failed => "marked_failed",
            ProcState::Pending => "marked_pending",
            _ if r.abandoned.is_some() => "marked_abandoned",
            _ if !r.confirmed => "marked_awaiting_confirmation",
            _ => return Verdict::Purgeable,
        },
        (Some(r), false) => match (r.state, r.abandoned.as_deref()) {
            (ProcState::Failed, _) => "failed",
            (ProcState::Pending, _) => "pending",
            (_, Some("MISSING_ROW")) => "abandoned_missing_row",
            (_, Some(_)) => "abandoned_max_attempts",
            _ if !r.confirmed => "awaiting_sweep",
            _ => "confirmed_mark_gone",
        },
        (None, true) => match unrecorded {
            Unrecorded::Stock => return Verdict::Purgeable,
            Unrecorded::ReleasedHole => "marked_in_released_hole",
            Unrecorded::BeyondWatermark => "marked_beyond_watermark",
            Unrecorded::NeverEnqueued => "marked_never_enqueued",
        },
        (None, false) => match unrecorded {
            Unrecorded::Stock => "stock_unmarked",
            Unrecorded::ReleasedHole => "released_hole",
            Unrecorded::BeyondWatermark => "beyond_watermark",
            Unrecorded::NeverEnqueued => "never_enqueued",
        },
    };
    Verdict::Held(held)
}

/// What the rule needs besides the rows: W and the cutover record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rule {
    /// W when the rule was loaded.
    pub w: i64,
    /// The cutover record (None: never seeded).
    pub stock: Option<CutoverStock>,
}

type RecordRow = (i64, ProcState, bool, Option<String>);

impl Rule {
    /// Reads W and the cutover record.
    pub(crate) async fn load(store: &Store) -> Result<Self, OpsError> {
        Ok(Self {
            w: store.read_cursor().await?.cursor.w,
            stock: store.cutover_stock().await?,
        })
    }

    /// The verdict for each row of one batch (same order; a run of inbox rows as
    /// `Inbox::mark_rows` reads them): one range lookup of the batch's records, live or
    /// archived, and one of the released holes for rows without a record.
    pub(crate) async fn judge(
        &self,
        store: &Store,
        rows: &[MarkRow],
    ) -> Result<Vec<Verdict>, OpsError> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
        let (lo, hi) = (ids.iter().min(), ids.iter().max());
        let records: Vec<RecordRow> = sqlx::query_as(
            // Archived rows (migration 0014) keep their state and reason. The batch is a run of
            // consecutive inbox rows: one range scan per table, not one index probe per id
            // (5,000 probes touched 47× the pages), and records in the range that are not in
            // the batch are simply not asked for below.
            "SELECT msg_id, state, backfill_at IS NOT NULL, backfill_abandon_reason \
             FROM proc_state_all WHERE msg_id BETWEEN $1 AND $2",
        )
        .bind(lo)
        .bind(hi)
        .fetch_all(store.pool())
        .await?;
        let records: HashMap<i64, Record> = records
            .into_iter()
            .map(|(id, state, confirmed, abandoned)| {
                (
                    id,
                    Record {
                        state,
                        confirmed,
                        abandoned,
                    },
                )
            })
            .collect();
        let skips = |id: i64| self.stock.as_ref().is_some_and(|s| s.skips(id));
        let ask: Vec<i64> = ids
            .iter()
            .copied()
            .filter(|id| !records.contains_key(id) && !skips(*id))
            .collect();
        let holes: HashSet<i64> = if ask.is_empty() {
            HashSet::new()
        } else {
            store.late_watch_covering(&ask).await?.into_iter().collect()
        };
        Ok(rows
            .iter()
            .map(|r| {
                let unrecorded = match r.id {
                    id if skips(id) => Unrecorded::Stock,
                    id if holes.contains(&id) => Unrecorded::ReleasedHole,
                    id if id > self.w => Unrecorded::BeyondWatermark,
                    _ => Unrecorded::NeverEnqueued,
                };
                verdict(r.marked, records.get(&r.id), unrecorded)
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(state: &str, confirmed: bool, abandoned: Option<&str>) -> Record {
        Record {
            state: ProcState::try_from(state).expect("state"),
            confirmed,
            abandoned: abandoned.map(Into::into),
        }
    }

    #[test]
    fn only_a_finished_confirmed_record_or_skipped_stock_is_purgeable() {
        use Unrecorded::*;
        let done = rec("SUCCEEDED", true, None);
        for s in ["SUCCEEDED", "SKIPPED", "DEAD"] {
            let r = rec(s, true, None);
            assert_eq!(verdict(true, Some(&r), NeverEnqueued), Verdict::Purgeable);
        }
        assert_eq!(verdict(true, None, Stock), Verdict::Purgeable);
        // A record wins over the stock rule.
        let pending = rec("PENDING", false, None);
        assert_eq!(
            verdict(true, Some(&pending), Stock),
            Verdict::Held("marked_pending")
        );
        let cases: Vec<(bool, Option<Record>, Unrecorded, &str)> = vec![
            (
                true,
                Some(rec("FAILED", false, None)),
                NeverEnqueued,
                "marked_failed",
            ),
            (
                true,
                Some(rec("DEAD", false, None)),
                NeverEnqueued,
                "marked_awaiting_confirmation",
            ),
            (
                true,
                Some(rec("DEAD", false, Some("MAX_ATTEMPTS"))),
                NeverEnqueued,
                "marked_abandoned",
            ),
            (true, None, ReleasedHole, "marked_in_released_hole"),
            (true, None, BeyondWatermark, "marked_beyond_watermark"),
            (true, None, NeverEnqueued, "marked_never_enqueued"),
            (false, Some(pending.clone()), Stock, "pending"),
            (
                false,
                Some(rec("FAILED", false, None)),
                NeverEnqueued,
                "failed",
            ),
            (
                false,
                Some(rec("SKIPPED", false, None)),
                NeverEnqueued,
                "awaiting_sweep",
            ),
            (
                false,
                Some(rec("DEAD", false, Some("MISSING_ROW"))),
                NeverEnqueued,
                "abandoned_missing_row",
            ),
            (
                false,
                Some(rec("DEAD", false, Some("MAX_ATTEMPTS"))),
                NeverEnqueued,
                "abandoned_max_attempts",
            ),
            (false, Some(done), NeverEnqueued, "confirmed_mark_gone"),
            (false, None, Stock, "stock_unmarked"),
            (false, None, ReleasedHole, "released_hole"),
            (false, None, BeyondWatermark, "beyond_watermark"),
            (false, None, NeverEnqueued, "never_enqueued"),
        ];
        for (marked, record, unrecorded, want) in cases {
            let got = verdict(marked, record.as_ref(), unrecorded);
            assert_eq!(
                got,
                Verdict::Held(want),
                "{marked} {record:?} {unrecorded:?}"
            );
            let list = if marked { MARKED_REASONS } else { REASONS };
            assert!(list.contains(&want), "{want} is listed");
        }
    }
}
