//! `[traces]`: OpenTelemetry traces exported over OTLP (issue 54). Off by default; when on,
//! every key is checked at start so a typo never turns into silently lost traces.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{check_nonzero, duration, invalid, Secret, SettingsError};

/// The OTLP protocol the exporter speaks: protobuf over HTTP (no gRPC stack in the binary; no
/// JSON encoding either, which would link a serde layer for nothing a collector needs).
pub const PROTOCOLS: [&str; 1] = ["http/protobuf"];

/// Most spans waiting for export ([`TracesSettings::queue_size`]): a bigger queue only hides a
/// dead collector for longer at the cost of memory (a span is about 1 KiB).
pub const MAX_QUEUE: u32 = 1_000_000;

/// The exporter and what it sends.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TracesSettings {
    /// Export spans at all. Off: no span is built for a message, nothing is sent.
    pub enabled: bool,
    /// The collector's OTLP/HTTP traces URL, e.g. `http://127.0.0.1:4318/v1/traces`.
    pub endpoint: String,
    /// `http/protobuf` (the only one built in; the key names it so a site's intent is explicit).
    pub protocol: String,
    /// Extra request headers (`name=value,name=value`, as `OTEL_EXPORTER_OTLP_HEADERS`): a
    /// collector's API key. Secret: from `traces.headers_file` or a systemd credential.
    pub headers: Secret,
    /// Share of message traces kept, 0.0 to 1.0, decided on the trace id (parent-based: a
    /// trace a caller sampled through `POST /cminmsgs/send` follows the caller's decision).
    pub sampling_ratio: f64,
    /// `service.instance.id`; empty: the host name.
    pub instance: String,
    /// Most finished spans waiting for export; beyond it spans are dropped and counted
    /// (`msgx_trace_spans_dropped_total`), never waited for.
    pub queue_size: u32,
    /// Most spans per export request.
    pub batch_size: u32,
    /// Longest a finished span waits before its batch is sent.
    #[serde(with = "duration")]
    pub export_interval: Duration,
    /// One export request may take this long; then its spans are dropped and counted.
    #[serde(with = "duration")]
    pub export_timeout: Duration,
}

impl TracesSettings {
    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        if !(0.0..=1.0).contains(&self.sampling_ratio) {
            return Err(invalid(
                "traces.sampling_ratio",
                format!("{} is not between 0.0 and 1.0", self.sampling_ratio),
            ));
        }
        if !PROTOCOLS.contains(&self.protocol.as_str()) {
            return Err(invalid(
                "traces.protocol",
                format!(
                    "`{}` is not one of {} (gRPC and JSON are not built in: point it at the \
                     collector's OTLP/HTTP port, 4318)",
                    self.protocol,
                    PROTOCOLS.join(", ")
                ),
            ));
        }
        if self.queue_size == 0 || self.queue_size > MAX_QUEUE {
            return Err(invalid(
                "traces.queue_size",
                format!("{} is not between 1 and {MAX_QUEUE}", self.queue_size),
            ));
        }
        if self.batch_size == 0 || self.batch_size > self.queue_size {
            return Err(invalid(
                "traces.batch_size",
                format!(
                    "{} is not between 1 and traces.queue_size ({})",
                    self.batch_size, self.queue_size
                ),
            ));
        }
        check_nonzero(self.export_interval, "traces.export_interval")?;
        check_nonzero(self.export_timeout, "traces.export_timeout")?;
        self.header_pairs()?;
        if self.enabled {
            check_endpoint(&self.endpoint)?;
        }
        Ok(())
    }

    /// `traces.headers` as (name, value) pairs; the error names the key, never a value.
    pub fn header_pairs(&self) -> Result<Vec<(String, String)>, SettingsError> {
        parse_headers(self.headers.expose())
    }
}

