//! Issue 19 item 7, reworked for issue 29 item 6: the site's procedures against a live
//! pipeline, at random, judged by a reference model that expects every outcome.
//!
//! A plan ([`super::ops_plan`], drawn by [`super::ops_gen`] or read from a regression file)
//! starts background writers (the test's own messages, so the model knows every row: updates,
//! deletes, unknown types, malformed rows, business duplicates, held commits), fires faults
//! (`kill -9`, SIGTERM, store connections cut through a proxy, a standby takeover) and runs
//! operator actions through the real `msgexchange` CLI or as the DB owner's SQL — cutover with
//! stock (each mode, `cutover plan` first), replay, approved skip, recover-backfill, the owner
//! purging the READY boundary, plan B rotation, events requeue, a commit left in doubt by a
//! slow broker ([`ops_slow_commit`]), a rebuilt store delivering on the same topic
//! ([`ops_shared_topic`]) — some of them *while* a fault is live ([`Step::Overlap`]). After every sequence: `verify --kafka`, and the reference
//! model ([`super::ops_reference`]) against PostgreSQL, the inbox marks and the topic
//! ([`super::ops_check`]).
//!
//! The oracle predicts and compares, it does not adopt the service's answers (issue 41): each
//! operator action is judged against the model's prediction of its effect
//! ([`super::ops_effect`]; a run prints the effect table per kind and fails below a kind's
//! required share), the READY boundary against bounds from the ledger, the replay and skip sets
//! against the model's; an overlap whose fault ended before its action started is a harness
//! failure; held commits and the owner's row lock are judged while they last; every record on
//! the topic is checked against the model's events.
//!
//! Each plan names its `kafka.delivery` (issue 31 item 3; drawn from the seed, about half in
//! each mode, and kept in the plan file). At-least-once sequences deliver to tansu and report
//! their duplicates (allowed only after a crash, kill or store cut); exactly-once sequences
//! deliver to librdkafka's mock cluster and must show 0 duplicates whatever the faults —
//! "exactly once in the log", since neither broker hides aborted records from
//! `read_committed` ([`ops_broker`] says why the mock cluster and what the check can see).
//!
//! CI runs every plan in `tests/chaos/regressions/` and the seeds `1..=CI_SEEDS`, three at a
//! time. `MSGEXCHANGE_OPS_PLAN=<file>` runs one plan file (`MSGEXCHANGE_OPS_REPEAT=<n>`: n
//! copies of it, to hunt a flake under load), `MSGEXCHANGE_OPS_SEED=<n>` one
//! seed, `MSGEXCHANGE_OPS_SEQUENCES=<n>` n random seeds (a soak: issue 41 asks ≥ 500); `MSGEXCHANGE_OPS_CONCURRENCY`
//! sets how many run at once; `MSGEXCHANGE_OPS_OPEN=1` runs the [`KNOWN_OPEN`] kinds as planned;
//! `MSGX_TEST_DELIVERY=exactly-once|at-least-once` runs every plan in that mode;
//! `MSGEXCHANGE_OPS_LOG_LEVEL=info` logs the instances in more detail than the suite's warn.
//! A failing plan is written to `/tmp/msgx-chaos/plan-<tag>.json` (a seed's plan also with
//! `MSGEXCHANGE_OPS_WRITE_PLAN=1`): copy it into `tests/chaos/regressions/` to keep it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::LocalBoxFuture;
use futures::{FutureExt as _, StreamExt as _};
use rand::Rng as _;

use super::ops_gen::generate;
use super::ops_model::{Exit, Model};
use super::ops_plan::{runs_open, Plan, Step, StoreKind, KNOWN_OPEN, SLOW_COMMIT_WAIT};
use crate::common::instance::{
    cli, log_dir, off_runtime, proxied, service_env_in, set_var, settled_above, simulator, CliOut,
    Instance, SimOpts,
};
use crate::common::kafka::{consume, Received};
use crate::common::proxy::Proxy;
use crate::common::seed::{self, Proc};
use crate::common::tansu::Tansu;
use crate::common::TestEnv;
use msgx_core::settings::Delivery;
use ops_broker::Broker;
use ops_cutover::Start;
use ops_report::{report, Outcome};

