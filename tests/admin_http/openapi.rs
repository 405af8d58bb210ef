//! `docs/openapi.json` against the real router and the real server: routes, methods,
//! examples and the answers to them, checked with a small JSON-schema validator.

use actix_web::{test, App};
use msgx_actors::admin::configure;
use serde_json::Value;

use super::common::TestEnv;
use super::{call, seed, serve, state, TOKEN};

fn openapi() -> Value {
    let path = super::common::repo_root().join("docs/openapi.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("docs/openapi.json"))
        .expect("valid JSON")
}

/// A small JSON-schema check of what the document uses: `$ref`, `oneOf`, `type` (or a list of
/// types), `required`, `properties`, `additionalProperties: false`, `items`, `enum`, `minimum`,
/// `maximum`, `minItems`, `maxItems`, `minLength`, `maxLength` (`pattern` is not checked).
/// Returns the first violation.
fn violation(doc: &Value, schema: &Value, v: &Value, at: &str) -> Option<String> {
    if let Some(r) = schema["$ref"].as_str() {
        let name = r.trim_start_matches("#/components/schemas/");
        return violation(doc, &doc["components"]["schemas"][name], v, at);
    }
    if let Some(options) = schema["oneOf"].as_array() {
        let matched = options
            .iter()
            .filter(|o| violation(doc, o, v, at).is_none())
            .count();
        if matched != 1 {
            return Some(format!("{at}: {v} matches {matched} of the oneOf shapes"));
        }
    }
    if let Some(n) = v.as_str().map(|s| s.chars().count() as u64) {
        let (min, max) = (schema["minLength"].as_u64(), schema["maxLength"].as_u64());
        if min.is_some_and(|m| n < m) || max.is_some_and(|m| n > m) {
            return Some(format!("{at}: length {n} outside {min:?}..={max:?}"));
        }
    }
    let type_ok = |t: &str| match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        _ => false,
    };
    let types: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    if !types.is_empty() && !types.iter().any(|t| type_ok(t)) {
        return Some(format!("{at}: {v} is not {types:?}"));
    }
    if let Some(options) = schema["enum"].as_array() {
        if !v.is_null() && !options.contains(v) {
            return Some(format!("{at}: {v} not in {options:?}"));
        }
    }
    if let (Some(min), Some(n)) = (schema["minimum"].as_i64(), v.as_i64()) {
        if n < min {
            return Some(format!("{at}: {n} < {min}"));
        }
    }
    if let (Some(max), Some(n)) = (schema["maximum"].as_i64(), v.as_i64()) {
        if n > max {
            return Some(format!("{at}: {n} > {max}"));
        }
    }
    if let Some(obj) = v.as_object() {
        for key in schema["required"].as_array().into_iter().flatten() {
            let key = key.as_str().unwrap_or_default();
            if !obj.contains_key(key) {
                return Some(format!("{at}: missing `{key}`"));
            }
        }
        for (key, value) in obj {
            match schema["properties"].get(key) {
                Some(s) => {
                    if let Some(e) = violation(doc, s, value, &format!("{at}.{key}")) {
                        return Some(e);
                    }
                }
                None if schema["additionalProperties"] == false => {
                    return Some(format!("{at}: `{key}` is not documented"))
                }
                None => {}
            }
        }
    }
    if let Some(items) = v.as_array() {
        if let Some(max) = schema["maxItems"].as_u64() {
            if items.len() as u64 > max {
                return Some(format!("{at}: more than {max} items"));
            }
        }
        if let Some(min) = schema["minItems"].as_u64() {
            if (items.len() as u64) < min {
                return Some(format!("{at}: fewer than {min} items"));
            }
        }
        for (i, item) in items.iter().enumerate() {
            if let Some(e) = violation(doc, &schema["items"], item, &format!("{at}[{i}]")) {
                return Some(e);
            }
        }
    }
    None
}

/// The full paths of the leaf resources in actix's `ResourceMap` debug dump (scopes nest:
/// `nodes: Some([…]) }` opens and closes a scope; a leaf ends with `nodes: None`).
fn resource_paths(dump: &str) -> Vec<String> {
    let mut marks: Vec<(usize, &str)> = Vec::new();
    for m in [
        "patterns: Single(\"",
        "nodes: None",
        "nodes: Some([",
        "]) }",
    ] {
        marks.extend(dump.match_indices(m));
    }
    marks.sort();
    let (mut stack, mut current, mut out) = (Vec::<String>::new(), String::new(), Vec::new());
    for (at, mark) in marks {
        match mark {
            "nodes: None" => out.push(format!("{}{current}", stack.concat())),
            "nodes: Some([" => stack.push(current.clone()),
            "]) }" => {
                stack.pop();
            }
            _ => {
                let rest = &dump[at + mark.len()..];
                current = rest[..rest.find('"').unwrap_or(0)].to_string();
            }
        }
    }
    out
}

/// The request examples of an operation (`example` or every `examples.*.value`).
fn request_examples(op: &Value) -> Vec<Value> {
    let media = &op["requestBody"]["content"]["application/json"];
    let mut out: Vec<Value> = media.get("example").cloned().into_iter().collect();
    if let Some(map) = media["examples"].as_object() {
        out.extend(map.values().map(|e| e["value"].clone()));
    }
    out
}

/// `docs/openapi.json` against the real server: every served route is documented and every
/// documented route is served (other methods 405, unknown paths 404); every example validates
/// against its schema and parses into the real request type; each request example sent to the
/// server gets a documented status, and the real 2xx bodies validate against their schemas.
#[actix_rt::test]
async fn openapi_document_matches_the_real_router() {
    let env = TestEnv::new("admin_openapi").await;
    seed(&env).await;
    let doc = openapi();
    assert!(doc["openapi"]
        .as_str()
        .unwrap_or_default()
        .starts_with("3."));
    every_route_is_documented(&env, &doc).await;
    let (port, stop) = serve(&env).await;
    methods_and_paths_answer_as_documented(port, &doc).await;
    examples_validate_and_parse(&doc);
    examples_sent_get_documented_answers(port, &doc).await;
    stop.stop(true).await;
    env.cleanup().await;
}

