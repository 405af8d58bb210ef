//! The late detector's and the compensation scan's inbox questions: which rows exist now
//! inside these id ranges? Ids only, never the message text.

use std::time::Duration;

use sqlx::Row;

use crate::inbox::names::InboxNames;
use crate::inbox::{Inbox, InboxError};

impl Inbox {
    /// Up to `limit` ids above `after` that have a committed row inside one of `ranges`
    /// (inclusive, ascending): ONE statement `SELECT id … WHERE id > ? AND (id BETWEEN ? AND ?
    /// OR …) ORDER BY id LIMIT ?` — primary-key range scans, cheap whatever the ranges span.
    /// Within `timeout`. An error is an infrastructure failure, never "absent".
    pub async fn ids_in_ranges(
        &self,
        names: &InboxNames,
        ranges: &[(i64, i64)],
        after: i64,
        limit: u32,
        timeout: Duration,
    ) -> Result<Vec<i64>, InboxError> {
        if ranges.is_empty() {
            return Ok(Vec::new());
        }
        let between = vec![format!("{} BETWEEN ? AND ?", names.id); ranges.len()].join(" OR ");
        let sql = format!(
            "SELECT {id} FROM {t} WHERE {id} > ? AND ({between}) ORDER BY {id} LIMIT ?",
            id = names.id,
            t = names.table
        );
        let mut query = sqlx::query(&sql).bind(after);
        for (first, last) in ranges {
            query = query.bind(first).bind(last);
        }
        query = query.bind(i64::from(limit));
        let rows = match tokio::time::timeout(timeout, query.fetch_all(self.pool())).await {
            Ok(rows) => rows?,
            Err(_) => return Err(InboxError::Timeout(timeout)),
        };
        rows.iter()
            .map(|row| row.try_get::<i64, _>(0))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(InboxError::from)
    }
}