/// An `http://` URL with a host. No TLS client is built into the exporter: an `https://`
/// endpoint is refused at start rather than failing every export later.
fn check_endpoint(endpoint: &str) -> Result<(), SettingsError> {
    if endpoint.starts_with("https://") {
        return Err(invalid(
            "traces.endpoint",
            format!(
                "`{endpoint}`: TLS to the collector is not built in; send to a collector or \
                 agent on this host or network over http:// (its OTLP/HTTP port, 4318), which \
                 forwards with TLS"
            ),
        ));
    }
    match endpoint.strip_prefix("http://") {
        Some(r) if !r.is_empty() && !r.starts_with('/') && !r.contains(char::is_whitespace) => {
            Ok(())
        }
        _ => Err(invalid(
            "traces.endpoint",
            format!(
                "`{endpoint}` is not an http:// URL with a host (the collector's OTLP/HTTP \
                 traces URL, e.g. http://127.0.0.1:4318/v1/traces)"
            ),
        )),
    }
}

/// `name=value,name=value` → pairs. Names are HTTP tokens; values may hold `=`.
fn parse_headers(raw: &str) -> Result<Vec<(String, String)>, SettingsError> {
    let mut out = Vec::new();
    for (i, item) in raw.split(',').enumerate() {
        if item.trim().is_empty() {
            continue;
        }
        let Some((name, value)) = item.split_once('=') else {
            return Err(invalid(
                "traces.headers",
                format!(
                    "entry {} has no `=` (expected name=value,name=value)",
                    i + 1
                ),
            ));
        };
        let name = name.trim();
        let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
        if name.is_empty() || !name.chars().all(token) {
            return Err(invalid(
                "traces.headers",
                format!("entry {} has no valid header name", i + 1),
            ));
        }
        if value.chars().any(|c| c.is_control()) {
            return Err(invalid(
                "traces.headers",
                format!("the value of `{name}` has a control character"),
            ));
        }
        out.push((name.to_string(), value.trim().to_string()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> TracesSettings {
        TracesSettings {
            enabled: true,
            endpoint: "http://127.0.0.1:4318/v1/traces".into(),
            protocol: "http/protobuf".into(),
            headers: Secret::default(),
            sampling_ratio: 1.0,
            instance: String::new(),
            queue_size: 2048,
            batch_size: 512,
            export_interval: Duration::from_secs(1),
            export_timeout: Duration::from_secs(5),
        }
    }

    fn key_of(t: &TracesSettings) -> Option<&'static str> {
        match t.validate() {
            Err(SettingsError::Invalid { key, .. }) => Some(key),
            Err(e) => panic!("unexpected {e}"),
            Ok(()) => None,
        }
    }

    #[test]
    fn traces_keys_are_checked_and_named() {
        assert_eq!(key_of(&base()), None);
        type Spoil = fn(&mut TracesSettings);
        let bad: [(Spoil, &str); 9] = [
            (
                |t| t.endpoint = "https://otel.example:4318/v1/traces".into(),
                "traces.endpoint",
            ),
            (|t| t.sampling_ratio = 1.5, "traces.sampling_ratio"),
            (|t| t.sampling_ratio = -0.1, "traces.sampling_ratio"),
            (|t| t.protocol = "grpc".into(), "traces.protocol"),
            (|t| t.queue_size = 0, "traces.queue_size"),
            (|t| t.batch_size = 4096, "traces.batch_size"),
            (|t| t.endpoint = "collector:4318".into(), "traces.endpoint"),
            (|t| t.headers = "x-api-key".into(), "traces.headers"),
            (
                |t| t.export_timeout = Duration::ZERO,
                "traces.export_timeout",
            ),
        ];
        for (spoil, key) in bad {
            let mut t = base();
            spoil(&mut t);
            assert_eq!(key_of(&t), Some(key), "{key}");
        }
        // Off, an empty endpoint is fine (the default); the other keys are still checked.
        let mut off = base();
        off.enabled = false;
        off.endpoint = String::new();
        assert_eq!(key_of(&off), None);
    }

    #[test]
    fn headers_parse_like_the_otel_variable() {
        let mut t = base();
        t.headers = "x-api-key=s3cr=t, authorization=Bearer abc".into();
        assert_eq!(
            t.header_pairs().unwrap(),
            vec![
                ("x-api-key".to_string(), "s3cr=t".to_string()),
                ("authorization".to_string(), "Bearer abc".to_string())
            ]
        );
        // The refusal names the entry, never the secret value.
        t.headers = "good=1,bad name=s3cret".into();
        let e = t.validate().unwrap_err().to_string();
        assert!(e.contains("traces.headers") && !e.contains("s3cret"), "{e}");
    }
}
