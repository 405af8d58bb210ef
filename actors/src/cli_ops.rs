//! The operator subcommands (`status`, `inspect`, `replay`, `recover-backfill`, `events …`):
//! the same [`msgx_core::ops`] calls as the admin API, straight against the stores, so they
//! work while the service is down. `--json` prints exactly what the API answers.

use std::io::IsTerminal as _;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use msgx_core::ops::{Ops, RecoverRequest, ReplayRequest, RequeueRequest};
use msgx_core::settings::Settings;

/// `status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print JSON (the same document as `GET /admin/status`).
    #[arg(long)]
    pub json: bool,
    /// Refresh until Ctrl-C (for people without Grafana).
    #[arg(long)]
    pub watch: bool,
    /// Refresh period with --watch.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2s")]
    pub interval: Duration,
}

/// `inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The inbox id (`CMINMSGS_ID` = `proc_state.msg_id`).
    pub msg_id: i64,
    /// Print JSON (the same document as `GET /admin/messages/{id}`).
    #[arg(long)]
    pub json: bool,
}

/// Who, why and the ticket of an audited action.
#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Who asks (recorded in the audit log).
    #[arg(long)]
    pub actor: String,
    /// Why (recorded in the audit log).
    #[arg(long)]
    pub reason: String,
    /// Change or incident number (recorded in the audit log).
    #[arg(long)]
    pub ticket: Option<String>,
    /// Print JSON (the same document as the admin API).
    #[arg(long)]
    pub json: bool,
}

/// `replay`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("select").required(true).args(["ids", "class"])))]
pub struct ReplayArgs {
    /// Rows by id, comma-separated (with --expect-state).
    #[arg(long, value_delimiter = ',', requires = "expect_state")]
    pub ids: Vec<i64>,
    /// The state you saw the rows in (DEAD or FAILED); a row that moved since is refused.
    #[arg(long)]
    pub expect_state: Option<String>,
    /// The error class you saw (optional, with --ids).
    #[arg(long, requires = "ids")]
    pub expect_class: Option<String>,
    /// Rows by replayable error class (CODEC_ERROR, UNSUPPORTED, INFRA, EXHAUSTED)…
    #[arg(long, requires_all = ["from", "to"], conflicts_with = "ids")]
    pub class: Option<String>,
    /// …from this id…
    #[arg(long, requires = "class")]
    pub from: Option<i64>,
    /// …to this id (inclusive).
    #[arg(long, requires = "class")]
    pub to: Option<i64>,
    /// With --class: only rows in this state (DEAD or FAILED).
    #[arg(long, requires = "class")]
    pub state: Option<String>,
    /// Show what would change; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub audit: AuditArgs,
}

/// `recover-backfill`.
#[derive(Debug, Args)]
pub struct RecoverArgs {
    /// Abandoned rows by id, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub ids: Vec<i64>,
    /// Show what would change; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub audit: AuditArgs,
}

/// `events …`.
#[derive(Debug, Subcommand)]
pub enum EventsCommand {
    /// List events that went DEAD (copied to the dead-letter topic), oldest first.
    ListDead(ListDeadArgs),
    /// Send DEAD events again (back to PENDING) after fixing the cause. Audited.
    Requeue(RequeueArgs),
}

/// `events list-dead`.
#[derive(Debug, Args)]
pub struct ListDeadArgs {
    /// Only events with a larger id (paging).
    #[arg(long, default_value_t = 0)]
    pub after: i64,
    /// At most this many (1..=1000).
    #[arg(long, default_value_t = 100)]
    pub limit: i64,
    /// Print JSON (the same document as `GET /admin/events/dead`).
    #[arg(long)]
    pub json: bool,
}

/// `events requeue`.
#[derive(Debug, Args)]
pub struct RequeueArgs {
    /// Event ids, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub ids: Vec<i64>,
    #[command(flatten)]
    pub audit: AuditArgs,
}

/// Connects both stores (migrating PostgreSQL; the inbox lazily) without taking the lease.
async fn ops(settings: &Settings) -> anyhow::Result<Ops> {
    let (inbox, store) = crate::app::connect(settings).await?;
    Ok(Ops::new(settings, store, inbox))
}

fn now() -> chrono::DateTime<chrono::Utc> {
    chrono::Utc::now()
}

/// Prints `value` as JSON (exactly what the admin API answers) or, for people, as `render`
/// writes it.
fn print_report<T: serde::Serialize>(
    value: &T,
    json: bool,
    render: impl FnOnce(&T) -> String,
) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        print!("{}", render(value));
    }
    Ok(())
}

