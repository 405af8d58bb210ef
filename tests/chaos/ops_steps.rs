//! The operator procedures and the DB owner's actions of a sequence, each as a site runs it:
//! through the real `msgexchange` CLI (replay, skip, recover-backfill, purge-readiness,
//! events list-dead / requeue) or as the DB owner's SQL (delete and restore a row, purge, plan B
//! rotation), and a standby takeover. Each records what it did in the model.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::{KeptRow, Seq, ACTOR, REPLAYABLE, TICKET};
use crate::common::instance::{off_runtime, Instance};
use crate::ops_model::{Exit, Replayed};

impl Seq {
    pub(super) async fn state(&self, id: i64) -> Option<(String, Option<String>, bool)> {
        sqlx::query_as(
            "SELECT state, backfill_abandon_reason, backfill_at IS NOT NULL \
             FROM proc_state WHERE msg_id = $1",
        )
        .bind(id)
        .fetch_optional(self.env.store.pool())
        .await
        .expect("state")
    }

    pub(super) async fn max_seq(&self) -> i64 {
        sqlx::query_scalar("SELECT COALESCE(max(processed_seq), 0) FROM proc_state")
            .fetch_one(self.env.store.pool())
            .await
            .expect("max seq")
    }

    pub(super) async fn in_inbox(&self, ids: &[i64]) -> HashSet<i64> {
        if ids.is_empty() {
            return HashSet::new();
        }
        let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
        sqlx::query_scalar(&format!(
            "SELECT CMINMSGS_ID FROM CMINMSGS WHERE CMINMSGS_ID IN ({list})"
        ))
        .fetch_all(&self.env.owner)
        .await
        .expect("inbox ids")
        .into_iter()
        .collect()
    }

    /// DEAD rows of a replayable class whose raw text is still in the inbox: (id, class).
    pub(super) async fn dead_rows(&self) -> Vec<(i64, String)> {
        let rows: Vec<(i64, String)> = sqlx::query_as(&format!(
            "SELECT msg_id, error_class FROM proc_state WHERE state = 'DEAD' \
               AND error_class IN ({REPLAYABLE}) ORDER BY msg_id"
        ))
        .fetch_all(self.env.store.pool())
        .await
        .expect("dead rows");
        let present = self
            .in_inbox(&rows.iter().map(|r| r.0).collect::<Vec<_>>())
            .await;
        rows.into_iter()
            .filter(|r| present.contains(&r.0))
            .collect()
    }

    /// Replay of DEAD rows (an unknown type poisoned to DEAD(EXHAUSTED) if there is none).
    pub(super) async fn replay(&mut self, by_class: bool, max_rows: usize) {
        let mut dead = self.dead_rows().await;
        if dead.is_empty() {
            let m = self.runtime_unknown();
            let id = self.write(m).await;
            let dead_now = self
                .wait_until(Duration::from_secs(25), || async {
                    self.state(id).await.is_some_and(|s| s.0 == "DEAD")
                })
                .await;
            if !dead_now {
                self.model.idle("replay");
                return;
            }
            dead = self.dead_rows().await;
        }
        let chosen: Vec<(i64, String)> = dead.iter().rev().take(max_rows).cloned().collect();
        let ids: Vec<String> = chosen.iter().map(|r| r.0.to_string()).collect();
        let (from, to) = (
            chosen.iter().map(|r| r.0).min().unwrap_or(0),
            chosen.iter().map(|r| r.0).max().unwrap_or(0),
        );
        let seq_before = self.max_seq().await;
        let (ids_arg, from_arg, to_arg) = (ids.join(","), from.to_string(), to.to_string());
        let mut args = vec!["replay", "--actor", ACTOR, "--reason", "ops test replay"];
        args.extend(["--ticket", TICKET, "--json"]);
        if by_class {
            args.extend([
                "--class",
                &chosen[0].1,
                "--from",
                &from_arg,
                "--to",
                &to_arg,
            ]);
            args.extend(["--state", "DEAD"]);
        } else {
            args.extend(["--ids", &ids_arg, "--expect-state", "DEAD"]);
        }
        let out = self.cli(&args).await;
        if out.code != Some(0) {
            self.model
                .violation(format!("replay failed: {}", out.all()));
            return;
        }
        let report = out.json();
        let mut applied: Vec<i64> = report["rows"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["result"] == "applied")
            .filter_map(|r| r["msg_id"].as_i64())
            .collect();
        applied.sort_unstable();
        if applied.is_empty() {
            self.model.idle("replay");
        }
        self.model.replays.push(Replayed {
            ids: applied,
            seq_before,
        });
    }

