//! Dispatcher (issue 5): MSG_EVENT → Kafka through librdkafka's mock cluster (a real
//! Kafka-protocol broker in this process), real PostgreSQL. Every event arrives, per-key order
//! holds, the CloudEvents headers de-duplicate, injected broker errors only delay, exhausted
//! events land on the dead-letter topic, a fatal producer error rebuilds the producer.

use msgx_testkit as common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use actix::Actor;
use common::dispatch::EXHAUST_FAST;
use common::dispatch_round::Round;
use common::kafka::{consume, inject_fatal_error, Received};
use common::TestEnv;
use msgx_actors::app::DispatchDeps;
use msgx_actors::dispatcher::Dispatcher;
use msgx_actors::messages::{DispatchNow, EventsQueued};
use msgx_core::clock::Clock;
use msgx_core::dispatch::{flush, DispatchConfig, DispatchState};
use msgx_core::kafka::EventProducer;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

const TOPIC: &str = "msgx.flight-events";
const DLQ: &str = "msgx.flight-events.dlq";
const PARTITIONS: i32 = 3;

/// A broker taken down and brought back re-listens on its old port: no other test of this
/// binary may open a listener meanwhile (an ephemeral port handed to a new mock cluster or to
/// tansu would make librdkafka abort). Tests that stop brokers hold this exclusively.
static PORTS: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// A mock cluster as the tests use it.
type Mock = MockCluster<'static, DefaultProducerContext>;

/// The shared side of [`PORTS`], held by a test that opens listeners but stops none.
type PortsShared = tokio::sync::RwLockReadGuard<'static, ()>;

/// The shared side of [`PORTS`], then a fresh env (`tag`) and a mock cluster of `brokers`
/// brokers.
async fn mock_env(tag: &str, brokers: i32) -> (PortsShared, TestEnv, Mock) {
    let ports = PORTS.read().await;
    let env = TestEnv::new(tag).await;
    (ports, env, mock(brokers))
}

/// The exclusive side of [`PORTS`] (the test stops brokers), then a fresh env (`tag`) and a
/// mock cluster of `brokers` brokers.
async fn exclusive_mock_env(
    tag: &str,
    brokers: i32,
) -> (tokio::sync::RwLockWriteGuard<'static, ()>, TestEnv, Mock) {
    let ports = PORTS.write().await;
    let env = TestEnv::new(tag).await;
    (ports, env, mock(brokers))
}

/// Overrides for batches of `n` events.
fn batch(n: &str) -> [(&str, &str); 1] {
    [("MSGX_DISPATCH__BATCH", n)]
}

fn mock(brokers: i32) -> Mock {
    let cluster = MockCluster::new(brokers).expect("mock cluster");
    for t in [TOPIC, DLQ] {
        cluster
            .create_topic(t, PARTITIONS, brokers.min(3))
            .expect("topic");
    }
    cluster
}

fn producer(d: &DispatchDeps) -> EventProducer {
    EventProducer::new(&d.kafka, &d.bootstrap).expect("producer")
}

fn keys(n: usize, distinct: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("FL{:03}", (i * 7) % distinct))
        .collect()
}

async fn states(env: &TestEnv) -> BTreeMap<String, i64> {
    let rows: Vec<(String, i64)> = env
        .rows("SELECT state, count(*) FROM msg_event GROUP BY state")
        .await;
    rows.into_iter().collect()
}

/// Per key, the first occurrence of each event id must ascend (duplicates allowed after).
fn assert_per_key_order(records: &[Received]) {
    let mut seen: HashSet<i64> = HashSet::new();
    let mut last: HashMap<&str, i64> = HashMap::new();
    for r in records_in_partition_order(records) {
        let id = r.event_id();
        if !seen.insert(id) {
            continue; // a duplicate: the consumer drops it by ce_id
        }
        if let Some(prev) = last.insert(&r.key, id) {
            assert!(prev < id, "key {} went {prev} then {id}", r.key);
        }
    }
}

