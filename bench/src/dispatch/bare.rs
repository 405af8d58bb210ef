//! The bare ceilings of `msgx-bench dispatch` (phases 2 and 3) and the broker's own latency
//! probe: a bare produce loop with the dispatcher's client settings, a bare batched `UPDATE` on a
//! scratch copy of `msg_event`, and a bare producer timed per record at a steady rate (also
//! used by `msgx-bench e2e` and the transaction probe). Apart from the dispatcher's own rounds
//! because none of it runs our code.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::future::join_all;
use msgx_actors::app::DispatchDeps;
use msgx_core::dispatch::cloudevents;
use msgx_core::kafka::producer::Outgoing;
use msgx_core::kafka::EventProducer;
use msgx_core::settings::Delivery;
use msgx_core::store::events::PendingEvent;
use msgx_core::store::Store;

use crate::report::{rate, Pacer};

/// The bare probes' producer: the dispatcher's client settings, never transactional (the
/// bare limit of the broker, whichever `kafka.delivery` the dispatcher runs).
pub(super) fn bare_producer(deps: &DispatchDeps) -> anyhow::Result<EventProducer> {
    let mut k = deps.kafka.clone();
    k.delivery = Delivery::AtLeastOnce;
    Ok(EventProducer::new(&k, &deps.bootstrap)?)
}

/// Records per second of a bare produce loop: the backlog's own rows as records, all queued
/// (librdkafka's queue bounds what is in flight), then every ack awaited.
pub(super) async fn bare_produce(
    deps: &DispatchDeps,
    store: &Store,
    n: u64,
) -> anyhow::Result<f64> {
    let rows = store
        .deliverable_events(
            chrono::Utc::now(),
            n.min(u64::from(u32::MAX)) as u32,
            &[],
            &[],
        )
        .await?;
    let producer = bare_producer(deps)?;
    // The real topic: a topic of its own might not be auto-created on a real cluster.
    let topic = deps.cfg.topic.clone();
    // Warm-up: metadata and producer id, outside the measurement.
    send_all(
        &producer,
        &topic,
        &rows[..rows.len().min(100)],
        &deps.cfg.ce_source,
    )
    .await?;
    let start = Instant::now();
    send_all(&producer, &topic, &rows, &deps.cfg.ce_source).await?;
    Ok(rate(rows.len() as u64, start.elapsed()))
}

