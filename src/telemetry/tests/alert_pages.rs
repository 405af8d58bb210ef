//! The runbook's alert pages (docs/alerts/<alert>.md, one per rule of prometheus/alerts.yml)
//! begin with a part generated from the rule and the dashboards: the title, when it fires, the
//! symptom (the rule's `description`) and the dashboard panels that show its series. The rest
//! (checks, remedy, escalation) is written by hand. Checked both ways: a page for every alert
//! and no page for anything else, each listed in docs/SUMMARY.md, each generated part current.
//! `MSGX_WRITE_DOCS=1` (scripts/render-docs.sh) rewrites the generated parts.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::{alert_rules, panels};

/// Where the hand-written part of a page starts; everything above it is generated.
const HAND_WRITTEN: &str = "## Checks\n";

/// The sections every page's hand-written part has, in this order (the SRE playbook's).
const SECTIONS: [&str; 3] = ["## Checks\n", "## Remedy\n", "## Escalation\n"];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every page of the operations runbook: the index, the procedures and the alert pages.
pub(super) fn runbook_pages(root: &Path) -> Vec<PathBuf> {
    let mut pages = vec![root.join("docs/operations.md"), root.join("docs/alerts.md")];
    for dir in ["docs/operations", "docs/alerts"] {
        let mut found: Vec<PathBuf> = std::fs::read_dir(root.join(dir))
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect();
        found.sort();
        pages.extend(found);
    }
    pages
}

/// One alert rule as the page shows it.
struct Rule {
    name: String,
    expr: String,
    pending: String,
    severity: String,
    description: String,
}

fn rules() -> Vec<Rule> {
    let text = std::fs::read_to_string(root().join("prometheus/alerts.yml")).expect("alerts.yml");
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("alerts.yml is YAML");
    let field = |r: &serde_yaml_ng::Value, k: &str| r[k].as_str().unwrap_or_default().to_string();
    let mut out = Vec::new();
    for group in doc["groups"].as_sequence().expect("groups") {
        for r in group["rules"].as_sequence().expect("rules") {
            let Some(name) = r["alert"].as_str() else {
                continue;
            };
            out.push(Rule {
                name: name.to_string(),
                expr: field(r, "expr").trim().to_string(),
                pending: field(r, "for"),
                severity: field(&r["labels"], "severity"),
                description: field(&r["annotations"], "description"),
            });
        }
    }
    out
}

/// A description as a reader sees it outside Prometheus: a value the alert looks up when it
/// fires (`{{ with query "m" }}…{{ end }}`) is named by its series instead.
fn plain(description: &str) -> String {
    let mut text = description.to_string();
    while let Some(start) = text.find("{{ with query \"") {
        let rest = &text[start + "{{ with query \"".len()..];
        let series = rest.split('"').next().unwrap_or_default().to_string();
        let end = text[start..]
            .find("{{ end }}")
            .map_or(text.len(), |e| start + e + "{{ end }}".len());
        text.replace_range(start..end, &format!("`{series}`"));
    }
    text
}

/// The generated part of `rule`'s page, up to its hand-written part.
fn generated(rule: &Rule, metrics: &[String], panels: &[(String, Vec<String>)]) -> String {
    let mut page = format!(
        "# {name}\n\n\
         <!-- Generated down to \"Checks\" from prometheus/alerts.yml and grafana/dashboards \
         (checked by telemetry::tests::alert_pages; rewritten by scripts/render-docs.sh). \
         Below: checks, remedy and escalation, written by hand. -->\n\n\
         Severity **{severity}**. Fires when this holds for {pending}:\n\n\
         ```promql\n{expr}\n```\n\n\
         ## Symptom\n\n{description}\n\n\
         ## Dashboard panel\n\n",
        name = rule.name,
        severity = rule.severity,
        pending = rule.pending,
        expr = rule.expr,
        description = plain(&rule.description),
    );
    let showing: Vec<String> = panels
        .iter()
        .filter_map(|(panel, series)| {
            let shared: Vec<String> = series
                .iter()
                .filter(|s| metrics.contains(s))
                .map(|s| format!("`{s}`"))
                .collect();
            let (file, title) = panel.split_once(": ")?;
            (!shared.is_empty())
                .then(|| format!("- **{title}** (`{file}`): {}\n", shared.join(", ")))
        })
        .collect();
    if showing.is_empty() {
        page.push_str(
            "No panel of the dashboard shows this alert's series: `msgexchange status` is the \
             first look.\n",
        );
    } else {
        page.push_str(&showing.concat());
    }
    page.push_str(&format!(
        "\nThe dashboard's rows and their pictures: [Dashboards](../dashboards.md). The rule is \
         tested by `promtool test rules prometheus/alerts_test.yml` (its `alertname: {}` \
         cases).\n\n",
        rule.name
    ));
    page
}

#[test]
fn alert_pages_are_current() {
    let metrics = alert_rules();
    let panels = panels();
    let write = std::env::var_os("MSGX_WRITE_DOCS").is_some();
    let mut stale = Vec::new();
    for rule in rules() {
        let used = metrics
            .iter()
            .find(|(n, _)| *n == rule.name)
            .map(|(_, m)| m.clone())
            .unwrap_or_default();
        let want = generated(&rule, &used, &panels);
        let path = root().join(format!("docs/alerts/{}.md", rule.name.to_lowercase()));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}: every alert has a page", path.display()));
        let at = text
            .find(HAND_WRITTEN)
            .unwrap_or_else(|| panic!("{}: no {HAND_WRITTEN:?} section", path.display()));
        let mut from = 0;
        for section in SECTIONS {
            from = text[from..]
                .find(section)
                .map(|i| from + i)
                .unwrap_or_else(|| {
                    panic!("{}: {section:?} missing or out of order", path.display())
                });
        }
        if text[..at] != want {
            if write {
                std::fs::write(&path, format!("{want}{}", &text[at..])).expect("write page");
            } else {
                stale.push(path.display().to_string());
            }
        }
    }
    assert!(
        stale.is_empty(),
        "alert pages whose generated part is stale (the rule, its description or the \
         dashboards changed): {stale:?}; regenerate with scripts/render-docs.sh"
    );
}

/// The other way round: no page for an alert that does not exist, and the book's table of
/// contents lists exactly the alert pages.
#[test]
fn every_alert_page_is_an_alert_and_in_the_book() {
    let names: BTreeSet<String> = rules().iter().map(|r| r.name.to_lowercase()).collect();
    let pages: BTreeSet<String> = runbook_pages(root())
        .iter()
        .filter(|p| p.parent().is_some_and(|d| d.ends_with("docs/alerts")))
        .filter_map(|p| Some(p.file_stem()?.to_string_lossy().to_string()))
        .collect();
    assert_eq!(pages, names, "docs/alerts/ holds one page per alert rule");
    let summary = std::fs::read_to_string(root().join("docs/SUMMARY.md")).expect("SUMMARY.md");
    let listed: BTreeSet<String> = summary
        .split("](alerts/")
        .skip(1)
        .filter_map(|rest| Some(rest.split_once(".md)")?.0.to_string()))
        .collect();
    assert_eq!(listed, names, "docs/SUMMARY.md lists every alert page");
}
