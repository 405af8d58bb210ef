//! One inbox row's metadata for operators (`msgexchange inspect`, the compat entry): whether
//! it exists, its receive time, its processed marks and the size of its message — never the
//! message text.

use sqlx::Row;

use super::{time, Inbox, InboxError};

/// What the inbox holds for one id.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RowMeta {
    /// `CMINMSGS_ID`.
    pub id: i64,
    /// `CMINMSGS_DATE_RECEIVED` as stored (airport local time), if any.
    pub received_local: Option<String>,
    /// The same in UTC (RFC 3339), when readable.
    pub received_at: Option<chrono::DateTime<chrono::Utc>>,
    /// The processed-time mark as stored (empty until the backfill marks the row).
    pub processed_local: Option<String>,
    /// The processed-status mark as stored.
    pub status: Option<String>,
    /// Bytes of the raw message (0 when empty or NULL).
    pub message_bytes: i64,
}

impl Inbox {
    /// The row's metadata, None when the inbox has no row with this id.
    pub async fn row_meta(&self, id: i64) -> Result<Option<RowMeta>, InboxError> {
        let n = &self.names;
        let sql = format!(
            "SELECT CAST({recv} AS CHAR), CAST({proc} AS CHAR), CAST({status} AS CHAR), \
                    COALESCE(LENGTH({m}), 0) FROM {t} WHERE {id} = ?",
            recv = n.received,
            proc = n.processed,
            status = n.status,
            m = n.message,
            t = n.table,
            id = n.id
        );
        let row = self
            .timed(sqlx::query(&sql).bind(id).fetch_optional(&self.pool))
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let received_local: Option<String> = row.try_get(0)?;
        let received_at = received_local
            .as_deref()
            .and_then(|s| time::local_to_utc(s, self.tz));
        Ok(Some(RowMeta {
            id,
            received_local,
            received_at,
            processed_local: row.try_get(1)?,
            status: row.try_get(2)?,
            message_bytes: row.try_get(3)?,
        }))
    }
}
