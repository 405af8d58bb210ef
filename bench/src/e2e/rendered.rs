//! The service's metrics as the recorder renders them, read back as `(series, value)` pairs:
//! what the drain's progress and the pump's stage table both read.

use metrics_exporter_prometheus::PrometheusHandle;

/// Every sample line of the rendered text: its series (name and labels) and value. Comment
/// lines and values that do not parse are left out.
pub(super) fn samples(metrics: &PrometheusHandle) -> Vec<(String, f64)> {
    metrics
        .render()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            Some((series.to_string(), value.parse::<f64>().ok()?))
        })
        .collect()
}

/// The series' metric name (before its labels).
pub(super) fn name(series: &str) -> &str {
    series.split('{').next().unwrap_or(series)
}

/// The value of label `label` in `series`, if it has one.
pub(super) fn label<'a>(series: &'a str, label: &str) -> Option<&'a str> {
    series
        .split(&format!("{label}=\""))
        .nth(1)
        .and_then(|rest| rest.split('"').next())
}
