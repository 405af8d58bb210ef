//! Delivery metrics (the dispatcher), each next to its log line.

use std::time::Duration;

use metrics::{counter, gauge, histogram};

use super::Def;

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
/// Records the exactly-once recovery read back, by what they were.
pub const DISPATCH_RECOVERED_TOTAL: &str = "msgx_dispatch_recovered_total";
/// Kafka transaction commits whose outcome was unknown (timed out) and were called again.
pub const DISPATCH_COMMIT_RETRIES_TOTAL: &str = "msgx_dispatch_commit_retries_total";
/// Partitions the exactly-once recovery waits on: another producer's open transaction holds
/// their last stable offset below the end seen at start.
pub const DISPATCH_RECOVERY_HELD_BACK_PARTITIONS: &str =
    "msgx_dispatch_recovery_held_back_partitions";

/// The `outcome` values of [`DISPATCH_RECOVERED_TOTAL`].
const RECOVERED_OUTCOMES: &[&str] = &["recovered", "already_recorded", "others"];

/// Buckets for the two latency histograms (the aim is p99 ≤ 50 ms).
pub(super) fn histogram_buckets() -> Vec<(&'static str, Vec<f64>)> {
    let latency = vec![
        0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0,
    ];
    vec![
        (DISPATCH_PRODUCE_SECONDS, latency.clone()),
        (DISPATCH_COMMIT_TO_ACK_SECONDS, latency),
    ]
}

/// The series of this file.
pub(super) fn defs() -> Vec<Def> {
    vec![
        Def::gauge(
            DISPATCH_PENDING,
            "events",
            "MSG_EVENT rows PENDING delivery; NaN before the first backlog refresh",
        ),
        Def::gauge(
            DISPATCH_OLDEST_PENDING_SECONDS,
            "seconds",
            "Age of the oldest PENDING event (0 when none); NaN before the first backlog refresh",
        ),
        Def::counter(
            DISPATCH_SENT_TOTAL,
            "events",
            "Events acknowledged by Kafka and marked SENT",
        ),
        Def::counter(
            DISPATCH_RETRIES_TOTAL,
            "sends",
            "Failed event sends (retried after backoff, DLQ when exhausted)",
        ),
        Def::counter(
            DISPATCH_DEAD_TOTAL,
            "events",
            "Events copied to the dead-letter topic and marked DEAD",
        ),
        Def::histogram(
            DISPATCH_PRODUCE_SECONDS,
            "seconds",
            "Event queued to the producer to broker ack",
        ),
        Def::histogram(
            DISPATCH_COMMIT_TO_ACK_SECONDS,
            "seconds",
            "Event committed by the pump to broker ack",
        ),
        Def::counter(
            DISPATCH_PRODUCER_RECREATED_TOTAL,
            "producers",
            "Kafka producers rebuilt after a fatal error",
        ),
        Def::counter(
            DISPATCH_ROUND_ERRORS_TOTAL,
            "rounds",
            "Dispatch rounds that failed (events stay PENDING)",
        ),
        Def::counter(
            DISPATCH_RECOVERED_TOTAL,
            "records",
            "exactly-once start (and an at-least-once start while events an earlier release \
             made are PENDING): committed records read back from the events and dead-letter \
             topics: recovered (ours, PENDING, now SENT/DEAD), already_recorded (ours, known), \
             others (another store's or deployment's, skipped)",
        )
        .label("outcome", RECOVERED_OUTCOMES),
        Def::counter(
            DISPATCH_COMMIT_RETRIES_TOTAL,
            "commits",
            "exactly-once: transaction commits whose outcome was unknown (timed out), called again",
        ),
        Def::gauge(
            DISPATCH_RECOVERY_HELD_BACK_PARTITIONS,
            "partitions",
            "exactly-once start: partitions whose last stable offset another producer's open \
             transaction holds below the end seen at start; the recovery waits (up to \
             kafka.open_transaction_wait) before it decides",
        )
        .starts_at(0.0),
    ]
}

/// What the exactly-once start read back from one topic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanRecovered<'a> {
    /// The topic read.
    pub topic: &'a str,
    /// Committed records read.
    pub read: usize,
    /// Ours and PENDING: now SENT (DEAD on the dead-letter topic).
    pub recovered: u64,
    /// Ours and already recorded (the recorded copy, or a re-sent duplicate).
    pub already_recorded: usize,
    /// Not ours: another store's or deployment's events, or no event at all.
    pub others: usize,
    /// Partitions found recreated or truncated (read from their first offset).
    pub recreated: &'a [i32],
}

impl ScanRecovered<'_> {
    /// The counter by outcome and the log line.
    pub fn emit(&self) {
        let _whole = super::whole::event();
        let by = [
            ("recovered", self.recovered),
            ("already_recorded", self.already_recorded as u64),
            ("others", self.others as u64),
        ];
        for (outcome, n) in by {
            counter!(DISPATCH_RECOVERED_TOTAL, "outcome" => outcome).increment(n);
        }
        if !self.recreated.is_empty() {
            tracing::warn!(
                topic = self.topic,
                partitions = ?self.recreated,
                "dispatch start: partitions end below the recorded floor (topic recreated or \
                 truncated); read from their first offset"
            );
        }
        tracing::info!(
            topic = self.topic,
            read = self.read,
            recovered = self.recovered,
            already_recorded = self.already_recorded,
            others = self.others,
            "dispatch start: read back what committed records of ours the topics hold"
        );
    }
}

