//! The real `msgexchange` binary as the chaos and operator-action tests drive it: service
//! instances (spawn, `kill -9`, signals, readiness, their exits and logs), the upstream
//! simulator, the operator CLI, `verify`, and "everything settled".

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use msgx_core::settings::Delivery;

use super::kafka::Received;
use super::service::free_port;
use super::TestEnv;

/// `MSGX_TEST_DELIVERY` (`exactly-once`, else `at-least-once`): how the [`service_env`] tests
/// (chaos, operator actions) deliver, without editing them.
pub fn delivery_from_env() -> Delivery {
    match std::env::var("MSGX_TEST_DELIVERY").as_deref() {
        Ok("exactly-once") => Delivery::ExactlyOnce,
        _ => Delivery::AtLeastOnce,
    }
}

/// The service's environment for a chaos run: quick timers, short lease; the delivery mode
/// from `MSGX_TEST_DELIVERY` ([`delivery_from_env`]).
pub fn service_env(env: &TestEnv, pg: &str, my: &str, kafka: &str) -> Vec<(String, String)> {
    service_env_in(env, pg, my, kafka, delivery_from_env())
}

/// [`service_env`] in the given delivery mode.
pub fn service_env_in(
    env: &TestEnv,
    pg: &str,
    my: &str,
    kafka: &str,
    delivery: Delivery,
) -> Vec<(String, String)> {
    let mut v = env.binary_env();
    v.push(("MSGX_KAFKA__DELIVERY".into(), delivery.as_str().into()));
    v.retain(|(k, _)| k != "MSGX_STORE__URL" && k != "MSGX_INBOX__URL");
    for (k, val) in [
        ("MSGX_STORE__URL", pg),
        ("MSGX_INBOX__URL", my),
        ("MSGX_KAFKA__BROKERS", kafka),
        ("MSGX_KAFKA__DELIVERY_TIMEOUT", "5s"),
        ("MSGX_KAFKA__REQUEST_TIMEOUT", "2s"),
        ("MSGX_STORE__MAX_CONNECTIONS", "4"),
        ("MSGX_STORE__STATEMENT_TIMEOUT", "10s"),
        ("MSGX_STORE__LOCK_TIMEOUT", "2s"),
        ("MSGX_STORE__IDLE_IN_TRANSACTION_TIMEOUT", "6s"),
        // The sweep's inbox work stays 2 s below the idle timeout, and the default 1 s
        // backfill.lock_wait at most a quarter of it (both checked at start).
        ("MSGX_BACKFILL__MARK_BUDGET", "4s"),
        ("MSGX_LEASE__TTL", "8s"),
        ("MSGX_LEASE__RENEW_EVERY", "500ms"),
        ("MSGX_LEASE__CHECK_TIMEOUT", "1s"),
        ("MSGX_SUPERVISOR__SHUTDOWN_GRACE", "8s"),
        ("MSGX_PIPELINE__POLL_INTERVAL", "100ms"),
        ("MSGX_PIPELINE__MAX_COMMIT_DELAY", "2s"),
        ("MSGX_PROCESSING__IDLE_POLL", "200ms"),
        ("MSGX_PROCESSING__RETRY_INITIAL", "100ms"),
        ("MSGX_PROCESSING__RETRY_MAX", "500ms"),
        ("MSGX_PROCESSING__MAX_ATTEMPTS", "4"),
        ("MSGX_PROCESSING__HEAD_DEADLINE", "5s"),
        ("MSGX_BACKFILL__PERIOD", "500ms"),
        ("MSGX_BACKFILL__RETRY_INITIAL", "200ms"),
        ("MSGX_BACKFILL__RETRY_MAX", "1s"),
        ("MSGX_LATE__DETECT_PERIOD", "500ms"),
        ("MSGX_DISPATCH__IDLE_POLL", "200ms"),
        ("MSGX_DISPATCH__RETRY_INITIAL", "200ms"),
        ("MSGX_DISPATCH__RETRY_MAX", "1s"),
        ("MSGX_OUTBOUND__SCHEDULE_REQUEST_AT", ""),
        ("MSGX_LOG__LEVEL", "warn"),
    ] {
        v.push((k.into(), val.into()));
    }
    v
}

/// The harness's own knobs: `MSGX_*` like the service's settings, which the binary would
/// refuse as unknown keys, so no spawned process inherits them.
pub const HARNESS_VARS: &[&str] = &[
    "MSGX_TANSU",
    "MSGX_TEST_PG",
    "MSGX_TEST_MYSQL",
    "MSGX_TEST_DELIVERY",
];

/// The `msgexchange` binary cargo built for the running test. `CARGO_BIN_EXE_msgexchange` is set
/// only while compiling a test of the binary's own package, not this harness crate, so it is
/// found the way cargo lays it out: a test runs from `target/<profile>/deps/`, the binary sits
/// in `target/<profile>/`.
pub fn msgexchange_path() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("a test binary runs from target/<profile>/deps");
    let bin = profile_dir.join(format!("msgexchange{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "{} not found: run the tests through cargo test",
        bin.display()
    );
    bin
}

