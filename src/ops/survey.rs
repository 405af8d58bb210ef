//! Backlog survey (seed §5.3 step 1): before the owner agrees what to skip, the operator needs
//! the id range, count, time span and TYPE/STYP distribution of a backlog. Reads only the
//! `META` of each message ([`crate::inbox::survey`]), in batches of [`SURVEY_BATCH`] ids, so
//! memory stays bounded at any backlog size; the distribution keeps at most
//! [`MAX_TYPE_KEYS`] distinct keys (the rest count as `(other)`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Ops, OpsError};
use crate::inbox::survey::MetaRow;

/// Ids per batch (one PG and one inbox statement each).
pub const SURVEY_BATCH: u32 = 2_000;
/// Most distinct TYPE/STYP pairs kept; more fall into `(other)` (garbage must not grow memory).
pub const MAX_TYPE_KEYS: usize = 256;

/// What to survey. No bounds: the unprocessed backlog (PENDING/FAILED rows plus the inbox rows
/// above W). `from_id`/`to_id`: every inbox row in that id range. `received_from`/`received_to`:
/// every inbox row received in `[from, to)`. Both: the rows of the id range received in the
/// window. A reversed id range or an empty window: nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SurveyRequest {
    /// First id (inclusive).
    #[serde(default)]
    pub from_id: Option<i64>,
    /// Last id (inclusive).
    #[serde(default)]
    pub to_id: Option<i64>,
    /// Received at or after (RFC 3339).
    #[serde(default)]
    pub received_from: Option<DateTime<Utc>>,
    /// Received before (RFC 3339).
    #[serde(default)]
    pub received_to: Option<DateTime<Utc>>,
}

/// One TYPE/STYP bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TypeCount {
    /// `TYPE`, `(none)` when the header or field is missing, `(other)` past the key cap.
    pub msg_type: String,
    /// `STYP`, empty when absent.
    pub subtype: String,
    /// Rows.
    pub count: u64,
}

/// The survey.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Survey {
    /// `backlog`, `ids` or `received`.
    pub scope: String,
    /// W when the survey started.
    pub w: i64,
    /// The lowest and highest id surveyed (None when nothing matched).
    pub first_id: Option<i64>,
    /// Highest id.
    pub last_id: Option<i64>,
    /// Inbox rows surveyed.
    pub count: u64,
    /// Of those, at or below W (in PROC_STATE, unfinished for the backlog).
    pub at_or_below_w: u64,
    /// Of those, above W (not discovered yet).
    pub above_w: u64,
    /// Backlog only: unfinished PROC_STATE rows whose inbox row is gone.
    pub missing_rows: u64,
    /// Earliest DATE_RECEIVED (UTC).
    pub received_first: Option<DateTime<Utc>>,
    /// Latest DATE_RECEIVED.
    pub received_last: Option<DateTime<Utc>>,
    /// Rows with no readable DATE_RECEIVED.
    pub received_unknown: u64,
    /// By TYPE/STYP, descending count.
    pub by_type: Vec<TypeCount>,
}

/// A progress report (rows so far, the id reached).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Rows surveyed so far.
    pub rows: u64,
    /// The highest id read so far.
    pub at_id: i64,
    /// The end of the range.
    pub to_id: i64,
}

#[derive(Default)]
struct Tally {
    first: Option<i64>,
    last: Option<i64>,
    count: u64,
    below: u64,
    above: u64,
    missing: u64,
    recv_first: Option<DateTime<Utc>>,
    recv_last: Option<DateTime<Utc>>,
    recv_unknown: u64,
    types: TypeMix,
}

/// A TYPE/STYP distribution that keeps at most [`MAX_TYPE_KEYS`] keys.
#[derive(Debug, Default)]
pub(super) struct TypeMix(BTreeMap<(String, String), u64>);

impl TypeMix {
    /// Counts one row.
    pub(super) fn add(&mut self, r: &MetaRow) {
        let mut key = (
            r.msg_type.clone().unwrap_or_else(|| "(none)".into()),
            r.subtype.clone().unwrap_or_default(),
        );
        if !self.0.contains_key(&key) && self.0.len() >= MAX_TYPE_KEYS {
            key = ("(other)".into(), String::new());
        }
        *self.0.entry(key).or_insert(0) += 1;
    }

    /// By descending count.
    pub(super) fn finish(self) -> Vec<TypeCount> {
        let mut by_type: Vec<TypeCount> = self
            .0
            .into_iter()
            .map(|((msg_type, subtype), count)| TypeCount {
                msg_type,
                subtype,
                count,
            })
            .collect();
        by_type.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then_with(|| a.msg_type.cmp(&b.msg_type))
        });
        by_type
    }
}

impl Tally {
    fn add(&mut self, r: &MetaRow, w: i64) {
        self.first = Some(self.first.map_or(r.id, |f| f.min(r.id)));
        self.last = Some(self.last.map_or(r.id, |l| l.max(r.id)));
        self.count += 1;
        if r.id <= w {
            self.below += 1;
        } else {
            self.above += 1;
        }
        match r.received_at {
            Some(t) => {
                self.recv_first = Some(self.recv_first.map_or(t, |f| f.min(t)));
                self.recv_last = Some(self.recv_last.map_or(t, |l| l.max(t)));
            }
            None => self.recv_unknown += 1,
        }
        self.types.add(r);
    }

