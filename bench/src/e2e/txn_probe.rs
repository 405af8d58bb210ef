//! The broker's floor for one Kafka transaction (`kafka.delivery = exactly-once`): a bare
//! transactional producer, with the dispatcher's settings and its own `transactional.id`, runs
//! transactions of one record back to back — `begin` → produce → ack → `commit`, as a round
//! does — and each is timed
//! from `begin` to the commit's return. A transaction costs the protocol's serial requests
//! (`AddPartitionsToTxn`, `Produce`, `EndTxn`), so this is what the exactly-once dispatcher's
//! round can never beat; an event processed just after a round began waits for that round and
//! then its own, about twice this floor (docs/performance.md, "Exactly-once delivery").

use std::time::{Duration, Instant};

use anyhow::Context as _;
use msgx_actors::app::DispatchDeps;
use msgx_core::kafka::producer::Outgoing;
use msgx_core::kafka::EventProducer;
use msgx_core::settings::Delivery;

/// Pause between two probe transactions: the probe stays a light load beside the service.
const GAP: Duration = Duration::from_millis(10);

/// Runs `count` one-record transactions; returns their begin → commit times, sorted.
pub(crate) async fn bare_txn_probe(
    deps: &DispatchDeps,
    count: usize,
    payload_bytes: usize,
) -> anyhow::Result<Vec<Duration>> {
    let mut k = deps.kafka.clone();
    k.delivery = Delivery::ExactlyOnce;
    // Its own id: the service's producer must not be fenced by the probe.
    k.transactional_id = format!("{}.bench-probe", k.transactional_id());
    let producer = EventProducer::new(&k, &deps.bootstrap)?;
    let timeout = k.transaction_timeout;
    producer
        .init_transactions(timeout)
        .await
        .context("bare transaction probe: init_transactions")?;
    let payload = vec![b'x'; payload_bytes];
    // The first transaction also looks the partitions' leaders up: warm-up, not timed.
    one(&producer, deps, &payload, "FL-WARMUP", timeout).await?;
    let mut lat = Vec::with_capacity(count);
    for i in 0..count {
        let key = format!("FL{:05}", i % 1500);
        lat.push(one(&producer, deps, &payload, &key, timeout).await?);
        tokio::time::sleep(GAP).await;
    }
    lat.sort();
    Ok(lat)
}

/// One transaction of one record: begin → produce → commit, timed.
async fn one(
    producer: &EventProducer,
    deps: &DispatchDeps,
    payload: &[u8],
    key: &str,
    timeout: Duration,
) -> anyhow::Result<Duration> {
    let began = Instant::now();
    producer.begin_transaction()?;
    let rec = Outgoing {
        topic: &deps.cfg.topic,
        key,
        payload,
        timestamp_ms: chrono::Utc::now().timestamp_millis(),
    };
    let ack = producer
        .send(rec, crate::dispatch::probe_headers(deps))
        .map_err(|e| anyhow::anyhow!("bare transaction probe send: {e}"))?;
    // As the dispatcher's round does: the ack first, then the commit (committing with the
    // record still queued measured a fixed ~100 ms more in librdkafka, not the broker).
    crate::dispatch::acked(ack.await, "bare transaction probe produce")?;
    producer
        .commit_transaction(timeout)
        .await
        .context("bare transaction probe: commit")?;
    Ok(began.elapsed())
}
