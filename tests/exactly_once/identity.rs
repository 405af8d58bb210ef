//! Issue 40: one identity per event, for all time. Each sequence of the issue, driven round by
//! round as the dispatcher drives them (the exactly-once start `txn::prepare`, then rounds
//! whose outcome is written during the next one), on a real broker (tansu) unless the sequence
//! needs a latency only librdkafka's mock cluster can inject:
//! - a rebuilt store (a second deployment) on the events topic another store already wrote,
//!   with committed rounds of both left unrecorded by a "crash": each store recovers its own
//!   records and none of the other's, nothing is lost or doubled, and a consumer that
//!   de-duplicates on (`ce_source`, `ce_id`) keeps every event of both;
//! - an operator's requeue of DEAD events, then a restart: the recovery does not find their
//!   old dead-letter copies and take the requeue back;
//! - a commit whose `EndTxn` is answered after the commit call timed out: the commit is called
//!   again, never aborted and re-sent (the batch would be in the log twice);
//! - two holders with different `client_id`s: one `transactional.id` (the recorded one), so
//!   the second fences the first; a holder configured with another id is refused;
//! - a recreated topic: the recovery reads the new topic from its start.
//!
//! Which records committed: tansu returns aborted records to `read_committed` readers, so
//! "committed" cannot be read off the topic there. These sequences abort nothing on tansu (no
//! send fails, no commit fails: a round either commits or is cut by the "crash" after its
//! commit), so every record in the log is a committed one and "exactly once in the log" is the
//! check; the one sequence that leaves a commit in doubt runs on the mock cluster, where no
//! transaction is aborted either (the commit is resolved, not abandoned).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use msgx_actors::app::DispatchDeps;
use msgx_core::clock::Clock;
use msgx_core::dispatch::{txn, DispatchError, DispatchState};
use msgx_core::kafka::EventProducer;
use msgx_testkit::dispatch_round::round;
use msgx_testkit::kafka::{consume, RawMock, Received};
use msgx_testkit::{audit, pg_admin, TestEnv};
use rdkafka::types::RDKafkaApiKey;

use super::{tansu, DLQ, TOPIC};

/// A store's dispatcher driven by hand: its env, deps, producer and carried state.
pub(super) struct Holder {
    pub(super) env: TestEnv,
    pub(super) d: DispatchDeps,
    pub(super) p: EventProducer,
    pub(super) state: DispatchState,
}

impl Holder {
    /// A fresh store (`tag`) on `bootstrap` in exactly-once mode, with these overrides.
    pub(super) async fn new(tag: &str, bootstrap: &str, extra: &[(&str, &str)]) -> Self {
        let env = TestEnv::new(tag).await;
        let mut all = vec![
            ("MSGX_KAFKA__DELIVERY", "exactly-once"),
            ("MSGX_KAFKA__TRANSACTION_TIMEOUT", "10s"),
            ("MSGX_DISPATCH__BATCH", "7"),
        ];
        all.extend_from_slice(extra);
        let d = env.dispatch_deps(bootstrap, &all);
        let p = EventProducer::new(&d.kafka, &d.bootstrap).expect("producer");
        Self {
            env,
            d,
            p,
            state: DispatchState::default(),
        }
    }

    /// The exactly-once start, as the dispatcher runs it.
    pub(super) async fn prepare(&mut self) -> Result<txn::Recovered, DispatchError> {
        let (d, clock) = (&self.d, &self.env.clock);
        txn::prepare(
            &self.env.store,
            &mut self.p,
            clock,
            &d.kafka,
            &d.bootstrap,
            &d.cfg,
        )
        .await
    }

    /// A crash and a restart: what the rounds learned and did not write is lost, a new
    /// producer starts over. The old producer is returned (the caller drops it when it likes).
    pub(super) async fn restart(&mut self) -> (EventProducer, txn::Recovered) {
        self.state = DispatchState::default();
        let fresh = EventProducer::new(&self.d.kafka, &self.d.bootstrap).expect("producer");
        let old = std::mem::replace(&mut self.p, fresh);
        let r = self.prepare().await.expect("exactly-once start");
        (old, r)
    }

