//! What a topic already holds, read `read_committed` from given offsets to its end: the
//! exactly-once dispatcher's start-up question "which of my events did a committed transaction
//! deliver without the store knowing?" (`kafka.delivery = "exactly-once"`).
//!
//! Run after `init_transactions`: that call aborts the previous holder's open transaction, so
//! the partitions' last stable offsets have caught up with their ends and nothing still open
//! can commit later. Where each partition's read starts is the caller's durable cursor (the
//! scan floor and the highest offset written SENT): never the partition's beginning.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Message, Offset, TopicPartitionList};

use super::consumer::{read_committed, ConsumerError, RecordIdentity};
use super::context::TracingContext;
use super::watermarks::watermarks;
use crate::settings::KafkaSettings;

/// One committed record read, whoever wrote it, and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// What it says of its event.
    pub identity: RecordIdentity,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
}

/// What one scan of a topic read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scan {
    /// Every committed record read.
    pub found: Vec<Found>,
    /// Each partition's end when the scan began: the floors to record once what was found is
    /// written.
    pub ends: Vec<(i32, i64)>,
    /// Partitions whose end lay below where the scan was to start: the topic was recreated or
    /// truncated, so they were read from their first offset.
    pub recreated: Vec<i32>,
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
    /// Records the scan must read are gone (retention deleted them first): events of ours
    /// committed there cannot be told from undelivered ones, so delivery stops here.
    #[error(
        "kafka recovery: {topic} partition {partition} starts at offset {log_start}, but \
         records from offset {from} had to be read (retention deleted them first): events \
         committed there cannot be told from undelivered ones, so delivery stops; to re-send \
         them (consumers drop duplicates by ce_id) set that partition's floor to {log_start} \
         (docs/operations.md, \"How a start knows what Kafka holds\")"
    )]
    Gap {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// Where the scan had to start.
        from: i64,
        /// The partition's first offset now.
        log_start: i64,
    },
}

/// Every committed record of `topic` from each partition's start to its end. A partition's
/// start is the higher of `floors` and one past `recorded` (the highest offset written SENT or
/// DEAD); with neither, nothing of ours can be there and it is not read. Blocking: run off the
/// async thread.
pub fn scan(
    k: &KafkaSettings,
    bootstrap: &str,
    topic: &str,
    floors: &HashMap<i32, i64>,
    recorded: &HashMap<i32, i64>,
    limit: Duration,
) -> Result<Scan, RecoverError> {
    let c = read_committed(k, bootstrap, "recovery")?;
    let mut out = Scan::default();
    let mut tpl = TopicPartitionList::new();
    let mut ends: HashMap<i32, i64> = HashMap::new();
    for (p, low, high) in watermarks(c.client(), topic, limit)? {
        out.ends.push((p, high));
        let start = [floors.get(&p).copied(), recorded.get(&p).map(|o| o + 1)]
            .into_iter()
            .flatten()
            .max();
        let from = match start {
            None => continue,
            Some(s) if s > high => {
                out.recreated.push(p);
                low
            }
            Some(s) if s < low => {
                return Err(RecoverError::Gap {
                    topic: topic.to_string(),
                    partition: p,
                    from: s,
                    log_start: low,
                })
            }
            Some(s) => s,
        };
        if from < high {
            tpl.add_partition_offset(topic, p, Offset::Offset(from))?;
            ends.insert(p, high);
        }
    }
    if !ends.is_empty() {
        c.assign(&tpl)?;
        out.found = read_to_ends(&c, topic, ends, limit)?;
    }
    Ok(out)
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
            Some(Ok(m)) => out.push(Found {
                identity: RecordIdentity::of(&m),
                partition: m.partition(),
                offset: m.offset(),
            }),
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
