//! The spans of one message's trace, built with explicit start and end times through the
//! OpenTelemetry API (a hop reports its span when it knows both ends: the inbox commit is
//! back-dated to the row's receive time, a delivery ends at the broker's ack). Names and
//! attributes follow the OpenTelemetry semantic conventions for database client spans (the
//! inbox commit, the mark) and messaging (Kafka) producer spans; `msgx.*` attributes are ours.

use std::time::SystemTime;

use chrono::{DateTime, Utc};
use opentelemetry::trace::{
    Link, Span as _, SpanBuilder, SpanContext, SpanId, SpanKind, Status, TraceContextExt as _,
    TraceFlags, TraceId, TraceState, Tracer as _,
};
use opentelemetry::{Context, KeyValue};

use super::context::{MessageTrace, TraceParent};
use super::Traces;

/// Our wire context as OpenTelemetry's.
pub fn span_context(tp: &TraceParent, state: Option<&str>) -> SpanContext {
    SpanContext::new(
        TraceId::from_bytes(tp.trace_id),
        SpanId::from_bytes(tp.span_id),
        TraceFlags::new(tp.flags),
        true,
        state
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default(),
    )
}

/// OpenTelemetry's span context as ours (`traceparent`).
pub fn trace_parent(sc: &SpanContext) -> TraceParent {
    TraceParent {
        trace_id: sc.trace_id().to_bytes(),
        span_id: sc.span_id().to_bytes(),
        flags: sc.trace_flags().to_u8(),
    }
}

/// A remote parent context.
pub(super) fn parent_context(tp: &TraceParent, state: Option<&str>) -> Context {
    Context::new().with_remote_span_context(span_context(tp, state))
}

fn at(t: DateTime<Utc>) -> SystemTime {
    t.into()
}

/// The link to the current `tracing` span (the pump group, the dispatch round), when it is
/// exported: a batch's span and each message's span point at each other this way.
fn batch_links(batch: Option<&SpanContext>) -> Vec<Link> {
    batch
        .filter(|sc| sc.is_valid())
        .map(|sc| vec![Link::with_context(sc.clone())])
        .unwrap_or_default()
}

impl Traces {
    /// The message's trace.
    pub fn message(&self, msg_id: i64, stored: Option<&str>, state: Option<&str>) -> MessageTrace {
        MessageTrace::derive(&self.ce_source, msg_id, stored, state, self.ratio)
    }

    /// The inbox commit: the row upstream wrote, back-dated to its receive time (a point: we
    /// do not see the writer's transaction start). The message's first span; its id is the
    /// one every later hop derives. `how`: who registered the row (`POLL`, `COMPAT`, `LATE`).
    pub fn inbox_commit(
        &self,
        msg_id: i64,
        trace: &MessageTrace,
        received_at: DateTime<Utc>,
        how: &'static str,
    ) {
        let builder = SpanBuilder::from_name(format!("INSERT {}", self.inbox_table))
            .with_kind(SpanKind::Client)
            .with_trace_id(TraceId::from_bytes(trace.root.trace_id))
            .with_span_id(SpanId::from_bytes(trace.root.span_id))
            .with_start_time(at(received_at))
            .with_attributes([
                KeyValue::new("db.system.name", "mysql"),
                KeyValue::new("db.operation.name", "INSERT"),
                KeyValue::new("db.collection.name", self.inbox_table.clone()),
                KeyValue::new("msgx.msg_id", msg_id),
                KeyValue::new("msgx.registered_by", how),
            ]);
        let cx = match &trace.caller {
            Some(c) => parent_context(c, trace.state.as_deref()),
            None => Context::new(),
        };
        self.tracer
            .build_with_context(builder, &cx)
            .end_with_timestamp(at(received_at));
    }

