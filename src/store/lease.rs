//! The single-instance lease (SPEC §8, seed §5.1: two pollers would overwrite W) with a fencing
//! token. One row, `instance_lease`: the holder renews `expires_at` every `lease.renew_every`
//! from a dedicated session whose pid it records. Another instance takes the lease when it
//! expired (the holder froze or lost the store) or when the recorded session is gone and no
//! renewal came for half a ttl (the holder was killed; a live holder whose connection broke
//! has that long to reconnect and renew) — at once when the holder is a process on this host
//! that no longer runs — and bumps `epoch`: from then on every write of the old holder fails
//! (migration 0006, [`super::Store::fenced`]), and its next renewal tells it to stop.
//!
//! Time is PostgreSQL's (`clock_timestamp()`): holder and standby compare against one clock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};
use tokio::sync::Mutex;

use super::{Store, StoreError};

/// Lease timing.
#[derive(Debug, Clone, Copy)]
pub struct LeaseConfig {
    /// Lifetime of a renewal.
    pub ttl: Duration,
    /// One acquire/renew/release may take this long.
    pub check_timeout: Duration,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(10),
            check_timeout: Duration::from_secs(3),
        }
    }
}

/// An expiry further ahead than this was not written by any valid `lease.ttl` (≤ 10m): the
/// row was edited by hand.
const TAMPER_SLACK: f64 = 600.0 + 60.0;

/// The lease this instance holds.
#[derive(Debug, Clone)]
pub struct InstanceLock {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The renewing session (reopened after an error).
    conn: Mutex<Option<PgConnection>>,
    options: PgConnectOptions,
    epoch: i64,
    holder: String,
    cfg: LeaseConfig,
    /// When the last renewal succeeded (monotonic, local).
    renewed: std::sync::Mutex<Instant>,
    /// Given up ([`InstanceLock::release`]): renewals stop.
    released: std::sync::atomic::AtomicBool,
}

const TAKE: &str = "UPDATE instance_lease SET epoch = epoch + 1, holder = $1, \
       acquired_at = clock_timestamp(), renewed_at = clock_timestamp(), \
       expires_at = clock_timestamp() + make_interval(secs => $2), backend_pid = pg_backend_pid() \
     WHERE id = 1 AND (holder IS NULL OR expires_at IS NULL OR backend_pid IS NULL \
       OR expires_at <= clock_timestamp() \
       OR (renewed_at < clock_timestamp() - make_interval(secs => $2 / 2) \
           AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = instance_lease.backend_pid)) \
       OR (holder = $3 AND NOT EXISTS \
           (SELECT 1 FROM pg_stat_activity a WHERE a.pid = instance_lease.backend_pid))) \
     RETURNING epoch";

const HOLDER: &str = "SELECT holder FROM instance_lease WHERE id = 1";

const RENEW: &str = "UPDATE instance_lease SET renewed_at = clock_timestamp(), \
       expires_at = clock_timestamp() + make_interval(secs => $3), backend_pid = pg_backend_pid() \
     WHERE id = 1 AND epoch = $1 AND holder = $2 RETURNING epoch";

const READ: &str = "SELECT epoch, holder, \
       EXTRACT(EPOCH FROM (expires_at - clock_timestamp()))::float8 \
     FROM instance_lease WHERE id = 1";

/// Sessions of older epochs (a frozen predecessor) are ended at takeover: their open
/// transactions roll back and release the pipeline lock at once.
const EVICT: &str = "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
     WHERE datname = current_database() AND pid <> pg_backend_pid() \
       AND application_name LIKE 'msgexchange e%' AND application_name <> $1) t";

/// The `application_name` of an instance's fenced sessions.
pub fn session_name(epoch: i64) -> String {
    format!("msgexchange e{epoch}")
}

fn this_host() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "?".into())
}

/// `holder` when it names a process on this host that no longer runs (a crashed predecessor
/// restarted by the process manager): its lease can be taken at once, without waiting for
/// the half-ttl grace that protects a live holder whose connection broke.
fn dead_local_holder(holder: &str) -> Option<&str> {
    let (host, rest) = holder.rsplit_once(':')?;
    let pid: u32 = rest.split('#').next()?.parse().ok()?;
    let gone = host == this_host()
        && pid != std::process::id()
        && !std::path::Path::new(&format!("/proc/{pid}")).exists()
        && std::path::Path::new("/proc/self").exists();
    gone.then_some(holder)
}

fn this_holder() -> String {
    let host = this_host();
    // The sequence tells two acquisitions of one process apart (tests run several).
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{host}:{}#{n}", std::process::id())
}

async fn timed<T>(
    limit: Duration,
    fut: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| StoreError::LeaseTimeout(limit))?
}

/// `(epoch, holder, seconds until expiry)`.
type LeaseRow = (i64, Option<String>, Option<f64>);

/// What the lease row says when our statement matched nothing.
async fn explain(conn: &mut PgConnection, epoch: i64, holder: &str) -> StoreError {
    let row: Result<Option<LeaseRow>, _> = sqlx::query_as(READ).fetch_optional(&mut *conn).await;
    match row {
        Err(e) => e.into(),
        Ok(None) => StoreError::LeaseTampered("the instance_lease row is missing".into()),
        Ok(Some((e, h, left))) => {
            let h = h.unwrap_or_default();
            if left.is_some_and(|l| l > TAMPER_SLACK) {
                StoreError::LeaseTampered(format!(
                    "expires in {:.0}s, more than any lease.ttl allows (holder `{h}`, epoch {e})",
                    left.unwrap_or_default()
                ))
            } else if epoch == 0 {
                StoreError::InstanceLocked
            } else if e > epoch && h != holder {
                StoreError::LeaseTakenOver {
                    epoch: e,
                    holder: h,
                }
            } else {
                StoreError::LeaseTampered(format!(
                    "epoch {e} holder `{h}` is not ours (epoch {epoch}, holder `{holder}`) \
                     and no takeover explains it"
                ))
            }
        }
    }
}

