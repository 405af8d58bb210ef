//! Service configuration, loaded by one layered loader for the binary and the tests
//! (`layers`): the compiled-in `config/default.toml`, then `--config` and `--config-extra`
//! files, then `MSGX_*` environment variables (`MSGX_SECTION__KEY`, e.g.
//! `MSGX_PIPELINE__MAX_COMMIT_DELAY=5m`).
//!
//! Every key is validated at start-up; a bad value fails with one line naming the key, so an
//! operator never starts a service that would misbehave later. Unknown keys are refused. Each
//! section validates its own keys, [`Settings::validate`] adds the rules between sections.
//! Every duration is bounded while it is parsed ([`duration`]); every secret is a [`Secret`],
//! which prints only redacted and is read with an explicit `expose()`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cutover::{expect::CutoverExpect, CutoverMode};
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
#[derive(Debug, Clone, Deserialize, Serialize)]
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
    /// OpenTelemetry traces over OTLP (off by default).
    pub traces: TracesSettings,
    /// The keys validation parsed into types, kept so no caller parses them again (read
    /// through [`Settings::inbox_names`] and its siblings). Not a configuration key.
    #[serde(skip)]
    resolved: Resolved,
}

/// The values [`Settings::validate`] parses out of text keys, resolved once at load.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// `inbox.table` and its columns, as checked identifiers.
    pub names: InboxNames,
    /// `inbox.out_table` and `outbound.*_column`.
    pub outbox: OutboxNames,
    /// `inbox.timezone`: the airport zone of the inbox's local times.
    pub tz: chrono_tz::Tz,
    /// `pipeline.cutover_watermark`; None when not configured.
    pub cutover: Option<CutoverMode>,
    /// `pipeline.cutover_expect`; None when not configured.
    pub cutover_expect: Option<CutoverExpect>,
}

impl Default for Resolved {
    /// Only what serde needs to build a [`Settings`] (the field is not a key): the loader
    /// replaces it with what validation parsed before anyone reads it.
    fn default() -> Self {
        Self {
            names: InboxNames::defaults(),
            outbox: OutboxNames::new("COUTMSGS")
                .unwrap_or_else(|_| unreachable!("a valid identifier")),
            tz: chrono_tz::Tz::UTC,
            cutover: None,
            cutover_expect: None,
        }
    }
}

mod databases;
pub use databases::{InboxSettings, StoreSettings};
pub mod duration;
pub use duration::{BoundedDuration, MAX_DURATION};
mod http;
pub use http::{HttpSettings, LogSettings, TokenEntry, MAX_TOKEN_NAME};
mod kafka;
pub use kafka::{Delivery, DispatchSettings, KafkaSettings};
mod layers;
pub use layers::DEFAULT_TOML;
mod outbound;
pub use outbound::{parse_daily_time, OutboundSettings};
mod pipeline;
pub use pipeline::{
    BackfillSettings, LateSettings, PipelineSettings, ProcessingSettings, MARK_MARGIN,
};
mod reliability;
pub use reliability::{LeaseSettings, SupervisorSettings};
mod retention;
pub use retention::{RetentionSettings, VacuumMode};
mod secret;
mod sources;
pub use sources::{SecretSource, SecretSources};
mod tls;
mod traces;
pub use secret::{
    redact_extra, redact_url, Redaction, Secret, SecretPairs, SecretUrl, UrlPassword, UrlText,
    Whole,
};
pub use tls::ConnectKeys;
pub use traces::TracesSettings;

impl Settings {
    /// Checks what serde cannot: ranges, names, zones, URLs. Each section checks its own
    /// keys; then the rules between sections. Durations were bounded while parsing
    /// ([`duration`]). Returns the keys it parsed into types (the loader keeps them).
    pub fn validate(&self) -> Result<Resolved, SettingsError> {
        self.inbox.validate()?;
        let tz = self.parse_timezone()?;
        let names = self.parse_inbox_names()?;
        let outbox = self.parse_outbox_names()?;
        self.store.validate()?;
        self.kafka.validate()?;
        self.dispatch.validate()?;
        self.outbound.validate()?;
        self.retention.validate()?;
        self.pipeline.validate()?;
        let cutover = self.parse_cutover()?;
        let cutover_expect = self.parse_cutover_expect(cutover)?;
        self.backfill.validate()?;
        self.late.validate()?;
        self.processing.validate()?;
        self.http.validate()?;
        self.log.validate()?;
        self.lease.validate()?;
        self.supervisor.validate()?;
        self.traces.validate()?;
        self.validate_between_sections()?;
        Ok(Resolved {
            names,
            outbox,
            tz,
            cutover,
            cutover_expect,
        })
    }

    /// Validates and keeps the parsed values: what the loader does last.
    pub(crate) fn resolve(mut self) -> Result<Self, SettingsError> {
        self.resolved = self.validate()?;
        Ok(self)
    }

    /// The inbox zone (`inbox.timezone`).
    pub fn inbox_timezone(&self) -> chrono_tz::Tz {
        self.resolved.tz
    }

    /// The inbox identifiers (`inbox.table`, `inbox.*_column`).
    pub fn inbox_names(&self) -> &InboxNames {
        &self.resolved.names
    }

    /// The outbound table (`inbox.out_table`, `outbound.*_column`).
    pub fn outbox_names(&self) -> &OutboxNames {
        &self.resolved.outbox
    }

