#!/usr/bin/env python3
"""tansu answers PRODUCER_FENCED to an idempotent (non-transactional) producer after a topic
outage (issue 31, the ending of the reverted overlapping sends, 3128459).

Usage: start tansu (see scripts/tansu_txn_repro.py), create topic `ev` (3 partitions), then
`python3 scripts/tansu_fenced_repro.py 127.0.0.1:PORT /path/to/tansu`.

One idempotent producer (acks=all) keeps producing while the topic is deleted and created
again. Measured on tansu 0.6.0, 2026-12-03:
    before    {'OK': 2900}
    deleted   {'OK': 16100}        <- tansu acks writes to the deleted topic
    recreated {'UNKNOWN': 20, 'PRODUCER_FENCED': 11860}
    new producer {'OK': 12, 'UNKNOWN': 18}
A Kafka broker would answer UNKNOWN_TOPIC_OR_PARTITION while the topic is gone and then
UNKNOWN_PRODUCER_ID / OUT_OF_ORDER_SEQUENCE_NUMBER for the reset partition state, which
librdkafka handles by bumping the epoch; PRODUCER_FENCED is fatal for an idempotent producer.
"""
import subprocess
import sys
import time

from confluent_kafka import Producer

b=sys.argv[1]; tb=sys.argv[2]
errs={}
def cb(err,msg):
    k=str(err.name() if err else 'OK'); errs[k]=errs.get(k,0)+1
p=Producer({'bootstrap.servers':b,'enable.idempotence':True,'acks':'all','linger.ms':1,'message.timeout.ms':2000,'request.timeout.ms':1000,'allow.auto.create.topics':False})
def run(sec):
    t=time.time()
    while time.time()-t<sec:
        for i in range(20): p.produce('ev', key=b'k%d'%(i%5), value=b'x', on_delivery=cb)
        p.poll(0.02)
run(1); p.flush(5); print('before', errs); errs.clear()
subprocess.run([tb,'topic','delete','--broker','tcp://'+b,'ev'])
run(3); p.flush(5); print('deleted', errs); errs.clear()
subprocess.run([tb,'topic','create','--broker','tcp://'+b,'--partitions','3','ev'],check=True)
time.sleep(1)
run(2); p.flush(5); print('recreated', errs); errs.clear()
p2=Producer({'bootstrap.servers':b,'enable.idempotence':True,'acks':'all','linger.ms':1,'message.timeout.ms':2000})
for i in range(30): p2.produce('ev', key=b'k%d'%(i%5), value=b'x', on_delivery=cb)
p2.flush(10); print('new producer', errs)