#[path = "ops_broker.rs"]
mod ops_broker;
#[path = "ops_cutover.rs"]
mod ops_cutover;
#[path = "ops_gate.rs"]
mod ops_gate;
#[path = "ops_pair.rs"]
mod ops_pair;
#[path = "ops_pair_more.rs"]
mod ops_pair_more;
#[path = "ops_pair_two.rs"]
mod ops_pair_two;
#[path = "ops_purge.rs"]
mod ops_purge;
#[path = "ops_report.rs"]
mod ops_report;
#[path = "ops_requeue.rs"]
mod ops_requeue;
#[path = "ops_sampler.rs"]
mod ops_sampler;
#[path = "ops_shared_topic.rs"]
mod ops_shared_topic;
#[path = "ops_slow_commit.rs"]
mod ops_slow_commit;
#[path = "ops_steps.rs"]
mod ops_steps;
#[path = "ops_takeover.rs"]
mod ops_takeover;
#[path = "ops_writers.rs"]
mod ops_writers;

/// The generated seeds CI runs besides the regression plans.
pub const CI_SEEDS: u64 = 28;

/// `pipeline.max_commit_delay` in [`service_env`]: a commit held at least this long may arrive
/// late.
pub(crate) const MAX_COMMIT_DELAY_MS: u64 = 2000;

const ACTOR: &str = "ops-test";
const TICKET: &str = "OPS-19";
const REPLAYABLE: &str = "'CODEC_ERROR','UNSUPPORTED','INFRA','EXHAUSTED'";

/// An inbox row as the DB owner keeps it aside: id, received, text, processed, status.
type KeptRow = (
    i64,
    Option<chrono::NaiveDateTime>,
    Option<String>,
    Option<chrono::NaiveDateTime>,
    Option<String>,
);

/// One sequence's world: its databases, proxies, topics, the active instance, the writers.
struct Seq {
    plan: Plan,
    tag: String,
    env: TestEnv,
    /// The broker of the plan's delivery mode.
    broker: Broker,
    topic: String,
    pg_proxy: Arc<Proxy>,
    my_proxy: Arc<Proxy>,
    /// The service's variables (stores through the proxies).
    vars: Vec<(String, String)>,
    /// The operator's variables (stores direct).
    direct: Vec<(String, String)>,
    active: Option<Instance>,
    instances: Vec<String>,
    /// Background writers and the owner's lock.
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Held commits.
    holds: Vec<tokio::task::JoinHandle<()>>,
    /// Legacy plans' simulator processes.
    sims: Vec<std::process::Child>,
    ledger: ops_writers::Ledger,
    /// The last number of a runtime message.
    n: i64,
    /// Violations found by background judges (held commits).
    live: ops_writers::Live,
    /// When the last fault that can stall the service ended.
    faults: ops_writers::Faults,
    /// `msgx_inbox_id_regressions_total` summed over every instance's life.
    id_regressions: f64,
    /// The last value read per instance (a second read of one instance adds only the rise).
    harvested: BTreeMap<String, f64>,
    /// Inbox ids the model knows as holes: rolled-back inserts (held commits, the cutover's gap).
    holes: Arc<Mutex<std::collections::BTreeSet<i64>>>,
    /// The row under the DB owner's lock and when the lock ends.
    locked: Option<(i64, Instant)>,
    /// True while a purge runs that may race a held commit (a [`KNOWN_OPEN`] kind run open).
    purge_races_holds: bool,
    /// The last purge's span: its readiness call to its delete (a pair's overlap check).
    purge_span: Option<(Instant, Instant)>,
    /// The last takeover's span: the active instance frozen to the standby ready (a pair's
    /// overlap check).
    takeover_span: Option<(Instant, Instant)>,
    /// Told when the next takeover has frozen the active instance (a pair's action waits for
    /// it, so that it runs across the takeover).
    on_freeze: Option<Arc<tokio::sync::Notify>>,
    /// Rows an operator replay reopened, and when its CLI returned (the model's clock for
    /// their next DEAD).
    reopened: BTreeMap<i64, Instant>,
    /// A pair's pause point, taken by the purge that runs as its second action.
    gate: Option<ops_gate::Gate>,
    /// True while a pair's first action runs beside its second (an idle prediction of the
    /// second may be overtaken by the first).
    pair_running: bool,
    /// What the harness tells the invariant sampler (held inserts, replays, rotations).
    shared: ops_sampler::Shared,
    /// The SPEC §11 sampler, from the first instance's start to the end's settle.
    sampler: Option<ops_sampler::Sampler>,
    /// When the sequence started (the sampler's moments are counted from it).
    started: Instant,
    model: Model,
}

