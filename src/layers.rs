//! The core's layers (docs/architecture.md, "Layers"): every `crate::…` path in production code
//! names a module of the same layer or a lower one. The layer table is read from the doc, so
//! the doc and this check cannot drift apart; a new top-level module must be placed in it.
//! Test code (files declared under `#[cfg(test)]`, inline `#[cfg(test)] mod … { … }`) may
//! reach any layer.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const BEGIN: &str = "<!-- layers: checked by the core's `layers` test -->";
const END: &str = "<!-- /layers -->";

/// `(module path, rank)` from the doc's table, rank 0 the lowest. A row's modules are
/// backticked paths (`inbox::names`); the longest matching path decides.
fn table() -> Vec<(String, usize)> {
    let doc =
        std::fs::read_to_string(root().join("docs/architecture.md")).expect("architecture.md");
    let start = doc.find(BEGIN).expect("layers table begin marker") + BEGIN.len();
    let stop = doc[start..].find(END).expect("layers table end marker") + start;
    let rows = doc[start..stop]
        .lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("|---") && !l.starts_with("| layer"));
    let mut out = Vec::new();
    for (rank, row) in rows.enumerate() {
        let modules = row.split('|').nth(2).expect("a modules column");
        for name in modules.split('`').skip(1).step_by(2) {
            out.push((name.to_string(), rank));
        }
    }
    assert!(!out.is_empty(), "the layers table is empty");
    out
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The layer of `path` (`store::audit`, `inbox::names::Ident`): its longest prefix in the table.
fn rank_of(table: &[(String, usize)], path: &str) -> Option<(String, usize)> {
    table
        .iter()
        .filter(|(m, _)| path == m || path.starts_with(&format!("{m}::")))
        .max_by_key(|(m, _)| m.len())
        .cloned()
}

/// Every production source file under `src/` with its module path.
fn sources() -> Vec<(PathBuf, String)> {
    let src = root().join("src");
    let mut test_only = BTreeSet::new();
    let mut files = Vec::new();
    let mut dirs = vec![src.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("src dir").flatten() {
            let p = entry.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                test_only.extend(test_modules(&p));
                files.push(p);
            }
        }
    }
    files
        .into_iter()
        .filter(|f| {
            !test_only
                .iter()
                .any(|t| f == t || f.starts_with(t.with_extension("")))
        })
        .map(|f| {
            let rel = f.strip_prefix(&src).expect("under src").with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if parts.last().is_some_and(|l| l == "mod" || l == "lib") {
                parts.pop();
            }
            (f, parts.join("::"))
        })
        .collect()
}

/// The files `file` declares as `#[cfg(test)] mod x;`.
fn test_modules(file: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(file).expect("readable source");
    let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let dir = match stem {
        "mod" | "lib" => file.parent().map(Path::to_path_buf),
        _ => Some(file.with_extension("")),
    }
    .expect("a directory");
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    lines
        .windows(2)
        .filter(|w| w[0] == "#[cfg(test)]")
        .filter_map(|w| w[1].strip_prefix("mod ")?.strip_suffix(';'))
        .map(|m| dir.join(format!("{m}.rs")))
        .collect()
}

/// The `crate::…` paths a file's production code names (comments and an inline
/// `#[cfg(test)] mod … {` block and everything after it are skipped).
fn crate_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let code = line.split("//").next().unwrap_or("");
        if code.trim() == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|n| n.trim_start().starts_with("mod ") && n.trim_end().ends_with('{'))
        {
            break;
        }
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let inner = group.split('}').next().unwrap_or("");
                out.extend(inner.split(',').map(|p| p.trim().to_string()));
            } else {
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                    .unwrap_or(rest.len());
                out.push(rest[..end].trim_end_matches(':').to_string());
            }
        }
    }
    out.retain(|p| !p.is_empty() && p != "self");
    out
}

#[test]
fn no_import_runs_from_a_lower_layer_back_up() {
    let table = table();
    let mut wrong = Vec::new();
    for (file, module) in sources() {
        let Some((_, from)) = rank_of(&table, &module) else {
            continue; // lib.rs itself
        };
        let text = std::fs::read_to_string(&file).expect("readable source");
        for path in crate_paths(&text) {
            if let Some((target, to)) = rank_of(&table, &path) {
                if to > from {
                    wrong.push(format!("{} names crate::{path} ({target})", file.display()));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports from a lower layer back up (docs/architecture.md, \"Layers\"): {wrong:#?}"
    );
}

#[test]
fn every_top_level_module_has_a_layer() {
    let table = table();
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).expect("lib.rs");
    let missing: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod ")?.strip_suffix(';'))
        .filter(|m| rank_of(&table, m).is_none())
        .collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md's layers table does not place {missing:?}"
    );
}

#[test]
fn the_check_sees_a_back_up_import() {
    let table = table();
    let paths = crate_paths("use crate::{ops::Ops, rows};\nlet x = crate::pump::drain::f();");
    assert_eq!(paths, ["ops::Ops", "rows", "pump::drain::f"]);
    let store = rank_of(&table, "store::audit").expect("store is placed").1;
    let ops = rank_of(&table, "ops::Ops").expect("ops is placed").1;
    assert!(ops > store, "ops is above store");
}
