//! The Kafka adapter: producer configuration from `[kafka]`, the idempotent event producer,
//! and the in-process mock cluster behind `kafka.brokers = "embedded"`.
//!
//! Like the store adapters this holds no decisions: which event goes when is
//! [`crate::dispatch`]'s business.

pub mod context;
pub mod embedded;
pub mod producer;
pub mod recover;

pub use embedded::EmbeddedCluster;
pub use producer::{EventProducer, ProducerError};