/// `MSGX_TEST_DELIVERY`, when set, runs every plan in that mode (e.g. a regression file in the
/// other mode); otherwise each plan's own `delivery` holds.
fn forced_delivery(mut plans: Vec<(String, Plan)>) -> Vec<(String, Plan)> {
    if std::env::var("MSGX_TEST_DELIVERY").is_ok() {
        let mode = crate::common::instance::delivery_from_env();
        for (_, p) in &mut plans {
            p.delivery = mode;
        }
    }
    plans
}

/// The plans to run, each with a tag naming it.
fn plans() -> Vec<(String, Plan)> {
    let var = |k: &str| std::env::var(k).ok();
    if let Some(f) = var("MSGEXCHANGE_OPS_PLAN") {
        let plan = super::ops_plan::load(std::path::Path::new(&f));
        // A flake hunt: the plan n times at once (the load the full suite puts on it), each
        // under a tag of its own with this process's id (its logs apart from a second run's).
        let Some(n) = var("MSGEXCHANGE_OPS_REPEAT").and_then(|v| v.parse::<usize>().ok()) else {
            return vec![("file".into(), plan)];
        };
        let pid = std::process::id();
        return (0..n)
            .map(|i| (format!("f{pid}x{i}"), plan.clone()))
            .collect();
    }
    if let Some(s) = var("MSGEXCHANGE_OPS_SEED").and_then(|v| v.parse().ok()) {
        let plan = generate(s);
        // A soak's failure the harness itself could not write (the soak stopped) kept anyway.
        if var("MSGEXCHANGE_OPS_WRITE_PLAN").is_some_and(|v| v == "1") {
            let path = log_dir().join(format!("plan-s{s}.json"));
            std::fs::write(&path, plan.to_json()).expect("plan file");
            eprintln!("ops: plan of seed {s} written to {}", path.display());
        }
        return vec![(format!("s{s}"), plan)];
    }
    if let Some(n) = var("MSGEXCHANGE_OPS_SEQUENCES").and_then(|v| v.parse::<usize>().ok()) {
        let mut rng = rand::rng();
        return (0..n)
            .map(|_| rng.random_range(1_000..1_000_000_000))
            .map(|s| (format!("s{s}"), generate(s)))
            .collect();
    }
    let mut all: Vec<(String, Plan)> = Plan::regressions()
        .into_iter()
        .enumerate()
        .map(|(i, (_, p))| (format!("r{i}"), p))
        .collect();
    all.extend((1..=CI_SEEDS).map(|s| (format!("s{s}"), generate(s))));
    all
}

#[tokio::test]
async fn operator_actions_against_a_live_pipeline() {
    let plans = forced_delivery(plans());
    let concurrency: usize = std::env::var("MSGEXCHANGE_OPS_CONCURRENCY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    for (kind, fix) in KNOWN_OPEN {
        let how = if runs_open(kind) {
            "runs open"
        } else {
            "defused"
        };
        eprintln!("ops: known open {kind} ({how}): waits for {fix}");
    }
    // The broker a plan runs on is its defused plan's (a known-open kind may change it).
    let on_tansu = |p: &Plan| p.defused().0.on_tansu();
    let tansu = plans.iter().any(|(_, p)| on_tansu(p)).then(Tansu::start);
    let mock = plans.iter().any(|(_, p)| !on_tansu(p)).then(Broker::mock);
    let broker_of = |p: &Plan| match (on_tansu(p), &tansu, &mock) {
        (true, Some(t), _) => Broker::Tansu {
            bootstrap: t.bootstrap.clone(),
            admin: t.admin(),
        },
        // A slow commit delays the broker's next EndTxn, whoever sends it: a mock of its own.
        (false, _, Some(_)) if p.defused().0.slow_commits() => Broker::mock(),
        (false, _, Some(m)) => m.clone(),
        _ => unreachable!("a broker is started for every plan"),
    };
    let started = Instant::now();
    let outcomes: Vec<Outcome> = futures::stream::iter(plans)
        .map(|(tag, plan)| {
            let broker = broker_of(&plan);
            run_caught(tag, plan, broker)
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    report(&outcomes, started.elapsed(), concurrency);
    let mut shares = super::ops_effect::Shares::new();
    for o in &outcomes {
        super::ops_effect::add_plan(&mut shares, &o.effects);
    }
    let (table, short) = super::ops_effect::table(&shares, outcomes.len());
    eprint!("{table}");
    assert!(
        short.is_empty(),
        "action kinds below their required share of effective plans: {short:?}"
    );
    let failed: Vec<&str> = outcomes
        .iter()
        .filter(|o| !o.violations.is_empty())
        .map(|o| o.tag.as_str())
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} sequences broke the model ({failed:?}); their plans are in {}",
        failed.len(),
        outcomes.len(),
        log_dir().display()
    );
}

