//! Service configuration: `config/default.toml`, then an optional extra file, then `MSGX_*`
//! environment variables (`MSGX_SECTION__KEY`, e.g. `MSGX_PIPELINE__MAX_COMMIT_DELAY=5m`).
//!
//! Every key is validated at start-up; a bad value fails with one line naming the key, so an
//! operator never starts a service that would misbehave later.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::cutover::CutoverMode;
use crate::inbox::names::{InboxNames, OutboxNames};

/// Why the configuration could not be loaded. The message always names the key.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The sources could not be read or a value has the wrong type.
    #[error("configuration error: {0}")]
    Load(String),
    /// A value parsed but is not acceptable.
    #[error("configuration error: `{key}`: {reason}")]
    Invalid { key: &'static str, reason: String },
}

fn invalid(key: &'static str, reason: impl Into<String>) -> SettingsError {
    SettingsError::Invalid {
        key,
        reason: reason.into(),
    }
}

/// Everything the service reads at start-up.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The shared MySQL inbox we read from and mark (owned by the DB owner).
    pub inbox: InboxSettings,
    /// Our own PostgreSQL: queue, cursor, flight state.
    pub store: StoreSettings,
    /// Event delivery target (used by the dispatcher).
    pub kafka: KafkaSettings,
    /// Draining `MSG_EVENT` into Kafka (the dispatcher).
    pub dispatch: DispatchSettings,
    /// Discovery rules.
    pub pipeline: PipelineSettings,
    /// Processing rules (the pump).
    pub processing: ProcessingSettings,
    /// Marking processed rows in the inbox (the backfill sweeper).
    pub backfill: BackfillSettings,
    /// Watching released holes for late commits.
    pub late: LateSettings,
    /// Our requests to upstream through the outbound table (`COUTMSGS`).
    pub outbound: OutboundSettings,
    /// The HTTP surface (`/metrics`, health).
    pub http: HttpSettings,
    /// Logging.
    pub log: LogSettings,
    /// The single-instance lease and the hot standby.
    pub lease: LeaseSettings,
    /// Restart intensity and graceful shutdown.
    pub supervisor: SupervisorSettings,
    /// How long our own records are kept (the housekeeping actor), and raw-text retention: the
    /// DB owner's (`r_keep`) and our own copy (`raw_copy`).
    pub retention: RetentionSettings,
}

/// Connection and naming of the shared inbox.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InboxSettings {
    /// `mysql://user:password@host:port/database`; the password is never logged.
    pub url: String,
    /// Zone the inbox DATETIME columns are written in (they carry none).
    pub timezone: String,
    /// Opening a connection may take this long before the round counts as failed.
    #[serde(with = "humantime_serde_compat")]
    pub connect_timeout: Duration,
    /// One inbox statement may take this long; a slow inbox is an infrastructure failure.
    #[serde(with = "humantime_serde_compat")]
    pub query_timeout: Duration,
    /// Pool size; the poller needs one, the pump and sweeper one each later.
    pub max_connections: u32,
    /// Inbound table name (DB owner's contract).
    pub table: String,
    /// Auto-increment id column.
    pub id_column: String,
    /// Receive time column (DATETIME, nullable).
    pub received_column: String,
    /// Raw message column (LONGTEXT).
    pub message_column: String,
    /// Processed-time mark column.
    pub processed_column: String,
    /// Processed-status mark column.
    pub status_column: String,
    /// Outbound table name (written by the outbound path, created only by the dev fixture).
    pub out_table: String,
    /// MySQL `net_read_timeout` of our sessions (whole seconds): a stalled read is an error.
    #[serde(with = "humantime_serde_compat")]
    pub read_timeout: Duration,
    /// MySQL `net_write_timeout` of our sessions (whole seconds).
    #[serde(with = "humantime_serde_compat")]
    pub write_timeout: Duration,
}

