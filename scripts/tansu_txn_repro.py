#!/usr/bin/env python3
"""Where tansu's transactions fall short for exactly-once delivery (issue 31).

Usage: start tansu (`tansu broker --listener-url tcp://127.0.0.1:PORT --advertised-listener-url
tcp://127.0.0.1:PORT --storage-engine memory://tansu/`), create topic `t1` with 3 partitions,
then `python3 scripts/tansu_txn_repro.py 127.0.0.1:PORT` (needs confluent-kafka).

It commits one transaction, aborts one, and leaves a third open while a second producer with the
same transactional.id fences the first (init_transactions aborts the open one). A Kafka broker
shows a `read_committed` reader commit0..4 and new only. tansu 0.6.0 shows every record,
abort0..4 and zombie included (measured 2026-12-03: the high watermark is 16 = 12 records + 4
control records, so the markers are written, but the fetch does not leave the aborted records
out for read_committed).
"""
import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition

b = sys.argv[1]
conf = {"bootstrap.servers": b, "transactional.id": "tx-a", "enable.idempotence": True}
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
# A zombie: its transaction is open when the next producer of the same id starts.
p.begin_transaction()
p.produce("t1", key=b"k", value=b"zombie")
p.flush(10)
p2 = Producer(conf)
p2.init_transactions(10)
try:
    p.commit_transaction(10)
    print("zombie committed (a broker must refuse this)")
except Exception as e:  # noqa: BLE001 - any refusal is the expected outcome
    print("zombie commit refused:", e)
p2.begin_transaction()
p2.produce("t1", key=b"k", value=b"new")
p2.commit_transaction(10)
for iso in ["read_committed", "read_uncommitted"]:
    c = Consumer({"bootstrap.servers": b, "group.id": "g" + iso, "isolation.level": iso,
                  "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition("t1", i, 0) for i in range(3)])
    got, eof, t = [], 0, time.time()
    while eof < 3 and time.time() - t < 10:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            eof += 1
            continue
        got.append(m.value().decode())
    print(iso, got)
    print("  watermarks", [c.get_watermark_offsets(TopicPartition("t1", i)) for i in range(3)])
    c.close()