/// Records in each partition's order (one key lives in one partition).
fn records_in_partition_order(records: &[Received]) -> Vec<&Received> {
    let mut by_part: BTreeMap<i32, Vec<&Received>> = BTreeMap::new();
    for r in records {
        by_part.entry(r.partition).or_default().push(r);
    }
    by_part.into_values().flatten().collect()
}

/// One dispatch run driven round by round: the env, deps on a broker, the seeded events, a
/// producer and the dispatcher's carried state — the set-up the round-driving tests share.
/// Fields drop in this order: the producer before the mock cluster it talks to, the port
/// guard last.
struct Rig {
    env: TestEnv,
    bootstrap: String,
    d: DispatchDeps,
    ids: Vec<i64>,
    p: EventProducer,
    state: DispatchState,
    /// The mock cluster, when the rig made its own ([`Rig::on_mock`]).
    cluster: Option<Mock>,
    /// The shared side of [`PORTS`], when the rig made its own cluster.
    _ports: Option<PortsShared>,
}

impl Rig {
    /// Deps on `bootstrap` with these overrides, one event per key seeded, a fresh producer.
    async fn new(
        env: TestEnv,
        bootstrap: String,
        extra: &[(&str, &str)],
        event_keys: &[String],
    ) -> Self {
        let d = env.dispatch_deps(&bootstrap, extra);
        let ids = env.seed_events(event_keys).await;
        let p = producer(&d);
        Self {
            env,
            bootstrap,
            d,
            ids,
            p,
            state: DispatchState::default(),
            cluster: None,
            _ports: None,
        }
    }

    /// [`Rig::new`] on a fresh env (`tag`) and a mock cluster of `brokers` brokers, both kept
    /// in the rig with the shared side of [`PORTS`].
    async fn on_mock(
        tag: &str,
        brokers: i32,
        extra: &[(&str, &str)],
        event_keys: &[String],
    ) -> Self {
        let (ports, env, cluster) = mock_env(tag, brokers).await;
        let mut rig = Self::new(env, cluster.bootstrap_servers(), extra, event_keys).await;
        rig.cluster = Some(cluster);
        rig._ports = Some(ports);
        rig
    }

    /// The mock cluster of a rig made [`Rig::on_mock`].
    fn cluster(&self) -> &Mock {
        self.cluster
            .as_ref()
            .expect("a rig on its own mock cluster")
    }

    /// One healthy round: it acknowledges a whole batch of `n` events.
    async fn full_round(&mut self, n: usize) {
        let r = self.round().await;
        assert_eq!(r.acked, n, "{r:?}");
    }

    /// One dispatch round, as the dispatcher runs it.
    async fn round(&mut self) -> Round {
        let (p, cfg) = (&mut self.p, &self.d.cfg);
        self.env.dispatch_round(p, cfg, &mut self.state).await
    }

    /// [`TestEnv::drain_events`] with this rig's producer and state.
    async fn drain(&mut self, limit: usize) {
        let (p, cfg) = (&mut self.p, &self.d.cfg);
        self.env.drain_events(p, cfg, &mut self.state, limit).await
    }

    /// [`rounds_until_stuck`] with this rig's producer and state.
    async fn until_stuck(&mut self) {
        rounds_until_stuck(&self.env, &mut self.p, &self.d.cfg, &mut self.state).await
    }

    /// A restart: the carried outcome is lost and a new producer takes over; the old one is
    /// returned, for the caller to keep alive as the test did before.
    fn restart(&mut self) -> EventProducer {
        self.state = DispatchState::default();
        std::mem::replace(&mut self.p, producer(&self.d))
    }

    /// Every record of `topic` read back, at least one per seeded event.
    fn read_back(&self, topic: &str) -> Vec<Received> {
        consume(&self.bootstrap, topic, PARTITIONS, self.ids.len())
    }

    /// Reads the event topic back and checks that exactly the seeded events arrived, in
    /// per-key order; the records, for further checks.
    fn assert_exactly_the_events_arrived(&self) -> Vec<Received> {
        let got = self.read_back(TOPIC);
        assert_eq!(
            ce_ids(&got),
            self.ids.iter().copied().collect(),
            "every event, nothing else"
        );
        assert_per_key_order(&got);
        got
    }

