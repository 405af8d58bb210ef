use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

use super::*;

mod alert_pages;

/// Labels named `msgx_…` that a site's Prometheus sets: the runbook's base URL (an external
/// label) and the scrape targets' service label `MsgxDown` selects on.
const SITE_LABELS: &[&str] = &["msgx_runbook_base", "msgx_service"];

/// Names a dashboard or alert rule uses, without the histogram suffixes.
pub(super) fn referenced(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(pos) = text[i..].find("msgx_") {
        let start = i + pos;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        let name = &text[start..end];
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        // `msgx_bench_*` and the like are database names, not metrics; the labels a site's
        // Prometheus sets (docs/operations.md "Alerts (runbook)") are labels.
        if !base.ends_with('_') && !SITE_LABELS.contains(&base) {
            names.push(base.to_string());
        }
        i = end;
    }
    names
}

#[test]
fn dashboards_and_alerts_use_only_known_metrics() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (mut checked, all) = (0, names());
    let mut files = vec![
        root.join("prometheus/alerts.yml"),
        root.join("grafana/dashboards/msgexchange.json"),
    ];
    files.extend(alert_pages::runbook_pages(root));
    for file in files {
        let text = std::fs::read_to_string(&file).expect("readable");
        for name in referenced(&text) {
            assert!(
                all.contains(&name.as_str()),
                "{} uses unknown metric {name}",
                file.display()
            );
            checked += 1;
        }
    }
    assert!(checked > 10, "the files reference our metrics");
}

#[test]
fn every_metric_is_defined_once() {
    let names = names();
    let unique: BTreeSet<&str> = names.iter().copied().collect();
    assert_eq!(unique.len(), names.len(), "a metric is defined twice");
}

#[test]
fn every_histogram_has_buckets_and_only_histograms() {
    let with_buckets: BTreeSet<&str> = histogram_buckets().iter().map(|(n, _)| *n).collect();
    let histograms: BTreeSet<&str> = defs()
        .iter()
        .filter(|d| d.kind == Kind::Histogram)
        .map(|d| d.name)
        .collect();
    assert_eq!(with_buckets, histograms);
}

#[test]
fn every_def_is_well_formed() {
    for d in defs() {
        assert!(d.name.starts_with("msgx_"), "{}", d.name);
        assert!(!d.unit.is_empty() && !d.help.is_empty(), "{}", d.name);
        assert_eq!(
            d.kind == Kind::Counter,
            d.name.ends_with("_total"),
            "{}: counters and only counters end in _total",
            d.name
        );
        assert!(!d.combos.is_empty(), "{}", d.name);
        for c in &d.combos {
            assert_eq!(c.len(), d.labels.len(), "{}: {c:?}", d.name);
        }
        let unique: BTreeSet<_> = d.combos.iter().collect();
        assert_eq!(
            unique.len(),
            d.combos.len(),
            "{}: a combination twice",
            d.name
        );
    }
}

/// One rendered sample: labels (sorted) → value text.
type Samples = BTreeMap<String, BTreeMap<BTreeSet<(String, String)>, String>>;

fn parse(text: &str) -> (Samples, BTreeMap<String, String>, BTreeSet<String>) {
    let mut samples = Samples::new();
    let mut types = BTreeMap::new();
    let mut helps = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE line");
            types.insert(name.to_string(), kind.to_string());
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').expect("HELP line");
            assert!(!help.trim().is_empty(), "{name}: empty HELP");
            helps.insert(name.to_string());
        } else if !line.is_empty() {
            let (series, value) = line.rsplit_once(' ').expect("sample line");
            let (name, labels) = match series.split_once('{') {
                Some((n, l)) => (n, l.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels: BTreeSet<(String, String)> = labels
                .split(',')
                .filter(|kv| !kv.is_empty())
                .map(|kv| {
                    let (k, v) = kv.split_once('=').expect("label");
                    (k.to_string(), v.trim_matches('"').to_string())
                })
                .collect();
            samples
                .entry(name.to_string())
                .or_default()
                .insert(labels, value.to_string());
        }
    }
    (samples, types, helps)
}

/// The exporter as the binary installs it (`install_metrics` in actors/src/app.rs: the same
/// buckets), with [`register`] run on it: every metric has HELP and TYPE, every enumerated
/// series is there at its start value.
#[test]
fn register_exports_every_series_from_zero() {
    let mut builder = PrometheusBuilder::new();
    for (name, buckets) in histogram_buckets() {
        builder = builder
            .set_buckets_for_metric(Matcher::Full(name.to_string()), &buckets)
            .expect("buckets");
    }
    let recorder = builder.build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, register);
    let text = handle.render();
    let (samples, types, helps) = parse(&text);
    let mut series = 0;
    for d in defs() {
        assert!(helps.contains(d.name), "{}: no HELP line", d.name);
        assert_eq!(
            types.get(d.name).map(String::as_str),
            Some(d.kind.as_str()),
            "{}: TYPE",
            d.name
        );
        let sample = match d.kind {
            Kind::Histogram => format!("{}_count", d.name),
            _ => d.name.to_string(),
        };
        let got = samples
            .get(&sample)
            .unwrap_or_else(|| panic!("{sample}: no sample"));
        for c in &d.combos {
            let labels: BTreeSet<(String, String)> = d
                .labels
                .iter()
                .zip(c)
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let value = got
                .get(&labels)
                .unwrap_or_else(|| panic!("{}: no series {labels:?}", d.name));
            let want = match d.kind {
                Kind::Gauge if d.start.is_nan() => "NaN".to_string(),
                Kind::Gauge => d.start.to_string(),
                _ => "0".to_string(),
            };
            assert_eq!(*value, want, "{} {labels:?}", d.name);
            series += 1;
        }
        assert_eq!(got.len(), d.combos.len(), "{}: unexpected series", d.name);
    }
    assert!(series > names().len(), "labelled series are enumerated");
}

