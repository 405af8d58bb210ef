//! The DB owner's purge up to the READY boundary and plan B rotation, each judged against the
//! model's bounds on the boundary ([`Seq::purge_bounds`]), never the service's word alone.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::Seq;
use crate::ops_effect::Predict;

impl Seq {
    /// `purge-readiness --json`: the READY boundary, if above what was purged already.
    pub(super) async fn boundary(&mut self) -> Option<i64> {
        let out = self.cli(&["purge-readiness", "--json"]).await;
        if out.code != Some(0) {
            self.model
                .violation(format!("purge-readiness failed: {}", out.all()));
            return None;
        }
        out.json()["boundary_id"]
            .as_i64()
            .filter(|b| *b > self.model.purged_to)
    }

    /// The model's bounds on a READY boundary above what was purged (SPEC §5, "the DB owner's
    /// side"), from the ledger, never from the service:
    /// - `upper`: the boundary must stay below the first id the model knows may still commit
    ///   or is a hole (a held commit still open, a rolled-back insert: a hole, released and then
    ///   watched for `late.watch_window`, 7 d, far longer than a sequence) and may not pass the
    ///   highest id written;
    /// - `lower`: the highest id `r` such that every id above the purged prefix up to `r` is a
    ///   committed row of the test that ends finished without an operator (not deleted by the
    ///   owner and left unrecovered, not under the owner's row lock, not the rows of a skip
    ///   beside the purge): `Some(r)` means a boundary above the purged prefix must come.
    fn purge_bounds(&self) -> (Option<i64>, Option<i64>) {
        let written = self.written();
        let from = self.model.purged_to;
        let holes = self.holes.lock().expect("holes").clone();
        let open = written.iter().filter(|w| !w.committed).map(|w| w.id);
        let first_gap = holes
            .iter()
            .copied()
            .chain(open)
            .filter(|i| *i > from)
            .min();
        let head = written.iter().map(|w| w.id).max().unwrap_or(from);
        let upper = first_gap.map_or(head, |g| g - 1).min(head);
        let committed: HashSet<i64> = written
            .iter()
            .filter(|w| w.committed)
            .map(|w| w.id)
            .collect();
        // Skipped stock the previous system never marked may hold the purge: the service's
        // rule asks a mark of every row it counts (stricter than SPEC §5, never unsafe).
        let blocked = |id: i64| {
            (self.model.skipped_stock.contains(&id) && !self.model.premarked.contains(&id))
                || (self.model.owner_deleted.contains(&id) && !self.model.recovered.contains(&id))
                || self
                    .locked
                    .is_some_and(|(l, until)| l == id && Instant::now() < until)
                // The blocker and followers of a skip waiting beside this purge: the skip may
                // still end them, so the purge is not held waiting for their own ends.
                || self
                    .gate
                    .as_ref()
                    .is_some_and(|g| g.pipeline && g.rows.contains(&id))
        };
        let mut r = from;
        while r < upper && committed.contains(&(r + 1)) && !blocked(r + 1) {
            r += 1;
        }
        if self.model.foreign_writers {
            return (None, None); // rows the model does not know: no bound
        }
        ((r > from).then_some(r), Some(upper))
    }

