//! Test harness: every test gets its own PostgreSQL database and its own MariaDB database
//! (real servers, no fakes), so tests run in parallel. Databases are named `msgxt_*`;
//! `scripts/test.sh` drops leftovers before a run.

pub mod contract;
pub mod dispatch;
pub mod dispatch_round;
pub mod drive;
pub mod http;
pub mod instance;
pub mod kafka;
pub mod msgs;
pub mod otlp;
pub mod owner;
pub mod pipeline;
pub mod process;
pub mod proxied;
pub mod proxy;
pub mod seed;
pub mod service;
pub mod sql;
pub mod tansu;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use msgx_core::clock::ManualClock;
use msgx_core::devtools::fixture;
use msgx_core::inbox::names::InboxNames;
use msgx_core::inbox::Inbox;
use msgx_core::ops::ReplayRequest;
use msgx_core::poller::{poll_once, PollConfig, PollReport};
use msgx_core::settings::Settings;
use msgx_core::store::replay::{self, AdminError, AdminReport, Audit, Expect};
use msgx_core::store::Store;
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{Executor, MySql, Transaction};

/// Admin URL of the test PostgreSQL (no database).
pub fn pg_base() -> String {
    std::env::var("MSGX_TEST_PG").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

/// Admin URL of the test MariaDB/MySQL (no database).
pub fn mysql_base() -> String {
    std::env::var("MSGX_TEST_MYSQL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into())
}

/// One connection to the test PostgreSQL's `postgres` database, for creating and dropping
/// the test databases.
pub async fn pg_admin() -> Result<PgPool, sqlx::Error> {
    let url = format!("{}/postgres", pg_base());
    PgPoolOptions::new().max_connections(1).connect(&url).await
}

/// One connection to the test MariaDB (no database), for creating and dropping databases
/// and accounts.
pub async fn mysql_admin() -> Result<MySqlPool, sqlx::Error> {
    MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&mysql_base())
        .await
}

/// A fresh, empty PostgreSQL database `db` (dropped first if a killed run left it), owned by
/// `owner` (the connecting admin when None).
pub async fn fresh_pg_database(db: &str, owner: Option<&str>) {
    let owner = owner.map(|o| format!(" OWNER {o}")).unwrap_or_default();
    let admin = pg_admin().await.expect("postgres reachable");
    run_all(
        &admin,
        &[
            format!("DROP DATABASE IF EXISTS \"{db}\" WITH (FORCE)"),
            format!("CREATE DATABASE \"{db}\"{owner}"),
        ],
    )
    .await;
    admin.close().await;
}

/// Runs these administrative statements on `pool` in order; panics naming the one that fails.
pub async fn run_all<DB: sqlx::Database>(pool: &sqlx::Pool<DB>, statements: &[String])
where
    for<'c> &'c sqlx::Pool<DB>: Executor<'c, Database = DB>,
{
    for sql in statements {
        pool.execute(sql.as_str())
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

/// The settings key an `MSGX_*` variable sets, as errors name it: `MSGX_RETENTION__BATCH` →
/// `retention.batch`.
pub fn setting_name(var: &str) -> String {
    var.trim_start_matches("MSGX_")
        .replace("__", ".")
        .to_lowercase()
}

/// The repository root (this crate is `tests/common`): where tests find the docs, the config,
/// the scripts and `target/`.
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every rule (alert or recording) of `prometheus/alerts.yml`, in file order: the one reader
/// of the rules for the tests that check them against the dashboards, the book and Prometheus.
pub fn alert_rules() -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(repo_root().join("prometheus/alerts.yml"))
        .expect("prometheus/alerts.yml");
    let doc: serde_json::Value = serde_yaml_ng::from_str(&text).expect("alerts.yml is YAML");
    let groups = doc["groups"].as_array().expect("alerts.yml: groups");
    groups
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("alerts.yml: rules").clone())
        .collect()
}

/// The repo's default config file.
pub fn default_toml() -> std::path::PathBuf {
    repo_root().join("config/default.toml")
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// One test's private world.
pub struct TestEnv {
    /// `msgxt_<tag>_<pid>_<n>`: the PG and MariaDB database name.
    pub db: String,
    /// Store URL (with database).
    pub pg_url: String,
    /// Inbox URL (with database).
    pub my_url: String,
    /// Our store (migrated).
    pub store: Store,
    /// The inbox adapter under test.
    pub inbox: Inbox,
    /// A pool acting as upstream and as the DB owner.
    pub owner: MySqlPool,
    /// Inbox names (the shipped defaults, resolved by the loader).
    pub names: InboxNames,
    /// Airport zone (`inbox.timezone` as shipped).
    pub tz: Tz,
    /// Injected clock.
    pub clock: ManualClock,
    /// The settings of this env without overrides: the one source of the defaults the
    /// helpers start from (the binary's loader and `config/default.toml`).
    pub base: Settings,
}

impl TestEnv {
    /// Creates both databases, the inbox fixture, and the migrated store.
    pub async fn new(tag: &str) -> Self {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let db = format!("msgxt_{tag}_{}_{n}", std::process::id());
        let pg_url = format!("{}/{db}", pg_base());
        let my_url = format!("{}/{db}", mysql_base());

        fresh_pg_database(&db, None).await;

        let base = Self::settings_for(&pg_url, &my_url, &[]);
        let (names, tz) = (base.inbox_names().clone(), base.inbox_timezone());
        let my_admin = mysql_admin().await.expect("mariadb reachable");
        run_all(&my_admin, &[format!("DROP DATABASE IF EXISTS `{db}`")]).await;
        my_admin.close().await;
        fixture::create_inbox_fixture(&my_url, &names, base.outbox_names())
            .await
            .expect("inbox fixture");

        let store = Store::connect(&base.store).await.expect("store");
        let inbox = Inbox::new(&base.inbox, &names, tz).expect("inbox");
        let owner = MySqlPoolOptions::new()
            .max_connections(8)
            .connect(&my_url)
            .await
            .expect("owner pool");
        let clock = ManualClock::new(
            DateTime::parse_from_rfc3339("2026-11-30T01:00:00Z")
                .expect("time")
                .with_timezone(&Utc),
        );
        Self {
            db,
            pg_url,
            my_url,
            store,
            inbox,
            owner,
            names,
            tz,
            clock,
            base,
        }
    }

    /// Settings pointing at this env's databases, with extra `MSGX_*` overrides.
    pub fn settings(&self, extra: &[(&str, &str)]) -> Settings {
        Self::settings_for(&self.pg_url, &self.my_url, extra)
    }

    /// `verify` over this environment's stores (no Kafka), as `msgexchange verify` runs it.
    pub async fn verify(&self) -> msgx_core::verify::Report {
        msgx_core::verify::verify(&msgx_core::verify::VerifyInput {
            inbox: self.inbox.clone(),
            names: self.names.clone(),
            store: self.store.clone(),
            mark_value: self.settings(&[]).backfill.mark_value.clone(),
            batch: 100,
            kafka: None,
        })
        .await
        .expect("verify")
    }

    fn settings_for(pg_url: &str, my_url: &str, extra: &[(&str, &str)]) -> Settings {
        let mut env = vec![
            ("MSGX_STORE__URL", pg_url),
            ("MSGX_INBOX__URL", my_url),
            ("MSGX_STORE__MAX_CONNECTIONS", "4"),
        ];
        env.extend_from_slice(extra);
        // The binary's loader and layers (`binary_env`: default.toml as `--config`), with the
        // overrides as its `MSGX_*` environment.
        Settings::load_layered_with_env(Some(&default_toml()), &env).expect("test settings")
    }

    /// Environment variables for running the binary against this env.
    pub fn binary_env(&self) -> Vec<(String, String)> {
        vec![
            ("MSGX_STORE__URL".into(), self.pg_url.clone()),
            ("MSGX_INBOX__URL".into(), self.my_url.clone()),
            (
                "MSGEXCHANGE_CONFIG".into(),
                default_toml().display().to_string(),
            ),
            // What the fail-closed defaults require of a run (issue 30): the Kafka to use, and
            // the first start's cutover choice on a fresh store with history ("process it all";
            // ignored once seeded). A test on a store it filled itself sets it to "".
            ("MSGX_KAFKA__BROKERS".into(), "embedded".into()),
            ("MSGX_PIPELINE__CUTOVER_WATERMARK".into(), "zero".into()),
            // A run on a real broker names its deployment (the compiled default is refused
            // there): one per env, as two sites sharing a topic would.
            (
                "MSGX_KAFKA__CE_SOURCE".into(),
                format!("//{}.test/msgexchange", self.db),
            ),
        ]
    }

    /// The configured poll knobs with this claim batch, the enqueue committed synchronously
    /// (as the harness's rounds always ran).
    pub fn poll_cfg(&self, claim_batch: u32) -> PollConfig {
        PollConfig {
            claim_batch,
            async_commit: false,
            ..PollConfig::from_settings(&self.base.pipeline, &self.base.late)
        }
    }

    /// One round with the manual clock.
    pub async fn poll(&self, cfg: PollConfig) -> PollReport {
        poll_once(&self.inbox, &self.store, &self.clock, cfg)
            .await
            .expect("poll round")
    }

    /// Inserts and commits `n` ordinary rows as upstream; returns their ids.
    pub async fn insert_rows(&self, n: usize) -> Vec<i64> {
        let mut ids = Vec::with_capacity(n);
        for _ in 0..n {
            let r = sqlx::query(
                "INSERT INTO CMINMSGS (CMINMSGS_DATE_RECEIVED, CMINMSGS_CLOB_MSG) VALUES (NOW(), '<MSG/>')",
            )
            .execute(&self.owner)
            .await
            .expect("insert");
            ids.push(r.last_insert_id() as i64);
        }
        ids
    }

    /// Inserts and commits one message with this text (receive time in airport local time).
    pub async fn insert_message(&self, text: &str) -> i64 {
        let r = sqlx::query(
            "INSERT INTO CMINMSGS (CMINMSGS_DATE_RECEIVED, CMINMSGS_CLOB_MSG) VALUES (?, ?)",
        )
        .bind(msgx_core::inbox::time::utc_to_local(Utc::now(), self.tz))
        .bind(text)
        .execute(&self.owner)
        .await
        .expect("insert message");
        r.last_insert_id() as i64
    }

    /// A pump core over this env (manual clock) with the default processing settings and
    /// these overrides.
    pub fn pump(&self, extra: &[(&str, &str)]) -> msgx_core::pump::PumpCore {
        self.pump_with_inbox(self.inbox.clone(), extra)
    }

    /// Same, reading raw messages through another inbox adapter (e.g. via a proxy).
    pub fn pump_with_inbox(
        &self,
        inbox: Inbox,
        extra: &[(&str, &str)],
    ) -> msgx_core::pump::PumpCore {
        let settings = self.settings(extra);
        msgx_core::pump::PumpCore::new(
            inbox,
            self.store.clone(),
            msgx_actors::app::codec(&settings.processing, self.tz),
            shared(&self.clock),
            msgx_actors::app::pump_config(&settings.processing, &settings.retention, self.tz),
        )
    }

    /// The operator surface on this env's store and inbox, with a five-minute drain window.
    pub fn ops(&self) -> msgx_core::ops::Ops {
        msgx_core::ops::Ops {
            store: self.store.clone(),
            inbox: self.inbox.clone(),
            drain_window: std::time::Duration::from_secs(300),
            dlq_topic: self.base.kafka.dlq_topic.clone(),
            caller: None,
        }
    }

    /// The operator's replay (`Ops::replay`) of `req` at the manual clock's now; it runs (rows
    /// may still be refused: the report says which).
    pub async fn ops_replay(&self, req: &ReplayRequest) -> msgx_core::ops::ActionReport {
        use msgx_core::clock::Clock;
        self.ops()
            .replay(req, self.clock.now())
            .await
            .unwrap_or_else(|e| panic!("replay {req:?}: {e}"))
    }

    /// `(state, error_class)` of a message.
    pub async fn state_of(&self, msg_id: i64) -> (String, Option<String>) {
        sqlx::query_as("SELECT state, error_class FROM proc_state WHERE msg_id = $1")
            .bind(msg_id)
            .fetch_one(self.store.pool())
            .await
            .expect("proc_state row")
    }

    /// The named flights and their code-shares as stored, decoded as the pump's load decodes
    /// them (the service has no reader of its own: flights leave as events).
    pub async fn flights(
        &self,
        flids: &[String],
    ) -> Result<
        std::collections::BTreeMap<String, msgx_core::flight::Flight>,
        Box<dyn std::error::Error>,
    > {
        let rows: Vec<(String, serde_json::Value, serde_json::Value)> = sqlx::query_as(
            "SELECT flid, fields, versions FROM flight_state \
             WHERE flid = ANY($1) OR master_flid = ANY($1) ORDER BY flid",
        )
        .bind(flids)
        .fetch_all(self.store.pool())
        .await?;
        let mut out = std::collections::BTreeMap::new();
        for (flid, fields, versions) in rows {
            let json = serde_json::json!({"flid": flid, "fields": fields, "versions": versions});
            out.insert(flid, serde_json::from_value(json)?);
        }
        Ok(out)
    }

    /// A replay of `ids` on `store` as the operator surface runs it (`Ops::replay`): the raw
    /// text looked up in this env's inbox first; no expectation (any state; the refusals
    /// then name what is not replayable).
    pub async fn replay_on(
        &self,
        store: &Store,
        ids: &[i64],
        actor: &str,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<AdminReport, AdminError> {
        let rows: Vec<(i64, Expect)> = ids.iter().map(|id| (*id, Expect::default())).collect();
        let in_inbox: Vec<replay::InboxText> = self
            .inbox
            .raw_messages(ids, u64::from(u32::MAX))
            .await
            .expect("inbox")
            .into_iter()
            .filter_map(|(id, raw)| match raw {
                msgx_core::inbox::RawMessage::Text(t) => Some((id, Some(t))),
                _ => None,
            })
            .collect();
        replay::replay(store, &rows, audit(actor, reason), false, now, &in_inbox).await
    }

    /// The late watch of `msg_id`, if any: its detection record, or the open range holding it.
    pub async fn late_watch_entry(&self, msg_id: i64) -> Result<Option<WatchEntry>, sqlx::Error> {
        type Row = (
            DateTime<Utc>,
            DateTime<Utc>,
            Option<DateTime<Utc>>,
            Option<DateTime<Utc>>,
        );
        let detected: Option<Row> = sqlx::query_as(
            // The detection record first, else the open range holding it.
            "SELECT released_at, expires_at, checked_at, detected_at FROM ( \
                 SELECT 0 AS k, released_at, expires_at, checked_at, detected_at \
                 FROM late_watch WHERE msg_id = $1 \
                 UNION ALL \
                 SELECT 1, released_at, expires_at, checked_at, NULL::timestamptz \
                 FROM late_watch_range WHERE first_id <= $1 AND last_id >= $1) w \
             ORDER BY k LIMIT 1",
        )
        .bind(msg_id)
        .fetch_optional(self.store.pool())
        .await?;
        Ok(detected.map(
            |(released_at, expires_at, checked_at, detected_at)| WatchEntry {
                released_at,
                expires_at,
                checked_at,
                detected_at,
            },
        ))
    }

    /// Every `audit_log` row, oldest first (operators read them per message: `inspect`).
    pub async fn audit_entries(
        &self,
    ) -> Result<Vec<msgx_core::store::replay::AuditEntry>, sqlx::Error> {
        sqlx::query_as(
            "SELECT id, at, actor, action, reason, msg_ids, result, ticket, token_name \
             FROM audit_log ORDER BY id",
        )
        .fetch_all(self.store.pool())
        .await
    }

    /// MSG_IDs in the order they reached a terminal state.
    pub async fn processing_order(&self) -> Vec<i64> {
        sqlx::query_scalar(
            "SELECT msg_id FROM proc_state WHERE processed_seq IS NOT NULL ORDER BY processed_seq",
        )
        .fetch_all(self.store.pool())
        .await
        .expect("order")
    }

    /// Opens a transaction and inserts one row in it (not committed): a late commit or a
    /// rollback in the making. Returns the transaction and the allocated id.
    pub async fn open_insert(&self) -> (Transaction<'static, MySql>, i64) {
        let mut tx = self.owner.begin().await.expect("begin");
        let r = sqlx::query(
            "INSERT INTO CMINMSGS (CMINMSGS_DATE_RECEIVED, CMINMSGS_CLOB_MSG) VALUES (NOW(), '<MSG/>')",
        )
        .execute(&mut *tx)
        .await
        .expect("insert");
        (tx, r.last_insert_id() as i64)
    }

    /// One committed row, then an insert left open after it (a hole in the making): the row's
    /// id, the open transaction and its id.
    pub async fn row_then_open_insert(&self) -> (i64, Transaction<'static, MySql>, i64) {
        let row = self.insert_rows(1).await[0];
        let (tx, id) = self.open_insert().await;
        (row, tx, id)
    }

    /// PROC_STATE ids in ascending order.
    pub async fn enqueued_ids(&self) -> Vec<i64> {
        sqlx::query_scalar("SELECT msg_id FROM proc_state ORDER BY msg_id")
            .fetch_all(self.store.pool())
            .await
            .expect("proc_state")
    }

    /// `(W, HOLE_SINCE)`.
    pub async fn cursor(&self) -> (i64, Option<DateTime<Utc>>) {
        let c = self.store.read_cursor().await.expect("cursor").cursor;
        (c.w, c.hole_since)
    }

    /// Drops both databases (best effort; `scripts/test.sh` also sweeps leftovers).
    pub async fn cleanup(self) {
        self.owner.close().await;
        self.store.pool().close().await;
        if let Ok(admin) = pg_admin().await {
            let _ = admin
                .execute(format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.db).as_str())
                .await;
        }
        if let Ok(admin) = mysql_admin().await {
            let _ = admin
                .execute(format!("DROP DATABASE IF EXISTS `{}`", self.db).as_str())
                .await;
        }
    }
}

/// Shared ManualClock as the trait object the actors take.
/// One released id's watch: open (inside a range) or detected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchEntry {
    /// When the poller released it.
    pub released_at: DateTime<Utc>,
    /// End of its watch window.
    pub expires_at: DateTime<Utc>,
    /// Last check that found it absent (or the detecting check).
    pub checked_at: Option<DateTime<Utc>>,
    /// When it was found in the inbox (and enqueued as LATE).
    pub detected_at: Option<DateTime<Utc>>,
}

/// The operator `ops` replaying one message it expects DEAD, for this reason and ticket.
pub fn replay_of_dead(id: i64, reason: &str, ticket: Option<&str>) -> ReplayRequest {
    ReplayRequest {
        msg_ids: vec![id],
        expect_state: Some("DEAD".into()),
        actor: "ops".into(),
        reason: reason.into(),
        ticket: ticket.map(Into::into),
        ..Default::default()
    }
}

/// An operator's audit (who, why), no ticket.
pub fn audit<'a>(actor: &'a str, reason: &'a str) -> Audit<'a> {
    Audit {
        actor,
        reason,
        ticket: None,
        token: None,
    }
}

pub fn shared(clock: &ManualClock) -> Arc<dyn msgx_core::clock::Clock> {
    Arc::new(clock.clone())
}

/// The finding of `invariant` in a `verify` report (every report holds one per invariant).
pub fn finding<'a>(
    report: &'a msgx_core::verify::Report,
    invariant: &str,
) -> &'a msgx_core::verify::Finding {
    report
        .findings
        .iter()
        .find(|f| f.invariant == invariant)
        .unwrap_or_else(|| panic!("no `{invariant}` finding in {:#?}", report.lines()))
}
