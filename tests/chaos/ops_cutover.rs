//! The cutover of a sequence: stock in the inbox, `cutover plan` (read-only), the first start
//! with `pipeline.cutover_watermark`, and what was seeded. A `<id>` above the inbox head must
//! be refused by both (issue 29 item 5); the operator then cuts over with `max`.

use std::time::Duration;

use super::Seq;
use crate::common::instance::Instance;
use crate::ops_plan::Mode;

/// How the first start goes.
pub enum Start {
    /// A fresh store: no cutover.
    Fresh,
    /// Start with these variables.
    With(Vec<(String, String)>),
    /// The sequence cannot go on (a cutover that should have been refused was accepted).
    Abort,
}

impl Seq {
    /// Stock for the cutover, `cutover plan` (read-only), the variables of the first start.
    pub(super) async fn cutover(&mut self) -> Start {
        let Some(c) = self.plan.cutover.clone() else {
            return Start::Fresh;
        };
        let mut ids = Vec::new();
        for i in 0..c.stock {
            ids.push(self.write(c.msg(i)).await);
            if c.gap_after == Some(i) {
                let (tx, gap) = self.env.open_insert().await;
                tx.rollback().await.expect("rollback");
                self.holes.lock().expect("holes").insert(gap);
            }
        }
        for i in &c.premarked {
            self.env.mark_as_owner(&[ids[*i]], "PROCESSED").await;
            self.model.premarked.insert(ids[*i]);
        }
        let head = *ids.last().expect("stock");
        if let Mode::AboveHead(over) = c.mode {
            if !self.refused(head + over).await {
                return Start::Abort;
            }
        }
        let (mode, w) = match c.mode {
            Mode::Min => ("min".to_string(), ids[0] - 1),
            Mode::Zero => ("zero".to_string(), 0),
            Mode::Max | Mode::AboveHead(_) => ("max".to_string(), head),
            Mode::At(i) => (ids[i].to_string(), ids[i]),
        };
        let skips = !matches!(c.mode, Mode::Min | Mode::Zero);
        self.model.cutover_w = Some(w);
        // The rest of the stock is read like any row (the reference model predicts it).
        for id in ids.iter().filter(|id| skips && **id <= w) {
            self.model.skipped_stock.insert(*id);
        }
        let before = self.snapshot().await;
        let out = self
            .cli(&["cutover", "plan", "--mode", &mode, "--json"])
            .await;
        if out.code != Some(0) {
            self.model
                .violation(format!("cutover plan --mode {mode}: {}", out.all()));
        } else {
            let plan = out.json();
            let skipped = self.model.skipped_stock.len() as u64;
            if plan["w"] != w || plan["skipped"]["rows"].as_u64() != Some(skipped) {
                self.model.violation(format!(
                    "cutover plan --mode {mode}: expected W {w} skipping {skipped} rows, got {plan}"
                ));
            }
        }
        if self.snapshot().await != before {
            self.model
                .violation(format!("cutover plan --mode {mode} changed the store"));
        }
        self.model.acted("cutover");
        Start::With(vec![("MSGX_PIPELINE__CUTOVER_WATERMARK".into(), mode)])
    }

    /// A cutover `<id>` above the inbox head: `cutover plan` refuses it (non-zero exit, nothing
    /// written), and so does a service started with it (it exits non-zero or stays unready
    /// without seeding). False when either accepted it.
    async fn refused(&mut self, w: i64) -> bool {
        self.model.acted("cutover_above_head");
        let mode = w.to_string();
        let before = self.snapshot().await;
        let out = self
            .cli(&["cutover", "plan", "--mode", &mode, "--json"])
            .await;
        if out.code == Some(0) {
            self.model.violation(format!(
                "cutover plan --mode {mode} accepted a W above the inbox head: {}",
                out.all()
            ));
        }
        if self.snapshot().await != before {
            self.model
                .violation(format!("cutover plan --mode {mode} changed the store"));
        }
        let name = self.name("above-head");
        let mut i = Instance::spawn(
            &self.vars,
            &name,
            &[("MSGX_PIPELINE__CUTOVER_WATERMARK", &mode)],
        );
        let exited = i.exited_within(Duration::from_secs(15)).await;
        let seeded: i64 = self.env.cursor().await.0;
        let ok = match exited {
            Some(st) => !st.success() && seeded == 0,
            None => !i.ready().await && seeded == 0,
        };
        if exited.is_none() {
            i.kill9();
        }
        if !ok {
            self.model.violation(format!(
                "the service accepted cutover_watermark {mode} above the inbox head (exit \
                 {exited:?}, W now {seeded})"
            ));
        }
        ok && out.code != Some(0)
    }

    /// Our tables and the inbox's marks, as text: unchanged by a read-only command.
    pub(super) async fn snapshot(&self) -> String {
        let pg: String = sqlx::query_scalar(
            "SELECT concat_ws('|', (SELECT row_to_json(c)::text FROM inbox_cursor c), \
                    (SELECT count(*) FROM proc_state), (SELECT count(*) FROM cutover_stock), \
                    (SELECT count(*) FROM cutover_gap), (SELECT count(*) FROM late_watch_range), \
                    (SELECT count(*) FROM audit_log), (SELECT count(*) FROM inbox_hole))",
        )
        .fetch_one(self.env.store.pool())
        .await
        .expect("snapshot");
        let my: (i64, Option<String>) = sqlx::query_as(
            "SELECT count(*), CAST(GROUP_CONCAT(CONCAT(CMINMSGS_ID, ':', \
                    COALESCE(CMINMSGS_STATUS, '-')) ORDER BY CMINMSGS_ID) AS CHAR) FROM CMINMSGS",
        )
        .fetch_one(&self.env.owner)
        .await
        .expect("inbox snapshot");
        format!("{pg} {my:?}")
    }

    /// After the first start: the seeded W and the skipped stock are what the plan said.
    pub(super) async fn check_seeded(&mut self) {
        let row: Option<(i64, i64)> = sqlx::query_as("SELECT w, stock_rows FROM cutover_stock")
            .fetch_optional(self.env.store.pool())
            .await
            .expect("cutover_stock");
        let skipped = self.model.skipped_stock.len() as i64;
        let expect_w = self.model.cutover_w.unwrap_or_default();
        match row {
            Some((w, rows)) if rows == skipped && w == expect_w => {}
            other => self.model.violation(format!(
                "cutover seeded {other:?} (w, stock_rows); expected {skipped} skipped rows up \
                 to {expect_w}"
            )),
        }
    }
}
