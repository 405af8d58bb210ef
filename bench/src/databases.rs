//! The bench's own databases: their name and URLs on the configured servers, the check that
//! they are fresh, and the drop at the end.

use std::future::Future;
use std::str::FromStr;

use anyhow::Context as _;
use msgx_core::settings::{redact_url, SecretUrl, Settings};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, Database, Executor, IntoArguments};

/// The bench's own databases, on the configured servers.
#[derive(Debug)]
pub(super) struct BenchDbs {
    /// `msgx_bench_<pid>`, in both servers.
    pub(super) name: String,
    /// The configured inbox URL with the database replaced.
    pub(super) inbox_url: String,
    /// The configured store URL with the database replaced.
    pub(super) store_url: String,
}

impl BenchDbs {
    /// Runs a bench on fresh databases ([`BenchDbs::fresh`]), then ends it
    /// ([`BenchDbs::finish`]): kept when `keep`, else dropped.
    pub(super) async fn run_fresh(
        settings: &Settings,
        keep: bool,
        run: impl AsyncFnOnce(&BenchDbs) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let dbs = Self::fresh(settings).await?;
        let result = run(&dbs).await;
        dbs.finish(result, keep).await
    }

    /// Ends a run: keeps the databases (and says where) when asked, else drops them; the run's
    /// own error wins over a failed drop, which is still reported.
    async fn finish(&self, result: anyhow::Result<()>, keep: bool) -> anyhow::Result<()> {
        if keep {
            println!(
                "  kept                  : {} and {}",
                msgx_core::settings::redact_url(&self.inbox_url),
                msgx_core::settings::redact_url(&self.store_url)
            );
            return result;
        }
        let dropped = self.drop_all().await;
        match (result, dropped) {
            (Err(e), Err(d)) => {
                eprintln!(
                    "msgexchange: also failed to drop the bench databases `{}`: {d:#}",
                    self.name
                );
                Err(e)
            }
            (Err(e), Ok(())) => Err(e),
            (Ok(()), dropped) => dropped,
        }
    }

    /// Derives both URLs from the configured ones, checking the drivers read `name` back.
    fn new(settings: &Settings, name: &str) -> anyhow::Result<Self> {
        let derive = |section: &str, url: &SecretUrl| {
            with_database(url.expose(), name).with_context(|| {
                format!(
                    "deriving the bench {section} URL from {section}.url `{}`",
                    redact_url(url)
                )
            })
        };
        let inbox_url = derive("inbox", &settings.inbox.connect.url)?;
        let store_url = derive("store", &settings.store.connect.url)?;
        // The drivers must read the name back exactly as written.
        let inbox_db = MySqlConnectOptions::from_str(&inbox_url)
            .with_context(|| format!("parsing {}", redact_url(&inbox_url)))?
            .get_database()
            .map(str::to_string);
        let store_db = PgConnectOptions::from_str(&store_url)
            .with_context(|| format!("parsing {}", redact_url(&store_url)))?
            .get_database()
            .map(str::to_string);
        anyhow::ensure!(
            inbox_db.as_deref() == Some(name) && store_db.as_deref() == Some(name),
            "derived bench URLs do not name `{name}`: {} / {}",
            redact_url(&inbox_url),
            redact_url(&store_url)
        );
        Ok(Self {
            name: name.to_string(),
            inbox_url,
            store_url,
        })
    }

    /// The databases `msgx_bench_<pid>` on the configured servers, refused when either already
    /// exists (an earlier `--keep` run with the same pid): "fresh" means fresh, and the
    /// clean-up in [`BenchDbs::finish`] must only ever drop what this run created.
    async fn fresh(settings: &Settings) -> anyhow::Result<Self> {
        let dbs = Self::new(settings, &format!("msgx_bench_{}", std::process::id()))?;
        dbs.ensure_absent().await?;
        Ok(dbs)
    }

    /// Creates the inbox tables (configured names) in the bench inbox, as the DB owner.
    pub(super) async fn inbox_fixture(&self, settings: &Settings) -> anyhow::Result<()> {
        msgx_actors::cli::create_inbox_fixture_at(&self.inbox_url, settings).await
    }

    /// The inbox adapter on the bench inbox, exactly as the service builds it.
    pub(super) fn inbox(&self, settings: &Settings) -> anyhow::Result<msgx_core::inbox::Inbox> {
        self.inbox_at(settings, &self.inbox_url)
    }

    /// The inbox adapter on `url` (the bench inbox, as another user), as the service builds it.
    pub(super) fn inbox_at(
        &self,
        settings: &Settings,
        url: &str,
    ) -> anyhow::Result<msgx_core::inbox::Inbox> {
        let mut inbox_settings = settings.inbox.clone();
        inbox_settings.connect.url = url.to_string().into();
        msgx_core::inbox::Inbox::new(
            &inbox_settings,
            settings.inbox_names(),
            settings.inbox_timezone(),
        )
        .context("building the bench inbox adapter")
    }

