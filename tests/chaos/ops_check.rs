//! The end check: the reference model's prediction ([`super::ops_reference`]) against what
//! PostgreSQL, the inbox's marks and the Kafka topic hold after a sequence settled.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use super::ops_model::Model;
use super::ops_reference::{predict, End, FlightEnd, Timing, Written};
use super::ops_timing;
use crate::common::kafka::Received;
use crate::common::TestEnv;

/// A record as the check reads it.
#[derive(Debug, Clone)]
struct Record {
    state: String,
    class: Option<String>,
    reason: Option<String>,
    late: bool,
    seq: Option<i64>,
    marked: bool,
    abandoned: Option<String>,
}

type RecordRow = (
    i64,
    String,
    Option<String>,
    Option<String>,
    String,
    Option<i64>,
    bool,
    Option<String>,
);

async fn records(env: &TestEnv) -> BTreeMap<i64, Record> {
    let rows: Vec<RecordRow> = env
        .rows(
            "SELECT msg_id, state, error_class, terminal_reason, source, processed_seq, \
                    backfill_at IS NOT NULL, backfill_abandon_reason FROM proc_state_all",
        )
        .await;
    rows.into_iter()
        .map(|r| {
            (
                r.0,
                Record {
                    state: r.1,
                    class: r.2,
                    reason: r.3,
                    late: r.4 == "LATE",
                    seq: r.5,
                    marked: r.6,
                    abandoned: r.7,
                },
            )
        })
        .collect()
}

/// The timing facts the model goes on with: its own answers ([`ops_timing::allowed`]), the
/// service's side taken only where the model allows both; every disagreement is a problem.
fn timing(
    model: &mut Model,
    recs: &BTreeMap<i64, Record>,
    written: &[Written],
    max_commit_delay_ms: u64,
) -> (Timing, Vec<String>) {
    let allowed = ops_timing::allowed(written, model, max_commit_delay_ms);
    model.timing_line = ops_timing::summary(&allowed);
    let shown = |f: &dyn Fn(&Record) -> bool| -> BTreeSet<i64> {
        recs.iter().filter(|r| f(r.1)).map(|r| *r.0).collect()
    };
    let mut problems = Vec::new();
    let late = ops_timing::resolve(
        &allowed.late,
        &shown(&|r| r.late),
        "LATE (source = LATE)",
        &mut problems,
    );
    let approved = ops_timing::resolve(
        &allowed.approved,
        &shown(&|r| r.reason.as_deref() == Some("APPROVED_SKIP")),
        "SKIPPED(APPROVED_SKIP)",
        &mut problems,
    );
    // Missing only tells apart rows whose own end is not DEAD(MALFORMED) anyway.
    let missing = ops_timing::resolve(
        &allowed.missing,
        &shown(&|r| r.state == "DEAD" && r.class.as_deref() == Some("MALFORMED"))
            .into_iter()
            .filter(|id| model.owner_deleted.contains(id))
            .collect(),
        "found missing (DEAD(MALFORMED))",
        &mut problems,
    );
    problems.extend(ops_timing::skip_counts(written, model));
    let precede = ops_timing::precedes(written, &late, &model.stalls);
    let t = Timing {
        late,
        approved,
        missing,
        replayed: model.replays.iter().flat_map(|r| r.ids.clone()).collect(),
        seq: recs
            .iter()
            .filter_map(|(id, r)| r.seq.map(|s| (*id, s)))
            .collect(),
        precede,
        done_in: model.first_done.clone(),
    };
    (t, problems)
}

/// The settled store against the model. `records` are what a consumer read from the topic.
pub async fn check(
    model: &mut Model,
    env: &TestEnv,
    written: &[Written],
    max_commit_delay_ms: u64,
    kafka: &[Received],
) {
    let recs = records(env).await;
    let (timing, problems) = timing(model, &recs, written, max_commit_delay_ms);
    let mut problems = problems;
    let e = predict(written, &model.skipped_stock, &timing, &mut problems);
    for p in problems {
        model.violation(p);
    }
    check_rows(model, &e.rows, &recs);
    check_fifo(model, written, &recs, &timing);
    check_marks(model, env, &e.rows, &recs).await;
    check_flights(model, env, &e.flights).await;
    check_events(model, env, written, &e, kafka).await;
}

