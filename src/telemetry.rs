//! Every metric of the service, each next to the log line that goes with it (Vector's
//! `internal_events` style), one file per component. Every series is declared in a [`Def`]
//! (name, type, unit, HELP, every label combination that can occur) and registered at start-up
//! by [`register`]: counters at 0, gauges at their start value (NaN where unknown until the
//! first refresh), histograms empty. So `increase()` sees the first event, and no panel says
//! "No data". `docs/metrics.md` is checked against [`defs`].

use metrics::{Key, KeyName, Label, Metadata, SharedString};

mod admin;
mod backfill;
mod backlog;

mod dispatch;
mod housekeeping;
pub mod ids;
mod inbox;
mod late;
mod lease;
mod outbound;
mod procedures;
mod pump;
mod raw_copy;
mod supervisor;
mod traces;
mod verify;
mod whole;

pub use admin::*;
pub use backfill::*;
pub use backlog::*;

pub use dispatch::*;
pub use housekeeping::*;
pub use inbox::*;
pub use late::*;
pub use lease::*;
pub use outbound::*;
pub use procedures::*;
pub use pump::*;
pub use raw_copy::*;
pub use supervisor::*;
pub use traces::*;
pub use verify::*;
pub use whole::between_events;

/// The Prometheus type of a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Monotonic; registered at 0 for every label combination.
    Counter,
    /// Registered at [`Def::start`].
    Gauge,
    /// Registered empty (buckets from [`histogram_buckets`]).
    Histogram,
}

impl Kind {
    /// As in the `# TYPE` line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram => "histogram",
        }
    }
}

/// One metric: what it is, and every series of it that can occur.
#[derive(Debug, Clone)]
pub struct Def {
    /// Metric name (`msgx_…`).
    pub name: &'static str,
    /// Prometheus type.
    pub kind: Kind,
    /// Unit, shown in the HELP line (`seconds`, `ids`, `rows`, `1 = yes`…).
    pub unit: &'static str,
    /// What it means (HELP, and `docs/metrics.md`).
    pub help: &'static str,
    /// Label keys (empty: one unlabelled series).
    pub labels: Vec<&'static str>,
    /// Every combination of label values that can occur, in `labels` order.
    pub combos: Vec<Vec<&'static str>>,
    /// A gauge's value at start-up: NaN while unknown (before the first refresh), else the
    /// real value (a flag the process knows: 0).
    pub start: f64,
}

impl Def {
    /// A counter with no labels.
    pub fn counter(name: &'static str, unit: &'static str, help: &'static str) -> Self {
        Self::new(name, Kind::Counter, unit, help)
    }

    /// A gauge with no labels, NaN until its first refresh.
    pub fn gauge(name: &'static str, unit: &'static str, help: &'static str) -> Self {
        Self::new(name, Kind::Gauge, unit, help)
    }

    /// A histogram with no labels.
    pub fn histogram(name: &'static str, unit: &'static str, help: &'static str) -> Self {
        Self::new(name, Kind::Histogram, unit, help)
    }

    fn new(name: &'static str, kind: Kind, unit: &'static str, help: &'static str) -> Self {
        Self {
            name,
            kind,
            unit,
            help,
            labels: Vec::new(),
            combos: vec![vec![]],
            start: f64::NAN,
        }
    }

    /// One label, with every value it takes.
    pub fn label(self, key: &'static str, values: &[&'static str]) -> Self {
        self.labels_product(&[key], &[values])
    }

    /// Several labels; every combination of their values occurs.
    pub fn labels_product(mut self, keys: &[&'static str], values: &[&[&'static str]]) -> Self {
        let mut combos: Vec<Vec<&'static str>> = vec![vec![]];
        for vs in values {
            combos = combos
                .into_iter()
                .flat_map(|c| {
                    vs.iter().map(move |v| {
                        let mut c = c.clone();
                        c.push(*v);
                        c
                    })
                })
                .collect();
        }
        self.labels = keys.to_vec();
        self.combos = combos;
        self
    }

    /// Several labels with an explicit list of the combinations that occur.
    pub fn combos(mut self, keys: &[&'static str], combos: Vec<Vec<&'static str>>) -> Self {
        self.labels = keys.to_vec();
        self.combos = combos;
        self
    }

    /// A gauge's known start value.
    pub fn starts_at(mut self, v: f64) -> Self {
        self.start = v;
        self
    }

    /// The HELP text: meaning and unit.
    pub fn help_line(&self) -> String {
        format!("{} ({})", self.help, self.unit)
    }

    /// The label sets of every series.
    pub fn series(&self) -> Vec<Vec<Label>> {
        self.combos
            .iter()
            .map(|c| {
                self.labels
                    .iter()
                    .zip(c)
                    .map(|(k, v)| Label::new(*k, *v))
                    .collect()
            })
            .collect()
    }
}

/// Every metric of the service, component by component.
pub fn defs() -> Vec<Def> {
    [
        inbox::defs(),
        late::defs(),
        pump::defs(),
        backfill::defs(),
        dispatch::defs(),
        outbound::defs(),
        lease::defs(),
        supervisor::defs(),
        verify::defs(),
        admin::defs(),
        procedures::defs(),
        housekeeping::defs(),
        raw_copy::defs(),
        traces::defs(),
    ]
    .concat()
}

/// Every metric name, from [`defs`] (dashboards and alert rules are checked against it).
pub fn names() -> Vec<&'static str> {
    defs().iter().map(|d| d.name).collect()
}

/// Histogram buckets per histogram, for the Prometheus exporter.
pub fn histogram_buckets() -> Vec<(&'static str, Vec<f64>)> {
    [
        inbox::histogram_buckets(),
        pump::histogram_buckets(),
        backfill::histogram_buckets(),
        dispatch::histogram_buckets(),
        housekeeping::histogram_buckets(),
    ]
    .concat()
}

/// Registers every metric once at start-up, on the installed recorder: HELP lines, counters at
/// 0 and gauges at their start value for every label combination, histograms empty.
pub fn register() {
    metrics::with_recorder(|r| {
        let meta = Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));
        for d in defs() {
            let help = SharedString::from(d.help_line());
            let name = KeyName::from_const_str(d.name);
            match d.kind {
                Kind::Counter => r.describe_counter(name, None, help),
                Kind::Gauge => r.describe_gauge(name, None, help),
                Kind::Histogram => r.describe_histogram(name, None, help),
            }
            for labels in d.series() {
                let key = Key::from_parts(d.name, labels);
                match d.kind {
                    Kind::Counter => r.register_counter(&key, &meta).increment(0),
                    Kind::Gauge => r.register_gauge(&key, &meta).set(d.start),
                    Kind::Histogram => drop(r.register_histogram(&key, &meta)),
                }
            }
        }
    });
}

#[cfg(test)]
mod tests;
