//! The evidence rule of a round (`late.hole_evidence`, docs/hole-evidence.md; steps 1–3 of
//! the [poller](super) docs): holes decided on the inbox's transaction list, their sightings
//! on the server clock, and the once-per-hole "held" announcement. Separate from the round
//! (`poller.rs`) because it is the one part that reads the inbox's transaction state; with
//! evidence off none of it runs.

use std::sync::Mutex;

use chrono::{DateTime, Utc};

use super::{read_window, round, Decided, HoleEvidenceConfig, PollConfig, PollError};
use crate::inbox::evidence::EvidenceError;
use crate::inbox::{Inbox, InboxRow};
use crate::telemetry;
use crate::watermark::{advance, Advance, Evidence, EvidenceDecision, Hole, TrxEvidence};

/// The evidence rule (module docs). Every path that cannot get evidence is the timer rule.
pub(super) async fn decide_with_evidence(
    inbox: &Inbox,
    w: i64,
    stored: &[Hole],
    (rows, complete): (Vec<InboxRow>, bool),
    now: DateTime<Utc>,
    cfg: PollConfig,
    ev: HoleEvidenceConfig,
) -> Result<Decided, PollError> {
    let any_sighted = stored.iter().any(|h| h.seen_db_at.is_some());
    let trx = match any_sighted {
        true => inbox.trx_snapshot().await.ok().map(|snap| TrxEvidence {
            read_at: snap.read_at,
            oldest_started: snap.oldest_started,
            cap: ev.cap,
        }),
        false => None,
    };
    let releasable = trx.is_some_and(|t| {
        stored
            .iter()
            .any(|h| t.about(h.seen_db_at) == Some(Evidence::NoOlderTransaction))
    });
    // Read again after the list: a commit that landed meanwhile is visible now.
    let (rows, complete) = if releasable {
        read_window(inbox, w, cfg).await?
    } else {
        (rows, complete)
    };
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    let decision = advance(round(w, stored, &ids, complete, now, cfg, trx));
    let front = decision
        .open_hole
        .and_then(|o| decision.holes.iter().find(|h| h.first == o.first_missing));
    let evidence = match (trx, stored.first()) {
        (Some(t), Some(h)) if h.first == w + 1 => t.about(h.seen_db_at),
        _ => None,
    };
    Ok(Decided {
        rows,
        complete,
        sighted: front.is_some_and(|h| h.seen_db_at.is_none()),
        advance: decision,
        evidence,
    })
}

/// Gives every hole not yet sighted on the server clock the server's time now, read after
/// the rows (a sighting read before them could predate the transaction). On failure the holes
/// stay unsighted and are sighted again next round — later, which only ever counts more
/// transactions as older (safe).
pub(super) async fn stamp_sightings(inbox: &Inbox, holes: &mut [Hole]) {
    if holes.iter().all(|h| h.seen_db_at.is_some()) {
        return;
    }
    match inbox.server_now().await {
        Ok(at) => {
            for h in holes.iter_mut().filter(|h| h.seen_db_at.is_none()) {
                h.seen_db_at = Some(at);
            }
        }
        Err(EvidenceError::Unavailable(reason)) => {
            tracing::debug!(%reason, "no server time for the hole sighting");
        }
        Err(e) => {
            tracing::warn!(error = %e, "reading the server time failed; the holes are sighted again next round");
        }
    }
}

/// The holes last announced as held past `max_commit_delay` (first id and sighting), so the
/// "held" decision is counted and logged once per hole, not every round. Logging only: no
/// decision depends on it.
static HELD_ANNOUNCED: Mutex<Vec<(i64, DateTime<Utc>)>> = Mutex::new(Vec::new());

/// Counts and logs the round's evidence decisions (a "held" one once per hole).
pub(super) fn report_evidence(decision: &Advance) {
    let mut held = HELD_ANNOUNCED.lock().unwrap_or_else(|p| p.into_inner());
    for &(first, d) in &decision.evidence {
        if d == EvidenceDecision::Held {
            let since = decision
                .holes
                .iter()
                .find(|h| h.first == first)
                .map_or(DateTime::<Utc>::MIN_UTC, |h| h.first_seen);
            if held.contains(&(first, since)) {
                continue;
            }
            held.push((first, since));
            if held.len() > 64 {
                held.remove(0);
            }
        }
        telemetry::hole_evidence(d.as_str(), first);
    }
}