/// The value of an unlabelled metric in a /metrics text (`None` when absent: absent is not 0).
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// Runs one sequence; a panic inside it becomes a violation of that sequence.
async fn run_caught(tag: String, plan: Plan, broker: Broker) -> Outcome {
    let start = Instant::now();
    let (run, defused) = plan.defused();
    let delivery = run.delivery;
    eprintln!(
        "ops: {tag} (seed {}, {}) starts ({} steps; defused: {defused:?})",
        plan.seed,
        plan.delivery.as_str(),
        run.steps.len()
    );
    let result = std::panic::AssertUnwindSafe(run_sequence(tag.clone(), run, broker))
        .catch_unwind()
        .await;
    let (actions, idle, effects, line, duplicates, violations) = match result {
        Ok(model) => (
            model.actions.clone(),
            model.idle.clone(),
            model.effects.clone(),
            format!("{} [{}]", model.actions_line(), model.timing_line),
            model.kafka_duplicates,
            model.violations,
        ),
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            let v = vec![format!("panicked: {msg}")];
            let none = BTreeMap::new();
            (none.clone(), none, BTreeMap::new(), String::new(), 0, v)
        }
    };
    let secs = start.elapsed().as_secs_f64();
    let verdict = if violations.is_empty() {
        "ok"
    } else {
        "FAILED"
    };
    eprintln!("ops: {tag} {verdict} in {secs:.1}s: {line}");
    Outcome {
        tag,
        plan,
        secs,
        actions,
        idle,
        effects,
        line,
        duplicates,
        violations,
        delivery,
    }
}

async fn run_sequence(tag: String, plan: Plan, broker: Broker) -> Model {
    let mut seq = Seq::new(tag, plan, broker).await;
    match seq.cutover().await {
        Start::Abort => {
            let Seq { env, model, .. } = seq;
            env.cleanup().await;
            return model;
        }
        Start::Fresh => seq.start(&[]).await,
        Start::With(vars) => {
            let first: Vec<(&str, &str)> =
                vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            seq.start(&first).await;
            seq.check_seeded().await;
        }
    }
    seq.start_sampler();
    for step in seq.plan.steps.clone() {
        seq.step(&step).await;
    }
    seq.finish().await;
    let Seq { env, model, .. } = seq;
    env.cleanup().await;
    model
}

impl Seq {
    async fn new(tag: String, plan: Plan, broker: Broker) -> Self {
        let env = TestEnv::new(&format!("ops{tag}")).await;
        let topic = format!("msgx.ops{tag}.{}.events", plan.seed);
        let dlq = format!("msgx.ops{tag}.{}.dlq", plan.seed);
        let (a, t, d, outage) = (
            broker.clone(),
            topic.clone(),
            dlq.clone(),
            plan.dispatch_outage,
        );
        off_runtime(move || {
            a.create_topic(&d, 3);
            if !outage {
                a.create_topic(&t, 3);
            }
        })
        .await;
        let pg_proxy = Arc::new(Proxy::start("127.0.0.1:5432").await);
        let my_proxy = Arc::new(Proxy::start("127.0.0.1:3306").await);
        let tune = |mut v: Vec<(String, String)>| {
            set_var(&mut v, "MSGX_KAFKA__TOPIC", &topic);
            set_var(&mut v, "MSGX_KAFKA__DLQ_TOPIC", &dlq);
            // A topic that is not there stays missing (tansu would create it on demand).
            set_var(
                &mut v,
                "MSGX_KAFKA__EXTRA",
                "allow.auto.create.topics=false",
            );
            set_var(&mut v, "MSGX_LEASE__TTL", "5s");
            // A flake hunt's instance logs in more detail (the suite's default is warn).
            if let Ok(level) = std::env::var("MSGEXCHANGE_OPS_LOG_LEVEL") {
                set_var(&mut v, "MSGX_LOG__LEVEL", &level);
            }
            set_var(&mut v, "MSGX_PROCESSING__MAX_ATTEMPTS", "6");
            if plan.slow_commits() {
                set_var(&mut v, "MSGX_KAFKA__TRANSACTION_TIMEOUT", SLOW_COMMIT_WAIT);
            }
            if outage {
                set_var(&mut v, "MSGX_KAFKA__DELIVERY_TIMEOUT", "2s");
                set_var(&mut v, "MSGX_DISPATCH__MAX_ATTEMPTS", "2");
            }
            v
        };
        let vars = tune(service_env_in(
            &env,
            &proxied(&env.pg_url, "127.0.0.1:5432", pg_proxy.port),
            &proxied(&env.my_url, "127.0.0.1:3306", my_proxy.port),
            broker.bootstrap(),
            plan.delivery,
        ));
        let direct = tune(service_env_in(
            &env,
            &env.pg_url,
            &env.my_url,
            broker.bootstrap(),
            plan.delivery,
        ));
        let mut model = Model::default();
        let kinds = plan.kinds();
        model.foreign_writers = kinds.iter().any(|k| *k == "write" || *k == "duplicate");
        model.duplicates_allowed = plan.dispatch_outage
            || kinds
                .iter()
                .any(|k| matches!(*k, "kill9" | "takeover" | "cut_pg" | "shared_topic"));
        model.requeued_by_hand = plan.dispatch_outage;
        model.exactly_once = plan.delivery == Delivery::ExactlyOnce;
        Self {
            plan,
            tag,
            env,
            broker,
            topic,
            pg_proxy,
            my_proxy,
            vars,
            direct,
            active: None,
            instances: Vec::new(),
            tasks: Vec::new(),
            holds: Vec::new(),
            sims: Vec::new(),
            ledger: Arc::new(Mutex::new(Vec::new())),
            n: 50_000,
            purge_races_holds: false,
            purge_span: None,
            takeover_span: None,
            on_freeze: None,
            reopened: BTreeMap::new(),
            pair_running: false,
            gate: None,
            shared: ops_sampler::Shared::default(),
            sampler: None,
            started: Instant::now(),
            holes: Arc::default(),
            id_regressions: 0.0,
            live: Arc::default(),
            faults: Arc::default(),
            harvested: BTreeMap::new(),
            locked: None,
            model,
        }
    }

