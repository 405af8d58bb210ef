//! The printed report of `bench pump`: the bare limits, the pump run, the ratios, where the
//! time goes, and the RSS samples.

use std::time::Duration;

use msgx_core::settings::{redact_url, Settings};

use super::super::databases::BenchDbs;
use super::super::percentile;
use super::super::report::rate;
use super::bare::{BareLimits, BareRun, BareShape};
use super::load::Loaded;
use super::run::PumpRun;
use super::{Measured, PumpBenchArgs};
use msgx_core::pump::stages::Stage;

/// Prints the whole report to stdout.
pub(super) fn print_report(
    settings: &Settings,
    args: &PumpBenchArgs,
    dbs: &BenchDbs,
    loaded: &Loaded,
    m: &Measured,
) {
    println!(
        "bench pump: {} messages (seed {}, Mix::well_formed), read_ahead {}, store pool {} \
         connections, raw_copy {} (first run)",
        args.messages,
        args.seed,
        m.run.read_ahead,
        settings.store.max_connections,
        on_off(m.run.raw_copy)
    );
    println!(
        "  server                : PostgreSQL {}, synchronous_commit={}, fsync={} (as the server \
         has them; this bench never changes them)",
        m.server.version, m.server.synchronous_commit, m.server.fsync
    );
    println!(
        "  databases             : {} and {}",
        redact_url(&dbs.inbox_url),
        redact_url(&dbs.store_url)
    );
    print_backlog(loaded, m);
    print_bare(args, m);
    print_run(&m.run);
    print_ratios(m);
    print_stages(&m.run, &m.before);
    let mut rss = vec![format!("start {}", mib(m.run.rss_start))];
    rss.extend(
        m.run
            .tenths
            .iter()
            .enumerate()
            .map(|(i, t)| format!("{}% {}", (i + 1) * 10, mib(t.rss))),
    );
    println!("  RSS MiB (pump run)    : {}", rss.join(", "));
    print_raw_copy(m);
}

fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

/// The cost of our raw copy (`retention.raw_copy`): the two runs side by side.
fn print_raw_copy(m: &Measured) {
    let runs: Vec<&PumpRun> = std::iter::once(&m.run).chain(m.copy_run.as_ref()).collect();
    if runs.len() == 2 {
        println!(
            "  RAW COPY (retention.raw_copy), the same backlog twice, the store emptied and \
             re-enqueued between the runs:"
        );
        println!(
            "    {:<34} {:>12} {:>12} {:>10}",
            "", "off", "on", "on vs off"
        );
        let (off, on) = (runs[0], runs[1]);
        let row = |what: &str, a: f64, b: f64, unit: &str| {
            let change = if a.abs() < 1e-9 {
                "-".to_string()
            } else {
                format!("{:+.1}%", 100.0 * (b - a) / a.abs())
            };
            println!(
                "    {what:<34} {:>12} {:>12} {change:>10}",
                format!("{a:.2}{unit}"),
                format!("{b:.2}{unit}"),
            );
        };
        row(
            "pump msgs/s",
            rate(off.messages, off.elapsed),
            rate(on.messages, on.elapsed),
            "",
        );
        let share = |r: &PumpRun| {
            100.0 * rate(r.messages, r.elapsed) / r.probe_rate(BareShape::Tx, None).max(1e-9)
        };
        row("% of time-matched bare tx/s", share(off), share(on), "%");
        let p = |r: &PumpRun, q: f64| percentile(&r.took, q).as_secs_f64() * 1e3;
        row("per message p50", p(off, 0.50), p(on, 0.50), "ms");
        row("per message p99", p(off, 0.99), p(on, 0.99), "ms");
        let stage = |r: &PumpRun, st: Stage| {
            r.stages.get(st).0.as_secs_f64() * 1e3 / r.stages.messages.max(1) as f64
        };
        for st in [Stage::RawCopy, Stage::Business, Stage::Commit] {
            row(
                &format!("stage {} ms/msg", st.as_str()),
                stage(off, st),
                stage(on, st),
                "",
            );
        }
        if let (Some(a), Some(b)) = (off.wal_bytes, on.wal_bytes) {
            let per = |w: u64, r: &PumpRun| w as f64 / r.messages.max(1) as f64;
            row("WAL bytes/msg (server-wide)", per(a, off), per(b, on), "");
        }
    }
    if let Some(c) = &m.copies {
        let mib = |b: i64| b as f64 / (1024.0 * 1024.0);
        println!(
            "    copies in the store          : {} rows, raw {:.1} MiB -> stored {:.1} MiB \
             ({:.1}% of raw, {:.0} B/msg), raw_copy table with TOAST and index {:.1} MiB",
            c.rows,
            mib(c.raw_bytes),
            mib(c.stored_bytes),
            100.0 * c.stored_bytes as f64 / c.raw_bytes.max(1) as f64,
            c.stored_bytes as f64 / c.rows.max(1) as f64,
            mib(c.table_bytes)
        );
    }
}

