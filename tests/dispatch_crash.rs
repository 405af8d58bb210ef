//! Seed §4, last row: the broker accepted an event but the process died before marking it
//! SENT. The real binary is aborted exactly there (`MSGEXCHANGE_FAILPOINT=dispatch_after_ack`, an
//! abort like `kill -9`); the next run re-sends: duplicates are allowed, loss is not.

use msgx_testkit as common;

use std::collections::HashSet;
use std::time::Duration;

use common::kafka::{consume, Received};
use common::process::exit_status;
use common::service::{free_port, kill9, spawn_service, wait_for};
use common::{msgs, TestEnv};
use rdkafka::mocking::MockCluster;

const TOPIC: &str = "msgx.flight-events";

fn read_ce_ids(bootstrap: &str, at_least: usize) -> Vec<i64> {
    consume(bootstrap, TOPIC, 3, at_least)
        .iter()
        .map(Received::event_id)
        .collect()
}

#[tokio::test]
async fn a_crash_between_ack_and_sent_resends_and_loses_nothing() {
    let env = TestEnv::new("disp_crash").await;
    let cluster = MockCluster::new(1).expect("mock cluster");
    for t in [TOPIC, "msgx.flight-events.dlq"] {
        cluster.create_topic(t, 3, 1).expect("topic");
    }
    let bootstrap = cluster.bootstrap_servers();
    for i in 0..30 {
        let flid = format!("CA{:04}", i % 6);
        env.insert_message(&msgs::flop(1000 + i, &flid, &[("GATE", &format!("G{i}"))]))
            .await;
    }
    let kafka = [
        ("MSGX_KAFKA__BROKERS", bootstrap.as_str()),
        ("MSGX_BACKFILL__PERIOD", "200ms"),
    ];

    // Run 1: dies at the first round that got acks, before marking them.
    let mut with_failpoint = kafka.to_vec();
    with_failpoint.push(("MSGEXCHANGE_FAILPOINT", "dispatch_after_ack"));
    let mut svc = spawn_service(&env, &with_failpoint, free_port());
    let late = "never reached the failpoint";
    let status = exit_status(&mut svc, Duration::from_secs(60), late).await;
    assert!(!status.success(), "aborted at the failpoint: {status:?}");
    let events = env.count("SELECT count(*) FROM msg_event").await;
    assert!(events > 0, "the pump committed events before the crash");
    assert_eq!(
        env.count("SELECT count(*) FROM msg_event WHERE state = 'SENT'")
            .await,
        0,
        "the crash came before SENT"
    );
    let acked_before = read_ce_ids(&bootstrap, 1).len();
    assert!(acked_before > 0, "the broker had acknowledged events");

    // Run 2: drains; every event SENT.
    let mut svc = spawn_service(&env, &kafka, free_port());
    wait_for(
        "all 30 processed and every event sent",
        Duration::from_secs(60),
        || async {
            env.count("SELECT count(*) FROM proc_state WHERE state = 'SUCCEEDED'")
                .await
                == 30
                && env
                    .count("SELECT count(*) FROM msg_event WHERE state <> 'SENT'")
                    .await
                    == 0
        },
    )
    .await;
    kill9(&mut svc);

    let all: Vec<i64> = env
        .column("SELECT event_id FROM msg_event ORDER BY event_id")
        .await;
    let got = read_ce_ids(&bootstrap, all.len());
    let unique: HashSet<i64> = got.iter().copied().collect();
    assert_eq!(unique, all.iter().copied().collect(), "no event lost");
    assert!(
        got.len() > unique.len(),
        "the events acked before the crash were re-sent (duplicates allowed): {} records, {} events",
        got.len(),
        unique.len()
    );
    env.cleanup().await;
}