    /// A CLI call with the operator's variables; a panic line in its output is a violation.
    async fn cli(&mut self, args: &[&str]) -> CliOut {
        let out = cli(&self.direct, args).await;
        if out.all().contains("panicked") {
            self.model.violation(format!(
                "`msgexchange {}` panicked: {}",
                args.join(" "),
                out.all()
            ));
        }
        out
    }

    /// Starts an instance (the active one) and waits until it is ready.
    async fn start(&mut self, extra: &[(&str, &str)]) {
        let name = self.name("run");
        let i = Instance::spawn(&self.vars, &name, extra);
        i.wait_ready(Duration::from_secs(40)).await;
        self.active = Some(i);
    }

    fn name(&mut self, what: &str) -> String {
        let n = format!("ops{}-{}-{what}", self.tag, self.instances.len() + 1);
        self.instances.push(n.clone());
        n
    }

    /// Notes that a fault that can stall the service starts now.
    fn fault_start(&self) {
        self.faults
            .lock()
            .expect("faults")
            .push((Instant::now(), None));
    }

    /// Notes that the last open fault ended now.
    fn fault_end(&self) {
        let mut f = self.faults.lock().expect("faults");
        if let Some(span) = f.iter_mut().rev().find(|s| s.1.is_none()) {
            span.1 = Some(Instant::now());
        }
    }