    /// Approved skip: an unknown type holds the FIFO head, rows queue behind it; the range from
    /// `before` rows below it to its last follower is skipped once W passed it.
    pub(super) async fn skip(&mut self, followers: usize, before: usize) {
        let m = self.runtime_unknown();
        let blocker = self.write(m).await;
        let mut to = blocker;
        for _ in 0..followers {
            let m = self.runtime_flop("K");
            to = self.write(m).await;
        }
        let from = (blocker - before as i64).max(1);
        let passed = self
            .wait_until(Duration::from_secs(20), || async {
                self.env.cursor().await.0 >= to
            })
            .await;
        if !passed {
            self.model.idle("skip");
            return;
        }
        let (f, t) = (from.to_string(), to.to_string());
        let out = self
            .cli(&[
                "skip",
                "--from",
                &f,
                "--to",
                &t,
                "--approver",
                "ops-lead",
                "--reason",
                "ops test skip",
                "--ticket",
                "CHG-19",
                "--json",
            ])
            .await;
        if out.code != Some(0) {
            self.model
                .violation(format!("skip {from}..{to} failed: {}", out.all()));
            return;
        }
        let skipped = out.json()["skipped"].as_u64().unwrap_or(0);
        if skipped == 0 {
            self.model.idle("skip");
        }
        self.model.skips.push((from, to, skipped));
    }

    /// The DB owner deletes a row we enqueued before it is marked and restores it later; the
    /// operator recovers the abandoned backfill.
    pub(super) async fn recover(&mut self) {
        let m = self.runtime_flop("V");
        let id = self.write(m).await;
        let enqueued = self
            .wait_until(Duration::from_secs(20), || async {
                self.state(id).await.is_some()
            })
            .await;
        if !enqueued {
            self.model.idle("recover_backfill");
            return;
        }
        // The row as it is when deleted (locked, so no mark lands between copy and delete).
        let mut tx = self.env.owner.begin().await.expect("begin");
        let kept: KeptRow = sqlx::query_as(
            "SELECT CMINMSGS_ID, CMINMSGS_DATE_RECEIVED, CMINMSGS_CLOB_MSG, \
                    CMINMSGS_DATE_PROCESSED, CMINMSGS_STATUS \
             FROM CMINMSGS WHERE CMINMSGS_ID = ? FOR UPDATE",
        )
        .bind(id)
        .fetch_one(&mut *tx)
        .await
        .expect("row to delete");
        sqlx::query("DELETE FROM CMINMSGS WHERE CMINMSGS_ID = ?")
            .bind(id)
            .execute(&mut *tx)
            .await
            .expect("delete");
        tx.commit().await.expect("commit delete");
        self.model.owner_deleted.insert(id);
        let settled = self
            .wait_until(Duration::from_secs(20), || async {
                self.state(id)
                    .await
                    .is_some_and(|(_, abandon, marked)| abandon.is_some() || marked)
            })
            .await;
        sqlx::query(
            "INSERT INTO CMINMSGS (CMINMSGS_ID, CMINMSGS_DATE_RECEIVED, CMINMSGS_CLOB_MSG, \
                    CMINMSGS_DATE_PROCESSED, CMINMSGS_STATUS) VALUES (?, ?, ?, ?, ?)",
        )
        .bind(kept.0)
        .bind(kept.1)
        .bind(kept.2)
        .bind(kept.3)
        .bind(kept.4)
        .execute(&self.env.owner)
        .await
        .expect("restore");
        let abandoned = self.state(id).await.and_then(|s| s.1);
        if !settled || abandoned.as_deref() != Some("MISSING_ROW") {
            self.model.idle("recover_backfill");
            return;
        }
        let ids = id.to_string();
        let out = self
            .cli(&[
                "recover-backfill",
                "--ids",
                &ids,
                "--actor",
                ACTOR,
                "--reason",
                "the DB owner restored the row",
                "--ticket",
                TICKET,
                "--json",
            ])
            .await;
        if out.code != Some(0) || out.json()["applied"] != 1 {
            self.model
                .violation(format!("recover-backfill {id}: {}", out.all()));
            return;
        }
        self.model.recovered.push(id);
    }

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

    /// Inbox ids up to `b`.
    pub(super) async fn ids_to(&self, b: i64) -> Vec<i64> {
        sqlx::query_scalar("SELECT CMINMSGS_ID FROM CMINMSGS WHERE CMINMSGS_ID <= ? ORDER BY 1")
            .bind(b)
            .fetch_all(&self.env.owner)
            .await
            .expect("ids to purge")
    }

    /// The rows a purge up to `b` may take that the check must account for: every row the
    /// test wrote (held commits still open included) and every row in the inbox now.
    async fn purge_candidates(&self, b: i64) -> Vec<i64> {
        let mut ids = self.ids_to(b).await;
        ids.extend(self.written().iter().map(|w| w.id).filter(|id| *id <= b));
        ids.sort_unstable();
        ids.dedup();
        ids
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
        let Some(b) = self.boundary().await else {
            self.model.idle("purge");
            return;
        };
        let ids = self.purge_candidates(b).await;
        self.env.purge_as_owner(b).await;
        self.model.check_purge(&self.env, b, &ids).await;
    }

