//! One valid record per business identity: no two records that are not DEAD bound to one
//! identity key. The unique index says so for live rows (migration 0012: DEAD rows take no
//! part in it); this reads it back over live and archived records together, in identity
//! order, page by page.
//!
//! Pages are keyset pages on `(identity_key, msg_id)`: the next page starts right after the
//! last *row*, not after the last *key*, so the rows of one key that straddle a page boundary
//! are all read, and the key's running state is carried from one page to the next.

use super::{Finding, VerifyError};
use crate::store::Store;

/// The rows of the identity key being read: whether one that is not DEAD holds it, and the
/// first DEAD row while it is alone with the key (noted once another row shares it).
#[derive(Debug, Default)]
struct KeyRun {
    key: Option<String>,
    held: bool,
    lone_dead: Option<i64>,
}

impl KeyRun {
    /// Feeds the next row in `(identity_key, msg_id)` order.
    fn push(&mut self, f: &mut Finding, key: String, id: i64, dead: bool) {
        f.checked += 1;
        if self.key.as_deref() != Some(key.as_str()) {
            *self = Self {
                key: Some(key),
                held: !dead,
                lone_dead: dead.then_some(id),
            };
            return;
        }
        if let Some(first) = self.lone_dead.take() {
            f.note(DEAD_KEEPS_KEY, first);
        }
        if dead {
            f.note(DEAD_KEEPS_KEY, id);
        } else if self.held {
            f.violation(id);
        } else {
            self.held = true;
        }
    }
}

const DEAD_KEEPS_KEY: &str =
    "DEAD records keeping an identity another record holds (DEAD rows are not unique, migration 0012)";

pub(super) async fn run(store: &Store, batch: i64) -> Result<Finding, VerifyError> {
    let mut f = Finding::new(
        "identity_unique",
        "at most one record that is not DEAD per identity (SNDR|TYPE|STYP|SEQN[|date]); a DEAD \
         record keeps its key for the record and shares it without breaking the rule (noted)",
    );
    // Before every row: no msg_id is below i64::MIN.
    let mut after = (String::new(), i64::MIN);
    let mut run = KeyRun::default();
    let mut keys = 0u64;
    loop {
        let rows: Vec<(String, i64, bool)> = sqlx::query_as(
            // Live and archived records together (migration 0014).
            "SELECT identity_key, msg_id, state = 'DEAD' FROM proc_state_all \
             WHERE identity_key IS NOT NULL AND (identity_key, msg_id) > ($1, $2) \
             ORDER BY identity_key, msg_id LIMIT $3",
        )
        .bind(&after.0)
        .bind(after.1)
        .bind(batch)
        .fetch_all(store.pool())
        .await?;
        let Some(last) = rows.last() else { break };
        after = (last.0.clone(), last.1);
        for (key, id, dead) in rows {
            if run.key.as_deref() != Some(key.as_str()) {
                keys += 1;
            }
            run.push(&mut f, key, id, dead);
        }
    }
    f.scope = format!(
        "every record with an identity key, live and archived (proc_state_all): {} records, \
         {keys} keys, read in pages of {batch} by (identity_key, msg_id)",
        f.checked
    );
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(rows: &[(&str, i64, bool)]) -> Finding {
        let mut f = Finding::new("identity_unique", "");
        let mut run = KeyRun::default();
        for (k, id, dead) in rows {
            run.push(&mut f, k.to_string(), *id, *dead);
        }
        f
    }

    #[test]
    fn a_second_holder_is_a_violation_a_dead_sharer_a_note() {
        let f = feed(&[("A", 1, false), ("B", 2, false), ("B", 3, false)]);
        assert_eq!((f.violations, f.examples.clone()), (1, vec![3]));
        let f = feed(&[
            ("C", 4, true),
            ("C", 5, false),
            ("C", 6, true),
            ("D", 7, true),
        ]);
        assert_eq!(f.violations, 0);
        assert_eq!(f.notes[0].count, 2);
        assert_eq!(f.notes[0].examples, vec![4, 6]);
        let f = feed(&[("E", 8, true), ("E", 9, false), ("E", 10, false)]);
        assert_eq!((f.violations, f.examples.clone()), (1, vec![10]));
    }
}