    fn step<'a>(&'a mut self, step: &'a Step) -> LocalBoxFuture<'a, ()> {
        async move {
            self.model.acted(step.kind());
            // A rotation renames the inbox under the poller; a requeue across a restart
            // freezes and kills the instance.
            let stalls = matches!(
                step,
                Step::Kill9 | Step::Term | Step::Cut { .. } | Step::Takeover | Step::Rotate
            ) || (matches!(step, Step::Requeue) && self.plan.dispatch_outage);
            if stalls {
                self.fault_start();
            }
            match step {
                Step::Upstream { msgs, gap_ms } => self.upstream(msgs.clone(), *gap_ms),
                Step::Hold {
                    held,
                    follow,
                    hold_ms,
                    rollback,
                } => {
                    self.hold(held.clone(), Some(follow.clone()), *hold_ms, *rollback)
                        .await
                }
                Step::OwnerLock { msgs, hold_ms } => self.owner_lock(msgs.clone(), *hold_ms).await,
                Step::Overlap {
                    fault,
                    after_ms,
                    action,
                } => self.overlap(step.kind(), fault, *after_ms, action).await,
                Step::Pair { first, second } => self.pair(first, second).await,
                Step::Write { total, sim_seed } | Step::Duplicate { total, sim_seed } => {
                    self.sims
                        .push(simulator(&self.env, legacy_sim(*total, *sim_seed)));
                }
                Step::Insert {
                    good,
                    hold_ms,
                    rollback,
                } => {
                    for _ in 0..*good {
                        let m = self.runtime_flop("L");
                        self.write(m).await;
                    }
                    let m = self.runtime_flop("L");
                    self.hold(m, None, *hold_ms, *rollback).await;
                }
                Step::Kill9 => {
                    self.harvest_metrics().await;
                    let a = self.active.take().expect("an active instance");
                    let name = a.name.clone();
                    let st = a.kill9();
                    self.model.exited(&name, Exit::Killed, st);
                    self.start(&[]).await;
                }
                Step::Term => {
                    self.stop_active().await;
                    self.start(&[]).await;
                }
                Step::Cut { store, ms } => {
                    let h = self.cut_in_background(*store, *ms);
                    h.await.expect("cut");
                    self.alive_after_cut(*store, *ms).await;
                }
                Step::Replay { by_class, max_rows } => self.replay(*by_class, *max_rows).await,
                Step::Skip { followers, before } => self.skip(*followers, *before).await,
                Step::RecoverBackfill => self.recover().await,
                Step::Purge => self.purge().await,
                Step::Rotate => self.rotate().await,
                Step::Requeue => self.requeue().await,
                Step::Takeover => self.takeover().await,
                Step::CutoverPlan => self.cutover_plan_live().await,
                Step::SlowCommit { ms } => self.slow_commit(*ms).await,
                Step::SharedTopic { msgs } => self.shared_topic(*msgs).await,
                Step::Pause { ms } => tokio::time::sleep(Duration::from_millis(*ms)).await,
            }
            if stalls {
                self.fault_end();
            }
        }
        .boxed_local()
    }

    /// `fault` starts (writers and held commits run in the background anyway; a cut is
    /// restored by its own task), `after_ms` later `action` runs while it lasts. The fault must
    /// still be live when the action starts (timestamps from the fault's start): a step whose
    /// overlap did not happen is a harness failure, not a pass. A purge under a held commit
    /// races it (the commit is not awaited first): the boundary must stay below it.
    async fn overlap(&mut self, _kind: &str, fault: &Step, after_ms: u64, action: &Step) {
        let f0 = Instant::now();
        let cut = match fault {
            Step::Cut { store, ms } => {
                self.model.acted(fault.kind());
                self.fault_start();
                Some((self.cut_in_background(*store, *ms), *store, *ms))
            }
            other => {
                self.step(other).await;
                None
            }
        };
        // The action starts inside the fault's span whatever the plan drew (older plans drew
        // `after_ms` past a short cut or burst): at most half of a cut or of the burst's
        // writing time.
        let after_ms = match fault {
            Step::Cut { ms, .. } => after_ms.min(ms / 2),
            Step::Upstream { msgs, gap_ms } => after_ms.min(msgs.len() as u64 * gap_ms / 2),
            _ => after_ms,
        };
        tokio::time::sleep(Duration::from_millis(after_ms)).await;
        let a0 = f0.elapsed();
        let live = match fault {
            Step::Cut { ms, .. } => a0 < Duration::from_millis(*ms),
            Step::Hold { .. } => self.holds.last().is_some_and(|h| !h.is_finished()),
            Step::Upstream { .. } => self.tasks.last().is_some_and(|t| !t.is_finished()),
            _ => true,
        };
        let what = format!(
            "{} starts {} ms after {} started",
            action.kind(),
            a0.as_millis(),
            fault.kind()
        );
        if live {
            eprintln!("ops: overlap: {what}, while it is live");
        } else {
            self.model.violation(format!(
                "harness: overlap did not happen: {what}, after it ended"
            ));
        }
        self.purge_races_holds = matches!(fault, Step::Hold { .. });
        self.step(action).await;
        self.purge_races_holds = false;
        eprintln!(
            "ops: overlap: {} ended {} ms after the fault started",
            action.kind(),
            f0.elapsed().as_millis()
        );
        if let Some((h, store, ms)) = cut {
            h.await.expect("cut");
            self.fault_end();
            self.alive_after_cut(store, ms).await;
        }
    }

    /// SIGTERM of the active instance: exit 0 within the shutdown grace.
    async fn stop_active(&mut self) {
        self.harvest_metrics().await;
        let mut a = self.active.take().expect("an active instance");
        a.signal("-TERM");
        let st = a.exited_within(Duration::from_secs(15)).await;
        self.model.exited(&a.name, Exit::Term, st);
    }