fn check_rows(model: &mut Model, rows: &BTreeMap<i64, End>, recs: &BTreeMap<i64, Record>) {
    let mut wrong = Vec::new();
    for (id, end) in rows {
        let rec = recs.get(id);
        let ok = match (end, rec) {
            (End::Stock, None) => true,
            (End::Record(state, what), Some(r)) => {
                let got = if *state == "DEAD" {
                    &r.class
                } else {
                    &r.reason
                };
                r.state == *state && (what.is_none() || got.as_deref() == *what)
            }
            _ => false,
        };
        if !ok {
            wrong.push(format!(
                "{id}: expected {end:?}, got {:?}",
                rec.map(|r| (&r.state, &r.class, &r.reason))
            ));
        }
    }
    if !wrong.is_empty() {
        model.violation(format!(
            "rows not as the model predicts: {}",
            wrong.join("; ")
        ));
    }
    let foreign: Vec<i64> = recs
        .keys()
        .filter(|id| !rows.contains_key(id) && !model.foreign_writers)
        .copied()
        .collect();
    if !foreign.is_empty() {
        model.violation(format!("records of rows the test never wrote: {foreign:?}"));
    }
    let abandoned: Vec<String> = recs
        .iter()
        .filter_map(|(id, r)| r.abandoned.as_ref().map(|a| (id, a)))
        .map(|(id, a)| format!("{id}:{a}"))
        .collect();
    if !abandoned.is_empty() {
        model.violation(format!(
            "rows abandoned (the model predicts none): {abandoned:?}"
        ));
    }
}

/// FIFO: every row the pump took in order (not late, not poisoned or skipped by hand) was
/// processed in id order.
fn check_fifo(model: &mut Model, written: &[Written], recs: &BTreeMap<i64, Record>, t: &Timing) {
    let ours: HashSet<i64> = written.iter().map(|w| w.id).collect();
    let mut last: Option<(i64, i64)> = None;
    for (id, r) in recs {
        let in_order = ours.contains(id)
            && !t.late.contains(id)
            && !t.replayed.contains(id)
            && (r.state == "SUCCEEDED" || r.reason.as_deref() == Some("DUPLICATE"));
        let (true, Some(seq)) = (in_order, r.seq) else {
            continue;
        };
        if let Some((pid, pseq)) = last {
            if pseq > seq {
                model.violation(format!(
                    "FIFO: {id} (seq {seq}) processed before {pid} (seq {pseq})"
                ));
            }
        }
        last = Some((*id, seq));
    }
}

async fn check_marks(
    model: &mut Model,
    env: &TestEnv,
    rows: &BTreeMap<i64, End>,
    recs: &BTreeMap<i64, Record>,
) {
    let inbox: Vec<(i64, Option<String>)> = sqlx::query_as(
        "SELECT CMINMSGS_ID, CAST(CMINMSGS_STATUS AS CHAR) FROM CMINMSGS ORDER BY 1",
    )
    .fetch_all(&env.owner)
    .await
    .expect("inbox");
    let mut wrong = Vec::new();
    for (id, mark) in inbox {
        let expect = match rows.get(&id) {
            Some(End::Stock) => model.premarked.contains(&id).then_some("PROCESSED"),
            Some(End::Record(..)) => Some("PROCESSED"),
            None if recs.contains_key(&id) => Some("PROCESSED"),
            None => continue, // a foreign writer's row the check cannot judge
        };
        if mark.as_deref() != expect {
            wrong.push(format!("{id}: {mark:?} (expected {expect:?})"));
        }
    }
    let unconfirmed: Vec<i64> = recs
        .iter()
        .filter(|(_, r)| !r.marked && r.abandoned.is_none())
        .map(|r| *r.0)
        .collect();
    if !wrong.is_empty() {
        model.violation(format!("inbox marks: {}", wrong.join(", ")));
    }
    if !unconfirmed.is_empty() {
        model.violation(format!(
            "records whose mark is not confirmed: {unconfirmed:?}"
        ));
    }
}

/// Our flights (`W1F2`, `H104`, `S3`, `K50007`, `C50010` of a slow commit, `P50002` of a
/// replayed row's corrected text, …); a legacy plan's simulator flights are not
/// ours to predict.
pub fn ours(flid: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match flid.split_at_checked(1) {
        Some(("W", rest)) => rest
            .split_once('F')
            .is_some_and(|(a, b)| digits(a) && digits(b)),
        Some((p, rest)) => "HSKVQLCP".contains(p) && digits(rest),
        None => false,
    }
}

/// A `flight_state` row: flid, master, fields, versions, created by, updated by.
type FlightRow = (
    String,
    Option<String>,
    serde_json::Value,
    serde_json::Value,
    i64,
    i64,
);