/// Every route documented, every documented route listed, and the router's own resource tree
/// (the same configuration `serve` uses) serves exactly the documented paths.
async fn every_route_is_documented(env: &TestEnv, doc: &Value) {
    let mut documented: Vec<(String, String)> = Vec::new();
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for method in ops.as_object().expect("ops").keys() {
            documented.push((method.to_uppercase(), path.clone()));
        }
    }
    documented.sort();
    let mut served: Vec<(String, String)> = msgx_actors::http::ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    served.sort();
    assert_eq!(
        documented, served,
        "every route documented, every documented route listed"
    );
    // The router's own resource tree (the same configuration `serve` uses): every path it
    // serves is documented.
    let tree = test::init_service(
        App::new()
            .configure(msgx_actors::http::open_routes)
            .configure(configure(state(env)))
            .default_service(actix_web::web::to(
                |req: actix_web::HttpRequest| async move {
                    actix_web::HttpResponse::Ok().body(format!("{:?}", req.resource_map()))
                },
            )),
    )
    .await;
    let dump = test::read_body(
        test::call_service(
            &tree,
            test::TestRequest::get().uri("/no-such-route").to_request(),
        )
        .await,
    )
    .await;
    let mut router_paths = resource_paths(&String::from_utf8_lossy(&dump));
    router_paths.sort();
    let mut doc_paths: Vec<String> = doc["paths"]
        .as_object()
        .expect("paths")
        .keys()
        .cloned()
        .collect();
    doc_paths.sort();
    assert_eq!(
        router_paths, doc_paths,
        "the router's paths are the documented ones"
    );
}

/// Every documented method of every path is served; the others answer 405, unknown paths 404.
async fn methods_and_paths_answer_as_documented(port: u16, doc: &Value) {
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        let concrete = path.replace("{msg_id}", "1");
        for method in ["GET", "POST", "PUT", "DELETE", "PATCH"] {
            let (status, _) = call(port, method, &concrete, None, None).await;
            if ops.get(method.to_lowercase()).is_some() {
                assert!(
                    ![404, 405].contains(&status),
                    "{method} {path} is served: {status}"
                );
            } else {
                assert_eq!(status, 405, "{method} {path} is not a route");
            }
        }
    }
    for unknown in [
        "/admin",
        "/admin/nothing",
        "/cminmsgs/receive",
        "/metrics/x",
    ] {
        assert_eq!(
            call(port, "GET", unknown, Some(TOKEN), None).await.0,
            404,
            "{unknown}"
        );
    }
}

/// Every example is valid against its schema; the request examples parse into the real
/// request types.
fn examples_validate_and_parse(doc: &Value) {
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for (method, op) in ops.as_object().expect("ops") {
            let schema = &op["requestBody"]["content"]["application/json"]["schema"];
            for ex in request_examples(op) {
                assert_eq!(
                    violation(doc, schema, &ex, "request"),
                    None,
                    "{method} {path}: {ex}"
                );
            }
            for (code, resp) in op["responses"].as_object().expect("responses") {
                for (_, media) in resp["content"].as_object().into_iter().flatten() {
                    if let Some(ex) = media.get("example") {
                        let v = violation(doc, &media["schema"], ex, "response");
                        assert_eq!(v, None, "{method} {path} {code}: {ex}");
                    }
                }
            }
        }
    }
    // The request examples parse into the real request types…
    let op = |path: &str, method: &str| doc["paths"][path][method].clone();
    for ex in request_examples(&op("/admin/replay", "post")) {
        serde_json::from_value::<msgx_core::ops::ReplayRequest>(ex).expect("ReplayRequest");
    }
    for ex in request_examples(&op("/admin/recover-backfill", "post")) {
        serde_json::from_value::<msgx_core::ops::RecoverRequest>(ex).expect("RecoverRequest");
    }
    for ex in request_examples(&op("/admin/events/requeue", "post")) {
        serde_json::from_value::<msgx_core::ops::RequeueRequest>(ex).expect("RequeueRequest");
    }
    for ex in request_examples(&op("/cminmsgs/send", "post")) {
        serde_json::from_value::<msgx_core::ops::CompatRequest>(ex).expect("CompatRequest");
    }
}

/// Each request example sent to the server gets a documented status; 2xx bodies validate.
async fn examples_sent_get_documented_answers(port: u16, doc: &Value) {
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for (method, op) in ops.as_object().expect("ops") {
            let mut bodies: Vec<Option<Value>> =
                request_examples(op).into_iter().map(Some).collect();
            if bodies.is_empty() {
                bodies.push(None);
            }
            for body in bodies {
                let concrete = path.replace("{msg_id}", "1");
                let (status, text) = call(
                    port,
                    &method.to_uppercase(),
                    &concrete,
                    Some(TOKEN),
                    body.as_ref(),
                )
                .await;
                let resp = &op["responses"][status.to_string()];
                assert!(
                    resp.is_object(),
                    "{method} {path} answered undocumented {status}: {text}"
                );
                if (200..300).contains(&status) {
                    if let Some(schema) = resp["content"]["application/json"].get("schema") {
                        let v: Value = serde_json::from_str(&text).expect("JSON body");
                        assert_eq!(
                            violation(doc, schema, &v, "body"),
                            None,
                            "{method} {path}: {v}"
                        );
                    }
                }
            }
        }
    }
}
