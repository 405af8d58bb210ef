//! Late arrivals against real MariaDB + PostgreSQL (SPEC §6, G1): a permanent hole released,
//! then committed after all, is detected from the durable watch list, enqueued as LATE in the
//! same transaction, processed by the pump under the ordering guard (a newer field is kept, an
//! older or unset one applied, refusals recorded and counted); the watch survives a restart,
//! expires, and is kept intact when the inbox cannot be read.

use msgx_testkit as common;

use std::sync::OnceLock;
use std::time::Duration;

use actix::Actor;
use common::msgs::{adft, fdel, flop};
use common::proxied::{ProxiedInbox, QUICK_INBOX};
use common::TestEnv;
use metrics_exporter_prometheus::PrometheusHandle;
use msgx_actors::late_detector::LateDetector;
use msgx_actors::messages::{DetectNow, HolesReleased};
use msgx_core::codec::model::Field;
use msgx_core::inbox::Inbox;
use msgx_core::late::{detect_once, DetectConfig, DetectError, DetectReport, LateHit};
use msgx_core::pump::PumpCore;
use msgx_core::store::Store;
use serde_json::json;
use sqlx::{MySql, Transaction};

const DETECTED: &str = "msgx_pipeline_late_arrival_detected_total";
const STALE: &str = "msgx_pipeline_late_arrival_stale_fields_total";

/// The process-wide Prometheus recorder (installed once for this test binary).
fn metrics() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| msgx_actors::app::install_metrics().expect("recorder"))
}

/// Current value of an unlabelled counter (0 before its first increment).
fn counter(name: &str) -> f64 {
    metrics()
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Counters are process-wide: tests that move them run one at a time.
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    metrics();
    SERIAL.lock().await
}

/// One test's env, the process-wide counters to itself while the guard lives.
async fn serial_env(tag: &str) -> (tokio::sync::MutexGuard<'static, ()>, TestEnv) {
    let serial = serial().await;
    (serial, TestEnv::new(tag).await)
}

/// A late row: `late` inserted in a transaction left open, `next` committed after it, the
/// poller releases the hole (`late`'s id alone), then the transaction commits. The late id.
async fn commit_after_release(env: &TestEnv, late: &str, next: &str) -> i64 {
    let (tx, hole) = open_message(env, late).await;
    env.insert_message(next).await;
    assert_eq!(release_hole(env).await, (hole, hole));
    tx.commit().await.expect("late commit");
    hole
}

/// Holds a MySQL transaction open with this message in it (commit → late row, rollback → the
/// id never arrives).
async fn open_message(env: &TestEnv, text: &str) -> (Transaction<'static, MySql>, i64) {
    let (mut tx, id) = env.open_insert().await;
    sqlx::query("UPDATE CMINMSGS SET CMINMSGS_CLOB_MSG = ? WHERE CMINMSGS_ID = ?")
        .bind(text)
        .bind(id)
        .execute(&mut *tx)
        .await
        .expect("message text");
    (tx, id)
}

/// Polls, waits out max-commit-delay, polls again: the hole at W+1 is released; one more
/// round enqueues what follows it. Returns the released range.
async fn release_hole(env: &TestEnv) -> (i64, i64) {
    let cfg = env.poll_cfg(100);
    let first = env.poll(cfg).await;
    assert!(first.advance.open_hole.is_some(), "a hole is open");
    env.clock.advance(Duration::from_secs(301));
    let r = env.poll(cfg).await;
    let released = r.advance.first_released().expect("hole released");
    env.poll(cfg).await;
    (released.first, released.last)
}

fn detect_cfg(env: &TestEnv, extra: &[(&str, &str)]) -> DetectConfig {
    DetectConfig::from_settings(&env.settings(extra))
}

async fn detect(env: &TestEnv, cfg: &DetectConfig) -> DetectReport {
    detect_once(&env.inbox, &env.store, &env.clock, cfg)
        .await
        .expect("detect round")
}

fn hits(ids: &[i64]) -> Vec<LateHit> {
    ids.iter()
        .map(|&msg_id| LateHit {
            msg_id,
            enqueued: true,
        })
        .collect()
}

/// Steps the pump until idle; returns the processed ids in order (each succeeded).
async fn drain(pump: &mut PumpCore) -> Vec<i64> {
    let done = common::drive::drain_processed(pump).await;
    for (msg_id, outcome) in &done {
        assert_eq!(outcome.label(), "succeeded", "{msg_id}: {outcome:?}");
    }
    done.into_iter().map(|(msg_id, _)| msg_id).collect()
}

