//! Issue 54: OpenTelemetry traces, checked against a real OTLP/HTTP receiver (the official
//! protobuf definitions, `common::otlp`) and the records a consumer reads from the topic:
//! - one trace per message: the inbox commit (back-dated root), discovery, processing and the
//!   Kafka delivery, joined across actors; the record's `traceparent` is its delivery span and
//!   `ce_traceparent` the message's root, in the same trace;
//! - a message registered through `POST /cminmsgs/send` with a `traceparent` continues the
//!   caller's trace, across a restart of the service;
//! - with the collector gone, the pipeline keeps delivering and the dropped spans are counted.

use msgx_testkit as common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::kafka::{consume, Received as Record};
use common::otlp::{Received as Span, Receiver};
use common::service::{free_port, kill9, spawn_service, wait_for};
use common::{msgs, TestEnv};
use msgx_core::traces::TraceParent;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;

const TOPIC: &str = "msgx.flight-events";
const DLQ: &str = "msgx.flight-events.dlq";
/// OTLP span kinds (opentelemetry-proto `Span.kind`).
const KIND_CLIENT: i32 = 3;
const KIND_PRODUCER: i32 = 4;

fn cluster() -> (MockCluster<'static, DefaultProducerContext>, String) {
    let cluster = MockCluster::new(1).expect("mock cluster");
    for t in [TOPIC, DLQ] {
        cluster.create_topic(t, 3, 1).expect("topic");
    }
    let bootstrap = cluster.bootstrap_servers();
    (cluster, bootstrap)
}

/// The service's environment: the broker, traces on to `endpoint`, quick export.
fn traced<'a>(bootstrap: &'a str, endpoint: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("MSGX_KAFKA__BROKERS", bootstrap),
        ("MSGX_TRACES__ENABLED", "true"),
        ("MSGX_TRACES__ENDPOINT", endpoint),
        ("MSGX_TRACES__EXPORT_INTERVAL", "100ms"),
        ("MSGX_TRACES__EXPORT_TIMEOUT", "2s"),
    ]
}

async fn all_sent(env: &TestEnv, messages: i64) -> bool {
    env.count("SELECT count(*) FROM proc_state WHERE state = 'SUCCEEDED'")
        .await
        == messages
        && env
            .count("SELECT count(*) FROM msg_event WHERE state <> 'SENT'")
            .await
            == 0
}

fn header<'a>(r: &'a Record, name: &str) -> &'a str {
    r.headers
        .get(name)
        .unwrap_or_else(|| panic!("record without {name}: {:?}", r.headers))
}

/// The spans of one trace by name (a name seen twice keeps the last).
fn by_name<'a>(spans: &'a [Span], trace_id: &str) -> HashMap<String, &'a Span> {
    spans
        .iter()
        .filter(|s| s.trace_id() == trace_id)
        .map(|s| (s.span.name.clone(), s))
        .collect()
}

/// Checks one record's trace: the root is the `ce_traceparent` span, discovery and
/// processing are its children, the record's `traceparent` is the delivery span (a PRODUCER
/// child of the root) with the record's partition and offset. Returns the root.
fn check_trace<'a>(spans: &'a [Span], rec: &Record, expect_discovery: bool) -> &'a Span {
    let tp = TraceParent::parse(header(rec, "traceparent")).expect("a W3C traceparent");
    let ce = TraceParent::parse(header(rec, "ce_traceparent")).expect("a W3C ce_traceparent");
    assert_eq!(tp.trace_id, ce.trace_id, "one trace per message");
    let trace = by_name(spans, &ce.trace_id_hex());
    let msg_id = header(rec, "ce_msgxmsgid");
    let send = trace
        .get(&format!("send {TOPIC}"))
        .unwrap_or_else(|| panic!("no delivery span in {:?}", trace.keys()));
    assert_eq!(
        send.span_id(),
        tp.span_id_hex(),
        "traceparent = the delivery span"
    );
    assert_eq!(send.span.kind, KIND_PRODUCER);
    assert_eq!(send.parent_id(), ce.span_id_hex());
    assert_eq!(send.attr("messaging.system").as_deref(), Some("kafka"));
    assert_eq!(
        send.attr("messaging.destination.name").as_deref(),
        Some(TOPIC)
    );
    assert_eq!(
        send.attr("messaging.destination.partition.id"),
        Some(rec.partition.to_string())
    );
    assert_eq!(
        send.attr("messaging.kafka.offset"),
        Some(rec.offset.to_string())
    );
    assert_eq!(
        send.attr("messaging.message.id").as_deref(),
        Some(header(rec, "ce_id"))
    );
    let process = trace.get("msgx.process").expect("a processing span");
    assert_eq!(process.parent_id(), ce.span_id_hex());
    assert_eq!(process.attr("msgx.outcome").as_deref(), Some("succeeded"));
    assert_eq!(process.attr("msgx.msg_id").as_deref(), Some(msg_id));
    let groups: Vec<&Span> = spans
        .iter()
        .filter(|s| s.span.name == "msgx.pump.group")
        .collect();
    assert!(
        !process.span.links.is_empty(),
        "linked to its pump group; {} group spans exported",
        groups.len()
    );
    // The event exists only once its processing committed.
    assert!(process.span.start_time_unix_nano <= send.span.start_time_unix_nano);
    if expect_discovery {
        let discover = trace.get("msgx.discover").expect("a discovery span");
        assert_eq!(discover.parent_id(), ce.span_id_hex());
        assert!(discover.span.end_time_unix_nano <= process.span.end_time_unix_nano);
    }
    let root = trace
        .values()
        .find(|s| s.span.name.starts_with("INSERT "))
        .unwrap_or_else(|| panic!("no inbox commit span in {:?}", trace.keys()));
    assert_eq!(
        root.span_id(),
        ce.span_id_hex(),
        "ce_traceparent = the root"
    );
    assert_eq!(root.span.kind, KIND_CLIENT);
    assert_eq!(root.attr("db.system.name").as_deref(), Some("mysql"));
    assert_eq!(root.attr("msgx.msg_id").as_deref(), Some(msg_id));
    // Back-dated: the row's receive time, before everything that happened to it.
    assert!(root.span.start_time_unix_nano <= process.span.start_time_unix_nano);
    assert_eq!(
        root.resource.get("service.name").map(String::as_str),
        Some("msgexchange")
    );
    root
}

