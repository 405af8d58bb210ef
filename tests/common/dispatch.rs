//! The dispatcher's deps as the tests against a broker use them: quick Kafka timeouts and
//! retries, built from the settings like the service builds them.

use msgx_actors::app::DispatchDeps;

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