async fn source_of(env: &TestEnv, msg_id: i64) -> Option<String> {
    sqlx::query_scalar("SELECT source FROM proc_state WHERE msg_id = $1")
        .bind(msg_id)
        .fetch_optional(env.store.pool())
        .await
        .expect("source")
}

async fn stale_fields(env: &TestEnv, msg_id: i64) -> Option<serde_json::Value> {
    env.scalar_for(
        "SELECT stale_fields FROM proc_state WHERE msg_id = $1",
        msg_id,
    )
    .await
}

async fn backfill_intent_set(env: &TestEnv, msg_id: i64) -> bool {
    env.scalar_for(
        "SELECT backfill_next_at IS NOT NULL FROM proc_state WHERE msg_id = $1",
        msg_id,
    )
    .await
}

#[tokio::test]
async fn a_late_row_is_detected_enqueued_and_applied_without_overtaking_newer_data() {
    let (_serial, env) = serial_env("late_main").await;
    let older = env
        .insert_message(&flop(5, "F1", &[("FLNO", "5101"), ("STND", "S1")]))
        .await;
    // Sent at :10, committed only after the hole was given up.
    let late_text = flop(10, "F1", &[("GATE", "A1"), ("STND", "S5"), ("BLTS", "7")]);
    let (tx, late) = open_message(&env, &late_text).await;
    let newer = env.insert_message(&flop(20, "F1", &[("GATE", "B2")])).await;

    assert_eq!(release_hole(&env).await, (late, late));
    let watch = env
        .late_watch_entry(late)
        .await
        .expect("entry")
        .expect("released id is watched");
    assert_eq!(
        watch.released_at,
        watch.expires_at - chrono::Duration::days(7)
    );
    assert_eq!((watch.checked_at, watch.detected_at), (None, None));

    let mut pump = env.pump(&[]);
    assert_eq!(drain(&mut pump).await, [older, newer]);

    let cfg = detect_cfg(&env, &[]);
    let before = (counter(DETECTED), counter(STALE));
    let r = detect(&env, &cfg).await;
    assert_eq!((r.checked, r.detected.len(), r.open), (1, 0, 1));
    assert_eq!(source_of(&env, late).await, None, "not there yet");

    tx.commit().await.expect("late commit");
    let r = detect(&env, &cfg).await;
    assert_eq!(r.detected, hits(&[late]));
    assert_eq!(r.open, 0);
    assert_eq!(counter(DETECTED) - before.0, 1.0);
    assert_eq!(source_of(&env, late).await.as_deref(), Some("LATE"));
    assert_eq!(env.state_of(late).await.0, "PENDING");
    let watch = env.late_watch_entry(late).await.expect("entry");
    assert_eq!(
        watch.and_then(|w| w.detected_at),
        Some(msgx_core::clock::Clock::now(&env.clock))
    );
    // Detected once: the next round has nothing to check.
    let r = detect(&env, &cfg).await;
    assert_eq!((r.checked, r.detected.len()), (0, 0));

    // Below W, so it is the head at once: processed after the newer message, by design.
    assert_eq!(drain(&mut pump).await, [late]);
    assert_eq!(env.processing_order().await, [older, newer, late]);
    assert_eq!(env.state_of(late).await.0, "SUCCEEDED");
    assert!(backfill_intent_set(&env, late).await, "marked like any row");

    let f1 = &env.flights(&["F1".into()]).await.expect("flights")["F1"];
    assert_eq!(f1.get(Field::Gate), Some("B2"), "the newer GATE is kept");
    assert_eq!(f1.versions[&Field::Gate].msg_id, newer);
    assert_eq!(f1.get(Field::Stnd), Some("S5"), "an older STND is replaced");
    assert_eq!(f1.versions[&Field::Stnd].msg_id, late);
    assert_eq!(f1.get(Field::Blts), Some("7"), "an unset field is applied");
    assert_eq!(f1.get(Field::Flno), Some("5101"));

    assert_eq!(
        stale_fields(&env, late).await,
        Some(json!({"F1": ["GATE"]}))
    );
    assert_eq!(counter(STALE) - before.1, 1.0);
    assert_eq!(stale_fields(&env, newer).await, None);
    let payload: serde_json::Value = env
        .scalar_for(
            "SELECT payload FROM msg_event WHERE msg_id = $1 AND event_type = 'FLIGHT_UPDATED'",
            late,
        )
        .await;
    assert_eq!(
        payload["changes"],
        json!({"STND": {"before": "S1", "after": "S5"}, "BLTS": {"before": null, "after": "7"}})
    );
    common::contract::check_stored_events(&env.store).await;
    env.cleanup().await;
}