/// Every column of our flights against the model: fields (all of them), each field's version
/// (message row and send time), the master, and the messages that created and last wrote it.
async fn check_flights(model: &mut Model, env: &TestEnv, expected: &BTreeMap<String, FlightEnd>) {
    let rows: Vec<FlightRow> = env
        .rows(
            "SELECT flid, master_flid, fields, versions, created_by_msg, updated_by_msg \
             FROM flight_state ORDER BY flid",
        )
        .await;
    let got: BTreeMap<String, FlightEnd> = rows
        .into_iter()
        .filter(|r| ours(&r.0))
        .map(|(flid, master, fields, versions, created_by, updated_by)| {
            let fields = fields
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.as_str().map_or(v.to_string(), String::from)))
                .collect();
            let versions = versions
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.clone(), stored_version(v)))
                .collect();
            let end = FlightEnd {
                fields,
                versions,
                master,
                created_by,
                updated_by,
            };
            (flid, end)
        })
        .collect();
    if &got != expected {
        let diff: Vec<String> = expected
            .keys()
            .chain(got.keys())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .filter(|k| expected.get(*k) != got.get(*k))
            .map(|k| format!("{k}: expected {:?}, got {:?}", expected.get(k), got.get(k)))
            .collect();
        model.violation(format!(
            "flights not as the model predicts: {}",
            diff.join("; ")
        ));
    }
}

/// A stored field version `{"at": …, "msg_id": …}` as (row, send time as UTC RFC 3339).
fn stored_version(v: &serde_json::Value) -> (i64, String) {
    let at = v["at"]
        .as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|t| {
            t.with_timezone(&chrono::Utc)
                .format("%Y-%m-%dT%H:%M:%SZ")
                .to_string()
        })
        .unwrap_or_else(|| format!("unreadable {v}"));
    (v["msg_id"].as_i64().unwrap_or(-1), at)
}

async fn check_events(
    model: &mut Model,
    env: &TestEnv,
    written: &[Written],
    e: &super::ops_reference::Expected,
    kafka: &[Received],
) {
    let expected = &e.events[..];
    let rows: Vec<(i64, i64, String, String, String)> = env
        .rows(
            "SELECT event_id, msg_id, flight_key, event_type, state FROM msg_event \
             ORDER BY event_id",
        )
        .await;
    let rows: Vec<_> = rows.into_iter().filter(|r| ours(&r.2)).collect();
    let mut want: Vec<(i64, String, String)> = expected
        .iter()
        .map(|(m, k, t)| (*m, k.clone(), t.to_string()))
        .collect();
    let mut got: Vec<(i64, String, String)> = rows
        .iter()
        .map(|r| (r.1, r.2.clone(), r.3.clone()))
        .collect();
    want.sort();
    got.sort();
    if want != got {
        let missing: Vec<_> = want.iter().filter(|w| !got.contains(w)).collect();
        let extra: Vec<_> = got.iter().filter(|g| !want.contains(g)).collect();
        model.violation(format!(
            "events not as the model predicts: missing {missing:?}, unexpected {extra:?}"
        ));
    }
    // Per key: the store's commit order and the topic's first sightings follow the model.
    let per_key = |evs: &mut dyn Iterator<Item = (String, i64)>| {
        let mut m: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        for (k, msg) in evs {
            m.entry(k).or_default().push(msg);
        }
        m
    };
    let model_order = per_key(&mut expected.iter().map(|e| (e.1.clone(), e.0)));
    let store_order = per_key(&mut rows.iter().map(|r| (r.2.clone(), r.1)));
    if model_order != store_order {
        model.violation(format!(
            "per-key event order: model {model_order:?}, store {store_order:?}"
        ));
    }
    let msg_of: HashMap<i64, i64> = rows.iter().map(|r| (r.0, r.1)).collect();
    let mut seen = HashSet::new();
    let mut topic: Vec<(String, i64)> = Vec::new();
    let mut by_part: BTreeMap<i32, Vec<&Received>> = BTreeMap::new();
    for r in kafka.iter().filter(|r| ours(&r.key)) {
        by_part.entry(r.partition).or_default().push(r);
    }
    for r in by_part.into_values().flatten() {
        if seen.insert(r.event_id()) {
            topic.push((
                r.key.clone(),
                msg_of.get(&r.event_id()).copied().unwrap_or(-1),
            ));
        }
    }
    let dups = kafka.iter().filter(|r| ours(&r.key)).count() - seen.len();
    model.kafka_duplicates = dups;
    let unsent: Vec<i64> = rows
        .iter()
        .filter(|r| r.4 != "SENT" || !seen.contains(&r.0))
        .map(|r| r.0)
        .collect();
    if !unsent.is_empty() {
        model.violation(format!("events not SENT or never read back: {unsent:?}"));
    }
    let all: HashSet<i64> = kafka.iter().map(Received::event_id).collect();
    let lost: Vec<&i64> = model
        .requeued
        .iter()
        .filter(|id| !all.contains(id))
        .collect();
    if !lost.is_empty() {
        model.violation(format!("requeued events never reached the topic: {lost:?}"));
    }
    check_requeued_across_takeover(model, kafka);
    // A requeued event may first be seen after later events of its key (docs/consuming-events
    // .md): it leaves the order check, every other event of the key keeps its place.
    let requeued_msgs: HashSet<(String, i64)> = rows
        .iter()
        .filter(|r| model.requeued.contains(&r.0))
        .map(|r| (r.2.clone(), r.1))
        .collect();
    let keep = |k: &String, m: &i64| !requeued_msgs.contains(&(k.clone(), *m));
    let topic_order = per_key(&mut topic.into_iter().filter(|(k, m)| keep(k, m)));
    let model_kept = per_key(
        &mut expected
            .iter()
            .map(|e| (e.1.clone(), e.0))
            .filter(|(k, m)| keep(k, m)),
    );
    if unsent.is_empty() && topic_order != model_kept {
        model.violation(format!(
            "per-key order on the topic (first sightings, {} requeued events aside): \
             {topic_order:?}, model {model_kept:?}",
            requeued_msgs.len()
        ));
    }
    super::ops_records::check_records(model, written, e, kafka);
    if dups > 0 && model.exactly_once {
        let copies = duplicate_copies(env, kafka).await;
        model.violation(format!(
            "{dups} duplicate records on the topic in exactly-once mode (0 expected whatever \
             the faults): {copies}"
        ));
    } else if dups > 0 && !model.duplicates_allowed {
        model.violation(format!(
            "{dups} duplicate records on the topic in a sequence without a crash, kill or \
             store cut (at-least-once allows them only there)"
        ));
    }
}

