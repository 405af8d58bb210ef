//! Observability checked against the real thing (issue 14, items 4–6).
//!
//! `dashboards_and_alerts_live`: the real `msgexchange` binary (MariaDB, PostgreSQL, tansu)
//! fed by the upstream simulator, scraped every second by a real Prometheus (Debian's
//! `prometheus`, installed by `scripts/test.sh`) that loads `prometheus/alerts.yml`. Every
//! PromQL expression of every panel of `grafana/dashboards/*.json` and of every rule is then
//! evaluated through the HTTP API: the test fails on an expression Prometheus rejects, on a
//! metric name the service does not export, on a panel query with no series after warm-up,
//! and on a rule not loaded healthy. Without `prometheus` it skips loudly, unless `CI` is set.
//!
//! `compose_*`: `docker-compose.yml` parsed and cross-checked with `config/default.toml`,
//! `prometheus/prometheus.yml` and the Grafana provisioning (no Docker daemon needed).
//!
//! `scenario_for_pictures` (ignored; by hand): a longer run with a held inbox transaction (a
//! hole, then a late arrival), a poison head and a service outage (a backlog, then its drain),
//! dumping Prometheus `query_range` data of every panel for `scripts/render_dashboards.py`
//! (docs/dashboards.md says how to rerun it).

use msgx_testkit as common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::service::free_port;
use common::tansu::Tansu;
use common::TestEnv;
use serde_json::Value;

// ---------------------------------------------------------------------------------------------
// Minimal HTTP (HTTP/1.0: the server answers without chunking and closes).

fn urlencode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// `GET path` on 127.0.0.1:port: (status code, body).
async fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    // HTTP/1.0: Prometheus (Go's server) then answers unchunked, so the body is the JSON itself.
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    let text = common::http::exchange(port, request, common::http::ANSWER_LIMIT).await?;
    if !text.contains("\r\n\r\n") {
        return Err(std::io::Error::other("no header end"));
    }
    Ok((
        common::http::status(&text),
        common::http::body(&text).to_string(),
    ))
}

// ---------------------------------------------------------------------------------------------
// A real Prometheus on loopback.

/// The Prometheus binary: `MSGEXCHANGE_PROMETHEUS`, else `prometheus` on PATH. None when missing.
fn prometheus_binary() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("MSGEXCHANGE_PROMETHEUS") {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("prometheus"))
            .find(|p| p.is_file())
    })
}

/// Prometheus or, outside CI, None after saying loudly that the test is skipped.
fn prometheus_or_skip(test: &str) -> Option<PathBuf> {
    let found = prometheus_binary();
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "prometheus not found and CI is set: install Debian's prometheus (scripts/test.sh does)"
        );
        eprintln!("SKIPPED {test}: prometheus not found (apt-get install prometheus)");
    }
    found
}

