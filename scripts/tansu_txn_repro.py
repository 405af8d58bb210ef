#!/usr/bin/env python3
"""Where the brokers we test on fall short of Kafka's transactions (issue 31).

Usage: `python3 scripts/tansu_txn_repro.py 127.0.0.1:PORT` against a running broker (tansu:
`tansu broker --listener-url tcp://127.0.0.1:PORT --advertised-listener-url
tcp://127.0.0.1:PORT --storage-engine memory://tansu/`, then create topic `t1` with 3
partitions), or `python3 scripts/tansu_txn_repro.py` for librdkafka's mock cluster (started
in-process). Needs confluent-kafka.

It commits one transaction, aborts one, and leaves a third open; a second producer with the same
transactional.id initialises (as a standby that took our lease does), and the first, like a
holder thawed after SIGSTOP, appends once more and commits. Kafka refuses that append and that
commit (PRODUCER_FENCED), aborts the open transaction, and shows a `read_committed` reader
commit0..4 and new only. Measured 2026-12-03/04:
- tansu 0.6.0 fences the zombie (append and commit refused) but shows every record to
  `read_committed`, abort0..4 and the zombie's first record included (the high watermark counts
  the control records, so the markers are written; the fetch does not leave aborted records out).
- the mock cluster accepts the zombie's append and commit: an InitProducerId without a current
  producer id gets a new producer id (rd_kafka_mock_pid_new) and the old one stays valid; and
  it writes no control records, so `read_committed` shows everything too.
So the chaos suite runs exactly-once takeovers on tansu (tests/chaos/ops_broker.rs).
"""
import logging
import re
import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition


def mock_bootstrap():
    """Starts a mock cluster inside a holder producer and reads its address from the log."""
    found = []

    class Grab(logging.Handler):
        def emit(self, record):
            m = re.search(r"replaced with (\S+)", record.getMessage())
            if m:
                found.append(m.group(1))

    log = logging.getLogger("mock")
    log.addHandler(Grab())
    log.setLevel(logging.DEBUG)
    holder = Producer({"test.mock.num.brokers": 1, "bootstrap.servers": "unused:1"}, logger=log)
    holder.poll(0.5)
    return holder, found[0]


def read_back(b, iso, topic="t1", partitions=3):
    """Every record of `topic` as a reader of isolation level `iso` sees it, and the consumer
    (for the watermarks); the caller closes it."""
    c = Consumer({"bootstrap.servers": b, "group.id": "g" + iso, "isolation.level": iso,
                  "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, i, 0) for i in range(partitions)])
    got, eof, t = [], 0, time.time()
    while eof < partitions and time.time() - t < 10:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            eof += 1
            continue
        got.append(m.value().decode())
    return got, c


def committed_aborted_open(b, conf):
    """One committed transaction, one aborted, one left open with the producer returned."""
    p = Producer(conf)
    p.init_transactions(10)
    p.begin_transaction()
    for i in range(5):
        p.produce("t1", key=b"k", value=b"commit%d" % i)
    p.commit_transaction(10)
    p.begin_transaction()
    for i in range(5):
        p.produce("t1", key=b"k", value=b"abort%d" % i)
    p.flush(10)
    p.abort_transaction(10)
    p.begin_transaction()
    p.produce("t1", key=b"k", value=b"zombie")
    p.flush(10)
    return p


def main():
    holder = None
    if len(sys.argv) > 1:
        b = sys.argv[1]
    else:
        holder, b = mock_bootstrap()
    print("broker", b)
    conf = {"bootstrap.servers": b, "transactional.id": "tx-a", "enable.idempotence": True}
    p = committed_aborted_open(b, conf)
    p2 = Producer(conf)
    p2.init_transactions(10)
    got = {}
    p.produce("t1", key=b"k", value=b"zombie-after-fence",
              on_delivery=lambda e, m: got.update(append=e.name() if e else "OK"))
    p.flush(10)
    print("zombie append after the fence:", got.get("append"), "(Kafka: PRODUCER_FENCED)")
    try:
        p.commit_transaction(10)
        print("zombie committed (a broker must refuse this)")
    except Exception as e:  # noqa: BLE001 - any refusal is the expected outcome
        print("zombie commit refused:", e)
    p2.begin_transaction()
    p2.produce("t1", key=b"k", value=b"new")
    p2.commit_transaction(10)
    for iso in ["read_committed", "read_uncommitted"]:
        seen, c = read_back(b, iso)
        print(iso, seen)
        print("  watermarks", [c.get_watermark_offsets(TopicPartition("t1", i)) for i in range(3)])
        c.close()
    del holder


if __name__ == "__main__":
    main()
