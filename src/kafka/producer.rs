//! The event producer: an idempotent (`enable.idempotence=true`, `acks=all`) rdkafka
//! `FutureProducer` built from `[kafka]`, recreated when librdkafka reports a fatal error; in
//! `kafka.delivery = "exactly-once"` also transactional (`transactional.id`), with the
//! transaction calls run off the async thread (librdkafka blocks in them).

use rdkafka::client::Client;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::future_producer::FutureProducerContext;
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};

use std::time::Duration;

use super::context::TracingContext;
use crate::settings::KafkaSettings;

/// Why the producer could not be built or used.
#[derive(Debug, thiserror::Error)]
pub enum ProducerError {
    /// A `[kafka]` value librdkafka refused.
    #[error("kafka producer configuration: {0}")]
    Config(String),
    /// librdkafka could not create the client.
    #[error("kafka producer could not be created: {0}")]
    Create(#[source] KafkaError),
    /// The in-process mock cluster could not start.
    #[error("embedded kafka mock cluster: {0}")]
    Embedded(String),
    /// A transaction call failed (`fatal`: the producer is fenced or broken for good).
    #[error("kafka transaction {op}: {source}")]
    Transaction {
        /// init, begin, commit or abort.
        op: &'static str,
        /// librdkafka's error.
        #[source]
        source: KafkaError,
    },
}

impl ProducerError {
    /// True when the producer can do nothing more (fenced by a newer holder, or broken):
    /// only a new producer, after the lease is confirmed, may go on.
    pub fn is_fatal(&self) -> bool {
        let fenced = |c| {
            matches!(
                c,
                RDKafkaErrorCode::Fenced
                    | RDKafkaErrorCode::ProducerFenced
                    | RDKafkaErrorCode::InvalidProducerEpoch
            )
        };
        match self {
            ProducerError::Transaction { source, .. } => {
                txn_error(source).is_some_and(|e| e.is_fatal() || fenced(e.code()))
            }
            _ => false,
        }
    }
}

impl ProducerError {
    /// A transaction call whose outcome is not known yet (a commit that timed out): librdkafka
    /// keeps it running, and the same call may be made again to learn how it ended.
    pub fn is_retriable(&self) -> bool {
        match self {
            ProducerError::Transaction { source, .. } => {
                txn_error(source).is_some_and(|e| e.is_retriable())
            }
            _ => false,
        }
    }

    /// A transaction call that failed so that the transaction must be aborted (nothing of it
    /// becomes visible).
    pub fn requires_abort(&self) -> bool {
        match self {
            ProducerError::Transaction { source, .. } => {
                txn_error(source).is_some_and(|e| e.txn_requires_abort())
            }
            _ => false,
        }
    }
}

fn txn_error(e: &KafkaError) -> Option<&rdkafka::error::RDKafkaError> {
    match e {
        KafkaError::Transaction(t) => Some(t),
        _ => None,
    }
}

/// One record to produce.
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    /// Target topic.
    pub topic: &'a str,
    /// Partitioning key (the flight identity).
    pub key: &'a str,
    /// JSON body.
    pub payload: &'a [u8],
    /// Record timestamp, ms since the epoch (the event's creation).
    pub timestamp_ms: i64,
}

/// The idempotent producer and what is needed to rebuild it.
pub struct EventProducer {
    inner: FutureProducer<TracingContext>,
    config: ClientConfig,
    /// How many times a fatal error made us rebuild it (for logs).
    generation: u64,
}

