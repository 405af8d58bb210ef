//! Over PROC_STATE, page by page: the inbox row exists (or the row was abandoned MISSING_ROW,
//! or the DB owner purged it after we confirmed its mark: seed §6 purges marked rows and our
//! record outlives them until retention archives it);
//! `processed_seq` follows `msg_id` (LATE rows and rows an operator acted on are listed, not
//! violations); terminal rows are marked or pending marking with a reason, and a row recorded
//! as marked carries the mark in the inbox.

use std::collections::{HashMap, HashSet};

use sqlx::Row;

use super::{Finding, VerifyError, VerifyInput};
use crate::backfill::MissingKind;
use crate::rows::{AbandonReason, ProcState, Source};

/// `(msg_id, state, source, processed_seq, confirmed (backfill_at set), intent
/// (backfill_next_at set), abandon reason, last backfill error set)`.
type StateRow = (
    i64,
    ProcState,
    Source,
    Option<i64>,
    bool,
    bool,
    Option<AbandonReason>,
    bool,
);

/// The inbox row exists, or the record says why it may not. A row discovery read (or the pump
/// applied) that was purged before we marked it (`purged_before_mark`) is a violation: the
/// seed's red line (§6, marks before purge) — unless an operator replayed it (audited
/// `REPLAY`): a replay takes its own raw copy, so the purge lost nothing.
fn judge_present(f: &mut Finding, r: &StateRow, in_inbox: bool, replayed: &HashSet<i64>) {
    let (id, state, is_marked, abandon) = (r.0, r.1, r.4, r.6);
    f.checked += 1;
    if in_inbox {
        return;
    }
    if abandon == Some(AbandonReason::MissingRow) {
        match MissingKind::of(r.2, state) {
            MissingKind::NeverSeen => f.note("abandoned MISSING_ROW (never_seen)", id),
            MissingKind::PurgedBeforeMark if replayed.contains(&id) => {
                f.note("replayed, then purged (processed from our raw copy)", id)
            }
            MissingKind::PurgedBeforeMark => f.violation(id),
        }
    } else if is_marked && state.is_terminal() {
        // Our mark was written and confirmed; only the DB owner deletes inbox rows.
        f.note("purged after the mark was confirmed", id);
    } else {
        f.violation(id);
    }
}

/// `processed_seq` ascends with `msg_id` among rows processed in discovery order.
fn judge_fifo(
    f: &mut Finding,
    r: &StateRow,
    operated: &HashSet<i64>,
    last_seq: &mut Option<(i64, i64)>,
) {
    let (id, source) = (r.0, r.2);
    let Some(seq) = r.3 else { return };
    f.checked += 1;
    if source.is_late() {
        f.note("LATE rows", id);
    } else if operated.contains(&id) {
        f.note("rows an operator replayed", id);
    } else {
        if last_seq.is_some_and(|(_, prev)| seq <= prev) {
            f.violation(id);
        }
        *last_seq = Some((id, seq));
    }
}

/// A terminal row is marked (and the inbox carries our mark), or pending marking with a reason.
fn judge_marked(f: &mut Finding, r: &StateRow, row: Option<&Option<String>>, mark_value: &str) {
    let (id, is_marked, intent, abandon, errored) = (r.0, r.4, r.5, r.6, r.7);
    if !r.1.is_terminal() {
        return;
    }
    f.checked += 1;
    if is_marked {
        let mark = row.cloned().flatten();
        if row.is_some() && mark.as_deref().map(str::trim) != Some(mark_value.trim()) {
            // Recorded as marked, but the inbox row does not carry our mark.
            f.violation(id);
        }
    } else if let Some(reason) = abandon {
        let what = match reason {
            AbandonReason::MissingRow => "abandoned MISSING_ROW",
            AbandonReason::MaxAttempts => "abandoned MAX_ATTEMPTS",
        };
        f.note(what, id);
    } else if intent || errored {
        f.note("pending marking", id);
    } else {
        f.violation(id);
    }
}