/// Own PostgreSQL.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSettings {
    /// `postgres://user:password@host:port/database`; the password is never logged.
    pub url: String,
    /// Pool size.
    pub max_connections: u32,
    /// Opening a connection may take this long.
    #[serde(with = "humantime_serde_compat")]
    pub connect_timeout: Duration,
    /// Create the database named in `url` when it does not exist (dev and demo convenience).
    pub create_database: bool,
    /// `run` brings an older or empty schema to this binary's at start; off: it refuses to
    /// start instead (sites that migrate by hand with `msgexchange migrate`).
    pub migrate_at_start: bool,
    /// How long start-up waits for the single-instance lock (a killed predecessor's session
    /// may take a moment to end) before refusing to start.
    #[serde(with = "humantime_serde_compat")]
    pub instance_lock_wait: Duration,
    /// PostgreSQL `statement_timeout` of our sessions (migrations run without it).
    #[serde(with = "humantime_serde_compat")]
    pub statement_timeout: Duration,
    /// PostgreSQL `lock_timeout`: a lock held by a frozen old instance fails the step instead
    /// of blocking it for ever.
    #[serde(with = "humantime_serde_compat")]
    pub lock_timeout: Duration,
    /// PostgreSQL `idle_in_transaction_session_timeout`: a session that froze inside a
    /// transaction (SIGSTOP, a hung client) is ended by the server and its locks released.
    #[serde(with = "humantime_serde_compat")]
    pub idle_in_transaction_timeout: Duration,
}

mod kafka;
pub use kafka::{redact_extra, DispatchSettings, KafkaSettings};
mod outbound;
pub use outbound::{parse_daily_time, OutboundSettings};
mod layers;
pub use layers::DEFAULT_TOML;
mod reliability;
pub use reliability::{LeaseSettings, SupervisorSettings, MARK_MARGIN, MAX_DURATION};
mod retention;
pub use retention::{RetentionSettings, VacuumMode};

/// Pipeline rules.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineSettings {
    /// Pause between poll rounds when the inbox is idle: empty rounds back off to it.
    #[serde(with = "humantime_serde_compat")]
    pub poll_interval: Duration,
    /// Shortest gap between two round starts while rounds find rows (adaptive discovery):
    /// under traffic a row waits about this long for its round; ≤ `poll_interval`.
    #[serde(with = "humantime_serde_compat")]
    pub min_poll_gap: Duration,
    /// Rows read per poll round (`LIMIT`).
    pub claim_batch: u32,
    /// While the rows read are not contiguous from W+1 (a hole), read up to this many pages of
    /// `claim_batch` rows per round, so holes further on are sighted — and age — side by side
    /// instead of one page at a time.
    pub hole_sight_ahead: u32,
    /// How long a hole may stay open before it is released as permanent (G7: a placeholder
    /// until the DB owner states the id-allocation → visibility bound).
    #[serde(with = "humantime_serde_compat")]
    pub max_commit_delay: Duration,
    /// Explicit one-time cutover seeding: `min`, `zero`, `max` or an id; empty = none.
    pub cutover_watermark: String,
    /// Let the enqueue transaction commit without waiting for the WAL flush: a lost enqueue
    /// (and its W) is simply re-read, so it is safe; processing never does this.
    pub async_enqueue_commit: bool,
}

/// Processing rules (SPEC §4).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessingSettings {
    /// A FAILED head older than this (from its first attempt) is poison → DEAD(EXHAUSTED).
    #[serde(with = "humantime_serde_compat")]
    pub head_deadline: Duration,
    /// A head with this many attempts is poison.
    pub max_attempts: i32,
    /// First retry delay after a failure (doubles per attempt).
    #[serde(with = "humantime_serde_compat")]
    pub retry_initial: Duration,
    /// Longest retry delay.
    #[serde(with = "humantime_serde_compat")]
    pub retry_max: Duration,
    /// A message larger than this is MALFORMED (and never transferred).
    pub max_message_bytes: u64,
    /// Add the send date to the business identity (Q11: SEQN may reset).
    pub identity_with_date: bool,
    /// FLOP subtypes the codec knows, comma-separated; others are UNSUPPORTED.
    pub flop_subtypes: String,
    /// Raw messages read from the inbox per round trip, ahead of the head (reads have no
    /// side effects).
    pub read_ahead: u32,
    /// How often the pump looks for work when nobody woke it (a safety net).
    #[serde(with = "humantime_serde_compat")]
    pub idle_poll: Duration,
    /// Window of the processing rate behind `msgx_pipeline_estimated_drain_seconds` (G6).
    #[serde(with = "humantime_serde_compat")]
    pub drain_rate_window: Duration,
    /// Most consecutive ready heads applied in one business transaction (group commit, one
    /// WAL flush per group); 1 turns grouping off.
    pub group_max: u32,
    /// A group takes no further member once it has run this long.
    #[serde(with = "humantime_serde_compat")]
    pub group_max_wait: Duration,
}

