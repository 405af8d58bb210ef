//! FIFO end to end: the simulator writes from several connections (held transactions, late
//! commits, rollbacks, malformed messages) while the poller and the pump run under the
//! supervisor. The processing order must equal ascending MSG_ID for every message. And the
//! real binary killed in the middle of a business transaction reprocesses that message
//! exactly once in effect.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::TestEnv;
use msgx_actors::app::{start_pipeline, PipelineDeps};
use msgx_actors::messages::PollNow;
use msgx_actors::wiring::Wiring;
use msgx_core::devtools::messages::Mix;
use msgx_core::devtools::simulator::{simulate, SimConfig};

#[actix_rt::test]
async fn processing_order_equals_msg_id_order_with_holes_and_late_commits() {
    let env = TestEnv::new("fifo").await;
    let settings = env.settings(&[
        ("MSGX_PIPELINE__POLL_INTERVAL", "20ms"),
        ("MSGX_PIPELINE__CLAIM_BATCH", "200"),
        ("MSGX_PROCESSING__IDLE_POLL", "50ms"),
    ]);
    let wiring = Wiring::default();
    let (fatal, _rx) = tokio::sync::mpsc::unbounded_channel();
    let _sup = start_pipeline(PipelineDeps {
        wiring: wiring.clone(),
        ..PipelineDeps::from_settings(
            &settings,
            env.inbox.clone(),
            env.store.clone(),
            common::shared(&env.clock),
            fatal,
        )
        .expect("pipeline deps")
    });
    let cfg = SimConfig {
        rate_per_sec: 0.0, // as fast as the connections go
        connections: 6,
        total: Some(2500),
        hold_fraction: 0.05,
        hold_max: Duration::from_millis(200),
        rollback_fraction: 0.01,
        huge_fraction: 0.0,
        mix: Mix {
            unknown_type: 0.0, // a FAILED head would only add retry waits here
            ..Mix::default()
        },
        seed: 11,
        ..SimConfig::default()
    };
    let (_stop, stop_rx) = tokio::sync::watch::channel(false);
    let report = simulate(&env.owner, &env.names, env.tz, &cfg, stop_rx)
        .await
        .expect("simulate");
    assert!(report.late_commits > 0, "the run had late commits");
    assert!(!report.rolled_back_ids.is_empty(), "the run had holes");

    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        env.clock.advance(Duration::from_secs(301)); // ages holes past max-commit-delay
        if let Some(p) = wiring.poller() {
            let _ = p.send(PollNow).await;
        }
        let unfinished: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM proc_state WHERE state IN ('PENDING','FAILED')",
        )
        .fetch_one(env.store.pool())
        .await
        .expect("count");
        let done = env.processing_order().await.len();
        if unfinished == 0 && done == report.committed_ids.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not drained: {done} done, {unfinished} unfinished"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let order = env.processing_order().await;
    assert_eq!(
        order, report.committed_ids,
        "processing order = ascending MSG_ID, nothing lost"
    );
    let dead: i64 =
        sqlx::query_scalar("SELECT count(*) FROM proc_state WHERE error_class = 'MALFORMED'")
            .fetch_one(env.store.pool())
            .await
            .expect("count");
    assert!(dead > 0, "malformed messages were in the mix and went DEAD");
    common::contract::check_stored_events(&env.store).await;
    env.cleanup().await;
}