/// `(inbox_row_present, fifo, terminal_marked)`.
pub(super) async fn run(input: &VerifyInput, batch: i64) -> Result<Vec<Finding>, VerifyError> {
    let mut present = Finding::new(
        "inbox_row_present",
        "every PROC_STATE row has its inbox row, or was purged after its mark was confirmed, or \
         is abandoned MISSING_ROW for a row we never read; a row read and purged before its \
         mark (purged_before_mark) is a violation unless an operator replayed it",
    );
    let mut fifo = Finding::new(
        "fifo",
        "processed_seq ascends with msg_id, except LATE rows (listed)",
    );
    let mut marked = Finding::new(
        "terminal_marked",
        "terminal rows are marked in the inbox, or pending marking with a reason",
    );
    // Rows an operator acted on (replay, recovery) were processed again, out of order on purpose.
    let operated = audited_ids(input, None).await?;
    let replayed = audited_ids(input, Some(crate::store::replay::ACTION_REPLAY)).await?;
    let mut after = i64::MIN;
    let mut last_seq: Option<(i64, i64)> = None;
    loop {
        let rows: Vec<StateRow> = sqlx::query_as(
            "SELECT msg_id, state, source, processed_seq, backfill_at IS NOT NULL, \
                    backfill_next_at IS NOT NULL, backfill_abandon_reason, \
                    backfill_error IS NOT NULL \
             FROM proc_state WHERE msg_id > $1 ORDER BY msg_id LIMIT $2",
        )
        .bind(after)
        .bind(batch)
        .fetch_all(input.store.pool())
        .await?;
        let Some(last) = rows.last() else { break };
        after = last.0;
        let inbox = inbox_marks(input, &rows).await?;
        for r in rows {
            let row = inbox.get(&r.0);
            judge_present(&mut present, &r, row.is_some(), &replayed);
            judge_fifo(&mut fifo, &r, &operated, &mut last_seq);
            judge_marked(&mut marked, &r, row, &input.mark_value);
        }
    }
    let read = format!(
        "every live PROC_STATE row ({} rows, in pages of {batch}); archived records \
         (proc_state_hst) are finished and confirmed, not read",
        present.checked
    );
    fifo.scope = format!(
        "{read}; judged: the {} rows with a processed_seq; LATE rows and rows named by any \
         audited operator action are listed, not ordered",
        fifo.checked
    );
    marked.scope = format!("{read}; judged: the {} terminal rows", marked.checked);
    present.scope = read;
    Ok(vec![present, fifo, marked])
}

/// The ids named by audited operator actions (of one `action`, or of any).
async fn audited_ids(
    input: &VerifyInput,
    action: Option<&str>,
) -> Result<HashSet<i64>, VerifyError> {
    Ok(sqlx::query_scalar(
        "SELECT DISTINCT unnest(msg_ids) FROM audit_log WHERE $1::text IS NULL OR action = $1",
    )
    .bind(action)
    .fetch_all(input.store.pool())
    .await?
    .into_iter()
    .collect())
}

/// The inbox's status column of each of `rows` that still has its inbox row.
async fn inbox_marks(
    input: &VerifyInput,
    rows: &[StateRow],
) -> Result<HashMap<i64, Option<String>>, VerifyError> {
    let n = &input.names;
    let list = rows
        .iter()
        .map(|r| r.0.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let found = sqlx::query(&format!(
        "SELECT {id}, CAST({st} AS CHAR) FROM {t} WHERE {id} IN ({list})",
        id = n.id,
        st = n.status,
        t = n.table
    ))
    .fetch_all(input.inbox.pool())
    .await?;
    Ok(found
        .iter()
        .map(|r| Ok((r.try_get::<i64, _>(0)?, r.try_get::<Option<String>, _>(1)?)))
        .collect::<Result<_, sqlx::Error>>()?)
}