/// The librdkafka properties for `[kafka]` with `bootstrap` as the broker list.
pub fn client_config(k: &KafkaSettings, bootstrap: &str) -> Result<ClientConfig, ProducerError> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("client.id", &k.client_id)
        // At-least-once without broker-side duplicates from internal retries, and in order
        // per partition even while retrying.
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", k.linger.as_millis().to_string())
        .set("batch.size", k.batch_bytes.to_string())
        .set("compression.type", &k.compression)
        .set(
            "message.timeout.ms",
            k.delivery_timeout.as_millis().to_string(),
        )
        .set(
            "request.timeout.ms",
            k.request_timeout.as_millis().to_string(),
        );
    security(&mut c, k);
    for (key, value) in k
        .extra_pairs()
        .map_err(|e| ProducerError::Config(e.to_string()))?
    {
        c.set(key, value);
    }
    if k.exactly_once() {
        c.set("transactional.id", k.transactional_id()).set(
            "transaction.timeout.ms",
            k.transaction_timeout.as_millis().to_string(),
        );
    } else {
        // A key's events are in flight together (`dispatch::round`): a batch the broker
        // refuses for good must fail the records queued after it too (a fatal error), or a
        // later event of the key would land before its failed predecessor is re-sent.
        c.set("enable.gapless.guarantee", "true");
    }
    Ok(c)
}

/// The connection's security properties (`security.protocol`, SASL, CA), shared with the
/// exactly-once recovery consumer.
pub fn security(c: &mut ClientConfig, k: &KafkaSettings) {
    c.set(
        "security.protocol",
        k.security_protocol.to_ascii_lowercase(),
    );
    if !k.sasl_mechanism.is_empty() {
        c.set("sasl.mechanism", &k.sasl_mechanism)
            .set("sasl.username", &k.sasl_username)
            .set("sasl.password", k.sasl_password.expose());
    }
    if !k.ssl_ca_location.is_empty() {
        c.set("ssl.ca.location", &k.ssl_ca_location);
    }
}

impl EventProducer {
    /// Builds the producer (no broker round trip: librdkafka connects in the background).
    pub fn new(k: &KafkaSettings, bootstrap: &str) -> Result<Self, ProducerError> {
        let config = client_config(k, bootstrap)?;
        Self::from_config(config)
    }

    /// Builds the producer from explicit properties (benchmarks, tests).
    pub fn from_config(config: ClientConfig) -> Result<Self, ProducerError> {
        let inner = Self::create(&config)?;
        Ok(Self {
            inner,
            config,
            generation: 0,
        })
    }

    fn create(config: &ClientConfig) -> Result<FutureProducer<TracingContext>, ProducerError> {
        config
            .create_with_context(TracingContext)
            .map_err(|e| match e {
                KafkaError::ClientConfig(..) => ProducerError::Config(e.to_string()),
                other => ProducerError::Create(other),
            })
    }

    /// Queues one record without waiting: the future resolves at the broker's ack (or the
    /// delivery timeout). Records queued for one partition are delivered in queue order.
    pub fn send(
        &self,
        rec: Outgoing<'_>,
        headers: OwnedHeaders,
    ) -> Result<DeliveryFuture, KafkaError> {
        let record = FutureRecord::to(rec.topic)
            .key(rec.key)
            .payload(rec.payload)
            .timestamp(rec.timestamp_ms)
            .headers(headers);
        self.inner.send_result(record).map_err(|(e, _)| e)
    }

    /// librdkafka's fatal error, if one was raised (idempotence sequence or epoch errors):
    /// the producer can deliver nothing more and must be rebuilt.
    pub fn fatal_error(&self) -> Option<String> {
        self.client()
            .fatal_error()
            .map(|(code, reason)| format!("{code:?}: {reason}"))
    }

    /// Rebuilds the producer after a fatal error. Records the old one had not delivered fail
    /// with it and are re-sent by the dispatcher: they may duplicate, never vanish.
    pub fn recreate(&mut self) -> Result<(), ProducerError> {
        self.inner = Self::create(&self.config)?;
        self.generation += 1;
        Ok(())
    }

