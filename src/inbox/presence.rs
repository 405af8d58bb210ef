//! Which of some ids still have an inbox row with message text (a replay's first source,
//! issue 13 item 4): ids only, never the text.

use sqlx::Row;

use super::{Inbox, InboxError};

/// Ids per statement.
const CHUNK: usize = 1000;

impl Inbox {
    /// The ids among `ids` whose inbox row exists and holds message text, ascending.
    pub async fn ids_with_text(&self, ids: &[i64]) -> Result<Vec<i64>, InboxError> {
        let n = &self.names;
        let mut found = Vec::new();
        for chunk in ids.chunks(CHUNK) {
            let sql = format!(
                "SELECT {id} FROM {t} WHERE {m} IS NOT NULL AND LENGTH({m}) > 0 AND {id} IN ({})",
                vec!["?"; chunk.len()].join(","),
                id = n.id,
                t = n.table,
                m = n.message,
            );
            let mut query = sqlx::query(&sql);
            for id in chunk {
                query = query.bind(id);
            }
            let rows = self.timed(query.fetch_all(&self.pool)).await?;
            for row in &rows {
                found.push(row.try_get::<i64, _>(0)?);
            }
        }
        found.sort_unstable();
        found.dedup();
        Ok(found)
    }
}