    /// One round; its outcome stays unwritten until the next round (or is lost by a restart).
    pub(super) async fn round(&mut self) -> usize {
        let r = self
            .env
            .dispatch_round(&mut self.p, &self.d.cfg, &mut self.state)
            .await;
        r.report.acked
    }

    /// Rounds until every event is SENT or DEAD and written.
    pub(super) async fn drain(&mut self) {
        let (p, cfg) = (&mut self.p, &self.d.cfg);
        self.env.drain_events(p, cfg, &mut self.state, 200).await;
    }

    /// (event id → ce_id) of every event of this store.
    pub(super) async fn identities(&self) -> HashMap<i64, String> {
        self.env
            .rows::<(i64, String)>("SELECT event_id, ce_id::text FROM msg_event")
            .await
            .into_iter()
            .collect()
    }

    pub(super) async fn count(&self, state: &str) -> i64 {
        self.env
            .count(&format!(
                "SELECT count(*) FROM msg_event WHERE state = '{state}'"
            ))
            .await
    }
}

/// `n` events on `flights` keys, seeded as the pump commits them.
pub(super) async fn seed(env: &TestEnv, n: i64, flights: i64) -> Vec<i64> {
    let keys: Vec<String> = (0..n).map(|i| format!("FL{:02}", i % flights)).collect();
    env.seed_events(&keys).await
}

pub(super) async fn read_all(
    bootstrap: &str,
    topic: &'static str,
    at_least: usize,
) -> Vec<Received> {
    let b = bootstrap.to_string();
    tokio::task::spawn_blocking(move || consume(&b, topic, 3, at_least))
        .await
        .expect("consumer")
}

/// Records per `ce_id` among `records`.
pub(super) fn copies(records: &[Received]) -> HashMap<String, usize> {
    let mut out = HashMap::new();
    for r in records {
        *out.entry(r.ce_id().to_string()).or_insert(0) += 1;
    }
    out
}

/// Each of `store`'s events exactly once in `records`, and (by `ce_id`) in key order.
pub(super) fn assert_each_once(store: &HashMap<i64, String>, records: &[Received], what: &str) {
    let n = copies(records);
    for (event_id, ce_id) in store {
        assert_eq!(
            n.get(ce_id).copied().unwrap_or(0),
            1,
            "{what}: event {event_id} ({ce_id}) once on the topic"
        );
    }
}

#[tokio::test]
async fn a_rebuilt_store_on_a_shared_topic_loses_nothing_and_takes_nothing() {
    let broker = tansu();
    let b = broker.bootstrap.clone();
    // Two deployments on one topic: their event numbers (BIGSERIAL) both start at 1.
    let mut one = Holder::new(
        "eid_one",
        &b,
        &[("MSGX_KAFKA__TRANSACTIONAL_ID", "site-one")],
    )
    .await;
    let mut two = Holder::new(
        "eid_two",
        &b,
        &[("MSGX_KAFKA__TRANSACTIONAL_ID", "site-two")],
    )
    .await;
    seed(&one.env, 30, 5).await;
    one.prepare().await.expect("store 1 starts");
    one.drain().await;
    // Store 2 made its events while it could not reach the broker, then starts.
    seed(&two.env, 30, 5).await;
    let first = two.prepare().await.expect("store 2 starts");
    assert_eq!(
        first.sent, 0,
        "nothing of store 1 taken for store 2's: {first:?}"
    );
    // Both deliver a round, interleaved on the topic, and both "crash" before writing SENT.
    seed(&one.env, 14, 5).await;
    assert_eq!(one.round().await, 7);
    assert_eq!(two.round().await, 7);
    let (_old_two, r2) = two.restart().await;
    let (_old_one, r1) = one.restart().await;
    assert_eq!(r2.sent, 7, "store 2 recovered its own round: {r2:?}");
    assert!(r2.others >= 7, "and skipped store 1's records: {r2:?}");
    assert_eq!(r1.sent, 7, "store 1 recovered its own round: {r1:?}");
    assert!(r1.others >= 7, "and skipped store 2's records: {r1:?}");
    two.drain().await;
    one.drain().await;
    assert_eq!((one.count("SENT").await, two.count("SENT").await), (44, 30));

    let got = read_all(&b, TOPIC, 74).await;
    let (ids1, ids2) = (one.identities().await, two.identities().await);
    assert_eq!(got.len(), 74, "nothing doubled in the log");
    assert_each_once(&ids1, &got, "store 1");
    assert_each_once(&ids2, &got, "store 2");
    // A consumer de-duplicating on (ce_source, ce_id) keeps all of both.
    let kept: HashSet<(String, String)> = got
        .iter()
        .map(|r| (r.headers["ce_source"].clone(), r.ce_id().to_string()))
        .collect();
    assert_eq!(kept.len(), 74);
    for h in [one, two] {
        h.env.cleanup().await;
    }
}

