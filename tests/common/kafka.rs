//! Reading topics back from a (mock) Kafka cluster, as a consumer would.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers};
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
    /// The event's number in its store (`ce_msgxevent`; a record of an older release, which
    /// had no such header, carried it as `ce_id`).
    pub fn event_id(&self) -> i64 {
        let v = self
            .headers
            .get("ce_msgxevent")
            .unwrap_or_else(|| &self.headers["ce_id"]);
        v.parse().expect("ce_msgxevent is the event id")
    }

    /// The CloudEvents id (the event's UUID).
    pub fn ce_id(&self) -> &str {
        &self.headers["ce_id"]
    }
}

/// Reads every record of `topic` from the beginning until `at_least` arrived, every partition
/// was read to its end, and no more came for a moment, as an exactly-once consumer reads
/// (`isolation.level=read_committed`; records outside transactions, the at-least-once mode's,
/// are all visible that way too). The end is the broker's partition EOF, not a quiet spell:
/// a broker that answers one partition's fetch late (tansu) once ended a read here with a
/// partition unread, and the records looked lost (issue 41's soak, seed 279182457).
pub fn consume(bootstrap: &str, topic: &str, partitions: i32, at_least: usize) -> Vec<Received> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "msgx-test-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
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
    // Partitions read to their end since their last record.
    let mut at_end = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut quiet_since = Instant::now();
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                at_end.remove(&m.partition());
                out.push(received(&m));
                quiet_since = Instant::now();
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => panic!("consumer error: {e}"),
            None => {
                let read_all = at_end.len() == partitions as usize;
                if read_all && out.len() >= at_least && quiet_since.elapsed() > QUIET {
                    break;
                }
            }
        }
    }
    out
}

/// How long no record may come before a read that reached every partition's end stops: a
/// late duplicate still being written is read too.
const QUIET: Duration = Duration::from_millis(500);

/// One record as text.
fn received(m: &BorrowedMessage<'_>) -> Received {
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
    Received {
        key: String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
        partition: m.partition(),
        offset: m.offset(),
        headers,
        payload: String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
    }
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

/// librdkafka's mock cluster held by its raw handle, for what the rdkafka wrapper does not
/// offer: the latency of chosen requests (`rd_kafka_mock_broker_push_request_error_rtts`),
/// e.g. a transaction's `EndTxn` answered only after the commit call timed out.
pub struct RawMock {
    /// The client that owns the cluster (librdkafka ties the cluster to a handle).
    _owner: rdkafka::producer::BaseProducer,
    cluster: *mut rdkafka::bindings::rd_kafka_mock_cluster_t,
}

// SAFETY: librdkafka's mock cluster API is thread-safe (it posts to the cluster's own thread).
unsafe impl Send for RawMock {}
unsafe impl Sync for RawMock {}

impl RawMock {
    /// `brokers` brokers and these topics (name, partitions).
    pub fn new(brokers: i32, topics: &[(&str, i32)]) -> Self {
        let owner: rdkafka::producer::BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .create()
            .expect("mock owner client");
        // SAFETY: the owner's handle outlives the cluster (dropped after it, see Drop).
        let cluster = unsafe {
            rdkafka::bindings::rd_kafka_mock_cluster_new(
                rdkafka::producer::Producer::client(&owner).native_ptr(),
                brokers,
            )
        };
        assert!(!cluster.is_null(), "mock cluster");
        let mock = Self {
            _owner: owner,
            cluster,
        };
        for (name, partitions) in topics {
            mock.create_topic(name, *partitions);
        }
        mock
    }

    /// Creates a topic of `partitions` partitions (replication 1).
    pub fn create_topic(&self, name: &str, partitions: i32) {
        let name = std::ffi::CString::new(name).expect("topic name");
        // SAFETY: a valid cluster; librdkafka copies the name.
        let err = unsafe {
            rdkafka::bindings::rd_kafka_mock_topic_create(
                self.cluster,
                name.as_ptr(),
                partitions,
                1,
            )
        };
        assert_eq!(
            err,
            rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR
        );
    }

    /// `host:port,…` of its brokers.
    pub fn bootstrap(&self) -> String {
        // SAFETY: a valid cluster; the string lives as long as it.
        unsafe {
            std::ffi::CStr::from_ptr(rdkafka::bindings::rd_kafka_mock_cluster_bootstraps(
                self.cluster,
            ))
        }
        .to_string_lossy()
        .into_owned()
    }

    /// The next `n` requests `api` to `broker` succeed, each answered after `rtt`.
    pub fn delay_next(
        &self,
        broker: i32,
        api: rdkafka::types::RDKafkaApiKey,
        n: usize,
        rtt: Duration,
    ) {
        let rtt_ms = std::os::raw::c_int::try_from(rtt.as_millis()).expect("rtt in ms");
        for _ in 0..n {
            // SAFETY: a valid cluster; one (error, rtt) pair per count, as the C API reads them
            // (error 0 = no error).
            unsafe {
                rdkafka::bindings::rd_kafka_mock_broker_push_request_error_rtts(
                    self.cluster,
                    broker,
                    api as i16,
                    1,
                    0 as std::os::raw::c_int,
                    rtt_ms,
                );
            }
        }
    }
}

impl Drop for RawMock {
    fn drop(&mut self) {
        // SAFETY: created by rd_kafka_mock_cluster_new and destroyed once, before its owner.
        unsafe { rdkafka::bindings::rd_kafka_mock_cluster_destroy(self.cluster) };
    }
}
