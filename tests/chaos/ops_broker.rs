//! The broker a sequence delivers to (issue 31 item 3), chosen by [`super::ops_plan::Plan::on_tansu`].
//!
//! - tansu, the real broker of the chaos suite: every at-least-once sequence, and every
//!   exactly-once sequence with a standby takeover. tansu fences a zombie producer as Kafka
//!   does (its produce and commit after a newer producer of the same `transactional.id`
//!   initialised are refused, PRODUCER_FENCED); librdkafka's mock cluster does not — it gives
//!   the newer producer a new producer id and accepts the thawed holder's records and commit
//!   (`scripts/tansu_txn_repro.py`), which showed as a duplicate after a takeover.
//! - librdkafka's mock cluster: the other exactly-once sequences. They stayed there because
//!   tansu 0.6 answers PRODUCER_FENCED to a producer whose topic was deleted and created again
//!   (`scripts/tansu_fenced_repro.py`); the dispatch outage here only creates a missing topic,
//!   which a transactional producer on tansu lived through in one probe (2026-12-04) and in the
//!   takeover plans with an outage, but the rest were not moved without a soak of their own.
//!   A plan with a slow commit (`Step::SlowCommit`) gets a mock cluster of its own: the delay
//!   is for the broker's next `EndTxn`, whichever producer sends it.
//!
//! Neither hides an aborted transaction's records from `read_committed`
//! (`scripts/tansu_txn_repro.py`; the mock writes no control records), so what the end check
//! demands in exactly-once mode — 0 duplicates — is "exactly once in the log": a record of a
//! transaction cut by a kill or a fence stays in the log and the recovery counts it as
//! delivered (as `tests/exactly_once.rs` checks); a round aborted and sent again would show as
//! a duplicate here although a real broker hides it, and is reported for a look.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::types::RDKafkaApiKey;

use crate::common::kafka::RawMock;
use crate::common::tansu::TansuAdmin;

/// What a sequence needs of its broker: where it is, and creating topics (from any thread).
#[derive(Clone)]
pub enum Broker {
    /// tansu.
    Tansu {
        bootstrap: String,
        admin: TansuAdmin,
    },
    /// The mock cluster (one broker), held by its raw handle: topics are created and a
    /// request's answer delayed ([`Broker::slow_next_commit`]) from any thread. It stops when
    /// the last clone is dropped.
    Mock {
        bootstrap: String,
        mock: Arc<RawMock>,
    },
}

impl Broker {
    /// A mock cluster of one broker.
    pub fn mock() -> Broker {
        let mock = RawMock::new(1, &[]);
        Broker::Mock {
            bootstrap: mock.bootstrap(),
            mock: Arc::new(mock),
        }
    }

    /// The broker answers the next `EndTxn` only after `after` (a commit left in doubt past
    /// the service's commit wait). Only the mock cluster can: None on tansu.
    pub fn slow_next_commit(&self, after: Duration) -> Option<()> {
        match self {
            Broker::Tansu { .. } => None,
            Broker::Mock { mock, .. } => {
                mock.delay_next(1, RDKafkaApiKey::EndTxn, 1, after);
                Some(())
            }
        }
    }

    /// The bootstrap servers.
    pub fn bootstrap(&self) -> &str {
        match self {
            Broker::Tansu { bootstrap, .. } | Broker::Mock { bootstrap, .. } => bootstrap,
        }
    }

    /// Creates a topic (blocking: call it off the runtime).
    pub fn create_topic(&self, name: &str, partitions: u32) {
        match self {
            Broker::Tansu { admin, .. } => admin.create_topic(name, partitions),
            Broker::Mock { mock, .. } => mock.create_topic(name, partitions as i32),
        }
    }
}
