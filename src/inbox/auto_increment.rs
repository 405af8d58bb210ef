//! The inbox table's next `AUTO_INCREMENT` value: tells an id regression (the table was
//! rotated or restored and will hand out ids W already passed) from an inbox whose newest rows
//! were simply purged (MAX(id) below W, but the next id still above it).

use sqlx::Row;

use super::{Inbox, InboxError};

impl Inbox {
    /// The next id the table will hand out; None when the server does not say (a view, no
    /// privilege on `information_schema`). MySQL 8 caches `information_schema.TABLES`
    /// statistics; the session asks for fresh ones first (MariaDB has no such cache and no
    /// such variable, so that statement may fail harmlessly).
    pub async fn next_auto_increment(&self) -> Result<Option<i64>, InboxError> {
        let mut conn = self.pool.acquire().await?;
        let _ = sqlx::query("SET SESSION information_schema_stats_expiry = 0")
            .execute(&mut *conn)
            .await;
        let row = self
            .timed(
                sqlx::query(
                    "SELECT CAST(AUTO_INCREMENT AS SIGNED) FROM information_schema.TABLES \
                     WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
                )
                .bind(self.names.table.as_str())
                .fetch_optional(&mut *conn),
            )
            .await?;
        Ok(match row {
            Some(r) => r.try_get::<Option<i64>, _>(0)?,
            None => None,
        })
    }
}
