//! Over the whole inbox, page by page up to its highest id: every id ≤ W is enqueued or inside
//! a watched released hole (`late_watch_range`); a mark only on a terminal row; marks only
//! with the owner's value.
//!
//! Not violations, each counted as a note: the visible stock an explicit cutover (`max`,
//! `<id>`) skipped — the previous system's rows, never ours, unmarked or marked with its own
//! value — and a row an operator replayed (audited `REPLAY`) that is pending again while its
//! inbox row still carries the mark of its first run (marks are never taken back).

use std::collections::HashMap;

use sqlx::Row;

use super::{Finding, VerifyError, VerifyInput};
use crate::cutover::CutoverStock;
use crate::rows::ProcState;
use crate::store::replay::ACTION_REPLAY;

const STOCK: &str = "skipped at cutover (previous system's stock)";
const REPLAYED: &str = "replayed, pending again, still carrying the mark of its first run";

/// What PostgreSQL knows of one inbox id.
#[derive(Debug, Clone, Default)]
struct Known {
    state: Option<ProcState>,
    watched: bool,
    replayed: bool,
}

/// One inbox row as read.
struct InboxRow {
    id: i64,
    status: Option<String>,
    dated: bool,
}

/// The three findings and what they are judged against.
struct Scan {
    covered: Finding,
    terminal: Finding,
    value: Finding,
    w: i64,
    stock: Option<CutoverStock>,
    mark_value: String,
    first: Option<i64>,
    last: Option<i64>,
}

/// `(coverage, marks_on_terminal, mark_value)`.
pub(super) async fn run(input: &VerifyInput, batch: i64) -> Result<Vec<Finding>, VerifyError> {
    let mut scan = Scan {
        covered: Finding::new(
            "inbox_covered",
            "every inbox id ≤ W is in PROC_STATE or inside a released hole (late_watch_range); \
             the stock a cutover skipped is not ours (noted)",
        ),
        terminal: Finding::new(
            "mark_only_terminal",
            "an inbox row carries a mark only when its PROC_STATE row is terminal; noted, not \
             violations: a replayed row pending again with the mark of its first run, and \
             cutover stock the previous system marked",
        ),
        value: Finding::new(
            "mark_value",
            "marks carry only the DB owner's value (backfill.mark_value); cutover stock the \
             previous system marked with its own value is noted",
        ),
        w: input.store.read_cursor().await?.cursor.w,
        stock: input.store.cutover_stock().await?,
        mark_value: input.mark_value.trim().to_string(),
        first: None,
        last: None,
    };
    let mut after = 0i64;
    loop {
        let page = read_page(input, after, batch).await?;
        let Some(last) = page.last() else { break };
        after = last.id;
        scan.first.get_or_insert(page[0].id);
        scan.last = Some(after);
        let ids: Vec<i64> = page.iter().map(|r| r.id).collect();
        let known = read_known(input, &ids).await?;
        for row in page {
            let k = known.get(&row.id).cloned().unwrap_or_default();
            scan.judge(&row, &k);
        }
    }
    scan.set_scopes();
    Ok(vec![scan.covered, scan.terminal, scan.value])
}

/// The next page of inbox rows above `after`.
async fn read_page(
    input: &VerifyInput,
    after: i64,
    batch: i64,
) -> Result<Vec<InboxRow>, VerifyError> {
    let n = &input.names;
    let sql = format!(
        "SELECT {id}, CAST({st} AS CHAR), {pr} IS NOT NULL FROM {t} WHERE {id} > ? ORDER BY {id} LIMIT ?",
        id = n.id,
        st = n.status,
        pr = n.processed,
        t = n.table
    );
    let rows = sqlx::query(&sql)
        .bind(after)
        .bind(batch)
        .fetch_all(input.inbox.pool())
        .await?;
    rows.iter()
        .map(|r| {
            Ok(InboxRow {
                id: r.try_get(0)?,
                status: r.try_get(1)?,
                dated: r.try_get::<i64, _>(2)? != 0,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(Into::into)
}

/// Our record of each id (live or archived), whether a released hole watches it, and whether
/// an audited replay named it (the GIN index on `audit_log.msg_ids` answers that).
async fn read_known(input: &VerifyInput, ids: &[i64]) -> Result<HashMap<i64, Known>, VerifyError> {
    let rows: Vec<(i64, Option<ProcState>, bool, bool)> = sqlx::query_as(
        "SELECT u.id, p.state, COALESCE((SELECT l.last_id >= u.id FROM late_watch_range l \
           WHERE l.first_id <= u.id ORDER BY l.first_id DESC LIMIT 1), false), \
           EXISTS (SELECT 1 FROM audit_log a WHERE a.action = $2 AND a.msg_ids @> ARRAY[u.id]) \
         FROM UNNEST($1::bigint[]) AS u(id) LEFT JOIN proc_state_all p ON p.msg_id = u.id",
    )
    .bind(ids)
    .bind(ACTION_REPLAY)
    .fetch_all(input.store.pool())
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, state, watched, replayed)| {
            let known = Known {
                state,
                watched,
                replayed,
            };
            (id, known)
        })
        .collect())
}

impl Scan {
    fn judge(&mut self, row: &InboxRow, k: &Known) {
        let id = row.id;
        let stock = self.stock.as_ref().is_some_and(|s| s.skips(id));
        if id <= self.w {
            self.covered.checked += 1;
            match (&k.state, k.watched) {
                (Some(_), _) => {}
                (None, _) if stock => self.covered.note(STOCK, id),
                (None, true) => self
                    .covered
                    .note("late rows still watched, not yet enqueued", id),
                (None, false) => self.covered.violation(id),
            }
        }
        let status = row.status.as_deref().map(str::trim);
        if !(row.dated || status.is_some_and(|s| !s.is_empty())) {
            return;
        }
        self.terminal.checked += 1;
        self.value.checked += 1;
        if stock {
            // The previous system's mark, on a row we never take: whatever its value.
            self.terminal.note(STOCK, id);
            if status != Some(self.mark_value.as_str()) {
                self.value.note(STOCK, id);
            }
            return;
        }
        match k.state {
            Some(s) if s.is_terminal() => {}
            Some(_) if k.replayed => self.terminal.note(REPLAYED, id),
            _ => self.terminal.violation(id),
        }
        if status != Some(self.mark_value.as_str()) {
            self.value.violation(id);
        }
    }

    /// What was read, and what the rules leave out.
    fn set_scopes(&mut self) {
        let read = match (self.first, self.last) {
            (Some(first), Some(last)) => format!("inbox ids {first}..={last} (the whole inbox)"),
            _ => "the whole inbox (empty)".to_string(),
        };
        let stock = match self
            .stock
            .as_ref()
            .and_then(|s| s.span.as_ref().map(|p| (s, p)))
        {
            Some((s, p)) => format!(
                "; excluded: {} stock rows in {}..={} skipped by cutover `{}` (not ours; its {} \
                 gap ids are holes like any other)",
                p.rows,
                p.first,
                p.last,
                s.mode,
                p.gap_ids()
            ),
            None => "; no cutover stock skipped".to_string(),
        };
        self.covered.scope = format!(
            "{read}; judged: the {} ids ≤ W={}{stock}",
            self.covered.checked, self.w
        );
        let marks = format!(
            "{read}; judged: the {} marked rows (status set or DATE_PROCESSED set){stock}",
            self.terminal.checked
        );
        self.terminal.scope = marks.clone();
        self.value.scope = marks;
    }
}
