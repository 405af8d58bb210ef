//! Issue 53: exactly-once at its edges, each sequence driven round by round as in
//! `identity.rs`:
//! - a dead-letter topic created by its first dead letter (no partition, so no cursor, at
//!   start): a committed copy whose DEAD was never written is found by the next start, not
//!   copied again. On librdkafka's mock cluster, which creates a topic on first use (with its
//!   default 4 partitions); nothing is aborted in it, so "committed" is what the log holds.
//!   The same code path serves a partition added to a topic after the start (neither tansu
//!   nor the mock can grow a topic's partitions).
//! - another producer's transaction left open on the events topic (a neighbour on a shared
//!   topic): it holds the last stable offset below a round of ours committed after it; the
//!   start after a crash waits for it to end and recovers the round instead of sending it
//!   again. On tansu, which holds a `read_committed` reader at the last stable offset as Kafka
//!   does (it returns aborted records to such a reader, so the neighbour's are in the log
//!   either way: the checks count our events only).
//! - the same on the dead-letter topic after an operator's requeue: no start takes the
//!   requeue back, before or after the neighbour's transaction ends (the floor the requeue
//!   raised never goes down). On tansu.
//! - a store failure writing the cursor before a commit gives the producer up (as the fence
//!   check does), so the batch is never aborted and sent again. On the mock cluster, which
//!   keeps an aborted transaction's records visible: that would show as a duplicate.
//! - at-least-once after a rolling upgrade: the start takes the previous release's records
//!   (and no record of this release's) while an event an earlier release made is PENDING, so
//!   an event the previous release delivered is not sent again under its UUID. On the mock
//!   cluster (records outside transactions: any broker shows them alike); the same with the
//!   previous release's own binary is `tests/upgrade.rs`.

use std::time::{Duration, Instant};

use msgx_core::clock::Clock;
use msgx_core::dispatch::{txn, DispatchError};
use msgx_testkit::audit;
use msgx_testkit::dispatch_round::round;
use msgx_testkit::kafka::RawMock;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;

use super::identity::{assert_each_once, read_all, seed, Holder};
use super::{tansu, DLQ, TOPIC};

/// Another producer's transaction, open, with one record on each of `partitions` partitions
/// of `topic`.
async fn open_neighbour(bootstrap: &str, topic: &'static str, partitions: i32) -> BaseProducer {
    let b = bootstrap.to_string();
    tokio::task::spawn_blocking(move || {
        let p: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &b)
            .set("transactional.id", "a-neighbour")
            .set("transaction.timeout.ms", "60000")
            .create()
            .expect("neighbour producer");
        p.init_transactions(Duration::from_secs(10))
            .expect("neighbour init");
        p.begin_transaction().expect("neighbour begin");
        for part in 0..partitions {
            let headers = OwnedHeaders::new().insert(Header {
                key: "ce_id",
                value: Some("not-ours"),
            });
            let rec = BaseRecord::to(topic)
                .partition(part)
                .key("neighbour")
                .payload("open")
                .headers(headers);
            p.send(rec).map_err(|(e, _)| e).expect("neighbour send");
        }
        p.flush(Duration::from_secs(10)).expect("neighbour flush");
        p
    })
    .await
    .expect("neighbour")
}

/// The recorded scan floors of `topic`.
async fn floors(h: &Holder, topic: &str) -> Vec<(i32, i64)> {
    h.env
        .rows(&format!(
            "SELECT kafka_partition, next_offset FROM dispatch_scan_floor WHERE topic = '{topic}'"
        ))
        .await
}

/// Aborts the neighbour's transaction after `after` (in the background).
fn abort_after(p: BaseProducer, after: Duration) -> tokio::task::JoinHandle<()> {
    tokio::task::spawn_blocking(move || {
        std::thread::sleep(after);
        p.abort_transaction(Duration::from_secs(10))
            .expect("neighbour abort");
    })
}

