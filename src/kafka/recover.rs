//! What a topic already holds, read `read_committed` from given offsets to its end: the
//! exactly-once dispatcher's start-up question "which of my events did a committed transaction
//! deliver without the store knowing?" (`kafka.delivery = "exactly-once"`).
//!
//! Run after `init_transactions`: that call aborts the previous holder's open transaction, so
//! the partitions' last stable offsets have caught up with their ends and nothing still open
//! can commit later.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Message, Offset, TopicPartitionList};

use super::consumer::{ce_id, read_committed, ConsumerError};
use super::context::TracingContext;
use crate::settings::KafkaSettings;

/// One committed record of ours (its `ce_id` header) and where it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// The event id (`ce_id`).
    pub event_id: i64,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
}

/// Why the topic could not be read to its end.
#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    /// The consumer could not be assigned or read.
    #[error("kafka recovery consumer: {0}")]
    Consumer(#[from] KafkaError),
    /// The consumer could not be built.
    #[error("kafka recovery: {0}")]
    Build(#[from] ConsumerError),
    /// The end was not reached in time.
    #[error("kafka recovery: {topic} not read to its end within {limit:?}")]
    Timeout {
        /// The topic.
        topic: String,
        /// The limit.
        limit: Duration,
    },
}

/// Every record of `topic` after `after` (partition → last offset the store knows; absent:
/// from the start) up to the end, read committed. Blocking: run off the async thread.
pub fn committed_after(
    k: &KafkaSettings,
    bootstrap: &str,
    topic: &str,
    after: &HashMap<i32, i64>,
    limit: Duration,
) -> Result<Vec<Found>, RecoverError> {
    let c = read_committed(k, bootstrap, "recovery")?;
    let md = c.fetch_metadata(Some(topic), limit)?;
    let partitions: Vec<i32> = md
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    let mut tpl = TopicPartitionList::new();
    let mut ends: HashMap<i32, i64> = HashMap::new();
    for p in partitions {
        let (_, high) = c.fetch_watermarks(topic, p, limit)?;
        let start = after.get(&p).map_or(0, |o| o + 1);
        if start < high {
            let from = after
                .get(&p)
                .map_or(Offset::Beginning, |o| Offset::Offset(o + 1));
            tpl.add_partition_offset(topic, p, from)?;
            ends.insert(p, high);
        }
    }
    if ends.is_empty() {
        return Ok(Vec::new());
    }
    c.assign(&tpl)?;
    read_to_ends(&c, topic, ends, limit)
}

/// Polls until every partition in `ends` reported its end at or past its high watermark.
fn read_to_ends(
    c: &BaseConsumer<TracingContext>,
    topic: &str,
    mut ends: HashMap<i32, i64>,
    limit: Duration,
) -> Result<Vec<Found>, RecoverError> {
    let start = Instant::now();
    let mut out = Vec::new();
    while !ends.is_empty() {
        if start.elapsed() > limit {
            return Err(RecoverError::Timeout {
                topic: topic.to_string(),
                limit,
            });
        }
        match c.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                if let Some(event_id) = ce_id(&m) {
                    out.push(Found {
                        event_id,
                        partition: m.partition(),
                        offset: m.offset(),
                    });
                }
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                // read_committed: the end is the last stable offset; after init_transactions
                // nothing of ours is open, so it reaches the high watermark.
                let pos = position(c, topic, p);
                if ends.get(&p).is_some_and(|high| pos >= *high) {
                    ends.remove(&p);
                }
            }
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
    Ok(out)
}

fn position(c: &BaseConsumer<TracingContext>, topic: &str, p: i32) -> i64 {
    c.position()
        .ok()
        .and_then(|tpl| {
            tpl.find_partition(topic, p)
                .and_then(|e| e.offset().to_raw())
        })
        .unwrap_or(-1)
}
