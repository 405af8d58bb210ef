//! docs/architecture.md's actor table, rendered from [`Child::ALL`] and the actor modules: what
//! each actor handles is read from its module's `Handler` impls; what it tells and which core
//! step it calls is written here and must appear in the module. `scripts/render-docs.sh`
//! rewrites it (with every other generated section, [`crate::rendered_docs`]).

use std::path::Path;

use super::Child;
use crate::rendered_docs::{doc_path, section, writing};
use crate::supervisor::{Supervised, Supervisor};

const ACTORS_BEGIN: &str =
    "<!-- actor-table: rendered from the code by `scripts/render-docs.sh`; do not edit -->";
const ACTORS_END: &str = "<!-- /actor-table -->";

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
            Child::BackfillSweeper => row::<BackfillSweeper>(
                child,
                ("the purge watch `MarksConfirmed`", &["MarksConfirmed"]),
                &["backfill::sweep_once"],
            ),
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

/// One test for both tables of docs/architecture.md: in write mode the actor table rewrites
/// the file the crate table reads.
#[test]
fn architecture_doc_tables_match_the_code() {
    actor_table_is_the_code();
    crate::rendered_docs::crate_table_matches_the_modules();
}

/// docs/architecture.md's actor table is [`render`]'s (rewritten under `MSGX_WRITE_DOCS`).
fn actor_table_is_the_code() {
    let path = doc_path("docs/architecture.md");
    let doc = std::fs::read_to_string(&path).expect("docs/architecture.md");
    let rendered = render();
    let (current, range) = section(&doc, ACTORS_BEGIN, ACTORS_END);
    if current == rendered {
        return;
    }
    if writing() {
        let mut new = doc.clone();
        new.replace_range(range, &rendered);
        std::fs::write(&path, new).expect("write docs/architecture.md");
        return;
    }
    panic!(
        "docs/architecture.md's actor table differs from the code; rewrite it with \
         scripts/render-docs.sh\nrendered:\n{rendered}"
    );
}
