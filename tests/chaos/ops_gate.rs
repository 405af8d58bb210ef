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
//!
//! An approved skip locks only the rows of its range that are still unfinished, so a row
//! lock may find nothing to wait on (the blocker poisoned, its followers done, by the time
//! the purge opened): for it the harness holds the pipeline lock the skip's transaction takes
//! first ([`Gate::pipeline`]) instead, which it waits on whatever the rows are (while the gate
//! holds it no business transaction commits either: the pump waits too).

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
    /// Also hold the service's pipeline lock (the first transaction's first lock).
    pub pipeline: bool,
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
            pipeline: false,
        }
    }

    /// The gate also holds the pipeline lock ([`msgx_core::store::PIPELINE_LOCK_KEY`]).
    pub fn with_pipeline_lock(mut self) -> Gate {
        self.pipeline = true;
        self
    }

    /// With the second action's window open (`during` says which, begun at `purge_open`: the
    /// purge's inbox transaction, or a rotation between its rename and its drop): locks the
    /// rows in our store, lets the first action start, waits until PostgreSQL shows its
    /// transaction waiting on a lock, and returns the held lock (release it once the window
    /// closed) with the proof.
    pub async fn hold_until_seen(
        &self,
        pool: &PgPool,
        purge_open: Instant,
        during: &str,
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
        // The pipeline lock alone, not with the rows: a business transaction holds it and then
        // locks its rows, so taking both could deadlock with the pump.
        let locked = if self.pipeline {
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(msgx_core::store::PIPELINE_LOCK_KEY)
                .execute(&mut *lock)
                .await
        } else {
            sqlx::query("SELECT msg_id FROM proc_state WHERE msg_id = ANY($1) FOR UPDATE")
                .bind(&self.rows)
                .execute(&mut *lock)
                .await
        };
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
                     harness's {}lock of {:?}) while {during} was open ({} ms)",
                    if self.pipeline { "pipeline " } else { "row " },
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

/// `application_name`, its waiting statement's start (epoch seconds, and as text).
type Waiting = (String, f64, String);

/// Two CLI calls of ours open at once, proven at the database (issue 52 item 3): the harness
/// holds the pipeline lock (and `events`' rows, which `events requeue` locks first) while
/// `run` starts both (their sessions named `apps` through `PGAPPNAME`); PostgreSQL's activity
/// view must show both transactions open and waiting on a lock at the same moment. Then the
/// lock is released and both go on. Besides the proof, which of the two started waiting
/// first, by more than [`ORDER_MARGIN`] (an index into `apps`): PostgreSQL grants a lock
/// to its waiters in the order they came, so that one's transaction runs first.
pub async fn hold_both<T>(
    pool: &PgPool,
    apps: [&str; 2],
    events: &[i64],
    run: impl std::future::Future<Output = T>,
) -> (T, Proof, Option<usize>) {
    let locked = async {
        let mut tx = pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(msgx_core::store::PIPELINE_LOCK_KEY)
            .execute(&mut *tx)
            .await?;
        if !events.is_empty() {
            sqlx::query("SELECT event_id FROM msg_event WHERE event_id = ANY($1) FOR UPDATE")
                .bind(events)
                .execute(&mut *tx)
                .await?;
        }
        Ok::<_, sqlx::Error>(tx)
    }
    .await;
    let mut lock = match locked {
        Ok(tx) => Some(tx),
        Err(e) => {
            let why = format!("could not take the pair's locks: {e}");
            return (run.await, Proof::Missed(why), None);
        }
    };
    let watch = async {
        let start = Instant::now();
        let mut seen: Vec<Waiting> = Vec::new();
        while start.elapsed() < PROOF_LIMIT {
            seen = sqlx::query_as(
                "SELECT application_name, extract(epoch FROM query_start)::float8, \
                        to_char(query_start, 'HH24:MI:SS.MS') \
                 FROM pg_stat_activity WHERE application_name = ANY($1) \
                   AND xact_start IS NOT NULL AND wait_event_type = 'Lock'",
            )
            .bind(apps.map(String::from).to_vec())
            .fetch_all(pool)
            .await
            .unwrap_or_default();
            if apps.iter().all(|a| seen.iter().any(|s| s.0 == *a)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if let Some(tx) = lock.take() {
            let _ = tx.commit().await;
        }
        let at = |a: &str| seen.iter().find(|s| s.0 == a).cloned();
        match (at(apps[0]), at(apps[1])) {
            (Some(a), Some(b)) => {
                let line = format!(
                    "both transactions open at once, waiting on the harness's lock: {} since \
                     {}, {} since {}",
                    a.0, a.2, b.0, b.2
                );
                let gap = a.1 - b.1;
                let first = if gap.abs() < ORDER_MARGIN.as_secs_f64() {
                    None
                } else if gap < 0.0 {
                    Some(0)
                } else {
                    Some(1)
                };
                (Proof::Seen(line), first)
            }
            (a, b) => {
                let why = format!(
                    "not both waiting within {PROOF_LIMIT:?}: {} {:?}, {} {:?}",
                    apps[0],
                    a.map(|a| a.2),
                    apps[1],
                    b.map(|b| b.2)
                );
                (Proof::Missed(why), None)
            }
        }
    };
    let (out, (proof, first)) = tokio::join!(run, watch);
    (out, proof, first)
}

/// How far apart two waits must have begun for the harness to call their order.
pub const ORDER_MARGIN: Duration = Duration::from_millis(50);
