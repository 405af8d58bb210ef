//! Liveness/readiness facts shared with the HTTP surface.
//!
//! `/readyz` needs no token, so what it says is public: fixed reasons (the poll stage that
//! failed, "store unreachable", "standing by"), never a driver's error text (host names,
//! table names, SQL). The error itself is in the log line written where it happened.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// What `/readyz` reports.
#[derive(Clone, Default)]
pub struct Health {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    /// The last poll round succeeded.
    poll_ok: AtomicBool,
    /// Unix seconds of the last successful round.
    last_ok_unix: AtomicI64,
    /// The stage of the last failed round (a fixed label, never the error's text).
    last_error: Mutex<Option<&'static str>>,
    /// Each supervised child: is its mailbox open (the supervisor writes this).
    children: Mutex<BTreeMap<&'static str, bool>>,
    /// The lease: 0 = not used (tests), 1 = held, 2 = not held (standby, lost, starting).
    lease: AtomicU8,
    /// Why the service is not running its pipeline yet (store unreachable, standing by).
    waiting: Mutex<Option<String>>,
}

/// What `m` holds. Each write is one assignment or insert, so a writer that panicked left it
/// whole: a poisoned lock is used as is.
fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

const LEASE_UNUSED: u8 = 0;
const LEASE_HELD: u8 = 1;
const LEASE_NOT_HELD: u8 = 2;

/// What `/readyz` says, with every reason it is not ready.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Readiness {
    /// All of the below hold.
    pub ready: bool,
    /// The last poll round succeeded.
    pub poll_ok: bool,
    /// Unix seconds of the last successful poll round.
    pub last_poll_ok_unix: i64,
    /// Which stage the last round failed at (`inbox`, `store`, `holes`): the cause is in the
    /// log, never on this unauthenticated answer.
    pub error: Option<String>,
    /// Children whose mailbox is closed (being restarted).
    pub children_down: Vec<&'static str>,
    /// Every supervised child with its state.
    pub children: BTreeMap<&'static str, bool>,
    /// `Some(false)` while this instance does not hold the lease (standby).
    pub lease_held: Option<bool>,
    /// Why the pipeline is not running yet, if it is not.
    pub waiting: Option<String>,
}

impl Health {
    /// A round succeeded.
    pub fn poll_ok(&self) {
        self.inner.poll_ok.store(true, Ordering::Relaxed);
        self.inner
            .last_ok_unix
            .store(chrono::Utc::now().timestamp(), Ordering::Relaxed);
        *locked(&self.inner.last_error) = None;
    }

    /// A round failed at `stage` (its error is logged by the poller, not kept here).
    pub fn poll_failed(&self, stage: &'static str) {
        self.inner.poll_ok.store(false, Ordering::Relaxed);
        *locked(&self.inner.last_error) = Some(stage);
    }

    /// `(ready, last success unix seconds, the public reason of the last failure)`.
    pub fn snapshot(&self) -> (bool, i64, Option<String>) {
        let stage = *locked(&self.inner.last_error);
        (
            self.inner.poll_ok.load(Ordering::Relaxed),
            self.inner.last_ok_unix.load(Ordering::Relaxed),
            stage.map(|s| {
                format!("the last poll round failed at stage `{s}` (the service log has the cause)")
            }),
        )
    }
}

impl Health {
    /// The supervisor's view of one child.
    pub fn child(&self, name: &'static str, alive: bool) {
        locked(&self.inner.children).insert(name, alive);
    }

    /// This instance holds (or does not hold) the lease; readiness requires it from now on.
    pub fn lease(&self, held: bool) {
        let v = if held { LEASE_HELD } else { LEASE_NOT_HELD };
        self.inner.lease.store(v, Ordering::Relaxed);
    }

    /// The pipeline is not running yet, and why (`None` once it runs). `why` is answered
    /// without a token: a fixed reason, never an error's text (log that where it happens).
    pub fn waiting(&self, why: Option<String>) {
        *locked(&self.inner.waiting) = why;
    }

    /// Everything `/readyz` reports.
    pub fn readiness(&self) -> Readiness {
        let (poll_ok, last_poll_ok_unix, error) = self.snapshot();
        let children = locked(&self.inner.children).clone();
        let children_down: Vec<&'static str> = children
            .iter()
            .filter(|(_, alive)| !**alive)
            .map(|(n, _)| *n)
            .collect();
        let lease_held = match self.inner.lease.load(Ordering::Relaxed) {
            LEASE_UNUSED => None,
            v => Some(v == LEASE_HELD),
        };
        let waiting = locked(&self.inner.waiting).clone();
        Readiness {
            ready: poll_ok
                && children_down.is_empty()
                && lease_held != Some(false)
                && waiting.is_none(),
            poll_ok,
            last_poll_ok_unix,
            error,
            children_down,
            children,
            lease_held,
            waiting,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_needs_the_poll_every_child_and_the_lease() {
        let h = Health::default();
        assert!(!h.readiness().ready, "no round yet");
        h.poll_ok();
        h.child("pump", true);
        assert!(h.readiness().ready);
        h.child("dispatcher", false);
        assert_eq!(h.readiness().children_down, vec!["dispatcher"]);
        assert!(!h.readiness().ready);
        h.child("dispatcher", true);
        h.lease(false);
        assert!(!h.readiness().ready, "standby");
        h.lease(true);
        assert!(h.readiness().ready);
        h.waiting(Some("store unreachable".into()));
        assert!(!h.readiness().ready);
    }
}
