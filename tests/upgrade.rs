//! Upgrades with a standby (issue 30), against the real previous release's binary: only the
//! lease holder or `msgexchange migrate` migrates; a newer standby that finds the previous
//! release's (older) schema waits and says so in `/readyz`, `status` and one log line; the
//! previous release keeps working on the new schema (expand/contract, docs/architecture.md
//! "Schema changes") and the new binary on its data. Each test is the rolling upgrade of
//! docs/operations.md ("Rolling upgrade with a standby"), step by step in the docs' order,
//! with upstream writing into the inbox and events going to Kafka throughout: at the end every
//! inbox row is processed once, in order, marked, and its events are on the topic.

use msgx_testkit as common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::instance::{
    assert_per_key_order, cli, http_get, log_dir, service_env, set_var, simulator, verify,
    Instance, SimOpts,
};
use common::kafka::consume;
use common::service::{free_port, wait_for};
use common::TestEnv;
use msgx_core::store::schema;
use rdkafka::mocking::MockCluster;
use sqlx::postgres::{PgPool, PgPoolOptions};

const LIMIT: Duration = Duration::from_secs(60);
const TOPIC: &str = "msgx.flight-events";
const PARTITIONS: i32 = 3;

/// The env's store emptied (no schema at all: the previous release creates its own), and a
/// pool of our own on it.
async fn empty_store(env: &TestEnv) -> PgPool {
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&env.pg_url)
        .await
        .expect("store");
    for sql in ["DROP SCHEMA public CASCADE", "CREATE SCHEMA public"] {
        sqlx::query(sql).execute(&pool).await.expect(sql);
    }
    pool
}

async fn schema_version(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations WHERE success")
        .fetch_one(pool)
        .await
        .expect("schema version")
}

async fn lease_epoch(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT epoch FROM instance_lease WHERE id = 1")
        .fetch_one(pool)
        .await
        .expect("lease epoch")
}

/// Records processed so far (terminal).
async fn processed(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM proc_state WHERE state IN ('SUCCEEDED', 'SKIPPED')")
        .fetch_one(pool)
        .await
        .unwrap_or(0)
}

/// Waits until `more` rows beyond `than` are processed: the pipeline moves under traffic.
async fn processing_moves(pool: &PgPool, than: i64, who: &str) -> i64 {
    let what = format!("{who} to process more than {than} rows under traffic");
    wait_for(&what, LIMIT, || async { processed(pool).await >= than + 5 }).await;
    processed(pool).await
}

async fn readyz_says(port: u16, what: &str) -> bool {
    http_get(port, "/readyz")
        .await
        .is_ok_and(|r| r.starts_with("HTTP/1.1 503") && r.contains(what))
}

/// The previous release's binary, built once by scripts/prev_release.sh and cached.
fn previous_release() -> PathBuf {
    let out = Command::new("bash")
        .arg(common::repo_root().join("scripts/prev_release.sh"))
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .expect("scripts/prev_release.sh");
    assert!(out.status.success(), "scripts/prev_release.sh failed");
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let bin = PathBuf::from(path.lines().last().unwrap_or_default());
    assert!(
        bin.is_file(),
        "no previous release binary at {}",
        bin.display()
    );
    bin
}

/// One site: the stores, a Kafka (librdkafka's mock cluster, reached over TCP by every
/// process), both binaries and their environments, and upstream writing.
struct Site {
    /// Names this test's logs (the tests run in parallel).
    tag: &'static str,
    env: TestEnv,
    pool: PgPool,
    _kafka: MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    bootstrap: String,
    prev: PathBuf,
    /// The new binary's environment.
    vars: Vec<(String, String)>,
    /// The previous release's: its compiled-in defaults and no key newer than it (it refuses
    /// unknown keys).
    old_vars: Vec<(String, String)>,
}

