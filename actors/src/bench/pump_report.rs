//! The printed report of `bench pump`: the bare limits, the pump run, the ratios, where the
//! time goes, and the RSS samples.

use std::time::Duration;

use msgx_core::settings::{redact_url, Settings};

use super::super::databases::BenchDbs;
use super::super::percentile;
use super::super::report::rate;
use super::pump_bare::{BareLimits, BareRun, BareShape, PUMP_TX_STATEMENTS, RELAXED_TX_STATEMENTS};
use super::pump_load::Loaded;
use super::pump_run::PumpRun;
use super::pump_stages::Stages;
use super::{Measured, PumpBenchArgs};

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
         connections",
        args.messages, args.seed, m.run.read_ahead, settings.store.max_connections
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
    print_stages(&m.stages, &m.run, &m.before, m.test_before_acquire);
    let mut rss = vec![format!("start {}", mib(m.run.rss_start))];
    rss.extend(
        m.run
            .tenths
            .iter()
            .enumerate()
            .map(|(i, t)| format!("{}% {}", (i + 1) * 10, mib(t.rss))),
    );
    println!("  RSS MiB (pump run)    : {}", rss.join(", "));
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
        loaded.elapsed.as_secs_f64(),
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
        "  pump (PumpCore::step) : {:.1} msgs/s, {} messages in {:.1}s; per message (took) p50 {} \
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

fn print_stages(s: &Stages, run: &PumpRun, before: &BareLimits, test_before_acquire: bool) {
    let n = s.messages.max(1);
    let per = |d: Duration| d.as_secs_f64() * 1e3 / n as f64;
    let total = s.elapsed.as_secs_f64() * 1e3 / n as f64;
    let share = |d: Duration| 100.0 * per(d) / total.max(1e-9);
    let sample = usize::try_from(s.messages).unwrap_or(usize::MAX);
    let same_in_run: Duration = run.steps.iter().take(sample).sum();
    println!(
        "  where the time goes   : the first {} messages reset and replayed stage by stage with \
         PumpCore::step's own calls: {:.1} msgs/s (the run did the same messages at {:.1} msgs/s)",
        s.messages,
        rate(s.messages, s.elapsed),
        rate(s.messages, same_in_run),
    );
    println!("    stage                             mean ms   share");
    let row = |label: &str, d: Duration, note: String| {
        println!(
            "    {label:<33} {:>7.3}  {:>5.1}%  {note}",
            per(d),
            share(d)
        );
    };
    let relaxed_note = || {
        format!(
            "{RELAXED_TX_STATEMENTS} autocommit statement on the relaxed pool \
             (synchronous_commit = off): no WAL flush wait"
        )
    };
    let refills = s.refills.max(1);
    row("head query + decision", s.head, "1 statement".into());
    row("stamp attempt (relaxed commit)", s.stamp, relaxed_note());
    row(
        "read-ahead ids (next_unfinished)",
        s.ahead_ids,
        format!(
            "{} refills, 1 statement and {:.2} ms each, amortised over {:.1} msgs",
            s.refills,
            s.ahead_ids.as_secs_f64() * 1e3 / refills as f64,
            n as f64 / refills as f64
        ),
    );
    row(
        "raw read, MySQL (raw_messages)",
        s.raw_read,
        format!(
            "{:.2} ms per refill, {:.0} B per message",
            s.raw_read.as_secs_f64() * 1e3 / refills as f64,
            s.bytes as f64 / n as f64
        ),
    );
    row("decode (XmlCodec)", s.decode, String::new());
    row("bind identity (relaxed commit)", s.identity, relaxed_note());
    row(
        "business transaction",
        s.business,
        format!(
            "{:.1} statements incl. BEGIN/COMMIT, 1 synchronous commit (WAL flush); pure plan \
             inside {:.3} ms",
            s.business_statements as f64 / n as f64,
            per(s.plan)
        ),
    );
    row(
        "bench loop (untimed gaps)",
        s.elapsed.saturating_sub(s.staged()),
        String::new(),
    );
    println!("    {:<33} {total:>7.3}  100.0%", "total");
    let statements = s.pg_statements as f64 / n as f64;
    let relaxed = s.relaxed_statements as f64 / n as f64;
    let business = s.business_statements as f64 / n as f64;
    let acquires = s.pg_acquires as f64 / n as f64;
    println!(
        "    per message: {statements:.2} PostgreSQL statements = round trips ({relaxed:.1} in the \
         {:.0} relaxed commits, {business:.1} in the business tx, {:.2} head + read-ahead ids), over \
         {acquires:.2} pool acquires ({}); 1 synchronous commit (WAL flush) + {:.0} relaxed \
         commits; {:.1} flight rows and {:.1} events",
        relaxed / f64::from(RELAXED_TX_STATEMENTS),
        statements - relaxed - business,
        acquire_ping(test_before_acquire),
        relaxed / f64::from(RELAXED_TX_STATEMENTS),
        s.changes as f64 / n as f64,
        s.events as f64 / n as f64,
    );
    let probe = |shape: BareShape| s.probes.iter().find(|r| r.shape == shape);
    let p50 = |shape: BareShape| {
        probe(shape).map(|r| percentile(&r.unit_latency, 0.50).as_secs_f64() * 1e3)
    };
    let mean = |shape: BareShape| {
        probe(shape).map(|r| {
            r.unit_latency.iter().sum::<Duration>().as_secs_f64() * 1e3 / r.units.max(1) as f64
        })
    };
    if let (Some(relaxed_tx), Some(ptx)) = (mean(BareShape::RelaxedTx), mean(BareShape::PumpTx)) {
        println!(
            "    bare probes right before the replay (means): relaxed commit {relaxed_tx:.3} ms (cf. \
             stamp, bind), pump-shaped tx {ptx:.3} ms (cf. business)"
        );
    }
    if let (Some(ptx), Some(rt)) = (p50(BareShape::PumpTx), before.round_trips.as_ref()) {
        let rt = percentile(&rt.select_one, 0.50).as_secs_f64() * 1e3;
        let more = (statements - f64::from(PUMP_TX_STATEMENTS)).max(0.0);
        let floor = ptx + more * rt;
        println!(
            "    floor of this shape from the probes' p50s: pump-shaped tx {ptx:.2} + {more:.1} \
             more statements ({relaxed:.0} of them relaxed commits) × one round trip {rt:.3} = \
             {floor:.2} ms/msg ({:.0} msgs/s)",
            1e3 / floor.max(1e-9),
        );
        if let Some(relaxed_tx) = p50(BareShape::RelaxedTx) {
            println!(
                "      (check: the relaxed commit probe's p50 {relaxed_tx:.3} ms is {:.1} round trips; \
                 the floor counts it as {RELAXED_TX_STATEMENTS})",
                relaxed_tx / rt.max(1e-9),
            );
        }
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