/// A command for the `msgexchange` binary without the harness's knobs (the one way tests start
/// the binary).
pub fn msgexchange() -> Command {
    let mut cmd = Command::new(msgexchange_path());
    for k in HARNESS_VARS {
        cmd.env_remove(k);
    }
    cmd
}

/// Sets (or replaces) one variable of an environment list.
pub fn set_var(vars: &mut Vec<(String, String)>, key: &str, value: &str) {
    vars.retain(|(k, _)| k != key);
    vars.push((key.into(), value.into()));
}

/// Where instance logs go (`/tmp/msgx-chaos/NAME.log`).
pub fn log_dir() -> PathBuf {
    let d = std::env::temp_dir().join("msgx-chaos");
    let _ = std::fs::create_dir_all(&d);
    d
}

/// One service process with its HTTP port and log file. Dropped while running: killed.
pub struct Instance {
    /// The process.
    pub child: Child,
    /// Its HTTP port (/metrics, /readyz, /admin).
    pub port: u16,
    /// Its name (the log file's stem).
    pub name: String,
}

impl Instance {
    /// Starts `msgexchange run` with these variables (plus `extra`), logging to its own file.
    pub fn spawn(vars: &[(String, String)], name: &str, extra: &[(&str, &str)]) -> Self {
        let port = free_port();
        let log = std::fs::File::create(log_dir().join(format!("{name}.log"))).expect("log");
        let mut cmd = msgexchange();
        cmd.arg("run")
            .envs(vars.iter().cloned())
            .env("MSGX_HTTP__LISTEN", format!("127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        for (k, v) in extra {
            cmd.env(k, v);
        }
        Self {
            child: cmd.spawn().expect("spawn msgexchange"),
            port,
            name: name.to_string(),
        }
    }

    /// Its log file.
    pub fn log_path(&self) -> PathBuf {
        log_dir().join(format!("{}.log", self.name))
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The last `n` lines of the log, for a failure's message (CI keeps no instance logs).
    pub fn log_tail(&self, n: usize) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Sends a signal (`-STOP`, `-CONT`, `-TERM`) with kill(1).
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(ok.success(), "kill {sig} {}", self.name);
    }

    /// SIGKILL and reap; the exit status (killed by signal 9 unless it had already exited).
    pub fn kill9(mut self) -> Option<ExitStatus> {
        let _ = self.child.kill();
        self.child.wait().ok()
    }

    /// True while the process runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits for the process to end; its exit status.
    pub async fn exited_within(&mut self, limit: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }

    /// `/readyz` answers 200.
    pub async fn ready(&self) -> bool {
        http_get(self.port, "/readyz")
            .await
            .is_ok_and(|r| r.starts_with("HTTP/1.1 200"))
    }

    /// `/metrics` (empty when unreachable).
    pub async fn metrics(&self) -> String {
        http_get(self.port, "/metrics").await.unwrap_or_default()
    }

    /// Waits for `/readyz`; panics (naming the log) after `limit`.
    pub async fn wait_ready(&self, limit: Duration) {
        assert!(
            self.try_wait_ready(limit).await,
            "{} not ready within {limit:?} (log: {})",
            self.name,
            self.log_path().display()
        );
    }

    /// Waits for `/readyz`; false after `limit`.
    pub async fn try_wait_ready(&self, limit: Duration) -> bool {
        let start = Instant::now();
        while !self.ready().await {
            if start.elapsed() >= limit {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        true
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // A failed test never leaves a service running (it would hold its port and lease).
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

// The one HTTP client (`common::http`), under the name the instance tests use.
pub use super::http::get as http_get;

/// Knobs of one `msgexchange dev simulate-upstream` run.
#[derive(Debug, Clone, Copy)]
pub struct SimOpts {
    /// Messages in all.
    pub total: u64,
    /// Messages per second.
    pub rate: u32,
    /// Concurrent writers.
    pub connections: u32,
    /// The simulator's seed (the same seed repeats the same message identities).
    pub seed: u64,
    /// Share of held (late) commits.
    pub hold: f64,
    /// Share of rollbacks.
    pub rollback: f64,
    /// Share of malformed messages.
    pub malformed: f64,
    /// Share of messages of an unknown type.
    pub unknown: f64,
}

impl SimOpts {
    /// The chaos run's mix.
    pub fn chaos(total: u64, seed: u64) -> Self {
        Self {
            total,
            rate: 120,
            connections: 4,
            seed,
            hold: 0.05,
            rollback: 0.03,
            malformed: 0.03,
            unknown: 0.005,
        }
    }
}

/// `msgexchange dev simulate-upstream` against the real inbox (upstream is not proxied).
pub fn simulator(env: &TestEnv, o: SimOpts) -> Child {
    let mut cmd = msgexchange();
    cmd.args(["dev", "simulate-upstream", "--hold-max", "1500ms"])
        .args(["--rate", &o.rate.to_string()])
        .args(["--connections", &o.connections.to_string()])
        .args(["--total", &o.total.to_string()])
        .args(["--hold-fraction", &o.hold.to_string()])
        .args(["--rollback-fraction", &o.rollback.to_string()])
        .args(["--malformed-fraction", &o.malformed.to_string()])
        .args(["--unknown-type-fraction", &o.unknown.to_string()])
        .args(["--seed", &o.seed.to_string()]);
    spawn_quiet(&mut cmd, env, "simulator")
}

/// Spawns `cmd` (`what`, in the panic) against `env`'s databases, logging warnings only,
/// its output discarded: a tool running beside the test.
pub fn spawn_quiet(cmd: &mut Command, env: &TestEnv, what: &str) -> Child {
    cmd.envs(env.binary_env())
        .env("MSGX_LOG__LEVEL", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// What a CLI run printed and how it ended.
#[derive(Debug, Clone)]
pub struct CliOut {
    /// Exit code (None: killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl CliOut {
    /// stdout and stderr together (for messages).
    pub fn all(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }

    /// stdout as JSON; panics with both streams when it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}), exit {:?}:\n{}", self.code, self.all()))
    }
}

/// `msgexchange ARGS` with these variables, blocking. Logs at error level only.
pub fn cli_blocking(vars: &[(String, String)], args: &[String]) -> CliOut {
    let out = msgexchange()
        .args(args)
        .envs(vars.iter().cloned())
        .env("MSGX_LOG__LEVEL", "error")
        .stdin(Stdio::null())
        .output()
        .expect("run msgexchange");
    CliOut {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `msgexchange ARGS` on a thread of its own: the runtime (and the proxies on it) keeps
/// running while the command does.
pub async fn cli(vars: &[(String, String)], args: &[&str]) -> CliOut {
    let vars = vars.to_vec();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    off_runtime(move || cli_blocking(&vars, &args)).await
}

/// Runs a blocking closure on its own thread and awaits its result.
pub async fn off_runtime<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.await.expect("the blocking task ended")
}

/// `msgexchange verify` with these args; (exit code, stdout + stderr).
pub fn verify(vars: &[(String, String)], args: &[&str]) -> (Option<i32>, String) {
    let mut all = vec!["verify".to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    let out = cli_blocking(vars, &all);
    (out.code, out.all())
}

/// Everything visible is enqueued, finished, marked (or abandoned) and delivered.
pub async fn settled(env: &TestEnv) -> bool {
    settled_above(env, 0).await
}

/// [`settled`] where the DB owner purged every row up to `purged_to` (the table's highest id
/// may be gone).
pub async fn settled_above(env: &TestEnv, purged_to: i64) -> bool {
    let max_id: Option<i64> = sqlx::query_scalar("SELECT MAX(CMINMSGS_ID) FROM CMINMSGS")
        .fetch_one(&env.owner)
        .await
        .expect("max id");
    let (w, _) = env.cursor().await;
    let open: i64 = env
        .scalar(
            "SELECT (SELECT count(*) FROM proc_state WHERE state IN ('PENDING','FAILED')) \
              + (SELECT count(*) FROM proc_state WHERE state IN ('SUCCEEDED','SKIPPED','DEAD') \
                   AND backfill_at IS NULL AND backfill_abandon_reason IS NULL) \
              + (SELECT count(*) FROM msg_event WHERE state = 'PENDING')",
        )
        .await;
    max_id.unwrap_or(0).max(purged_to) <= w && open == 0
}

/// Per key, the first sighting of each event id ascends (duplicates allowed after).
pub fn assert_per_key_order(records: &[Received]) {
    let mut by_part: BTreeMap<i32, Vec<&Received>> = BTreeMap::new();
    for r in records {
        by_part.entry(r.partition).or_default().push(r);
    }
    let mut seen: HashSet<i64> = HashSet::new();
    let mut last: HashMap<&str, i64> = HashMap::new();
    for r in by_part.into_values().flatten() {
        let id = r.event_id();
        if !seen.insert(id) {
            continue;
        }
        if let Some(prev) = last.insert(&r.key, id) {
            assert!(prev < id, "key {} went {prev} then {id}", r.key);
        }
    }
}

/// Waits for a child without blocking the runtime (the proxies run on it).
pub async fn wait_child(c: &mut Child) {
    while c.try_wait().expect("child").is_none() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `url` with its `from` host:port replaced by the local proxy port.
pub fn proxied(url: &str, from: &str, port: u16) -> String {
    url.replacen(from, &format!("127.0.0.1:{port}"), 1)
}
