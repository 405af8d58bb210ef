//! Statements the service sends to the inbox, counted by the inbox server itself.
//!
//! The MariaDB server here is shared (other sessions' tests run on it), so the global
//! `Com_select` counter would count their statements too, and `performance_schema` is off
//! (it needs a restart). Instead the service's inbox pool connects as a MySQL user of its own,
//! `msgx_bench_<pid>`, granted only the bench database, and MariaDB's user statistics
//! (`information_schema.USER_STATISTICS`, updated at the end of every statement) count that
//! user's SELECT, UPDATE and other commands: every statement of every actor that reads or marks
//! the inbox (poller, pump's raw read, late detector, sweeper, purge watch), and nothing else —
//! the bench's own inserts and checks run as the configured user. The statistics need
//! `userstat = ON`; when it is off the bench turns it on for the run and back off at the end.
//! So the configured inbox user must be allowed to create users and set globals (root on a dev
//! server); without that the bench stops at the start and says which step was refused.

use anyhow::Context as _;
use sqlx::mysql::MySqlPool;

use super::databases::BenchDbs;

/// The service's own inbox user and where its statistics are read.
#[derive(Debug)]
pub(super) struct InboxStats {
    /// A server-level pool as the configured (owner) user.
    admin: MySqlPool,
    /// The user the service's inbox pool connects as.
    user: String,
    /// The inbox URL with that user.
    pub(super) url: String,
    /// `userstat` was off and this run turned it on (and turns it off again).
    switched_on: bool,
}

/// Statements run by the service's inbox user so far.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Commands {
    pub(super) select: i64,
    pub(super) update: i64,
    pub(super) other: i64,
}

impl Commands {
    /// Every statement.
    pub(super) fn total(&self) -> i64 {
        self.select + self.update + self.other
    }

    /// What ran between `earlier` and `self`.
    pub(super) fn since(&self, earlier: &Commands) -> Commands {
        Commands {
            select: self.select - earlier.select,
            update: self.update - earlier.update,
            other: self.other - earlier.other,
        }
    }
}

impl InboxStats {
    /// Creates the service's inbox user (the bench database only) and makes sure the server
    /// counts its statements.
    pub(super) async fn setup(dbs: &BenchDbs) -> anyhow::Result<Self> {
        let admin = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(1)
            .connect(&dbs.inbox_url)
            .await
            .context("connecting to the bench inbox as its owner")?;
        let user = dbs.name.clone();
        let password = format!("p{}", rand::random::<u64>());
        let quoted_db = format!("`{}`", dbs.name.replace('`', "``"));
        for sql in [
            format!("CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'"),
            format!("GRANT ALL ON {quoted_db}.* TO '{user}'@'%'"),
        ] {
            sqlx::query(&sql)
                .execute(&admin)
                .await
                .with_context(|| format!("creating the service's inbox user `{user}`"))?;
        }
        let on: i64 = sqlx::query_scalar("SELECT @@GLOBAL.userstat + 0")
            .fetch_one(&admin)
            .await
            .context("reading userstat")?;
        let switched_on = on == 0;
        if switched_on {
            sqlx::query("SET GLOBAL userstat = ON")
                .execute(&admin)
                .await
                .context("turning userstat on for the run")?;
        }
        let url = with_user(&dbs.inbox_url, &user, &password)?;
        Ok(Self {
            admin,
            user,
            url,
            switched_on,
        })
    }

    /// The user's statements so far (zero before its first statement).
    pub(super) async fn read(&self) -> anyhow::Result<Commands> {
        let row: Option<(i64, i64, i64)> = sqlx::query_as(
            "SELECT CAST(SELECT_COMMANDS AS SIGNED), CAST(UPDATE_COMMANDS AS SIGNED), \
                    CAST(OTHER_COMMANDS AS SIGNED) \
             FROM information_schema.USER_STATISTICS WHERE USER = ?",
        )
        .bind(&self.user)
        .fetch_optional(&self.admin)
        .await
        .context("reading USER_STATISTICS")?;
        Ok(
            row.map_or(Commands::default(), |(select, update, other)| Commands {
                select,
                update,
                other,
            }),
        )
    }

