//! The records on the sequence's topic against the model's events, one by one: headers, key
//! and body.

use std::collections::{HashMap, HashSet};

use super::ops_check::ours;
use super::ops_model::Model;
use super::ops_msgs::Msg;
use super::ops_reference::{Expected, Written};
use crate::common::kafka::Received;

/// Every record on the topic (each `ce_id` once; read as a string, whatever form it takes)
/// against the model's events, matched by `ce_msgxmsgid`: `ce_type`, `ce_subject` and the key,
/// and the body's `msg_id`, `msg_type`, `flid`, and its `after`, `changes` and `before` as
/// the model has them ([`super::ops_reference::Expected::bodies`]: every field of the flight
/// after a create or update, each changed field's before and after, the fields a delete
/// removed). The multiset of (message, key, type) read back is the model's.
pub fn check_records(model: &mut Model, written: &[Written], e: &Expected, kafka: &[Received]) {
    let expected = &e.events[..];
    let msgs: HashMap<i64, &Msg> = written.iter().map(|w| (w.id, &w.msg)).collect();
    let mut seen = HashSet::new();
    let mut got: Vec<(i64, String, String)> = Vec::new();
    let mut bad = Vec::new();
    for r in kafka.iter().filter(|r| ours(&r.key)) {
        let id = r.headers.get("ce_id").cloned().unwrap_or_default();
        if !seen.insert(id.clone()) {
            continue;
        }
        let msg_id: i64 = r
            .headers
            .get("ce_msgxmsgid")
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1);
        let ce_type = r.headers.get("ce_type").cloned().unwrap_or_default();
        let ty = ce_type.strip_prefix("msgx.").unwrap_or("?").to_uppercase();
        got.push((msg_id, r.key.clone(), ty.clone()));
        let body: serde_json::Value = serde_json::from_str(&r.payload).unwrap_or_default();
        let mut wrong = Vec::new();
        if r.headers.get("ce_subject") != Some(&r.key) {
            wrong.push(format!("ce_subject {:?}", r.headers.get("ce_subject")));
        }
        if body["msg_id"].as_i64() != Some(msg_id) {
            wrong.push(format!("body msg_id {}", body["msg_id"]));
        }
        let kind = match msgs.get(&msg_id) {
            Some(Msg::Flop { flid, .. }) => Some(("FLOP", flid)),
            Some(Msg::Fdel { flid, .. }) => Some(("FDEL", flid)),
            _ => None,
        };
        match kind {
            Some((mt, flid)) if body["msg_type"] != mt || body["flid"] != flid.as_str() => {
                wrong.push(format!(
                    "msg_type/flid {}/{}",
                    body["msg_type"], body["flid"]
                ));
            }
            Some(_) => {}
            None if !model.foreign_writers => wrong.push("no message of the model".into()),
            None => {}
        }
        // The body against the model's, where the model predicts this very event.
        let predicted = expected
            .iter()
            .any(|(m, k, t)| *m == msg_id && *k == r.key && *t == ty);
        if let Some(want) = e.bodies.get(&msg_id).filter(|_| predicted) {
            for (part, v) in want.as_object().into_iter().flatten() {
                if body[part] != *v {
                    wrong.push(format!("{part} {} (the model: {v})", body[part]));
                }
            }
        }
        if !wrong.is_empty() {
            bad.push(format!(
                "ce_id {id} (msg {msg_id}, {ce_type}): {}",
                wrong.join(", ")
            ));
        }
    }
    if !bad.is_empty() {
        model.violation(format!(
            "records on the topic not as the model's events: {bad:?}"
        ));
    }
    let mut want: Vec<(i64, String, String)> = expected
        .iter()
        .map(|(m, k, t)| (*m, k.clone(), t.to_string()))
        .collect();
    want.sort();
    got.sort();
    if want != got && !model.foreign_writers {
        let missing: Vec<_> = want.iter().filter(|w| !got.contains(w)).collect();
        let extra: Vec<_> = got.iter().filter(|g| !want.contains(g)).collect();
        model.violation(format!(
            "the topic's events are not the model's: missing {missing:?}, unexpected {extra:?}"
        ));
    }
}
