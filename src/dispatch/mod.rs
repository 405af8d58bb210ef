//! Delivery (SPEC §7, seed §2 MSG_EVENT): PENDING `MSG_EVENT` rows → Kafka → SENT after the
//! broker's ack; failed sends back off; exhausted events go to the dead-letter topic → DEAD.
//!
//! - [`rules`]: pure: grouping a batch into per-key chains, what follows a failed send.
//! - [`cloudevents`]: the CloudEvents Kafka binary-binding headers.
//! - [`send_round`]: one dispatch round over the store and the producer, [`round`] its
//!   at-least-once form.
//! - [`outcome`]: what the broker said and the store does not know yet, and its write.
//! - [`txn`]: `kafka.delivery = "exactly-once"`: a round is one Kafka transaction, and the
//!   start recovers from Kafka what was committed but not yet written SENT.
//!
//! Guarantees: at least once (SENT only after the ack; a crash between ack and SENT re-sends,
//! consumers de-duplicate on `ce_id`); one key's events reach the topic in event order (a key's
//! events are in flight together in queue order on the idempotent producer, whose gapless
//! guarantee fails the later ones with a failed one, and an event backing off holds back the
//! later events of its key only). In `exactly-once` mode: each event once in the
//! `read_committed` view (a round's events commit or abort together; many events per key go in
//! one transaction).

pub mod cloudevents;
pub mod outcome;
pub mod round;
pub mod rules;
pub mod txn;

pub use outcome::{flush, write_outcome, DispatchState, Skips, Unrecorded};
pub use round::{DispatchConfig, DispatchError, RoundReport};
pub use rules::RetryRules;

use crate::clock::Clock;
use crate::kafka::EventProducer;
use crate::store::Store;

/// The sending half of a round: selects the deliverable events (without `skips`), sends them
/// and returns the report with the outcome to write — at least once ([`round`]: a producer
/// rebuilt after a fatal error), or one Kafka transaction when the producer is transactional
/// ([`txn`]: never rebuilt here, since a new transactional producer fences the current
/// holder's, so only a dispatcher that confirmed the lease may build one). The caller adds the
/// outcome to its [`DispatchState`].
pub async fn send_round(
    store: &Store,
    producer: &mut EventProducer,
    clock: &dyn Clock,
    cfg: &DispatchConfig,
    skips: &Skips,
) -> Result<(RoundReport, Unrecorded), DispatchError> {
    if producer.transactional() {
        return txn::send_txn_round(store, producer, clock, cfg, skips).await;
    }
    let (mut report, fresh) = round::select_and_send(store, producer, clock, cfg, skips).await?;
    if let Some(reason) = producer.fatal_error() {
        producer.recreate()?;
        report.producer_recreated = Some(reason);
    }
    Ok((report, fresh))
}
