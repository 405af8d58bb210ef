//! OpenTelemetry traces of the messages (issue 54): one trace per inbox message, from the
//! upstream's inbox commit to the Kafka ack, joined across actors and restarts by ids derived
//! from the message's identity ([`context`]).
//!
//! Off unless the binary installs a [`Traces`] at start (`traces.enabled`): every hop asks
//! [`active`] first, so with tracing off no span, id or header is made for a message — one
//! atomic load per round, not work per message.
//!
//! The exporter (OTLP, the bounded queue, the `tracing` bridge) lives in the binary
//! (`msgx_actors::traces`); this crate only builds spans through the OpenTelemetry API.

mod context;
mod delivery;
mod operator;
pub use operator::Audited;
mod spans;

use std::sync::OnceLock;

use opentelemetry::global::BoxedTracer;

pub use context::{hex, ratio_sampled, valid_tracestate, MessageTrace, TraceParent};
pub use delivery::{
    DeliverySpan, Destination, CE_TRACEPARENT, CE_TRACESTATE, TRACEPARENT, TRACESTATE,
};
pub use spans::{
    span_context, trace_parent, Discovered, HoleWaited, Marking, OperatorAction, Processing,
};

/// What the spans need to know about the deployment, and the tracer they are built with.
pub struct Traces {
    /// `kafka.ce_source`: part of every derived trace id.
    pub ce_source: String,
    /// `traces.sampling_ratio`.
    pub ratio: f64,
    /// `inbox.table` (the inbox commit span's `db.collection.name`).
    pub inbox_table: String,
    tracer: BoxedTracer,
}

impl std::fmt::Debug for Traces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Traces")
            .field("ce_source", &self.ce_source)
            .field("ratio", &self.ratio)
            .finish_non_exhaustive()
    }
}

impl Traces {
    /// Spans through `tracer` (the binary's OTLP pipeline).
    pub fn new(ce_source: &str, ratio: f64, inbox_table: &str, tracer: BoxedTracer) -> Self {
        Self {
            ce_source: ce_source.to_string(),
            ratio,
            inbox_table: inbox_table.to_string(),
            tracer,
        }
    }
}

static ACTIVE: OnceLock<Traces> = OnceLock::new();

/// Turns message tracing on for this process (once; a second call is refused with `false`).
pub fn install(traces: Traces) -> bool {
    ACTIVE.set(traces).is_ok()
}

/// The installed tracing, `None` when tracing is off.
pub fn active() -> Option<&'static Traces> {
    ACTIVE.get()
}