/// Events requeued while a takeover ran (a pair, `ops_pair_more`): on the topic once each in
/// exactly-once mode (at least once otherwise), and within a key first seen in event order.
fn check_requeued_across_takeover(model: &mut Model, kafka: &[Received]) {
    let ids: HashSet<i64> = model.requeued_across_takeover.iter().copied().collect();
    let mut seen: BTreeMap<i64, usize> = BTreeMap::new();
    let mut first: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for r in kafka.iter().filter(|r| ids.contains(&r.event_id())) {
        let n = seen.entry(r.event_id()).or_default();
        if *n == 0 {
            first.entry(&r.key).or_default().push(r.event_id());
        }
        *n += 1;
    }
    let wrong: Vec<(i64, usize)> = ids
        .iter()
        .map(|id| (*id, seen.get(id).copied().unwrap_or(0)))
        .filter(|(_, n)| *n == 0 || (*n > 1 && model.exactly_once))
        .collect();
    let unordered: Vec<(&str, Vec<i64>)> = first
        .into_iter()
        .filter(|(_, evs)| evs.windows(2).any(|w| w[0] > w[1]))
        .collect();
    if !wrong.is_empty() || !unordered.is_empty() {
        model.violation(format!(
            "events requeued across a takeover: not on the topic once each (event, copies) \
             {wrong:?}; out of event order within their key {unordered:?}"
        ));
    }
}

/// Each event read more than once: its copies (partition/offset) and where it was recorded
/// SENT, for a look at what the duplicate came from.
async fn duplicate_copies(env: &TestEnv, kafka: &[Received]) -> String {
    let mut by_id: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for r in kafka.iter().filter(|r| ours(&r.key)) {
        by_id
            .entry(r.event_id())
            .or_default()
            .push(format!("{}/{}", r.partition, r.offset));
    }
    by_id.retain(|_, at| at.len() > 1);
    let ids: Vec<i64> = by_id.keys().copied().collect();
    let sent: Vec<(i64, Option<i32>, Option<i64>)> = sqlx::query_as(
        "SELECT event_id, kafka_partition, kafka_offset FROM msg_event WHERE event_id = ANY($1)",
    )
    .bind(&ids)
    .fetch_all(env.store.pool())
    .await
    .unwrap_or_default();
    by_id
        .into_iter()
        .map(|(id, at)| {
            let s = sent.iter().find(|s| s.0 == id).map(|s| (s.1, s.2));
            format!("event {id} read at {at:?}, SENT at {s:?}")
        })
        .collect::<Vec<_>>()
        .join("; ")
}