#[tokio::test]
async fn each_message_is_one_trace_from_the_inbox_commit_to_the_ack() {
    let env = TestEnv::new("traces_one").await;
    let (_cluster, bootstrap) = cluster();
    let receiver = Receiver::start();
    for i in 0..6 {
        let flid = format!("CA{:04}", i % 3);
        env.insert_message(&msgs::flop(2000 + i, &flid, &[("GATE", &format!("G{i}"))]))
            .await;
    }
    let mut svc = spawn_service(&env, &traced(&bootstrap, &receiver.endpoint), free_port());
    wait_for(
        "6 processed, every event sent",
        Duration::from_secs(60),
        || all_sent(&env, 6),
    )
    .await;
    let events = env.count("SELECT count(*) FROM msg_event").await as usize;
    let records = consume(&bootstrap, TOPIC, 3, events);
    wait_for(
        "every delivery span exported",
        Duration::from_secs(30),
        || async {
            receiver
                .spans()
                .iter()
                .filter(|s| s.span.name == format!("send {TOPIC}"))
                .count()
                >= events
        },
    )
    .await;
    kill9(&mut svc);
    let spans = receiver.spans();
    let ce_source = env
        .binary_env()
        .into_iter()
        .find(|(k, _)| k == "MSGX_KAFKA__CE_SOURCE")
        .map(|(_, v)| v)
        .expect("ce_source");
    let mut traces = std::collections::HashSet::new();
    for rec in &records {
        let root = check_trace(&spans, rec, true);
        assert_eq!(root.resource.get("msgx.ce_source"), Some(&ce_source));
        traces.insert(root.trace_id());
    }
    assert_eq!(traces.len(), 6, "one trace per message, six messages");
    // The pump's groups are spans of their own (the `tracing` bridge), idle polls are not.
    let groups: Vec<&Span> = spans
        .iter()
        .filter(|s| s.span.name == "msgx.pump.group")
        .collect();
    assert!(!groups.is_empty(), "the pump groups are exported");
    for g in groups {
        let members = g.attr("msgx.pump.members").unwrap_or_default();
        assert!(
            members.parse::<u64>().is_ok_and(|m| m > 0),
            "an idle group was exported: {members:?}"
        );
    }
    env.cleanup().await;
}

