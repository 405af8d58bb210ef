//! The dispatcher's deps as the tests against a broker use them: quick Kafka timeouts and
//! retries, built from the settings like the service builds them; rounds driven as the
//! dispatcher drives them ([`super::dispatch_round`]) on the env's store and clock.

use std::time::Duration;

use msgx_actors::app::DispatchDeps;
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
