//! The generated parts of the docs, each checked against what it is generated from: a stale one
//! fails the test run, naming `scripts/render-docs.sh`, the one command that renders them all
//! (it sets `MSGX_WRITE_DOCS=1` for the tests that rewrite, and draws the pictures):
//!
//! - docs/architecture.md's actor table: rendered from the code by `child::doc_table`, whose
//!   test `architecture_doc_tables_match_the_code` also checks the crate table;
//! - docs/architecture.md's crate table: written by hand, checked both ways here (every module
//!   of a crate is named in its row, every name in a row is a module or an item of the crate);
//! - docs/metrics.md: rendered by msgx-core's `telemetry::tests::metrics_doc_is_current`;
//! - docs/img/dashboard-*.png: drawn by `scripts/render_dashboards.py`, which records in
//!   docs/img/rendered.json the SHA-256 of what it drew them from and of each picture; checked
//!   here against the files, the dashboard's rows and docs/dashboards.md.
//! - CHANGELOG.md: its newest release is this package's version (`msgexchange --version`,
//!   the .deb), below an `[Unreleased]` section.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use sha2::{Digest, Sha256};

const CRATES_BEGIN: &str = "<!-- crate-table: every module is named in its crate's row and every name in a row is a module or item of that crate (checked by `architecture_doc_tables_match_the_code`) -->";
const CRATES_END: &str = "<!-- /crate-table -->";

/// A path from the repository root.
pub(crate) fn doc_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(relative)
}

/// True under `scripts/render-docs.sh`: rendered sections are rewritten, not compared.
pub(crate) fn writing() -> bool {
    std::env::var_os("MSGX_WRITE_DOCS").is_some()
}

/// The text between `begin` and `end` (each on a line of its own), and its byte range.
pub(crate) fn section<'a>(
    doc: &'a str,
    begin: &str,
    end: &str,
) -> (&'a str, std::ops::Range<usize>) {
    let start = doc
        .find(begin)
        .unwrap_or_else(|| panic!("marker {begin} missing"))
        + begin.len()
        + 1;
    let stop = doc[start..]
        .find(end)
        .unwrap_or_else(|| panic!("marker {end} missing"))
        + start;
    (&doc[start..stop], start..stop)
}

/// A crate as its row in the crate table names it.
struct Crate {
    /// `msgx-core`, as the row starts.
    name: &'static str,
    /// `msgx_core`, as code paths name it.
    path: &'static str,
    /// Its `src` directory, from the repository root.
    src: &'static str,
    /// Its root file in `src` (`lib.rs`, or `mod.rs` for the tests' harness in tests/common).
    root: &'static str,
}

const CRATES: [Crate; 4] = [
    Crate {
        name: "msgx-core",
        path: "msgx_core",
        src: "src",
        root: "lib.rs",
    },
    Crate {
        name: "msgx-actors",
        path: "msgx_actors",
        src: "actors/src",
        root: "lib.rs",
    },
    Crate {
        name: "msgx-bench",
        path: "msgx_bench",
        src: "bench/src",
        root: "lib.rs",
    },
    Crate {
        name: "msgx-testkit",
        path: "msgx_testkit",
        src: "tests/common",
        root: "mod.rs",
    },
];

/// The top-level modules of a crate (`mod` and `pub mod` in its root file), without its test
/// modules (`#[cfg(test)]`).
fn modules(c: &Crate) -> Vec<String> {
    let lib = std::fs::read_to_string(doc_path(c.src).join(c.root)).expect("crate root");
    let mut out = Vec::new();
    let mut test_only = false;
    for line in lib.lines().map(str::trim) {
        let decl = line.strip_prefix("pub ").unwrap_or(line);
        if let Some(m) = decl.strip_prefix("mod ").and_then(|m| m.strip_suffix(';')) {
            if !test_only {
                out.push(m.to_string());
            }
            test_only = false;
        } else if line == "#[cfg(test)]" {
            test_only = true;
        } else if !line.starts_with("#[") && !line.starts_with("//") {
            test_only = false;
        }
    }
    out
}

/// Every `.rs` file of `dir` and below, or the one file `<dir>.rs`.
fn sources(module_dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(text) = std::fs::read_to_string(module_dir.with_extension("rs")) {
        out.push(text);
    }
    let mut dirs = vec![module_dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|x| x == "rs") {
                out.push(std::fs::read_to_string(&path).expect("readable source"));
            }
        }
    }
    out
}