    /// Reads the event topic back and checks none of the seeded events is lost and per-key
    /// order holds.
    fn assert_none_lost(&self) {
        let got = self.read_back(TOPIC);
        assert_eq!(ce_ids(&got).len(), self.ids.len(), "none lost");
        assert_per_key_order(&got);
    }

    /// Drops the databases.
    async fn cleanup(self) {
        self.env.cleanup().await;
    }
}

/// The distinct event ids among these records (duplicates collapse, as the consumer's do).
fn ce_ids(records: &[Received]) -> HashSet<i64> {
    records.iter().map(Received::event_id).collect()
}

#[tokio::test]
async fn every_event_arrives_in_key_order_with_cloudevents_headers() {
    let mut rig = Rig::on_mock("disp_all", 3, &batch("100"), &keys(1000, 37)).await;
    rig.drain(100).await;
    assert_eq!(states(&rig.env).await.get("SENT"), Some(&1000));

    let got = rig.assert_exactly_the_events_arrived();
    let r = &got[0];
    assert_eq!(r.headers["ce_specversion"], "1.0");
    assert_eq!(r.headers["ce_source"], "/msgexchange");
    assert_eq!(r.headers["ce_type"], "msgx.flight_updated");
    assert_eq!(r.headers["content-type"], "application/json");
    assert_eq!(r.headers["ce_subject"], r.key);
    assert!(r.headers["ce_time"].ends_with('Z'));
    let msg_id: i64 = r.headers["ce_msgxmsgid"].parse().expect("msg id header");
    assert!(
        r.payload.contains(&format!("\"msg_id\": {msg_id}"))
            || r.payload.contains(&format!("\"msg_id\":{msg_id}"))
    );
    // Where each landed is recorded.
    let missing: i64 = rig
        .env
        .scalar("SELECT count(*) FROM msg_event WHERE kafka_offset IS NULL OR sent_at IS NULL")
        .await;
    assert_eq!(missing, 0);
    rig.cleanup().await;
}

#[tokio::test]
async fn broker_errors_delay_events_but_lose_none() {
    let (_ports, env, cluster) = exclusive_mock_env("disp_errors", 3).await;
    let bootstrap = cluster.bootstrap_servers();
    let mut rig = Rig::new(env, bootstrap, &batch("200"), &keys(600, 25)).await;

    // Retriable produce errors: librdkafka retries them itself, in order (idempotence).
    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
        ],
    );
    let first = rig.round().await;
    assert!(first.acked > 0, "retriable errors only delay: {first:?}");
    flush(&rig.env.store, &mut rig.state, &rig.d.cfg)
        .await
        .expect("flush");

    // All brokers down: sends time out (delivery_timeout 3s) and back off.
    for b in 1..=3 {
        cluster.broker_down(b).expect("down");
    }
    let down = rig.round().await;
    assert_eq!(down.acked, 0, "{down:?}");
    assert!(down.failed > 0, "{down:?}");
    let env = &rig.env;
    flush(&env.store, &mut rig.state, &rig.d.cfg)
        .await
        .expect("flush");
    let backing_off: i64 = env
        .scalar_for(
            "SELECT count(*) FROM msg_event WHERE state = 'PENDING' AND next_attempt_at > $1",
            env.clock.now(),
        )
        .await;
    assert_eq!(backing_off as usize, down.failed);
    // Later events of a backing-off key wait; a round now selects no event of those keys.
    let blocked_keys: Vec<String> = env
        .column_for(
            "SELECT DISTINCT flight_key FROM msg_event WHERE state = 'PENDING' AND next_attempt_at > $1",
            env.clock.now(),
        )
        .await;
    let next = env
        .store
        .deliverable_events(env.clock.now(), 10_000, &[], &[])
        .await
        .expect("deliverable");
    assert!(next.iter().all(|e| !blocked_keys.contains(&e.flight_key)));

    for b in 1..=3 {
        cluster.broker_up(b).expect("up");
    }
    rig.drain(200).await;
    rig.assert_none_lost();
    let retried: i64 = rig
        .env
        .scalar("SELECT count(*) FROM msg_event WHERE attempts > 0")
        .await;
    assert!(retried > 0);
    rig.cleanup().await;
}