    /// Discovery: from the row's receive time until W passed it and it was enqueued. A hole
    /// the row waited behind is an event with the hole's age.
    pub fn discovered(&self, d: &Discovered) {
        let trace = self.message(d.msg_id, None, None);
        let mut span = self.tracer.build_with_context(
            SpanBuilder::from_name("msgx.discover")
                .with_kind(SpanKind::Internal)
                .with_start_time(at(d.received_at.unwrap_or(d.enqueued_at)))
                .with_attributes([
                    KeyValue::new("msgx.msg_id", d.msg_id),
                    KeyValue::new("msgx.watermark", d.watermark),
                    KeyValue::new("msgx.registered_by", "POLL"),
                ])
                .with_links(batch_links(d.round)),
            &parent_context(&trace.root, None),
        );
        if let Some(h) = d.hole {
            let age = (d.enqueued_at - h.first_seen).num_milliseconds().max(0) as f64 / 1e3;
            span.add_event_with_timestamp(
                "msgx.hole.waited",
                at(d.enqueued_at),
                vec![
                    KeyValue::new("msgx.hole.first", h.first),
                    KeyValue::new("msgx.hole.last", h.last),
                    KeyValue::new("msgx.hole.age_s", age),
                ],
            );
        }
        span.end_with_timestamp(at(d.enqueued_at));
    }

    /// One processing attempt of the pump: `started` to `ended`, its outcome; a FAILED attempt
    /// is an error with the retry as an event, a DEAD one an error.
    pub fn processed(&self, p: &Processing<'_>) {
        let trace = self.message(p.msg_id, p.stored, p.state);
        let mut span = self.tracer.build_with_context(
            SpanBuilder::from_name("msgx.process")
                .with_kind(SpanKind::Internal)
                .with_start_time(at(p.started))
                .with_attributes([
                    KeyValue::new("msgx.msg_id", p.msg_id),
                    KeyValue::new("msgx.outcome", p.outcome),
                    KeyValue::new("msgx.class", p.class),
                    KeyValue::new("msgx.pump.group_size", p.group_size as i64),
                ])
                .with_links(batch_links(p.group)),
            &parent_context(&trace.root, trace.state.as_deref()),
        );
        if let Some(retry_at) = p.retry_at {
            span.add_event_with_timestamp(
                "msgx.retry_scheduled",
                at(p.ended),
                vec![KeyValue::new(
                    "msgx.retry_at",
                    retry_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                )],
            );
        }
        if matches!(p.outcome, "failed" | "dead") {
            span.set_status(Status::error(format!("{}: {}", p.class, p.detail)));
        }
        span.end_with_timestamp(at(p.ended));
    }
}

impl Traces {
    /// The inbox mark (the backfill sweep's UPDATE of the processed-mark columns): the sweep's
    /// time, its outcome for this row; an abandoned mark is an error.
    pub fn marked(&self, m: &Marking<'_>) {
        let trace = self.message(m.msg_id, m.stored, m.state);
        let mut span = self.tracer.build_with_context(
            SpanBuilder::from_name(format!("UPDATE {}", self.inbox_table))
                .with_kind(SpanKind::Client)
                .with_start_time(at(m.started))
                .with_attributes([
                    KeyValue::new("db.system.name", "mysql"),
                    KeyValue::new("db.operation.name", "UPDATE"),
                    KeyValue::new("db.collection.name", self.inbox_table.clone()),
                    KeyValue::new("msgx.msg_id", m.msg_id),
                    KeyValue::new("msgx.mark", m.outcome),
                ]),
            &parent_context(&trace.root, trace.state.as_deref()),
        );
        if matches!(
            m.outcome,
            "abandoned_missing_row" | "abandoned_max_attempts"
        ) {
            span.set_status(Status::error(m.outcome));
        }
        span.end_with_timestamp(at(m.ended));
    }
}

impl Traces {
    /// An audited operator action on a message (`replay`, `requeue`): a point span at `at` in
    /// the message's trace, naming who and why, so the trace shows why the message ran again.
    pub fn operator_action(&self, a: &OperatorAction<'_>) {
        let trace = self.message(a.msg_id, a.stored, a.state);
        let mut attributes = vec![
            KeyValue::new("msgx.msg_id", a.msg_id),
            KeyValue::new("msgx.action", a.action),
            KeyValue::new("msgx.audit.actor", a.actor.to_string()),
            KeyValue::new("msgx.audit.reason", a.reason.to_string()),
        ];
        if let Some(t) = a.ticket {
            attributes.push(KeyValue::new("msgx.audit.ticket", t.to_string()));
        }
        if let Some(id) = a.audit_id {
            attributes.push(KeyValue::new("msgx.audit.id", id));
        }
        if let Some(id) = a.event_id {
            attributes.push(KeyValue::new("msgx.event_id", id));
        }
        self.tracer
            .build_with_context(
                SpanBuilder::from_name(format!("msgx.operator.{}", a.action))
                    .with_kind(SpanKind::Internal)
                    .with_start_time(at(a.at))
                    .with_attributes(attributes),
                &parent_context(&trace.root, trace.state.as_deref()),
            )
            .end_with_timestamp(at(a.at));
    }
}