    /// The READY boundary a purge or rotation acts on, judged against the model's bounds: one
    /// predicted must come (the answer is polled for up to 40 s: the rows below it may still be
    /// finishing), and none may pass the upper bound.
    async fn ready_boundary(&mut self, kind: &'static str) -> Option<i64> {
        let (lower, _) = self.purge_bounds();
        let from = self.model.purged_to;
        let predict = match (lower, self.model.foreign_writers) {
            (_, true) => {
                Predict::Either("a legacy simulator wrote rows the model does not know".into())
            }
            (Some(r), _) => Predict::Effective(format!(
                "ids {}..={r} are committed rows that all end finished",
                from + 1
            )),
            (None, _) => match self.idle_undecided() {
                Some(why) => Predict::Either(format!(
                    "id {} is not a finishable committed row of the test now, but {why}",
                    from + 1
                )),
                None => Predict::Idle(format!(
                    "id {} is not a finishable committed row of the test",
                    from + 1
                )),
            },
        };
        let mut b = self.boundary().await;
        if let (Predict::Effective(_), Some(r)) = (&predict, lower) {
            // Polled until it reaches the model's lower bound: the rows below it may still be
            // finishing; a boundary that stays below it is a violation (issue 52 item 1: the
            // answer is checked against both bounds, not adopted).
            let start = Instant::now();
            while b.is_none_or(|b| b < r) && start.elapsed() < Duration::from_secs(40) {
                tokio::time::sleep(Duration::from_millis(500)).await;
                b = self.boundary().await;
            }
            if let Some(got) = b.filter(|b| *b < r) {
                self.model.violation(format!(
                    "purge-readiness says READY up to {got} after 40 s; the model's lower bound \
                     is {r}: ids {}..={r} are committed rows of the test that all end finished",
                    from + 1
                ));
            }
        }
        // The upper bound as of the answer: a commit open after it was open during it (a
        // commit that ended while the answer was polled for may rightly be covered).
        let (_, upper) = self.purge_bounds();
        if let (Some(b), Some(u)) = (b, upper) {
            if b > u {
                let watched: Vec<(i64, i64)> = sqlx::query_as(
                    "SELECT first_id, last_id FROM late_watch_range ORDER BY first_id",
                )
                .fetch_all(self.env.store.pool())
                .await
                .unwrap_or_default();
                let holes = self.holes.lock().expect("holes").clone();
                let (w, _) = self.env.cursor().await;
                self.model.violation(format!(
                    "purge-readiness says READY up to {b}, past {u}: id {} is a hole or an \
                     open commit, or beyond every row written (W {w}, rolled back {holes:?}, \
                     watched {watched:?})",
                    u + 1
                ));
            }
        }
        let what = format!("purge-readiness boundary {b:?} (purged up to {from})");
        self.model.effect(kind, predict, b.is_some(), &what);
        b
    }

    /// Why the rows above the purged prefix may become finishable while the readiness call
    /// runs (the harness's own facts: its writers, held commits, the owner's lock, a pair's
    /// other action), or `None`: nothing can change them and an idle prediction is sure.
    fn idle_undecided(&self) -> Option<String> {
        if self.tasks.iter().any(|t| !t.is_finished()) {
            return Some("a background writer is still writing".into());
        }
        if self.holds.iter().any(|h| !h.is_finished()) {
            return Some("a held commit is still open".into());
        }
        if self.pair_running {
            return Some("the pair's other action runs beside it".into());
        }
        if self.locked.is_some_and(|(_, until)| Instant::now() < until) {
            return Some("the owner's row lock was released lately".into());
        }
        None
    }

    /// The DB owner deletes the inbox rows up to `b` in one transaction, reading each one's
    /// mark under the same lock (no mark can land between): `(id, mark)` of every row deleted.
    async fn purge_recording(&mut self, b: i64) -> Vec<(i64, Option<String>)> {
        let purge_open = Instant::now();
        let mut tx = self.env.owner.begin().await.expect("begin purge");
        let rows: Vec<(i64, Option<String>)> = sqlx::query_as(
            "SELECT CMINMSGS_ID, CAST(CMINMSGS_STATUS AS CHAR) FROM CMINMSGS \
             WHERE CMINMSGS_ID <= ? FOR UPDATE",
        )
        .bind(b)
        .fetch_all(&mut *tx)
        .await
        .expect("rows to purge");
        sqlx::query("DELETE FROM CMINMSGS WHERE CMINMSGS_ID <= ?")
            .bind(b)
            .execute(&mut *tx)
            .await
            .expect("purge as owner");
        // A pair's pause point: the other action runs inside this open transaction.
        let held = self
            .pause_for_pair(purge_open, "the purge's inbox transaction (uncommitted)")
            .await;
        tx.commit().await.expect("commit purge");
        if let Some(lock) = held {
            lock.commit().await.expect("release the pair's row lock");
        }
        rows
    }

    /// The ids of the rows the test wrote.
    fn written_ids(&self) -> HashSet<i64> {
        self.written().iter().map(|w| w.id).collect()
    }

    /// Held commits end before a purge unless this purge is the known race run open.
    async fn purge_waits(&mut self) {
        if !self.purge_races_holds {
            self.holds_done().await;
        }
    }

