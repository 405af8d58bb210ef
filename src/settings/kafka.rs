//! `[kafka]` (where events go) and `[dispatch]` (how the dispatcher drains `MSG_EVENT`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::secret::{redact_pair, Secret, SecretPairs};
use super::{check_nonzero, check_retries, duration, invalid, SettingsError};

/// Kafka: the broker, topics, producer tuning and security pass-through.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSettings {
    /// Bootstrap list `host:port[,host:port]`, or `embedded` for librdkafka's in-process mock
    /// cluster (dev and demo only: nothing it holds survives the process); empty (the default)
    /// = not set, which `run` refuses.
    pub brokers: String,
    /// Topic the flight events go to.
    pub topic: String,
    /// Topic exhausted events are copied to, with the error (then `MSG_EVENT` is DEAD).
    pub dlq_topic: String,
    /// `client.id`, shown in broker logs and quotas.
    pub client_id: String,
    /// CloudEvents `ce_source` of every event (a URI reference naming this service instance).
    pub ce_source: String,
    /// `linger.ms`: how long the producer waits to fill a batch (latency vs throughput).
    #[serde(with = "duration")]
    pub linger: Duration,
    /// `batch.size` in bytes.
    pub batch_bytes: u32,
    /// `compression.type`: none | gzip | snappy | lz4.
    pub compression: String,
    /// `message.timeout.ms`: a send not acknowledged by then fails and the event backs off.
    #[serde(with = "duration")]
    pub delivery_timeout: Duration,
    /// `request.timeout.ms`: one produce request's ack timeout.
    #[serde(with = "duration")]
    pub request_timeout: Duration,
    /// `security.protocol`: plaintext | ssl | sasl_plaintext | sasl_ssl.
    pub security_protocol: String,
    /// `sasl.mechanism` ("" = none): PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512.
    pub sasl_mechanism: String,
    /// `sasl.username`.
    pub sasl_username: String,
    /// `sasl.password`; never printed.
    pub sasl_password: Secret,
    /// `ssl.ca.location` ("" = system default).
    pub ssl_ca_location: String,
    /// Any other librdkafka property, `key=value;key=value` (e.g. `ssl.certificate.location=…`).
    /// Values of keys containing `password` or `secret` are never printed.
    pub extra: Secret<SecretPairs>,
    /// `at-least-once` (default: idempotent producer, consumers de-duplicate on `ce_id`) or
    /// `exactly-once` (one Kafka transaction per dispatch round; readers set
    /// `isolation.level=read_committed`).
    #[serde(default)]
    pub delivery: Delivery,
    /// `transactional.id` in `exactly-once` mode ("" = `<client_id>.<topic>`): stable for the
    /// site, so the next lease holder's producer fences the previous one's.
    #[serde(default)]
    pub transactional_id: String,
    /// `transaction.timeout.ms` in `exactly-once` mode: the broker aborts a transaction left
    /// open longer (a frozen or dead holder's); at least `delivery_timeout`.
    #[serde(with = "duration", default = "default_transaction_timeout")]
    pub transaction_timeout: Duration,
    /// `exactly-once`: how long the start-up recovery waits for another producer's open
    /// transaction that holds a partition's last stable offset below records of ours (the
    /// broker's `transaction.max.timeout.ms`: no transaction stays open longer).
    #[serde(with = "duration", default = "default_open_transaction_wait")]
    pub open_transaction_wait: Duration,
}

/// How events reach Kafka (`kafka.delivery`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Delivery {
    /// Idempotent producer; a crash between the ack and SENT re-sends (a duplicate).
    #[default]
    AtLeastOnce,
    /// Transactional producer; a round is one transaction, recovered from Kafka at start.
    ExactlyOnce,
}

impl Delivery {
    /// The setting's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Delivery::AtLeastOnce => "at-least-once",
            Delivery::ExactlyOnce => "exactly-once",
        }
    }
}

