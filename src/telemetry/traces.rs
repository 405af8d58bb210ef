//! The trace exporter (issue 54, `[traces]`): spans sent to the collector, and spans dropped —
//! the queue was full (a dead or slow collector: the pipeline never waits for it) or an export
//! request failed — each next to its log line.

use metrics::{counter, gauge};

use super::Def;

/// Spans the collector accepted.
pub const TRACE_SPANS_EXPORTED_TOTAL: &str = "msgx_trace_spans_exported_total";
/// Spans dropped, by reason (`queue_full`, `export_failed`).
pub const TRACE_SPANS_DROPPED_TOTAL: &str = "msgx_trace_spans_dropped_total";
/// Spans waiting for export.
pub const TRACE_QUEUE_SPANS: &str = "msgx_trace_queue_spans";

/// Why spans were dropped.
pub const TRACE_DROP_REASONS: [&str; 2] = ["queue_full", "export_failed"];

/// The series of this file.
pub(super) fn defs() -> Vec<Def> {
    vec![
        Def::counter(
            TRACE_SPANS_EXPORTED_TOTAL,
            "spans",
            "Spans the OTLP collector accepted (traces.enabled)",
        ),
        Def::counter(
            TRACE_SPANS_DROPPED_TOTAL,
            "spans",
            "Spans dropped instead of exported: the export queue was full (traces.queue_size) or an export request failed",
        )
        .label("reason", &TRACE_DROP_REASONS),
        Def::gauge(
            TRACE_QUEUE_SPANS,
            "spans",
            "Finished spans waiting for export (at most traces.queue_size)",
        )
        .starts_at(0.0),
    ]
}

/// A batch reached the collector.
pub fn trace_spans_exported(spans: usize, queued: usize) {
    counter!(TRACE_SPANS_EXPORTED_TOTAL).increment(spans as u64);
    gauge!(TRACE_QUEUE_SPANS).set(queued as f64);
}

/// A span found the queue full. Counted only: a log line per span would flood the log exactly
/// when the collector is gone; [`trace_export_failed`] says that once.
pub fn trace_span_dropped_queue_full() {
    counter!(TRACE_SPANS_DROPPED_TOTAL, "reason" => "queue_full").increment(1);
}

/// An export request failed; `first`: the first failure after a success (logged; the rest are
/// only counted until an export succeeds again).
pub fn trace_export_failed(spans: usize, queued: usize, error: &str, first: bool) {
    counter!(TRACE_SPANS_DROPPED_TOTAL, "reason" => "export_failed").increment(spans as u64);
    gauge!(TRACE_QUEUE_SPANS).set(queued as f64);
    if first {
        tracing::warn!(
            spans,
            error = %error,
            "trace export failed; spans are dropped (msgx_trace_spans_dropped_total) until the collector answers again"
        );
    }
}

/// An export succeeded after failures.
pub fn trace_export_recovered(failed_batches: u64) {
    tracing::info!(failed_batches, "trace export works again");
}