#[tokio::test]
async fn exhausted_events_go_dead_and_to_the_dead_letter_topic() {
    let mut rig = Rig::on_mock("disp_dead", 1, EXHAUST_FAST, &keys(5, 5)).await;
    // The event topic refuses us; the dead-letter topic does not.
    rig.cluster()
        .topic_error(
            TOPIC,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
        )
        .expect("topic error");
    rig.drain(50).await;
    assert_eq!(
        states(&rig.env).await.get("DEAD"),
        Some(&5),
        "{:?}",
        states(&rig.env).await
    );
    let dead = rig.read_back(DLQ);
    assert_eq!(ce_ids(&dead), rig.ids.iter().copied().collect());
    for r in &dead {
        assert_eq!(r.headers["ce_msgxorigtopic"], TOPIC);
        assert_eq!(r.headers["ce_msgxattempts"], "2");
        assert!(!r.headers["ce_msgxerror"].is_empty());
    }
    let errors: Vec<Option<String>> = rig
        .env
        .column("SELECT last_error FROM msg_event ORDER BY event_id")
        .await;
    assert!(errors.iter().all(Option::is_some));
    rig.cleanup().await;
}

#[tokio::test]
async fn a_fatal_producer_error_rebuilds_the_producer_and_nothing_is_lost() {
    let mut rig = Rig::on_mock("disp_fatal", 1, &batch("50"), &keys(200, 10)).await;
    rig.full_round(50).await;
    inject_fatal_error(&rig.p, "test: out of order sequence");
    let broken = rig.round().await;
    assert_eq!(broken.sent, 50, "the first round's acks are written");
    assert!(broken.producer_recreated.is_some(), "{broken:?}");
    assert_eq!(rig.p.generation(), 1);
    rig.drain(100).await;
    rig.assert_none_lost();
    rig.cleanup().await;
}

/// A dispatcher actor whose safety-net poll is far longer than any test: only a wake-up can
/// deliver in time.
fn idle_dispatcher(env: &TestEnv, bootstrap: &str) -> actix::Addr<Dispatcher> {
    let d = env.dispatch_deps(bootstrap, &[("MSGX_DISPATCH__IDLE_POLL", "1h")]);
    Dispatcher::new(
        env.store.clone(),
        common::shared(&env.clock),
        producer(&d),
        d.cfg.clone(),
        d.idle_poll,
    )
    .start()
}

#[actix_rt::test]
async fn the_actor_delivers_when_woken_without_busy_polling() {
    let (_ports, env, cluster) = mock_env("disp_actor", 1).await;
    let addr = idle_dispatcher(&env, &cluster.bootstrap_servers());
    // Let the start-up round find nothing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    env.seed_events(&keys(20, 4)).await;
    addr.do_send(EventsQueued { msg_id: 1 });
    wait_sent(&env, 20).await;
    env.cleanup().await;
}

/// Waits until `n` events are SENT (within 20 s).
async fn wait_sent(env: &TestEnv, n: i64) {
    let what = format!("{n} events SENT");
    common::service::wait_for(&what, Duration::from_secs(20), || async {
        states(env).await.get("SENT") == Some(&n)
    })
    .await;
}