/// True when one of `texts` defines an item `name` (fn, type, trait, module, constant, macro).
fn defines(texts: &[String], name: &str) -> bool {
    const KINDS: [&str; 9] = [
        "fn ",
        "struct ",
        "enum ",
        "trait ",
        "mod ",
        "type ",
        "const ",
        "static ",
        "macro_rules! ",
    ];
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    texts.iter().any(|t| {
        KINDS.iter().any(|k| {
            let needle = format!("{k}{name}");
            t.match_indices(&needle).any(|(i, _)| {
                let before_ok = !t[..i].ends_with(ident);
                let after_ok = !t[i + needle.len()..].starts_with(ident);
                before_ok && after_ok
            })
        })
    })
}

/// The code names in `row` (backticked `a::b::C` paths; prose, file names and commands are
/// not names) that are neither a module nor an item of the crate they start from.
fn unknown_names(row: &str, own: &Crate) -> Vec<String> {
    let is_ident = |s: &str| {
        !s.is_empty()
            && !s.starts_with(|c: char| c.is_ascii_digit())
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let mut unknown = Vec::new();
    for name in row.split('`').skip(1).step_by(2) {
        let segments: Vec<&str> = name.split("::").collect();
        if !segments.iter().all(|s| is_ident(s)) {
            continue;
        }
        let (krate, path) = match CRATES.iter().find(|c| c.path == segments[0]) {
            Some(c) => (c, &segments[1..]),
            None => (own, &segments[..]),
        };
        if !resolves(krate, path) {
            unknown.push(name.to_string());
        }
    }
    unknown
}

/// True when `path` names a module of `krate` (then items of it), or items of the crate.
fn resolves(krate: &Crate, path: &[&str]) -> bool {
    let Some((first, rest)) = path.split_first() else {
        return true; // the crate itself
    };
    let src = doc_path(krate.src);
    let texts = if first.starts_with(|c: char| c.is_ascii_lowercase()) {
        if !modules(krate).iter().any(|m| m == first) {
            return false;
        }
        sources(&src.join(first))
    } else {
        let all = sources(&src);
        if !defines(&all, first) {
            return false;
        }
        all
    };
    rest.iter().all(|item| defines(&texts, item))
}

/// The crate table, both ways: every module of a crate is named in its row, and every code
/// name in a row is a module or an item of that crate (a renamed or removed one fails here).
pub(crate) fn crate_table_matches_the_modules() {
    let doc = std::fs::read_to_string(doc_path("docs/architecture.md")).expect("architecture.md");
    let (table, _) = section(&doc, CRATES_BEGIN, CRATES_END);
    for c in &CRATES {
        let row = table
            .lines()
            .find(|l| l.starts_with(&format!("| `{}` |", c.name)))
            .unwrap_or_else(|| panic!("no row for {}", c.name));
        let missing: Vec<String> = modules(c)
            .into_iter()
            .filter(|m| !row.contains(&format!("`{m}`")) && !row.contains(&format!("`{m}::")))
            .collect();
        assert!(
            missing.is_empty(),
            "docs/architecture.md: {}'s row does not name the modules {missing:?}",
            c.name
        );
        let unknown = unknown_names(row, c);
        assert!(
            unknown.is_empty(),
            "docs/architecture.md: {}'s row names what is no module or item: {unknown:?}",
            c.name
        );
    }
}

fn sha256(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `dashboard-<n>-<slug of the row title>.png` for each row of the dashboard, as
/// `scripts/render_dashboards.py` names its pictures.
fn expected_pictures(dashboard: &Value) -> Vec<String> {
    let slug = |title: &str| {
        let mut s = String::new();
        for c in title.to_lowercase().chars() {
            if c.is_ascii_alphanumeric() {
                s.push(c);
            } else if !s.ends_with('-') {
                s.push('-');
            }
        }
        s.trim_matches('-').to_string()
    };
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut titles: Vec<&str> = Vec::new();
    for (i, p) in panels.iter().enumerate() {
        if p["type"] == "row" {
            titles.push(p["title"].as_str().unwrap_or(""));
        } else if i == 0 {
            titles.push(""); // panels before the first row
        }
    }
    titles
        .iter()
        .enumerate()
        .map(|(n, t)| format!("dashboard-{}-{}.png", n + 1, slug(t)))
        .collect()
}

/// The pictures of docs/dashboards.md are the ones drawn from the dashboard and the scenario
/// as they are now: docs/img/rendered.json's hashes match the files, there is one picture per
/// dashboard row and no other, and the page shows each.
#[test]
fn dashboard_pictures_are_current() {
    let stale = "stale: render the pictures again with scripts/render-docs.sh";
    let manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(doc_path("docs/img/rendered.json"))
            .unwrap_or_else(|e| panic!("docs/img/rendered.json: {e}; {stale}")),
    )
    .expect("docs/img/rendered.json is JSON");
    let recorded = |key: &str| -> BTreeMap<String, String> {
        serde_json::from_value(manifest[key].clone()).expect("name → sha256")
    };
    for input in [
        "grafana/dashboards/msgexchange.json",
        "docs/img/scenario.json",
        "scripts/render_dashboards.py",
    ] {
        let was = recorded("inputs").get(input).cloned().unwrap_or_default();
        assert_eq!(
            sha256(&doc_path(input)),
            was,
            "{input} changed since the pictures were drawn; {stale}"
        );
    }
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(doc_path("grafana/dashboards/msgexchange.json"))
            .expect("dashboard"),
    )
    .expect("dashboard is JSON");
    let want = expected_pictures(&dashboard);
    let pictures = recorded("pictures");
    let drawn: Vec<&String> = pictures.keys().collect();
    let mut sorted_want: Vec<&String> = want.iter().collect();
    sorted_want.sort();
    assert_eq!(drawn, sorted_want, "one picture per dashboard row; {stale}");
    let on_disk: Vec<String> = std::fs::read_dir(doc_path("docs/img"))
        .expect("docs/img")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("dashboard-") && n.ends_with(".png"))
        .collect();
    for name in &on_disk {
        let hash = pictures
            .get(name)
            .unwrap_or_else(|| panic!("docs/img/{name}: no row draws it; {stale}"));
        assert_eq!(
            &sha256(&doc_path(&format!("docs/img/{name}"))),
            hash,
            "docs/img/{name} is not the one drawn; {stale}"
        );
    }
    let page = std::fs::read_to_string(doc_path("docs/dashboards.md")).expect("dashboards.md");
    for name in &want {
        assert!(
            on_disk.contains(name) && page.contains(&format!("(img/{name})")),
            "docs/img/{name} is missing or not shown by docs/dashboards.md; {stale}"
        );
    }
}