    /// Counts one batch of rows and says how far the survey got: `at_id` of `to_id`.
    fn add_batch(
        &mut self,
        rows: &[MetaRow],
        w: i64,
        (at_id, to_id): (i64, i64),
        progress: &mut (dyn FnMut(Progress) + Send),
    ) {
        for r in rows {
            self.add(r, w);
        }
        progress(Progress {
            rows: self.count,
            at_id,
            to_id,
        });
    }

    fn finish(self, scope: &str, w: i64) -> Survey {
        let by_type = self.types.finish();
        Survey {
            scope: scope.into(),
            w,
            first_id: self.first,
            last_id: self.last,
            count: self.count,
            at_or_below_w: self.below,
            above_w: self.above,
            missing_rows: self.missing,
            received_first: self.recv_first,
            received_last: self.recv_last,
            received_unknown: self.recv_unknown,
            by_type,
        }
    }
}

impl Ops {
    /// [`Ops::survey_with_progress`] without progress reports.
    pub async fn survey(&self, req: &SurveyRequest) -> Result<Survey, OpsError> {
        self.survey_with_progress(req, &mut |_| {}).await
    }

    /// Surveys (see [`SurveyRequest`]), calling `progress` after every batch.
    pub async fn survey_with_progress(
        &self,
        req: &SurveyRequest,
        progress: &mut (dyn FnMut(Progress) + Send),
    ) -> Result<Survey, OpsError> {
        // Every well-formed request has a meaning (docs/openapi.json cannot compare two
        // fields): ids and a receive window together survey the rows of the range received in
        // the window; a reversed id range or an empty window surveys nothing.
        let by_ids = req.from_id.is_some() || req.to_id.is_some();
        let by_time = req.received_from.is_some() || req.received_to.is_some();
        let empty_window =
            matches!((req.received_from, req.received_to), (Some(f), Some(t)) if f >= t);
        let w = self.store.read_cursor().await?.cursor.w;
        let inbox_max = self.inbox.max_id().await?.unwrap_or(0);
        let mut tally = Tally::default();
        if !by_ids && !by_time {
            self.survey_unfinished(w, inbox_max, &mut tally, progress)
                .await?;
            self.survey_range(w, inbox_max, (None, None), w, &mut tally, progress)
                .await?;
            return Ok(tally.finish("backlog", w));
        }
        let from = req.from_id.unwrap_or(1).max(1);
        let to = match empty_window {
            true => 0,
            false => req.to_id.unwrap_or(inbox_max).min(inbox_max),
        };
        let window = (req.received_from, req.received_to);
        self.survey_range(from - 1, to, window, w, &mut tally, progress)
            .await?;
        Ok(tally.finish(if by_ids { "ids" } else { "received" }, w))
    }

    /// The unfinished PROC_STATE rows at or below W (keyset batches on the head index).
    async fn survey_unfinished(
        &self,
        w: i64,
        to: i64,
        tally: &mut Tally,
        progress: &mut (dyn FnMut(Progress) + Send),
    ) -> Result<(), OpsError> {
        let mut after = 0i64;
        loop {
            let ids: Vec<i64> = sqlx::query_scalar(
                "SELECT msg_id FROM proc_state WHERE state IN ('PENDING', 'FAILED') \
                   AND msg_id > $1 AND msg_id <= $2 ORDER BY msg_id LIMIT $3",
            )
            .bind(after)
            .bind(w)
            .bind(i64::from(SURVEY_BATCH))
            .fetch_all(self.store.pool())
            .await?;
            let Some(&last) = ids.last() else {
                return Ok(());
            };
            let rows = self.inbox.meta_of(&ids).await?;
            tally.missing += (ids.len() - rows.len()) as u64;
            tally.add_batch(&rows, w, (last, to), progress);
            after = last;
        }
    }

    /// Every inbox row in `(after, to]` (and the receive window), in batches.
    async fn survey_range(
        &self,
        mut after: i64,
        to: i64,
        window: (Option<DateTime<Utc>>, Option<DateTime<Utc>>),
        w: i64,
        tally: &mut Tally,
        progress: &mut (dyn FnMut(Progress) + Send),
    ) -> Result<(), OpsError> {
        while after < to {
            // An id window per batch: a receive filter matching few rows still moves on.
            let until = to.min(after.saturating_add(i64::from(SURVEY_BATCH)));
            let rows = self
                .inbox
                .meta_rows(after, until, window, SURVEY_BATCH)
                .await?;
            tally.add_batch(&rows, w, (until, to), progress);
            after = until;
        }
        Ok(())
    }
}

impl Survey {
    /// For people.
    pub fn render(&self) -> String {
        let t = |v: Option<DateTime<Utc>>| v.map(|t| t.to_rfc3339()).unwrap_or_else(|| "-".into());
        let mut out = format!(
            "survey ({}) W={}\nids: {}..{}  rows: {} ({} at or below W, {} above W)\n",
            self.scope,
            self.w,
            self.first_id.map_or("-".into(), |v| v.to_string()),
            self.last_id.map_or("-".into(), |v| v.to_string()),
            self.count,
            self.at_or_below_w,
            self.above_w
        );
        if self.missing_rows > 0 {
            out.push_str(&format!(
                "unfinished rows whose inbox row is gone: {}\n",
                self.missing_rows
            ));
        }
        out.push_str(&format!(
            "received: {} .. {}  (unknown: {})\nby TYPE/STYP:\n",
            t(self.received_first),
            t(self.received_last),
            self.received_unknown
        ));
        for b in &self.by_type {
            out.push_str(&format!(
                "  {:<8} {:<6} {}\n",
                b.msg_type,
                if b.subtype.is_empty() {
                    "-"
                } else {
                    &b.subtype
                },
                b.count
            ));
        }
        out
    }
}