#[tokio::test]
async fn at_least_once_two_stores_on_one_topic_keep_every_event_for_a_deduplicating_consumer() {
    let broker = tansu();
    let b = broker.bootstrap.clone();
    let alo = [("MSGX_KAFKA__DELIVERY", "at-least-once")];
    let mut one = Holder::new("eid_alo_one", &b, &alo).await;
    let mut two = Holder::new("eid_alo_two", &b, &alo).await;
    // The same event numbers (1..=25) in both stores, and the same ce_source: only the UUIDs
    // tell the events apart.
    seed(&one.env, 25, 5).await;
    seed(&two.env, 25, 5).await;
    one.drain().await;
    two.drain().await;
    let got = read_all(&b, TOPIC, 50).await;
    let mut seen = HashSet::new();
    let kept = got
        .iter()
        .filter(|r| seen.insert((r.headers["ce_source"].clone(), r.ce_id().to_string())))
        .count();
    assert_eq!(
        kept, 50,
        "a consumer de-duplicating on (ce_source, ce_id) keeps all of both"
    );
    assert_each_once(&one.identities().await, &got, "store 1");
    assert_each_once(&two.identities().await, &got, "store 2");
    for h in [one, two] {
        h.env.cleanup().await;
    }
}

#[tokio::test]
async fn an_operators_requeue_survives_a_restart() {
    let broker = tansu();
    let mut h = Holder::new("eid_requeue", &broker.bootstrap, &[]).await;
    let ids = seed(&h.env, 20, 4).await;
    // Five events exhausted their attempts: the first round copies them to the DLQ → DEAD.
    let dead: Vec<i64> = ids.iter().copied().filter(|id| id % 4 == 0).collect();
    h.env
        .exec_with(
            "UPDATE msg_event SET attempts = 100, last_error = 'refused' WHERE event_id = ANY($1)",
            |q| q.bind(&dead),
        )
        .await;
    h.prepare().await.expect("start");
    h.drain().await;
    assert_eq!(h.count("DEAD").await, dead.len() as i64);
    let req = h
        .env
        .store
        .requeue_dead_events(
            &dead,
            audit("ops", "the downstream fixed its schema"),
            DLQ,
            h.env.clock.now(),
        )
        .await
        .expect("requeue");
    assert_eq!(req.requeued, dead);
    // A restart (the next dispatcher start after a deploy): the old dead-letter copies are
    // committed records of ours on the DLQ, below the floor the requeue raised.
    let (_old, r) = h.restart().await;
    assert_eq!(r.dead, 0, "the requeue is not taken back: {r:?}");
    assert_eq!(h.count("DEAD").await, 0);
    h.drain().await;
    assert_eq!(h.count("SENT").await, ids.len() as i64);
    let got = read_all(&broker.bootstrap, TOPIC, ids.len()).await;
    assert_eq!(got.len(), ids.len());
    assert_each_once(&h.identities().await, &got, "after the requeue");
    h.env.cleanup().await;
}

/// A holder (`tag`) on a mock cluster of its own whose commit call waits 4 s
/// (`transaction_timeout`): [`slow_next_commit`] makes the broker answer the next EndTxn past it.
async fn slow_commit_holder(tag: &str) -> (RawMock, String, Holder) {
    let mock = RawMock::new(1, &[(TOPIC, 3), (DLQ, 3)]);
    let b = mock.bootstrap();
    let extra = [
        ("MSGX_KAFKA__TRANSACTION_TIMEOUT", "4s"),
        ("MSGX_KAFKA__DELIVERY_TIMEOUT", "3s"),
    ];
    let h = Holder::new(tag, &b, &extra).await;
    (mock, b, h)
}

