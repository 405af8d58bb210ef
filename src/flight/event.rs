//! The events a plan raises, as drafts for `MSG_EVENT` (the processor assigns ids).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::change::{FlightChange, ScheduleSnapshot};
use crate::codec::model::{Field, Meta};

/// The kind of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum EventType {
    /// A flight was created.
    FlightCreated,
    /// Fields of a flight changed.
    FlightUpdated,
    /// A flight was deleted (by name or as a master's code-share).
    FlightDeleted,
    /// A daily schedule (`DNLD`/`RESP`) was merged.
    ScheduleApplied,
}

impl EventType {
    /// Every event type the code can emit. The published contract (`docs/asyncapi.yaml`, one
    /// JSON Schema per type under `docs/schemas/`) names exactly these; `tests/event_contract.rs`
    /// checks it, and [`EventType::as_str`]'s exhaustive `match` plus the unit test below keep
    /// this list complete when a variant is added.
    pub const ALL: [EventType; 4] = [
        EventType::FlightCreated,
        EventType::FlightUpdated,
        EventType::FlightDeleted,
        EventType::ScheduleApplied,
    ];

    /// The type of a stored name (`msg_event.event_type`), if it is one of ours.
    pub fn from_name(name: &str) -> Option<EventType> {
        EventType::ALL.into_iter().find(|t| t.as_str() == name)
    }

    /// The `ce_dataschema` of this type's events: `msgx:schemas/<type>/v<N>`, a fixed absolute
    /// URI (scheme `msgx`, not fetchable on purpose: consumers map it to the `$id` of
    /// `docs/schemas/<type>.v<N>.json`). The version moves only on an incompatible change.
    pub fn schema_uri(self) -> String {
        format!(
            "msgx:schemas/{}/v{}",
            self.as_str().to_ascii_lowercase(),
            self.schema_version()
        )
    }

    /// The version of this type's payload schema (see [`EventType::schema_uri`]).
    pub fn schema_version(self) -> u32 {
        match self {
            EventType::FlightCreated
            | EventType::FlightUpdated
            | EventType::FlightDeleted
            | EventType::ScheduleApplied => 1,
        }
    }

    /// The stored and published name, e.g. `FLIGHT_CREATED`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::FlightCreated => "FLIGHT_CREATED",
            EventType::FlightUpdated => "FLIGHT_UPDATED",
            EventType::FlightDeleted => "FLIGHT_DELETED",
            EventType::ScheduleApplied => "SCHEDULE_APPLIED",
        }
    }
}

/// An event to queue: the processor inserts it as `MSG_EVENT` PENDING in the same transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventDraft {
    /// What happened.
    pub event_type: EventType,
    /// The Kafka key: the flight identity, or `SCHD:<YYYYMMDD>` for a schedule.
    pub flight_key: String,
    /// The JSON body (see [`EventDraft::for_change`] and [`EventDraft::schedule_applied`]).
    pub payload: Value,
}

impl EventDraft {
    /// The event for one flight change. Every payload has `msg_id`, `msg_type`, `subtype`,
    /// `sent_at` (RFC 3339 UTC) and `flid`; then
    /// - created: `after` (`{TAG: value}`);
    /// - updated: `changes` (`{TAG: {before, after}}`, `null` for absent) and `after`;
    /// - deleted: `before` and `cascade_of` (master `FLID` or `null`).
    pub fn for_change(change: &FlightChange, meta: &Meta, msg_id: i64) -> EventDraft {
        let mut payload = Map::new();
        payload.insert("msg_id".into(), json!(msg_id));
        payload.insert("msg_type".into(), json!(meta.msg_type));
        payload.insert("subtype".into(), json!(meta.subtype));
        payload.insert("sent_at".into(), json!(meta.sent_at.to_rfc3339()));
        payload.insert("flid".into(), json!(change.flid()));
        let (event_type, flight_key) = match change {
            FlightChange::Created { after } => {
                payload.insert("after".into(), fields_json(&after.fields));
                (EventType::FlightCreated, after.key())
            }
            FlightChange::Updated {
                before,
                after,
                changed,
            } => {
                let changes: Map<String, Value> = changed
                    .iter()
                    .map(|f| {
                        let pair = json!({"before": before.get(*f), "after": after.get(*f)});
                        (f.tag().to_string(), pair)
                    })
                    .collect();
                payload.insert("changes".into(), Value::Object(changes));
                payload.insert("after".into(), fields_json(&after.fields));
                (EventType::FlightUpdated, after.key())
            }
            FlightChange::Deleted { before, cascade_of } => {
                payload.insert("before".into(), fields_json(&before.fields));
                payload.insert("cascade_of".into(), json!(cascade_of));
                (EventType::FlightDeleted, before.key())
            }
        };
        EventDraft {
            event_type,
            flight_key: flight_key.to_string(),
            payload: Value::Object(payload),
        }
    }

    /// The `SCHEDULE_APPLIED` event: key `SCHD:<YYYYMMDD>`, payload `msg_id`, `date`
    /// (`YYYYMMDD`), `kind`, `flights`, `created`, `updated`, `unchanged`, `request_id`.
    pub fn schedule_applied(snapshot: &ScheduleSnapshot, msg_id: i64) -> EventDraft {
        let date = snapshot.date.format("%Y%m%d").to_string();
        EventDraft {
            event_type: EventType::ScheduleApplied,
            flight_key: format!("SCHD:{date}"),
            payload: json!({
                "msg_id": msg_id,
                "date": date,
                "kind": snapshot.kind,
                "flights": snapshot.flights,
                "created": snapshot.created,
                "updated": snapshot.updated,
                "unchanged": snapshot.unchanged,
                "request_id": snapshot.request_id,
            }),
        }
    }
}

/// `{TAG: value}` for a flight's fields.
fn fields_json(fields: &BTreeMap<Field, String>) -> Value {
    Value::Object(
        fields
            .iter()
            .map(|(f, v)| (f.tag().to_string(), Value::String(v.clone())))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::EventType;

    /// A new variant must be added to [`EventType::ALL`] (and so to the published contract):
    /// the `match` stops compiling without an arm, the position check fails without the entry.
    #[test]
    fn all_lists_every_variant_once() {
        for t in EventType::ALL {
            let pos = match t {
                EventType::FlightCreated => 0,
                EventType::FlightUpdated => 1,
                EventType::FlightDeleted => 2,
                EventType::ScheduleApplied => 3,
            };
            assert_eq!(EventType::ALL[pos], t);
            assert_eq!(EventType::from_name(t.as_str()), Some(t));
        }
        assert_eq!(EventType::from_name("NOPE"), None);
        assert_eq!(
            EventType::FlightUpdated.schema_uri(),
            "msgx:schemas/flight_updated/v1"
        );
    }
}
