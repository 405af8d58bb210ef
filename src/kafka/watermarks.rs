//! Where each partition of a topic begins and ends, asked of the broker through any of our
//! clients: the recovery's consumer (where to read) and the producer (the scan floors recorded
//! between transactions).

use std::time::Duration;

use rdkafka::client::{Client, ClientContext};
use rdkafka::error::KafkaResult;

/// Each partition of `topic` with its first offset and its end (low and high watermarks). A
/// topic the broker does not know has none. Blocking: run off the async thread.
pub fn watermarks<C: ClientContext>(
    client: &Client<C>,
    topic: &str,
    timeout: Duration,
) -> KafkaResult<Vec<(i32, i64, i64)>> {
    let md = client.fetch_metadata(Some(topic), timeout)?;
    let partitions: Vec<i32> = md
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    partitions
        .into_iter()
        .map(|p| {
            let (low, high) = client.fetch_watermarks(topic, p, timeout)?;
            Ok((p, low, high))
        })
        .collect()
}
