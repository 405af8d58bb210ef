//! `late.hole_evidence` is only valid on the primary (docs/hole-evidence.md): a replica's
//! `INNODB_TRX` shows its own applier, never the upstream's open transactions, so "no older
//! transaction" would release holes whose rows are still coming. The service refuses to start
//! with evidence on against a read-only server or a replica.

use sqlx::mysql::MySqlDatabaseError;
use sqlx::Row;

use super::{Inbox, InboxError};

/// What the server says about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerRole {
    /// `@@global.read_only`.
    pub read_only: bool,
    /// `@@global.innodb_read_only`.
    pub innodb_read_only: bool,
    /// `SHOW REPLICA STATUS` / `SHOW SLAVE STATUS` returned a row; None when it could not be
    /// read (no `REPLICATION CLIENT` privilege).
    pub replica: Option<bool>,
}

/// Why evidence may not be used against this server.
#[derive(Debug, thiserror::Error)]
pub enum PrimaryError {
    /// The server is read-only or a replica.
    #[error(
        "late.hole_evidence = true needs the inbox's primary, but the server at inbox.url is {0}; \
         point inbox.url at the primary or set late.hole_evidence = false"
    )]
    NotPrimary(&'static str),
    /// The check itself failed.
    #[error("checking whether the inbox server is the primary failed: {0}")]
    Inbox(#[from] InboxError),
}

impl ServerRole {
    /// The verdict: refuse on positive evidence of a read-only server or a replica; an
    /// unreadable replica status alone is not (the read-only flags are set on replicas).
    pub fn verdict(&self) -> Result<(), PrimaryError> {
        if self.replica == Some(true) {
            return Err(PrimaryError::NotPrimary(
                "a replica (SHOW REPLICA STATUS has a row)",
            ));
        }
        if self.read_only {
            return Err(PrimaryError::NotPrimary("read-only (@@read_only = 1)"));
        }
        if self.innodb_read_only {
            return Err(PrimaryError::NotPrimary(
                "read-only (@@innodb_read_only = 1)",
            ));
        }
        Ok(())
    }
}

impl Inbox {
    /// Reads the server's role (read-only flags, replica status).
    pub async fn server_role(&self) -> Result<ServerRole, InboxError> {
        let row = self
            .timed(
                sqlx::query(
                    "SELECT CAST(@@global.read_only AS SIGNED), \
                            CAST(@@global.innodb_read_only AS SIGNED)",
                )
                .fetch_one(&self.pool),
            )
            .await?;
        let read_only = row.try_get::<i64, _>(0)? != 0;
        let innodb_read_only = row.try_get::<i64, _>(1)? != 0;
        let mut replica = None;
        // MySQL 8.0.22+ and MariaDB 10.5+ know REPLICA; older servers only SLAVE.
        for sql in ["SHOW REPLICA STATUS", "SHOW SLAVE STATUS"] {
            match self.timed(sqlx::query(sql).fetch_all(&self.pool)).await {
                Ok(rows) => {
                    replica = Some(!rows.is_empty());
                    break;
                }
                Err(InboxError::Db(sqlx::Error::Database(db)))
                    if db
                        .try_downcast_ref::<MySqlDatabaseError>()
                        .is_some_and(|m| matches!(m.number(), 1064 | 1227 | 1142)) =>
                {
                    // 1064: syntax (an old server), 1227/1142: no privilege.
                    continue;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(ServerRole {
            read_only,
            innodb_read_only,
            replica,
        })
    }

    /// Refuses a read-only server or a replica (see [`ServerRole::verdict`]).
    pub async fn check_primary(&self) -> Result<ServerRole, PrimaryError> {
        let role = self.server_role().await?;
        role.verdict()?;
        if role.replica.is_none() {
            tracing::warn!(
                "late.hole_evidence: replica status not readable (no REPLICATION CLIENT \
                 privilege); relying on @@read_only to tell the primary"
            );
        }
        Ok(role)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role(read_only: bool, innodb_read_only: bool, replica: Option<bool>) -> ServerRole {
        ServerRole {
            read_only,
            innodb_read_only,
            replica,
        }
    }

    #[test]
    fn only_a_writable_non_replica_passes() {
        assert!(role(false, false, Some(false)).verdict().is_ok());
        assert!(role(false, false, None).verdict().is_ok());
        for bad in [
            role(true, false, Some(false)),
            role(false, true, Some(false)),
            role(false, false, Some(true)),
            role(true, true, None),
        ] {
            let e = bad.verdict().expect_err("refused").to_string();
            assert!(
                e.contains("late.hole_evidence") && e.contains("inbox.url"),
                "{e}"
            );
        }
    }
}