impl Site {
    /// The previous release installed and `migrate`d (its own schema), nothing running yet.
    async fn with_previous_release(tag: &'static str) -> Self {
        let prev = previous_release();
        let env = TestEnv::new(tag).await;
        let pool = empty_store(&env).await;
        let kafka = MockCluster::new(1).expect("mock cluster");
        for t in [TOPIC, "msgx.flight-events.dlq"] {
            kafka.create_topic(t, PARTITIONS, 1).expect("topic");
        }
        let bootstrap = kafka.bootstrap_servers();
        let vars = service_env(&env, &env.pg_url, &env.my_url, &bootstrap);
        let old_vars = vars
            .iter()
            .filter(|(k, _)| k != "MSGEXCHANGE_CONFIG" && k != "MSGX_KAFKA__DELIVERY")
            .cloned()
            .collect();
        let site = Self {
            tag,
            env,
            pool,
            _kafka: kafka,
            bootstrap,
            prev,
            vars,
            old_vars,
        };
        let migrated = site.old_command("migrate").output().expect("migrate");
        assert!(migrated.status.success(), "{migrated:?}");
        site
    }

    fn old_command(&self, what: &str) -> Command {
        let mut cmd = Command::new(&self.prev);
        cmd.arg(what)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(self.old_vars.iter().cloned())
            .stdin(Stdio::null());
        cmd
    }