/// librdkafka's fatal error inside the running actor: the round on the broken producer fails
/// its sends (they back off), the producer is rebuilt, and every event is delivered.
#[actix_rt::test]
async fn the_actor_rebuilds_a_fatal_producer_and_nothing_is_lost() {
    let (_ports, env, cluster) = mock_env("disp_actor_fatal", 1).await;
    let d = env.dispatch_deps(
        &cluster.bootstrap_servers(),
        &[("MSGX_DISPATCH__IDLE_POLL", "200ms")],
    );
    // Connected (producer id fetched) by one record of its own, then broken: as a broker-caused
    // fatal error finds it.
    let broken = producer(&d);
    let warm = msgx_core::kafka::producer::Outgoing {
        topic: TOPIC,
        key: "WARM",
        payload: b"{}",
        timestamp_ms: 0,
    };
    broken
        .send(warm, rdkafka::message::OwnedHeaders::new())
        .expect("queued")
        .await
        .expect("delivery report")
        .expect("acked");
    inject_fatal_error(&broken, "test: out of order sequence");
    env.seed_events(&keys(40, 4)).await;
    let _addr = Dispatcher::new(
        env.store.clone(),
        common::shared(&env.clock),
        broken,
        d.cfg.clone(),
        d.idle_poll,
    )
    .start();
    // The sends on the broken producer fail and back off (each key's first event); then the
    // test clock passes their retry time and the safety-net poll sends them again.
    common::service::wait_for("a failed send", Duration::from_secs(20), || async {
        env.count("SELECT count(*) FROM msg_event WHERE attempts > 0")
            .await
            > 0
    })
    .await;
    env.clock.advance(Duration::from_secs(60));
    wait_sent(&env, 40).await;
    env.cleanup().await;
}

/// Keys with a failed send, the events of other keys not yet SENT, and SENT events that
/// overtook a still-pending failed event of their key.
async fn hold_check(env: &TestEnv) -> (Vec<String>, i64, i64) {
    let failed_keys: Vec<String> = env
        .column("SELECT DISTINCT flight_key FROM msg_event WHERE attempts > 0 ORDER BY 1")
        .await;
    let undelivered_other: i64 = env
        .scalar_for(
            "SELECT count(*) FROM msg_event WHERE state <> 'SENT' AND NOT (flight_key = ANY($1))",
            &failed_keys,
        )
        .await;
    let overtaken: i64 = env
        .scalar(
            "SELECT count(*) FROM msg_event s JOIN msg_event f \
               ON f.flight_key = s.flight_key AND f.attempts > 0 AND f.state = 'PENDING' \
             WHERE s.state = 'SENT' AND s.event_id > f.event_id",
        )
        .await;
    (failed_keys, undelivered_other, overtaken)
}

/// Rounds without moving the clock until nothing more is deliverable.
async fn rounds_until_stuck(
    env: &TestEnv,
    p: &mut EventProducer,
    cfg: &DispatchConfig,
    state: &mut DispatchState,
) {
    for _ in 0..100 {
        let r = env.dispatch_round(p, cfg, state).await;
        if r.selected == 0 && state.unwritten() == 0 {
            return;
        }
    }
    panic!("rounds never ran dry");
}

#[tokio::test]
async fn one_broker_down_holds_back_only_the_keys_it_leads() {
    let (_ports, env, cluster) = exclusive_mock_env("disp_partial", 3).await;
    for p in 0..PARTITIONS {
        cluster
            .partition_leader(TOPIC, p, Some(p + 1))
            .expect("leader");
    }
    let bootstrap = cluster.bootstrap_servers();
    let mut rig = Rig::new(env, bootstrap, &batch("100"), &keys(300, 30)).await;
    // Warm up metadata so every partition's leader is known before the outage.
    let warm = rig.round().await;
    assert!(warm.acked > 0);
    cluster.broker_down(1).expect("down");
    rig.until_stuck().await;
    let (failed_keys, undelivered_other, overtaken) = hold_check(&rig.env).await;
    assert!(
        !failed_keys.is_empty(),
        "the partition led by broker 1 failed"
    );
    assert!(
        failed_keys.len() < 30,
        "only that partition's keys: {failed_keys:?}"
    );
    assert_eq!(undelivered_other, 0, "other keys are not held back");
    assert_eq!(overtaken, 0, "no later event of a failed key was sent");

    cluster.broker_up(1).expect("up");
    rig.drain(200).await;
    rig.assert_none_lost();
    rig.cleanup().await;
}

