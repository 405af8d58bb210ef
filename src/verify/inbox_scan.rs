//! Over the inbox, page by page up to its highest id: every id ≤ W is enqueued or inside a
//! watched released hole (`late_watch_range`); a mark only on a terminal row; marks only with
//! the owner's value.

use std::collections::HashMap;

use sqlx::Row;

use super::{Finding, VerifyError, VerifyInput};

/// `(coverage, marks_on_terminal, mark_value)`.
pub(super) async fn run(input: &VerifyInput, batch: i64) -> Result<Vec<Finding>, VerifyError> {
    let mut covered = Finding::new(
        "inbox_covered",
        "every inbox id ≤ W is in PROC_STATE or inside a released hole (late_watch_range)",
    );
    let mut terminal = Finding::new(
        "mark_only_terminal",
        "an inbox row carries a mark only when its PROC_STATE row is terminal",
    );
    let mut value = Finding::new(
        "mark_value",
        "marks carry only the DB owner's value (backfill.mark_value)",
    );
    let w = input.store.read_cursor().await?.cursor.w;
    let n = &input.names;
    let page_sql = format!(
        "SELECT {id}, CAST({st} AS CHAR), {pr} IS NOT NULL FROM {t} WHERE {id} > ? ORDER BY {id} LIMIT ?",
        id = n.id,
        st = n.status,
        pr = n.processed,
        t = n.table
    );
    let mut after = 0i64;
    loop {
        let rows = sqlx::query(&page_sql)
            .bind(after)
            .bind(batch)
            .fetch_all(input.inbox.pool())
            .await?;
        let Some(last) = rows.last() else { break };
        after = last.try_get::<i64, _>(0)?;
        let mut page = Vec::with_capacity(rows.len());
        for r in &rows {
            let id: i64 = r.try_get(0)?;
            let status: Option<String> = r.try_get(1)?;
            let dated: bool = r.try_get::<i64, _>(2)? != 0;
            page.push((id, status, dated));
        }
        let ids: Vec<i64> = page.iter().map(|p| p.0).collect();
        let known: HashMap<i64, (Option<String>, bool)> =
            sqlx::query_as::<_, (i64, Option<String>, bool)>(
                "SELECT u.id, p.state, COALESCE((SELECT l.last_id >= u.id FROM late_watch_range l \
                   WHERE l.first_id <= u.id ORDER BY l.first_id DESC LIMIT 1), false) \
             FROM UNNEST($1::bigint[]) AS u(id) LEFT JOIN proc_state_all p ON p.msg_id = u.id",
            )
            .bind(&ids)
            .fetch_all(input.store.pool())
            .await?
            .into_iter()
            .map(|(id, state, watched)| (id, (state, watched)))
            .collect();
        for (id, status, dated) in page {
            let (state, watched) = known.get(&id).cloned().unwrap_or((None, false));
            if id <= w {
                covered.checked += 1;
                match (&state, watched) {
                    (Some(_), _) => {}
                    (None, true) => covered.note("late rows still watched, not yet enqueued", id),
                    (None, false) => covered.violation(id),
                }
            }
            let marked = dated || status.as_deref().is_some_and(|s| !s.trim().is_empty());
            if marked {
                terminal.checked += 1;
                value.checked += 1;
                let is_terminal =
                    matches!(state.as_deref(), Some("SUCCEEDED" | "SKIPPED" | "DEAD"));
                if !is_terminal {
                    terminal.violation(id);
                }
                if status.as_deref().map(str::trim) != Some(input.mark_value.trim()) {
                    value.violation(id);
                }
            }
        }
    }
    Ok(vec![covered, terminal, value])
}
