//! FIFO end to end: the simulator writes from several connections (held transactions, late
//! commits, rollbacks, malformed messages) while the poller and the pump run under the
//! supervisor. The processing order must equal ascending MSG_ID for every message. And the
//! real binary killed in the middle of a business transaction reprocesses that message
//! exactly once in effect.

use msgx_testkit as common;

use std::time::{Duration, Instant};

use common::process::exit_status;
use common::service::{kill9, spawn_service};
use common::TestEnv;
use msgx_actors::messages::PollNow;
use msgx_core::devtools::messages::Mix;
use msgx_core::devtools::simulator::SimConfig;

#[actix_rt::test]
async fn processing_order_equals_msg_id_order_with_holes_and_late_commits() {
    let env = TestEnv::new("fifo").await;
    let pipeline = common::pipeline::start_with(
        &env,
        &[
            ("MSGX_PIPELINE__POLL_INTERVAL", "20ms"),
            ("MSGX_PIPELINE__CLAIM_BATCH", "200"),
            ("MSGX_PROCESSING__IDLE_POLL", "50ms"),
        ],
    );
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
    let report = env.simulate(&cfg).await;
    assert!(report.late_commits > 0, "the run had late commits");
    assert!(!report.rolled_back_ids.is_empty(), "the run had holes");

    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        env.clock.advance(Duration::from_secs(301)); // ages holes past max-commit-delay
        if let Some(p) = pipeline.wiring.poller() {
            let _ = p.send(PollNow).await;
        }
        let unfinished = env
            .count("SELECT count(*) FROM proc_state WHERE state IN ('PENDING','FAILED')")
            .await;
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
    let dead = env
        .count("SELECT count(*) FROM proc_state WHERE error_class = 'MALFORMED'")
        .await;
    assert!(dead > 0, "malformed messages were in the mix and went DEAD");
    common::contract::check_stored_events(&env.store).await;
    env.cleanup().await;
}

#[tokio::test]
async fn killed_mid_transaction_reprocesses_exactly_once_in_effect() {
    let env = TestEnv::new("kill_tx").await;
    // Make the business transaction of flight SLOW hang inside, after its flight write.
    env.exec(
        "CREATE FUNCTION slow() RETURNS trigger AS $$ BEGIN \
           IF NEW.flight_key = 'SLOW' THEN PERFORM pg_sleep(3); END IF; RETURN NEW; END $$ \
           LANGUAGE plpgsql; \
         CREATE TRIGGER slow BEFORE INSERT ON msg_event FOR EACH ROW EXECUTE FUNCTION slow();",
    )
    .await;
    let before = env
        .insert_message(&common::msgs::flop(1, "F0", &[("GATE", "A1")]))
        .await;
    let slow = env
        .insert_message(&common::msgs::flop(2, "SLOW", &[("GATE", "B2")]))
        .await;
    let after = env
        .insert_message(&common::msgs::flop(3, "SLOW", &[("STND", "S3")]))
        .await;

    let mut svc = spawn_service(&env, &[], 0);
    let start = Instant::now();
    loop {
        let sleeping: i64 = env.scalar_for("SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event = 'PgSleep'", &env.db).await;
        if sleeping > 0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "never reached the slow transaction"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    kill9(&mut svc);
    assert_eq!(
        env.state_of(slow).await.0,
        "PENDING",
        "nothing of the killed transaction committed"
    );
    env.exec("DROP TRIGGER slow ON msg_event").await;

    let mut svc = spawn_service(&env, &[], 0);
    let start = Instant::now();
    while env.state_of(after).await.0 != "SUCCEEDED" {
        assert!(start.elapsed() < Duration::from_secs(60), "not reprocessed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    kill9(&mut svc);

    assert_eq!(env.processing_order().await, vec![before, slow, after]);
    let events: Vec<(i64, String)> = env
        .rows(
            "SELECT msg_id, event_type FROM msg_event WHERE flight_key = 'SLOW' ORDER BY event_id",
        )
        .await;
    assert_eq!(
        events,
        vec![
            (slow, "FLIGHT_CREATED".to_string()),
            (after, "FLIGHT_UPDATED".to_string())
        ],
        "exactly one effect per message"
    );
    let attempts: i32 = env.proc_col("attempts", slow).await;
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
    let mut svc = spawn_service(&env, &[("MSGEXCHANGE_FAILPOINT", failpoint)], 0);
    let status = exit_status(
        &mut svc,
        Duration::from_secs(60),
        "never reached the failpoint",
    )
    .await;
    assert!(!status.success(), "aborted mid-group: {status:?}");
    let count = |sql: &'static str| env.count(sql);
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

    let mut svc = spawn_service(&env, &[], 0);
    let start = Instant::now();
    while count("SELECT count(*) FROM proc_state WHERE state = 'SUCCEEDED'").await < 20 {
        assert!(start.elapsed() < Duration::from_secs(60), "not redone");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    kill9(&mut svc);
    assert_eq!(env.processing_order().await, ids, "MSG_ID order");
    let per_msg: Vec<(i64, i64)> = env
        .rows("SELECT msg_id, count(*) FROM msg_event GROUP BY msg_id ORDER BY msg_id")
        .await;
    assert_eq!(per_msg.len(), 20, "every message had its effect");
    assert!(
        per_msg.iter().all(|(_, n)| *n == 1),
        "exactly one effect each: {per_msg:?}"
    );
    let max_attempts: i32 = env.scalar("SELECT max(attempts) FROM proc_state").await;
    assert_eq!(max_attempts, 2, "the aborted attempt counted once, no more");
    common::contract::check_stored_events(&env.store).await;
    env.cleanup().await;
}