#[tokio::test]
async fn a_failed_event_holds_back_the_later_events_of_its_key() {
    let mut rig = Rig::on_mock("disp_hold", 1, &batch("60"), &keys(600, 30)).await;
    rig.full_round(60).await;
    // The next produce request is refused for good: its events fail, nothing else does.
    rig.cluster().request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE],
    );
    // Without moving the clock: the failed events stay in backoff while the rest drains.
    rig.until_stuck().await;
    let (failed_keys, undelivered_other, overtaken) = hold_check(&rig.env).await;
    assert!(!failed_keys.is_empty(), "the refused request failed events");
    assert_eq!(overtaken, 0, "a later event of a failed key went out first");
    assert_eq!(undelivered_other, 0, "other keys are not held back");

    rig.drain(200).await;
    rig.assert_none_lost();
    rig.cleanup().await;
}

/// Issue 43 item 3: one key's events are in flight together, one record per produce request
/// here (`batch.num.messages=1`). The broker refuses the third for good and, as Kafka does for
/// an idempotent producer, answers every batch after it out of sequence (the mock checks
/// sequences only for transactional producers, so the test gives Kafka's answers): the two
/// before it land, it backs off, and the three after it fail with it (the gapless guarantee's
/// fatal error; the producer is rebuilt) without an attempt of their own.
#[tokio::test]
async fn a_refusal_mid_chain_fails_the_rest_of_its_key_and_nothing_overtakes_it() {
    let mut rig = mid_chain_rig("disp_midchain").await;
    // Kafka answers every later batch of the producer out of sequence (its sequence 2 never
    // landed), retries included, until they time out (`kafka.delivery_timeout`).
    let out_of_sequence = RDKafkaRespErr::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER;
    let refusal = [
        &[NO_ERROR, NO_ERROR, TOO_LARGE][..],
        &[out_of_sequence; 200],
    ]
    .concat();
    rig.cluster()
        .request_errors(RDKafkaApiKey::Produce, &refusal);
    let r = rig.round().await;
    // Whatever of the refusal the failed producer did not use is not the next one's.
    rig.cluster().clear_request_errors(RDKafkaApiKey::Produce);
    let seen = (r.selected, r.acked, r.failed, r.held_back, r.overtaken);
    assert_eq!(seen, (6, 2, 1, 3, 0), "{r:?}");
    assert!(r.producer_recreated.is_some(), "a fatal error: {r:?}");
    // The two before it sent, it charged an attempt, the three after it not.
    let held = ("PENDING", 0);
    let want = rows(&[("SENT", 0), ("SENT", 0), ("PENDING", 1), held, held, held]);
    assert_eq!(mid_chain_states(&mut rig).await, want);

    rig.drain(50).await;
    rig.assert_exactly_the_events_arrived();
    rig.cleanup().await;
}

/// The same refusal on a broker that appends what it gets without checking an idempotent
/// producer's sequence (the mock as it is): batches already in flight behind the refused one
/// land before it. The round records them SENT (they are on the topic) and counts them as
/// overtaken (an alert in the log), so a broker that breaks the order is seen, not hidden.
#[tokio::test]
async fn a_broker_without_sequence_checks_shows_as_overtaken() {
    let mut rig = mid_chain_rig("disp_overtaken").await;
    rig.cluster()
        .request_errors(RDKafkaApiKey::Produce, &[NO_ERROR, NO_ERROR, TOO_LARGE]);
    let r = rig.round().await;
    rig.cluster().clear_request_errors(RDKafkaApiKey::Produce);
    assert_eq!((r.failed, r.acked), (1, 2 + r.overtaken), "{r:?}");
    let states = mid_chain_states(&mut rig).await;
    let sent_after = states[3..].iter().filter(|(s, _)| s == "SENT").count();
    assert_eq!(sent_after, r.overtaken, "{states:?}");
    assert_eq!(
        states[..3],
        rows(&[("SENT", 0), ("SENT", 0), ("PENDING", 1)])
    );

    rig.drain(50).await;
    let got = rig.read_back(TOPIC);
    assert_eq!(ce_ids(&got), rig.ids.iter().copied().collect(), "none lost");
    rig.cleanup().await;
}