fn print_backlog(loaded: &Loaded, m: &Measured) {
    let total: u64 = loaded.kinds.values().sum();
    let kinds: Vec<String> = loaded
        .kinds
        .iter()
        .map(|(k, n)| format!("{k} {:.1}%", 100.0 * *n as f64 / total.max(1) as f64))
        .collect();
    println!(
        "  inbox backlog         : {} messages ({}), {:.1} MiB, mean {:.0} B, largest {:.0} KiB; \
         generated and bulk-loaded in {:.1}s (generating {:.1}s of it)",
        total,
        kinds.join(", "),
        loaded.bytes as f64 / (1024.0 * 1024.0),
        loaded.bytes as f64 / total.max(1) as f64,
        loaded.largest as f64 / 1024.0,
        loaded.inbox.elapsed.as_secs_f64(),
        loaded.generated_in.as_secs_f64()
    );
    println!(
        "  enqueue (not timed)   : {} rows in {} poll_once rounds, {:.1}s",
        m.enqueue.rows,
        m.enqueue.rounds,
        m.enqueue.elapsed.as_secs_f64()
    );
}

/// Units per second over both brackets (all units ÷ all time).
fn bracketed_rate(m: &Measured, shape: BareShape) -> Option<f64> {
    let runs: Vec<&BareRun> = [m.before.get(shape), m.after.get(shape)]
        .into_iter()
        .flatten()
        .collect();
    if runs.is_empty() {
        return None;
    }
    let units: u64 = runs.iter().map(|r| r.units).sum();
    let time: Duration = runs.iter().map(|r| r.elapsed).sum();
    Some(rate(units, time))
}

fn print_bare(args: &PumpBenchArgs, m: &Measured) {
    println!(
        "  bare PG commit rates  : one held connection, synchronous_commit={} (relaxed: a second \
         connection with synchronous_commit = off, as the pump's stamp and bind), up to {} units or {:.0}s \
         each; 'before'/'after' bracket the pump run",
        m.server.synchronous_commit,
        args.bare_tx,
        args.bare_time.as_secs_f64()
    );
    for shape in BareShape::ALL {
        let Some(before) = m.before.get(shape) else {
            continue;
        };
        let after = m.after.get(shape);
        let overall = bracketed_rate(m, shape).unwrap_or_default();
        let bracket = match after {
            Some(a) => format!(" (before {:.0}, after {:.0})", before.rate(), a.rate()),
            None => String::new(),
        };
        let unit = if shape == BareShape::PumpMessage {
            "msg/s"
        } else {
            "tx/s "
        };
        println!(
            "    {:<23}: {overall:>6.0} {unit}{bracket}; unit p50 {} p99 {}, last COMMIT p50 {} \
             p99 {}; {}, {} round trips",
            shape.label(),
            ms(percentile(&before.unit_latency, 0.50)),
            ms(percentile(&before.unit_latency, 0.99)),
            ms(percentile(&before.commit_latency, 0.50)),
            ms(percentile(&before.commit_latency, 0.99)),
            commits(shape),
            shape.round_trips(),
        );
    }
    if let Some(rt) = &m.before.round_trips {
        println!(
            "    {:<23}: SELECT 1 on a held connection p50 {} p99 {}; store pool acquire of an \
             idle connection ({}) p50 {} p99 {}",
            "one round trip",
            ms(percentile(&rt.select_one, 0.50)),
            ms(percentile(&rt.select_one, 0.99)),
            acquire_ping(m.test_before_acquire),
            ms(percentile(&rt.acquire, 0.50)),
            ms(percentile(&rt.acquire, 0.99)),
        );
    }
}

/// The commits of a bare shape, e.g. "1 sync commit + 2 relaxed".
fn commits(shape: BareShape) -> String {
    match (shape.sync_commits(), shape.relaxed_commits()) {
        (s, 0) => format!("{s} sync commit"),
        (0, r) => format!("{r} relaxed commit"),
        (s, r) => format!("{s} sync commit + {r} relaxed"),
    }
}

/// What a store pool acquire does besides taking an idle connection.
fn acquire_ping(test_before_acquire: bool) -> &'static str {
    if test_before_acquire {
        "pings it first: test_before_acquire"
    } else {
        "no ping before checkout: test_before_acquire=false"
    }
}

