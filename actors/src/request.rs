//! `msgexchange request …`: outbound requests by hand (seed §7). Each first reconciles the
//! REGISTERED leftovers of earlier runs (a crash between register, insert and SENT), then
//! registers, writes and confirms the new request, and prints its RQID and outbound row id.
//! Safe next to a running service: a request is only ever completed under its REQ_TRACK row
//! lock, and the reconciler skips rows someone else is completing.

use anyhow::Context as _;
use chrono::{NaiveDate, Utc};
use clap::{Args, Subcommand};
use msgx_core::outbound::{self, request, Origin, Outbound, SentVia};
use msgx_core::settings::Settings;

/// Requests to upstream.
#[derive(Debug, Subcommand)]
pub enum RequestCommand {
    /// Ask upstream for a day's schedule (SCHD/RQST; answered by SCHD/RESP with the RQID).
    Schedule(ScheduleArgs),
}

/// `request schedule`.
#[derive(Debug, Args)]
pub struct ScheduleArgs {
    /// The day, YYYYMMDD; default: today in airport time (`inbox.timezone`).
    #[arg(long, value_parser = parse_date)]
    pub date: Option<NaiveDate>,
}

fn parse_date(raw: &str) -> Result<NaiveDate, String> {
    NaiveDate::parse_from_str(raw, "%Y%m%d").map_err(|_| format!("`{raw}` is not a YYYYMMDD date"))
}

/// Runs a `request` command.
pub async fn run(settings: &Settings, cmd: &RequestCommand) -> anyhow::Result<()> {
    match cmd {
        RequestCommand::Schedule(args) => schedule(settings, args).await,
    }
}

async fn schedule(settings: &Settings, args: &ScheduleArgs) -> anyhow::Result<()> {
    let (inbox, store) = crate::app::connect(settings).await?;
    let ob = Outbound::from_settings(settings, &store, &inbox)?;
    let now = Utc::now();
    let leftovers = outbound::reconcile(&ob, now)
        .await
        .context("reconciling REGISTERED leftovers")?;
    for sent in &leftovers {
        let how = match sent.via {
            SentVia::ReconcileFound => "found",
            _ => "written",
        };
        println!(
            "reconciled rqid={} out_id={} date={} ({how})",
            sent.rqid,
            sent.out_id,
            sent.target_date.format("%Y%m%d")
        );
    }
    let date = args
        .date
        .unwrap_or_else(|| request::local_date(now, ob.cfg.tz));
    let sent = outbound::request_schedule(&ob, Origin::Manual, date, now)
        .await
        .with_context(|| format!("requesting the schedule of {}", date.format("%Y%m%d")))?;
    println!(
        "requested schedule date={} rqid={} out_id={}",
        date.format("%Y%m%d"),
        sent.rqid,
        sent.out_id
    );
    Ok(())
}