/// The broker answers the next EndTxn after 6 s, past the 4 s commit wait.
fn slow_next_commit(mock: &RawMock) {
    mock.delay_next(1, RDKafkaApiKey::EndTxn, 1, Duration::from_secs(6));
}

#[tokio::test]
async fn a_commit_that_times_out_is_called_again_not_resent() {
    let (mock, b, mut h) = slow_commit_holder("eid_commit").await;
    let ids = seed(&h.env, 21, 3).await;
    h.prepare().await.expect("start");
    assert_eq!(h.round().await, 7);
    slow_next_commit(&mock);
    let started = std::time::Instant::now();
    assert_eq!(h.round().await, 7, "the slow commit resolved as committed");
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "the commit did time out once: {:?}",
        started.elapsed()
    );
    h.drain().await;
    let got = read_all(&b, TOPIC, ids.len()).await;
    assert_eq!(got.len(), ids.len(), "the batch is in the log once");
    assert_each_once(&h.identities().await, &got, "after the slow commit");
    h.env.cleanup().await;
}

/// A commit in doubt (its first call timed out) whose next fence check fails — the store
/// refuses connections meanwhile: the round gives its producer up instead of returning a store
/// error with the transaction left open (every later `begin_transaction` of that producer was
/// refused: found by the issue-41 oracle, a slow commit under a PostgreSQL cut). A new
/// producer's start settles it, and the batch is in the log once.
#[tokio::test]
async fn a_store_failure_inside_a_commit_in_doubt_gives_the_producer_up() {
    let (mock, b, mut h) = slow_commit_holder("eid_open").await;
    let ids = seed(&h.env, 14, 2).await;
    h.prepare().await.expect("start");
    slow_next_commit(&mock);
    let db = h.env.db.clone();
    let cut = async {
        // Inside the first commit call's 4 s wait.
        tokio::time::sleep(Duration::from_secs(1)).await;
        store_connections(&db, false).await;
    };
    let Holder { env, d, p, state } = &mut h;
    let (r, ()) = tokio::join!(round(&env.store, p, &env.clock, &d.cfg, state), cut);
    store_connections(&db, true).await;
    let e = r.expect_err("the round fails");
    assert!(e.producer_fatal(), "the producer is given up: {e}");
    assert!(e.to_string().contains("left open"), "{e}");
    // The pool's connections the cut ended fail once each, as the service's next start would
    // retry past them.
    for _ in 0..10 {
        if sqlx::query("SELECT 1")
            .execute(h.env.store.pool())
            .await
            .is_ok()
        {
            break;
        }
    }
    let (_old, _) = h.restart().await;
    h.drain().await;
    let got = read_all(&b, TOPIC, ids.len()).await;
    assert_eq!(got.len(), ids.len(), "the batch is in the log once");
    assert_each_once(
        &h.identities().await,
        &got,
        "after the producer was given up",
    );
    h.env.cleanup().await;
}

/// Lets the store's database take connections, or refuses them and ends those it has.
async fn store_connections(db: &str, allow: bool) {
    let admin = pg_admin().await.expect("postgres admin");
    sqlx::query(&format!(
        "ALTER DATABASE \"{db}\" ALLOW_CONNECTIONS {allow}"
    ))
    .execute(&admin)
    .await
    .expect("allow connections");
    if !allow {
        sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = $1 AND pid <> pg_backend_pid()",
        )
        .bind(db)
        .execute(&admin)
        .await
        .expect("end the store's connections");
    }
    admin.close().await;
}