    /// The cutover mode (`pipeline.cutover_watermark`), `None` when not configured.
    pub fn cutover(&self) -> Option<CutoverMode> {
        self.resolved.cutover
    }

    /// The approved plan (`pipeline.cutover_expect`), `None` when not configured.
    pub fn cutover_expect(&self) -> Option<&CutoverExpect> {
        self.resolved.cutover_expect.as_ref()
    }

    /// The rules that tie keys of two sections together.
    fn validate_between_sections(&self) -> Result<(), SettingsError> {
        if self.late.hole_evidence && self.late.hole_evidence_cap < self.pipeline.max_commit_delay {
            return Err(invalid(
                "late.hole_evidence_cap",
                "shorter than pipeline.max_commit_delay",
            ));
        }
        self.check_mark_budget()?;
        self.check_overdue_after()
    }

    /// The sweep writes inbox marks while it holds PostgreSQL row locks (G5): its inbox budget
    /// must end before the server could end the sweep's transaction for idleness.
    fn check_mark_budget(&self) -> Result<(), SettingsError> {
        let (budget, idle) = (
            self.backfill.mark_budget,
            self.store.idle_in_transaction_timeout,
        );
        if budget.saturating_add(MARK_MARGIN) > idle {
            return Err(invalid(
                "backfill.mark_budget",
                format!(
                    "{} is not at least {} shorter than store.idle_in_transaction_timeout = {}: \
                     a backfill sweep holds its PostgreSQL row locks while it writes inbox \
                     marks, and the server ends a transaction idle that long; lower \
                     backfill.mark_budget or raise store.idle_in_transaction_timeout",
                    humantime::format_duration(budget),
                    humantime::format_duration(MARK_MARGIN),
                    humantime::format_duration(idle)
                ),
            ));
        }
        Ok(())
    }

    /// `R ≤ R_keep` (seed §5.2).
    fn check_overdue_after(&self) -> Result<(), SettingsError> {
        let (overdue, r_keep) = (self.backfill.overdue_after, self.retention.r_keep);
        if overdue > r_keep {
            return Err(invalid(
                "backfill.overdue_after",
                format!(
                    "R = {} exceeds retention.r_keep = {} (the DB owner's retention of marked \
                     rows, Q6/Q7): R must be at most R_keep (seed §5.2), else a row whose mark \
                     keeps failing is force-retried only after the owner's retention ran out; \
                     lower backfill.overdue_after or confirm a longer retention with the DB \
                     owner",
                    humantime::format_duration(overdue),
                    humantime::format_duration(r_keep)
                ),
            ));
        }
        Ok(())
    }

    /// The inbox zone as a parsed tz.
    fn parse_timezone(&self) -> Result<chrono_tz::Tz, SettingsError> {
        self.inbox.timezone.parse::<chrono_tz::Tz>().map_err(|_| {
            invalid(
                "inbox.timezone",
                format!("`{}` is not an IANA zone", self.inbox.timezone),
            )
        })
    }

    /// Validated inbox identifiers.
    fn parse_inbox_names(&self) -> Result<InboxNames, SettingsError> {
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
    fn parse_outbox_names(&self) -> Result<OutboxNames, SettingsError> {
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
    fn parse_cutover(&self) -> Result<Option<CutoverMode>, SettingsError> {
        CutoverMode::parse(&self.pipeline.cutover_watermark)
            .map_err(|reason| invalid("pipeline.cutover_watermark", reason))
    }

    /// The approved plan (`pipeline.cutover_expect`), `None` when not configured; refused
    /// without a cutover mode, or with an `<id>` that is not its W.
    fn parse_cutover_expect(
        &self,
        cutover: Option<CutoverMode>,
    ) -> Result<Option<CutoverExpect>, SettingsError> {
        const KEY: &str = "pipeline.cutover_expect";
        let Some(expect) = CutoverExpect::parse(&self.pipeline.cutover_expect)
            .map_err(|reason| invalid(KEY, reason))?
        else {
            return Ok(None);
        };
        let Some(mode) = cutover else {
            return Err(invalid(
                KEY,
                "is set but pipeline.cutover_watermark is not: the expectation guards a \
                 cutover seeding; set the mode it was planned for, or unset it",
            ));
        };
        expect.fits(mode).map_err(|reason| invalid(KEY, reason))?;
        Ok(Some(expect))
    }
}

fn check_positive(v: u32, key: &'static str) -> Result<(), SettingsError> {
    if v == 0 {
        return Err(invalid(key, "must be at least 1"));
    }
    Ok(())
}

fn check_nonzero(d: Duration, key: &'static str) -> Result<(), SettingsError> {
    if d.is_zero() {
        return Err(invalid(key, "must be longer than 0s"));
    }
    Ok(())
}

/// A retry schedule: its first delay (`keys[0]`, above zero), its longest delay (`keys[1]`,
/// not shorter) and its attempts (`keys[2]`, at least one).
fn check_retries(
    keys: [&'static str; 3],
    initial: Duration,
    max: Duration,
    attempts: i32,
) -> Result<(), SettingsError> {
    let [initial_key, max_key, attempts_key] = keys;
    check_nonzero(initial, initial_key)?;
    if max < initial {
        return Err(invalid(max_key, format!("shorter than {initial_key}")));
    }
    if attempts < 1 {
        return Err(invalid(attempts_key, "must be at least 1"));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_secrets;