pub(super) async fn send_all(
    producer: &EventProducer,
    topic: &str,
    rows: &[PendingEvent],
    source: &str,
) -> anyhow::Result<()> {
    let mut futures = Vec::with_capacity(rows.len());
    for ev in rows {
        let rec = Outgoing {
            topic,
            key: &ev.flight_key,
            payload: ev.payload.as_bytes(),
            timestamp_ms: ev.created_at.timestamp_millis(),
        };
        let headers = cloudevents::to_headers(&cloudevents::attributes(ev, source));
        loop {
            match producer.send(rec, headers.clone()) {
                Ok(f) => {
                    futures.push(f);
                    break;
                }
                // Queue full: let deliveries drain, as the real producer would wait.
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    }
    for r in join_all(futures).await {
        match r {
            Ok(Ok(_)) => {}
            Ok(Err((e, _))) => anyhow::bail!("bare produce failed: {e}"),
            Err(_) => anyhow::bail!("bare produce: delivery dropped"),
        }
    }
    Ok(())
}

/// Rows per second of the bare mark statement on a scratch copy of the backlog.
pub(super) async fn bare_update(store: &Store, batch: u32) -> anyhow::Result<f64> {
    let pool = store.pool();
    // Same columns and indexes as msg_event (an UPDATE pays for every index it touches).
    sqlx::query("CREATE TABLE bare_event (LIKE msg_event INCLUDING ALL)")
        .execute(pool)
        .await?;
    sqlx::query("INSERT INTO bare_event SELECT * FROM msg_event")
        .execute(pool)
        .await?;
    sqlx::query("VACUUM ANALYZE bare_event")
        .execute(pool)
        .await?;
    let ids: Vec<i64> = sqlx::query_scalar("SELECT event_id FROM bare_event ORDER BY event_id")
        .fetch_all(pool)
        .await?;
    let start = Instant::now();
    for chunk in ids.chunks(batch as usize) {
        sqlx::query(
            "UPDATE bare_event SET state = 'SENT', sent_at = now() \
             WHERE event_id = ANY($1) AND state = 'PENDING'",
        )
        .bind(chunk)
        .execute(pool)
        .await?;
    }
    let r = rate(ids.len() as u64, start.elapsed());
    sqlx::query("DROP TABLE bare_event").execute(pool).await?;
    Ok(r)
}

/// The broker's own latency at a steady rate: a bare producer (the dispatcher's client
/// settings: idempotent, acks, linger; same topic and headers) sends `rate` records a second for
/// `length`, of `payload_bytes`, over `keys` keys, each timed from `send` to its ack. What
/// commit → SENT shows beyond this is the dispatcher's (and the store's) share.
pub(crate) async fn bare_latency_probe(
    deps: &DispatchDeps,
    (rate, length): (u64, Duration),
    payload_bytes: usize,
    keys: u64,
) -> anyhow::Result<Vec<Duration>> {
    let producer = bare_producer(deps)?;
    let payload = vec![b'x'; payload_bytes];
    let topic = deps.cfg.topic.clone();
    let headers = || probe_headers(deps);
    // Warm up: a new idempotent producer fetches metadata and its producer id before its first
    // ack (hundreds of ms); timed from its first record, that start-up was the probe's p99.
    let warm = Outgoing {
        topic: &topic,
        key: "FL-WARMUP",
        payload: &payload,
        timestamp_ms: chrono::Utc::now().timestamp_millis(),
    };
    let fut = producer
        .send(warm, headers())
        .map_err(|e| anyhow::anyhow!("bare probe warm-up send: {e}"))?;
    acked(fut.await, "bare probe warm-up")?;
    let mut pacer = Pacer::new(rate as f64, length, 1.0);
    let mut pending = Vec::with_capacity(pacer.total() as usize);
    while let Some((made, n)) = pacer.next().await {
        for i in 0..n {
            let key = format!("FL{:05}", (made + i) % keys);
            let rec = Outgoing {
                topic: &topic,
                key: &key,
                payload: &payload,
                timestamp_ms: chrono::Utc::now().timestamp_millis(),
            };
            let sent = Instant::now();
            let fut = producer
                .send(rec, headers())
                .map_err(|e| anyhow::anyhow!("bare probe send: {e}"))?;
            pending.push(tokio::spawn(async move {
                let r = fut.await;
                (r, sent.elapsed())
            }));
        }
    }
    let mut lat = Vec::with_capacity(pending.len());
    for p in pending {
        let (r, took) = p.await.context("probe task")?;
        acked(r, "bare probe produce")?;
        lat.push(took);
    }
    lat.sort();
    Ok(lat)
}

/// The headers of a probe record (bare produce and bare transaction probes alike).
pub(crate) fn probe_headers(deps: &DispatchDeps) -> rdkafka::message::OwnedHeaders {
    cloudevents::to_headers(&[
        ("ce_type", "bench.probe".to_string()),
        ("ce_source", deps.cfg.ce_source.clone()),
    ])
}

/// A delivery future's result as acked, or the error saying which send (`what`) failed.
pub(crate) fn acked<T, E: std::fmt::Display, M, C>(
    delivery: Result<Result<T, (E, M)>, C>,
    what: &str,
) -> anyhow::Result<()> {
    match delivery {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((e, _))) => anyhow::bail!("{what} failed: {e}"),
        Err(_) => anyhow::bail!("{what}: delivery dropped"),
    }
}
