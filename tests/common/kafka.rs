//! Reading topics back from a (mock) Kafka cluster, as a consumer would.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Headers;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

/// One record read back.
#[derive(Debug, Clone)]
pub struct Received {
    /// Record key.
    pub key: String,
    /// Partition it was read from.
    pub partition: i32,
    /// Its offset there.
    pub offset: i64,
    /// Headers as text.
    pub headers: HashMap<String, String>,
    /// Value as text.
    pub payload: String,
}

impl Received {
    /// The CloudEvents id (our event id).
    pub fn ce_id(&self) -> i64 {
        self.headers["ce_id"]
            .parse()
            .expect("ce_id is the event id")
    }
}

/// Reads every record of `topic` from the beginning until `at_least` arrived and no more came
/// for a moment, as an exactly-once consumer reads (`isolation.level=read_committed`; records
/// outside transactions, the at-least-once mode's, are all visible that way too).
pub fn consume(bootstrap: &str, topic: &str, partitions: i32, at_least: usize) -> Vec<Received> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "msgx-test-reader")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("partition");
    }
    consumer.assign(&tpl).expect("assign");
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut quiet_since = Instant::now();
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let headers = m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|x| {
                                let v = x.value.map(|v| String::from_utf8_lossy(v).into_owned());
                                (x.key.to_string(), v.unwrap_or_default())
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                out.push(Received {
                    key: String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
                    partition: m.partition(),
                    offset: m.offset(),
                    headers,
                    payload: String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
                });
                quiet_since = Instant::now();
            }
            Some(Err(e)) => panic!("consumer error: {e}"),
            None => {
                if out.len() >= at_least && quiet_since.elapsed() > Duration::from_millis(500) {
                    break;
                }
            }
        }
    }
    out
}

/// Raises a fatal error inside the producer's librdkafka exactly as a broker-caused one would
/// be raised (`rd_kafka_test_fatal_error`), to test the rebuild path.
pub fn inject_fatal_error(producer: &msgx_core::kafka::EventProducer, reason: &str) {
    let reason = std::ffi::CString::new(reason).expect("a reason without NUL");
    // SAFETY: the client pointer is valid while `producer` is borrowed; librdkafka copies the
    // reason string before returning.
    unsafe {
        rdkafka::bindings::rd_kafka_test_fatal_error(
            producer.client().native_ptr(),
            rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
            reason.as_ptr(),
        );
    }
}
