//! Crash points for crash-safety tests: `MSGEXCHANGE_FAILPOINT=<name>` makes the process abort
//! (like `kill -9`: no destructors, no flush) the moment it reaches the named point.
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