    /// Opens the bench store (creating the database and running the migrations) as the
    /// service runs it: fenced with a lease epoch, so every write pays the fencing check.
    pub(super) async fn store(
        &self,
        settings: &Settings,
    ) -> anyhow::Result<msgx_core::store::Store> {
        let mut store_settings = settings.store.clone();
        store_settings.connect.url = self.store_url.clone().into();
        store_settings.create_database = true;
        let store = msgx_core::store::Store::connect(&store_settings)
            .await
            .with_context(|| {
                format!("opening the bench store at {}", redact_url(&self.store_url))
            })?;
        // The epoch outlives the lock (nobody else bumps it in a bench database).
        let epoch = msgx_core::store::InstanceLock::acquire(&store)
            .await
            .context("taking the bench store's lease")?
            .epoch();
        store.fenced(epoch).await.context("fencing the bench store")
    }

    /// A server-level MySQL connection (no database selected).
    async fn mysql_admin(&self) -> anyhow::Result<MySqlConnection> {
        MySqlConnectOptions::from_str(&self.inbox_url)
            .context("parsing the bench inbox URL")?
            .database("")
            .disable_statement_logging()
            .connect()
            .await
            .with_context(|| {
                format!(
                    "connecting to the inbox server {}",
                    redact_url(&self.inbox_url)
                )
            })
    }

    /// A connection to the PostgreSQL maintenance database `postgres`.
    async fn pg_admin(&self) -> anyhow::Result<sqlx::PgConnection> {
        PgConnectOptions::from_str(&self.store_url)
            .context("parsing the bench store URL")?
            .database("postgres")
            .disable_statement_logging()
            .connect()
            .await
            .with_context(|| {
                format!(
                    "connecting to the maintenance database `postgres` on {}",
                    redact_url(&self.store_url)
                )
            })
    }

    /// Fails when either database already exists.
    async fn ensure_absent(&self) -> anyhow::Result<()> {
        let mut my = self.mysql_admin().await?;
        let in_mysql: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?",
        )
        .bind(&self.name)
        .fetch_one(&mut my)
        .await
        .context("looking for a leftover bench inbox database")?;
        close_admin(my, "inbox").await?;
        let mut pg = self.pg_admin().await?;
        let in_pg: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
                .bind(&self.name)
                .fetch_one(&mut pg)
                .await
                .context("looking for a leftover bench store database")?;
        close_admin(pg, "store").await?;
        anyhow::ensure!(
            in_mysql == 0 && !in_pg,
            "database `{}` already exists (a `--keep` leftover?); drop it first",
            self.name
        );
        Ok(())
    }

    /// Drops both databases (if they exist); tries both even when the first fails.
    pub(super) async fn drop_all(&self) -> anyhow::Result<()> {
        let pg_quoted = format!("\"{}\"", self.name.replace('"', "\"\""));
        let pg = self
            .drop_on(
                self.pg_admin(),
                &format!("DROP DATABASE IF EXISTS {pg_quoted} WITH (FORCE)"),
                "store",
            )
            .await;
        let my_quoted = format!("`{}`", self.name.replace('`', "``"));
        let my = self
            .drop_on(
                self.mysql_admin(),
                &format!("DROP DATABASE IF EXISTS {my_quoted}"),
                "inbox",
            )
            .await;
        pg.and(my)
    }

    /// Runs `drop_sql` on the admin connection `admin` opens to the `server` ("store" or
    /// "inbox"), then closes it.
    async fn drop_on<C>(
        &self,
        admin: impl Future<Output = anyhow::Result<C>>,
        drop_sql: &str,
        server: &str,
    ) -> anyhow::Result<()>
    where
        C: Connection,
        for<'c> &'c mut C: Executor<'c, Database = C::Database>,
        for<'q> <C::Database as Database>::Arguments<'q>: IntoArguments<'q, C::Database>,
    {
        let mut conn = admin.await?;
        sqlx::query(drop_sql)
            .execute(&mut conn)
            .await
            .with_context(|| format!("dropping the {server} database `{}`", self.name))?;
        close_admin(conn, server).await
    }
}

/// Closes an admin connection to the `server` ("store" or "inbox").
async fn close_admin<C: Connection>(conn: C, server: &str) -> anyhow::Result<()> {
    conn.close()
        .await
        .with_context(|| format!("closing the {server} admin connection"))
}

/// `url` with its database (the path) replaced by `database`; scheme, credentials, host and
/// query parameters are kept as written.
pub fn with_database(url: &str, database: &str) -> anyhow::Result<String> {
    let scheme_end = url
        .find("://")
        .map(|i| i + 3)
        .context("the URL has no scheme (`scheme://…`)")?;
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    anyhow::ensure!(!authority.is_empty(), "the URL has no host");
    let after_path = rest[authority_end..]
        .find(['?', '#'])
        .map_or("", |i| &rest[authority_end + i..]);
    Ok(format!(
        "{}{authority}/{database}{after_path}",
        &url[..scheme_end]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_is_replaced_and_the_rest_kept() {
        assert_eq!(
            with_database("mysql://root@127.0.0.1:3306/msgx_inbox", "b").expect("url"),
            "mysql://root@127.0.0.1:3306/b"
        );
        assert_eq!(
            with_database("postgres://u:p@h:5432/msgx?sslmode=disable", "b").expect("url"),
            "postgres://u:p@h:5432/b?sslmode=disable"
        );
        assert_eq!(
            with_database("postgres://h", "b").expect("url"),
            "postgres://h/b"
        );
        assert_eq!(
            with_database("postgresql://h/?application_name=x", "b").expect("url"),
            "postgresql://h/b?application_name=x"
        );
        assert!(with_database("no-scheme", "b").is_err());
    }
}