/// A running Prometheus scraping one target every second; killed on drop.
struct Prometheus {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Prometheus {
    /// Starts it with a generated config (scrape and rule evaluation every 1s, the repo's
    /// alerts as `rule_files`) and waits until it is ready.
    async fn start(bin: &Path, target: &str, tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("msgx-prom-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("prometheus dir");
        let alerts = common::repo_root().join("prometheus/alerts.yml");
        let alerts = alerts.canonicalize().expect("prometheus/alerts.yml");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n\
             rule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: msgexchange\n    static_configs:\n      - targets: [\"{target}\"]\n        labels: {{ msgx_service: msgexchange }}\n",
            alerts.display()
        );
        std::fs::write(dir.join("prometheus.yml"), config).expect("write prometheus.yml");
        let port = free_port();
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("log");
        let child = Command::new(bin)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn prometheus");
        let p = Self { child, port, dir };
        let start = Instant::now();
        while !matches!(http_get(p.port, "/-/ready").await, Ok((200, _))) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "prometheus not ready (log: {})",
                p.dir.join("prometheus.log").display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        p
    }

    /// An API call: `data` on success, the API's error text otherwise.
    async fn api(&self, path: &str) -> Result<Value, String> {
        let (code, body) = http_get(self.port, path)
            .await
            .map_err(|e| format!("prometheus unreachable: {e}"))?;
        let v: Value =
            serde_json::from_str(&body).map_err(|e| format!("HTTP {code}, not JSON: {e}"))?;
        if v["status"] == "success" {
            Ok(v["data"].clone())
        } else {
            Err(format!(
                "{}: {}",
                v["errorType"].as_str().unwrap_or("?"),
                v["error"].as_str().unwrap_or("?")
            ))
        }
    }

    /// Instant query: its result vector (or the parse/evaluation error).
    async fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let data = self
            .api(&format!("/api/v1/query?query={}", urlencode(expr)))
            .await?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// Range query: its result matrix.
    async fn query_range(
        &self,
        expr: &str,
        start: f64,
        end: f64,
        step: f64,
    ) -> Result<Value, String> {
        let data = self
            .api(&format!(
                "/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step={step}",
                urlencode(expr)
            ))
            .await?;
        Ok(data["result"].clone())
    }

    /// Every metric name Prometheus holds (what the service exported, plus its own `up`...).
    async fn names(&self) -> BTreeSet<String> {
        let data = self
            .api("/api/v1/label/__name__/values")
            .await
            .expect("label values");
        data.as_array()
            .expect("names")
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect()
    }

    /// Number of scrapes of the target so far that succeeded.
    async fn good_scrapes(&self) -> f64 {
        match self.query("sum_over_time(up[10m])").await {
            Ok(r) => r
                .first()
                .and_then(|s| s["value"][1].as_str())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0),
            Err(_) => 0.0,
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// ---------------------------------------------------------------------------------------------
// What the dashboards and rules ask for.

/// One PromQL expression and where it comes from.
#[derive(Debug, Clone)]
struct Query {
    /// `dashboard file / panel title / refId` or `alerts.yml / rule name`.
    origin: String,
    expr: String,
}

/// Every target of every panel (rows included, collapsed or not) of every dashboard.
fn panel_queries() -> Vec<Query> {
    fn walk(file: &str, panels: &[Value], out: &mut Vec<Query>) {
        for p in panels {
            if let Some(inner) = p["panels"].as_array() {
                walk(file, inner, out);
            }
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = t["expr"].as_str() {
                    // The dashboard's instance variable, as "All" sets it.
                    let expr = expr.replace("$instance", ".+");
                    out.push(Query {
                        origin: format!(
                            "{file} / {} / {}",
                            p["title"].as_str().unwrap_or("?"),
                            t["refId"].as_str().unwrap_or("?")
                        ),
                        expr,
                    });
                }
            }
        }
    }
    let mut out = Vec::new();
    let dir = common::repo_root().join("grafana/dashboards");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("grafana/dashboards")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    for f in files {
        let d: Value = serde_json::from_str(&std::fs::read_to_string(&f).expect("dashboard"))
            .expect("dashboard is JSON");
        let name = f.file_name().expect("name").to_string_lossy().into_owned();
        walk(&name, d["panels"].as_array().expect("panels"), &mut out);
    }
    out
}

/// Every rule (alert or recording) of `prometheus/alerts.yml`: (name, expr).
fn rule_queries() -> Vec<Query> {
    common::alert_rules()
        .iter()
        .map(|r| {
            let name = r["alert"]
                .as_str()
                .or(r["record"].as_str())
                .expect("rule name");
            Query {
                origin: format!("alerts.yml / {name}"),
                expr: r["expr"].as_str().expect("expr").trim().to_string(),
            }
        })
        .collect()
}

/// Metric names in a PromQL expression: identifiers starting with `msgx_` outside strings.
/// (Our metrics all start with it; label values are quoted, so they are skipped.)
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let b = expr.as_bytes();
    let mut i = 0;
    // Inside `{…}` a word is a label name (`up{msgx_service="…"}`), not a metric.
    let mut in_matchers = false;
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    while i < b.len() {
        match b[i] {
            brace @ (b'{' | b'}') => {
                in_matchers = brace == b'{';
                i += 1;
            }
            q @ (b'"' | b'\'' | b'`') => {
                i += 1;
                while i < b.len() && b[i] != q {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            c if ident(c) => {
                let start = i;
                while i < b.len() && ident(b[i]) {
                    i += 1;
                }
                let word = &expr[start..i];
                if word.starts_with("msgx_") && !in_matchers {
                    names.insert(word.to_string());
                }
            }
            _ => i += 1,
        }
    }
    names
}

#[test]
fn metric_names_skip_strings_and_functions() {
    let n = metric_names(
        r#"histogram_quantile(0.99, sum by (le) (rate(msgx_a_bucket{x="msgx_not"}[5m]))) / msgx_b
           + up{msgx_service="msgexchange"}"#,
    );
    assert_eq!(
        n.into_iter().collect::<Vec<_>>(),
        vec!["msgx_a_bucket", "msgx_b"]
    );
}

/// Every alert says what it means (`description`) and links its runbook page (`runbook_url`:
/// the site's base URL, the Prometheus external label `msgx_runbook_base`, or else the book
/// the package installs, plus the alert's page of the book, `alerts/<name>.html`, and its
/// title's anchor; tests/docs_book.rs follows each URL into the built book), and none selects
/// a scrape job by name.
#[test]
fn every_alert_has_a_description_and_a_runbook_url() {
    let mut alerts = 0;
    for r in common::alert_rules() {
        let Some(name) = r["alert"].as_str() else {
            continue;
        };
        alerts += 1;
        let a = &r["annotations"];
        assert!(
            a["description"].as_str().is_some_and(|d| d.len() > 20),
            "{name}: no description"
        );
        // The site's base URL (external label), else the installed book; the anchor is
        // the page title's.
        let page = name.to_lowercase();
        let url = format!(
            "{{{{ with $externalLabels.msgx_runbook_base }}}}{{{{ . }}}}{{{{ else }}}}\
             file:///usr/share/doc/msgexchange/html{{{{ end }}}}/alerts/{page}.html#{page}"
        );
        assert_eq!(a["runbook_url"].as_str(), Some(url.as_str()), "{name}");
        // No alert is tied to a scrape job's name (a site names its jobs).
        let expr = r["expr"].as_str().unwrap_or_default();
        assert!(
            !expr.contains("job="),
            "{name}: selects a job by name: {expr}"
        );
        assert!(
            a["runbook"].is_null(),
            "{name}: `runbook` is runbook_url now"
        );
        let doc = common::repo_root().join(format!("docs/alerts/{page}.md"));
        let text = std::fs::read_to_string(&doc).unwrap_or_default();
        assert!(
            text.starts_with(&format!("# {name}\n")),
            "{name}: no runbook page {} titled with its name",
            doc.display()
        );
    }
    assert!(alerts > 30, "{alerts} alerts");
}

/// Issue 55: no panel is tied to a scrape job's name either (a site names its jobs): `up`
/// is selected by the target label `msgx_service`, as MsgxDown does.
#[test]
fn no_panel_selects_a_scrape_job_by_name() {
    let queries = panel_queries();
    assert!(queries.len() > 20, "{} panel queries", queries.len());
    for q in &queries {
        assert!(
            !q.expr.contains("job="),
            "{}: selects a job by name: {}",
            q.origin,
            q.expr
        );
        if q.expr.starts_with("up{") {
            assert!(
                q.expr.contains("msgx_service=\"msgexchange\""),
                "{}: `up` without the service label: {}",
                q.origin,
                q.expr
            );
        }
    }
}

#[test]
fn every_panel_has_a_unit_and_every_row_named_by_ops2_is_there() {
    let d: Value = serde_json::from_str(
        &std::fs::read_to_string(common::repo_root().join("grafana/dashboards/msgexchange.json"))
            .expect("dashboard"),
    )
    .expect("JSON");
    let vars = d["templating"]["list"].as_array().expect("templating");
    let var = |name: &str| vars.iter().find(|v| v["name"] == name).cloned();
    assert_eq!(
        var("datasource").expect("datasource variable")["type"],
        "datasource"
    );
    let instance = var("instance").expect("instance variable");
    assert_eq!(instance["datasource"]["uid"], "${datasource}");
    assert!(instance["query"]["query"]
        .as_str()
        .is_some_and(|q| q.starts_with("label_values(msgx_")));
    let panels = d["panels"].as_array().expect("panels");
    let rows: Vec<&str> = panels
        .iter()
        .filter(|p| p["type"] == "row")
        .filter_map(|p| p["title"].as_str())
        .collect();
    for want in [
        "Backlog and drain estimate",
        "Discovery and holes",
        "FIFO head",
        "Marking",
        "Delivery",
        "Lease and restarts",
        "Late arrivals",
    ] {
        assert!(
            rows.contains(&want),
            "row {want:?} missing (rows: {rows:?})"
        );
    }
    let mut ids = BTreeSet::new();
    for p in panels.iter().filter(|p| p["type"] != "row") {
        let title = p["title"].as_str().unwrap_or("?");
        assert!(
            p["fieldConfig"]["defaults"]["unit"].is_string(),
            "panel {title:?} has no unit"
        );
        assert!(
            p["fieldConfig"]["defaults"]["thresholds"]["steps"].is_array(),
            "panel {title:?} has no thresholds"
        );
        // Imports into any Grafana: the datasource is the dashboard's variable, and every
        // query shows the instance chosen (not the active and the standby mixed).
        assert_eq!(p["datasource"]["uid"], "${datasource}", "panel {title:?}");
        for t in p["targets"].as_array().into_iter().flatten() {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "panel {title:?}");
            let expr = t["expr"].as_str().unwrap_or_default();
            for name in metric_names(expr) {
                let with = format!("{name}{{instance=~\"$instance\"");
                assert!(
                    expr.contains(&with),
                    "panel {title:?}: {name} unfiltered in {expr}"
                );
            }
        }
        assert!(
            ids.insert(p["id"].as_i64().expect("id")),
            "duplicate id in {title:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The live run.

/// The service's environment: quick timers so a short run exercises holes, retries, marking.
fn service_env(
    env: &TestEnv,
    kafka: &str,
    port: u16,
    extra: &[(&str, &str)],
) -> Vec<(String, String)> {
    let mut v = env.binary_env();
    for (k, val) in [
        ("MSGX_KAFKA__BROKERS", kafka),
        ("MSGX_HTTP__LISTEN", &format!("127.0.0.1:{port}")),
        ("MSGX_STORE__MAX_CONNECTIONS", "4"),
        ("MSGX_PIPELINE__POLL_INTERVAL", "100ms"),
        ("MSGX_PIPELINE__MAX_COMMIT_DELAY", "3s"),
        ("MSGX_PROCESSING__IDLE_POLL", "200ms"),
        ("MSGX_PROCESSING__RETRY_INITIAL", "200ms"),
        ("MSGX_PROCESSING__RETRY_MAX", "1s"),
        ("MSGX_PROCESSING__HEAD_DEADLINE", "3s"),
        ("MSGX_BACKFILL__PERIOD", "500ms"),
        ("MSGX_LATE__DETECT_PERIOD", "1s"),
        ("MSGX_DISPATCH__IDLE_POLL", "200ms"),
        ("MSGX_OUTBOUND__SCHEDULE_REQUEST_AT", ""),
        ("MSGX_LOG__LEVEL", "warn"),
    ] {
        v.push((k.into(), val.to_string()));
    }
    for (k, val) in extra {
        v.retain(|(key, _)| key != k);
        v.push((k.to_string(), val.to_string()));
    }
    v
}

fn spawn_service(vars: &[(String, String)], log: &Path) -> Child {
    common::instance::msgexchange()
        .arg("run")
        .envs(vars.iter().cloned())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("service log"))
        .spawn()
        .expect("spawn msgexchange")
}

/// A live scenario's world: a test env (tagged `tag`), a broker with the event and
/// dead-letter topics, a free port for the service and the path of its log.
async fn live_world(tag: &str) -> (TestEnv, Tansu, u16, PathBuf) {
    let env = TestEnv::new(tag).await;
    let broker = Tansu::start();
    broker.create_topic("msgx.flight-events", 3);
    broker.create_topic("msgx.flight-events.dlq", 3);
    let port = free_port();
    let log = std::env::temp_dir().join(format!("msgx-{tag}-{}.log", std::process::id()));
    (env, broker, port, log)
}

/// `msgexchange dev simulate-upstream` on four connections with these flags (rate, duration,
/// the shares of holds, rollbacks, malformed and unknown-type messages), written as on its
/// command line.
fn simulator(env: &TestEnv, flags: &str) -> Child {
    let mut cmd = common::instance::msgexchange();
    cmd.args(["dev", "simulate-upstream", "--connections", "4"])
        .args(flags.split_whitespace());
    common::instance::spawn_quiet(&mut cmd, env, "simulator")
}

async fn wait_ready(port: u16, limit: Duration, log: &Path) {
    let start = Instant::now();
    while !matches!(http_get(port, "/readyz").await, Ok((200, _))) {
        assert!(
            start.elapsed() < limit,
            "msgexchange not ready within {limit:?} (log: {})",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// A scalar from an instant query (0 when empty or failing).
async fn scalar(prom: &Prometheus, expr: &str) -> f64 {
    prom.query(expr)
        .await
        .ok()
        .and_then(|r| r.first().cloned())
        .and_then(|s| s["value"][1].as_str().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0)
}

/// Everything wrong with the dashboards and rules right now, by kind.
#[derive(Debug, Default)]
struct Findings {
    invalid: Vec<String>,
    unknown_names: Vec<String>,
    no_series: Vec<String>,
}

async fn evaluate_all(prom: &Prometheus, panels: &[Query], rules: &[Query]) -> Findings {
    let exported = prom.names().await;
    let mut f = Findings::default();
    for (q, is_panel) in panels
        .iter()
        .map(|q| (q, true))
        .chain(rules.iter().map(|q| (q, false)))
    {
        for name in metric_names(&q.expr) {
            if !exported.contains(&name) {
                f.unknown_names.push(format!("{}: {name}", q.origin));
            }
        }
        match prom.query(&q.expr).await {
            Err(e) => f
                .invalid
                .push(format!("{}: {e}\n      {}", q.origin, q.expr)),
            // An alert's expression is empty while it does not fire: only panels must show data.
            Ok(r) if r.is_empty() && is_panel => {
                f.no_series.push(format!("{}: {}", q.origin, q.expr))
            }
            Ok(_) => {}
        }
    }
    f
}

#[tokio::test]
async fn dashboards_and_alerts_live() {
    let Some(prom_bin) = prometheus_or_skip("dashboards_and_alerts_live") else {
        return;
    };
    let panels = panel_queries();
    let rules = rule_queries();
    assert!(
        panels.len() > 20 && rules.len() > 10,
        "dashboards and rules found"
    );

    let (env, broker, port, log) = live_world("obslive").await;
    let vars = service_env(&env, &broker.bootstrap, port, &[]);
    let service = spawn_service(&vars, &log);
    let prom = Prometheus::start(&prom_bin, &format!("127.0.0.1:{port}"), "live").await;
    wait_ready(port, Duration::from_secs(60), &log).await;
    let sim = simulator(
        &env,
        "--rate 150 --duration 40s --hold-fraction 0.05 --hold-max 5s \
         --rollback-fraction 0.02 --malformed-fraction 0.02 --unknown-type-fraction 0.005",
    );

    // Warm-up: 15 good scrapes, and messages processed and delivered (so rates have points).
    let started = Instant::now();
    loop {
        let scrapes = prom.good_scrapes().await;
        let processed = scalar(&prom, "sum(msgx_pipeline_processed_total)").await;
        let sent = scalar(&prom, "sum(msgx_dispatch_sent_total)").await;
        if scrapes >= 15.0 && processed > 0.0 && sent > 0.0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "warm-up: {scrapes} scrapes, {processed} processed, {sent} sent (log: {})",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Series that appear a little later (a first hole, a first late arrival) get a few
    // seconds; invalid expressions and unknown names fail at once.
    let deadline = Instant::now() + Duration::from_secs(20);
    let findings = loop {
        let f = evaluate_all(&prom, &panels, &rules).await;
        if !f.invalid.is_empty() || f.no_series.is_empty() && f.unknown_names.is_empty() {
            break f;
        }
        if Instant::now() > deadline {
            break f;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };

    // Every rule of the file loaded, evaluated, healthy.
    let loaded = prom.api("/api/v1/rules").await.expect("rules API");
    let mut health: BTreeMap<String, (String, String)> = BTreeMap::new();
    for g in loaded["groups"].as_array().expect("groups") {
        for r in g["rules"].as_array().expect("rules") {
            health.insert(
                r["name"].as_str().unwrap_or("?").to_string(),
                (
                    r["health"].as_str().unwrap_or("?").to_string(),
                    r["lastError"].as_str().unwrap_or("").to_string(),
                ),
            );
        }
    }
    let mut unhealthy = Vec::new();
    for q in &rules {
        let name = q.origin.trim_start_matches("alerts.yml / ");
        match health.get(name) {
            Some((h, _)) if h == "ok" => {}
            Some((h, e)) => unhealthy.push(format!("{name}: {h} {e}")),
            None => unhealthy.push(format!("{name}: not loaded")),
        }
    }

    stop(sim);
    stop(service);
    drop(prom);
    drop(broker);
    env.cleanup().await;

    let mut report = String::new();
    for (what, list) in [
        ("invalid expressions", &findings.invalid),
        (
            "metric names the service does not export",
            &findings.unknown_names,
        ),
        (
            "panel queries with no series after warm-up",
            &findings.no_series,
        ),
        ("rules not loaded healthy", &unhealthy),
    ] {
        if !list.is_empty() {
            report.push_str(&format!("\n{} {what}:\n", list.len()));
            for l in list {
                report.push_str(&format!("  - {l}\n"));
            }
        }
    }
    assert!(
        report.is_empty(),
        "{} panel queries and {} rules evaluated live:{report}",
        panels.len(),
        rules.len()
    );
    eprintln!(
        "{} panel queries and {} rules evaluated live: all valid, exported, with series; rules healthy",
        panels.len(),
        rules.len()
    );
}

// ---------------------------------------------------------------------------------------------
// The scenario behind the pictures in docs/dashboards.md.

/// A moment of the scenario, drawn as a vertical line.
fn event(events: &mut Vec<Value>, t0: Instant, epoch0: f64, label: &str) {
    let t = epoch0 + t0.elapsed().as_secs_f64();
    eprintln!("scenario +{:>5.1}s: {label}", t0.elapsed().as_secs_f64());
    events.push(serde_json::json!({ "t": t, "label": label }));
}

async fn sleep_s(s: u64) {
    tokio::time::sleep(Duration::from_secs(s)).await;
}

/// By hand: `cargo test -p msgx-actors --test observability -- --ignored scenario_for_pictures
/// --nocapture`, then `python3 scripts/render_dashboards.py` (docs/dashboards.md).
#[tokio::test]
#[ignore = "about 5 minutes; renders the pictures of docs/dashboards.md"]
async fn scenario_for_pictures() {
    let prom_bin = prometheus_binary().expect("prometheus (apt-get install prometheus)");
    let out = std::env::var("MSGEXCHANGE_SCENARIO_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| common::repo_root().join("docs/img/scenario.json"));
    let (env, broker, port, log) = live_world("obsscen").await;
    let vars = service_env(
        &env,
        &broker.bootstrap,
        port,
        &[
            ("MSGX_PIPELINE__MAX_COMMIT_DELAY", "20s"),
            ("MSGX_PROCESSING__HEAD_DEADLINE", "25s"),
            ("MSGX_PROCESSING__RETRY_INITIAL", "1s"),
            ("MSGX_PROCESSING__RETRY_MAX", "3s"),
            ("MSGX_PROCESSING__DRAIN_RATE_WINDOW", "30s"),
            ("MSGX_LATE__DETECT_PERIOD", "2s"),
        ],
    );
    let prom = Prometheus::start(&prom_bin, &format!("127.0.0.1:{port}"), "scenario").await;
    let epoch0 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    let t0 = Instant::now();
    let mut events = Vec::new();
    let mut service = spawn_service(&vars, &log);
    wait_ready(port, Duration::from_secs(60), &log).await;
    // Healthy upstream: short holds only (filled long before max_commit_delay), no rollbacks.
    // 12/s: well within what the service does on a busy 2-core machine, so the healthy
    // phase is healthy and every backlog below is the scenario's own.
    let sim = simulator(
        &env,
        "--rate 12 --duration 290s --hold-fraction 0.03 --hold-max 800ms --rollback-fraction 0 \
         --malformed-fraction 0 --unknown-type-fraction 0 --null-received-fraction 0",
    );
    event(&mut events, t0, epoch0, "simulator starts (healthy)");
    sleep_s(50).await;

    // A hole: an inbox transaction held open past max_commit_delay, then committed (late).
    let (tx, id) = env.open_insert().await;
    event(
        &mut events,
        t0,
        epoch0,
        &format!("hole: id {id} held uncommitted"),
    );
    sleep_s(35).await;
    tx.commit().await.expect("late commit");
    event(&mut events, t0, epoch0, "hole committed late");
    sleep_s(20).await;

    // A poison head: a message of a type nobody knows fails until processing.head_deadline.
    env.insert_message(&common::msgs::unknown_type(999_999))
        .await;
    event(&mut events, t0, epoch0, "poison head written");
    sleep_s(45).await;

    // An outage: the service stops while upstream keeps writing; then the backlog drains.
    let _ = Command::new("kill")
        .args(["-TERM", &service.id().to_string()])
        .status();
    let _ = service.wait();
    event(&mut events, t0, epoch0, "service stopped");
    sleep_s(10).await;
    // A burst on top while it is down: the backlog the restarted service drains.
    // An unknown type would be a new FAILED head, holding the drain for head_deadline.
    let mut burst = simulator(
        &env,
        "--rate 0 --duration 30s --total 4000 --hold-fraction 0 --rollback-fraction 0 \
         --malformed-fraction 0 --unknown-type-fraction 0",
    );
    let _ = burst.wait();
    event(&mut events, t0, epoch0, "4000 rows written while down");
    sleep_s(10).await;
    service = spawn_service(&vars, &log);
    event(&mut events, t0, epoch0, "service restarted");
    wait_ready(port, Duration::from_secs(60), &log).await;
    sleep_s(70).await;
    event(&mut events, t0, epoch0, "end");

    let end = epoch0 + t0.elapsed().as_secs_f64();
    let step = 2.0;
    let mut results = serde_json::Map::new();
    for q in panel_queries() {
        if results.contains_key(&q.expr) {
            continue;
        }
        let r = prom
            .query_range(&q.expr, epoch0, end, step)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", q.origin));
        results.insert(q.expr.clone(), r);
    }
    let dump = serde_json::json!({
        "start": epoch0, "end": end, "step": step, "events": events, "results": results,
    });
    std::fs::create_dir_all(out.parent().expect("dir")).expect("out dir");
    std::fs::write(&out, serde_json::to_string(&dump).expect("json")).expect("write dump");
    eprintln!(
        "query_range data of every panel written to {}",
        out.display()
    );

    stop(sim);
    stop(service);
    drop(prom);
    drop(broker);
    env.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// docker-compose.yml against the config.

fn yaml(path: &str) -> Value {
    let text = std::fs::read_to_string(common::repo_root().join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{path} is not YAML: {e}"))
}

fn compose() -> Value {
    yaml("docker-compose.yml")
}

/// Container ports a compose service listens on: the container side of `ports`, and `expose`.
fn listening_ports(svc: &Value) -> BTreeSet<u16> {
    let mut out = BTreeSet::new();
    for p in svc["ports"].as_array().into_iter().flatten() {
        let s = p
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| p.to_string());
        if let Some(c) = s
            .rsplit(':')
            .next()
            .and_then(|c| c.split('/').next()?.parse().ok())
        {
            out.insert(c);
        }
    }
    for p in svc["expose"].as_array().into_iter().flatten() {
        let s = p
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| p.to_string());
        if let Ok(c) = s.parse() {
            out.insert(c);
        }
    }
    out
}

/// `host:port` out of a URL or a `host:port` value.
fn host_port(v: &str) -> Option<(String, u16)> {
    let rest = v.split_once("://").map_or(v, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let hp = rest.split(['/', ',']).next()?;
    let (h, p) = hp.rsplit_once(':')?;
    Some((h.to_string(), p.parse().ok()?))
}

/// The `MSGX_*` environment of a compose service.
/// The compose service `host`, asserted to exist and to listen on `port` (its ports or
/// expose); `what` names the reference in the panic.
fn listening_service<'a>(
    services: &'a serde_json::Map<String, Value>,
    host: &str,
    port: u16,
    what: &str,
) -> &'a Value {
    let svc = services
        .get(host)
        .unwrap_or_else(|| panic!("{what}: names no service {host}"));
    assert!(
        listening_ports(svc).contains(&port),
        "{what}: {host} does not listen on {port} (ports/expose)"
    );
    svc
}

fn msgx_env(svc: &Value) -> Vec<(String, String)> {
    svc["environment"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.starts_with("MSGX_"))
        .map(|(k, v)| {
            let v = v
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| v.to_string());
            (k.clone(), v)
        })
        .collect()
}

#[test]
fn compose_has_every_service_with_health_checks() {
    let c = compose();
    let services = c["services"].as_object().expect("services");
    for want in [
        "mysql",
        "postgres",
        "kafka",
        "inbox-fixture",
        "simulator",
        "msgexchange",
        "prometheus",
        "grafana",
    ] {
        assert!(
            services.contains_key(want),
            "docker-compose.yml: no service {want}"
        );
    }
    // Long-running services are checked; one-shot jobs (fixture, topics, simulator) are not.
    for long in [
        "mysql",
        "postgres",
        "kafka",
        "msgexchange",
        "prometheus",
        "grafana",
    ] {
        let t = &services[long]["healthcheck"]["test"];
        assert!(
            t.is_array() || t.is_string(),
            "docker-compose.yml: {long} has no healthcheck"
        );
    }
    // Every depends_on names a service; a service_healthy one has a healthcheck.
    for (name, svc) in services {
        for (dep, cond) in svc["depends_on"].as_object().into_iter().flatten() {
            assert!(
                services.contains_key(dep),
                "{name} depends on unknown {dep}"
            );
            if cond["condition"] == "service_healthy" {
                assert!(
                    services[dep]["healthcheck"].is_object(),
                    "{name} waits for {dep} healthy, which has no healthcheck"
                );
            }
        }
    }
    // Kafka in KRaft single-node mode: broker and controller, its own quorum, no ZooKeeper.
    let k = &services["kafka"]["environment"];
    let roles = k["KAFKA_PROCESS_ROLES"].as_str().unwrap_or("");
    assert!(
        roles.contains("broker") && roles.contains("controller"),
        "KRaft roles: {roles}"
    );
    assert!(k["KAFKA_CONTROLLER_QUORUM_VOTERS"]
        .as_str()
        .is_some_and(|v| v.starts_with("1@kafka:")));
    assert!(k.get("KAFKA_ZOOKEEPER_CONNECT").is_none());
    // MySQL 8 and Grafana with the repo's provisioning and dashboards.
    assert!(services["mysql"]["image"]
        .as_str()
        .is_some_and(|i| i.starts_with("mysql:8")));
    let vols = |s: &str| -> Vec<String> {
        services[s]["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect()
    };
    assert!(vols("grafana")
        .iter()
        .any(|v| v.starts_with("./grafana/provisioning:/etc/grafana/provisioning")));
    let dash_provider = yaml("grafana/provisioning/dashboards/msgexchange.yml");
    let dash_path = dash_provider["providers"][0]["options"]["path"]
        .as_str()
        .expect("dashboard provider path");
    assert!(
        vols("grafana")
            .iter()
            .any(|v| v.starts_with("./grafana/dashboards:") && v.contains(dash_path)),
        "grafana mounts grafana/dashboards at the provider's path {dash_path}"
    );
    // Prometheus gets prometheus.yml and the alerts it names.
    assert!(vols("prometheus")
        .iter()
        .any(|v| v.starts_with("./prometheus:/etc/prometheus")));
    let prom = yaml("prometheus/prometheus.yml");
    for f in prom["rule_files"].as_array().expect("rule_files") {
        let f = f.as_str().expect("rule file");
        let local = f.replace("/etc/prometheus/", "prometheus/");
        assert!(
            common::repo_root().join(&local).is_file(),
            "rule file {f} is not in the repo"
        );
    }
}

#[test]
fn compose_environment_matches_the_config() {
    let c = compose();
    let services = c["services"].as_object().expect("services");
    let defaults: toml::Table = std::fs::read_to_string(common::default_toml())
        .expect("default.toml")
        .parse()
        .expect("default.toml is TOML");
    let mut checked = 0;
    for (name, svc) in services {
        let env = msgx_env(svc);
        if env.is_empty() {
            continue;
        }
        for (k, v) in &env {
            // MSGX_SECTION__KEY → [section] key (src/settings.rs, env_source).
            let (section, key) = k["MSGX_".len()..]
                .split_once("__")
                .unwrap_or_else(|| panic!("{name}: {k} is not MSGX_SECTION__KEY"));
            let (section, key) = (section.to_lowercase(), key.to_lowercase());
            assert!(
                defaults
                    .get(&section)
                    .and_then(|s| s.as_table())
                    .is_some_and(|s| s.contains_key(&key)),
                "{name}: {k} has no [{section}] {key} in config/default.toml"
            );
            // Every host:port it names is a compose service listening on that port.
            if matches!(key.as_str(), "url" | "brokers" | "listen") {
                let (host, port) = host_port(v).unwrap_or_else(|| panic!("{name}: {k}={v}"));
                if key == "listen" {
                    assert!(
                        listening_ports(&services["msgexchange"]).contains(&port),
                        "{k}={v}: msgexchange does not publish {port}"
                    );
                } else {
                    listening_service(services, &host, port, &format!("{name}: {k}={v}"));
                }
            }
            checked += 1;
        }
        // The whole environment loads and validates like the service would at start.
        let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let s = msgx_core::settings::Settings::load_layered_with_env(
            Some(&common::default_toml()),
            &pairs,
        )
        .unwrap_or_else(|e| panic!("{name}: its MSGX_* environment does not load: {e}"));
        // The topics the kafka-topics job creates are the configured ones.
        let topics = services["kafka-topics"]["command"].to_string();
        assert!(
            topics.contains(&format!(" {} ", s.kafka.topic)) && topics.contains(&s.kafka.dlq_topic),
            "kafka-topics creates {} and {}",
            s.kafka.topic,
            s.kafka.dlq_topic
        );
    }
    assert!(checked >= 4, "docker-compose.yml sets MSGX_* keys");

    // Prometheus scrapes the service where it listens; Grafana reads Prometheus where it is.
    let prom = yaml("prometheus/prometheus.yml");
    let mut targets = 0;
    for sc in prom["scrape_configs"].as_array().expect("scrape_configs") {
        for t in sc["static_configs"][0]["targets"]
            .as_array()
            .expect("targets")
        {
            let (host, port) = host_port(t.as_str().expect("target")).expect("host:port");
            let svc = listening_service(services, &host, port, "scrape target");
            let listen = msgx_env(svc)
                .into_iter()
                .find(|(k, _)| k == "MSGX_HTTP__LISTEN")
                .map(|(_, v)| v)
                .expect("MSGX_HTTP__LISTEN");
            assert!(
                listen.ends_with(&format!(":{port}")),
                "scraped {port}, listens {listen}"
            );
            targets += 1;
        }
    }
    assert_eq!(targets, 1);
    let ds = yaml("grafana/provisioning/datasources/prometheus.yml");
    let url = ds["datasources"][0]["url"]
        .as_str()
        .expect("datasource url");
    let (host, port) = host_port(url).expect("host:port");
    assert!(
        listening_ports(&services[&host]).contains(&port),
        "datasource {url}"
    );
    assert_eq!(
        ds["datasources"][0]["isDefault"], true,
        "the dashboards' datasource variable starts at the default datasource"
    );

    // With the compose plugin on this machine, its own parser agrees (never required).
    let ok = Command::new("docker")
        .args(["compose", "version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        common::process::succeed(
            Command::new("docker")
                .args(["compose", "-f"])
                .arg(common::repo_root().join("docker-compose.yml"))
                .args(["config", "--quiet"]),
            "docker compose config",
        );
    }
}
