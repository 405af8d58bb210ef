//! The published event contract (`docs/asyncapi.yaml`, `docs/schemas/*.json`) as validators:
//! one JSON Schema (draft 2020-12, formats checked) per event type for the payload, and the
//! document's header schemas for the records read back from a broker.

use std::collections::BTreeMap;

use jsonschema::Validator;
use msgx_core::flight::EventType;
use serde_json::{json, Value};

/// `docs/asyncapi.yaml` as JSON.
pub fn asyncapi() -> Value {
    let text = std::fs::read_to_string(crate::repo_root().join("docs/asyncapi.yaml"))
        .expect("asyncapi.yaml");
    serde_yaml_ng::from_str(&text).expect("asyncapi.yaml is YAML")
}

/// The schema file of an event type, relative to `docs/`.
pub fn schema_file(t: EventType) -> String {
    format!(
        "schemas/{}.v{}.json",
        t.as_str().to_ascii_lowercase(),
        t.schema_version()
    )
}

fn compile(schema: &Value, what: &str) -> Validator {
    jsonschema::draft202012::options()
        .should_validate_formats(true)
        .build(schema)
        .unwrap_or_else(|e| panic!("{what} is not a valid JSON Schema 2020-12: {e}"))
}

/// Every error of `instance` against `v`, one line each (empty when valid).
fn errors(v: &Validator, instance: &Value) -> Vec<String> {
    v.iter_errors(instance)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

/// The payload validators, by event type and by `ce_dataschema`.
pub struct Contract {
    payloads: BTreeMap<&'static str, (String, Validator)>,
}

impl Contract {
    /// Loads and compiles `docs/schemas/<type>.v<N>.json` for every [`EventType::ALL`]; each
    /// file's `$id` must be the type's `ce_dataschema`.
    pub fn load() -> Self {
        let mut payloads = BTreeMap::new();
        for t in EventType::ALL {
            let path = crate::repo_root().join("docs").join(schema_file(t));
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let schema: Value = serde_json::from_str(&text).expect("schema is JSON");
            assert_eq!(
                schema["$schema"],
                "https://json-schema.org/draft/2020-12/schema",
                "{}",
                path.display()
            );
            assert_eq!(schema["$id"], json!(t.schema_uri()), "{}", path.display());
            let v = compile(&schema, &path.display().to_string());
            payloads.insert(t.as_str(), (t.schema_uri(), v));
        }
        Self { payloads }
    }

    /// Panics unless `payload` is a valid `event_type` body.
    pub fn check_payload(&self, event_type: &str, payload: &Value) {
        let (_, v) = self
            .payloads
            .get(event_type)
            .unwrap_or_else(|| panic!("event type {event_type} has no schema"));
        let errs = errors(v, payload);
        assert!(errs.is_empty(), "{event_type} {payload}: {errs:?}");
    }

    /// Panics unless `payload` is valid against the schema `ce_dataschema` names.
    pub fn check_by_dataschema(&self, dataschema: &str, payload: &Value) {
        let (name, _) = self
            .payloads
            .iter()
            .find(|(_, (uri, _))| uri == dataschema)
            .unwrap_or_else(|| panic!("no schema has $id {dataschema}"));
        self.check_payload(name, payload);
    }
}

/// The header schema of message `message` (a `components.messages` name, e.g. `flightUpdated`
/// or `flightUpdatedDead`) of `docs/asyncapi.yaml`, compiled with the document's
/// `components.schemas` as `$defs`.
pub fn header_validator(doc: &Value, message: &str) -> Validator {
    part_validator(doc, message, "/headers")
}

/// The Kafka key schema (`bindings.kafka.key`) of message `message`, compiled likewise.
pub fn key_validator(doc: &Value, message: &str) -> Validator {
    part_validator(doc, message, "/bindings/kafka/key")
}

fn part_validator(doc: &Value, message: &str, pointer: &str) -> Validator {
    let part = doc["components"]["messages"][message]
        .pointer(pointer)
        .unwrap_or_else(|| panic!("message {message} has no {pointer}"));
    let wrapped = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$defs": doc["components"]["schemas"],
        "allOf": [part],
    });
    let text = wrapped
        .to_string()
        .replace("#/components/schemas/", "#/$defs/");
    let schema: Value = serde_json::from_str(&text).expect("json");
    compile(&schema, &format!("{pointer} of {message}"))
}

/// Panics unless `key` is valid against `v`.
pub fn check_key(v: &Validator, key: &str, what: &str) {
    let errs = errors(v, &Value::String(key.to_string()));
    assert!(errs.is_empty(), "{what} key {key:?}: {errs:?}");
}

/// Panics unless the header map is valid against `v`.
pub fn check_headers(v: &Validator, headers: &BTreeMap<String, String>, what: &str) {
    let instance = serde_json::to_value(headers).expect("headers");
    let errs = errors(v, &instance);
    assert!(errs.is_empty(), "{what} {instance}: {errs:?}");
}

/// The `components.messages` name of an event type, e.g. `flightUpdated`.
pub fn message_name(t: EventType) -> String {
    let lower = t.as_str().to_ascii_lowercase();
    let mut out = String::new();
    let mut upper = false;
    for c in lower.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// Validates every event in `msg_event` against its type's schema (for pipeline tests whose
/// events all come from the real pump); returns how many were checked.
pub async fn check_stored_events(store: &msgx_core::store::Store) -> usize {
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT event_type, payload::text FROM msg_event ORDER BY event_id")
            .fetch_all(store.pool())
            .await
            .expect("events");
    let contract = Contract::load();
    for (t, payload) in &rows {
        contract.check_payload(t, &serde_json::from_str(payload).expect("JSON payload"));
    }
    rows.len()
}
