//! `cutover plan --mode min|zero|max|<id>` (read-only): what a cutover mode would do, before
//! anyone commits to it — the W it would seed, the stock it would skip or read, and the stock
//! rows the previous system left **unmarked** (count, id ranges, TYPE mix), because skipping
//! those is the real decision. One pass over the inbox's ids and marks in pages of
//! [`PLAN_BATCH`]; the `META` header is read only for unmarked rows that would be skipped.

use serde::Serialize;

use super::survey::TypeMix;
use super::{Ops, OpsError, TypeCount};
use crate::cutover::seed::{check_head, watermark_of, SeedError};
use crate::cutover::{CutoverMode, StockScan};
use crate::telemetry::ids;

/// Inbox rows per page.
pub const PLAN_BATCH: u32 = 5_000;
/// Id ranges listed per part of the plan (the rest are counted).
pub const PLAN_RANGES: usize = 20;

/// Rows of the inbox on one side of the W a mode would seed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StockPart {
    /// Inbox rows.
    pub rows: u64,
    /// Lowest id (None: no row).
    pub first_id: Option<i64>,
    /// Highest id.
    pub last_id: Option<i64>,
    /// Of those, carrying a mark (processed by the previous system).
    pub marked: u64,
    /// Of those, carrying none.
    pub unmarked: u64,
    /// The unmarked ids as ranges: the first [`PLAN_RANGES`].
    pub unmarked_ranges: Vec<(i64, i64)>,
    /// How many ranges the unmarked ids make in all.
    pub unmarked_range_count: u64,
}

/// What a mode would do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CutoverPlan {
    /// The mode planned.
    pub mode: String,
    /// The W it would seed.
    pub w: i64,
    /// The stock token: a hash of the rows at or below W as seen now (count, highest id, id
    /// sum) — see `cutover::expect`.
    pub token: String,
    /// `"<W>:<token>"`: the value of `pipeline.cutover_expect` that makes the seeding require
    /// exactly this stock.
    pub expect: String,
    /// None: the inbox can honour the mode; otherwise why not (an `<id>` above the inbox's
    /// head): the service would refuse it too.
    pub inbox_refused: Option<String>,
    /// None: this store would accept the seeding; otherwise why it would be refused or ignored.
    pub refused: Option<String>,
    /// The inbox's stock at or below W: skipped by `max` / `<id>` (never processed by us), and
    /// empty for `min` (W below every row) and `zero`.
    pub skipped: StockPart,
    /// Ids in the skipped span with no committed row now: holes like any other after the
    /// cutover (watched; a late commit among them is processed as LATE).
    pub gap_ids: i64,
    /// Those ids as ranges (the first [`PLAN_RANGES`]).
    pub gap_ranges: Vec<(i64, i64)>,
    /// TYPE/STYP of the skipped rows the previous system left unmarked.
    pub skipped_unmarked_by_type: Vec<TypeCount>,
    /// The stock above W: read and processed by us, in id order (marked rows are processed
    /// again, and their events sent again).
    pub read: StockPart,
    /// Ids below the lowest row that the hole rule ages first (`zero` only).
    pub aged_hole_ids: i64,
}

#[derive(Default)]
struct PartTally {
    part: StockPart,
    unmarked: Vec<(i64, i64)>,
}

impl PartTally {
    fn add(&mut self, id: i64, marked: bool) {
        let p = &mut self.part;
        p.rows += 1;
        p.first_id.get_or_insert(id);
        p.last_id = Some(id);
        if marked {
            p.marked += 1;
            return;
        }
        p.unmarked += 1;
        match self.unmarked.last_mut() {
            Some(last) if last.1 + 1 == id => last.1 = id,
            _ => self.unmarked.push((id, id)),
        }
    }

    fn finish(mut self) -> StockPart {
        self.part.unmarked_range_count = self.unmarked.len() as u64;
        self.unmarked.truncate(PLAN_RANGES);
        self.part.unmarked_ranges = self.unmarked;
        self.part
    }
}

