//! [`Status`] for people: the text `msgexchange status` prints, one line per part (W, the
//! open hole, the head, the backlog, the drain estimate, backfill, dispatch, the lease).
//! Separate from the queries (`status.rs`) because the API and `--json` print the serde form
//! and never need these lines.

use super::Status;

impl Status {
    /// The status for people: one block per part, the things to act on first.
    pub fn render(&self) -> String {
        let lines = [
            format!("msgexchange status as of {}", self.as_of.to_rfc3339()),
            self.watermark_line(),
            self.holes_line(),
            self.head_line(),
            self.backlog_line(),
            self.drain_line(),
            self.backfill_line(),
            self.dispatch_line(),
            self.lease_line(),
        ];
        lines.iter().map(|l| format!("{l}\n")).collect()
    }

    fn watermark_line(&self) -> String {
        format!(
            "watermark   W={}{}",
            self.watermark.w,
            self.watermark
                .seeded_at
                .map(|t| format!(" (seeded {})", t.to_rfc3339()))
                .unwrap_or_default()
        )
    }

    fn holes_line(&self) -> String {
        format!(
            "holes       open={} missing_ids={} waiting_at={} oldest_age={}",
            self.holes.open,
            self.holes.missing_ids,
            self.holes
                .first_missing
                .map_or_else(|| "-".to_string(), |id| id.to_string()),
            secs(self.holes.oldest_age_seconds)
        )
    }

    fn head_line(&self) -> String {
        let Some(h) = &self.head else {
            return "head        none (nothing to process up to W)".into();
        };
        format!(
            "head        id={} state={} attempts={} age={}{}",
            h.msg_id,
            h.state,
            h.attempts,
            secs(Some(h.age_seconds)),
            match (&h.error_class, &h.last_error) {
                (Some(c), Some(e)) => format!(" last_error={c}: {e}"),
                (Some(c), None) => format!(" last_error={c}"),
                _ => String::new(),
            }
        )
    }

    fn backlog_line(&self) -> String {
        let b = &self.backlog;
        format!(
            "backlog     pending={} failed={} beyond_w={} oldest_age={}",
            b.pending,
            b.failed,
            b.beyond_w,
            secs(b.oldest_age_seconds)
        )
    }

    fn drain_line(&self) -> String {
        let d = &self.drain;
        format!(
            "drain       {} ({:.1} msg/s over {})",
            match d.estimate {
                "seconds" => format!("~{}", secs(d.estimated_seconds)),
                other => other.to_string(),
            },
            d.rate_per_second,
            secs(Some(d.window_seconds))
        )
    }

    fn backfill_line(&self) -> String {
        let f = &self.backfill;
        format!(
            "backfill    pending={} oldest_age={} abandoned: missing_row={} max_attempts={}",
            f.pending,
            secs(f.oldest_age_seconds),
            f.abandoned_missing_row,
            f.abandoned_max_attempts
        )
    }

    fn dispatch_line(&self) -> String {
        let e = &self.dispatch;
        format!(
            "dispatch    pending={} oldest_age={} dead={}",
            e.pending,
            secs(e.oldest_age_seconds),
            e.dead
        )
    }

    fn lease_line(&self) -> String {
        let l = &self.lease;
        format!(
            "lease       {} holder={} epoch={}{}",
            if l.held {
                "held"
            } else {
                "NOT held (service down?)"
            },
            l.holder.as_deref().unwrap_or("-"),
            l.epoch,
            l.acquired_at
                .map(|t| format!(" since {}", t.to_rfc3339()))
                .unwrap_or_default()
        )
    }
}

/// Seconds for people (`1m 30s`), `-` when unknown.
fn secs(s: Option<f64>) -> String {
    s.map(|s| humantime::format_duration(std::time::Duration::from_secs(s as u64)).to_string())
        .unwrap_or_else(|| "-".into())
}