/// `msgexchange status`.
pub async fn status(settings: &Settings, args: &StatusArgs) -> anyhow::Result<()> {
    let ops = match ops(settings).await {
        Ok(ops) => ops,
        Err(e) => match crate::upgrade_status::behind(settings, &e, args.json).await {
            Some(report) => {
                print!("{report}");
                return Ok(());
            }
            None => return Err(e),
        },
    };
    let terminal = std::io::stdout().is_terminal();
    loop {
        let status = ops.status(now()).await.context("reading the status")?;
        if args.watch && terminal {
            // Clear the screen and go home: a refreshing view.
            print!("\x1b[2J\x1b[H");
        }
        print_report(&status, args.json, |s| s.render())?;
        if !args.watch {
            return Ok(());
        }
        tokio::select! {
            _ = tokio::time::sleep(args.interval) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

/// `msgexchange inspect ID`.
pub async fn inspect(settings: &Settings, args: &InspectArgs) -> anyhow::Result<()> {
    let ops = ops(settings).await?;
    let found = ops.inspect(args.msg_id).await?;
    print_report(&found, args.json, |r| r.render())
}

/// `msgexchange replay`.
pub async fn replay(settings: &Settings, args: &ReplayArgs) -> anyhow::Result<()> {
    let ops = ops(settings).await?;
    let req = ReplayRequest {
        msg_ids: args.ids.clone(),
        expect_state: args.expect_state.clone(),
        expect_class: args.expect_class.clone(),
        error_class: args.class.clone(),
        from_id: args.from,
        to_id: args.to,
        state: args.state.clone(),
        actor: args.audit.actor.clone(),
        reason: args.audit.reason.clone(),
        ticket: args.audit.ticket.clone(),
        dry_run: args.dry_run,
    };
    let report = ops.replay(&req, now()).await?;
    print_report(&report, args.audit.json, |r| r.render())
}

/// `msgexchange recover-backfill`.
pub async fn recover_backfill(settings: &Settings, args: &RecoverArgs) -> anyhow::Result<()> {
    let ops = ops(settings).await?;
    let req = RecoverRequest {
        msg_ids: args.ids.clone(),
        actor: args.audit.actor.clone(),
        reason: args.audit.reason.clone(),
        ticket: args.audit.ticket.clone(),
        dry_run: args.dry_run,
    };
    let report = ops.recover_backfill(&req, now()).await?;
    print_report(&report, args.audit.json, |r| r.render())
}

/// `msgexchange events …`.
pub async fn events(settings: &Settings, cmd: &EventsCommand) -> anyhow::Result<()> {
    let ops = ops(settings).await?;
    match cmd {
        EventsCommand::ListDead(a) => {
            let page = ops.list_dead_events(a.after, a.limit).await?;
            print_report(&page, a.json, |r| r.render())
        }
        EventsCommand::Requeue(a) => {
            let req = RequeueRequest {
                event_ids: a.ids.clone(),
                actor: a.audit.actor.clone(),
                reason: a.audit.reason.clone(),
                ticket: a.audit.ticket.clone(),
            };
            let report = ops.requeue_events(&req, now()).await?;
            print_report(&report, a.audit.json, |r| r.render())
        }
    }
}

/// `survey`.
#[derive(Debug, Args)]
pub struct SurveyArgs {
    /// First id (inclusive); with --to. Without a range: the unprocessed backlog.
    #[arg(long, conflicts_with_all = ["received_from", "received_to"])]
    pub from: Option<i64>,
    /// Last id (inclusive).
    #[arg(long)]
    pub to: Option<i64>,
    /// Received at or after (RFC 3339, e.g. 2026-11-30T00:00:00Z).
    #[arg(long)]
    pub received_from: Option<chrono::DateTime<chrono::Utc>>,
    /// Received before (RFC 3339).
    #[arg(long)]
    pub received_to: Option<chrono::DateTime<chrono::Utc>>,
    /// Print JSON (the same document as `GET /admin/survey`).
    #[arg(long)]
    pub json: bool,
}

/// `skip`.
#[derive(Debug, Args)]
pub struct SkipArgs {
    /// First id (inclusive).
    #[arg(long)]
    pub from: i64,
    /// Last id (inclusive); must be at or below W.
    #[arg(long)]
    pub to: i64,
    /// Who approved (the DB owner's / operations' representative).
    #[arg(long)]
    pub approver: String,
    /// Why (recorded in the audit log).
    #[arg(long)]
    pub reason: String,
    /// The change or agreement number.
    #[arg(long)]
    pub ticket: String,
    /// Count what would be skipped; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print JSON (the same document as `POST /admin/skip`).
    #[arg(long)]
    pub json: bool,
}

/// `purge-readiness`.
#[derive(Debug, Args)]
pub struct PurgeArgs {
    /// Up to this id (inclusive). Without a bound: the whole inbox.
    #[arg(long, conflicts_with = "received_before")]
    pub to: Option<i64>,
    /// Up to the highest id received before this time (RFC 3339).
    #[arg(long)]
    pub received_before: Option<chrono::DateTime<chrono::Utc>>,
    /// Print JSON (the same document as `GET /admin/purge-readiness`).
    #[arg(long)]
    pub json: bool,
}

/// `msgexchange survey`: a progress line on stderr every 2 s on long runs.
pub async fn survey(settings: &Settings, args: &SurveyArgs) -> anyhow::Result<()> {
    let ops = ops(settings).await?;
    let req = msgx_core::ops::SurveyRequest {
        from_id: args.from,
        to_id: args.to,
        received_from: args.received_from,
        received_to: args.received_to,
    };
    let started = std::time::Instant::now();
    let mut last = started;
    let mut printed = false;
    let survey = ops
        .survey_with_progress(&req, &mut |p| {
            if last.elapsed() >= Duration::from_secs(2) {
                last = std::time::Instant::now();
                printed = true;
                eprint!(
                    "\rsurvey: {} rows, at id {} of {} ({:.0}s)",
                    p.rows,
                    p.at_id,
                    p.to_id,
                    started.elapsed().as_secs_f64()
                );
            }
        })
        .await?;
    if printed {
        eprintln!();
    }
    print_report(&survey, args.json, |r| r.render())
}

/// `msgexchange skip`.
pub async fn skip(settings: &Settings, args: &SkipArgs) -> anyhow::Result<()> {
    let ops = ops(settings).await?;
    let req = msgx_core::ops::SkipRequest {
        from_id: args.from,
        to_id: args.to,
        approver: args.approver.clone(),
        reason: args.reason.clone(),
        ticket: args.ticket.clone(),
        dry_run: args.dry_run,
    };
    let report = ops.skip(&req, now()).await?;
    print_report(&report, args.json, |r| r.render())
}

/// `msgexchange purge-readiness`: exit 0 either way (the report says READY or not).
pub async fn purge_readiness(settings: &Settings, args: &PurgeArgs) -> anyhow::Result<()> {
    let ops = ops(settings).await?;
    let req = msgx_core::ops::PurgeRequest {
        to_id: args.to,
        received_before: args.received_before,
    };
    let report = ops.purge_readiness(&req).await?;
    print_report(&report, args.json, |r| r.render())
}

/// `cutover …`.
#[derive(Debug, clap::Subcommand)]
pub enum CutoverCommand {
    /// What a cutover mode would do on this inbox and store, before anyone commits to it.
    /// Changes nothing.
    Plan(CutoverPlanArgs),
}

/// `cutover plan`.
#[derive(Debug, Args)]
pub struct CutoverPlanArgs {
    /// `min`, `zero`, `max` or an id (the values of pipeline.cutover_watermark).
    #[arg(long, value_parser = parse_cutover_mode)]
    pub mode: msgx_core::cutover::CutoverMode,
    /// Print JSON (the same document as `GET /admin/cutover-plan`).
    #[arg(long)]
    pub json: bool,
}

fn parse_cutover_mode(raw: &str) -> Result<msgx_core::cutover::CutoverMode, String> {
    msgx_core::cutover::CutoverMode::parse(raw)?.ok_or_else(|| "give a mode".to_string())
}

/// `msgexchange cutover plan`.
pub async fn cutover(settings: &Settings, cmd: &CutoverCommand) -> anyhow::Result<()> {
    let CutoverCommand::Plan(args) = cmd;
    let ops = ops(settings).await?;
    let plan = ops.cutover_plan(args.mode).await?;
    print_report(&plan, args.json, |r| r.render())?;
    // The service would refuse this mode at start: so does the plan (exit status 1).
    match &plan.inbox_refused {
        Some(why) => anyhow::bail!("{why}"),
        None => Ok(()),
    }
}
