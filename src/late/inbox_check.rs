//! The late detector's inbox question: which of these ids exist now?

use std::collections::BTreeSet;
use std::time::Duration;

use sqlx::Row;

use crate::inbox::names::InboxNames;
use crate::inbox::{Inbox, InboxError};

impl Inbox {
    /// The ids among `ids` that have a committed row in the inbox now: ONE statement
    /// `SELECT id FROM <table> WHERE id IN (…)`, ids only (never the message text), within
    /// `timeout`. `names` are the configured inbox names. An error is an infrastructure
    /// failure, never "absent".
    pub async fn present_ids(
        &self,
        names: &InboxNames,
        ids: &[i64],
        timeout: Duration,
    ) -> Result<BTreeSet<i64>, InboxError> {
        if ids.is_empty() {
            return Ok(BTreeSet::new());
        }
        let placeholders = vec!["?"; ids.len()].join(",");
        let sql = format!(
            "SELECT {id} FROM {t} WHERE {id} IN ({placeholders})",
            id = names.id,
            t = names.table
        );
        let mut query = sqlx::query(&sql);
        for id in ids {
            query = query.bind(id);
        }
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