    /// Drops the user and puts `userstat` back as it was (after the service stopped).
    pub(super) async fn teardown(self) -> anyhow::Result<()> {
        let dropped = sqlx::query(&format!("DROP USER IF EXISTS '{}'@'%'", self.user))
            .execute(&self.admin)
            .await
            .with_context(|| format!("dropping the inbox user `{}`", self.user));
        if self.switched_on {
            sqlx::query("SET GLOBAL userstat = OFF")
                .execute(&self.admin)
                .await
                .context("turning userstat back off")?;
        }
        self.admin.close().await;
        dropped.map(|_| ())
    }
}

/// MariaDB's general log, on for one window (`--idle-trace`): which statements the service's
/// user sent, by shape. The log is global, so it is on only for that window and put back as it
/// was; its table keeps every session's statements of the window (this is a dev server).
#[derive(Debug)]
pub(super) struct StatementTrace {
    /// `general_log` and `log_output` before the window.
    previous: (i64, String),
    /// The server's time when the window opened.
    since: chrono::NaiveDateTime,
}

impl InboxStats {
    /// Turns the general log on, into its table.
    pub(super) async fn trace_start(&self) -> anyhow::Result<StatementTrace> {
        let (on, output, since): (i64, String, chrono::NaiveDateTime) =
            sqlx::query_as("SELECT @@GLOBAL.general_log + 0, @@GLOBAL.log_output, NOW(6)")
                .fetch_one(&self.admin)
                .await
                .context("reading general_log")?;
        for sql in [
            "SET GLOBAL log_output = 'TABLE'",
            "SET GLOBAL general_log = ON",
        ] {
            sqlx::query(sql)
                .execute(&self.admin)
                .await
                .with_context(|| format!("turning the general log on: {sql}"))?;
        }
        Ok(StatementTrace {
            previous: (on, output),
            since,
        })
    }

    /// Puts the general log back and returns the service user's statements of the window by
    /// shape (numbers and quoted strings blanked), most frequent first.
    pub(super) async fn trace_end(
        &self,
        trace: StatementTrace,
    ) -> anyhow::Result<Vec<(String, i64)>> {
        let (on, output) = &trace.previous;
        // The server's own words (`FILE`, `TABLE,FILE`, `NONE`), checked before they go back
        // into a statement.
        anyhow::ensure!(
            output.chars().all(|c| c.is_ascii_uppercase() || c == ','),
            "unexpected log_output {output:?}"
        );
        for sql in [
            format!("SET GLOBAL general_log = {}", i64::from(*on != 0)),
            format!("SET GLOBAL log_output = '{output}'"),
        ] {
            sqlx::query(&sql)
                .execute(&self.admin)
                .await
                .with_context(|| format!("putting the general log back: {sql}"))?;
        }
        sqlx::query_as(
            "SELECT shape, CAST(COUNT(*) AS SIGNED) AS n FROM ( \
               SELECT REGEXP_REPLACE(REGEXP_REPLACE(LEFT(CONVERT(argument USING utf8mb4), 160), \
                        \"'[^']*'\", '?'), '[0-9]+', 'N') AS shape \
               FROM mysql.general_log \
               WHERE event_time >= ? AND user_host LIKE CONCAT(?, '[%') \
                 AND command_type IN ('Query', 'Execute')) s \
             GROUP BY shape ORDER BY n DESC",
        )
        .bind(trace.since)
        .bind(&self.user)
        .fetch_all(&self.admin)
        .await
        .context("reading the general log")
    }
}

/// `url` with its credentials replaced by `user:password` (both plain ASCII here).
fn with_user(url: &str, user: &str, password: &str) -> anyhow::Result<String> {
    let (scheme, rest) = url
        .split_once("://")
        .context("the inbox URL has no scheme")?;
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    Ok(format!("{scheme}://{user}:{password}@{host}"))
}

#[cfg(test)]
mod tests {
    use super::with_user;

    #[test]
    fn credentials_are_replaced() {
        assert_eq!(
            with_user("mysql://root@127.0.0.1:3306/b", "u", "p").expect("url"),
            "mysql://u:p@127.0.0.1:3306/b"
        );
        assert_eq!(
            with_user("mysql://a:b@h/b?x=1", "u", "p").expect("url"),
            "mysql://u:p@h/b?x=1"
        );
    }
}
