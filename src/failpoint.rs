//! Crash points for crash-safety tests: `MSGEXCHANGE_FAILPOINT=<name>` makes the process abort
//! (like `kill -9`: no destructors, no flush) the moment it reaches the named point ([`hit`]),
//! or stall the thread that reaches it ([`stall`]: a long request, for liveness tests).
//!
//! Only tests set the variable; unset, [`hit`] is one cached lookup and a compare. The names are
//! the dangerous points of seed §4 and the delivery/outbound windows (docs/operations.md).

use std::sync::OnceLock;

/// The failpoint named in `MSGEXCHANGE_FAILPOINT`, read once.
fn armed() -> Option<&'static str> {
    static ARMED: OnceLock<Option<String>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            std::env::var("MSGEXCHANGE_FAILPOINT")
                .ok()
                .filter(|s| !s.is_empty())
        })
        .as_deref()
}

/// Aborts the process if `name` is the armed failpoint.
pub fn hit(name: &str) {
    if armed() == Some(name) {
        // stderr is unbuffered: the test sees which point fired before the abort.
        eprintln!("MSGEXCHANGE_FAILPOINT {name}: aborting");
        std::process::abort();
    }
}

/// Default of `MSGEXCHANGE_FAILPOINT_STALL`.
const DEFAULT_STALL: std::time::Duration = std::time::Duration::from_secs(3);

/// Blocks the calling thread if `name` is the armed failpoint, for `MSGEXCHANGE_FAILPOINT_STALL`
/// (humantime, default 3 s): a stand-in for a long stretch of work that holds its thread (a
/// `verify` over a large store), so a test can check what still answers meanwhile.
pub fn stall(name: &str) {
    if armed() == Some(name) {
        let pause = std::env::var("MSGEXCHANGE_FAILPOINT_STALL")
            .ok()
            .and_then(|v| humantime::parse_duration(&v).ok())
            .unwrap_or(DEFAULT_STALL);
        eprintln!("MSGEXCHANGE_FAILPOINT {name}: stalling this thread for {pause:?}");
        std::thread::sleep(pause);
    }
}