    /// Plan B (seed §6): a new table seeded above every id, the rows above the READY boundary
    /// copied, an atomic rename while writers run, the rows written or marked in between
    /// reconciled, the old table dropped.
    pub(super) async fn rotate(&mut self) {
        self.purge_waits().await;
        let b = self.boundary().await;
        let keep_above = b.unwrap_or(self.model.purged_to);
        let ids = self.purge_candidates(keep_above).await;
        let owner = &self.env.owner;
        let exec = |sql: String| async move {
            sqlx::query(&sql)
                .execute(owner)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        };
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
        exec("DROP TABLE CMINMSGS_OLD".into()).await;
        if b.is_some() {
            self.model.check_purge(&self.env, keep_above, &ids).await;
        }
    }

    /// The events topic was missing: wait for DEAD events, create it, requeue until none is
    /// left DEAD.
    pub(super) async fn requeue(&mut self) {
        if !self.plan.dispatch_outage {
            self.model.idle("requeue");
            return;
        }
        let pool = self.env.store.pool().clone();
        let count = |sql: &'static str| {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, i64>(sql)
                    .fetch_one(&pool)
                    .await
                    .expect("count")
            }
        };
        if !self
            .wait_until(Duration::from_secs(5), || async {
                count("SELECT count(*) FROM msg_event").await > 0
            })
            .await
        {
            let m = self.runtime_flop("Q");
            self.write(m).await;
        }
        let dead = self
            .wait_until(Duration::from_secs(30), || async {
                count("SELECT count(*) FROM msg_event WHERE state = 'DEAD'").await > 0
            })
            .await;
        let (a, t) = (self.broker.clone(), self.topic.clone());
        off_runtime(move || a.create_topic(&t, 3)).await;
        if !dead {
            self.model.idle("requeue");
        }
        self.requeue_until_none_dead().await;
    }

    /// `events list-dead` and `events requeue` until no event is DEAD any more and events that
    /// were in flight when the topic came back had time to fail (2 attempts of 2 s).
    async fn requeue_until_none_dead(&mut self) {
        let since = Instant::now();
        loop {
            let out = self
                .cli(&["events", "list-dead", "--limit", "1000", "--json"])
                .await;
            let ids: Vec<String> = out.json()["events"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e["event_id"].as_i64())
                .map(|i| i.to_string())
                .collect();
            if ids.is_empty() {
                if since.elapsed() > Duration::from_secs(7) {
                    break;
                }
            } else {
                let list = ids.join(",");
                let out = self
                    .cli(&[
                        "events",
                        "requeue",
                        "--ids",
                        &list,
                        "--actor",
                        ACTOR,
                        "--reason",
                        "the events topic is back",
                        "--ticket",
                        TICKET,
                        "--json",
                    ])
                    .await;
                let r = out.json();
                if out.code != Some(0) || r["refused"].as_array().is_some_and(|a| !a.is_empty()) {
                    self.model
                        .violation(format!("events requeue: {}", out.all()));
                }
                self.model.requeued.extend(
                    r["requeued"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|v| v.as_i64()),
                );
            }
            tokio::time::sleep(Duration::from_millis(700)).await;
        }
    }

    /// Hot standby: B waits while A holds the lease; A freezes past it; B takes over; A, thawed,
    /// is fenced and exits 1.
    pub(super) async fn takeover(&mut self) {
        let mut a = self.active.take().expect("an active instance");
        // A store cut just before may have ended A's lease session: until A renews from a live
        // session, the lease is rightly takeable (src/store/lease.rs) and B taking it is no
        // fault. B is judged only once A holds the lease for certain.
        if !self.lease_renewed_from_live_session().await {
            self.model
                .violation(format!("{} did not renew its lease within 15s", a.name));
        }
        let name = self.name("standby");
        let b = Instance::spawn(&self.vars, &name, &[]);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        if b.ready().await {
            self.model
                .violation(format!("{name} ready while {} holds the lease", a.name));
        }
        a.signal("-STOP");
        let frozen = Instant::now();
        if !b.try_wait_ready(Duration::from_secs(25)).await {
            self.model
                .violation(format!("{name} did not take over within 25s"));
        }
        let took = frozen.elapsed();
        a.signal("-CONT");
        let st = a.exited_within(Duration::from_secs(15)).await;
        self.model.exited(&a.name, Exit::Fenced, st);
        eprintln!("ops: seed {} standby took over in {took:?}", self.plan.seed);
        self.active = Some(b);
    }

    /// The lease row was renewed after this call began, by a session that still exists.
    async fn lease_renewed_from_live_session(&self) -> bool {
        let since: chrono::DateTime<chrono::Utc> =
            self.env.scalar("SELECT clock_timestamp()").await;
        self.wait_until(Duration::from_secs(15), || async move {
            sqlx::query_scalar::<_, bool>(
                "SELECT renewed_at > $1 AND EXISTS (SELECT 1 FROM pg_stat_activity a \
                     WHERE a.pid = instance_lease.backend_pid) \
                 FROM instance_lease WHERE id = 1",
            )
            .bind(since)
            .fetch_one(self.env.store.pool())
            .await
            .unwrap_or(false)
        })
        .await
    }
}
