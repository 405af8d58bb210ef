//! `msgexchange dev inbox-fixture`: creates `CMINMSGS` and `COUTMSGS` in a dev/test MySQL
//! database, acting as the DB owner. The service never runs DDL on the shared database.

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::{ConnectOptions, Connection};

use crate::inbox::names::{InboxNames, OutboxNames};

/// DDL of the inbound inbox as SPEC §12 assumes it.
pub fn inbox_ddl(n: &InboxNames) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {t} (\n  \
           {id} BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,\n  \
           {recv} DATETIME NULL,\n  \
           {msg} LONGTEXT NULL,\n  \
           {proc} DATETIME NULL,\n  \
           {status} VARCHAR(32) NULL,\n  \
           KEY {idx} ({recv})\n\
         ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
        t = n.table,
        id = n.id,
        recv = n.received,
        msg = n.message,
        proc = n.processed,
        status = n.status,
        idx = format_args!("`{}_RECV_IDX`", n.table.as_str()),
    )
}

/// DDL of the outbound table (SPEC §12; the ACK columns belong to the downstream adapter;
/// our three columns carry their configured names).
pub fn outbox_ddl(n: &OutboxNames) -> String {
    let t = n.table.as_str();
    format!(
        "CREATE TABLE IF NOT EXISTS `{t}` (\n  \
           {id} BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,\n  \
           {created} DATETIME NULL,\n  \
           {message} LONGTEXT NULL,\n  \
           `{t}_DATE_SENT` DATETIME NULL,\n  \
           `{t}_ACK_DATE_RECV` DATETIME NULL,\n  \
           `{t}_ACK_RESEND_TIMES` INT NULL,\n  \
           `{t}_ERROR` VARCHAR(512) NULL\n\
         ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
        id = n.id,
        created = n.created,
        message = n.message,
    )
}

/// Creates the database in `url` (if missing) and both tables (if missing).
pub async fn create_inbox_fixture(
    url: &str,
    inbox: &InboxNames,
    outbox: &OutboxNames,
) -> Result<(), sqlx::Error> {
    create_inbox_fixture_with(url.parse()?, inbox, outbox).await
}

/// The same with connect options (`inbox::connect_options`: the password and TLS keys).
pub async fn create_inbox_fixture_with(
    options: MySqlConnectOptions,
    inbox: &InboxNames,
    outbox: &OutboxNames,
) -> Result<(), sqlx::Error> {
    if let Some(db) = options.get_database().map(str::to_string) {
        let mut admin: MySqlConnection = options.clone().database("").connect().await?;
        let quoted = format!("`{}`", db.replace('`', "``"));
        sqlx::query(&format!("CREATE DATABASE IF NOT EXISTS {quoted}"))
            .execute(&mut admin)
            .await?;
        admin.close().await?;
    }
    let mut conn = options.connect().await?;
    sqlx::query(&inbox_ddl(inbox)).execute(&mut conn).await?;
    sqlx::query(&outbox_ddl(outbox)).execute(&mut conn).await?;
    conn.close().await?;
    Ok(())
}
