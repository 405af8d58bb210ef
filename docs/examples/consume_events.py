#!/usr/bin/env python3
"""A minimal consumer of msgexchange flight events (docs/consuming-events.md).

Reads the event topic with a consumer group, committed records only (read_committed: in the
service's exactly-once mode an aborted round's records are never seen), drops redeliveries by
(ce_source, ce_id), and prints one JSON line per new event, then a summary line when it stops.
ce_id is the event's UUID, unique across stores and deployments; ce_source names the
deployment. The test suite runs it
against a real broker (tests/event_contract.rs).

    pip install confluent-kafka
    python3 consume_events.py --bootstrap kafka:9092 [--topic msgx.flight-events]

Give --topic twice to read the dead-letter topic too, with the same de-duplication set: a
dead letter has its own ce_id (the event's is in its ce_msgxoriginalid header), so an event an
operator requeued after it died is still handled when it reaches the main topic.

Tracing (docs/operations/tracing.md): with the service's traces on, each record carries W3C
`traceparent` (its delivery span) and the CloudEvents extension `ce_traceparent` (the message's
trace). This consumer prints the trace id; with `opentelemetry-api` installed it handles each
event in a CONSUMER span that continues the record's `traceparent` and links to the message's
trace, as the OpenTelemetry messaging conventions describe.

The de-duplication set lives in memory here. A real consumer keeps the seen (ce_source, ce_id)
pairs in its own store, written in the same transaction as the effect of the event, for longer
than any redelivery can take (a requeued dead event can come back days later).
"""
import argparse
import json
import sys
import time

from confluent_kafka import Consumer

try:  # optional: continue the producer's trace (pip install opentelemetry-api opentelemetry-sdk)
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Link, SpanKind
except ImportError:
    trace = None


# The body versions this consumer handles (docs/consuming-events.md, "Versions"): select by
# ce_dataschema first, then de-duplicate.
KNOWN_SCHEMAS = {
    "msgx:schemas/flight_created/v1",
    "msgx:schemas/flight_updated/v1",
    "msgx:schemas/flight_deleted/v1",
    "msgx:schemas/schedule_applied/v1",
}


def headers_of(msg):
    """Kafka headers as a dict of text values (CloudEvents binary mode: UTF-8)."""
    return {k: (v.decode("utf-8") if v is not None else None) for k, v in (msg.headers() or [])}


def trace_id_of(traceparent):
    """The trace id of a W3C traceparent (`00-<trace id>-<span id>-<flags>`), or None."""
    parts = (traceparent or "").split("-")
    if len(parts) >= 4 and len(parts[1]) == 32 and parts[1] != "0" * 32:
        return parts[1]
    return None


def traced(msg, headers, topic):
    """A CONSUMER span continuing the record's trace (a no-op context without OpenTelemetry):
    its parent is the delivery span (`traceparent`), its link the message's trace
    (`ce_traceparent`)."""
    if trace is None or "traceparent" not in headers:
        return _NoSpan()
    parent = propagate.extract(headers)
    origin = propagate.extract({"traceparent": headers.get("ce_traceparent", ""),
                                "tracestate": headers.get("ce_tracestate", "")})
    origin_span = trace.get_current_span(origin).get_span_context()
    links = [Link(origin_span)] if origin_span.is_valid else []
    return trace.get_tracer("msgx-example-consumer").start_as_current_span(
        f"process {topic}", context=parent, kind=SpanKind.CONSUMER, links=links,
        attributes={"messaging.system": "kafka", "messaging.destination.name": topic,
                    "messaging.message.id": headers["ce_id"],
                    "messaging.kafka.offset": msg.offset()})


class _NoSpan:
    def __enter__(self):
        return None

    def __exit__(self, *_):
        return False


def handle(msg, headers, event):
    """The consumer's business: here, print what arrived."""
    line = {
        "ce_id": headers["ce_id"],
        "ce_source": headers["ce_source"],
        # The event's number in the producing store: ordered per key, not unique across
        # stores (never de-duplicate on it).
        "event_id": int(headers["ce_msgxevent"]),
        "type": headers["ce_type"],
        "key": msg.key().decode("utf-8"),
        "dataschema": headers.get("ce_dataschema"),
        "msg_id": event["msg_id"],
        "partition": msg.partition(),
        "offset": msg.offset(),
        # The message's trace (None while the service's tracing is off).
        "trace_id": trace_id_of(headers.get("ce_traceparent")),
    }
    if "ce_msgxoriginalid" in headers:
        # A dead letter: its own identity; the event it copies is this one.
        line["dead_letter_of"] = headers["ce_msgxoriginalid"]
    print(json.dumps(line), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", required=True, help="host:port[,host:port]")
    p.add_argument("--topic", action="append", default=None,
                   help="a topic to read (repeatable: the events and the dead-letter topic, "
                        "one de-duplication set); default msgx.flight-events")
    p.add_argument("--group", default="msgx-example-consumer")
    p.add_argument("--idle-exit", type=float, default=0.0,
                   help="stop after this many seconds without a record (0 = run until killed)")
    p.add_argument("-X", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                   help="a librdkafka consumer property (security, timeouts), repeatable")
    args = p.parse_args()

    config = {
        "bootstrap.servers": args.bootstrap,
        "group.id": args.group,
        "auto.offset.reset": "earliest",
        # Commit after handling: a crash re-reads, the de-duplication absorbs it.
        "enable.auto.commit": False,
        # Only what committed: an exactly-once round that aborted is never handled.
        "isolation.level": "read_committed",
    }
    config.update(kv.split("=", 1) for kv in args.extra)
    consumer = Consumer(config)
    assigned = []

    def on_assign(_consumer, partitions):
        assigned.append(partitions)

    consumer.subscribe(args.topic or ["msgx.flight-events"], on_assign=on_assign)
    seen = set()
    duplicates = 0
    last = time.monotonic()
    try:
        while True:
            msg = consumer.poll(0.5)
            if msg is None:
                if not assigned:
                    last = time.monotonic()  # the idle clock starts once the group has us
                elif args.idle_exit and time.monotonic() - last > args.idle_exit:
                    break
                continue
            if msg.error():
                print(f"consumer error: {msg.error()}", file=sys.stderr)
                return 1
            last = time.monotonic()
            headers = headers_of(msg)
            if headers.get("ce_dataschema") not in KNOWN_SCHEMAS:
                # A version (or type) this consumer does not handle: while v1 and v2 are
                # published side by side, each event arrives once per version.
                consumer.commit(message=msg, asynchronous=False)
                continue
            identity = (headers["ce_source"], headers["ce_id"])
            if identity in seen:
                duplicates += 1  # at-least-once: a redelivery, already handled
            else:
                with traced(msg, headers, args.topic):
                    handle(msg, headers, json.loads(msg.value()))
                seen.add(identity)
            consumer.commit(message=msg, asynchronous=False)
    finally:
        consumer.close()
    print(json.dumps({"summary": {"events": len(seen), "duplicates_skipped": duplicates}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