    /// The DB owner purges up to the READY boundary; then, from the inbox, nothing gone was
    /// unfinished.
    pub(super) async fn purge(&mut self) {
        self.purge_waits().await;
        let b0 = Instant::now();
        let Some(b) = self.ready_boundary("purge").await else {
            self.purge_span = Some((b0, Instant::now()));
            return;
        };
        let deleted = self.purge_recording(b).await;
        self.purge_span = Some((b0, Instant::now()));
        let ours = self.written_ids();
        self.model.check_purge(&self.env, b, &deleted, &ours).await;
    }

    /// Plan B (seed §6): a new table seeded above every id, the rows above the READY boundary
    /// copied, an atomic rename while writers run, the rows written or marked in between
    /// reconciled, the old table dropped.
    pub(super) async fn rotate(&mut self) {
        self.purge_waits().await;
        let r0 = Instant::now();
        let b = self.ready_boundary("rotate").await;
        let keep_above = b.unwrap_or(self.model.purged_to);
        // A handle of its own (a pool clone): the pair's pause below borrows the harness.
        let owner = &self.env.owner.clone();
        let exec = |sql: String| async move {
            sqlx::query(&sql)
                .execute(owner)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        };
        self.shared.rotating();
        exec("CREATE TABLE CMINMSGS_NEW LIKE CMINMSGS".into()).await;
        let next: i64 = sqlx::query_scalar(
            "SELECT CAST(GREATEST(COALESCE(AUTO_INCREMENT, 1), \
                    (SELECT COALESCE(MAX(CMINMSGS_ID), 0) + 1 FROM CMINMSGS)) AS SIGNED) \
             FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'CMINMSGS'",
        )
        .fetch_one(owner)
        .await
        .expect("auto_increment");
        // The margin covers rows written into the old table until the rename.
        exec(format!(
            "ALTER TABLE CMINMSGS_NEW AUTO_INCREMENT = {}",
            next + 200
        ))
        .await;
        exec(format!(
            "INSERT INTO CMINMSGS_NEW SELECT * FROM CMINMSGS WHERE CMINMSGS_ID > {keep_above}"
        ))
        .await;
        exec("RENAME TABLE CMINMSGS TO CMINMSGS_OLD, CMINMSGS_NEW TO CMINMSGS".into()).await;
        // A pair's pause point: the other action runs while the old table is still there and
        // the rows written or marked in between are not reconciled yet.
        let held = self
            .pause_for_pair(r0, "the rotation (renamed, not yet reconciled and dropped)")
            .await;
        exec(format!(
            "INSERT INTO CMINMSGS SELECT o.* FROM CMINMSGS_OLD o \
             LEFT JOIN CMINMSGS n ON n.CMINMSGS_ID = o.CMINMSGS_ID \
             WHERE o.CMINMSGS_ID > {keep_above} AND n.CMINMSGS_ID IS NULL"
        ))
        .await;
        exec(
            "UPDATE CMINMSGS n JOIN CMINMSGS_OLD o ON o.CMINMSGS_ID = n.CMINMSGS_ID \
             SET n.CMINMSGS_STATUS = o.CMINMSGS_STATUS, \
                 n.CMINMSGS_DATE_PROCESSED = o.CMINMSGS_DATE_PROCESSED \
             WHERE o.CMINMSGS_STATUS IS NOT NULL AND n.CMINMSGS_STATUS IS NULL"
                .into(),
        )
        .await;
        // The rows dropped with the old table and their marks: nothing writes to it now.
        let dropped: Vec<(i64, Option<String>)> = sqlx::query_as(&format!(
            "SELECT CMINMSGS_ID, CAST(CMINMSGS_STATUS AS CHAR) FROM CMINMSGS_OLD \
             WHERE CMINMSGS_ID <= {keep_above}"
        ))
        .fetch_all(owner)
        .await
        .expect("rows dropped with the old table");
        exec("DROP TABLE CMINMSGS_OLD".into()).await;
        if let Some(lock) = held {
            lock.commit().await.expect("release the pair's row lock");
        }
        self.purge_span = Some((r0, Instant::now()));
        self.shared.rotated();
        let ours = self.written_ids();
        self.model
            .check_purge(&self.env, keep_above, &dropped, &ours)
            .await;
    }
}