/// The exactly-once recovery found a partition held back by an open transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryHeldBack<'a> {
    /// The topic read.
    pub topic: &'a str,
    /// The partition.
    pub partition: i32,
    /// Its last stable offset.
    pub stable: i64,
    /// Its end when the scan began.
    pub end: i64,
    /// Partitions of the topic held back now.
    pub partitions: usize,
}

impl RecoveryHeldBack<'_> {
    /// The gauge and the log line.
    pub fn emit(&self) {
        recovery_held_back_partitions(self.partitions);
        tracing::warn!(
            topic = self.topic,
            partition = self.partition,
            last_stable_offset = self.stable,
            end = self.end,
            "exactly-once start: another producer's open transaction holds the last stable \
             offset below the end seen at start; waiting for it to end before deciding what \
             was delivered"
        );
    }
}

/// A held-back partition was read to its end.
pub fn recovery_released(topic: &str, partition: i32, waited: Duration, left: usize) {
    recovery_held_back_partitions(left);
    tracing::info!(
        topic,
        partition,
        waited_ms = waited.as_millis() as u64,
        "exactly-once start: the open transaction ended; partition read to its end"
    );
}

/// Sets the held-back partitions gauge.
pub fn recovery_held_back_partitions(n: usize) {
    gauge!(DISPATCH_RECOVERY_HELD_BACK_PARTITIONS).set(n as f64);
}

/// A transaction commit's outcome was unknown (timed out): it is called again.
pub fn commit_retried(attempt: u32, error: &dyn std::error::Error) {
    counter!(DISPATCH_COMMIT_RETRIES_TOTAL).increment(1);
    tracing::warn!(attempt, error = %error, "kafka transaction commit unresolved; committing again");
}

/// A dispatch round ended.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DispatchRound<'a> {
    /// Events read.
    pub selected: usize,
    /// Acknowledged by the broker.
    pub acked: usize,
    /// Failed sends (retried), dead-letter copies included.
    pub retries: u64,
    /// Per acknowledged event: queue → ack, and commit → ack when known.
    pub timings: Vec<(Duration, Option<Duration>)>,
    /// First few failed sends (event id, error).
    pub failures: &'a [(i64, String)],
    /// Dead events (event id, last error).
    pub dead_events: &'a [(i64, String)],
    /// Dead-letter copies that failed.
    pub dlq_failed: usize,
    /// Acknowledged after an earlier event of their key failed: out of key order on the topic.
    pub overtaken: usize,
    /// The producer was rebuilt after a fatal error (why).
    pub producer_recreated: Option<&'a str>,
}

impl DispatchRound<'_> {
    /// Metrics and log lines of the round.
    pub fn emit(&self) {
        let _whole = super::whole::event();
        counter!(DISPATCH_RETRIES_TOTAL).increment(self.retries);
        for (produce, commit_to_ack) in &self.timings {
            histogram!(DISPATCH_PRODUCE_SECONDS).record(produce.as_secs_f64());
            if let Some(c) = commit_to_ack {
                histogram!(DISPATCH_COMMIT_TO_ACK_SECONDS).record(c.as_secs_f64());
            }
        }
        for (event_id, error) in self.failures {
            tracing::warn!(event_id, error = %error, "event send failed; backing off (later events of its key wait)");
        }
        for (event_id, error) in self.dead_events {
            tracing::error!(event_id, last_error = %error, alert = true, "event exhausted its attempts: copied to the dead-letter topic, DEAD");
        }
        if self.dlq_failed > 0 {
            tracing::error!(
                count = self.dlq_failed,
                "dead-letter copy failed; the events stay PENDING and are retried"
            );
        }
        if self.overtaken > 0 {
            tracing::error!(
                count = self.overtaken,
                alert = true,
                "events acknowledged after an earlier event of their key failed: per-key order broken on the topic"
            );
        }
        if let Some(reason) = self.producer_recreated {
            counter!(DISPATCH_PRODUCER_RECREATED_TOTAL).increment(1);
            tracing::error!(reason = %reason, "fatal kafka producer error; producer rebuilt (undelivered events are re-sent, duplicates possible)");
        }
        if self.acked > 0 {
            tracing::debug!(
                acked = self.acked,
                selected = self.selected,
                "events delivered"
            );
        }
    }
}

/// A round's outcome was written: acks as SENT, dead-letter copies as DEAD.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutcomeWritten {
    /// Marked SENT.
    pub sent: u64,
    /// Marked DEAD.
    pub dead: u64,
}

impl OutcomeWritten {
    /// The SENT and DEAD counters.
    pub fn emit(&self) {
        let _whole = super::whole::event();
        counter!(DISPATCH_SENT_TOTAL).increment(self.sent);
        counter!(DISPATCH_DEAD_TOTAL).increment(self.dead);
    }
}

/// A round failed (store or producer rebuild).
pub fn dispatch_failed(error: &dyn std::error::Error) {
    counter!(DISPATCH_ROUND_ERRORS_TOTAL).increment(1);
    tracing::error!(error = %error, "dispatch round failed; events stay PENDING");
}
