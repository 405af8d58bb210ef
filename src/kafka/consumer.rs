//! Reading our own topics back: a `read_committed` consumer with `[kafka]`'s connection and
//! security settings that assigns its partitions itself (no group commits), and the event id a
//! record carries in `ce_id`. The exactly-once start-up recovery (`recover`) and
//! `verify --kafka` read with it.

use rdkafka::consumer::BaseConsumer;
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers};
use rdkafka::{ClientConfig, Message};

use super::context::TracingContext;
use super::producer::{security, ProducerError};
use crate::settings::KafkaSettings;

/// Why the consumer could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    /// librdkafka refused the configuration or could not create the client.
    #[error("kafka consumer: {0}")]
    Kafka(#[from] KafkaError),
    /// `kafka.extra` could not be read.
    #[error(transparent)]
    Config(#[from] ProducerError),
}

/// A `read_committed` consumer named `<client_id>-<purpose>` (group
/// `<transactional_id>-<purpose>`, never committed: the ACLs of docs/operations.md), reporting
/// each partition's end (`PartitionEOF`) and reading from the start of a partition whose start
/// offset retention deleted. Only what a transaction committed is read: an aborted round's
/// records are never taken for delivered ones.
pub fn read_committed(
    k: &KafkaSettings,
    bootstrap: &str,
    purpose: &str,
) -> Result<BaseConsumer<TracingContext>, ConsumerError> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("client.id", format!("{}-{purpose}", k.client_id))
        .set("group.id", format!("{}-{purpose}", k.transactional_id()))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed");
    security(&mut c, k);
    for (key, value) in k
        .extra_pairs()
        .map_err(|e| ProducerError::Config(e.to_string()))?
    {
        c.set(key, value);
    }
    Ok(c.create_with_context(TracingContext)?)
}

/// The event id a record of ours carries in its `ce_id` header.
pub fn ce_id(m: &BorrowedMessage<'_>) -> Option<i64> {
    m.headers()?
        .iter()
        .find(|h| h.key == "ce_id")
        .and_then(|h| h.value)
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.parse().ok())
}