/// Telemetry is a leaf: it imports no caller type (the core steps build its events), so no
/// import cycle runs through it. It may name the row vocabulary (`rows`: label values such
/// as an abandon reason are the stored names), which is itself a leaf.
#[test]
fn telemetry_imports_no_caller() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let needle = concat!("crate", "::");
    let mut files = vec![root.join("telemetry.rs")];
    for entry in std::fs::read_dir(root.join("telemetry")).expect("src/telemetry") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            // tests/: this module's own test files.
            for inner in std::fs::read_dir(&path).expect("a telemetry subdirectory") {
                files.push(inner.expect("entry").path());
            }
        } else {
            files.push(path);
        }
    }
    assert!(files.len() > 10, "one file per component");
    for file in files {
        let text = std::fs::read_to_string(&file).expect("readable");
        for (n, line) in text.lines().enumerate() {
            let mut rest = line;
            while let Some(i) = rest.find(needle) {
                rest = &rest[i + needle.len()..];
                assert!(
                    rest.starts_with("telemetry") || rest.starts_with("rows"),
                    "{}:{}: telemetry mentions a caller: {line}",
                    file.display(),
                    n + 1
                );
            }
            assert!(
                !line.contains(concat!("super", "::super")),
                "{}:{}: {line}",
                file.display(),
                n + 1
            );
        }
    }
}

/// Each alert of `prometheus/alerts.yml` with the metrics its `expr` names.
fn alert_rules() -> Vec<(String, Vec<String>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("prometheus/alerts.yml")).expect("alerts.yml");
    let mut rules: Vec<(String, String)> = Vec::new();
    let mut in_expr = false;
    for line in text.lines() {
        let t = line.trim();
        if let Some(name) = t.strip_prefix("- alert:") {
            rules.push((name.trim().to_string(), String::new()));
            in_expr = false;
        } else if let Some(expr) = t.strip_prefix("expr:") {
            in_expr = true;
            if let Some(r) = rules.last_mut() {
                r.1.push_str(expr);
            }
        } else if in_expr && !t.contains(':') {
            // A folded (`>-`) expression continues on the following lines.
            if let Some(r) = rules.last_mut() {
                r.1.push(' ');
                r.1.push_str(t);
            }
        } else {
            in_expr = false;
        }
    }
    rules
        .into_iter()
        .map(|(name, expr)| {
            let mut names = referenced(&expr);
            names.sort();
            names.dedup();
            (name, names)
        })
        .collect()
}

/// Each panel of `grafana/dashboards/*.json` (`file: title`) with the metrics it queries.
fn panels() -> Vec<(String, Vec<String>)> {
    fn walk(file: &str, panels: &serde_json::Value, out: &mut Vec<(String, Vec<String>)>) {
        for p in panels.as_array().into_iter().flatten() {
            let exprs: Vec<&str> = p["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t["expr"].as_str())
                .collect();
            if !exprs.is_empty() {
                let mut names = referenced(&exprs.join(" "));
                names.sort();
                names.dedup();
                let title = p["title"].as_str().unwrap_or("(untitled)");
                out.push((format!("{file}: {title}"), names));
            }
            walk(file, &p["panels"], out);
        }
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("grafana/dashboards");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("grafana/dashboards")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&f).expect("readable")).expect("json");
        let name = f.file_name().expect("name").to_string_lossy().to_string();
        walk(&name, &json["panels"], &mut out);
    }
    out
}

