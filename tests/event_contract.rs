//! The published event contract (issue 22): `docs/asyncapi.yaml` names exactly the event types
//! the code can emit (`EventType::ALL`), parses with the AsyncAPI reference parser, and every
//! event the real pump produces — FLOP create/update, a schedule DNLD and RESP, ADFT, an FDEL
//! with a code-share cascade — validates against its JSON Schema; the records read back from a
//! real broker (tansu) and from the dead-letter topic (mock cluster) carry the headers the
//! document describes, `ce_dataschema` included; the consumer example of
//! `docs/consuming-events.md` de-duplicates the at-least-once stream.

use msgx_testkit as common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::process::Command;

use common::contract::{self, Contract};
use common::dispatch::EXHAUST_FAST;
use common::kafka::{consume, Received};
use common::msgs::{adft, fdel, flop, schedule};
use common::TestEnv;
use msgx_core::dispatch::DispatchState;
use msgx_core::flight::EventType;
use msgx_core::kafka::EventProducer;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::types::RDKafkaRespErr;
use serde_json::Value;

const TOPIC: &str = "msgx.flight-events";
const DLQ: &str = "msgx.flight-events.dlq";
const PARTITIONS: i32 = 3;

/// Every event type's name, from the code.
fn code_names() -> BTreeSet<String> {
    EventType::ALL
        .iter()
        .map(|t| t.as_str().to_string())
        .collect()
}

/// Follows a local `$ref` (`#/a/b`) of the document.
fn deref<'a>(doc: &'a Value, v: &'a Value) -> &'a Value {
    match v.get("$ref").and_then(Value::as_str) {
        Some(r) => doc
            .pointer(r.trim_start_matches('#'))
            .unwrap_or_else(|| panic!("dangling $ref {r}")),
        None => v,
    }
}

/// The messages of a channel: `(components name, message)`.
fn channel_messages<'a>(doc: &'a Value, channel: &str) -> Vec<(String, &'a Value)> {
    let msgs = doc["channels"][channel]["messages"]
        .as_object()
        .unwrap_or_else(|| panic!("channel {channel} has no messages"));
    msgs.values()
        .map(|m| {
            let r = m["$ref"].as_str().expect("channel messages are $refs");
            let name = r.rsplit('/').next().expect("name").to_string();
            (name, deref(doc, m))
        })
        .collect()
}

/// The document names every event type the code can emit and nothing else, on both topics;
/// each message's payload is the type's schema file and its headers pin `ce_type` and
/// `ce_dataschema`; `docs/schemas/` holds exactly those files.
#[test]
fn asyncapi_names_every_event_type_and_nothing_else() {
    let doc = contract::asyncapi();
    assert!(doc["asyncapi"]
        .as_str()
        .is_some_and(|v| v.starts_with("3.")));
    for (channel, address, suffix) in [("flightEvents", TOPIC, ""), ("deadLetters", DLQ, "Dead")] {
        assert_eq!(doc["channels"][channel]["address"], address);
        let msgs = channel_messages(&doc, channel);
        let names: BTreeSet<String> = msgs
            .iter()
            .map(|(_, m)| m["name"].as_str().expect("message name").to_string())
            .collect();
        assert_eq!(names, code_names(), "channel {channel}");
        assert_eq!(msgs.len(), EventType::ALL.len(), "channel {channel}");
        for t in EventType::ALL {
            let key = format!("{}{suffix}", contract::message_name(t));
            let (_, m) = msgs
                .iter()
                .find(|(k, _)| *k == key)
                .unwrap_or_else(|| panic!("{channel}: no message {key}"));
            assert_eq!(m["name"], t.as_str());
            assert_eq!(
                m["payload"]["$ref"],
                format!("./{}", contract::schema_file(t))
            );
            let headers = serde_json::to_string(&m["headers"]).expect("json");
            let typed = format!("#/components/schemas/{}Headers", contract::message_name(t));
            assert!(headers.contains(&typed), "{key} headers: {headers}");
            let typed =
                &doc["components"]["schemas"][format!("{}Headers", contract::message_name(t))];
            let pinned = &typed["allOf"][1]["properties"];
            assert_eq!(
                pinned["ce_type"]["const"],
                msgx_core::dispatch::cloudevents::ce_type(t.as_str())
            );
            assert_eq!(pinned["ce_dataschema"]["const"], t.schema_uri());
        }
    }
    let files: BTreeSet<String> = std::fs::read_dir(common::repo_root().join("docs/schemas"))
        .expect("docs/schemas")
        .map(|e| {
            format!(
                "schemas/{}",
                e.expect("entry").file_name().to_string_lossy()
            )
        })
        .collect();
    let expected: BTreeSet<String> = EventType::ALL
        .into_iter()
        .map(contract::schema_file)
        .collect();
    assert_eq!(
        files, expected,
        "docs/schemas/ holds one schema per event type"
    );
    // Every schema compiles, its $id is the type's ce_dataschema.
    Contract::load();
}