impl ProcessingSettings {
    /// The FLOP subtypes as a list.
    pub fn flop_subtype_list(&self) -> Vec<String> {
        self.flop_subtypes
            .split(',')
            .map(|s| s.trim().to_ascii_uppercase())
            .filter(|s| !s.is_empty())
            .collect()
    }
}

/// Backfill (SPEC §5, seed §5.2).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackfillSettings {
    /// Sweep schedule (a period, not a completion deadline).
    #[serde(with = "humantime_serde_compat")]
    pub period: Duration,
    /// Rows per sweep batch (one UPDATE + one existence check per batch).
    pub batch: u32,
    /// The DB owner's "processed" status value written into the status mark column.
    pub mark_value: String,
    /// First retry delay after a transient failure (doubles).
    #[serde(with = "humantime_serde_compat")]
    pub retry_initial: Duration,
    /// Longest retry delay.
    #[serde(with = "humantime_serde_compat")]
    pub retry_max: Duration,
    /// Transient failures before the row is abandoned (MAX_ATTEMPTS) with an alert.
    pub max_attempts: i32,
    /// R: rows received longer ago than this are retried every sweep (overrides backoff).
    #[serde(with = "humantime_serde_compat")]
    pub overdue_after: Duration,
    /// Wall time the inbox part of one sweep (existence check, marks) may take while the sweep
    /// holds its PostgreSQL row locks; at least [`MARK_MARGIN`] below
    /// `store.idle_in_transaction_timeout`.
    #[serde(with = "humantime_serde_compat")]
    pub mark_budget: Duration,
}

/// Late detection (SPEC §6).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LateSettings {
    /// How often watched ids are checked against the inbox.
    #[serde(with = "humantime_serde_compat")]
    pub detect_period: Duration,
    /// How long a released id stays watched.
    #[serde(with = "humantime_serde_compat")]
    pub watch_window: Duration,
    /// Ids checked per inbox round trip.
    pub batch: u32,
    /// Release holes early / hold them on transaction evidence from
    /// `information_schema.INNODB_TRX` (needs PROCESS; valid on the primary only;
    /// docs/hole-evidence.md).
    pub hole_evidence: bool,
    /// With evidence: hard cap for holding a hole while an older transaction is still open.
    #[serde(with = "humantime_serde_compat")]
    pub hole_evidence_cap: Duration,
    /// Compensation scan (seed §5.1 stage 1): how many ids behind W are re-read for rows
    /// discovery never saw (id reuse after a table rotation, a restore); 0 = off.
    pub compensation_window: u64,
    /// How often the compensation scan runs.
    #[serde(with = "humantime_serde_compat")]
    pub compensation_period: Duration,
}

/// HTTP surface.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    /// Listen address of `/metrics`, `/healthz`, `/readyz` (and `/admin/*` when enabled).
    pub listen: String,
    /// Bearer token of the admin API and the compat entry, with every scope (kept from earlier
    /// versions). With this and the scoped lists all empty there is no admin surface (404).
    /// At least 16 characters; never logged. A token with every scope (read, operate, compat).
    pub admin_token: String,
    /// Comma-separated bearer tokens that may read `/admin/*` (status, messages, dead events).
    #[serde(default)]
    pub read_tokens: String,
    /// Comma-separated bearer tokens that may also run the audited actions (`POST /admin/*`).
    #[serde(default)]
    pub operate_tokens: String,
    /// Comma-separated bearer tokens that may call only the compat entry `POST /cminmsgs/send`.
    #[serde(default)]
    pub compat_tokens: String,
}

impl fmt::Debug for HttpSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let token = if self.admin_token.is_empty() {
            ""
        } else {
            "***"
        };
        let count = |list: &str| list.split(',').filter(|t| !t.trim().is_empty()).count();
        f.debug_struct("HttpSettings")
            .field("listen", &self.listen)
            .field("admin_token", &token)
            .field("read_tokens", &count(&self.read_tokens))
            .field("operate_tokens", &count(&self.operate_tokens))
            .field("compat_tokens", &count(&self.compat_tokens))
            .finish()
    }
}

