//! A pause point the harness drives (issue 52 item 3): the overlap of a pair's two mutating
//! actions proven at the database, not by two wall-clock spans that include process start-up.
//!
//! For a replay or a recover-backfill beside the DB owner's purge: the purge opens its inbox
//! transaction (rows locked, deleted, not committed), the harness takes a row lock in our
//! store on the rows the first action must change, and only then lets the first action's CLI
//! start (its PostgreSQL sessions named [`Gate::app`] through `PGAPPNAME`). The CLI's
//! transaction reaches the locked row and waits: PostgreSQL's own activity view shows it open
//! and waiting on a lock while the purge's transaction is open. Then the purge commits, the
//! row lock is released, and the CLI goes on. A CLI never seen waiting within
//! [`PROOF_LIMIT`] is a harness failure (the overlap was not proven), not a pass.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::sync::Notify;

/// How long the purge's open transaction waits for the CLI's transaction to show up.
pub const PROOF_LIMIT: Duration = Duration::from_secs(15);

/// A pair's pause point, set by the pair and used by the purge.
#[derive(Clone)]
pub struct Gate {
    /// Our store's rows the first action's transaction must lock.
    pub rows: Vec<i64>,
    /// `application_name` of the first action's sessions.
    pub app: String,
    /// Told when the first action may start (the purge's transaction is open, or the purge
    /// found nothing to delete).
    pub go: Arc<Notify>,
}

/// What the gate saw: the proof line, or why there is none.
pub enum Proof {
    /// Both transactions open at once (the line says when, from the database's view).
    Seen(String),
    /// The CLI's transaction never showed up waiting.
    Missed(String),
}

impl Gate {
    pub fn new(rows: Vec<i64>, tag: &str) -> Gate {
        Gate {
            rows,
            app: format!("msgx-pair-{tag}"),
            go: Arc::new(Notify::new()),
        }
    }

    /// With the purge's inbox transaction open (begun at `purge_open`): locks the rows in our
    /// store, lets the first action start, waits until PostgreSQL shows its transaction
    /// waiting on a lock, and returns the held lock (release it after the purge's COMMIT)
    /// with the proof.
    pub async fn hold_until_seen(
        &self,
        pool: &PgPool,
        purge_open: Instant,
    ) -> (Option<sqlx::Transaction<'static, sqlx::Postgres>>, Proof) {
        let mut lock = match pool.begin().await {
            Ok(tx) => tx,
            Err(e) => {
                self.go.notify_one();
                return (
                    None,
                    Proof::Missed(format!("could not begin the row lock: {e}")),
                );
            }
        };
        let locked = sqlx::query("SELECT msg_id FROM proc_state WHERE msg_id = ANY($1) FOR UPDATE")
            .bind(&self.rows)
            .execute(&mut *lock)
            .await;
        if let Err(e) = locked {
            self.go.notify_one();
            return (
                None,
                Proof::Missed(format!("could not lock {:?}: {e}", self.rows)),
            );
        }
        self.go.notify_one();
        let start = Instant::now();
        while start.elapsed() < PROOF_LIMIT {
            let seen: Option<(String, String)> = sqlx::query_as(
                "SELECT to_char(xact_start, 'HH24:MI:SS.MS'), \
                        COALESCE(wait_event_type, '') || '/' || COALESCE(wait_event, '') \
                 FROM pg_stat_activity WHERE application_name = $1 \
                   AND xact_start IS NOT NULL AND wait_event_type = 'Lock' LIMIT 1",
            )
            .bind(&self.app)
            .fetch_optional(pool)
            .await
            .ok()
            .flatten();
            if let Some((since, wait)) = seen {
                let line = format!(
                    "the first action's transaction (open since {since}, waiting {wait} on the \
                     harness's row lock of {:?}) while the purge's inbox transaction was open \
                     ({} ms, uncommitted)",
                    self.rows,
                    purge_open.elapsed().as_millis()
                );
                return (Some(lock), Proof::Seen(line));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let why = format!(
            "no session {} waited on the row lock of {:?} within {PROOF_LIMIT:?}",
            self.app, self.rows
        );
        (Some(lock), Proof::Missed(why))
    }
}