    /// The previous release as a service (`systemctl start` on a host with the old package).
    fn spawn_old(&self, name: &str) -> Instance {
        let name = format!("{}-{name}", self.tag);
        let port = free_port();
        let log = std::fs::File::create(log_dir().join(format!("{name}.log"))).expect("log");
        let child = self
            .old_command("run")
            .env("MSGX_HTTP__LISTEN", format!("127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn the previous release");
        Instance { child, port, name }
    }

    /// Upstream: four concurrent writers (some commits held back, so ids commit out of
    /// order) at 20 messages a second, for up to 5 minutes; stopped by [`Site::stop_writers`].
    /// The new binary as a service on a host.
    fn spawn_new(&self, name: &str) -> Instance {
        Instance::spawn(&self.vars, &format!("{}-{name}", self.tag), &[])
    }

    fn start_writers(&self) -> Child {
        let mut o = SimOpts::chaos(6000, 30);
        (o.rate, o.rollback, o.malformed, o.unknown) = (20, 0.0, 0.0, 0.0);
        simulator(&self.env, o)
    }

    /// Upstream stops (a writer killed mid-transaction leaves no row: its id is a hole that
    /// never fills, which the pipeline passes after `max_commit_delay`).
    fn stop_writers(&self, mut writers: Child) {
        assert!(
            matches!(writers.try_wait(), Ok(None)),
            "upstream stopped writing before the upgrade ended"
        );
        let _ = writers.kill();
        let _ = writers.wait();
    }

    async fn finish(self, instances: Vec<Instance>) {
        drop(instances);
        self.pool.close().await;
        self.env.cleanup().await;
    }
}

/// Stops an instance as `systemctl stop` does (SIGTERM: graceful, the lease released).
async fn systemctl_stop(mut instance: Instance) {
    instance.signal("-TERM");
    let exit = instance
        .exited_within(LIMIT)
        .await
        .unwrap_or_else(|| panic!("{} did not stop", instance.name));
    assert!(exit.success(), "{exit:?}: {}", instance.log());
}

/// Before the upgrade: the previous release active on host A under traffic, and its standby
/// on host B. Returns (active, standby, the active's lease epoch).
async fn previous_release_running(site: &Site) -> (Instance, Instance, i64) {
    let active = site.spawn_old("old-active");
    active.wait_ready(LIMIT).await;
    processing_moves(&site.pool, 0, "the previous release").await;
    let standby = site.spawn_old("old-standby");
    wait_for("the old standby", LIMIT, || {
        readyz_says(standby.port, "standing by")
    })
    .await;
    let epoch = lease_epoch(&site.pool).await;
    (active, standby, epoch)
}

/// Step 2 (host A: `systemctl stop`): the new standby takes the lease at once, migrates if
/// the schema is still older, and processes from where the old one stopped.
async fn step2_stop_the_active(site: &Site, active: Instance, new: &Instance, old_epoch: i64) {
    let before = processed(&site.pool).await;
    systemctl_stop(active).await;
    new.wait_ready(LIMIT).await;
    assert!(
        lease_epoch(&site.pool).await > old_epoch,
        "the new binary holds the lease"
    );
    assert_eq!(schema_version(&site.pool).await, schema::binary_version());
    processing_moves(&site.pool, before, "the new binary").await;
}

/// Step 3 (host A: the new package, `systemctl start`): it is the standby now.
async fn step3_the_old_host_stands_by(site: &Site) -> Instance {
    let standby = site.spawn_new("new-standby");
    wait_for("the upgraded old host to stand by", LIMIT, || {
        readyz_says(standby.port, "standing by")
    })
    .await;
    standby
}

/// Steps 2 and 3, the new active serving under traffic, upstream stopped, [`nothing_lost`].
async fn steps_2_and_3_then_nothing_lost(
    site: Site,
    writers: Child,
    active: Instance,
    new: Instance,
    old_epoch: i64,
) {
    step2_stop_the_active(&site, active, &new, old_epoch).await;
    let standby = step3_the_old_host_stands_by(&site).await;
    processing_moves(&site.pool, processed(&site.pool).await, "the new active").await;
    site.stop_writers(writers);
    nothing_lost(&site).await;
    site.finish(vec![new, standby]).await;
}

/// Upstream stopped: every inbox row processed once, none dead, FIFO, marked, every event
/// SENT and on the topic at its recorded offset (`verify --kafka`), per key in order.
async fn nothing_lost(site: &Site) {
    let env = &site.env;
    wait_for("everything settled", LIMIT, || {
        common::instance::settled(env)
    })
    .await;
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM CMINMSGS")
        .fetch_one(&env.owner)
        .await
        .expect("rows");
    let unmarked: i64 =
        sqlx::query_scalar("SELECT count(*) FROM CMINMSGS WHERE CMINMSGS_DATE_PROCESSED IS NULL")
            .fetch_one(&env.owner)
            .await
            .expect("unmarked");
    let records: i64 = sqlx::query_scalar("SELECT count(*) FROM proc_state")
        .fetch_one(&site.pool)
        .await
        .expect("records");
    assert!(rows > 50, "traffic throughout: {rows} rows");
    assert_eq!(
        (records, processed(&site.pool).await),
        (rows, rows),
        "each row once, processed"
    );
    assert_eq!(unmarked, 0, "every inbox row marked");
    let (code, out) = verify(&site.vars, &["--kafka"]);
    assert_eq!(
        code,
        Some(0),
        "verify (fifo, marks, events, kafka read-back):\n{out}"
    );
    let events: Vec<i64> = sqlx::query_scalar("SELECT event_id FROM msg_event ORDER BY event_id")
        .fetch_all(&site.pool)
        .await
        .expect("events");
    let (bootstrap, n) = (site.bootstrap.clone(), events.len());
    let records =
        common::instance::off_runtime(move || consume(&bootstrap, TOPIC, PARTITIONS, n)).await;
    assert_per_key_order(&records);
    let on_topic: std::collections::HashSet<i64> = records.iter().map(|r| r.event_id()).collect();
    let missing = events.iter().filter(|e| !on_topic.contains(e)).count();
    assert_eq!(
        missing,
        0,
        "of {} events, {missing} not on the topic",
        events.len()
    );
    let n = events.len();
    eprintln!("{}: nothing lost: {rows} rows, {n} events", site.tag);
}

/// docs/operations.md "Rolling upgrade with a standby", as written (`migrate_at_start` on):
/// step 1 the standby host restarts on the new binary, which finds the previous release's
/// older schema, does not migrate, and says so in `/readyz`, one WARN line and `status`,
/// while the old active keeps processing; step 2 the active host stops, the standby takes the
/// lease, migrates and serves; step 3 the old host comes back as the standby. Writers run
/// throughout; nothing is lost.
#[tokio::test]
async fn the_rolling_upgrade_from_the_previous_release_loses_nothing() {
    let site = Site::with_previous_release("upg_roll").await;
    let older = schema_version(&site.pool).await;
    let binary = schema::binary_version();
    assert!(
        older < binary,
        "the previous release's schema ({older}) is this binary's ({binary}): the standby \
         that waits to migrate needs an older one (scripts/prev_release.sh)"
    );
    let writers = site.start_writers();
    let (active, old_standby, epoch) = previous_release_running(&site).await;

    // Step 1: the standby host gets the new package and restarts.
    systemctl_stop(old_standby).await;
    let new = site.spawn_new("new");
    wait_for("the new standby to say it waits to migrate", LIMIT, || {
        readyz_says(new.port, "migrates once it holds the lease")
    })
    .await;
    let status = cli(&site.vars, &["status"]).await;
    assert_eq!(status.code, Some(0), "{}", status.all());
    let says = format!("at version {older}, this binary's is {binary}");
    assert!(
        status.stdout.contains(&says) && status.stdout.contains("held by"),
        "{}",
        status.all()
    );
    // The old active keeps processing on its schema while the new one waits.
    processing_moves(&site.pool, processed(&site.pool).await, "the old active").await;
    assert_eq!(
        schema_version(&site.pool).await,
        older,
        "the standby migrated"
    );
    assert_eq!(lease_epoch(&site.pool).await, epoch, "still the old active");
    let log = new.log();
    let line = "migrated only once this instance holds the lease";
    assert_eq!(log.matches(line).count(), 1, "one log line: {log}");

    steps_2_and_3_then_nothing_lost(site, writers, active, new, epoch).await;
}

/// The same upgrade with `store.migrate_at_start = false` (docs step 1's note): started before
/// `migrate`, the new binary refuses the older schema at once (exit 3, which the unit does
/// not restart); `msgexchange migrate` runs under the old active instance, which keeps
/// processing on the new schema (expand/contract); then the new binary stands by, and steps 2
/// and 3 follow. Writers run throughout; nothing is lost.
#[tokio::test]
async fn the_rolling_upgrade_with_migrate_first_keeps_the_previous_release_running() {
    let mut site = Site::with_previous_release("upg_migfirst").await;
    set_var(&mut site.vars, "MSGX_STORE__MIGRATE_AT_START", "false");
    let writers = site.start_writers();
    let (active, old_standby, epoch) = previous_release_running(&site).await;

    // Step 1, migrate first: the new binary would refuse the older schema at once.
    systemctl_stop(old_standby).await;
    let mut early = site.vars.clone();
    set_var(&mut early, "MSGX_HTTP__LISTEN", "127.0.0.1:0");
    let refused = cli(&early, &["run"]).await;
    assert_eq!(refused.code, Some(3), "{}", refused.all());
    assert!(
        refused.stderr.contains("msgexchange migrate"),
        "{}",
        refused.all()
    );
    let m = cli(&site.vars, &["migrate"]).await;
    assert_eq!(m.code, Some(0), "{}", m.all());
    assert_eq!(schema_version(&site.pool).await, schema::binary_version());
    processing_moves(
        &site.pool,
        processed(&site.pool).await,
        "the old release on the new schema",
    )
    .await;
    assert!(active.ready().await, "the old release keeps running");
    assert_eq!(
        lease_epoch(&site.pool).await,
        epoch,
        "still the old release"
    );
    let new = site.spawn_new("new");
    wait_for("the new standby", LIMIT, || {
        readyz_says(new.port, "standing by")
    })
    .await;

    steps_2_and_3_then_nothing_lost(site, writers, active, new, epoch).await;
}

/// Issue 53 item 3, at-least-once: the previous release delivers a round and dies before it
/// writes SENT (its own `dispatch_after_ack` failpoint, an abort like `kill -9`: the window a
/// rolling upgrade's stop can leave); the new binary takes the lease, migrates and delivers the
/// rest. A consumer that de-duplicates on (`ce_source`, `ce_id`), as the contract says, sees
/// each event once: the previous release's record is recognised at the start (its number as
/// `ce_id`, the event's inbox message, key and time) and written SENT, so the event is not
/// sent again under its UUID. Before issue 53 it was: two identities for one event.
#[tokio::test]
async fn an_event_the_previous_release_delivered_is_not_sent_again_under_a_new_identity() {
    let mut site = Site::with_previous_release("upg_identity").await;
    set_var(&mut site.vars, "MSGX_KAFKA__DELIVERY", "at-least-once");
    for i in 0..12 {
        let flid = format!("UP{:02}", i % 4);
        let gate = format!("G{i}");
        site.env
            .insert_message(&common::msgs::flop(5000 + i, &flid, &[("GATE", &gate)]))
            .await;
    }
    let mut old = site
        .old_command("run")
        .env("MSGX_HTTP__LISTEN", format!("127.0.0.1:{}", free_port()))
        .env("MSGEXCHANGE_FAILPOINT", "dispatch_after_ack")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the previous release");
    let late = "the previous release never reached dispatch_after_ack";
    let status = common::process::exit_status(&mut old, LIMIT, late).await;
    assert!(!status.success(), "aborted at the failpoint: {status:?}");
    let (bootstrap, tag) = (site.bootstrap.clone(), site.tag);
    let before =
        common::instance::off_runtime(move || consume(&bootstrap, TOPIC, PARTITIONS, 1)).await;
    assert!(
        !before.is_empty()
            && before
                .iter()
                .all(|r| !r.headers.contains_key("ce_msgxevent")),
        "{tag}: the previous release's records (its number as ce_id): {before:?}"
    );
    let sent_before: i64 =
        sqlx::query_scalar("SELECT count(*) FROM msg_event WHERE state = 'SENT'")
            .fetch_one(&site.pool)
            .await
            .expect("sent");
    assert_eq!(sent_before, 0, "it died before writing SENT");

    let new = site.spawn_new("new");
    new.wait_ready(LIMIT).await;
    wait_for("every event SENT by the new binary", LIMIT, || async {
        let (n, sent): (i64, i64) = sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE state = 'SENT') FROM msg_event",
        )
        .fetch_one(&site.pool)
        .await
        .unwrap_or((0, -1));
        processed(&site.pool).await == 12 && n > 0 && n == sent
    })
    .await;
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM msg_event")
        .fetch_one(&site.pool)
        .await
        .expect("events");
    let bootstrap = site.bootstrap.clone();
    let records = common::instance::off_runtime(move || {
        consume(&bootstrap, TOPIC, PARTITIONS, events as usize)
    })
    .await;
    // The consumer's view: identities per event (the event by its number, either release's).
    let mut identities: std::collections::BTreeMap<
        i64,
        std::collections::BTreeSet<(String, String)>,
    > = Default::default();
    for r in &records {
        identities
            .entry(r.event_id())
            .or_default()
            .insert((r.headers["ce_source"].clone(), r.ce_id().to_string()));
    }
    assert_eq!(
        identities.len() as i64,
        events,
        "every event on the topic: {identities:?}"
    );
    let twice: Vec<_> = identities.iter().filter(|(_, ids)| ids.len() > 1).collect();
    assert!(
        twice.is_empty(),
        "events a consumer de-duplicating on (ce_source, ce_id) receives twice: {twice:?}"
    );
    let (code, out) = verify(&site.vars, &["--kafka"]);
    assert_eq!(code, Some(0), "verify --kafka:\n{out}");
    site.finish(vec![new]).await;
}