/// The versions of CHANGELOG.md's releases, newest first (`## [x.y.z] - YYYY-MM-DD`), after
/// checking that `[Unreleased]` is the first section (where the next release's lines go).
pub(crate) fn changelog_releases(changelog: &str) -> Vec<String> {
    let headings: Vec<&str> = changelog
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .collect();
    assert_eq!(
        headings.first(),
        Some(&"[Unreleased]"),
        "CHANGELOG.md: [Unreleased] is the first section"
    );
    headings[1..]
        .iter()
        .map(|h| {
            let (version, date) = h
                .strip_prefix('[')
                .and_then(|h| h.split_once("] - "))
                .unwrap_or_else(|| panic!("CHANGELOG.md: `## {h}` is not `## [x.y.z] - date`"));
            let parts: Vec<&str> = version.split('.').collect();
            assert!(
                parts.len() == 3 && parts.iter().all(|p| p.parse::<u32>().is_ok()),
                "CHANGELOG.md: {version} is no semantic version"
            );
            assert!(
                date.len() == 10 && date.as_bytes()[4] == b'-' && date.as_bytes()[7] == b'-',
                "CHANGELOG.md: {version}'s date {date} is not YYYY-MM-DD"
            );
            version.to_string()
        })
        .collect()
}

/// The package (`msgexchange --version`, the .deb) is the newest release of CHANGELOG.md, and
/// the releases go down strictly (a version bump without its changelog entry, or an entry
/// without the bump, fails here).
#[test]
fn the_changelog_top_release_is_the_package_version() {
    let text = std::fs::read_to_string(doc_path("CHANGELOG.md")).expect("CHANGELOG.md");
    let releases = changelog_releases(&text);
    assert_eq!(
        releases.first().map(String::as_str),
        Some(env!("CARGO_PKG_VERSION")),
        "CHANGELOG.md's newest release is not msgx-actors' version (actors/Cargo.toml)"
    );
    let key = |v: &String| -> Vec<u32> {
        v.split('.')
            .map(|p| p.parse().expect("checked above"))
            .collect()
    };
    for pair in releases.windows(2) {
        assert!(
            key(&pair[0]) > key(&pair[1]),
            "CHANGELOG.md: {} is listed above {} but is not newer",
            pair[0],
            pair[1]
        );
    }
}