fn default_transaction_timeout() -> Duration {
    Duration::from_secs(60)
}

/// Kafka's default `transaction.max.timeout.ms` (15 minutes).
fn default_open_transaction_wait() -> Duration {
    Duration::from_secs(15 * 60)
}

/// The dispatcher's draining rules.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DispatchSettings {
    /// Events read per round (all produced concurrently across keys, in order within a key).
    pub batch: u32,
    /// How often the dispatcher looks for events when nobody woke it (a safety net).
    #[serde(with = "duration")]
    pub idle_poll: Duration,
    /// First retry delay after a failed send (doubles per attempt).
    #[serde(with = "duration")]
    pub retry_initial: Duration,
    /// Longest retry delay.
    #[serde(with = "duration")]
    pub retry_max: Duration,
    /// Failed sends after which the event is copied to the dead-letter topic and marked DEAD.
    pub max_attempts: i32,
    /// `exactly-once`: how often, at most, the recovery's scan floors move up to the topics'
    /// ends between rounds (a start then reads at most what came since).
    #[serde(with = "duration", default = "default_scan_floor_every")]
    pub scan_floor_every: Duration,
}

fn default_scan_floor_every() -> Duration {
    Duration::from_secs(30)
}

impl KafkaSettings {
    /// True when the in-process mock cluster is asked for.
    pub fn is_embedded(&self) -> bool {
        self.brokers.trim() == "embedded"
    }

    /// True in `exactly-once` mode.
    pub fn exactly_once(&self) -> bool {
        self.delivery == Delivery::ExactlyOnce
    }

    /// The producer's `transactional.id` before the store is asked: the configured one, else
    /// [`Self::default_transactional_id`]. The exactly-once start then uses the one recorded
    /// for the deployment (`dispatch::txn::use_deployment_id`).
    pub fn transactional_id(&self) -> String {
        match self.transactional_id.trim() {
            "" => self.default_transactional_id(),
            id => id.to_string(),
        }
    }

    /// `<client_id>.<topic>`: recorded as the deployment's id at its first exactly-once start
    /// when `transactional_id` is not set; every later holder uses the recorded one, whatever
    /// its own `client_id`.
    pub fn default_transactional_id(&self) -> String {
        format!("{}.{}", self.client_id.trim(), self.topic)
    }

