//! What `msgx-bench mark` prints: every phase's figures beside the bare limits of the same run.
//! Apart from the phases so the measuring code and the wording change independently.

use std::time::Duration;

use super::{Ctx, Measured};
use crate::percentile;
use crate::report::rate;

/// The printed report.
pub(super) fn print_report(ctx: &Ctx<'_>, batch: u32, m: &Measured) {
    let single = rate(
        m.single_before.rows + m.single_after.rows,
        m.single_before.elapsed + m.single_after.elapsed,
    );
    println!(
        "  bare single UPDATE    : {single:.0} rows/s  (before the sweeps {:.0}, after {:.0}; \
         autocommit, `WHERE id = ? AND <empty mark>`, one connection; p50 {} p99 {})",
        m.single_before.rate(),
        m.single_after.rate(),
        ms(percentile(&m.single_before.latency, 0.50)),
        ms(percentile(&m.single_before.latency, 0.99)),
    );
    println!(
        "  bare IN ({batch}) UPDATE : {:.0} rows/s  ({} statements, p50 {} p99 {})",
        m.batched.rate(),
        m.batched.latency.len(),
        ms(percentile(&m.batched.latency, 0.50)),
        ms(percentile(&m.batched.latency, 0.99)),
    );
    let s = &m.sweeps;
    let marks = rate(s.marked, s.elapsed);
    println!(
        "  sweep_once            : {marks:.0} marks/s = {:.1}× the bare single-row rate \
         ({:.0}% of bare IN)   {} rows in {:.2}s, {} sweeps, sweep p50 {} p99 {} max {}",
        marks / single.max(1e-9),
        100.0 * marks / m.batched.rate().max(1e-9),
        s.marked,
        s.elapsed.as_secs_f64(),
        s.sweeps,
        ms(percentile(&s.took, 0.50)),
        ms(percentile(&s.took, 0.99)),
        ms(s.took.last().copied().unwrap_or_default()),
    );
    println!(
        "  verified              : {} inbox rows carry `{}`, {} PROC_STATE rows confirmed",
        s.inbox_marked, ctx.cfg.mark_value, s.confirmed
    );
    let st = &m.stages;
    if st.sweeps > 0 {
        let per = |d: Duration| ms(d / st.sweeps);
        println!(
            "  where the time goes   : {} rows again, {:.0} marks/s; per sweep: select+lock {} \
             + existence check {} + UPDATE {} + write-back+commit {} (+ backlog gauge {}, at most \
             1/s while draining)",
            st.rows,
            rate(st.rows, st.elapsed),
            per(st.select_lock),
            per(st.check),
            per(st.update),
            per(st.write_back),
            per(st.backlog),
        );
    }
    for r in &m.steady {
        println!(
            "  steady {}/s ({}) : {} rows over {:.0}s; oldest unmarked max {:.1}s (sampled p50 \
             {:.1}s p99 {:.1}s); per-row lag terminal→mark p50 {:.2}s p99 {:.2}s max {:.2}s; {} \
             unmarked at the end",
            ctx.args.steady_rate,
            r.label(),
            r.rows,
            r.duration.as_secs_f64(),
            r.oldest_max.as_secs_f64(),
            percentile(&r.oldest, 0.50).as_secs_f64(),
            percentile(&r.oldest, 0.99).as_secs_f64(),
            percentile(&r.lag, 0.50).as_secs_f64(),
            percentile(&r.lag, 0.99).as_secs_f64(),
            r.lag.last().copied().unwrap_or_default().as_secs_f64(),
            r.unmarked_at_end,
        );
    }
}

/// A duration as milliseconds with one decimal.
pub(super) fn ms(d: Duration) -> String {
    format!("{:.1}ms", d.as_secs_f64() * 1e3)
}