impl Ops {
    /// Plans `mode` against the inbox and the store as they are now. Changes nothing.
    pub async fn cutover_plan(&self, mode: CutoverMode) -> Result<CutoverPlan, OpsError> {
        let inbox_refused = match check_head(&self.inbox, mode).await {
            Ok(()) => None,
            Err(SeedError::Refused(why)) => Some(why),
            Err(SeedError::Inbox(e)) => return Err(e.into()),
            Err(SeedError::Store(e)) => return Err(e.into()),
        };
        let w = watermark_of(&self.inbox, mode).await?;
        let skips = matches!(mode, CutoverMode::Max | CutoverMode::Id(_));
        let top = self.inbox.max_id().await?.unwrap_or(0);
        let (mut skipped, mut read) = (PartTally::default(), PartTally::default());
        let mut scan = StockScan::default();
        // Every row at or below W, whatever the mode: the token the seeding recomputes.
        let mut below = StockScan::default();
        let mut types = TypeMix::default();
        let mut after = 0i64;
        loop {
            let rows = self.inbox.mark_rows(after, top, PLAN_BATCH).await?;
            let Some(last) = rows.last() else { break };
            after = last.id;
            let mut unmarked_skipped = Vec::new();
            for r in &rows {
                if r.id <= w {
                    below.push(r.id);
                }
                if skips && r.id <= w {
                    scan.push(r.id);
                    skipped.add(r.id, r.marked);
                    if !r.marked {
                        unmarked_skipped.push(r.id);
                    }
                } else {
                    read.add(r.id, r.marked);
                }
            }
            for m in self.inbox.meta_of(&unmarked_skipped).await? {
                types.add(&m);
            }
            if rows.len() < PLAN_BATCH as usize {
                break;
            }
        }
        let gaps = if skips {
            scan.finish(w).map(|s| s.gaps).unwrap_or_default()
        } else {
            Vec::new()
        };
        let read = read.finish();
        let token = below.token(w).to_string();
        Ok(CutoverPlan {
            mode: mode.to_string(),
            w,
            expect: format!("{w}:{token}"),
            token,
            inbox_refused,
            refused: self.seeding_refused().await?,
            skipped: skipped.finish(),
            gap_ids: gaps.iter().map(|(a, b)| b - a + 1).sum(),
            gap_ranges: gaps.into_iter().take(PLAN_RANGES).collect(),
            skipped_unmarked_by_type: types.finish(),
            aged_hole_ids: match (mode, read.first_id) {
                (CutoverMode::Zero, Some(first)) => first - 1,
                _ => 0,
            },
            read,
        })
    }

    /// Why seeding would not happen on this store now (the same conditions as the seeding
    /// statement), or None.
    async fn seeding_refused(&self) -> Result<Option<String>, OpsError> {
        let cursor = self.store.read_cursor().await?;
        if let Some(at) = cursor.seeded_at {
            return Ok(Some(format!(
                "already seeded at {} (W={}); the setting is ignored on this store",
                at.to_rfc3339(),
                cursor.cursor.w
            )));
        }
        let records = self.store.proc_state_count().await?;
        let fresh = cursor.cursor.w == 0
            && cursor.cursor.hole_since.is_none()
            && cursor.holes.is_empty()
            && records == 0;
        Ok((!fresh).then(|| {
            format!(
                "the store is not fresh (W={}, {} open holes, {records} processing records): \
                 seeding would be refused",
                cursor.cursor.w,
                cursor.holes.len()
            )
        }))
    }
}

impl CutoverPlan {
    /// For people.
    pub fn render(&self) -> String {
        let mut out = format!(
            "cutover plan: mode {} would seed W = {}\n",
            self.mode, self.w
        );
        if let Some(why) = &self.inbox_refused {
            out.push_str(&format!("  REFUSED: {why}\n"));
            return out;
        }
        out.push_str(&format!(
            "  stock token {} — to require exactly this stock at the seeding, set \
             pipeline.cutover_expect = \"{}\" (MSGX_PIPELINE__CUTOVER_EXPECT)\n",
            self.token, self.expect
        ));
        match &self.refused {
            Some(why) => out.push_str(&format!("  NOT APPLICABLE: {why}\n")),
            None => out.push_str("  this store is fresh: the seeding would be applied\n"),
        }
        let part = |name: &str, p: &StockPart| {
            let span = match (p.first_id, p.last_id) {
                (Some(a), Some(b)) => format!("ids {a}-{b}"),
                _ => "no rows".into(),
            };
            let mut s = format!(
                "  {name}: {} rows ({span}), {} marked, {} unmarked\n",
                p.rows, p.marked, p.unmarked
            );
            if p.unmarked > 0 {
                s.push_str(&format!(
                    "    unmarked ids ({} ranges): {}\n",
                    p.unmarked_range_count,
                    ids::RangeList(&p.unmarked_ranges)
                ));
            }
            s
        };
        out.push_str(&part("SKIPPED (never processed by us)", &self.skipped));
        if self.skipped.unmarked > 0 {
            out.push_str(
                "    the previous system left these unmarked: skipping them is the decision to \
                 take; by type:\n",
            );
            for t in &self.skipped_unmarked_by_type {
                out.push_str(&format!(
                    "      {:<8} {:<6} {:>8}\n",
                    t.msg_type, t.subtype, t.count
                ));
            }
        }
        if self.gap_ids > 0 {
            out.push_str(&format!(
                "  gaps in the skipped span (no row now; watched after the cutover, a late commit \
                 is processed as LATE): {} ids: {}\n",
                self.gap_ids,
                ids::RangeList(&self.gap_ranges)
            ));
        }
        out.push_str(&part("READ (processed by us, in id order)", &self.read));
        if self.read.marked > 0 {
            out.push_str(
                "    marked rows above W were processed by the previous system: they are \
                 processed again and their events sent again\n",
            );
        }
        if self.aged_hole_ids > 0 {
            out.push_str(&format!(
                "  ids 1-{} have no row: one hole, aged for pipeline.max_commit_delay before W \
                 passes it\n",
                self.aged_hole_ids
            ));
        }
        out
    }
}