    /// `extra` as key/value pairs.
    pub fn extra_pairs(&self) -> Result<Vec<(String, String)>, SettingsError> {
        let mut out = Vec::new();
        for part in self
            .extra
            .expose()
            .split(';')
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            let Some((k, v)) = part.split_once('=') else {
                return Err(invalid(
                    "kafka.extra",
                    format!("`{}` is not key=value", redact_pair(part)),
                ));
            };
            let k = k.trim();
            if k.is_empty()
                || !k
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '_')
            {
                return Err(invalid(
                    "kafka.extra",
                    format!("`{k}` is not a property name"),
                ));
            }
            if let Some(why) = guarantee_key(k) {
                return Err(invalid(
                    "kafka.extra",
                    format!("`{k}` may not be set here: {why}"),
                ));
            }
            out.push((k.to_string(), v.trim().to_string()));
        }
        Ok(out)
    }

    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        self.check_brokers()?;
        check_topic(&self.topic, "kafka.topic")?;
        check_topic(&self.dlq_topic, "kafka.dlq_topic")?;
        if self.topic == self.dlq_topic {
            return Err(invalid("kafka.dlq_topic", "must differ from kafka.topic"));
        }
        if self.client_id.trim().is_empty() {
            return Err(invalid("kafka.client_id", "empty"));
        }
        if self.ce_source.trim().is_empty() {
            return Err(invalid(
                "kafka.ce_source",
                "empty (CloudEvents requires a source)",
            ));
        }
        self.check_producer()?;
        self.check_security()?;
        self.extra_pairs()?;
        Ok(())
    }

    fn check_brokers(&self) -> Result<(), SettingsError> {
        let brokers = self.brokers.trim();
        // Unset: operator commands need no Kafka; `run` refuses to start without it
        // (msgx_actors::first_start, issue 30: no silent in-process default).
        if brokers.is_empty() || self.is_embedded() {
            return Ok(());
        }
        for b in brokers.split(',') {
            let b = b.trim();
            let ok = b
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            if !ok {
                return Err(invalid(
                    "kafka.brokers",
                    format!("`{b}` is not host:port (or use `embedded`)"),
                ));
            }
        }
        Ok(())
    }

    /// Producer tuning: linger, batch size, compression, timeouts.
    fn check_producer(&self) -> Result<(), SettingsError> {
        if self.linger > Duration::from_secs(5) {
            return Err(invalid("kafka.linger", "longer than 5s"));
        }
        if self.batch_bytes < 1024 {
            return Err(invalid("kafka.batch_bytes", "below 1024 bytes"));
        }
        if !matches!(
            self.compression.as_str(),
            "none" | "gzip" | "snappy" | "lz4"
        ) {
            return Err(invalid(
                "kafka.compression",
                format!("`{}` is not none, gzip, snappy or lz4", self.compression),
            ));
        }
        check_nonzero(self.delivery_timeout, "kafka.delivery_timeout")?;
        check_nonzero(self.request_timeout, "kafka.request_timeout")?;
        if self.request_timeout > self.delivery_timeout {
            return Err(invalid(
                "kafka.request_timeout",
                "longer than kafka.delivery_timeout",
            ));
        }
        // librdkafka refuses message.timeout.ms above transaction.timeout.ms.
        if self.exactly_once() && self.transaction_timeout < self.delivery_timeout {
            return Err(invalid(
                "kafka.transaction_timeout",
                "shorter than kafka.delivery_timeout",
            ));
        }
        check_nonzero(self.open_transaction_wait, "kafka.open_transaction_wait")?;
        if self.transactional_id.trim().len() > 200 {
            return Err(invalid(
                "kafka.transactional_id",
                "longer than 200 characters",
            ));
        }
        Ok(())
    }

    /// The security protocol and the SASL mechanism it needs (or must not have).
    fn check_security(&self) -> Result<(), SettingsError> {
        let proto = self.security_protocol.to_ascii_lowercase();
        if !matches!(
            proto.as_str(),
            "plaintext" | "ssl" | "sasl_plaintext" | "sasl_ssl"
        ) {
            return Err(invalid(
                "kafka.security_protocol",
                format!(
                    "`{}` is not plaintext, ssl, sasl_plaintext or sasl_ssl",
                    self.security_protocol
                ),
            ));
        }
        let sasl = proto.starts_with("sasl");
        if sasl
            && !matches!(
                self.sasl_mechanism.as_str(),
                "PLAIN" | "SCRAM-SHA-256" | "SCRAM-SHA-512"
            )
        {
            return Err(invalid(
                "kafka.sasl_mechanism",
                "a sasl_* protocol needs PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512",
            ));
        }
        if !sasl && !self.sasl_mechanism.is_empty() {
            return Err(invalid(
                "kafka.sasl_mechanism",
                "set, but kafka.security_protocol is not sasl_*",
            ));
        }
        Ok(())
    }
}

impl DispatchSettings {
    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        if self.batch == 0 || self.batch > 10_000 {
            return Err(invalid("dispatch.batch", "outside 1..=10000"));
        }
        check_nonzero(self.idle_poll, "dispatch.idle_poll")?;
        check_nonzero(self.scan_floor_every, "dispatch.scan_floor_every")?;
        if self.scan_floor_every > Duration::from_secs(3600) {
            return Err(invalid("dispatch.scan_floor_every", "longer than 1h"));
        }
        check_retries(
            [
                "dispatch.retry_initial",
                "dispatch.retry_max",
                "dispatch.max_attempts",
            ],
            self.retry_initial,
            self.retry_max,
            self.max_attempts,
        )
    }
}