#[tokio::test]
async fn a_dead_letter_topic_created_on_first_use_is_read_back_after_a_crash() {
    let mock = RawMock::new(1, &[(TOPIC, 3)]);
    let b = mock.bootstrap();
    let mut h = Holder::new("edge_dlq_first", &b, &[]).await;
    let ids = seed(&h.env, 7, 7).await;
    let dead: Vec<i64> = ids[..3].to_vec();
    h.env
        .exec_with(
            "UPDATE msg_event SET attempts = 100, last_error = 'refused' WHERE event_id = ANY($1)",
            |q| q.bind(&dead),
        )
        .await;
    h.prepare().await.expect("start");
    let floors: i64 = h
        .env
        .scalar(&format!(
            "SELECT count(*) FROM dispatch_scan_floor WHERE topic = '{DLQ}'"
        ))
        .await;
    assert_eq!(floors, 0, "no dead-letter partition existed at start");
    // One transaction: 4 events and the first 3 dead-letter copies (creating the topic); the
    // "crash" comes before SENT/DEAD is written.
    assert_eq!(h.round().await, 4);
    let (_old, r) = h.restart().await;
    assert_eq!(
        (r.sent, r.dead),
        (4, 3),
        "the round is recovered on both topics: {r:?}"
    );
    h.drain().await;
    assert_eq!(h.count("DEAD").await, 3);
    let got = read_all(&b, DLQ, 3).await;
    assert_eq!(got.len(), 3, "each dead letter copied once: {got:?}");
    h.env.cleanup().await;
}

#[tokio::test]
async fn a_neighbours_open_transaction_is_waited_out_before_the_start_decides() {
    let broker = tansu();
    let b = broker.bootstrap.clone();
    let wait = [("MSGX_KAFKA__OPEN_TRANSACTION_WAIT", "60s")];
    let mut h = Holder::new("edge_open", &b, &wait).await;
    let ids = seed(&h.env, 14, 2).await;
    h.prepare().await.expect("start");
    let neighbour = open_neighbour(&b, TOPIC, 3).await;
    // Our round commits behind the neighbour's open transaction; the crash comes before SENT.
    assert_eq!(h.round().await, 7);
    let ended = abort_after(neighbour, Duration::from_secs(2));
    let started = Instant::now();
    let (_old, r) = h.restart().await;
    ended.await.expect("neighbour ended");
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "the start waited for the open transaction: {:?}",
        started.elapsed()
    );
    assert_eq!(r.sent, 7, "the committed round is recovered: {r:?}");
    h.drain().await;
    let got = read_all(&b, TOPIC, ids.len() + 3).await;
    assert_each_once(&h.identities().await, &got, "behind an open transaction");
    h.env.cleanup().await;
}

#[tokio::test]
async fn a_requeue_survives_a_neighbours_open_transaction_on_the_dead_letter_topic() {
    let broker = tansu();
    let b = broker.bootstrap.clone();
    let wait = [("MSGX_KAFKA__OPEN_TRANSACTION_WAIT", "60s")];
    let mut h = Holder::new("edge_requeue", &b, &wait).await;
    let ids = seed(&h.env, 20, 4).await;
    let dead: Vec<i64> = ids.iter().copied().filter(|id| id % 4 == 0).collect();
    h.env
        .exec_with(
            "UPDATE msg_event SET attempts = 100, last_error = 'refused' WHERE event_id = ANY($1)",
            |q| q.bind(&dead),
        )
        .await;
    h.prepare().await.expect("start");
    let neighbour = open_neighbour(&b, DLQ, 3).await;
    h.drain().await;
    assert_eq!(h.count("DEAD").await, dead.len() as i64);
    let req = h
        .env
        .store
        .requeue_dead_events(&dead, audit("ops", "fixed"), DLQ, h.env.clock.now())
        .await
        .expect("requeue");
    assert_eq!(req.requeued, dead);
    let raised: Vec<(i32, i64)> = floors(&h, DLQ).await;
    // A start while the neighbour's transaction is open, and one after it ended.
    let ended = abort_after(neighbour, Duration::from_secs(2));
    let (_old, first) = h.restart().await;
    ended.await.expect("neighbour ended");
    let (_older, second) = h.restart().await;
    assert_eq!(
        (first.dead, second.dead),
        (0, 0),
        "the requeue is not taken back: {first:?} {second:?}"
    );
    assert_eq!(h.count("DEAD").await, 0);
    let now: Vec<(i32, i64)> = floors(&h, DLQ).await;
    for (p, o) in &raised {
        let after = now.iter().find(|f| f.0 == *p).map(|f| f.1);
        assert!(
            after.is_some_and(|a| a >= *o),
            "partition {p}: the floor the requeue raised to {o} never goes down: {after:?}"
        );
    }
    h.drain().await;
    assert_eq!(h.count("SENT").await, ids.len() as i64);
    let got = read_all(&b, TOPIC, ids.len()).await;
    assert_each_once(&h.identities().await, &got, "after the requeue");
    h.env.cleanup().await;
}