const NO_ERROR: RDKafkaRespErr = RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR;
const TOO_LARGE: RDKafkaRespErr = RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE;

/// Six events of one key on a mock cluster, one record per produce request.
async fn mid_chain_rig(tag: &str) -> Rig {
    let extra = [
        ("MSGX_DISPATCH__BATCH", "60"),
        ("MSGX_KAFKA__EXTRA", "batch.num.messages=1"),
    ];
    Rig::on_mock(tag, 1, &extra, &keys(6, 1)).await
}

/// Each event's state and attempts, in event order, once the round's outcome is written.
async fn mid_chain_states(rig: &mut Rig) -> Vec<(String, i32)> {
    flush(&rig.env.store, &mut rig.state, &rig.d.cfg)
        .await
        .expect("flush");
    rig.env
        .rows("SELECT state::text, attempts FROM msg_event ORDER BY event_id")
        .await
}

/// `(state, attempts)` rows as [`mid_chain_states`] gives them.
fn rows(want: &[(&str, i32)]) -> Vec<(String, i32)> {
    want.iter().map(|(s, a)| (s.to_string(), *a)).collect()
}

/// The same promise against a real Kafka-protocol broker that is not librdkafka's mock
/// (tansu): every event arrives, in order per key by first sighting, read back by an
/// independent consumer; a second producer generation (a restart) only duplicates.
#[tokio::test]
async fn every_event_arrives_in_key_order_on_a_real_broker() {
    let _ports = PORTS.read().await;
    let env = TestEnv::new("disp_tansu").await;
    let broker = common::tansu::Tansu::start();
    broker.create_topic(TOPIC, PARTITIONS as u32);
    broker.create_topic(DLQ, PARTITIONS as u32);
    let mut rig = Rig::new(env, broker.bootstrap.clone(), &batch("100"), &keys(600, 29)).await;
    // Half, then a "restart": the carried outcome is lost, a new producer re-sends it.
    for _ in 0..3 {
        rig.round().await;
    }
    let _first_generation = rig.restart();
    rig.drain(100).await;
    assert_eq!(states(&rig.env).await.get("SENT"), Some(&600));

    rig.assert_exactly_the_events_arrived();
    rig.cleanup().await;
}

/// Graceful shutdown: `Shutdown` is handled after the round in flight, and what the broker
/// acknowledged is SENT before the actor stops (a deploy does not re-send it).
#[actix_rt::test]
async fn shutdown_writes_sent_for_what_was_acknowledged_then_stops() {
    let (_ports, env, cluster) = mock_env("disp_shutdown", 1).await;
    let bootstrap = cluster.bootstrap_servers();
    let d = env.dispatch_deps(&bootstrap, &[("MSGX_DISPATCH__IDLE_POLL", "1h")]);
    env.seed_events(&keys(30, 5)).await;
    let addr = Dispatcher::new(
        env.store.clone(),
        common::shared(&env.clock),
        producer(&d),
        d.cfg.clone(),
        d.idle_poll,
    )
    .start();
    // One round in flight, the shutdown queued behind it.
    let round = addr.send(DispatchNow);
    let stop = addr.send(msgx_actors::messages::Shutdown {
        deadline: Instant::now() + Duration::from_secs(10),
    });
    let summary = round.await.expect("mailbox").expect("round");
    assert!(summary.acked > 0, "{summary:?}");
    stop.await.expect("mailbox").expect("clean stop");
    assert_eq!(states(&env).await.get("SENT"), Some(&30));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!addr.connected(), "stopped");
    env.cleanup().await;
}

