//! The processed mark: the only inbox columns we ever write (SPEC §0, seed §5.2).
//!
//! A mark is the DB owner's status value in the status column plus the processed time (airport
//! local time) in the processed column. **Empty mark** means: the status column is NULL or
//! holds only blanks (`TRIM(status) = ''`). Anything else in it — our value, a legacy value, a
//! value some other system wrote — is a mark, and it is never overwritten. The processed time
//! is written only where it is NULL (`COALESCE`), so an odd row with a blank status but a
//! processed time keeps that time.
//!
//! Both statements are batched: one existence check (`SELECT id, status … WHERE id IN (…)`)
//! and one conditional `UPDATE … WHERE id IN (…) AND <empty>` per batch — never a round trip
//! per row. The `IN` list is built per call with `?` placeholders; names come from config as
//! validated identifiers, values are always bound.

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::names::InboxNames;
use super::time::utc_to_local;
use super::{Inbox, InboxError};

/// The mark statements for one set of inbox names (built once, at start).
#[derive(Debug, Clone)]
pub struct MarkSql {
    /// `SELECT id, status FROM t WHERE id IN ` — the list is appended per call.
    check_prefix: String,
    /// `UPDATE t SET status = ?, processed = COALESCE(processed, ?) WHERE <empty> AND id IN `.
    write_prefix: String,
}

impl MarkSql {
    /// Builds the statements from validated names.
    pub fn new(n: &InboxNames) -> Self {
        Self {
            check_prefix: format!(
                "SELECT {id}, {status} FROM {t} WHERE {id} IN ",
                id = n.id,
                status = n.status,
                t = n.table
            ),
            write_prefix: format!(
                "UPDATE {t} SET {status} = ?, {proc} = COALESCE({proc}, ?) \
                 WHERE ({status} IS NULL OR TRIM({status}) = '') AND {id} IN ",
                id = n.id,
                status = n.status,
                proc = n.processed,
                t = n.table
            ),
        }
    }
}

/// The mark of one existing inbox row, as the existence check found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkState {
    /// Status NULL or blank: ours to write.
    Empty,
    /// Some value is there already (ours or anybody's): never overwritten.
    Marked(String),
}

impl MarkState {
    /// Classifies a status column value (the definition of "empty mark").
    pub fn of(status: Option<&str>) -> Self {
        match status {
            Some(s) if !s.trim().is_empty() => Self::Marked(s.to_string()),
            _ => Self::Empty,
        }
    }
}

impl InboxError {
    /// True when the failure says nothing about particular rows: the inbox is unreachable,
    /// the connection broke, or the statement timed out. A statement-level database error
    /// (a trigger, a lock wait, a constraint) may be caused by one row of a batch.
    pub fn is_connection_level(&self) -> bool {
        match self {
            Self::Timeout(_) | Self::Url { .. } => true,
            Self::Db(sqlx::Error::Database(_)) => false,
            Self::Db(_) => true,
        }
    }
}

impl Inbox {
    /// ONE existence check for a batch: the mark of every id that has a row. Ids without a row
    /// are simply absent from the answer (the caller tells "missing" from the ids it asked for).
    pub async fn mark_states(
        &self,
        sql: &MarkSql,
        ids: &[i64],
    ) -> Result<Vec<(i64, MarkState)>, InboxError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let stmt = format!("{}({})", sql.check_prefix, placeholders(ids.len()));
        let mut query = sqlx::query(&stmt);
        for id in ids {
            query = query.bind(id);
        }
        let rows = self.timed(query.fetch_all(&self.pool)).await?;
        rows.iter()
            .map(|row| {
                let id: i64 = row.try_get(0)?;
                let status: Option<String> = row.try_get(1)?;
                Ok((id, MarkState::of(status.as_deref())))
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(InboxError::from)
    }

    /// ONE conditional UPDATE for a batch: writes `value` and the processed time `at` (converted
    /// to airport local time) where the mark is still empty. Returns the rows written; a row
    /// marked meanwhile by somebody else, or gone, is not counted.
    pub async fn write_marks(
        &self,
        sql: &MarkSql,
        ids: &[i64],
        value: &str,
        at: DateTime<Utc>,
    ) -> Result<u64, InboxError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let stmt = format!("{}({})", sql.write_prefix, placeholders(ids.len()));
        let mut query = sqlx::query(&stmt)
            .bind(value)
            .bind(utc_to_local(at, self.tz));
        for id in ids {
            query = query.bind(id);
        }
        let done = self.timed(query.execute(&self.pool)).await?;
        Ok(done.rows_affected())
    }
}

/// `?,?,…,?`
fn placeholders(n: usize) -> String {
    let mut s = String::with_capacity(n * 2);
    for i in 0..n {
        s.push_str(if i == 0 { "?" } else { ",?" });
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_mark_is_null_or_blank() {
        assert_eq!(MarkState::of(None), MarkState::Empty);
        assert_eq!(MarkState::of(Some("")), MarkState::Empty);
        assert_eq!(MarkState::of(Some("   ")), MarkState::Empty);
        assert_eq!(
            MarkState::of(Some("PROCESSED")),
            MarkState::Marked("PROCESSED".into())
        );
        assert_eq!(MarkState::of(Some(" Y ")), MarkState::Marked(" Y ".into()));
    }

    #[test]
    fn statements_quote_names_and_guard_the_empty_mark() {
        let sql = MarkSql::new(&InboxNames::defaults());
        assert_eq!(
            sql.check_prefix,
            "SELECT `CMINMSGS_ID`, `CMINMSGS_STATUS` FROM `CMINMSGS` WHERE `CMINMSGS_ID` IN "
        );
        assert!(sql.write_prefix.starts_with(
            "UPDATE `CMINMSGS` SET `CMINMSGS_STATUS` = ?, \
             `CMINMSGS_DATE_PROCESSED` = COALESCE(`CMINMSGS_DATE_PROCESSED`, ?)"
        ));
        assert!(sql
            .write_prefix
            .contains("(`CMINMSGS_STATUS` IS NULL OR TRIM(`CMINMSGS_STATUS`) = '')"));
        assert_eq!(placeholders(3), "?,?,?");
        assert_eq!(placeholders(1), "?");
    }
}
