//! Bounded, read-only inbox scans for the seed's procedures (§5.3 survey, §6 purge readiness):
//! per row only the id, the receive time, the mark, and for the survey the `META` header —
//! cut out in MySQL (`SUBSTRING_INDEX(LEFT(msg, META_BYTES), '</META>', 1)`), so at most
//! [`META_BYTES`] bytes of a message cross the wire, never the body.

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::{time, Inbox, InboxError};

/// Ids per statement in the id-list lookups.
const IDS_PER_STATEMENT: usize = 1000;

/// Most bytes of a message read for its `META` (the header is a few hundred bytes at the top).
pub const META_BYTES: u32 = 4096;

/// One row as the survey sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaRow {
    /// `CMINMSGS_ID`.
    pub id: i64,
    /// `CMINMSGS_DATE_RECEIVED` in UTC, when set and readable.
    pub received_at: Option<DateTime<Utc>>,
    /// `TYPE` from `META`, None when the header or the field is missing.
    pub msg_type: Option<String>,
    /// `STYP` from `META`, None when absent.
    pub subtype: Option<String>,
}

/// One row as purge readiness sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MarkRow {
    /// `CMINMSGS_ID`.
    pub id: i64,
    /// `CMINMSGS_DATE_RECEIVED` in UTC, when set and readable.
    pub received_at: Option<DateTime<Utc>>,
    /// The status column holds a non-blank value (see [`super::mark`]).
    pub marked: bool,
}

/// The text of `<tag>…</tag>` inside `head`, trimmed and cut to 32 characters; None when
/// absent or empty. Tolerant on purpose: the survey counts, it does not validate.
pub fn meta_field(head: &str, tag: &str) -> Option<String> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let start = head.find(&open)? + open.len();
    let len = head.get(start..)?.find(&close)?;
    let v = head.get(start..start + len)?.trim();
    (!v.is_empty()).then(|| v.chars().take(32).collect())
}

impl Inbox {
    fn received(&self, raw: Option<String>) -> Option<DateTime<Utc>> {
        raw.as_deref().and_then(|s| time::local_to_utc(s, self.tz))
    }

    /// Rows with `after < id <= to` (ascending, at most `limit`), with receive time and `META`
    /// fields, optionally only those received in `[from, until)` (UTC, compared in airport
    /// local time as stored).
    pub async fn meta_rows(
        &self,
        after: i64,
        to: i64,
        received: (Option<DateTime<Utc>>, Option<DateTime<Utc>>),
        limit: u32,
    ) -> Result<Vec<MetaRow>, InboxError> {
        let n = &self.names;
        let mut sql = format!(
            "SELECT {id}, CAST({recv} AS CHAR), \
                    SUBSTRING_INDEX(LEFT({m}, {META_BYTES}), '</META>', 1) \
             FROM {t} WHERE {id} > ? AND {id} <= ?",
            id = n.id,
            recv = n.received,
            m = n.message,
            t = n.table
        );
        if received.0.is_some() {
            sql.push_str(&format!(" AND {} >= ?", n.received));
        }
        if received.1.is_some() {
            sql.push_str(&format!(" AND {} < ?", n.received));
        }
        sql.push_str(&format!(" ORDER BY {} LIMIT ?", n.id));
        let mut q = sqlx::query(&sql).bind(after).bind(to);
        for t in [received.0, received.1].into_iter().flatten() {
            q = q.bind(time::utc_to_local(t, self.tz));
        }
        let rows = self.timed(q.bind(limit).fetch_all(&self.pool)).await?;
        self.to_meta(rows)
    }