/// `@asyncapi/parser` (npm, installed by scripts/test.sh into scripts/asyncapi/) accepts the
/// document with no error or warning, resolves the schema files, and sees the same messages.
/// Without node or the package the test is skipped, except under `CI=true`.
#[test]
fn asyncapi_parses_with_the_reference_parser() {
    let dir = common::repo_root().join("scripts/asyncapi");
    let installed = dir.join("node_modules/@asyncapi/parser").is_dir();
    let node = Command::new("node").arg("--version").output().is_ok();
    if !(installed && node) {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "@asyncapi/parser is not installed (scripts/test.sh: npm ci --prefix scripts/asyncapi)"
        );
        eprintln!("skipped: node or @asyncapi/parser missing (scripts/test.sh installs them)");
        return;
    }
    let out = Command::new("node")
        .arg(dir.join("validate.mjs"))
        .arg(common::repo_root().join("docs/asyncapi.yaml"))
        .output()
        .expect("node");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "asyncapi parser: {stderr}");
    let parsed: Value = serde_json::from_slice(&out.stdout).expect("validate.mjs prints JSON");
    for address in [TOPIC, DLQ] {
        // Sorted, not de-duplicated: a type named twice fails too.
        let names: Vec<String> = parsed["channels"][address]
            .as_array()
            .unwrap_or_else(|| panic!("{address} missing: {parsed}"))
            .iter()
            .map(|n| n.as_str().expect("name").to_string())
            .collect();
        let expected: Vec<String> = code_names().into_iter().collect();
        assert_eq!(names, expected, "{address}");
    }
}

/// A `SCHD/RESP` answering request `rqid` (the common builder writes DNLD).
fn schedule_resp(seqn: i64, rqid: &str, flights: &[(&str, &[(&str, &str)])]) -> String {
    schedule(seqn, flights)
        .replace("<STYP>DNLD</STYP>", "<STYP>RESP</STYP>")
        .replace("<DATE>", &format!("<RQID>{rqid}</RQID><DATE>"))
}

/// Feeds an inbox that raises every event type through the real poller and pump; returns the
/// events as stored: `(event_id, flight_key, event_type, payload)`.
async fn run_pipeline(env: &TestEnv) -> Vec<(i64, String, String, Value)> {
    let texts = [
        schedule(
            1,
            &[
                ("A", &[("GATE", "G1"), ("STAT", "SCH")]),
                ("B", &[("GATE", "G2")]),
            ],
        ),
        flop(2, "A", &[("GATE", "-"), ("ETOT", "20261130101500")]),
        flop(3, "C", &[("GATE", "G9")]),
        schedule_resp(
            4,
            "R42",
            &[("A", &[("STND", "S7")]), ("B", &[("GATE", "G2")])],
        ),
        adft(5, "M", &[("AWCD", "CA"), ("FLNO", "CA1234")]),
        adft(6, "S1", &[("AWCD", "KE"), ("MFID", "M")]),
        adft(7, "S2", &[("AWCD", "SQ"), ("MFID", "M")]),
        fdel(8, "M"),
    ];
    for t in &texts {
        env.insert_message(t).await;
    }
    env.poll(env.poll_cfg(100)).await;
    let mut pump = env.pump(&[]);
    let done = common::drive::drain_processed(&mut pump).await;
    for (_, outcome) in &done {
        assert_eq!(outcome.label(), "succeeded", "{outcome:?}");
    }
    assert_eq!(done.len(), texts.len());
    let rows: Vec<(i64, String, String, String)> = env.rows("SELECT event_id, flight_key, event_type, payload::text FROM msg_event ORDER BY event_id").await;
    rows.into_iter()
        .map(|(id, k, t, p)| (id, k, t, serde_json::from_str(&p).expect("JSON payload")))
        .collect()
}