#[tokio::test]
async fn holders_with_different_client_ids_share_the_recorded_transactional_id() {
    let broker = tansu();
    let b = broker.bootstrap.clone();
    let mut a = Holder::new("eid_fence", &b, &[("MSGX_KAFKA__CLIENT_ID", "host-a")]).await;
    seed(&a.env, 14, 2).await;
    a.prepare().await.expect("a starts");
    assert_eq!(a.p.transactional_id(), Some("host-a.msgx.flight-events"));
    assert_eq!(a.round().await, 7);
    // The standby on another host takes over the same store.
    let d = a.env.dispatch_deps(
        &b,
        &[
            ("MSGX_KAFKA__DELIVERY", "exactly-once"),
            ("MSGX_KAFKA__TRANSACTION_TIMEOUT", "10s"),
            ("MSGX_KAFKA__CLIENT_ID", "host-b"),
        ],
    );
    let mut pb = EventProducer::new(&d.kafka, &b).expect("producer b");
    let clock = &a.env.clock;
    txn::prepare(&a.env.store, &mut pb, clock, &d.kafka, &b, &d.cfg)
        .await
        .expect("b starts");
    assert_eq!(pb.transactional_id(), Some("host-a.msgx.flight-events"));
    // The old holder's producer is fenced by the broker: it delivers nothing more (its round
    // fails for good, or every send of it fails).
    let (p, cfg) = (&mut a.p, &a.d.cfg);
    match msgx_testkit::dispatch_round::round(&a.env.store, p, clock, cfg, &mut a.state).await {
        Err(e) => assert!(e.producer_fatal(), "{e}"),
        Ok(r) => assert_eq!(
            r.report.acked, 0,
            "a fenced producer's round: {:?}",
            r.report
        ),
    }
    // A holder configured with another id is refused, naming the recorded one.
    let d = a.env.dispatch_deps(
        &b,
        &[
            ("MSGX_KAFKA__DELIVERY", "exactly-once"),
            ("MSGX_KAFKA__TRANSACTION_TIMEOUT", "10s"),
            ("MSGX_KAFKA__TRANSACTIONAL_ID", "somewhere-else"),
        ],
    );
    let mut pc = EventProducer::new(&d.kafka, &b).expect("producer c");
    let refused = txn::prepare(&a.env.store, &mut pc, clock, &d.kafka, &b, &d.cfg)
        .await
        .expect_err("another transactional.id");
    assert!(
        matches!(refused, DispatchError::TransactionalId(_)),
        "{refused}"
    );
    assert!(
        refused.to_string().contains("host-a.msgx.flight-events"),
        "{refused}"
    );
    a.env.cleanup().await;
}

#[tokio::test]
async fn a_recreated_topic_is_read_from_its_start() {
    let first = tansu();
    let mut h = Holder::new("eid_recreate", &first.bootstrap, &[]).await;
    seed(&h.env, 21, 3).await;
    h.prepare().await.expect("start");
    h.drain().await;
    // The topic is recreated (here: the same names on a new broker), and a round commits on
    // the new topic before the floors move (their offsets lie below the old floors).
    drop(first);
    let second = tansu();
    let mut d = h.d.clone();
    d.bootstrap = second.bootstrap.clone();
    d.kafka.brokers = second.bootstrap.clone();
    h.d = d;
    // The producer the dispatcher had when the topic went (here: one on the new broker,
    // initialised but without a new start, so the floors stay the old topic's).
    h.p = EventProducer::new(&h.d.kafka, &h.d.bootstrap).expect("producer");
    txn::use_deployment_id(&h.env.store, &mut h.p, &h.env.clock, &h.d.kafka)
        .await
        .expect("the recorded id");
    h.p.init_transactions(Duration::from_secs(10))
        .await
        .expect("init");
    seed(&h.env, 7, 3).await;
    assert_eq!(h.round().await, 7);
    let above: i64 = h
        .env
        .scalar("SELECT count(*) FROM msg_event WHERE state = 'SENT' AND kafka_offset > 3")
        .await;
    assert!(
        above > 0,
        "the old topic's offsets lie above the new topic's end"
    );
    let (_old, r) = h.restart().await;
    assert_eq!(
        r.sent, 7,
        "found on the new topic below the old offsets: {r:?}"
    );
    let retired: i64 = h
        .env
        .scalar("SELECT count(*) FROM msg_event WHERE kafka_topic LIKE '%@retired-%'")
        .await;
    assert_eq!(
        retired, 21,
        "the old topic's offsets are retired, not read again"
    );
    // More rounds, another "crash": the next start reads from the new topic's own offsets.
    seed(&h.env, 7, 3).await;
    h.drain().await;
    seed(&h.env, 7, 3).await;
    assert_eq!(h.round().await, 7);
    let (_older, again) = h.restart().await;
    assert_eq!(again.sent, 7, "{again:?}");
    h.drain().await;
    let got = read_all(&second.bootstrap, TOPIC, 21).await;
    assert_eq!(got.len(), 21, "nothing re-sent");
    h.env.cleanup().await;
}
