//! Operator action metrics (replays through the admin surface or the CLI) and the HTTP
//! surface's refusals.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use metrics::counter;

use super::Def;

/// Operator replays by result (`applied`, `refused`).
pub const REPLAY_TOTAL: &str = "msgx_admin_replay_total";

/// `result` of [`REPLAY_TOTAL`].
pub const REPLAY_RESULTS: &[&str] = &["applied", "refused"];

/// HTTP requests refused before any work by reason: no valid token, a token without the
/// route's scope, a request not sent within `http.read_timeout`.
pub const HTTP_REFUSED_TOTAL: &str = "msgx_http_refused_total";

/// `reason` of [`HTTP_REFUSED_TOTAL`].
pub const HTTP_REFUSED_REASONS: &[&str] = &["unauthenticated", "forbidden", "read_timeout"];

/// The series of this file.
pub(super) fn defs() -> Vec<Def> {
    vec![
        Def::counter(REPLAY_TOTAL, "replays", "Operator replays by result")
            .label("result", REPLAY_RESULTS),
        Def::counter(
            HTTP_REFUSED_TOTAL,
            "requests",
            "HTTP requests refused before any work, by reason (no valid token, a token without \
             the scope, a request body not sent within http.read_timeout)",
        )
        .label("reason", HTTP_REFUSED_REASONS),
    ]
}

/// Shortest gap between two WARN lines about refused requests.
pub const REFUSED_WARN_EVERY_S: i64 = 60;

/// Unix seconds of the last WARN line about refused requests (0: none yet).
static REFUSED_WARNED_AT: AtomicI64 = AtomicI64::new(0);
/// Refusals since that line.
static REFUSED_SINCE: AtomicU64 = AtomicU64::new(0);

/// A request was refused (`reason`, one of [`HTTP_REFUSED_REASONS`]): counted; logged at
/// DEBUG each, and at WARN at most once per [`REFUSED_WARN_EVERY_S`] with the count since
/// the last such line, so a scanner or a misconfigured client cannot flood the log.
pub fn http_refused(reason: &'static str, path: &str, peer: Option<std::net::SocketAddr>) {
    counter!(HTTP_REFUSED_TOTAL, "reason" => reason).increment(1);
    let since = REFUSED_SINCE.fetch_add(1, Ordering::Relaxed) + 1;
    tracing::debug!(reason, path, peer = ?peer, "HTTP request refused");
    let now = chrono::Utc::now().timestamp();
    let last = REFUSED_WARNED_AT.load(Ordering::Relaxed);
    if now - last >= REFUSED_WARN_EVERY_S
        && REFUSED_WARNED_AT
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        REFUSED_SINCE.fetch_sub(since, Ordering::Relaxed);
        tracing::warn!(
            reason,
            path,
            peer = ?peer,
            refused = since,
            "HTTP requests refused (this one and the count since the last such line; at most \
             one line per minute, every refusal counted in msgx_http_refused_total)"
        );
    }
}

/// An operator replay was applied or refused.
/// `source`: where an applied replay found the raw text (`inbox` or `raw_copy`).
pub fn replay(msg_id: i64, applied: bool, reason: &str, source: Option<&'static str>) {
    let result = if applied { "applied" } else { "refused" };
    counter!(REPLAY_TOTAL, "result" => result).increment(1);
    if let (true, Some(source)) = (applied, source) {
        super::raw_copy::replay_source(msg_id, source);
    }
    tracing::warn!(
        msg_id,
        result,
        reason,
        source = source.unwrap_or("-"),
        "operator replay"
    );
}