#[tokio::test]
async fn late_deletes_and_late_updates_of_deleted_flights_are_refused_and_recorded() {
    let (_serial, env) = serial_env("late_delete").await;
    let a = env
        .insert_message(&adft(1, "F1", &[("FLNO", "5101")]))
        .await;
    let b = env
        .insert_message(&adft(2, "F2", &[("FLNO", "5102")]))
        .await;
    let (tx_del, late_del) = open_message(&env, &fdel(10, "F1")).await;
    let (tx_upd, late_upd) = open_message(&env, &flop(11, "F2", &[("STND", "S7")])).await;
    let newer_upd = env.insert_message(&flop(20, "F1", &[("GATE", "B2")])).await;
    let newer_del = env.insert_message(&fdel(21, "F2")).await;
    assert_eq!(release_hole(&env).await, (late_del, late_upd));
    let mut pump = env.pump(&[]);
    assert_eq!(drain(&mut pump).await, [a, b, newer_upd, newer_del]);

    tx_del.commit().await.expect("commit");
    tx_upd.commit().await.expect("commit");
    let before = counter(STALE);
    let r = detect(&env, &detect_cfg(&env, &[])).await;
    assert_eq!(r.detected, hits(&[late_del, late_upd]));
    assert_eq!(drain(&mut pump).await, [late_del, late_upd]);

    // F1 was updated after the delete was sent: the delete is refused, F1 stays.
    let flights = env
        .flights(&["F1".into(), "F2".into()])
        .await
        .expect("flights");
    assert_eq!(flights["F1"].get(Field::Gate), Some("B2"));
    assert_eq!(
        stale_fields(&env, late_del).await,
        Some(json!({"F1": ["DELETE"]}))
    );
    // F2 was deleted after the update was sent: the update does not bring it back.
    assert!(!flights.contains_key("F2"), "{flights:?}");
    assert_eq!(
        stale_fields(&env, late_upd).await,
        Some(json!({"F2": ["CREATE", "STND"]}))
    );
    assert_eq!(counter(STALE) - before, 3.0);
    for id in [late_del, late_upd] {
        assert_eq!(env.state_of(id).await.0, "SUCCEEDED");
        assert!(backfill_intent_set(&env, id).await);
    }
    let late_events: i64 = env
        .scalar_for(
            "SELECT count(*) FROM msg_event WHERE msg_id = ANY($1)",
            vec![late_del, late_upd],
        )
        .await;
    assert_eq!(late_events, 0, "nothing applied, nothing announced");
    common::contract::check_stored_events(&env.store).await;
    env.cleanup().await;
}

#[actix_rt::test]
async fn the_watch_survives_a_restart_and_the_detector_wakes_on_a_release() {
    let (_serial, env) = serial_env("late_restart").await;
    let hole_a = commit_after_release(
        &env,
        &flop(1, "F1", &[("GATE", "A1")]),
        &flop(2, "F2", &[("GATE", "A2")]),
    )
    .await;

    // A restart: new pools, a fresh detector; only PostgreSQL remembers the watch.
    let settings = env.settings(&[]);
    let store = Store::connect(&settings.store).await.expect("store");
    let inbox = Inbox::new(&settings.inbox, &env.names, env.tz).expect("inbox");
    let detector = LateDetector::new(
        inbox,
        store,
        common::shared(&env.clock),
        detect_cfg(&env, &[]),
        Duration::from_secs(3600),
    )
    .start();
    wait_for_late(&env, hole_a).await; // the round at start

    // A second hole released while it sleeps: the wake-up runs a round now, not in an hour.
    let hole_b = commit_after_release(
        &env,
        &flop(3, "F1", &[("STND", "S1")]),
        &flop(4, "F2", &[("STND", "S2")]),
    )
    .await;
    detector.do_send(HolesReleased {
        first: hole_b,
        last: hole_b,
        at: msgx_core::clock::Clock::now(&env.clock),
    });
    wait_for_late(&env, hole_b).await;

    let r = common::pipeline::ask(&detector, DetectNow).await;
    assert_eq!((r.checked, r.open), (0, 0));
    common::contract::check_stored_events(&env.store).await;
    env.cleanup().await;
}