fn print_run(run: &PumpRun) {
    let mut steps = run.steps.clone();
    steps.sort_unstable();
    let head: Duration = run.tenths.iter().map(|t| t.head).sum();
    println!(
        "  pump (step_group)    : {:.1} msgs/s, {} messages in {:.1}s; per message (took) p50 {} \
         p99 {} max {}; whole step p50 {} p99 {}; head query (step - took) mean {}",
        rate(run.messages, run.elapsed),
        run.messages,
        run.elapsed.as_secs_f64(),
        ms(percentile(&run.took, 0.50)),
        ms(percentile(&run.took, 0.99)),
        ms(run.took.last().copied().unwrap_or_default()),
        ms(percentile(&steps, 0.50)),
        ms(percentile(&steps, 0.99)),
        ms(head / u32::try_from(run.messages.max(1)).unwrap_or(u32::MAX)),
    );
    let outcomes: Vec<String> = run
        .outcomes
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    println!(
        "    outcomes            : {}; {} flight rows written, {} events queued; every row \
         SUCCEEDED and processed in MSG_ID order (checked in the store)",
        outcomes.join(", "),
        run.changes,
        run.events
    );
    let tenths: Vec<String> = run
        .tenths
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let n = u32::try_from(t.messages.max(1)).unwrap_or(u32::MAX);
            let pump = rate(t.messages, t.elapsed);
            let bare = run.probe_rate(BareShape::Tx, Some(i));
            format!(
                "{:>4}%: {pump:>5.0} msg/s (head {} + took {}) vs bare tx {bare:>5.0}/s = {:>5.1}%",
                (i + 1) * 10,
                ms(t.head / n),
                ms(t.took / n),
                100.0 * pump / bare.max(1e-9),
            )
        })
        .collect();
    println!(
        "    by tenth of the run (bare = BEGIN;UPDATE;COMMIT probes right before and after it):"
    );
    for line in tenths {
        println!("      {line}");
    }
}

fn print_ratios(m: &Measured) {
    let pump = rate(m.run.messages, m.run.elapsed);
    let pct = |bare: f64| 100.0 * pump / bare.max(1e-9);
    let bracketed = |shape: BareShape| {
        bracketed_rate(m, shape).map_or_else(
            || "n/a".to_string(),
            |bare| format!("{:.1}% of {bare:.0}/s", pct(bare)),
        )
    };
    println!(
        "  RATIO pump {pump:.1} msgs/s, time-matched (bare probes before the run and after every \
         tenth, pump paused) | bracketed (full bare runs before and after the pump)"
    );
    for (shape, what, note) in [
        (BareShape::Tx, "bare BEGIN;UPDATE;COMMIT", "aim ≥ 40%"),
        (BareShape::PumpTx, "pump-shaped tx", "the business tx alone"),
        (
            BareShape::PumpMessage,
            "pump-shaped message",
            "2 relaxed commits (stamp, bind) + business tx = 1 sync commit",
        ),
    ] {
        let probe = m.run.probe_rate(shape, None);
        println!(
            "    pump ÷ {what:<24}: {:>5.1}% of {probe:>5.0}/s | {}   ({note})",
            pct(probe),
            bracketed(shape),
        );
    }
}

/// Where the time went, from the timings the real step recorded ([`PumpCore::stages`]).
///
/// [`PumpCore::stages`]: msgx_core::pump::PumpCore::stages
fn print_stages(run: &PumpRun, before: &BareLimits) {
    let st = &run.stages;
    let n = st.messages.max(1) as f64;
    let total = run.elapsed.as_secs_f64() * 1e3 / n;
    println!(
        "  where the time goes   : recorded by PumpCore itself over the run: {} groups, {:.1} \
         messages per group (processing.group_max / group_max_wait), {:.2} batch outcome \
         statements per group",
        st.groups,
        n / st.groups.max(1) as f64,
        st.batches as f64 / st.groups.max(1) as f64
    );
    println!("    stage                 mean ms/msg   share   calls   ms/call");
    for stage in Stage::ALL {
        let (t, calls) = st.get(stage);
        let per = t.as_secs_f64() * 1e3 / n;
        println!(
            "    {:<20} {per:>10.3}  {:>5.1}%  {calls:>6}  {:>8.3}",
            stage.as_str(),
            100.0 * per / total.max(1e-9),
            t.as_secs_f64() * 1e3 / calls.max(1) as f64
        );
    }
    let rest = run.elapsed.saturating_sub(st.total());
    println!(
        "    {:<20} {:>10.3}  {:>5.1}%",
        "outside the stages",
        rest.as_secs_f64() * 1e3 / n,
        100.0 * rest.as_secs_f64() * 1e3 / n / total.max(1e-9)
    );
    println!("    {:<20} {total:>10.3}  100.0%", "total");
    if let Some(rt) = before.round_trips.as_ref() {
        println!(
            "    one round trip (SELECT 1, held connection) p50 {:.3} ms: the savepoint stage is \
             one round trip",
            percentile(&rt.select_one, 0.50).as_secs_f64() * 1e3
        );
    }
}

/// A duration as milliseconds with two decimals.
fn ms(d: Duration) -> String {
    format!("{:.2}ms", d.as_secs_f64() * 1e3)
}

/// An RSS sample.
fn mib(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".to_string(), |v| format!("{v:.1}"))
}
