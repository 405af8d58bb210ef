//! The Kafka adapter: producer configuration from `[kafka]`, the idempotent event producer,
//! the `read_committed` consumer that reads our topics back (start-up recovery, `verify
//! --kafka`), each partition's watermarks (`watermarks`), and the in-process mock cluster behind
//! `kafka.brokers = "embedded"`.
//!
//! Like the store adapters this holds no decisions: which event goes when is
//! the dispatcher's business (`dispatch`).

pub mod consumer;
pub mod context;
pub mod embedded;
pub mod producer;
pub mod recover;
pub mod watermarks;

pub use embedded::EmbeddedCluster;
pub use producer::{EventProducer, ProducerError};