async fn wait_for_late(env: &TestEnv, msg_id: i64) {
    for _ in 0..200 {
        if source_of(env, msg_id).await.as_deref() == Some("LATE") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{msg_id} was not enqueued as LATE");
}

#[tokio::test]
async fn watched_ids_are_checked_in_batches_and_closed_after_their_window() {
    let (_serial, env) = serial_env("late_expiry").await;
    env.insert_message(&flop(1, "F1", &[("GATE", "A1")])).await;
    let (tx2, id2) = open_message(&env, &flop(2, "F1", &[("STND", "S2")])).await;
    let (tx3, id3) = open_message(&env, &flop(3, "F1", &[("STND", "S3")])).await;
    let (tx4, id4) = open_message(&env, &flop(4, "F1", &[("STND", "S4")])).await;
    env.insert_message(&flop(5, "F1", &[("GATE", "A5")])).await;
    assert_eq!(release_hole(&env).await, (id2, id4));

    tx2.commit().await.expect("commit");
    tx3.rollback().await.expect("rollback: id 3 never arrives");
    let cfg = detect_cfg(&env, &[("MSGX_LATE__BATCH", "2")]);
    assert_eq!(cfg.batch, 2);
    let before = counter(DETECTED);
    let r = detect(&env, &cfg).await;
    assert_eq!((r.checked, r.open), (3, 2));
    assert_eq!(r.detected, hits(&[id2]));
    assert!(r.closed.is_empty());
    let now = msgx_core::clock::Clock::now(&env.clock);
    for id in [id3, id4] {
        let w = env
            .late_watch_entry(id)
            .await
            .expect("entry")
            .expect("open");
        assert_eq!((w.checked_at, w.detected_at), (Some(now), None));
    }

    // The window (7 days) passes. id 4 commits just before the final check.
    env.clock.advance(Duration::from_secs(7 * 24 * 3600));
    tx4.commit().await.expect("commit");
    let r = detect(&env, &cfg).await;
    assert_eq!(
        r.detected,
        hits(&[id4]),
        "a final check at expiry still finds it"
    );
    assert_eq!(r.closed, [(id3, id3)]);
    assert_eq!(r.open, 0);
    assert_eq!(counter(DETECTED) - before, 2.0);
    assert_eq!(env.late_watch_entry(id3).await.expect("entry"), None);
    assert_eq!(source_of(&env, id3).await, None);
    assert_eq!(source_of(&env, id4).await.as_deref(), Some("LATE"));
    // Detected entries stay as the record of late arrivals.
    assert!(env
        .late_watch_entry(id2)
        .await
        .expect("entry")
        .is_some_and(|w| w.detected_at.is_some()));

    let r = detect(&env, &cfg).await;
    assert_eq!((r.checked, r.detected.len(), r.closed.len()), (0, 0, 0));
    common::contract::check_stored_events(&env.store).await;
    env.cleanup().await;
}

#[tokio::test]
async fn an_unreachable_inbox_keeps_the_watch_intact() {
    let (_serial, env) = serial_env("late_unreach").await;
    // The detector's own way to the inbox, cut below.
    let ProxiedInbox {
        proxy,
        settings,
        inbox: via_proxy,
    } = env.inbox_via_proxy(QUICK_INBOX).await;
    let hole = commit_after_release(
        &env,
        &flop(1, "F1", &[("GATE", "A1")]),
        &flop(2, "F1", &[("STND", "S2")]),
    )
    .await;

    let cfg = DetectConfig::from_settings(&settings);
    proxy.cut();
    // Even past its window: an id is never closed without a successful check.
    env.clock.advance(Duration::from_secs(8 * 24 * 3600));
    let before = counter(DETECTED);
    for _ in 0..2 {
        let err = detect_once(&via_proxy, &env.store, &env.clock, &cfg)
            .await
            .expect_err("inbox unreachable");
        assert!(matches!(err, DetectError::Inbox(_)), "{err}");
    }
    let w = env
        .late_watch_entry(hole)
        .await
        .expect("entry")
        .expect("still watched");
    assert_eq!((w.checked_at, w.detected_at), (None, None));
    assert_eq!(env.store.late_watch_open().await.expect("open"), 1);
    assert_eq!(source_of(&env, hole).await, None);
    assert_eq!(counter(DETECTED), before);

    proxy.restore();
    let r = detect_once(&via_proxy, &env.store, &env.clock, &cfg)
        .await
        .expect("round");
    assert_eq!(r.detected, hits(&[hole]));
    assert_eq!(source_of(&env, hole).await.as_deref(), Some("LATE"));
    common::contract::check_stored_events(&env.store).await;
    env.cleanup().await;
}
