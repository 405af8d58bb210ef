//! The upstream side of a sequence, as the DB owner's sessions: background writers, held
//! commits, the owner's row lock, and the cutover's stock. Every row written lands in the
//! ledger the reference model reads (id, message, committed, how long it was held).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::MySqlPool;

use super::Seq;
use crate::ops_msgs::Msg;
use crate::ops_reference::Written;

/// The rows the test wrote, shared with its background writers.
pub type Ledger = Arc<Mutex<Vec<Written>>>;

/// Inserts one message, committed at once; its id.
async fn insert(owner: &MySqlPool, msg: &Msg) -> i64 {
    let r = sqlx::query(
        "INSERT INTO CMINMSGS (CMINMSGS_DATE_RECEIVED, CMINMSGS_CLOB_MSG) VALUES (NOW(), ?)",
    )
    .bind(msg.render())
    .execute(owner)
    .await
    .expect("insert");
    r.last_insert_id() as i64
}

fn record(ledger: &Ledger, id: i64, msg: &Msg, committed: bool, hold_ms: u64) {
    ledger.lock().expect("ledger").push(Written {
        id,
        msg: msg.clone(),
        committed,
        hold_ms,
    });
}

impl Seq {
    /// The ledger as it is now.
    pub(super) fn written(&self) -> Vec<Written> {
        self.ledger.lock().expect("ledger").clone()
    }

    /// Inserts `msg` now and records it.
    pub(super) async fn write(&mut self, msg: Msg) -> i64 {
        let id = insert(&self.env.owner, &msg).await;
        record(&self.ledger, id, &msg, true, 0);
        id
    }

    /// A message the runner writes for an action (numbered from 50_000 in step order; its own
    /// flight `{prefix}{n}`).
    pub(super) fn runtime_flop(&mut self, prefix: &str) -> Msg {
        self.n += 1;
        Msg::Flop {
            n: self.n,
            flid: format!("{prefix}{}", self.n),
            gate: format!("G{}", self.n),
            stnd: None,
        }
    }

    /// An unknown type for an action.
    pub(super) fn runtime_unknown(&mut self) -> Msg {
        self.n += 1;
        Msg::Unknown { n: self.n }
    }

    /// A background writer of these messages, `gap_ms` apart.
    pub(super) fn upstream(&mut self, msgs: Vec<Msg>, gap_ms: u64) {
        let (owner, ledger) = (self.env.owner.clone(), self.ledger.clone());
        self.tasks.push(tokio::spawn(async move {
            for m in msgs {
                let id = insert(&owner, &m).await;
                record(&ledger, id, &m, true, 0);
                tokio::time::sleep(Duration::from_millis(gap_ms)).await;
            }
        }));
    }

    /// An insert held open `hold_ms` then committed or rolled back; `follow` (if any) is
    /// committed while it is open.
    pub(super) async fn hold(
        &mut self,
        held: Msg,
        follow: Option<Msg>,
        hold_ms: u64,
        rollback: bool,
    ) {
        let mut tx = self.env.owner.begin().await.expect("begin");
        let r = sqlx::query(
            "INSERT INTO CMINMSGS (CMINMSGS_DATE_RECEIVED, CMINMSGS_CLOB_MSG) VALUES (NOW(), ?)",
        )
        .bind(held.render())
        .execute(&mut *tx)
        .await
        .expect("held insert");
        let id = r.last_insert_id() as i64;
        record(&self.ledger, id, &held, false, hold_ms);
        if let Some(f) = follow {
            self.write(f).await;
        }
        let (ledger, holes) = (self.ledger.clone(), self.holes.clone());
        self.holds.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(hold_ms)).await;
            if rollback {
                tx.rollback().await.expect("rollback");
                holes.lock().expect("holes").insert(id);
            } else {
                tx.commit().await.expect("commit");
            }
            // A rolled-back id never existed: it leaves the ledger.
            let mut l = ledger.lock().expect("ledger");
            l.retain(|w| w.id != id || !rollback);
            if let Some(w) = l.iter_mut().find(|w| w.id == id) {
                w.committed = true;
            }
        }));
    }

    /// The DB owner locks the first row (`SELECT … FOR UPDATE`) for `hold_ms` while the rest
    /// are written behind it.
    pub(super) async fn owner_lock(&mut self, mut msgs: Vec<Msg>, hold_ms: u64) {
        if msgs.is_empty() {
            return;
        }
        let first = msgs.remove(0);
        let id = self.write(first).await;
        let mut tx = self.env.owner.begin().await.expect("begin");
        sqlx::query("SELECT CMINMSGS_ID FROM CMINMSGS WHERE CMINMSGS_ID = ? FOR UPDATE")
            .bind(id)
            .fetch_all(&mut *tx)
            .await
            .expect("owner lock");
        self.upstream(msgs, 20);
        // A margin past the release for the mark to land.
        self.locked = Some((id, Instant::now() + Duration::from_millis(hold_ms + 5_000)));
        self.tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(hold_ms)).await;
            tx.commit().await.expect("release the owner's lock");
        }));
    }

    /// Waits for every held commit to end.
    pub(super) async fn holds_done(&mut self) {
        for h in self.holds.drain(..) {
            h.await.expect("held insert");
        }
    }

    /// Waits for every background writer and held commit.
    pub(super) async fn writers_done(&mut self) {
        self.holds_done().await;
        for t in self.tasks.drain(..) {
            t.await.expect("writer");
        }
        for w in &mut self.sims {
            crate::common::instance::wait_child(w).await;
        }
    }
}