/// Exhausts `ids` (their next round copies them to the dead-letter topic).
async fn exhaust(h: &Holder, ids: &[i64]) {
    h.env
        .exec_with(
            "UPDATE msg_event SET attempts = 100, last_error = 'refused' WHERE event_id = ANY($1)",
            |q| q.bind(ids),
        )
        .await;
}

async fn requeue(h: &Holder, ids: &[i64]) {
    let r = h
        .env
        .store
        .requeue_dead_events(ids, audit("ops", "fixed"), DLQ, h.env.clock.now())
        .await
        .expect("requeue");
    assert_eq!(r.requeued, ids);
}

#[tokio::test]
async fn a_dead_letter_has_its_own_identity_so_a_requeued_event_is_kept() {
    // Both modes build the copy the same way; at-least-once here, on tansu.
    let broker = tansu();
    let b = broker.bootstrap.clone();
    let alo = [("MSGX_KAFKA__DELIVERY", "at-least-once")];
    let mut h = Holder::new("edge_dl_identity", &b, &alo).await;
    let ids = seed(&h.env, 4, 4).await;
    let dead = vec![ids[0]];
    // It dies, is requeued, dies again, is requeued and delivered.
    for _ in 0..2 {
        exhaust(&h, &dead).await;
        h.drain().await;
        assert_eq!(h.count("DEAD").await, 1);
        requeue(&h, &dead).await;
    }
    h.drain().await;
    assert_eq!(h.count("SENT").await, 4);
    let event_ce_id = h.identities().await[&dead[0]].clone();
    let letters = read_all(&b, DLQ, 2).await;
    let events = read_all(&b, TOPIC, 4).await;
    assert_eq!(letters.len(), 2, "{letters:?}");
    for l in &letters {
        assert_ne!(l.ce_id(), event_ce_id, "a dead letter's own ce_id");
        assert_eq!(l.headers["ce_msgxoriginalid"], event_ce_id);
    }
    assert_ne!(
        letters[0].ce_id(),
        letters[1].ce_id(),
        "each death is a dead letter of its own"
    );
    // A sink with one de-duplication store over both topics (the dead letters came first).
    let mut seen = std::collections::HashSet::new();
    for r in letters.iter().chain(&events) {
        seen.insert((r.headers["ce_source"].clone(), r.ce_id().to_string()));
    }
    assert_eq!(
        seen.len(),
        2 + 4,
        "every event kept beside its dead letters"
    );
    assert_each_once(&h.identities().await, &events, "main topic");
    h.env.cleanup().await;
}

/// Sends one record outside any transaction with these headers (what the previous release's
/// producer wrote).
async fn send_plain(
    bootstrap: &str,
    topic: &'static str,
    key: String,
    headers: Vec<(String, String)>,
) {
    let b = bootstrap.to_string();
    tokio::task::spawn_blocking(move || {
        let p: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &b)
            .set("enable.idempotence", "true")
            .create()
            .expect("producer");
        let h = headers.iter().fold(OwnedHeaders::new(), |h, (k, v)| {
            h.insert(Header {
                key: k,
                value: Some(v.as_str()),
            })
        });
        let rec = BaseRecord::to(topic).key(&key).payload("{}").headers(h);
        p.send(rec).map_err(|(e, _)| e).expect("send");
        p.flush(Duration::from_secs(10)).expect("flush");
    })
    .await
    .expect("send");
}

