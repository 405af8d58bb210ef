//! What the inbox's DB owner does to CMINMSGS behind our back: marks, purges, odd rows.

use super::TestEnv;

impl TestEnv {
    /// As the DB owner: `UPDATE CMINMSGS SET {set} WHERE CMINMSGS_ID IN (ids)`, where `set`
    /// takes `binds` (in order) before the ids.
    pub async fn owner_update(&self, set: &str, binds: &[&str], ids: &[i64]) {
        let sql = format!(
            "UPDATE CMINMSGS SET {set} WHERE CMINMSGS_ID IN ({})",
            vec!["?"; ids.len()].join(", ")
        );
        let mut q = sqlx::query(&sql);
        for b in binds {
            q = q.bind(*b);
        }
        for id in ids {
            q = q.bind(id);
        }
        q.execute(&self.owner)
            .await
            .unwrap_or_else(|e| panic!("{sql} {ids:?}: {e}"));
    }

    /// As the DB owner (or the previous system): marks these rows with `status`, processed now.
    pub async fn mark_as_owner(&self, ids: &[i64], status: &str) {
        let set = "CMINMSGS_STATUS = ?, CMINMSGS_DATE_PROCESSED = NOW()";
        self.owner_update(set, &[status], ids).await;
    }

    /// As the DB owner: runs this statement on the inbox (no binds).
    pub async fn owner_exec(&self, sql: &str) {
        sqlx::query(sql)
            .execute(&self.owner)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// As the DB owner: deletes every inbox row up to `last` (a purge).
    pub async fn purge_as_owner(&self, last: i64) {
        sqlx::query("DELETE FROM CMINMSGS WHERE CMINMSGS_ID <= ?")
            .bind(last)
            .execute(&self.owner)
            .await
            .expect("purge as owner");
    }

    /// As the DB owner: deletes these inbox rows (in one statement); how many there were.
    pub async fn delete_as_owner(&self, ids: &[i64]) -> u64 {
        let sql = format!(
            "DELETE FROM CMINMSGS WHERE CMINMSGS_ID IN ({})",
            vec!["?"; ids.len()].join(", ")
        );
        let mut q = sqlx::query(&sql);
        for id in ids {
            q = q.bind(id);
        }
        q.execute(&self.owner)
            .await
            .unwrap_or_else(|e| panic!("{sql} {ids:?}: {e}"))
            .rows_affected()
    }

    /// As upstream: inserts and commits one message with NULL DATE_RECEIVED; its id.
    pub async fn insert_unreceived(&self) -> i64 {
        let r = sqlx::query(
            "INSERT INTO CMINMSGS (CMINMSGS_DATE_RECEIVED, CMINMSGS_CLOB_MSG) VALUES (NULL, '<MSG/>')",
        )
        .execute(&self.owner)
        .await
        .expect("insert");
        r.last_insert_id() as i64
    }
}