impl Traces {
    /// A late arrival (a row committed below W after its hole was released): its first spans,
    /// the inbox commit (at detection: the row's own time is not read) and the detection, a
    /// point span the late detector reports.
    pub fn late_detected(&self, msg_id: i64, at_detection: DateTime<Utc>) {
        let trace = self.message(msg_id, None, None);
        self.inbox_commit(msg_id, &trace, at_detection, "LATE");
        self.tracer
            .build_with_context(
                SpanBuilder::from_name("msgx.late.detected")
                    .with_kind(SpanKind::Internal)
                    .with_start_time(at(at_detection))
                    .with_attributes([
                        KeyValue::new("msgx.msg_id", msg_id),
                        KeyValue::new("msgx.registered_by", "LATE"),
                    ]),
                &parent_context(&trace.root, None),
            )
            .end_with_timestamp(at(at_detection));
    }
}

/// An audited operator action on one message.
#[derive(Debug, Clone, Copy)]
pub struct OperatorAction<'a> {
    /// Inbox id.
    pub msg_id: i64,
    /// The stored caller context (compat entry), if any.
    pub stored: Option<&'a str>,
    /// Its `tracestate`.
    pub state: Option<&'a str>,
    /// `replay`, `requeue`.
    pub action: &'static str,
    /// The audited actor, reason and ticket.
    pub actor: &'a str,
    /// See `actor`.
    pub reason: &'a str,
    /// See `actor`.
    pub ticket: Option<&'a str>,
    /// The `audit_log` row.
    pub audit_id: Option<i64>,
    /// The requeued event, for `requeue`.
    pub event_id: Option<i64>,
    /// When.
    pub at: DateTime<Utc>,
}

/// One row's mark in a sweep.
#[derive(Debug, Clone, Copy)]
pub struct Marking<'a> {
    /// Inbox id.
    pub msg_id: i64,
    /// The stored caller context (compat entry), if any.
    pub stored: Option<&'a str>,
    /// Its `tracestate`.
    pub state: Option<&'a str>,
    /// The sweep's start and end.
    pub started: DateTime<Utc>,
    /// See `started`.
    pub ended: DateTime<Utc>,
    /// `confirmed`, `abandoned_missing_row`, `abandoned_max_attempts`.
    pub outcome: &'static str,
}

/// A hole a discovered row waited behind.
#[derive(Debug, Clone, Copy)]
pub struct HoleWaited {
    /// Its first id.
    pub first: i64,
    /// Its last id.
    pub last: i64,
    /// When it was first seen.
    pub first_seen: DateTime<Utc>,
}

/// One row W passed.
#[derive(Debug, Clone, Copy)]
pub struct Discovered<'a> {
    /// Inbox id.
    pub msg_id: i64,
    /// Its receive time (converted), if the row has one.
    pub received_at: Option<DateTime<Utc>>,
    /// When it was enqueued.
    pub enqueued_at: DateTime<Utc>,
    /// W after the round.
    pub watermark: i64,
    /// The hole below it that held W, if any.
    pub hole: Option<HoleWaited>,
    /// The poll round's span.
    pub round: Option<&'a SpanContext>,
}

/// One processing attempt.
#[derive(Debug, Clone, Copy)]
pub struct Processing<'a> {
    /// Inbox id.
    pub msg_id: i64,
    /// The stored caller context (compat entry), if any.
    pub stored: Option<&'a str>,
    /// Its `tracestate`.
    pub state: Option<&'a str>,
    /// When the attempt began and ended.
    pub started: DateTime<Utc>,
    /// See `started`.
    pub ended: DateTime<Utc>,
    /// `succeeded`, `skipped`, `dead`, `failed`, `finished_elsewhere`.
    pub outcome: &'static str,
    /// The error class, `none` on success.
    pub class: &'static str,
    /// Detail of a failure.
    pub detail: &'a str,
    /// A FAILED attempt's next try.
    pub retry_at: Option<DateTime<Utc>>,
    /// Members of the group it rode in.
    pub group_size: usize,
    /// The group's span.
    pub group: Option<&'a SpanContext>,
}