/// Logging.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    /// `tracing` filter, e.g. `info,msgx_core=debug`; `RUST_LOG` overrides it.
    pub level: String,
    /// `text` for people, `json` for log shippers.
    pub format: String,
}

impl Settings {
    /// Loads `config/default.toml` (or `base`), an optional extra file, then `MSGX_*` env.
    pub fn load(base: &Path, extra: Option<&Path>) -> Result<Self, SettingsError> {
        let mut builder =
            config::Config::builder().add_source(config::File::from(base).required(true));
        if let Some(extra) = extra {
            builder = builder.add_source(config::File::from(extra).required(true));
        }
        Self::from_builder(builder.add_source(env_source(None)))
    }

    /// Same as [`Settings::load`] with explicit environment pairs (tests).
    pub fn load_with_env(base: &Path, env: &[(&str, &str)]) -> Result<Self, SettingsError> {
        let map = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let builder = config::Config::builder()
            .add_source(config::File::from(base).required(true))
            .add_source(env_source(Some(map)));
        Self::from_builder(builder)
    }

    fn from_builder(
        builder: config::ConfigBuilder<config::builder::DefaultState>,
    ) -> Result<Self, SettingsError> {
        let cfg = builder
            .build()
            .map_err(|e| SettingsError::Load(e.to_string()))?;
        let settings: Settings = cfg
            .try_deserialize()
            .map_err(|e| SettingsError::Load(e.to_string()))?;
        settings.validate()?;
        Ok(settings)
    }