impl InstanceLock {
    /// Takes the lease with the default timing, or fails with [`StoreError::InstanceLocked`]
    /// when another live instance holds it.
    pub async fn acquire(store: &Store) -> Result<Self, StoreError> {
        Self::acquire_with(store, LeaseConfig::default()).await
    }

    /// Takes the lease (see the module doc), or fails: [`StoreError::InstanceLocked`] while a
    /// live holder renews it, [`StoreError::LeaseTampered`] when the row makes no sense.
    pub async fn acquire_with(store: &Store, cfg: LeaseConfig) -> Result<Self, StoreError> {
        let options = (*store.pool().connect_options()).clone();
        let holder = this_holder();
        let (conn, epoch) = timed(cfg.check_timeout, async {
            let mut conn = PgConnection::connect_with(&options).await?;
            let previous: Option<Option<String>> =
                sqlx::query_scalar(HOLDER).fetch_optional(&mut conn).await?;
            let dead = previous
                .flatten()
                .and_then(|h| dead_local_holder(&h).map(str::to_string));
            let got: Option<i64> = sqlx::query_scalar(TAKE)
                .bind(&holder)
                .bind(cfg.ttl.as_secs_f64())
                .bind(dead)
                .fetch_optional(&mut conn)
                .await?;
            match got {
                Some(epoch) => Ok((conn, epoch)),
                None => {
                    let why = explain(&mut conn, 0, &holder).await;
                    let _ = conn.close().await;
                    Err(why)
                }
            }
        })
        .await?;
        let mut conn = conn;
        match sqlx::query_scalar::<_, i64>(EVICT)
            .bind(session_name(epoch))
            .fetch_one(&mut conn)
            .await
        {
            Ok(0) => {}
            Ok(n) => tracing::warn!(
                sessions = n,
                epoch,
                "ended the sessions of an older lease holder"
            ),
            Err(e) => tracing::warn!(error = %e, "could not end an older holder's sessions; \
                its locks go with store.idle_in_transaction_timeout"),
        }
        tracing::info!(epoch, holder = %holder, "instance lease taken; epoch bumped");
        Ok(Self {
            inner: Arc::new(Inner {
                conn: Mutex::new(Some(conn)),
                options,
                epoch,
                holder,
                cfg,
                renewed: std::sync::Mutex::new(Instant::now()),
                released: std::sync::atomic::AtomicBool::new(false),
            }),
        })
    }

    /// This instance's fencing token (pass it to [`Store::fenced`]).
    pub fn epoch(&self) -> i64 {
        self.inner.epoch
    }

    /// Renews the lease. Errors: [`StoreError::LeaseTakenOver`] / [`StoreError::LeaseTampered`]
    /// (stop at once), or a transient failure (the store, [`StoreError::LeaseTimeout`]): the
    /// lease may still be ours until [`InstanceLock::expired_locally`].
    pub async fn check(&self) -> Result<(), StoreError> {
        let i = &self.inner;
        let mut guard = i.conn.lock().await;
        if i.released.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(());
        }
        let result = timed(i.cfg.check_timeout, async {
            if guard.is_none() {
                *guard = Some(PgConnection::connect_with(&i.options).await?);
            }
            let Some(conn) = guard.as_mut() else {
                return Err(StoreError::LeaseTimeout(i.cfg.check_timeout));
            };
            let ok: Option<i64> = sqlx::query_scalar(RENEW)
                .bind(i.epoch)
                .bind(&i.holder)
                .bind(i.cfg.ttl.as_secs_f64())
                .fetch_optional(&mut *conn)
                .await?;
            match ok {
                Some(_) => Ok(()),
                None => Err(explain(conn, i.epoch, &i.holder).await),
            }
        })
        .await;
        match &result {
            Ok(()) => *i.renewed.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now(),
            // The session may be broken (or mid-statement after a timeout): reopen next time.
            Err(StoreError::Db(_) | StoreError::LeaseTimeout(_)) => *guard = None,
            Err(_) => {}
        }
        result
    }

    /// True when no renewal succeeded for a whole ttl: a standby may own the lease by now.
    pub fn expired_locally(&self) -> bool {
        let renewed = *self.inner.renewed.lock().unwrap_or_else(|p| p.into_inner());
        renewed.elapsed() >= self.inner.cfg.ttl
    }

    /// Gives the lease up (graceful shutdown): a standby takes it at its next try.
    pub async fn release(&self) -> Result<(), StoreError> {
        let i = &self.inner;
        let mut guard = i.conn.lock().await;
        i.released.store(true, std::sync::atomic::Ordering::Release);
        let result = timed(i.cfg.check_timeout, async {
            if guard.is_none() {
                *guard = Some(PgConnection::connect_with(&i.options).await?);
            }
            let Some(conn) = guard.as_mut() else {
                return Ok(());
            };
            sqlx::query(
                "UPDATE instance_lease SET expires_at = clock_timestamp(), backend_pid = NULL \
                 WHERE id = 1 AND epoch = $1 AND holder = $2",
            )
            .bind(i.epoch)
            .bind(&i.holder)
            .execute(&mut *conn)
            .await?;
            Ok(())
        })
        .await;
        if let Some(conn) = guard.take() {
            let _ = conn.close().await;
        }
        if result.is_ok() {
            tracing::info!(epoch = i.epoch, "instance lease released");
        }
        result
    }
}
