//! What the broker said and the store does not know yet: acks to write as SENT, dead-letter
//! copies to write as DEAD, failed sends to write with their backoff.
//!
//! Rounds add to it; a write takes all of it at once and, until that write is done, its events
//! and held keys stay out of the next selections (an acked event is not sent again, no later
//! event of a failed key overtakes the failed one). The dispatcher actor runs the write beside
//! the next rounds, so a slow commit never holds the next sends.

use super::round::DispatchConfig;
use crate::store::events::{Acked, SendFailure};
use crate::store::{Store, StoreError};

/// Outcomes of sends not written yet.
#[derive(Debug, Default)]
pub struct Unrecorded {
    pub(super) acked: Vec<Acked>,
    pub(super) dead: Vec<Acked>,
    pub(super) failures: Vec<SendFailure>,
    /// Keys whose failure (and so whose backoff) is not in the store yet.
    pub(super) hold_keys: Vec<String>,
}

impl Unrecorded {
    fn is_empty(&self) -> bool {
        self.acked.is_empty() && self.dead.is_empty() && self.failures.is_empty()
    }

    /// Events covered (acked, dead or failed).
    fn len(&self) -> usize {
        self.acked.len() + self.dead.len() + self.failures.len()
    }

    fn add(&mut self, other: Unrecorded) {
        self.acked.extend(other.acked);
        self.dead.extend(other.dead);
        self.failures.extend(other.failures);
        self.hold_keys.extend(other.hold_keys);
    }

    fn add_skips(&self, skips: &mut Skips) {
        let failed = self.failures.iter().map(|f| f.event_id);
        let written = self.acked.iter().chain(&self.dead).map(|a| a.event_id);
        skips.ids.extend(written.chain(failed));
        skips.keys.extend(self.hold_keys.iter().cloned());
    }
}

/// What a selection must leave out: events whose outcome is not written, keys held back.
#[derive(Debug, Default, Clone)]
pub struct Skips {
    pub(super) ids: Vec<i64>,
    pub(super) keys: Vec<String>,
}

/// Carried from one round to the next by the caller (the dispatcher actor).
#[derive(Debug, Default)]
pub struct DispatchState {
    /// Learned from the broker, not handed to a write yet.
    unrecorded: Unrecorded,
    /// What the write in flight covers, skipped until it is done.
    in_write: Option<Skips>,
}

impl DispatchState {
    /// Events whose outcome is not written (waiting or being written): the caller stops
    /// sending above a bound, so a store that reads but cannot write does not grow this.
    pub fn unwritten(&self) -> usize {
        self.unrecorded.len() + self.in_write.as_ref().map_or(0, |s| s.ids.len())
    }

    /// What the next selection must leave out.
    pub fn skips(&self) -> Skips {
        let mut skips = self.in_write.clone().unwrap_or_default();
        self.unrecorded.add_skips(&mut skips);
        skips
    }

    /// Adds a round's outcome.
    pub fn add(&mut self, fresh: Unrecorded) {
        self.unrecorded.add(fresh);
    }

    /// Hands everything waiting to a write; `None` when nothing waits or a write is in flight.
    pub fn take_for_write(&mut self) -> Option<Unrecorded> {
        if self.in_write.is_some() || self.unrecorded.is_empty() {
            return None;
        }
        let u = std::mem::take(&mut self.unrecorded);
        let mut skips = Skips::default();
        u.add_skips(&mut skips);
        self.in_write = Some(skips);
        Some(u)
    }

    /// The write of `u` ended: written, or (`written == false`) back to wait for the next write.
    pub fn write_finished(&mut self, u: Unrecorded, written: bool) {
        self.in_write = None;
        if !written {
            self.unrecorded.add(u);
        }
    }

    /// The write in flight was lost with its outcome (its task died): its events are no
    /// longer skipped and go again (duplicates at worst, never a loss).
    pub fn write_lost(&mut self) {
        self.in_write = None;
    }
}

/// Writes what the broker said: SENT, DEAD (each stamped with its ack's time), failures with
/// their backoff. Returns (SENT, DEAD) rows written. Each statement changes PENDING rows only,
/// so writing the same outcome again after a partial failure changes nothing twice.
pub async fn write_outcome(
    store: &Store,
    u: &Unrecorded,
    cfg: &DispatchConfig,
) -> Result<(u64, u64), StoreError> {
    let sent = store.mark_events_sent(&u.acked, &cfg.topic).await?;
    let dead = store.mark_events_dead(&u.dead, &cfg.dlq_topic).await?;
    store.record_send_failures(&u.failures).await?;
    Ok((sent, dead))
}

/// Writes everything waiting now (tests, shutdown; a write in flight must have ended).
/// Returns (SENT, DEAD) rows written.
pub async fn flush(
    store: &Store,
    state: &mut DispatchState,
    cfg: &DispatchConfig,
) -> Result<(u64, u64), StoreError> {
    let Some(u) = state.take_for_write() else {
        return Ok((0, 0));
    };
    let written = write_outcome(store, &u, cfg).await;
    state.write_finished(u, written.is_ok());
    written
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;

    fn acked(id: i64) -> Acked {
        Acked {
            event_id: id,
            partition: 0,
            offset: id,
            at: Utc::now(),
        }
    }

    fn failed(id: i64, key: &str) -> Unrecorded {
        Unrecorded {
            failures: vec![SendFailure {
                event_id: id,
                next_attempt_at: Utc::now(),
                error: "x".into(),
            }],
            hold_keys: vec![key.into()],
            ..Unrecorded::default()
        }
    }

    #[test]
    fn a_write_in_flight_stays_skipped_and_a_failed_write_comes_back() {
        let mut s = DispatchState::default();
        s.add(Unrecorded {
            acked: vec![acked(1), acked(2)],
            ..Unrecorded::default()
        });
        let w = s.take_for_write().expect("something to write");
        assert!(s.take_for_write().is_none(), "one write at a time");
        s.add(failed(3, "K"));
        let skips = s.skips();
        assert_eq!(skips.ids, vec![1, 2, 3]);
        assert_eq!(skips.keys, vec!["K".to_string()]);
        assert_eq!(s.unwritten(), 3);
        s.write_finished(w, false);
        assert_eq!(s.skips().ids.len(), 3, "the failed write's acks wait again");
        let w = s.take_for_write().expect("all of it");
        assert_eq!(w.len(), 3);
        s.write_finished(w, true);
        assert_eq!(s.unwritten(), 0);
        assert!(s.skips().ids.is_empty());
    }

    #[test]
    fn a_lost_write_releases_its_events_to_be_sent_again() {
        let mut s = DispatchState::default();
        s.add(failed(7, "K"));
        let _lost = s.take_for_write().expect("write");
        s.write_lost();
        assert!(s.skips().ids.is_empty());
        assert_eq!(s.unwritten(), 0);
    }
}