    /// Checks what serde cannot: ranges, names, zones, URLs.
    pub fn validate(&self) -> Result<(), SettingsError> {
        let i = &self.inbox;
        check_url(&i.url, "inbox.url", &["mysql://", "mariadb://"])?;
        self.inbox_timezone()?;
        self.inbox_names()?;
        self.outbox_names()?;
        check_positive(i.max_connections, "inbox.max_connections")?;
        check_nonzero(i.connect_timeout, "inbox.connect_timeout")?;
        check_nonzero(i.query_timeout, "inbox.query_timeout")?;
        check_url(
            &self.store.url,
            "store.url",
            &["postgres://", "postgresql://"],
        )?;
        check_positive(self.store.max_connections, "store.max_connections")?;
        check_nonzero(self.store.connect_timeout, "store.connect_timeout")?;
        self.kafka.validate()?;
        self.dispatch.validate()?;
        self.outbound.validate()?;
        self.retention.validate()?;
        let p = &self.pipeline;
        check_nonzero(p.poll_interval, "pipeline.poll_interval")?;
        check_min_poll_gap(p)?;
        check_nonzero(p.max_commit_delay, "pipeline.max_commit_delay")?;
        if p.claim_batch == 0 || p.claim_batch > 50_000 {
            return Err(invalid(
                "pipeline.claim_batch",
                format!("{} is outside 1..=50000", p.claim_batch),
            ));
        }
        self.cutover()?;
        let b = &self.backfill;
        check_nonzero(b.period, "backfill.period")?;
        check_nonzero(b.retry_initial, "backfill.retry_initial")?;
        check_nonzero(b.overdue_after, "backfill.overdue_after")?;
        if b.retry_max < b.retry_initial {
            return Err(invalid(
                "backfill.retry_max",
                "shorter than backfill.retry_initial",
            ));
        }
        if b.batch == 0 || b.batch > 10_000 {
            return Err(invalid("backfill.batch", "outside 1..=10000"));
        }
        if b.max_attempts < 1 {
            return Err(invalid("backfill.max_attempts", "must be at least 1"));
        }
        let mark = b.mark_value.trim();
        if mark.is_empty() || mark.len() > 32 {
            return Err(invalid(
                "backfill.mark_value",
                "must be 1..=32 characters (the DB owner's value)",
            ));
        }
        if self.pipeline.hole_sight_ahead == 0 || self.pipeline.hole_sight_ahead > 1000 {
            return Err(invalid("pipeline.hole_sight_ahead", "outside 1..=1000"));
        }
        let l = &self.late;
        check_nonzero(l.detect_period, "late.detect_period")?;
        check_nonzero(l.watch_window, "late.watch_window")?;
        if l.batch == 0 || l.batch > 10_000 {
            return Err(invalid("late.batch", "outside 1..=10000"));
        }
        if l.hole_evidence && l.hole_evidence_cap < self.pipeline.max_commit_delay {
            return Err(invalid(
                "late.hole_evidence_cap",
                "shorter than pipeline.max_commit_delay",
            ));
        }
        if l.compensation_window > 100_000_000 {
            return Err(invalid("late.compensation_window", "above 100000000 ids"));
        }
        check_nonzero(l.compensation_period, "late.compensation_period")?;
        let q = &self.processing;
        check_nonzero(q.head_deadline, "processing.head_deadline")?;
        check_nonzero(q.retry_initial, "processing.retry_initial")?;
        check_nonzero(q.idle_poll, "processing.idle_poll")?;
        if q.drain_rate_window < Duration::from_secs(10) {
            return Err(invalid(
                "processing.drain_rate_window",
                "shorter than 10s (the backlog is sampled every 5s)",
            ));
        }
        if q.retry_max < q.retry_initial {
            return Err(invalid(
                "processing.retry_max",
                "shorter than processing.retry_initial",
            ));
        }
        if q.max_attempts < 1 {
            return Err(invalid("processing.max_attempts", "must be at least 1"));
        }
        if q.max_message_bytes < 1024 {
            return Err(invalid("processing.max_message_bytes", "below 1024 bytes"));
        }
        if q.read_ahead == 0 || q.read_ahead > 1000 {
            return Err(invalid("processing.read_ahead", "outside 1..=1000"));
        }
        if q.flop_subtype_list().is_empty() {
            return Err(invalid("processing.flop_subtypes", "lists no subtype"));
        }
        if q.group_max == 0 || q.group_max > 1000 {
            return Err(invalid("processing.group_max", "outside 1..=1000"));
        }
        check_nonzero(q.group_max_wait, "processing.group_max_wait")?;
        self.http
            .listen
            .parse::<std::net::SocketAddr>()
            .map_err(|e| invalid("http.listen", format!("`{}`: {e}", self.http.listen)))?;
        let token = &self.http.admin_token;
        if !token.is_empty() && (token.len() < 16 || token.chars().any(char::is_whitespace)) {
            return Err(invalid(
                "http.admin_token",
                "must be empty (no admin surface) or at least 16 characters without spaces",
            ));
        }
        for (key, list) in [
            ("http.read_tokens", &self.http.read_tokens),
            ("http.operate_tokens", &self.http.operate_tokens),
            ("http.compat_tokens", &self.http.compat_tokens),
        ] {
            let bad = list
                .split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .any(|t| t.len() < 16 || t.chars().any(char::is_whitespace));
            if bad {
                return Err(invalid(
                    key,
                    "every token must be at least 16 characters without spaces (comma-separated)",
                ));
            }
        }
        if !matches!(self.log.format.as_str(), "text" | "json") {
            return Err(invalid(
                "log.format",
                format!("`{}` is not `text` or `json`", self.log.format),
            ));
        }
        reliability::validate(self)?;
        retention::validate(self)?;
        Ok(())
    }

    /// The inbox zone as a parsed tz.
    pub fn inbox_timezone(&self) -> Result<chrono_tz::Tz, SettingsError> {
        self.inbox.timezone.parse::<chrono_tz::Tz>().map_err(|_| {
            invalid(
                "inbox.timezone",
                format!("`{}` is not an IANA zone", self.inbox.timezone),
            )
        })
    }

    /// Validated inbox identifiers.
    pub fn inbox_names(&self) -> Result<InboxNames, SettingsError> {
        let i = &self.inbox;
        InboxNames::new(
            &i.table,
            &i.id_column,
            &i.received_column,
            &i.message_column,
            &i.processed_column,
            &i.status_column,
        )
        .map_err(|(key, reason)| invalid(key, reason))
    }

    /// Validated outbound table name.
    pub fn outbox_names(&self) -> Result<OutboxNames, SettingsError> {
        let o = &self.outbound;
        OutboxNames::with_columns(
            &self.inbox.out_table,
            &o.id_column,
            &o.created_column,
            &o.message_column,
        )
        .map_err(|(key, reason)| invalid(key, reason))
    }