/// `docs/metrics.md` as generated from [`defs`], the alert rules and the dashboards.
fn metrics_doc() -> String {
    let alerts = alert_rules();
    let panels = panels();
    let mut doc = String::from(
        "# Metrics\n\n\
         <!-- Generated from src/telemetry (defs), prometheus/alerts.yml and \
         grafana/dashboards/*.json; checked by the test telemetry::tests::metrics_doc_is_current. \
         Regenerate with every other generated section: scripts/render-docs.sh -->\n\n\
         This page is generated from the code (`telemetry::defs`), the alert rules and the \
         dashboards, and checked against them by the test \
         `telemetry::tests::metrics_doc_is_current`.\n\n\
         Every series below is registered when the service starts (`telemetry::register`, \
         called by `install_metrics`): counters at 0 for every label combination listed, so \
         `increase()` sees the first event and no panel shows \"No data\"; gauges at their start \
         value — NaN where the value is unknown until the component's first refresh (a few \
         seconds after start), 0 for a flag the process knows (lease held, gave up, tampered, \
         restarts in window); histograms empty. Labels not listed here are never emitted (a unit \
         test ties every label value the code emits to these lists).\n\n\
         | metric | type | labels (values) | unit | meaning | alerts | panels |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for d in defs() {
        let labels = if d.labels.is_empty() {
            "—".to_string()
        } else {
            d.labels
                .iter()
                .enumerate()
                .map(|(i, k)| {
                    let mut values: Vec<&str> = Vec::new();
                    for c in &d.combos {
                        if !values.contains(&c[i]) {
                            values.push(c[i]);
                        }
                    }
                    format!("`{k}`: {}", values.join(", "))
                })
                .collect::<Vec<_>>()
                .join("; ")
        };
        let uses = |list: &[(String, Vec<String>)]| {
            let names: Vec<String> = list
                .iter()
                .filter(|(_, m)| m.iter().any(|n| n == d.name))
                .map(|(n, _)| n.clone())
                .collect();
            if names.is_empty() {
                "—".to_string()
            } else {
                names.join(", ")
            }
        };
        doc.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} | {} |\n",
            d.name,
            d.kind.as_str(),
            labels,
            d.unit,
            d.help,
            uses(&alerts),
            uses(&panels)
        ));
    }
    doc
}

/// `docs/metrics.md` names exactly the metrics of [`defs`], with the alerts and panels that
/// use each (a metric missing from the doc, or a doc row for a metric that does not exist,
/// fails here).
#[test]
fn metrics_doc_is_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/metrics.md");
    let want = metrics_doc();
    // scripts/render-docs.sh sets it (with every other generated section).
    if std::env::var_os("MSGX_WRITE_DOCS").is_some() {
        std::fs::write(&path, &want).expect("write docs/metrics.md");
    }
    let got = std::fs::read_to_string(&path).unwrap_or_default();
    let documented: BTreeSet<String> = got
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_string)
        .collect();
    let defined: BTreeSet<String> = names().iter().map(|s| s.to_string()).collect();
    assert_eq!(
        documented, defined,
        "docs/metrics.md and the telemetry module name different metrics"
    );
    assert!(
        got == want,
        "docs/metrics.md is stale (alerts, panels, help or labels changed): regenerate it \
         with scripts/render-docs.sh"
    );
}

/// Every alert has a runbook page (docs/alerts/<name>.md, titled with its name; the pages'
/// generated parts are checked in `alert_pages`) and a `promtool test rules` case in
/// prometheus/alerts_test.yml; every alert names at least one of our metrics.
#[test]
fn every_alert_has_a_runbook_entry_and_a_test() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tests =
        std::fs::read_to_string(root.join("prometheus/alerts_test.yml")).expect("alerts_test");
    let alerts = alert_rules();
    assert!(alerts.len() > 30, "{} alerts", alerts.len());
    for (name, metrics) in &alerts {
        let page = root.join(format!("docs/alerts/{}.md", name.to_lowercase()));
        let text = std::fs::read_to_string(&page).unwrap_or_default();
        assert!(
            text.starts_with(&format!("# {name}\n")),
            "{} is not {name}'s runbook page",
            page.display()
        );
        assert!(
            tests.contains(&format!("alertname: {name}\n")),
            "prometheus/alerts_test.yml has no case for {name}"
        );
        assert!(
            matches!(name.as_str(), "MsgxDown" | "MsgxAbsent") || !metrics.is_empty(),
            "{name} uses none of our metrics"
        );
    }
}

/// The race a fresh machine once showed (`msgx_inbox_watermark 3` beside
/// `msgx_inbox_enqueued_total 0`): a scrape between two writes of one poll round. Rounds of one
/// row each are emitted while another thread renders; every render must show the enqueued
/// count of the W it shows.
#[test]
fn a_scrape_sees_a_poll_round_whole() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let value = |text: &str, name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    };
    let rounds = 20_000;
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            metrics::with_local_recorder(&recorder, || {
                for w in 1..=rounds {
                    poll_round(w).emit();
                }
            });
            done.store(true, std::sync::atomic::Ordering::Release);
        });
        let mut renders = 0;
        while !done.load(std::sync::atomic::Ordering::Acquire) || renders == 0 {
            let text = between_events(|| handle.render());
            let w = value(&text, INBOX_WATERMARK);
            let enqueued = value(&text, INBOX_ENQUEUED_TOTAL);
            assert_eq!(w, enqueued, "W {w} shown with {enqueued} rows enqueued");
            renders += 1;
        }
    });
}

/// A round that enqueued the one row `w` (W moves from `w - 1`).
fn poll_round(w: i64) -> PollRound {
    PollRound {
        w,
        sight: InboxSight {
            head: Some(w),
            lag: Some(std::time::Duration::ZERO),
            ..InboxSight::default()
        },
        enqueued: 1,
        took: std::time::Duration::ZERO,
        holes_open: 0,
        missing_ids: 0,
        waiting: None,
        fills: Vec::new(),
        released: Vec::new(),
    }
}
