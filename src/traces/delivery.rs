//! The delivery span of one Kafka record (OpenTelemetry messaging conventions: a `send
//! {topic}` PRODUCER span from queueing to the broker's ack), and the trace headers the record
//! carries: W3C `traceparent`/`tracestate` of this span (the per-hop context a Kafka
//! instrumentation reads), and the CloudEvents Distributed Tracing extension's
//! `ce_traceparent`/`ce_tracestate` with the message's starting trace (binary mode: the
//! extension attributes are `ce_` headers).

use opentelemetry::global::BoxedSpan;
use opentelemetry::trace::{Span as _, SpanBuilder, SpanKind, Status, Tracer as _};
use opentelemetry::KeyValue;

use super::spans::trace_parent;
use super::Traces;
use crate::store::events::PendingEvent;

/// Header names (the extension's attributes lower-case after `ce_`, as the binding requires).
pub const TRACEPARENT: &str = "traceparent";
/// See [`TRACEPARENT`].
pub const TRACESTATE: &str = "tracestate";
/// The CloudEvents extension attribute `traceparent` in binary mode.
pub const CE_TRACEPARENT: &str = "ce_traceparent";
/// The CloudEvents extension attribute `tracestate` in binary mode.
pub const CE_TRACESTATE: &str = "ce_tracestate";

/// A record's delivery, open until the broker answers.
pub struct DeliverySpan {
    span: BoxedSpan,
}

impl std::fmt::Debug for DeliverySpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeliverySpan")
    }
}

/// Where the record goes.
#[derive(Debug, Clone, Copy)]
pub struct Destination<'a> {
    /// The topic.
    pub topic: &'a str,
    /// A dead-letter copy.
    pub dead_letter: bool,
    /// `exactly-once`: the producer's `transactional.id`.
    pub transactional_id: Option<&'a str>,
}

impl Traces {
    /// Starts `ev`'s delivery span (now) and appends the trace headers to `headers`.
    pub fn delivery(
        &self,
        ev: &PendingEvent,
        to: Destination<'_>,
        headers: &mut Vec<(&'static str, String)>,
    ) -> DeliverySpan {
        let trace = self.message(
            ev.msg_id,
            ev.trace_parent.as_deref(),
            ev.trace_state.as_deref(),
        );
        let state = trace.state.as_deref();
        let mut attributes = vec![
            KeyValue::new("messaging.system", "kafka"),
            KeyValue::new("messaging.operation.name", "send"),
            KeyValue::new("messaging.operation.type", "send"),
            KeyValue::new("messaging.destination.name", to.topic.to_string()),
            KeyValue::new("messaging.kafka.message.key", ev.flight_key.clone()),
            KeyValue::new("messaging.message.id", ev.ce_id.clone()),
            KeyValue::new("msgx.msg_id", ev.msg_id),
            KeyValue::new("msgx.event_id", ev.event_id),
            KeyValue::new("msgx.event_type", ev.event_type.clone()),
            KeyValue::new("msgx.attempt", i64::from(ev.attempts) + 1),
            KeyValue::new("msgx.dead_letter", to.dead_letter),
        ];
        if let Some(id) = to.transactional_id {
            attributes.push(KeyValue::new("msgx.kafka.transactional_id", id.to_string()));
        }
        let span = self.tracer.build_with_context(
            SpanBuilder::from_name(format!("send {}", to.topic))
                .with_kind(SpanKind::Producer)
                .with_attributes(attributes),
            &super::spans::parent_context(&trace.root, state),
        );
        // An unsampled span still has its context: the flags tell the consumer we did not
        // sample, so its decision can follow ours.
        let own = trace_parent(span.span_context());
        headers.push((TRACEPARENT, own.to_string()));
        headers.push((CE_TRACEPARENT, trace.root.to_string()));
        if let Some(s) = state {
            headers.push((TRACESTATE, s.to_string()));
            headers.push((CE_TRACESTATE, s.to_string()));
        }
        DeliverySpan { span }
    }
}

impl DeliverySpan {
    /// The broker acknowledged it at `partition`/`offset`.
    pub fn acked(mut self, partition: i32, offset: i64) {
        self.span.set_attribute(KeyValue::new(
            "messaging.destination.partition.id",
            partition.to_string(),
        ));
        self.span
            .set_attribute(KeyValue::new("messaging.kafka.offset", offset));
        self.span.end();
    }

    /// The send failed (it is retried, or dead-lettered once exhausted).
    pub fn failed(mut self, error: &str) {
        self.span
            .set_attribute(KeyValue::new("error.type", "kafka_send"));
        self.span.set_status(Status::error(error.to_string()));
        self.span.end();
    }
}
