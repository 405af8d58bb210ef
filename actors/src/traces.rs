//! The trace pipeline of `msgexchange run` (`[traces]`, issue 54): the OTLP/HTTP exporter
//! behind the bounded queue ([`queue`]), the SDK's tracer provider (parent-based sampling on
//! the trace-id ratio, the resource), the `tracing` bridge (`tracing-opentelemetry`: the
//! service's own `tracing` spans become OpenTelemetry spans, no second logging path) and the
//! message spans of `msgx_core::traces`.

pub mod log_ids;
pub mod queue;

use std::collections::HashMap;
use std::time::Duration;

use msgx_core::settings::Settings;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider, SpanExporter as _};
use opentelemetry_sdk::Resource;

use self::queue::{BoundedQueue, QueueLimits};

/// The instrumentation scope of every span.
pub const SCOPE: &str = "msgexchange";

/// Why the trace pipeline could not start (the service refuses to start: tracing was asked for).
#[derive(Debug, thiserror::Error)]
pub enum TracesError {
    /// The OTLP exporter could not be built from `[traces]`.
    #[error("configuration error: `traces.endpoint`: the OTLP exporter could not be built: {0}")]
    Exporter(String),
    /// `traces.headers` did not parse (validation normally caught it).
    #[error("{0}")]
    Settings(#[from] msgx_core::settings::SettingsError),
    /// The export thread could not start.
    #[error("trace export thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// The running pipeline; [`Pipeline::shutdown`] sends what is queued.
#[derive(Debug)]
pub struct Pipeline {
    provider: SdkTracerProvider,
    /// The tracer of the `tracing` bridge.
    pub tracer: SdkTracer,
}

impl Pipeline {
    /// Sends the queued spans (at most `within`) and stops the export thread.
    pub fn shutdown(self, within: Duration) {
        if let Err(e) = self.provider.shutdown_with_timeout(within) {
            tracing::warn!(error = %e, "trace export did not finish at shutdown; queued spans dropped");
        }
    }
}

/// The resource every span carries: `service.name`, `service.version`, `service.instance.id`
/// and the deployment (`msgx.ce_source`, `kafka.ce_source`).
pub fn resource(settings: &Settings) -> Resource {
    let t = &settings.traces;
    let instance = if t.instance.is_empty() {
        host_name()
    } else {
        t.instance.clone()
    };
    Resource::builder_empty()
        .with_service_name(SCOPE)
        .with_attributes([
            KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
            KeyValue::new("service.instance.id", instance),
            KeyValue::new("msgx.ce_source", settings.kafka.ce_source.clone()),
        ])
        .build()
}

/// Starts the pipeline when `traces.enabled` (else `None`: nothing is built) and installs the
/// message spans (`msgx_core::traces`). Call before any runtime starts: the blocking HTTP
/// client runs its own.
pub fn start(settings: &Settings) -> Result<Option<Pipeline>, TracesError> {
    let t = &settings.traces;
    if !t.enabled {
        return Ok(None);
    }
    let headers: HashMap<String, String> = t.header_pairs()?.into_iter().collect();
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(t.endpoint.clone())
        .with_protocol(Protocol::HttpBinary)
        .with_timeout(t.export_timeout)
        .with_headers(headers)
        .build()
        .map_err(|e| TracesError::Exporter(e.to_string()))?;
    let resource = resource(settings);
    exporter.set_resource(&resource);
    let limits = QueueLimits {
        capacity: t.queue_size as usize,
        batch: t.batch_size as usize,
        interval: t.export_interval,
    };
    let provider = SdkTracerProvider::builder()
        .with_span_processor(BoundedQueue::start(exporter, limits)?)
        // Parent-based: a caller's sampled flag decides for its trace; a trace of ours is
        // decided on its id, the same rule `msgx_core::traces::ratio_sampled` applies to the
        // contexts every hop rebuilds.
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            t.sampling_ratio,
        ))))
        .with_resource(resource)
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    let tracer = provider.tracer(SCOPE);
    msgx_core::traces::install(msgx_core::traces::Traces::new(
        &settings.kafka.ce_source,
        t.sampling_ratio,
        &settings.inbox.table,
        opentelemetry::global::tracer(SCOPE),
    ));
    Ok(Some(Pipeline { provider, tracer }))
}

/// The host name (`service.instance.id` by default), from the kernel.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
}