/// Every stored event validates against its type's schema, and the run covers every type and
/// the nullable shapes (a cleared field, a cascade, a schedule answering a request).
/// The contract, its AsyncAPI document, and the events a pipeline run stored, each already
/// checked against the contract: where the tests against a broker start.
async fn contract_and_stored_events(
    env: &TestEnv,
) -> (Contract, Value, Vec<(i64, String, String, Value)>) {
    let contract = Contract::load();
    let doc = contract::asyncapi();
    let events = run_pipeline(env).await;
    check_stored(&contract, &events);
    (contract, doc, events)
}

fn check_stored(contract: &Contract, events: &[(i64, String, String, Value)]) {
    for (_, _, t, payload) in events {
        contract.check_payload(t, payload);
    }
    let types: BTreeSet<String> = events.iter().map(|(_, _, t, _)| t.clone()).collect();
    assert_eq!(types, code_names(), "the run raises every event type");
    let has = |t: &str, f: &dyn Fn(&Value) -> bool| events.iter().any(|e| e.2 == t && f(&e.3));
    assert!(has("FLIGHT_UPDATED", &|p| p["changes"]["GATE"]["after"]
        .is_null()));
    assert!(has("FLIGHT_DELETED", &|p| p["cascade_of"] == "M"));
    assert!(has("FLIGHT_DELETED", &|p| p["cascade_of"].is_null()));
    assert!(has("SCHEDULE_APPLIED", &|p| p["request_id"] == "R42"));
    assert!(has("SCHEDULE_APPLIED", &|p| p["request_id"].is_null()));
}

/// One record against the contract: key = `ce_subject` = the stored key, headers valid against
/// the document's header schema of its message (`suffix` "Dead" on the dead-letter topic),
/// payload valid against the schema `ce_dataschema` names, and that names the stored type.
fn check_record(
    doc: &Value,
    contract: &Contract,
    stored: &HashMap<i64, (String, String)>,
    r: &Received,
    suffix: &str,
) {
    let (key, event_type) = &stored[&r.event_id()];
    let t = EventType::from_name(event_type).expect("a known type");
    assert_eq!(&r.key, key);
    let message = format!("{}{suffix}", contract::message_name(t));
    let what = format!("record {}", r.event_id());
    let headers: BTreeMap<String, String> = r.headers.clone().into_iter().collect();
    contract::check_headers(&contract::header_validator(doc, &message), &headers, &what);
    contract::check_key(&contract::key_validator(doc, &message), &r.key, &what);
    assert_eq!(r.headers["ce_subject"], r.key);
    assert_eq!(r.headers["ce_dataschema"], t.schema_uri());
    let payload: Value = serde_json::from_str(&r.payload).expect("JSON value");
    contract.check_by_dataschema(&r.headers["ce_dataschema"], &payload);
}

/// The output of `docs/examples/consume_events.py` (tansu): each event once, in order per key.
fn run_consumer_example(bootstrap: &str, ids: &BTreeSet<i64>, duplicates: usize) {
    let script = common::repo_root().join("docs/examples/consume_events.py");
    let out = Command::new("python3")
        .arg(&script)
        .args([
            "--bootstrap",
            bootstrap,
            "--topic",
            TOPIC,
            "--group",
            "contract-test",
        ])
        .args(["--idle-exit", "3"])
        // Short group timeouts: the broker's first join waits out the rebalance timeout
        // (about 20 s with the defaults here, 3 s with these).
        .args([
            "-X",
            "session.timeout.ms=6000",
            "-X",
            "max.poll.interval.ms=6000",
        ])
        .args(["-X", "heartbeat.interval.ms=1000"])
        .output()
        .expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "consumer example: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    let (summary, events) = lines.split_last().expect("a summary line");
    let got: Vec<i64> = events
        .iter()
        .map(|e| e["event_id"].as_i64().expect("id"))
        .collect();
    assert_eq!(got.len(), ids.len(), "each event once: {stdout}");
    assert_eq!(got.iter().copied().collect::<BTreeSet<_>>(), *ids);
    let mut last: HashMap<&str, i64> = HashMap::new();
    for e in events {
        let (key, id) = (
            e["key"].as_str().expect("key"),
            e["event_id"].as_i64().expect("id"),
        );
        if let Some(prev) = last.insert(key, id) {
            assert!(prev < id, "key {key}: {prev} then {id}");
        }
    }
    assert_eq!(summary["summary"]["events"], ids.len());
    assert_eq!(summary["summary"]["duplicates_skipped"], duplicates);
}