    /// Adds the active instance's `msgx_inbox_id_regressions_total` to the sequence's sum; a
    /// /metrics without it is a violation (the counter is registered at 0 on start).
    async fn harvest_metrics(&mut self) {
        let Some(a) = &self.active else { return };
        let (name, text) = (a.name.clone(), a.metrics().await);
        self.add_metrics(&name, &text);
    }

    /// Adds one read of an instance's /metrics to the sum.
    fn add_metrics(&mut self, name: &str, text: &str) {
        let name = name.to_string();
        let since = self.harvested.get(&name).copied().unwrap_or(0.0);
        match metric(text, "msgx_inbox_id_regressions_total") {
            Some(v) => {
                self.id_regressions += v - since;
                self.harvested.insert(name, v);
            }
            None => self.model.violation(format!(
                "{name}: msgx_inbox_id_regressions_total absent from /metrics ({} bytes)",
                text.len()
            )),
        }
    }

    /// Cuts a store's connections now and restores them `ms` later, from a task of its own.
    fn cut_in_background(&self, store: StoreKind, ms: u64) -> tokio::task::JoinHandle<()> {
        let proxy = match store {
            StoreKind::Pg => self.pg_proxy.clone(),
            StoreKind::My => self.my_proxy.clone(),
        };
        proxy.cut();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            proxy.restore();
            tokio::time::sleep(Duration::from_millis(300)).await;
        })
    }

    /// The service lived through a cut shorter than its lease.
    async fn alive_after_cut(&mut self, store: StoreKind, ms: u64) {
        let mut a = self.active.take().expect("an active instance");
        if !a.running() {
            let st = a.child.try_wait().ok().flatten();
            self.model.violation(format!(
                "{} exited ({st:?}) on a {store:?} cut of {ms} ms (lease.ttl 5s)",
                a.name
            ));
            self.start(&[]).await;
        } else {
            self.active = Some(a);
        }
    }

    /// Waits until `f` holds (polling every 50 ms); false after `limit`.
    async fn wait_until<F, Fut>(&self, limit: Duration, mut f: F) -> bool
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let start = Instant::now();
        while !f().await {
            if start.elapsed() > limit {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        true
    }
    /// Every row the test committed (not skipped stock) has a terminal record with its mark
    /// confirmed or abandoned: late arrivals found, nothing left to sweep.
    async fn all_recorded(&self) -> bool {
        let ids: Vec<i64> = self
            .written()
            .iter()
            .filter(|w| w.committed && !self.model.skipped_stock.contains(&w.id))
            .map(|w| w.id)
            .collect();
        let done: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM proc_state_all WHERE msg_id = ANY($1) \
               AND state IN ('SUCCEEDED','SKIPPED','DEAD') \
               AND (backfill_at IS NOT NULL OR backfill_abandon_reason IS NOT NULL)",
        )
        .bind(&ids)
        .fetch_one(self.env.store.pool())
        .await
        .expect("recorded");
        done as usize == ids.len()
    }

    /// The SPEC §11 sampler ([`ops_sampler`]) starts, once the cutover (if any) is done.
    fn start_sampler(&mut self) {
        let stock = self
            .model
            .skipped_stock
            .union(&self.model.premarked)
            .copied()
            .collect();
        self.sampler = Some(ops_sampler::Sampler::start(ops_sampler::Inputs {
            my_url: self.env.my_url.clone(),
            pg_url: self.env.pg_url.clone(),
            ledger: self.ledger.clone(),
            holes: self.holes.clone(),
            shared: self.shared.clone(),
            stock,
            foreign_writers: self.model.foreign_writers,
            delay_ms: MAX_COMMIT_DELAY_MS,
            started: self.started,
            tag: self.tag.clone(),
        }));
    }

    /// The sampler stops; each invariant it saw broken is a violation (its first moment).
    async fn finish_sampler(&mut self) {
        if let Some(s) = self.sampler.take() {
            let out = s.finish().await;
            eprintln!(
                "ops: {} sampler: {} samples, W passed {} held insert(s) while open",
                self.tag,
                out.samples,
                out.passed_open.len()
            );
            for l in out.violations {
                self.model.violation(l);
            }
            self.model.passed_open = out.passed_open;
            self.model.first_done = out.first_done;
        }
    }

    /// Writers done, settle, `verify --kafka`, the reference model, a clean SIGTERM, the logs.
    async fn finish(&mut self) {
        self.writers_done().await;
        for v in std::mem::take(&mut *self.live.lock().expect("live")) {
            self.model.violation(v);
        }
        if !self.active.as_mut().is_some_and(Instance::running) {
            self.model
                .violation("no running instance at the end".to_string());
            self.start(&[]).await;
        }
        let start = Instant::now();
        while !(settled_above(&self.env, self.model.purged_to).await && self.all_recorded().await) {
            if start.elapsed() > Duration::from_secs(90) {
                let status = self.cli(&["status"]).await;
                self.model
                    .violation(format!("did not settle within 90s:\n{}", status.all()));
                break;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        self.finish_sampler().await;
        let out = self.cli(&["verify", "--kafka"]).await;
        if out.code != Some(0) {
            let fails: Vec<&str> = out
                .stdout
                .lines()
                .filter(|l| !l.starts_with("OK") && !l.starts_with("SKIP"))
                .collect();
            self.model.violation(format!(
                "verify --kafka exit {:?}: {}{}",
                out.code,
                fails.join(" | "),
                out.stderr
            ));
        }
        // Plan B with its seed never looks like an id regression to the service: summed over
        // every instance's life (each read just before it was killed, stopped or frozen).
        self.harvest_metrics().await;
        if self.id_regressions > 0.0 {
            self.model.violation(format!(
                "msgx_inbox_id_regressions_total {} summed over the instances after the DB \
                 owner's procedures",
                self.id_regressions
            ));
        }
        let records = self.consumed().await;
        self.model.stalls = self.faults.lock().expect("faults").clone();
        self.model.check_actions(&self.env).await;
        let written = self.written();
        super::ops_check::check(
            &mut self.model,
            &self.env,
            &written,
            MAX_COMMIT_DELAY_MS,
            &records,
        )
        .await;
        self.stop_active().await;
        for name in &self.instances {
            let log =
                std::fs::read_to_string(log_dir().join(format!("{name}.log"))).unwrap_or_default();
            if let Some(line) = log.lines().find(|l| l.contains("panicked")) {
                self.model.violation(format!("{name} panicked: {line}"));
            }
        }
    }

    /// Every record of ours a consumer reads back from the sequence's topic (duplicates
    /// included; another deployment's records left out).
    async fn consumed(&self) -> Vec<Received> {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM msg_event")
            .fetch_one(self.env.store.pool())
            .await
            .expect("events");
        if n == 0 {
            return Vec::new();
        }
        let (b, t) = (self.broker.bootstrap().to_string(), self.topic.clone());
        let mut all = off_runtime(move || consume(&b, &t, 3, n as usize)).await;
        let foreign = &self.model.foreign_sources;
        all.retain(|r| {
            r.headers
                .get("ce_source")
                .is_none_or(|s| !foreign.contains(s))
        });
        all
    }
}

/// The simulator as issue 19's plans ran it.
fn legacy_sim(total: u64, seed: u64) -> SimOpts {
    SimOpts {
        total,
        rate: 150,
        connections: 3,
        seed,
        hold: 0.05,
        rollback: 0.05,
        malformed: 0.05,
        unknown: 0.02,
    }
}

/// Found by the sequences above: after the DB owner purged up to the READY boundary, `verify`
/// reported every purged row as `inbox_row_present` violations. A record that is terminal with
/// its mark confirmed outlives its purged inbox row (a note); any other record without its row
/// is still a violation.
#[tokio::test]
async fn verify_notes_rows_the_owner_purged_after_the_mark() {
    let env = TestEnv::new("verify_purged").await;
    let ids = env.insert_rows(3).await;
    let now = chrono::Utc::now();
    let done = |id, seq| Proc::terminal(id, "SUCCEEDED", now).seq(seq).marked(now);
    seed::procs(
        &env,
        [done(ids[0], 1), Proc::pending(ids[1], now), done(ids[2], 2)],
    )
    .await;
    env.set_w(ids[2]).await;
    env.mark_as_owner(&[ids[0], ids[2]], "PROCESSED").await;
    // The owner purges ids[0] (finished) and, wrongly, ids[1] (pending).
    env.purge_as_owner(ids[1]).await;
    let (code, out) = crate::common::instance::verify(&env.binary_env(), &["--json"]);
    assert_eq!(code, Some(1), "{out}");
    let report: serde_json::Value = serde_json::from_str(&out).expect("json");
    let present = report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .find(|f| f["invariant"] == "inbox_row_present")
        .expect("inbox_row_present")
        .clone();
    assert_eq!(present["violations"], 1, "{present}");
    assert_eq!(present["examples"][0], ids[1], "{present}");
    assert!(
        present
            .to_string()
            .contains("purged after the mark was confirmed"),
        "{present}"
    );
    env.cleanup().await;
}
