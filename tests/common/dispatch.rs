//! The dispatcher's deps as the tests against a broker use them: quick Kafka timeouts and
//! retries, built from the settings like the service builds them; events seeded as the pump
//! commits them; rounds driven as the dispatcher drives them ([`super::dispatch_round`]) on the
//! env's store and clock.

use std::time::Duration;

use msgx_actors::app::DispatchDeps;
use msgx_core::clock::Clock;
use msgx_core::dispatch::{DispatchConfig, DispatchState};
use msgx_core::kafka::EventProducer;

use super::dispatch_round::{round, Round};
use super::TestEnv;

/// Overrides under which an event the broker keeps refusing goes DEAD quickly (two attempts,
/// short Kafka timeouts).
pub const EXHAUST_FAST: &[(&str, &str)] = &[
    ("MSGX_DISPATCH__MAX_ATTEMPTS", "2"),
    ("MSGX_KAFKA__DELIVERY_TIMEOUT", "1s"),
    ("MSGX_KAFKA__REQUEST_TIMEOUT", "500ms"),
];

impl TestEnv {
    /// Dispatch deps for this env and broker, with `MSGX_*` overrides.
    pub fn dispatch_deps(&self, bootstrap: &str, extra: &[(&str, &str)]) -> DispatchDeps {
        let mut all = vec![
            ("MSGX_KAFKA__BROKERS", bootstrap),
            ("MSGX_KAFKA__DELIVERY_TIMEOUT", "3s"),
            ("MSGX_KAFKA__REQUEST_TIMEOUT", "1s"),
            ("MSGX_DISPATCH__RETRY_INITIAL", "1s"),
            ("MSGX_DISPATCH__RETRY_MAX", "8s"),
        ];
        all.extend_from_slice(extra);
        DispatchDeps::new(&self.settings(&all), bootstrap)
    }
}

impl TestEnv {
    /// Events as the pump commits them: one SUCCEEDED message each (numbered after the last
    /// one) and one PENDING `FLIGHT_UPDATED` event per key, keys interleaved as given; the event
    /// ids in order.
    pub async fn seed_events(&self, keys: &[String]) -> Vec<i64> {
        let now = self.clock.now();
        let base: i64 = self
            .scalar("SELECT COALESCE(max(msg_id), 0) FROM proc_state")
            .await;
        let msg_ids: Vec<i64> = (1..=keys.len() as i64).map(|i| base + i).collect();
        self.exec_with(
            "INSERT INTO proc_state (msg_id, state, enqueued_at, terminal_at) \
             SELECT id, 'SUCCEEDED', $2, $2 FROM UNNEST($1::bigint[]) AS id",
            |q| q.bind(&msg_ids).bind(now),
        )
        .await;
        let payloads: Vec<String> = msg_ids
            .iter()
            .zip(keys)
            .map(|(m, k)| format!(r#"{{"msg_id":{m},"flid":"{k}"}}"#))
            .collect();
        sqlx::query_scalar(
            "INSERT INTO msg_event (msg_id, flight_key, event_type, payload, created_at, \
                                    made_by_uuid_release) \
             SELECT m, k, 'FLIGHT_UPDATED', p::jsonb, $4, true \
             FROM UNNEST($1::bigint[], $2::text[], $3::text[]) WITH ORDINALITY AS u(m, k, p, o) \
             ORDER BY o RETURNING event_id",
        )
        .bind(&msg_ids)
        .bind(keys)
        .bind(&payloads)
        .bind(now)
        .fetch_all(self.store.pool())
        .await
        .expect("events")
    }

    /// One dispatch round on this env's store and clock ([`round`]); an error fails the test.
    pub async fn dispatch_round(
        &self,
        p: &mut EventProducer,
        cfg: &DispatchConfig,
        state: &mut DispatchState,
    ) -> Round {
        round(&self.store, p, &self.clock, cfg, state)
            .await
            .expect("dispatch round")
    }

    /// Rounds until no event is PENDING and every outcome is written, moving the injected
    /// clock past backoffs; fails the test after `limit` rounds.
    pub async fn drain_events(
        &self,
        p: &mut EventProducer,
        cfg: &DispatchConfig,
        state: &mut DispatchState,
        limit: usize,
    ) {
        let pending = "SELECT count(*) FROM msg_event WHERE state = 'PENDING'";
        for _ in 0..limit {
            let r = self.dispatch_round(p, cfg, state).await;
            if r.selected == 0 && state.unwritten() == 0 {
                if self.scalar::<i64>(pending).await == 0 {
                    return;
                }
                self.clock.advance(Duration::from_secs(10));
            }
        }
        panic!(
            "events not drained: {} PENDING",
            self.scalar::<i64>(pending).await
        );
    }
}