/// The whole promise on a real broker: the pipeline's events validate as stored, a restart in
/// the acked-but-unrecorded window duplicates some, every record read back matches the
/// contract, and the consumer example prints each event once.
#[tokio::test]
async fn pipeline_events_match_the_contract_on_a_real_broker() {
    let env = TestEnv::new("contract_tansu").await;
    let (contract, doc, events) = contract_and_stored_events(&env).await;

    let broker = common::tansu::Tansu::start();
    broker.create_topic(TOPIC, PARTITIONS as u32);
    broker.create_topic(DLQ, PARTITIONS as u32);
    let d = env.dispatch_deps(&broker.bootstrap, &[("MSGX_DISPATCH__BATCH", "4")]);
    // One round, then a "restart": its acks were never recorded, a new producer re-sends them.
    let mut p = EventProducer::new(&d.kafka, &d.bootstrap).expect("producer");
    let mut state = DispatchState::default();
    env.dispatch_round(&mut p, &d.cfg, &mut state).await;
    assert!(state.unwritten() > 0);
    drop((p, state));
    let mut p = EventProducer::new(&d.kafka, &d.bootstrap).expect("producer");
    let mut state = DispatchState::default();
    env.drain_events(&mut p, &d.cfg, &mut state, 100).await;

    let stored = by_event_id(&events);
    let got = consume(&broker.bootstrap, TOPIC, PARTITIONS, events.len() + 4);
    for r in &got {
        check_record(&doc, &contract, &stored, r, "");
    }
    let ids: BTreeSet<i64> = got.iter().map(Received::event_id).collect();
    assert_eq!(ids, stored.keys().copied().collect());
    let duplicates = got.len() - ids.len();
    assert!(duplicates > 0, "the restart re-sent the unrecorded acks");
    run_consumer_example(&broker.bootstrap, &ids, duplicates);
    env.cleanup().await;
}

/// `(key, type)` of each stored event, by event id.
fn by_event_id(events: &[(i64, String, String, Value)]) -> HashMap<i64, (String, String)> {
    events
        .iter()
        .map(|(id, k, t, _)| (*id, (k.clone(), t.clone())))
        .collect()
}

fn mock() -> MockCluster<'static, DefaultProducerContext> {
    let cluster = MockCluster::new(1).expect("mock cluster");
    for t in [TOPIC, DLQ] {
        cluster.create_topic(t, PARTITIONS, 1).expect("topic");
    }
    cluster
}

/// Exhausted events reach the dead-letter topic as the document's dead-letter messages: the
/// event's headers plus `ce_msgxerror`, `ce_msgxattempts`, `ce_msgxorigtopic`.
#[tokio::test]
async fn dead_letters_match_the_contract() {
    let env = TestEnv::new("contract_dlq").await;
    let (contract, doc, events) = contract_and_stored_events(&env).await;
    let cluster = mock();
    let bootstrap = cluster.bootstrap_servers();
    let d = env.dispatch_deps(&bootstrap, EXHAUST_FAST);
    cluster
        .topic_error(
            TOPIC,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
        )
        .expect("topic error");
    let mut p = EventProducer::new(&d.kafka, &d.bootstrap).expect("producer");
    let mut state = DispatchState::default();
    env.drain_events(&mut p, &d.cfg, &mut state, 100).await;
    let stored = by_event_id(&events);
    let dead = consume(&bootstrap, DLQ, PARTITIONS, events.len());
    for r in &dead {
        check_record(&doc, &contract, &stored, r, "Dead");
        assert_eq!(r.headers["ce_msgxorigtopic"], TOPIC);
    }
    let ids: BTreeSet<i64> = dead.iter().map(Received::event_id).collect();
    assert_eq!(ids, stored.keys().copied().collect());
    env.cleanup().await;
}
