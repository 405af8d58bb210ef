//! Log lines inside an exported span carry its `trace_id` and `span_id` (issue 54), so a log
//! search and a trace view find each other. A wrapper around the usual text or JSON line: the
//! ids come from the span's OpenTelemetry data (`tracing-opentelemetry`), when it has any —
//! with tracing off, lines are exactly as before.

use std::fmt::{self, Write as _};

use opentelemetry::trace::TraceId;
use tracing::{Event, Subscriber};
use tracing_opentelemetry::OtelData;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The line format `F`, with the current span's trace ids added.
#[derive(Debug, Clone)]
pub struct WithTraceIds<F> {
    inner: F,
    json: bool,
}

impl<F> WithTraceIds<F> {
    /// Wraps a text line format (ids appended as `trace_id=… span_id=…`).
    pub fn text(inner: F) -> Self {
        Self { inner, json: false }
    }

    /// Wraps a JSON line format (ids as the first two members of the object).
    pub fn json(inner: F) -> Self {
        Self { inner, json: true }
    }
}

impl<S, N, F> FormatEvent<S, N> for WithTraceIds<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let Some((trace_id, span_id)) = current_ids(ctx) else {
            return self.inner.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        // Formatted into a string first (no colour: the ids are put into the line after).
        self.inner
            .format_event(ctx, Writer::new(&mut line), event)?;
        writer.write_str(&with_ids(&line, &trace_id, &span_id, self.json))
    }
}

/// The line with the ids added (`line` as the inner format wrote it, newline included).
fn with_ids(line: &str, trace_id: &str, span_id: &str, json: bool) -> String {
    let body = line.strip_suffix('\n').unwrap_or(line);
    let mut out = String::with_capacity(line.len() + 72);
    match body.strip_prefix('{') {
        Some(rest) if json => {
            let _ = write!(
                out,
                "{{\"trace_id\":\"{trace_id}\",\"span_id\":\"{span_id}\",{rest}"
            );
        }
        _ => {
            let _ = write!(out, "{body} trace_id={trace_id} span_id={span_id}");
        }
    }
    out.push('\n');
    out
}

/// The current span's OpenTelemetry trace and span id, when it has them.
fn current_ids<S, N>(ctx: &FmtContext<'_, S, N>) -> Option<(String, String)>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    let span = ctx.lookup_current()?;
    let ext = span.extensions();
    let data = ext.get::<OtelData>()?;
    // Built once the span was entered (tracing-opentelemetry's context activation).
    let (trace_id, span_id) = (data.trace_id()?, data.span_id()?);
    if trace_id == TraceId::INVALID {
        return None;
    }
    Some((trace_id.to_string(), span_id.to_string()))
}

#[cfg(test)]
mod tests {
    use super::with_ids;

    #[test]
    fn ids_join_text_and_json_lines() {
        let t = "4bf92f3577b34da6a3ce929d0e0e4736";
        let s = "00f067aa0ba902b7";
        assert_eq!(
            with_ids("2026 INFO msgx: round done\n", t, s, false),
            format!("2026 INFO msgx: round done trace_id={t} span_id={s}\n")
        );
        let json = with_ids("{\"level\":\"INFO\",\"msg\":\"x\"}\n", t, s, true);
        let v: serde_json::Value = serde_json::from_str(json.trim_end()).expect("still JSON");
        assert_eq!(v["trace_id"], t);
        assert_eq!(v["span_id"], s);
        assert_eq!(v["level"], "INFO");
    }
}
