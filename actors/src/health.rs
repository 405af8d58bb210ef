//! Liveness/readiness facts shared with the HTTP surface.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

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
    /// Why the last round failed.
    last_error: Mutex<Option<String>>,
}

impl Health {
    /// A round succeeded.
    pub fn poll_ok(&self) {
        self.inner.poll_ok.store(true, Ordering::Relaxed);
        self.inner
            .last_ok_unix
            .store(chrono::Utc::now().timestamp(), Ordering::Relaxed);
        *self
            .inner
            .last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// A round failed.
    pub fn poll_failed(&self, why: String) {
        self.inner.poll_ok.store(false, Ordering::Relaxed);
        *self
            .inner
            .last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(why);
    }

    /// `(ready, last success unix seconds, last error)`.
    pub fn snapshot(&self) -> (bool, i64, Option<String>) {
        (
            self.inner.poll_ok.load(Ordering::Relaxed),
            self.inner.last_ok_unix.load(Ordering::Relaxed),
            self.inner
                .last_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }
}
