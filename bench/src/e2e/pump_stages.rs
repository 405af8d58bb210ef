//! Where the service's pump spent its time during the drain, from its own
//! `msgx_pump_stage_seconds` histograms: the stages `msgx-bench pump` prints for the pump
//! alone, so the two tables compare stage by stage (which stages the rest of the pipeline —
//! marking, delivery, discovery, housekeeping — slows down when it runs beside the pump).

use std::collections::BTreeMap;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use msgx_core::telemetry::{PUMP_STAGES, PUMP_STAGE_SECONDS};

use super::rendered;

/// `(seconds, calls)` per stage, read from the recorder's `_sum` and `_count` series.
fn read(metrics: &PrometheusHandle) -> BTreeMap<String, (f64, u64)> {
    let (sum, count) = (
        format!("{PUMP_STAGE_SECONDS}_sum"),
        format!("{PUMP_STAGE_SECONDS}_count"),
    );
    let mut stages = BTreeMap::new();
    for (series, value) in rendered::samples(metrics) {
        let Some(stage) = rendered::label(&series, "stage") else {
            continue;
        };
        let entry = stages.entry(stage.to_string()).or_insert((0.0, 0));
        let name = rendered::name(&series);
        if name == sum {
            entry.0 += value;
        } else if name == count {
            entry.1 += value as u64;
        }
    }
    stages
}

/// Prints the pump's stage table over the drain: ms per message, share of the staged time,
/// calls and ms per call, then how much of the drain's wall time the pump spent in its stages
/// (near 100 %: the pipeline's pace is the pump's).
pub(super) fn print(metrics: &PrometheusHandle, messages: u64, wall: Duration) {
    let stages = read(metrics);
    let staged: f64 = stages.values().map(|(s, _)| s).sum();
    if staged <= 0.0 {
        return;
    }
    let per_msg = |s: f64| s * 1e3 / messages.max(1) as f64;
    println!("  pump stages           : its own msgx_pump_stage_seconds over the drain (compare msgx-bench pump's table)");
    println!("    stage                 mean ms/msg   share   calls   ms/call");
    for stage in PUMP_STAGES {
        let (secs, calls) = stages.get(*stage).copied().unwrap_or((0.0, 0));
        println!(
            "    {stage:<21} {:>11.4} {:>6.1}% {:>7} {:>9.3}",
            per_msg(secs),
            100.0 * secs / staged,
            calls,
            secs * 1e3 / calls.max(1) as f64
        );
    }
    println!(
        "    staged                {:>11.4}  {:.1} s = {:.1} % of the drain's {:.1} s",
        per_msg(staged),
        staged,
        100.0 * staged / wall.as_secs_f64().max(1e-9),
        wall.as_secs_f64()
    );
}