    /// The parsed cutover mode, `None` when not configured.
    pub fn cutover(&self) -> Result<Option<CutoverMode>, SettingsError> {
        CutoverMode::parse(&self.pipeline.cutover_watermark)
            .map_err(|reason| invalid("pipeline.cutover_watermark", reason))
    }
}

fn env_source(map: Option<config::Map<String, String>>) -> config::Environment {
    config::Environment::with_prefix("MSGX")
        .prefix_separator("_")
        .separator("__")
        .try_parsing(true)
        .source(map)
}

fn check_url(url: &str, key: &'static str, schemes: &[&str]) -> Result<(), SettingsError> {
    if schemes.iter().any(|s| url.starts_with(s)) && url.len() > 12 {
        Ok(())
    } else {
        Err(invalid(
            key,
            format!(
                "`{}` must start with {}",
                redact_url(url),
                schemes.join(" or ")
            ),
        ))
    }
}

fn check_positive(v: u32, key: &'static str) -> Result<(), SettingsError> {
    if v == 0 {
        return Err(invalid(key, "must be at least 1"));
    }
    Ok(())
}

/// `pipeline.min_poll_gap`: above zero (never a busy loop) and at most `poll_interval`.
fn check_min_poll_gap(p: &PipelineSettings) -> Result<(), SettingsError> {
    check_nonzero(p.min_poll_gap, "pipeline.min_poll_gap")?;
    if p.min_poll_gap > p.poll_interval {
        return Err(invalid(
            "pipeline.min_poll_gap",
            format!(
                "{:?} is longer than pipeline.poll_interval {:?}",
                p.min_poll_gap, p.poll_interval
            ),
        ));
    }
    Ok(())
}

fn check_nonzero(d: Duration, key: &'static str) -> Result<(), SettingsError> {
    if d.is_zero() {
        return Err(invalid(key, "must be longer than 0s"));
    }
    Ok(())
}

/// A URL with its password replaced by `***`, safe for logs and errors.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest = &url[scheme_end + 3..];
    let Some(at) = rest.find('@') else {
        return url.to_string();
    };
    let creds = &rest[..at];
    match creds.find(':') {
        Some(colon) => format!(
            "{}{}:***{}",
            &url[..scheme_end + 3],
            &creds[..colon],
            &rest[at..]
        ),
        None => url.to_string(),
    }
}

impl fmt::Debug for InboxSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InboxSettings")
            .field("url", &redact_url(&self.url))
            .field("timezone", &self.timezone)
            .field("table", &self.table)
            .field("max_connections", &self.max_connections)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for StoreSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreSettings")
            .field("url", &redact_url(&self.url))
            .field("max_connections", &self.max_connections)
            .finish_non_exhaustive()
    }
}