/// The selection the dispatcher sends from, against the rule it must keep (per key: nothing
/// after an event still backing off; never a skipped id or key; the first `limit` in event
/// order otherwise), over more pending events than one page holds and with statistics taken
/// while almost nothing was pending — the state in which the single-statement version chose
/// a plan that re-scanned every pending event per pending event.
#[tokio::test]
async fn the_selection_keeps_key_order_across_pages_whatever_the_statistics() {
    let env = TestEnv::new("dispatch_selection").await;
    // Statistics of a table with no PENDING event.
    let early = env.seed_events(&keys(200, 20)).await;
    env.exec_for(
        "UPDATE msg_event SET state = 'SENT', sent_at = now() WHERE event_id = ANY($1)",
        &early,
    )
    .await;
    env.exec("ANALYZE msg_event").await;
    // 3,000 pending: the first 2,500 on key HELD (its first one backing off), then 500 on
    // 50 other keys.
    let mut ks: Vec<String> = vec!["HELD".to_string(); 2_500];
    ks.extend(keys(500, 50));
    let ids = env.seed_events(&ks).await;
    let now = env.clock.now();
    env.exec_with(
        "UPDATE msg_event SET attempts = 1, next_attempt_at = $2, last_error = 'broker down' \
         WHERE event_id = $1",
        |q| q.bind(ids[0]).bind(now + chrono::Duration::minutes(5)),
    )
    .await;
    // In flight (outcome not written yet): two ids of the other keys, and key FL007.
    let skip_ids = vec![ids[2_500], ids[2_503]];
    let skip_keys = vec!["FL007".to_string()];
    let expected: Vec<i64> = ids
        .iter()
        .zip(&ks)
        .filter(|(id, k)| k.as_str() != "HELD" && !skip_ids.contains(id) && k.as_str() != "FL007")
        .map(|(id, _)| *id)
        .take(100)
        .collect();
    let started = Instant::now();
    let got: Vec<i64> = env
        .store
        .deliverable_events(now, 100, &skip_ids, &skip_keys)
        .await
        .expect("select")
        .into_iter()
        .map(|e| e.event_id)
        .collect();
    let took = started.elapsed();
    assert_eq!(got, expected);
    // Not a timing test; a guard against the quadratic plan, which took seconds here.
    assert!(took < Duration::from_secs(2), "selection took {took:?}");

    // Once the backing-off event is due, HELD's events come first again, in order.
    let later = now + chrono::Duration::minutes(6);
    let got: Vec<i64> = env
        .store
        .deliverable_events(later, 10, &[], &[])
        .await
        .expect("select")
        .into_iter()
        .map(|e| e.event_id)
        .collect();
    assert_eq!(got, ids[..10].to_vec());
    // A limit larger than everything pending returns everything deliverable.
    let all = env
        .store
        .deliverable_events(now, 10_000, &[], &[])
        .await
        .expect("select");
    assert_eq!(all.len(), 500);
}

/// Issue 21, the whole wake-up chain without a timer: W moves → the pump steps (its idle poll
/// an hour) → its commit wakes the dispatcher (its safety net an hour too) → the events are
/// acknowledged and SENT within seconds.
#[actix_rt::test]
async fn a_pump_commit_wakes_the_dispatcher_without_its_timer() {
    use msgx_actors::messages::WatermarkMoved;
    use msgx_actors::pump::Pump;
    use msgx_actors::wiring::Wiring;
    let (_ports, env, cluster) = mock_env("disp_chain", 1).await;
    let dispatcher = idle_dispatcher(&env, &cluster.bootstrap_servers());
    let wiring = Wiring::default();
    wiring.update(|r| r.events.push(dispatcher.recipient()));
    let core = env.pump(&[]);
    let pump = Pump::new(
        core,
        common::shared(&env.clock),
        Duration::from_secs(3600),
        wiring,
    )
    .start();
    // Both start-up rounds find nothing; then only the wake-ups can deliver in time.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..3 {
        let text = common::msgs::flop(i + 1, &format!("WK{i}"), &[("GATE", "B1")]);
        env.insert_message(&text).await;
    }
    env.poll(env.poll_cfg(1000)).await;
    pump.do_send(WatermarkMoved { w: 3 });
    let start = Instant::now();
    loop {
        let s = states(&env).await;
        if s.get("SENT").copied().unwrap_or(0) > 0 && s.keys().all(|k| k == "SENT") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "not delivered: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    env.cleanup().await;
}