/// Properties `kafka.extra` may not set, with why: they would weaken at-least-once delivery
/// or per-key order (the producer is always idempotent with `acks=all`) or the broker
/// connection's TLS, or they are ours.
const GUARANTEE_KEYS: &[(&str, &str)] = &[
    ("enable.idempotence", "the producer is always idempotent"),
    ("acks", "the producer always waits for acks=all"),
    (
        "request.required.acks",
        "the producer always waits for acks=all",
    ),
    ("enable.gapless.guarantee", "set by the idempotent producer"),
    (
        "max.in.flight.requests.per.connection",
        "bounded by the idempotent producer (per-key order)",
    ),
    (
        "max.in.flight",
        "bounded by the idempotent producer (per-key order)",
    ),
    (
        "retries",
        "librdkafka's retries keep per-key order only as configured here",
    ),
    (
        "message.send.max.retries",
        "librdkafka's retries keep per-key order only as configured here",
    ),
    ("transactional.id", "use kafka.transactional_id"),
    ("transaction.timeout.ms", "use kafka.transaction_timeout"),
    (
        "partitioner",
        "the key → partition mapping keeps per-key order; changing it reorders",
    ),
    (
        "delivery.report.only.error",
        "SENT is written from the delivery reports",
    ),
    ("bootstrap.servers", "use kafka.brokers"),
    ("metadata.broker.list", "use kafka.brokers"),
    ("message.timeout.ms", "use kafka.delivery_timeout"),
    ("delivery.timeout.ms", "use kafka.delivery_timeout"),
    // The exactly-once recovery and `verify --kafka` read our topics back: what they read
    // must be what committed, from where they say, with nothing committed to a group.
    (
        "isolation.level",
        "the recovery and verify --kafka read only committed records (read_committed)",
    ),
    (
        "enable.auto.commit",
        "the recovery consumer assigns its partitions and commits nothing",
    ),
    (
        "auto.offset.reset",
        "the recovery reads from the offsets it chose",
    ),
    (
        "enable.partition.eof",
        "the recovery stops at each partition's end",
    ),
    (
        "group.id",
        "the recovery consumer's group is named by the service",
    ),
    // Issue 55: TLS and credentials have their own keys, which the start-up TLS check reads;
    // set here they would override those keys after the fact (and could turn verification
    // off without a word).
    (
        "security.protocol",
        "use kafka.security_protocol (the start-up TLS check reads it)",
    ),
    ("ssl.ca.location", "use kafka.ssl_ca_location"),
    (
        "enable.ssl.certificate.verification",
        "the broker's certificate is always verified",
    ),
    (
        "ssl.endpoint.identification.algorithm",
        "the broker's host name is always checked against its certificate (https)",
    ),
    ("sasl.mechanism", "use kafka.sasl_mechanism"),
    ("sasl.mechanisms", "use kafka.sasl_mechanism"),
    ("sasl.username", "use kafka.sasl_username"),
    ("sasl.password", "use kafka.sasl_password"),
];

/// Why `k` may not be set through `kafka.extra`, if it may not.
fn guarantee_key(k: &str) -> Option<&'static str> {
    let k = k.to_ascii_lowercase();
    GUARANTEE_KEYS
        .iter()
        .find(|(name, _)| *name == k)
        .map(|(_, why)| *why)
}

fn check_topic(t: &str, key: &'static str) -> Result<(), SettingsError> {
    let ok = !t.is_empty()
        && t.len() <= 249
        && t != "."
        && t != ".."
        && t.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(invalid(
            key,
            format!("`{t}` is not a Kafka topic name ([a-zA-Z0-9._-], 1..=249)"),
        ))
    }
}

#[cfg(test)]
mod tests;