/// humantime durations (`"5m"`, `"30s"`, `"1h 30m"`) for serde, with the value in the error.
mod humantime_serde_compat {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let raw = String::deserialize(d)?;
        humantime::parse_duration(raw.trim()).map_err(|e| {
            serde::de::Error::custom(format!(
                "`{raw}` is not a duration like \"5m\" or \"30s\" ({e})"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn default_toml() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("config/default.toml")
    }

    #[test]
    fn default_file_is_valid() {
        let s = Settings::load_with_env(&default_toml(), &[]).expect("defaults load");
        assert_eq!(s.pipeline.max_commit_delay, Duration::from_secs(300));
        assert_eq!(s.inbox.table, "CMINMSGS");
        assert!(s.cutover().expect("cutover").is_none());
    }

    #[test]
    fn env_overrides_with_double_underscore() {
        let s = Settings::load_with_env(
            &default_toml(),
            &[
                ("MSGX_PIPELINE__MAX_COMMIT_DELAY", "7m"),
                ("MSGX_PIPELINE__CLAIM_BATCH", "17"),
                ("MSGX_INBOX__TABLE", "INBOX2"),
                ("MSGX_KAFKA__BROKERS", "k1:9092,k2:9092"),
            ],
        )
        .expect("load");
        assert_eq!(s.pipeline.max_commit_delay, Duration::from_secs(420));
        assert_eq!(s.pipeline.claim_batch, 17);
        assert_eq!(s.inbox.table, "INBOX2");
        assert_eq!(s.kafka.brokers, "k1:9092,k2:9092");
    }

    fn err_of(env: &[(&str, &str)]) -> String {
        Settings::load_with_env(&default_toml(), env)
            .expect_err("must fail")
            .to_string()
    }

    #[test]
    fn bad_values_name_their_key() {
        let e = err_of(&[("MSGX_PIPELINE__MAX_COMMIT_DELAY", "five minutes")]);
        assert!(e.contains("max_commit_delay"), "{e}");
        let e = err_of(&[("MSGX_PIPELINE__CLAIM_BATCH", "0")]);
        assert!(e.contains("pipeline.claim_batch"), "{e}");
        let e = err_of(&[("MSGX_INBOX__TABLE", "CMINMSGS; DROP TABLE x")]);
        assert!(e.contains("inbox.table"), "{e}");
        let e = err_of(&[("MSGX_INBOX__TIMEZONE", "Mars/Olympus")]);
        assert!(e.contains("inbox.timezone"), "{e}");
        let e = err_of(&[("MSGX_PIPELINE__CUTOVER_WATERMARK", "latest")]);
        assert!(e.contains("pipeline.cutover_watermark"), "{e}");
        let e = err_of(&[("MSGX_STORE__URL", "mysql://x@y/z")]);
        assert!(e.contains("store.url"), "{e}");
        let e = err_of(&[("MSGX_HTTP__LISTEN", "nowhere")]);
        assert!(e.contains("http.listen"), "{e}");
        let e = err_of(&[("MSGX_PIPELINE__POLL_INTERVAL", "0s")]);
        assert!(e.contains("pipeline.poll_interval"), "{e}");
        let e = err_of(&[("MSGX_PIPELINE__MIN_POLL_GAP", "0s")]);
        assert!(e.contains("pipeline.min_poll_gap"), "{e}");
        let e = err_of(&[
            ("MSGX_PIPELINE__POLL_INTERVAL", "200ms"),
            ("MSGX_PIPELINE__MIN_POLL_GAP", "1s"),
        ]);
        assert!(e.contains("pipeline.min_poll_gap"), "{e}");
    }

    #[test]
    fn r_may_not_exceed_the_owners_retention() {
        let s = Settings::load_with_env(&default_toml(), &[]).expect("defaults");
        assert!(
            !s.retention.raw_copy,
            "off by default (docs/open-questions.md Q6/Q7)"
        );
        assert!(s.backfill.overdue_after <= s.retention.r_keep);
        let e = err_of(&[("MSGX_BACKFILL__OVERDUE_AFTER", "40d")]);
        assert!(
            e.contains("`backfill.overdue_after`") && e.contains("retention.r_keep"),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1, "{e}");
        let e = err_of(&[("MSGX_RETENTION__R_KEEP", "7d")]);
        assert!(e.contains("backfill.overdue_after"), "{e}");
        Settings::load_with_env(
            &default_toml(),
            &[
                ("MSGX_BACKFILL__OVERDUE_AFTER", "40d"),
                ("MSGX_RETENTION__R_KEEP", "60d"),
            ],
        )
        .expect("R ≤ R_keep");
        let e = err_of(&[("MSGX_RETENTION__REPLAY_WINDOW", "0s")]);
        assert!(e.contains("retention.replay_window"), "{e}");
        let e = err_of(&[("MSGX_RETENTION__R_KEEP", "300000y")]);
        assert!(e.contains("retention.r_keep"), "{e}");
    }

    #[test]
    fn unknown_keys_are_refused() {
        let e = err_of(&[("MSGX_PIPELINE__MAX_COMIT_DELAY", "5m")]);
        assert!(e.contains("max_comit_delay"), "{e}");
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/msgx"),
            "postgres://app:***@db:5432/msgx"
        );
        assert_eq!(redact_url("mysql://root@h/db"), "mysql://root@h/db");
        let s = Settings::load_with_env(
            &default_toml(),
            &[("MSGX_STORE__URL", "postgres://u:topsecret@h/db")],
        )
        .expect("load");
        assert!(!format!("{s:?}").contains("topsecret"));
    }
}