#[tokio::test]
async fn killed_mid_transaction_reprocesses_exactly_once_in_effect() {
    let env = TestEnv::new("kill_tx").await;
    // Make the business transaction of flight SLOW hang inside, after its flight write.
    sqlx::raw_sql(
        "CREATE FUNCTION slow() RETURNS trigger AS $$ BEGIN \
           IF NEW.flight_key = 'SLOW' THEN PERFORM pg_sleep(3); END IF; RETURN NEW; END $$ \
           LANGUAGE plpgsql; \
         CREATE TRIGGER slow BEFORE INSERT ON msg_event FOR EACH ROW EXECUTE FUNCTION slow();",
    )
    .execute(env.store.pool())
    .await
    .expect("trigger");
    let before = env
        .insert_message(&common::msgs::flop(1, "F0", &[("GATE", "A1")]))
        .await;
    let slow = env
        .insert_message(&common::msgs::flop(2, "SLOW", &[("GATE", "B2")]))
        .await;
    let after = env
        .insert_message(&common::msgs::flop(3, "SLOW", &[("STND", "S3")]))
        .await;

    let spawn = || {
        Command::new(env!("CARGO_BIN_EXE_msgexchange"))
            .arg("run")
            .envs(env.binary_env())
            .env("MSGX_HTTP__LISTEN", "127.0.0.1:0")
            .env("MSGX_PIPELINE__POLL_INTERVAL", "50ms")
            .env("MSGX_LOG__LEVEL", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn")
    };
    let mut svc = spawn();
    let start = Instant::now();
    loop {
        let sleeping: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event = 'PgSleep'",
        )
        .bind(&env.db)
        .fetch_one(env.store.pool())
        .await
        .expect("activity");
        if sleeping > 0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "never reached the slow transaction"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    svc.kill().expect("kill -9");
    svc.wait().expect("reap");
    assert_eq!(
        env.state_of(slow).await.0,
        "PENDING",
        "nothing of the killed transaction committed"
    );
    sqlx::raw_sql("DROP TRIGGER slow ON msg_event")
        .execute(env.store.pool())
        .await
        .expect("drop");

    let mut svc = spawn();
    let start = Instant::now();
    while env.state_of(after).await.0 != "SUCCEEDED" {
        assert!(start.elapsed() < Duration::from_secs(60), "not reprocessed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    svc.kill().expect("kill");
    svc.wait().expect("reap");

    assert_eq!(env.processing_order().await, vec![before, slow, after]);
    let events: Vec<(i64, String)> = sqlx::query_as(
        "SELECT msg_id, event_type FROM msg_event WHERE flight_key = 'SLOW' ORDER BY event_id",
    )
    .fetch_all(env.store.pool())
    .await
    .expect("events");
    assert_eq!(
        events,
        vec![
            (slow, "FLIGHT_CREATED".to_string()),
            (after, "FLIGHT_UPDATED".to_string())
        ],
        "exactly one effect per message"
    );
    let attempts: i32 = sqlx::query_scalar("SELECT attempts FROM proc_state WHERE msg_id = $1")
        .bind(slow)
        .fetch_one(env.store.pool())
        .await
        .expect("attempts");
    assert_eq!(attempts, 2, "the killed attempt counted");
    common::contract::check_stored_events(&env.store).await;
    env.cleanup().await;
}

/// The binary aborted in the middle of a group (`MSGEXCHANGE_FAILPOINT=pump_mid_group`: two
/// members planned, not committed): nothing of the group is visible, and the next run applies
/// every message exactly once, in MSG_ID order, with the interrupted members counted once.
#[tokio::test]
async fn killed_mid_group_commits_nothing_of_it_and_redoes_the_whole_group() {
    killed_in_group_at("pump_mid_group").await;
}

/// As above, aborted after the group's outcome statement was written and before its commit
/// (`pump_group_before_commit`): the written batch is rolled back with the connection.
#[tokio::test]
async fn killed_after_the_batch_write_before_commit_redoes_the_whole_group() {
    killed_in_group_at("pump_group_before_commit").await;
}

async fn killed_in_group_at(failpoint: &'static str) {
    let env = TestEnv::new("kill_group").await;
    let mut ids = Vec::new();
    for i in 0..20 {
        let flid = format!("G{}", i % 4);
        ids.push(
            env.insert_message(&common::msgs::flop(
                100 + i,
                &flid,
                &[("GATE", &format!("A{i}"))],
            ))
            .await,
        );
    }
    let spawn = |failpoint: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_msgexchange"));
        cmd.arg("run")
            .envs(env.binary_env())
            .env("MSGX_HTTP__LISTEN", "127.0.0.1:0")
            .env("MSGX_PIPELINE__POLL_INTERVAL", "50ms")
            .env("MSGX_LOG__LEVEL", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(f) = failpoint {
            cmd.env("MSGEXCHANGE_FAILPOINT", f);
        }
        cmd.spawn().expect("spawn")
    };
    let mut svc = spawn(Some(failpoint));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = svc.try_wait().expect("wait") {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "never reached the failpoint"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(!status.success(), "aborted mid-group: {status:?}");
    let pool = env.store.pool().clone();
    let count = |sql: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .expect("count")
        }
    };
    assert_eq!(
        count("SELECT count(*) FROM proc_state WHERE state <> 'PENDING'").await,
        0,
        "no member of the aborted group committed"
    );
    assert_eq!(count("SELECT count(*) FROM flight_state").await, 0);
    assert_eq!(count("SELECT count(*) FROM msg_event").await, 0);
    let stamped = count("SELECT count(*) FROM proc_state WHERE attempts = 1").await;
    assert!(
        stamped >= 2,
        "the group's attempts were stamped before it ran ({stamped})"
    );

    let mut svc = spawn(None);
    let start = Instant::now();
    while count("SELECT count(*) FROM proc_state WHERE state = 'SUCCEEDED'").await < 20 {
        assert!(start.elapsed() < Duration::from_secs(60), "not redone");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    svc.kill().expect("kill");
    svc.wait().expect("reap");
    assert_eq!(env.processing_order().await, ids, "MSG_ID order");
    let per_msg: Vec<(i64, i64)> =
        sqlx::query_as("SELECT msg_id, count(*) FROM msg_event GROUP BY msg_id ORDER BY msg_id")
            .fetch_all(env.store.pool())
            .await
            .expect("events");
    assert_eq!(per_msg.len(), 20, "every message had its effect");
    assert!(
        per_msg.iter().all(|(_, n)| *n == 1),
        "exactly one effect each: {per_msg:?}"
    );
    let max_attempts: i32 = sqlx::query_scalar("SELECT max(attempts) FROM proc_state")
        .fetch_one(env.store.pool())
        .await
        .expect("attempts");
    assert_eq!(max_attempts, 2, "the aborted attempt counted once, no more");
    common::contract::check_stored_events(&env.store).await;
    env.cleanup().await;
}
