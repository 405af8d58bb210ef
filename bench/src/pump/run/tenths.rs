//! The time-matched tenths of phase 3 of `msgx-bench pump`: the short bare probes run before
//! the first step and after every tenth (pump paused), and the tally of each tenth beside the
//! bare rates measured right around it. Apart from the pump loop (`pump/run.rs`) because this
//! is the yardstick, not the thing measured.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use msgx_core::retention::vacuum::{vacuum_step, VacuumPolicy};
use msgx_core::store::Store;

use super::wal_lsn;
use crate::pump::bare::{bare_shape, BareRun, BareShape, BareTables};
use crate::rss_mib;

/// What runs in the pauses between the tenths: the bare probes and the vacuum rule.
#[derive(Clone, Copy)]
pub(in crate::pump) struct Probe<'a> {
    /// The scratch tables.
    pub(in crate::pump) tables: &'a BareTables,
    /// Longest probe.
    pub(in crate::pump) time: Duration,
    /// Most transactions per probe.
    pub(in crate::pump) units: u64,
    /// The housekeeper's vacuum rule (`retention.vacuum*`), applied between the tenths with
    /// the pump paused: the service keeps the pump's tables vacuumed while it runs (the
    /// e2e bench's pump has that), so the pump alone gets it too, without its cost.
    pub(in crate::pump) vacuum: VacuumPolicy,
}

/// The shapes every probe runs.
pub(in crate::pump) const PROBE_SHAPES: [BareShape; 3] =
    [BareShape::Tx, BareShape::PumpTx, BareShape::PumpMessage];

impl Probe<'_> {
    /// One probe: each of `shapes` for `time` (or `units`).
    pub(in crate::pump) async fn run(&self, shapes: &[BareShape]) -> anyhow::Result<Vec<BareRun>> {
        let mut out = Vec::with_capacity(shapes.len());
        for &shape in shapes {
            out.push(
                bare_shape(self.tables, shape, self.units, self.time)
                    .await
                    .with_context(|| format!("bare probe {}", shape.label()))?,
            );
        }
        Ok(out)
    }
}

/// One tenth of the run.
#[derive(Debug)]
pub(in crate::pump) struct Tenth {
    /// Messages in it.
    pub(in crate::pump) messages: u64,
    /// Its wall time.
    pub(in crate::pump) elapsed: Duration,
    /// Sum of `step_group()` wall time minus `took` (the whole group's wall time counts on its
    /// first message): the head query (and the head decision).
    pub(in crate::pump) head: Duration,
    /// Sum of `took` (stamp to terminal state).
    pub(in crate::pump) took: Duration,
    /// RSS at its end.
    pub(in crate::pump) rss: Option<f64>,
    /// The bare probe right after it.
    pub(in crate::pump) probe_after: Vec<BareRun>,
}

impl Tenth {
    pub(in crate::pump) fn empty() -> Self {
        Self {
            messages: 0,
            elapsed: Duration::ZERO,
            head: Duration::ZERO,
            took: Duration::ZERO,
            rss: None,
            probe_after: Vec::new(),
        }
    }
}

/// The progress of the run between its tenths.
pub(in crate::pump) struct Tenths {
    pub(in crate::pump) done: Vec<Tenth>,
    pub(in crate::pump) current: Tenth,
    pub(in crate::pump) started: Instant,
    /// Time spent in the pauses between the tenths, probes and vacuum (not the pump's).
    pub(in crate::pump) paused: Duration,
    /// WAL written in the pauses between the tenths (probes and vacuum), taken out of the
    /// run's.
    pub(in crate::pump) probe_wal: u64,
}

impl Tenths {
    /// Counts one processed message in the current tenth.
    pub(in crate::pump) fn count(&mut self, took_one: Duration, wall: Duration) {
        let tenth = &mut self.current;
        tenth.messages += 1;
        tenth.head += wall.saturating_sub(took_one);
        tenth.took += took_one;
    }

    /// Closes the current tenth: RSS, the bare probe and the vacuum rule (pump paused, their
    /// time and WAL counted apart) and a progress line on stderr.
    pub(in crate::pump) async fn close(
        &mut self,
        probe: &Probe<'_>,
        store: &Store,
        msg_id: i64,
        run_started: Instant,
    ) -> anyhow::Result<()> {
        let tenth = &mut self.current;
        tenth.elapsed = self.started.elapsed();
        tenth.rss = rss_mib();
        let pause = Instant::now();
        let wal_before = wal_lsn(store).await;
        let bare = probe.run(&PROBE_SHAPES).await?;
        let vacuumed = vacuum_step(store, &probe.vacuum)
            .await
            .context("vacuum between the tenths")?;
        if let Some((a, b)) = wal_before.zip(wal_lsn(store).await) {
            self.probe_wal += b.saturating_sub(a);
        }
        self.paused += pause.elapsed();
        let rates: Vec<String> = bare
            .iter()
            .map(|r| format!("{} {:.0}/s", r.shape.label(), r.rate()))
            .collect();
        let vacuumed: Vec<String> = vacuumed
            .done
            .iter()
            .map(|(t, what, took)| format!("{} {t} {:.1}s", what.label(), took.as_secs_f64()))
            .collect();
        eprintln!(
            "bench pump: {:>3}% message {msg_id} after {:.1}s, this tenth {:.0} msg/s; \
             bare probe {}; paused for [{}]; RSS {}",
            (self.done.len() + 1) * 10,
            (run_started.elapsed() - self.paused).as_secs_f64(),
            tenth.messages as f64 / tenth.elapsed.as_secs_f64().max(1e-9),
            rates.join(", "),
            vacuumed.join(", "),
            tenth
                .rss
                .map_or_else(|| "n/a".to_string(), |v| format!("{v:.1} MiB"))
        );
        tenth.probe_after = bare;
        self.done
            .push(std::mem::replace(&mut self.current, Tenth::empty()));
        self.started = Instant::now();
        Ok(())
    }
}