/// The headers the previous release (6d86680, `src/dispatch/cloudevents.rs`) gave event
/// `event_id`: its number as `ce_id`, no `ce_msgxevent`, the compiled `ce_source`.
fn previous_release_headers(
    event_id: i64,
    msg_id: i64,
    key: &str,
    created_at: chrono::DateTime<chrono::Utc>,
) -> Vec<(String, String)> {
    let time = created_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    [
        ("ce_specversion", "1.0".to_string()),
        ("ce_id", event_id.to_string()),
        ("ce_source", "/msgexchange".to_string()),
        ("ce_type", "msgx.flight_updated".to_string()),
        ("ce_time", time),
        ("ce_subject", key.to_string()),
        ("content-type", "application/json".to_string()),
        ("ce_msgxmsgid", msg_id.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

#[tokio::test]
async fn a_record_the_previous_release_sent_is_recognised_not_sent_again() {
    // The previous release is stood in for by its records (headers as it wrote them), sent
    // outside a transaction as its at-least-once producer did; on tansu.
    let broker = tansu();
    let b = broker.bootstrap.clone();
    let mut h = Holder::new("edge_prev", &b, &[]).await;
    let ids = seed(&h.env, 3, 3).await;
    h.prepare().await.expect("start");
    let (msg_id, key, created_at): (i64, String, chrono::DateTime<chrono::Utc>) = h
        .env
        .rows(&format!(
            "SELECT msg_id, flight_key, created_at FROM msg_event WHERE event_id = {}",
            ids[0]
        ))
        .await
        .remove(0);
    // It delivered our first event and stopped before writing SENT; another store's previous
    // release sent its own event with the same number.
    let ours = previous_release_headers(ids[0], msg_id, &key, created_at);
    send_plain(&b, TOPIC, key.clone(), ours).await;
    let theirs = previous_release_headers(ids[0], msg_id + 1000, &key, created_at);
    send_plain(&b, TOPIC, key.clone(), theirs).await;
    let (_old, r) = h.restart().await;
    assert_eq!((r.sent, r.others), (1, 1), "{r:?}");
    h.drain().await;
    let got = read_all(&b, TOPIC, 4).await;
    assert_eq!(got.len(), 4, "our first event not sent again: {got:?}");
    let uuid = h.identities().await[&ids[0]].clone();
    assert!(got.iter().all(|r| r.ce_id() != uuid), "{got:?}");
    h.env.cleanup().await;
}

#[tokio::test]
async fn a_pending_row_without_identities_is_delivered_not_stuck() {
    let mock = RawMock::new(1, &[(TOPIC, 3), (DLQ, 3)]);
    let b = mock.bootstrap();
    let mut h = Holder::new("edge_null_id", &b, &[]).await;
    let ids = seed(&h.env, 3, 3).await;
    // What the previous release's requeue of a DEAD row older than migration 0018 leaves.
    h.env
        .exec_with(
            "UPDATE msg_event SET ce_id = NULL, dead_ce_id = NULL WHERE event_id = $1",
            |q| q.bind(ids[0]),
        )
        .await;
    h.prepare().await.expect("start");
    h.drain().await;
    assert_eq!(h.count("SENT").await, 3);
    let missing: i64 = h
        .env
        .scalar("SELECT count(*) FROM msg_event WHERE ce_id IS NULL OR dead_ce_id IS NULL")
        .await;
    assert_eq!(missing, 0, "the identity made is kept");
    let got = read_all(&b, TOPIC, 3).await;
    assert_each_once(&h.identities().await, &got, "with a made identity");
    h.env.cleanup().await;
}

/// The headers this release gives event `event_id` (`ce_id` its UUID, `ce_msgxevent` its
/// number), as a record an at-least-once round sent before a crash carries them.
fn current_headers(event_id: i64, ce_id: &str) -> Vec<(String, String)> {
    [
        ("ce_specversion", "1.0".to_string()),
        ("ce_id", ce_id.to_string()),
        ("ce_source", "/test".to_string()),
        ("ce_msgxevent", event_id.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The at-least-once start's read-back, as the dispatcher runs it.
async fn read_back(h: &Holder) -> Result<txn::Recovered, DispatchError> {
    let d = &h.d;
    txn::recover_previous_release(&h.env.store, &h.env.clock, &d.kafka, &d.bootstrap, &d.cfg).await
}

#[tokio::test]
async fn an_at_least_once_start_takes_the_previous_releases_records_only() {
    // At-least-once after a rolling upgrade (item 3): the previous release delivered our first
    // event and stopped before SENT; a crash of this release left our second event acked and
    // unwritten. The start writes the first SENT (never sent again under its UUID) and leaves
    // the second to be sent again (at-least-once: the same identity). The previous release
    // stood in for by its records; on the mock cluster.
    let mock = RawMock::new(1, &[(TOPIC, 3), (DLQ, 3)]);
    let b = mock.bootstrap();
    let alo = [("MSGX_KAFKA__DELIVERY", "at-least-once")];
    let mut h = Holder::new("edge_alo_prev", &b, &alo).await;
    let ids = seed(&h.env, 3, 3).await;
    let (msg_id, key, created_at): (i64, String, chrono::DateTime<chrono::Utc>) = h
        .env
        .rows(&format!(
            "SELECT msg_id, flight_key, created_at FROM msg_event WHERE event_id = {}",
            ids[0]
        ))
        .await
        .remove(0);
    let prev = previous_release_headers(ids[0], msg_id, &key, created_at);
    send_plain(&b, TOPIC, key.clone(), prev).await;
    let uuids = h.identities().await;
    send_plain(
        &b,
        TOPIC,
        "k".into(),
        current_headers(ids[1], &uuids[&ids[1]]),
    )
    .await;
    // Every event made by this release: nothing to look for, nothing read.
    let none = read_back(&h).await.expect("read-back");
    assert_eq!(none, txn::Recovered::default(), "no read without a reason");
    // The first two were made by the previous release (the pump of this one marks its own).
    h.env
        .exec_with(
            "UPDATE msg_event SET made_by_uuid_release = NULL WHERE event_id = ANY($1)",
            |q| q.bind(&ids[..2]),
        )
        .await;
    let r = read_back(&h).await.expect("read-back");
    assert_eq!(
        (r.sent, r.dead),
        (1, 0),
        "the previous release's record only: {r:?}"
    );
    h.drain().await;
    assert_eq!(h.count("SENT").await, 3);
    let got = read_all(&b, TOPIC, 4).await;
    let first: Vec<&str> = got
        .iter()
        .filter(|r| r.headers.get("ce_msgxevent") == Some(&ids[0].to_string()))
        .map(|r| r.ce_id())
        .collect();
    assert!(first.is_empty(), "our first event not sent again: {got:?}");
    let second = got.iter().filter(|r| r.ce_id() == uuids[&ids[1]]).count();
    assert_eq!(
        second, 2,
        "our own record is sent again, same identity: {got:?}"
    );
    // Written: the next start has nothing to look for.
    let again = read_back(&h).await.expect("read-back");
    assert_eq!(again.read, 0, "{again:?}");
    h.env.cleanup().await;
}

#[tokio::test]
async fn a_store_failure_before_the_commit_gives_the_producer_up() {
    // The cursor written before the commit (a store statement) fails: the transaction is left
    // to the next producer's start, as at the fence check, not aborted and sent again. The mock
    // cluster keeps an aborted transaction's records visible (as tansu does): a batch aborted
    // and sent again would be in its log twice (issue 53's r14 duplicates).
    let mock = RawMock::new(1, &[(TOPIC, 3), (DLQ, 3)]);
    let b = mock.bootstrap();
    let mut h = Holder::new("edge_cursor_fails", &b, &[]).await;
    let ids = seed(&h.env, 7, 7).await;
    h.prepare().await.expect("start");
    h.env
        .exec(
            "CREATE FUNCTION refuse_floor() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$; \
             CREATE TRIGGER refuse_floor BEFORE INSERT ON dispatch_scan_floor \
             FOR EACH STATEMENT EXECUTE FUNCTION refuse_floor();",
        )
        .await;
    let Holder { env, d, p, state } = &mut h;
    let e = round(&env.store, p, &env.clock, &d.cfg, state)
        .await
        .expect_err("the round fails");
    assert!(e.producer_fatal(), "the producer is given up: {e}");
    h.env
        .exec("DROP TRIGGER refuse_floor ON dispatch_scan_floor")
        .await;
    let (_old, r) = h.restart().await;
    assert_eq!(
        r.sent, 7,
        "the open transaction's records are read back: {r:?}"
    );
    h.drain().await;
    let got = read_all(&b, TOPIC, ids.len()).await;
    assert_eq!(
        got.len(),
        ids.len(),
        "the batch is in the log once: {got:?}"
    );
    assert_each_once(&h.identities().await, &got, "after a failed cursor write");
    h.env.cleanup().await;
}
