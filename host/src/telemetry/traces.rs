//! OpenTelemetry traces (`sluice serve --otlp-endpoint`, cargo feature `otlp`): the spans
//! of every request (`request`, with `guest` and `queue` under it) and of every batch
//! (`compute`, linked to the queue spans of the requests it ran) are sent to a collector
//! over OTLP/gRPC in batches, off the request path. A client's W3C `traceparent` makes the
//! request span part of the client's trace. Off unless an endpoint is given.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set while the export runs: only then do request spans carry their OpenTelemetry fields
/// and continue a client's trace (otherwise that would be work for nothing).
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// The log filter `sluice serve` uses where `SLUICE_LOG` sets none.
pub const DEFAULT_LOG_FILTER: &str = "info,ort=warn,cranelift=warn,wasmtime=warn";

/// The W3C trace-context header (HTTP) and metadata key (gRPC).
pub const TRACEPARENT: &str = "traceparent";
/// Vendor state that travels with `traceparent`.
pub const TRACESTATE: &str = "tracestate";

/// Whether spans are being exported.
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// Spans closing are written to the log (`--log-spans`): set once at start.
static SPANS_LOGGED: AtomicBool = AtomicBool::new(false);

pub fn set_spans_logged(logged: bool) {
    SPANS_LOGGED.store(logged, Ordering::Relaxed);
}

/// Whether anyone reads a span as a whole (exported, or logged as it closes), so that fields
/// describing the request as a whole are worth recording on it; otherwise a span only names
/// the request on the log lines made inside it.
pub fn spans_read() -> bool {
    exporting() || SPANS_LOGGED.load(Ordering::Relaxed)
}

/// Make `span` a child of the client's span named by a W3C `traceparent` (and
/// `tracestate`), when spans are exported and the header is well formed; otherwise the
/// span starts a trace of its own.
pub fn continue_client_trace(span: &tracing::Span, traceparent: Option<&str>, tracestate: Option<&str>) {
    if !exporting() {
        return;
    }
    let Some(traceparent) = traceparent else { return };
    #[cfg(feature = "otlp")]
    export::set_remote_parent(span, traceparent, tracestate);
    #[cfg(not(feature = "otlp"))]
    let _ = (span, traceparent, tracestate);
}

/// A layer for the subscriber that all spans go through.
pub type BoxedLayer<S> = Box<dyn tracing_subscriber::Layer<S> + Send + Sync + 'static>;

/// The running export; [`OtlpExport::shutdown`] sends what is still buffered.
pub struct OtlpExport {
    #[cfg(feature = "otlp")]
    provider: opentelemetry_sdk::trace::SdkTracerProvider,
}

impl OtlpExport {
    /// Connect (lazily) to the collector at `endpoint` (`http://host:4317`) and return the
    /// layer that turns Sluice's spans into OpenTelemetry spans. Must run inside a Tokio
    /// runtime: the gRPC channel's worker lives on it. Batch size, delay and queue follow
    /// the standard `OTEL_BSP_*` variables, the sampler `OTEL_TRACES_SAMPLER`.
    pub fn start<S>(endpoint: &str) -> anyhow::Result<(Self, BoxedLayer<S>)>
    where
        S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span> + Send + Sync,
    {
        #[cfg(feature = "otlp")]
        {
            let (provider, layer) = export::start(endpoint)?;
            EXPORTING.store(true, Ordering::Relaxed);
            Ok((Self { provider }, layer))
        }
        #[cfg(not(feature = "otlp"))]
        anyhow::bail!("cannot export spans to {endpoint}: this sluice was built without the `otlp` feature")
    }

    /// Send the spans still buffered and stop exporting.
    pub fn shutdown(self) {
        EXPORTING.store(false, Ordering::Relaxed);
        #[cfg(feature = "otlp")]
        export::shutdown(&self.provider);
    }
}

#[cfg(feature = "otlp")]
mod export {
    use std::collections::HashMap;
    use std::time::Duration;

    use anyhow::Context as _;
    use opentelemetry::propagation::TextMapPropagator;
    use opentelemetry::trace::{TraceContextExt, TracerProvider};
    use opentelemetry_otlp::WithExportConfig;
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    use tracing_subscriber::registry::LookupSpan;

    use super::BoxedLayer;

    /// How long shutting down waits for the last spans to reach the collector.
    const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

    pub(super) fn start<S>(endpoint: &str) -> anyhow::Result<(SdkTracerProvider, BoxedLayer<S>)>
    where
        S: tracing::Subscriber + for<'span> LookupSpan<'span> + Send + Sync,
    {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .build()
            .with_context(|| format!("cannot export spans to {endpoint}"))?;
        let mut resource = Resource::builder();
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name("sluice");
        }
        let resource =
            resource.with_attribute(opentelemetry::KeyValue::new("service.version", env!("CARGO_PKG_VERSION"))).build();
        let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
        // No `target` attribute from the module path: the request span's own `target` (the
        // URL path or model) would be hidden behind it.
        let layer = tracing_opentelemetry::layer().with_target(false).with_tracer(provider.tracer("sluice"));
        Ok((provider, Box::new(layer)))
    }

    pub(super) fn shutdown(provider: &SdkTracerProvider) {
        if let Err(err) = provider.shutdown_with_timeout(FLUSH_TIMEOUT) {
            tracing::warn!(error = %err, "the last spans may not have reached the collector");
        }
    }

    pub(super) fn set_remote_parent(span: &tracing::Span, traceparent: &str, tracestate: Option<&str>) {
        let mut carrier = HashMap::from([(super::TRACEPARENT.to_string(), traceparent.to_string())]);
        if let Some(state) = tracestate {
            carrier.insert(super::TRACESTATE.to_string(), state.to_string());
        }
        let parent = TraceContextPropagator::new().extract(&carrier);
        // A malformed traceparent extracts to an empty context: keep the span's own trace.
        if parent.span().span_context().is_valid() {
            let _ = span.set_parent(parent);
        }
    }
}