    /// The same for these ids (ascending; ids without a row are left out).
    pub async fn meta_of(&self, ids: &[i64]) -> Result<Vec<MetaRow>, InboxError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let n = &self.names;
        let sql = format!(
            "SELECT {id}, CAST({recv} AS CHAR), \
                    SUBSTRING_INDEX(LEFT({m}, {META_BYTES}), '</META>', 1) \
             FROM {t} WHERE {id} IN ({list}) ORDER BY {id}",
            id = n.id,
            recv = n.received,
            m = n.message,
            t = n.table,
            list = vec!["?"; ids.len()].join(",")
        );
        let mut q = sqlx::query(&sql);
        for id in ids {
            q = q.bind(id);
        }
        let rows = self.timed(q.fetch_all(&self.pool)).await?;
        self.to_meta(rows)
    }

    fn to_meta(&self, rows: Vec<sqlx::mysql::MySqlRow>) -> Result<Vec<MetaRow>, InboxError> {
        rows.into_iter()
            .map(|row| {
                let head: Option<String> = row.try_get(2)?;
                let head = head.unwrap_or_default();
                let meta = head
                    .find("<META>")
                    .and_then(|i| head.get(i..))
                    .unwrap_or("");
                Ok(MetaRow {
                    id: row.try_get(0)?,
                    received_at: self.received(row.try_get(1)?),
                    msg_type: meta_field(meta, "TYPE"),
                    subtype: meta_field(meta, "STYP"),
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(InboxError::from)
    }

    /// Rows with `after < id <= to`, ascending, at most `limit`: id, receive time, marked.
    pub async fn mark_rows(
        &self,
        after: i64,
        to: i64,
        limit: u32,
    ) -> Result<Vec<MarkRow>, InboxError> {
        let sql = format!(
            "{} WHERE {id} > ? AND {id} <= ? ORDER BY {id} LIMIT ?",
            self.mark_select(),
            id = self.names.id
        );
        let rows = self
            .timed(
                sqlx::query(&sql)
                    .bind(after)
                    .bind(to)
                    .bind(limit)
                    .fetch_all(&self.pool),
            )
            .await?;
        self.to_mark_rows(rows)
    }

    /// The rows of these ids (ascending; ids without a row are left out): id, receive time,
    /// marked.
    pub async fn mark_rows_of(&self, ids: &[i64]) -> Result<Vec<MarkRow>, InboxError> {
        let mut found = Vec::new();
        for chunk in ids.chunks(IDS_PER_STATEMENT) {
            let sql = format!(
                "{} WHERE {id} IN ({list}) ORDER BY {id}",
                self.mark_select(),
                id = self.names.id,
                list = vec!["?"; chunk.len()].join(",")
            );
            let mut q = sqlx::query(&sql);
            for id in chunk {
                q = q.bind(id);
            }
            let rows = self.timed(q.fetch_all(&self.pool)).await?;
            found.extend(self.to_mark_rows(rows)?);
        }
        found.sort_unstable_by_key(|r| r.id);
        Ok(found)
    }

    /// The row with the highest id below `id`, if any.
    pub async fn mark_row_before(&self, id: i64) -> Result<Option<MarkRow>, InboxError> {
        let sql = format!(
            "{} WHERE {id} < ? ORDER BY {id} DESC LIMIT 1",
            self.mark_select(),
            id = self.names.id
        );
        let rows = self
            .timed(sqlx::query(&sql).bind(id).fetch_all(&self.pool))
            .await?;
        Ok(self.to_mark_rows(rows)?.pop())
    }

    /// `SELECT id, receive time, marked FROM table` (the columns [`Self::to_mark_rows`] reads).
    fn mark_select(&self) -> String {
        let n = &self.names;
        format!(
            "SELECT {id}, CAST({recv} AS CHAR), \
                    CAST(({status} IS NOT NULL AND TRIM({status}) <> '') AS SIGNED) FROM {t}",
            id = n.id,
            recv = n.received,
            status = n.status,
            t = n.table
        )
    }

    fn to_mark_rows(&self, rows: Vec<sqlx::mysql::MySqlRow>) -> Result<Vec<MarkRow>, InboxError> {
        rows.into_iter()
            .map(|row| {
                let marked: i64 = row.try_get(2)?;
                Ok(MarkRow {
                    id: row.try_get(0)?,
                    received_at: self.received(row.try_get(1)?),
                    marked: marked != 0,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(InboxError::from)
    }

    /// The highest id received before `t` (UTC; compared in airport local time), if any.
    pub async fn max_id_received_before(
        &self,
        t: DateTime<Utc>,
    ) -> Result<Option<i64>, InboxError> {
        let n = &self.names;
        let sql = format!(
            "SELECT MAX({id}) FROM {t} WHERE {recv} < ?",
            id = n.id,
            recv = n.received,
            t = n.table
        );
        let row = self
            .timed(
                sqlx::query(&sql)
                    .bind(time::utc_to_local(t, self.tz))
                    .fetch_one(&self.pool),
            )
            .await?;
        Ok(row.try_get(0)?)
    }
}

#[cfg(test)]
mod tests {
    use super::meta_field;

    #[test]
    fn reads_type_and_subtype_tolerantly() {
        let h = "<META><SNDR>A</SNDR> <TYPE> FLOP </TYPE><STYP>UPDT</STYP>";
        assert_eq!(meta_field(h, "TYPE").as_deref(), Some("FLOP"));
        assert_eq!(meta_field(h, "STYP").as_deref(), Some("UPDT"));
        assert_eq!(meta_field(h, "SEQN"), None);
        assert_eq!(meta_field("<TYPE></TYPE>", "TYPE"), None);
        assert_eq!(meta_field("<TYPE>FLOP", "TYPE"), None);
    }
}