#[tokio::test]
async fn a_compat_callers_traceparent_is_continued_across_a_restart() {
    const TOKEN: &str = "test-compat-token-0123456789";
    const CALLER: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let env = TestEnv::new("traces_compat").await;
    let (_cluster, bootstrap) = cluster();
    let receiver = Receiver::start();
    let tokens = format!("upstream:{TOKEN}");
    let mut with_compat = traced(&bootstrap, &receiver.endpoint);
    with_compat.push(("MSGX_HTTP__COMPAT_TOKENS", &tokens));
    // Discovery paused (an hour between rounds): the row stays beyond W while the caller
    // registers it.
    let mut paused = with_compat.clone();
    paused.push(("MSGX_PIPELINE__POLL_INTERVAL", "1h"));
    let port = free_port();
    let mut svc = spawn_service(&env, &paused, port);
    wait_for("the service is ready", Duration::from_secs(30), || async {
        common::http::get(port, "/readyz")
            .await
            .is_ok_and(|r| r.starts_with("HTTP/1.1 200"))
    })
    .await;
    let id = env
        .insert_message(&msgs::flop(3000, "CA0042", &[("GATE", "G7")]))
        .await;
    let body = format!("{{\"msg_id\": {id}}}");
    let request = format!(
        "POST /cminmsgs/send HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n\
         traceparent: {CALLER}\r\ntracestate: upstream=abc\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let answer = common::http::exchange(port, request, common::http::ANSWER_LIMIT)
        .await
        .expect("compat answer");
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    let caller = TraceParent::parse(CALLER).expect("caller");
    wait_for("the inbox commit span", Duration::from_secs(30), || async {
        receiver
            .spans()
            .iter()
            .any(|s| s.trace_id() == caller.trace_id_hex() && s.span.name.starts_with("INSERT "))
    })
    .await;
    kill9(&mut svc);

    // A new process (discovery running) processes and delivers it in the caller's trace.
    let mut svc = spawn_service(&env, &with_compat, free_port());
    wait_for("processed and sent", Duration::from_secs(60), || {
        all_sent(&env, 1)
    })
    .await;
    let events = env.count("SELECT count(*) FROM msg_event").await as usize;
    let records = consume(&bootstrap, TOPIC, 3, events);
    wait_for("the delivery spans", Duration::from_secs(30), || async {
        receiver
            .spans()
            .iter()
            .filter(|s| s.span.name == format!("send {TOPIC}"))
            .count()
            >= events
    })
    .await;
    kill9(&mut svc);
    let spans = receiver.spans();
    for rec in &records {
        // A compat-registered row is not discovered by the poller (its insert is a no-op).
        let root = check_trace(&spans, rec, false);
        assert_eq!(root.trace_id(), caller.trace_id_hex(), "the caller's trace");
        assert_eq!(
            root.parent_id(),
            caller.span_id_hex(),
            "a child of the caller's span"
        );
        assert_eq!(header(rec, "tracestate"), "upstream=abc");
        assert_eq!(header(rec, "ce_tracestate"), "upstream=abc");
    }
    env.cleanup().await;
}

/// The collector hangs mid-run (takes the requests, never answers: each export waits out
/// `traces.export_timeout`), then goes away: the next messages are delivered as fast as the
/// first, and the spans that could not be sent are counted as dropped.
#[tokio::test]
async fn with_the_collector_gone_the_pipeline_keeps_its_pace() {
    let env = TestEnv::new("traces_gone").await;
    let (_cluster, bootstrap) = cluster();
    let mut receiver = Receiver::start();
    let port = free_port();
    let mut extra = traced(&bootstrap, &receiver.endpoint);
    extra.extend([
        ("MSGX_TRACES__QUEUE_SIZE", "8"),
        ("MSGX_TRACES__BATCH_SIZE", "4"),
    ]);
    let mut svc = spawn_service(&env, &extra, port);
    let batch = |from: i64| {
        let env = &env;
        async move {
            let t0 = Instant::now();
            for i in 0..20 {
                env.insert_message(&msgs::flop(from + i, &format!("CA{:04}", i % 4), &[]))
                    .await;
            }
            t0
        }
    };
    let t0 = batch(4000).await;
    wait_for("the first 20", Duration::from_secs(60), || {
        all_sent(&env, 20)
    })
    .await;
    let with_collector = t0.elapsed();
    assert!(receiver.requests() > 0, "the collector received spans");
    receiver.hang();
    let t1 = batch(5000).await;
    wait_for(
        "the next 20, collector gone",
        Duration::from_secs(60),
        || all_sent(&env, 40),
    )
    .await;
    let without = t1.elapsed();
    receiver.stop();
    let t2 = batch(6000).await;
    wait_for(
        "the last 20, collector gone",
        Duration::from_secs(60),
        || all_sent(&env, 60),
    )
    .await;
    let gone = t2.elapsed();
    let metrics = || async {
        common::http::get(port, "/metrics")
            .await
            .unwrap_or_default()
    };
    // Same pace: a pipeline waiting on the exporter would take export_timeout (2 s) per batch.
    for (what, took) in [("hung", without), ("gone", gone)] {
        assert!(
            took < with_collector * 3 + Duration::from_secs(2),
            "{took:?} with the collector {what} vs {with_collector:?} with it answering"
        );
    }
    wait_for("drops counted", Duration::from_secs(30), || async {
        dropped(&metrics().await) > 0.0
    })
    .await;
    kill9(&mut svc);
    env.cleanup().await;
}

/// `msgx_trace_spans_dropped_total`, all reasons.
fn dropped(metrics: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("msgx_trace_spans_dropped_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
