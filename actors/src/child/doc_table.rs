//! docs/architecture.md's crate table and actor table, checked against the code. The actor
//! table is rendered from [`Child::ALL`] and the actor modules: what each actor handles is read
//! from its module's `Handler` impls; what it tells and which core step it calls is written
//! here and must appear in the module. `MSGX_WRITE_ARCH_DOC=1 cargo test -p msgx-actors --lib
//! architecture_doc` rewrites the actor table; the crate table is checked (every module of a
//! crate is named in its row) and edited by hand.

use std::path::{Path, PathBuf};

use super::Child;
use crate::supervisor::{Supervised, Supervisor};

const ACTORS_BEGIN: &str = "<!-- actor-table: rendered from the code by `MSGX_WRITE_ARCH_DOC=1 cargo test -p msgx-actors --lib architecture_doc`; do not edit -->";
const ACTORS_END: &str = "<!-- /actor-table -->";
const CRATES_BEGIN: &str =
    "<!-- crate-table: every module is named in its crate's row (checked by `cargo test -p msgx-actors --lib architecture_doc`) -->";
const CRATES_END: &str = "<!-- /crate-table -->";

/// One actor's row.
struct Row {
    actor: &'static str,
    module: &'static str,
    /// What it tells, and the message types that say it (each must appear in the module).
    tells: (&'static str, &'static [&'static str]),
    /// The core steps it calls (the last path segment must appear in the module).
    steps: &'static [&'static str],
}

/// A child's row: `A` must be that child's actor, in that child's module.
fn row<A: Supervised>(
    child: Child,
    tells: (&'static str, &'static [&'static str]),
    steps: &'static [&'static str],
) -> Row {
    assert_eq!(A::CHILD, child, "the row of {child:?} names another actor");
    let path = std::any::type_name::<A>();
    assert!(
        path.contains(&format!("::{}::", child.name())),
        "{path} is not in module {}",
        child.name()
    );
    Row {
        actor: path.rsplit("::").next().unwrap_or(path),
        module: child.name(),
        tells,
        steps,
    }
}

fn rows() -> Vec<Row> {
    use crate::{
        backfill_sweeper::BackfillSweeper, dispatcher::Dispatcher, housekeeper::Housekeeper,
        inbox_poller::InboxPoller, late_detector::LateDetector, pump::Pump,
        purge_watch::PurgeWatch, schedule_requester::ScheduleRequester,
    };
    const NONE: (&str, &[&str]) = ("—", &[]);
    let mut rows: Vec<Row> = Child::ALL
        .iter()
        .copied()
        .map(|child| match child {
            Child::LateDetector => row::<LateDetector>(
                child,
                NONE,
                &["late::detect_once", "late::compensation_scan"],
            ),
            Child::BackfillSweeper => {
                row::<BackfillSweeper>(child, NONE, &["backfill::sweep_once"])
            }
            Child::Dispatcher => row::<Dispatcher>(
                child,
                NONE,
                &[
                    "dispatch::send_round",
                    "dispatch::write_outcome",
                    "dispatch::flush",
                ],
            ),
            Child::ScheduleRequester => {
                row::<ScheduleRequester>(child, NONE, &["outbound::daily_step"])
            }
            Child::PurgeWatch => row::<PurgeWatch>(
                child,
                ("— (sets `msgx_purge_boundary_id`)", &[]),
                &["ops::BoundaryWatch::advance"],
            ),
            Child::Housekeeper => row::<Housekeeper>(
                child,
                (
                    "— (sets the `msgx_retention_*` and `msgx_vacuum_*` metrics)",
                    &[],
                ),
                &["retention::Job::step", "retention::vacuum_step"],
            ),
            Child::Pump => row::<Pump>(
                child,
                (
                    "the sweeper `TerminalCommitted`, the dispatcher `EventsQueued`",
                    &["TerminalCommitted", "EventsQueued"],
                ),
                &["pump::PumpCore::step_group", "backlog::read"],
            ),
            Child::InboxPoller => row::<InboxPoller>(
                child,
                (
                    "the pump `WatermarkMoved`, the late detector `HolesReleased`; readiness",
                    &["WatermarkMoved", "HolesReleased", "Health"],
                ),
                &["poller::poll_once"],
            ),
        })
        .collect();
    let supervisor = std::any::type_name::<Supervisor>();
    rows.push(Row {
        actor: supervisor.rsplit("::").next().unwrap_or(supervisor),
        module: "supervisor",
        tells: (
            "every child `Shutdown` (last started first); `Fatal` to the binary; readiness",
            &["Shutdown", "Fatal", "Health"],
        ),
        steps: &["store::InstanceLock::check"],
    });
    rows
}

fn src(module: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join(format!("{module}.rs"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The messages a module's actor handles, in file order: `impl … Handler<M> for …` and the
/// `Shutdown` of [`crate::child_actor!`].
fn handled(source: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in source.lines().map(str::trim_start) {
        if line.starts_with("crate::child_actor!(") {
            found.push("Shutdown".to_string());
        }
        // `impl … for $actor`: a macro's body (the supervisor's `child_actor!`), not a handler.
        if line.contains("$actor") {
            continue;
        }
        let Some(rest) = line.strip_prefix("impl ") else {
            continue;
        };
        let Some((_, after)) = rest.split_once("Handler<") else {
            continue;
        };
        let Some((message, _)) = after.split_once('>') else {
            continue;
        };
        let name = message.rsplit("::").next().unwrap_or(message);
        found.push(name.to_string());
    }
    found
}

fn render() -> String {
    let mut out =
        String::from("| actor | module | handles | tells | core step |\n|---|---|---|---|---|\n");
    for r in rows() {
        let source = src(r.module);
        for told in r.tells.1 {
            assert!(
                source.contains(told),
                "{}: tells {told}, not in its module",
                r.actor
            );
        }
        for step in r.steps {
            let call = step.rsplit("::").next().unwrap_or(step);
            assert!(
                source.contains(call),
                "{}: calls {step}, not in its module",
                r.actor
            );
        }
        let handles: Vec<String> = handled(&source).iter().map(|m| format!("`{m}`")).collect();
        let steps: Vec<String> = r.steps.iter().map(|s| format!("`{s}`")).collect();
        out.push_str(&format!(
            "| `{}` | `{}` | {} | {} | {} |\n",
            r.actor,
            r.module,
            handles.join(", "),
            r.tells.0,
            steps.join(", ")
        ));
    }
    out
}

fn doc_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/architecture.md")
}

/// The text between `begin` and `end` (each on a line of its own), and its byte range.
fn section<'a>(doc: &'a str, begin: &str, end: &str) -> (&'a str, std::ops::Range<usize>) {
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

fn pub_mods(lib_rs: &Path) -> Vec<String> {
    let text =
        std::fs::read_to_string(lib_rs).unwrap_or_else(|e| panic!("{}: {e}", lib_rs.display()));
    text.lines()
        .filter_map(|l| l.strip_prefix("pub mod "))
        .map(|m| m.trim_end_matches(';').to_string())
        .collect()
}

/// One test for both tables: in write mode the actor table rewrites the file the crate table
/// reads.
#[test]
fn architecture_doc_tables_match_the_code() {
    actor_table_is_the_code();
    crate_table_names_every_module();
}

fn actor_table_is_the_code() {
    let doc = std::fs::read_to_string(doc_path()).expect("docs/architecture.md");
    let rendered = render();
    let (current, range) = section(&doc, ACTORS_BEGIN, ACTORS_END);
    if current == rendered {
        return;
    }
    if std::env::var_os("MSGX_WRITE_ARCH_DOC").is_some() {
        let mut new = doc.clone();
        new.replace_range(range, &rendered);
        std::fs::write(doc_path(), new).expect("write docs/architecture.md");
        return;
    }
    panic!(
        "docs/architecture.md's actor table differs from the code; rewrite it with \
         MSGX_WRITE_ARCH_DOC=1 cargo test -p msgx-actors --lib architecture_doc\n\
         rendered:\n{rendered}"
    );
}

fn crate_table_names_every_module() {
    let doc = std::fs::read_to_string(doc_path()).expect("docs/architecture.md");
    let (table, _) = section(&doc, CRATES_BEGIN, CRATES_END);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for (krate, lib_rs) in [
        ("msgx-core", root.join("src/lib.rs")),
        ("msgx-actors", root.join("actors/src/lib.rs")),
        ("msgx-bench", root.join("bench/src/lib.rs")),
    ] {
        let row = table
            .lines()
            .find(|l| l.starts_with(&format!("| `{krate}` |")))
            .unwrap_or_else(|| panic!("no row for {krate}"));
        let missing: Vec<String> = pub_mods(&lib_rs)
            .into_iter()
            .filter(|m| !row.contains(&format!("`{m}`")) && !row.contains(&format!("`{m}::")))
            .collect();
        assert!(
            missing.is_empty(),
            "{krate}'s row does not name {missing:?}"
        );
    }
}
