//! Group-commit metrics of the pump (issue 10), each next to its log line.

use std::time::Duration;

use metrics::{describe_histogram, histogram, Unit};

/// Messages per committed group.
pub const PUMP_GROUP_SIZE: &str = "msgx_pump_group_size";
/// A group's wall time: first member started → commit returned.
pub const PUMP_GROUP_SECONDS: &str = "msgx_pump_group_seconds";

/// Buckets of the group histograms.
pub fn histogram_buckets() -> Vec<(&'static str, Vec<f64>)> {
    vec![
        (
            PUMP_GROUP_SIZE,
            vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0],
        ),
        (
            PUMP_GROUP_SECONDS,
            vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
            ],
        ),
    ]
}

/// HELP lines.
pub fn describe() {
    describe_histogram!(
        PUMP_GROUP_SIZE,
        "Messages per pump group (one business transaction, one commit)"
    );
    describe_histogram!(
        PUMP_GROUP_SECONDS,
        Unit::Seconds,
        "Pump group wall time, first member to commit"
    );
}

/// A group committed.
pub fn pump_group(messages: usize, took: Duration) {
    histogram!(PUMP_GROUP_SIZE).record(messages as f64);
    histogram!(PUMP_GROUP_SECONDS).record(took.as_secs_f64());
    tracing::trace!(
        messages,
        took_ms = took.as_secs_f64() * 1e3,
        "pump group committed"
    );
}
