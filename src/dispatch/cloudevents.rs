//! CloudEvents 1.0, Kafka protocol binding, binary content mode: the event's attributes travel
//! as `ce_*` headers, the value is the JSON body (`content-type: application/json`). Any
//! CloudEvents consumer can read them and de-duplicate on (`ce_source`, `ce_id`): `ce_id` is
//! the event's UUID, made once with the event and never made again by any store, and
//! `ce_source` names the deployment (`kafka.ce_source`).

use chrono::SecondsFormat;
use rdkafka::message::{Header, OwnedHeaders};

use crate::flight::EventType;
use crate::store::events::PendingEvent;

/// The extension header carrying `MSG_EVENT.EVENT_ID` (declared by the broker adapter, which
/// reads it back to recognise its own records).
pub use crate::kafka::consumer::EVENT_HEADER;

/// `ce_type` of an event: `msgx.` + the lower-case event type, e.g. `msgx.flight_updated`.
pub fn ce_type(event_type: &str) -> String {
    format!("msgx.{}", event_type.to_ascii_lowercase())
}

/// The attribute headers as (name, value) pairs. `ce_dataschema` names the payload's JSON
/// Schema ([`EventType::schema_uri`]); an event type this binary does not know (a row written
/// by another version) goes without it rather than with a wrong one.
pub fn attributes(ev: &PendingEvent, source: &str) -> Vec<(&'static str, String)> {
    let mut out = base_attributes(ev, source);
    if let Some(t) = EventType::from_name(&ev.event_type) {
        out.push(("ce_dataschema", t.schema_uri()));
    }
    out
}

/// The attributes every event carries.
fn base_attributes(ev: &PendingEvent, source: &str) -> Vec<(&'static str, String)> {
    vec![
        ("ce_specversion", "1.0".to_string()),
        ("ce_id", ev.ce_id.clone()),
        ("ce_source", source.to_string()),
        ("ce_type", ce_type(&ev.event_type)),
        (
            "ce_time",
            ev.created_at.to_rfc3339_opts(SecondsFormat::Millis, true),
        ),
        ("ce_subject", ev.flight_key.clone()),
        ("content-type", "application/json".to_string()),
        // Extensions: the inbox message the event came from (operators trace it back), and
        // the event's row in our store (with `ce_id`, how the recovery knows its own records).
        ("ce_msgxmsgid", ev.msg_id.to_string()),
        (EVENT_HEADER, ev.event_id.to_string()),
    ]
}

/// The extension header of a dead-letter copy carrying the event's own `ce_id`.
pub const ORIGINAL_ID_HEADER: &str = "ce_msgxoriginalid";

/// A dead-letter copy's headers: the event's attributes under an identity of its own
/// (`ce_id` = the copy's, made anew by each requeue; the event's `ce_id` in
/// [`ORIGINAL_ID_HEADER`]), so one de-duplication store across both topics never drops the
/// event when a requeue delivers it; then why, after how many attempts, and where it was
/// meant to go.
pub fn dead_letter_attributes(
    ev: &PendingEvent,
    source: &str,
    original_topic: &str,
) -> Vec<(&'static str, String)> {
    let mut out = attributes(ev, source);
    for (name, value) in out.iter_mut() {
        if *name == "ce_id" {
            *value = ev.dead_ce_id.clone();
        }
    }
    out.push((ORIGINAL_ID_HEADER, ev.ce_id.clone()));
    out.extend(dead_letter_extras(ev, original_topic));
    out
}

/// Dead-letter extras: why and after how many attempts, and where it was meant to go.
fn dead_letter_extras(ev: &PendingEvent, original_topic: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            "ce_msgxerror",
            ev.last_error.clone().unwrap_or_else(|| "unknown".into()),
        ),
        ("ce_msgxattempts", ev.attempts.to_string()),
        ("ce_msgxorigtopic", original_topic.to_string()),
    ]
}

/// Pairs → Kafka headers.
pub fn to_headers(pairs: &[(&'static str, String)]) -> OwnedHeaders {
    pairs
        .iter()
        .fold(OwnedHeaders::new_with_capacity(pairs.len()), |h, (k, v)| {
            h.insert(Header {
                key: k,
                value: Some(v.as_str()),
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};

    #[test]
    fn attributes_follow_the_binary_binding() {
        let ev = PendingEvent {
            event_id: 42,
            ce_id: "0192a7b0-7c1e-4f6a-9d2b-3e4f5a6b7c8d".into(),
            msg_id: 7,
            flight_key: "CA1234-20261130-D".into(),
            event_type: "FLIGHT_UPDATED".into(),
            payload: "{}".into(),
            attempts: 0,
            created_at: Utc.with_ymd_and_hms(2026, 11, 30, 1, 2, 3).unwrap(),
            last_error: None,
            dead_ce_id: "0192a7b0-7c1e-4f6a-9d2b-00000000dead".into(),
            trace_parent: None,
            trace_state: None,
        };
        let a = attributes(&ev, "/msgexchange");
        let get = |k: &str| a.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("ce_specversion"), Some("1.0"));
        assert_eq!(get("ce_id"), Some("0192a7b0-7c1e-4f6a-9d2b-3e4f5a6b7c8d"));
        assert_eq!(get("ce_msgxevent"), Some("42"));
        assert_eq!(get("ce_type"), Some("msgx.flight_updated"));
        assert_eq!(get("ce_time"), Some("2026-11-30T01:02:03.000Z"));
        assert_eq!(get("ce_msgxmsgid"), Some("7"));
        assert_eq!(get("ce_dataschema"), Some("msgx:schemas/flight_updated/v1"));
        let unknown = PendingEvent {
            event_type: "FROM_A_NEWER_BINARY".into(),
            ..ev.clone()
        };
        let u = attributes(&unknown, "/msgexchange");
        assert!(u.iter().all(|(k, _)| *k != "ce_dataschema"));
        let dl = dead_letter_attributes(&ev, "/msgexchange", "msgx.flight-events");
        let get_dl = |k: &str| dl.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
        assert_eq!(
            get_dl("ce_id"),
            Some("0192a7b0-7c1e-4f6a-9d2b-00000000dead")
        );
        assert_eq!(
            get_dl("ce_msgxoriginalid"),
            Some("0192a7b0-7c1e-4f6a-9d2b-3e4f5a6b7c8d")
        );
        assert_eq!(dl.iter().filter(|(n, _)| *n == "ce_id").count(), 1);
        // CloudEvents attribute names: lower-case a-z0-9 only after the `ce_` prefix.
        for (k, _) in a.iter().chain(&dl) {
            if let Some(attr) = k.strip_prefix("ce_") {
                assert!(attr
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()));
            }
        }
    }
}
