//! Child processes the tests run: the real binary until it exits by itself, and tools whose
//! success is a precondition.

use std::process::{Child, Command, ExitStatus, Output};
use std::time::{Duration, Instant};

/// Waits (without blocking the runtime) for a child to exit by itself; panics with `late`
/// after `limit`.
pub async fn exit_status(child: &mut Child, limit: Duration, late: &str) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().expect("wait") {
            return s;
        }
        assert!(start.elapsed() < limit, "{late}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `cmd` to completion and asserts it succeeded (its stderr in the panic, after `what`);
/// its output.
pub fn succeed(cmd: &mut Command, what: &str) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(out.status.success(), "{what}: {}", stderr(&out));
    out
}

/// Asserts a finished command succeeded, its stderr in the panic.
pub fn assert_ok(out: &Output) {
    assert!(out.status.success(), "{}", stderr(out));
}

/// A finished command's stderr, as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}