    /// The librdkafka client behind the producer. Besides [`Self::fatal_error`], this is the
    /// test seam for the rebuild path: a test raises a fatal error on its native handle
    /// (`rd_kafka_test_fatal_error`, see `tests/common/kafka.rs`) exactly as a broker-caused
    /// one would be raised, which the service itself never does.
    pub fn client(&self) -> &Client<FutureProducerContext<TracingContext>> {
        self.inner.client()
    }

    /// How many times the producer was rebuilt.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// True when built with a `transactional.id` (`exactly-once`).
    pub fn transactional(&self) -> bool {
        self.config.get("transactional.id").is_some()
    }

    /// The `transactional.id` it was built with.
    pub fn transactional_id(&self) -> Option<&str> {
        self.config.get("transactional.id")
    }

    /// Rebuilds it with another `transactional.id` (the one recorded for the deployment),
    /// before `init_transactions`.
    pub fn use_transactional_id(&mut self, id: &str) -> Result<(), ProducerError> {
        if self.transactional_id() == Some(id) {
            return Ok(());
        }
        self.config.set("transactional.id", id);
        self.recreate()
    }

    /// Each partition's end of `topic`, from the broker: the scan floors recorded between
    /// transactions. librdkafka asks it `read_committed` (its default isolation), so this is
    /// the last stable offset: at or below the high watermark, and with none of our
    /// transactions open, past every record of ours. Runs off the async thread (librdkafka blocks).
    pub async fn partition_ends(
        &self,
        topic: &str,
        timeout: Duration,
    ) -> Result<Vec<(i32, i64)>, KafkaError> {
        let (p, topic) = (self.inner.clone(), topic.to_string());
        let joined = tokio::task::spawn_blocking(move || {
            let all = super::watermarks::watermarks(p.client(), &topic, timeout)?;
            Ok(all.into_iter().map(|(id, _, high)| (id, high)).collect())
        })
        .await;
        joined.unwrap_or(Err(KafkaError::Canceled))
    }

    /// `init_transactions`: fences every earlier producer with the same `transactional.id`
    /// (aborting its open transaction) and readies this one. Call only while holding the lease.
    pub async fn init_transactions(&self, timeout: Duration) -> Result<(), ProducerError> {
        self.blocking("init", move |p| p.init_transactions(timeout))
            .await
    }

    /// `begin_transaction` (local, no broker round trip).
    pub fn begin_transaction(&self) -> Result<(), ProducerError> {
        self.inner
            .begin_transaction()
            .map_err(|source| ProducerError::Transaction {
                op: "begin",
                source,
            })
    }

    /// `commit_transaction`: flushes what is queued and commits it all, or fails.
    pub async fn commit_transaction(&self, timeout: Duration) -> Result<(), ProducerError> {
        self.blocking("commit", move |p| p.commit_transaction(timeout))
            .await
    }

    /// `abort_transaction`: nothing of the open transaction becomes visible to
    /// `read_committed` readers.
    pub async fn abort_transaction(&self, timeout: Duration) -> Result<(), ProducerError> {
        self.blocking("abort", move |p| p.abort_transaction(timeout))
            .await
    }

    /// Runs a blocking transaction call on tokio's blocking pool.
    async fn blocking(
        &self,
        op: &'static str,
        f: impl FnOnce(&FutureProducer<TracingContext>) -> Result<(), KafkaError> + Send + 'static,
    ) -> Result<(), ProducerError> {
        let p = self.inner.clone();
        let joined = tokio::task::spawn_blocking(move || f(&p)).await;
        match joined {
            Ok(r) => r.map_err(|source| ProducerError::Transaction { op, source }),
            Err(e) => Err(ProducerError::Transaction {
                op,
                source: KafkaError::Canceled,
            })
            .inspect_err(|_| tracing::error!(error = %e, op, "kafka transaction call panicked")),
        }
    }

    /// Waits up to `timeout` for queued records (shutdown).
    pub fn flush(&self, timeout: std::time::Duration) -> Result<(), KafkaError> {
        self.inner.flush(timeout)
    }
}
