//! librdkafka's callbacks routed into `tracing` (structured, filtered with the rest of the
//! service's logs) instead of the `log` crate.

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;

/// The producer's (and the recovery consumer's) client context: logs only.
#[derive(Debug, Clone, Copy, Default)]
pub struct TracingContext;

impl ClientContext for TracingContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => tracing::error!(target: "librdkafka", fac, "{log_message}"),
            RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", fac, "{log_message}"),
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", fac, "{log_message}")
            }
            RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", fac, "{log_message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if matches!(error, KafkaError::PartitionEOF(_)) {
            // The recovery consumer's "end reached", which it waits for: not an error.
            return;
        }
        // Broker-down and transport errors land here while librdkafka retries on its own; the
        // dispatcher sees the consequence per event (a failed delivery), so this is a warning.
        tracing::warn!(target: "librdkafka", error = %error, reason, "kafka client error");
    }
}

impl rdkafka::consumer::ConsumerContext for TracingContext {}
