//! Running the real `msgexchange` binary against a test env, and killing it like `kill -9`.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::TestEnv;

/// Starts `msgexchange run` on this env's databases, `/metrics` on `port`, quick polling.
pub fn spawn_service(env: &TestEnv, extra: &[(&str, &str)], port: u16) -> Child {
    spawn_service_logging(env, extra, port, Stdio::null())
}

/// [`spawn_service`], its log (stderr) going to `log`; `extra` overrides the quick polling too.
pub fn spawn_service_logging(
    env: &TestEnv,
    extra: &[(&str, &str)],
    port: u16,
    log: Stdio,
) -> Child {
    let mut cmd = Command::new(super::instance::msgexchange_path());
    cmd.arg("run")
        .envs(env.binary_env())
        .env("MSGX_HTTP__LISTEN", format!("127.0.0.1:{port}"))
        .env("MSGX_PIPELINE__POLL_INTERVAL", "50ms")
        .env("MSGX_LOG__LEVEL", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn msgexchange")
}

/// SIGKILL (Child::kill on Unix): no shutdown path runs.
pub fn kill9(child: &mut Child) {
    child.kill().expect("kill -9");
    child.wait().expect("reap");
}

/// Polls `f` every 50 ms until it holds; panics after `timeout`.
pub async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !f().await {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A TCP port nobody listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}
