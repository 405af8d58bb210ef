//! Delivery metrics (the dispatcher), each next to its log line.

use std::time::Duration;

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit,
};

use crate::dispatch::RoundReport;
use crate::store::events::EventBacklog;

/// PENDING events.
pub const DISPATCH_PENDING: &str = "msgx_dispatch_pending";
/// Age of the oldest PENDING event.
pub const DISPATCH_OLDEST_PENDING_SECONDS: &str = "msgx_dispatch_oldest_pending_seconds";
/// Events acknowledged by the broker and marked SENT.
pub const DISPATCH_SENT_TOTAL: &str = "msgx_dispatch_sent_total";
/// Failed sends (each is retried after a backoff, or goes to the DLQ when exhausted).
pub const DISPATCH_RETRIES_TOTAL: &str = "msgx_dispatch_retries_total";
/// Events copied to the dead-letter topic and marked DEAD.
pub const DISPATCH_DEAD_TOTAL: &str = "msgx_dispatch_dead_total";
/// Queue → broker ack per event.
pub const DISPATCH_PRODUCE_SECONDS: &str = "msgx_dispatch_produce_seconds";
/// Event committed by the pump → broker ack.
pub const DISPATCH_COMMIT_TO_ACK_SECONDS: &str = "msgx_dispatch_commit_to_ack_seconds";
/// Producers rebuilt after a fatal librdkafka error.
pub const DISPATCH_PRODUCER_RECREATED_TOTAL: &str = "msgx_dispatch_producer_recreated_total";
/// Rounds that failed on the store (events stay PENDING).
pub const DISPATCH_ROUND_ERRORS_TOTAL: &str = "msgx_dispatch_round_errors_total";

/// Buckets for the two latency histograms (the aim is p99 ≤ 50 ms).
pub fn histogram_buckets() -> Vec<(&'static str, Vec<f64>)> {
    let latency = vec![
        0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0,
    ];
    vec![
        (DISPATCH_PRODUCE_SECONDS, latency.clone()),
        (DISPATCH_COMMIT_TO_ACK_SECONDS, latency),
    ]
}

/// HELP lines.
pub fn describe() {
    describe_gauge!(DISPATCH_PENDING, "MSG_EVENT rows PENDING delivery");
    describe_gauge!(
        DISPATCH_OLDEST_PENDING_SECONDS,
        Unit::Seconds,
        "Age of the oldest PENDING event"
    );
    describe_counter!(
        DISPATCH_SENT_TOTAL,
        "Events acknowledged by Kafka and marked SENT"
    );
    describe_counter!(
        DISPATCH_RETRIES_TOTAL,
        "Failed event sends (retried after backoff, DLQ when exhausted)"
    );
    describe_counter!(
        DISPATCH_DEAD_TOTAL,
        "Events copied to the dead-letter topic and marked DEAD"
    );
    describe_histogram!(
        DISPATCH_PRODUCE_SECONDS,
        Unit::Seconds,
        "Event queued to the producer → broker ack"
    );
    describe_histogram!(
        DISPATCH_COMMIT_TO_ACK_SECONDS,
        Unit::Seconds,
        "Event committed by the pump → broker ack"
    );
    describe_counter!(
        DISPATCH_PRODUCER_RECREATED_TOTAL,
        "Kafka producers rebuilt after a fatal error"
    );
    describe_counter!(
        DISPATCH_ROUND_ERRORS_TOTAL,
        "Dispatch rounds that failed (events stay PENDING)"
    );
}

/// A round ended.
pub fn dispatch_round(r: &RoundReport) {
    counter!(DISPATCH_SENT_TOTAL).increment(r.sent);
    counter!(DISPATCH_RETRIES_TOTAL).increment((r.failed + r.dlq_failed) as u64);
    counter!(DISPATCH_DEAD_TOTAL).increment(r.dead);
    for t in &r.timings {
        histogram!(DISPATCH_PRODUCE_SECONDS).record(t.produce.as_secs_f64());
        if let Some(c) = t.commit_to_ack {
            histogram!(DISPATCH_COMMIT_TO_ACK_SECONDS).record(c.as_secs_f64());
        }
    }
    for (event_id, error) in &r.failures {
        tracing::warn!(event_id, error = %error, "event send failed; backing off (later events of its key wait)");
    }
    for (event_id, error) in &r.dead_events {
        tracing::error!(event_id, last_error = %error, alert = true, "event exhausted its attempts: copied to the dead-letter topic, DEAD");
    }
    if r.dlq_failed > 0 {
        tracing::error!(
            count = r.dlq_failed,
            "dead-letter copy failed; the events stay PENDING and are retried"
        );
    }
    if let Some(reason) = &r.producer_recreated {
        counter!(DISPATCH_PRODUCER_RECREATED_TOTAL).increment(1);
        tracing::error!(reason = %reason, "fatal kafka producer error; producer rebuilt (undelivered events are re-sent, duplicates possible)");
    }
    if r.sent > 0 {
        tracing::debug!(sent = r.sent, selected = r.selected, "events delivered");
    }
}

/// A round failed (store or producer rebuild).
pub fn dispatch_failed(error: &dyn std::error::Error) {
    counter!(DISPATCH_ROUND_ERRORS_TOTAL).increment(1);
    tracing::error!(error = %error, "dispatch round failed; events stay PENDING");
}

/// Backlog gauges.
pub fn dispatch_backlog(b: &EventBacklog, oldest_age: Option<Duration>) {
    gauge!(DISPATCH_PENDING).set(b.pending as f64);
    gauge!(DISPATCH_OLDEST_PENDING_SECONDS).set(oldest_age.map_or(0.0, |d| d.as_secs_f64()));
}
