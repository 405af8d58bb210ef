//! Where the pump's time goes, recorded by the real step itself (no hand-made copy of it in
//! the benches): wall time per stage summed over the run, and how many groups and messages.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::telemetry;

/// The stages of a group, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The head and the candidates behind it (one index-backed read).
    Head,
    /// The attempt stamp of the whole group (one relaxed autocommit statement) and, at the
    /// same time, the inbox read of the texts not buffered (one round trip per `read_ahead`):
    /// the wall time of the two together.
    Stamp,
    /// The texts read taken into the buffer; for rows the DB owner purged, their copies read
    /// from our store (a round trip only then).
    RawRead,
    /// Decoding the text (CPU only).
    Decode,
    /// The group's one load: members' rows locked, identity holders, flights (3 statements).
    Load,
    /// The pure rules on the loaded state (CPU only).
    Plan,
    /// A savepoint of a message written on its own (a batch's savepoint counts as business).
    Savepoint,
    /// The columns of a batch's outcome statement built in Rust (flights as JSON text, events,
    /// terminal rows; CPU only, before the statement).
    Rows,
    /// The business writes: one outcome statement per batch of planned members (its round trip
    /// and server work spread over them), or one message's own write (with the identity binding; for a
    /// message without the group's load also its own lock-and-load and plan).
    Business,
    /// Our raw-text copy (`retention.raw_copy`): compressing the members' texts before the
    /// transaction and their one `INSERT` in it (0 calls when off).
    RawCopy,
    /// Taking back unused stamps and the one commit (the WAL flush).
    Commit,
}

impl Stage {
    /// Every stage, in order.
    pub const ALL: [Stage; 11] = [
        Stage::Head,
        Stage::Stamp,
        Stage::RawRead,
        Stage::Decode,
        Stage::Load,
        Stage::Plan,
        Stage::Savepoint,
        Stage::Rows,
        Stage::Business,
        Stage::RawCopy,
        Stage::Commit,
    ];

    // One label per stage: `as_str` indexes the label list.
    const _LABELED: () = assert!(telemetry::PUMP_STAGES.len() == Stage::ALL.len());

    /// Its name in reports and in the `stage` label of `msgx_pump_stage_seconds`
    /// ([`telemetry::PUMP_STAGES`], listed in this enum's order).
    pub fn as_str(self) -> &'static str {
        telemetry::PUMP_STAGES[self as usize]
    }
}

/// Summed wall time and call count per stage.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StageTimes {
    /// `(total, calls)` per stage, indexed like [`Stage::ALL`].
    totals: [(Duration, u64); 11],
    /// Groups committed.
    pub groups: u64,
    /// Messages run in them.
    pub messages: u64,
    /// Batch outcome statements run (a member that writes on its own splits its group's
    /// batch in two: these per group show how often).
    pub batches: u64,
}

impl StageTimes {
    /// Adds `calls` calls taking `took` in total to `stage`.
    pub fn add(&mut self, stage: Stage, took: Duration, calls: u64) {
        let slot = &mut self.totals[stage as usize];
        slot.0 += took;
        slot.1 += calls;
    }

    /// `(total, calls)` of a stage.
    pub fn get(&self, stage: Stage) -> (Duration, u64) {
        self.totals[stage as usize]
    }

    /// The sum over every stage.
    pub fn total(&self) -> Duration {
        self.totals.iter().map(|(d, _)| *d).sum()
    }
}

/// The pump's running [`StageTimes`], shared with the timers that add to them, so a stage is
/// timed by a scope ([`StageLog::time`]) while the step goes on borrowing the pump.
#[derive(Debug, Clone, Default)]
pub struct StageLog(Arc<Mutex<StageTimes>>);

impl StageLog {
    /// Starts timing one call of `stage`; the time is added when the timer is dropped.
    pub fn time(&self, stage: Stage) -> StageTimer {
        StageTimer {
            log: self.clone(),
            stage,
            calls: 1,
            started: Instant::now(),
        }
    }

    /// Counts a committed group of `messages`.
    pub fn group(&self, messages: u64) {
        let mut t = self.lock();
        t.groups += 1;
        t.messages += messages;
    }

    /// Counts one batch outcome statement.
    pub fn batch(&self) {
        self.lock().batches += 1;
    }

    /// The totals so far.
    pub fn snapshot(&self) -> StageTimes {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StageTimes> {
        // Counters only: a panic mid-add leaves them usable.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A stage being timed: adds its wall time (and calls) to the log when dropped — at the end of
/// its scope, or on an early return.
#[derive(Debug)]
pub struct StageTimer {
    log: StageLog,
    stage: Stage,
    calls: u64,
    started: Instant,
}

impl StageTimer {
    /// Counts the scope as `calls` calls (e.g. the members decoded), not one.
    pub fn calls(&mut self, calls: u64) {
        self.calls = calls;
    }
}

impl Drop for StageTimer {
    fn drop(&mut self) {
        let took = self.started.elapsed();
        self.log.lock().add(self.stage, took, self.calls);
        telemetry::pump_stage(self.stage.as_str(), took);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stage_has_its_label_in_order() {
        for (i, stage) in Stage::ALL.iter().enumerate() {
            assert_eq!(*stage as usize, i, "{stage:?} out of order");
        }
        assert_eq!(Stage::Stamp.as_str(), "stamp_and_raw_read");
        assert_eq!(Stage::Commit.as_str(), "commit");
    }

    #[test]
    fn sums_per_stage() {
        let mut t = StageTimes::default();
        t.add(Stage::Commit, Duration::from_millis(2), 1);
        t.add(Stage::Commit, Duration::from_millis(3), 1);
        t.add(Stage::Head, Duration::from_millis(1), 1);
        assert_eq!(t.get(Stage::Commit), (Duration::from_millis(5), 2));
        assert_eq!(t.total(), Duration::from_millis(6));
        assert_eq!(Stage::ALL[Stage::Business as usize], Stage::Business);
    }

    #[test]
    fn a_timer_adds_its_scope_when_dropped() {
        let log = StageLog::default();
        {
            let mut t = log.time(Stage::Decode);
            t.calls(3);
            assert_eq!(
                log.snapshot().get(Stage::Decode).1,
                0,
                "not before the scope ends"
            );
        }
        let _ = log.time(Stage::Load);
        log.group(3);
        log.batch();
        let s = log.snapshot();
        assert_eq!(s.get(Stage::Decode).1, 3);
        assert_eq!(s.get(Stage::Load).1, 1);
        assert_eq!((s.groups, s.messages, s.batches), (1, 3, 1));
    }
}
