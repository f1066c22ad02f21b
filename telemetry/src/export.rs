//! What the binary installs: the settings (`[telemetry]`, then the standard `OTEL_*`
//! variables), the OTLP exporter, the tracer provider and the subscriber layer that turns the
//! `otel` target's spans into OpenTelemetry ones.

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::trace::{SpanBuilder, Tracer, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use tracing_subscriber::filter::{filter_fn, FilterFn, Filtered};
use tracing_subscriber::layer::Layer;
use tracing_subscriber::registry::LookupSpan;

use crate::post::Poster;

/// The target of every span this crate builds; the exporting layer takes only these, and the
/// log filters (which name our crates) never do.
pub const SPAN_TARGET: &str = "otel";

/// How long one export may take before the batch is dropped: a collector that hangs must not
/// hold spans in memory for long.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// The settings of one process's tracing.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The collector's OTLP/HTTP base URL (`/v1/traces` is appended); `None` is off.
    pub endpoint: Option<String>,
    /// The share of requests without a `traceparent` that are traced, 0 to 1.
    pub sample_ratio: f64,
    /// `service.name`: the role (`seckill-node`, `seckill-orders`, ...), unless
    /// `OTEL_SERVICE_NAME` names it.
    pub service: String,
    /// `service.instance.id`: the node's or member's id, the order service's consumer name.
    pub instance: String,
}

/// The tracer [`install`] builds; until then no span of [`SPAN_TARGET`] exists (the edge makes
/// none while tracing is off), so nothing reaches the fallback.
static TRACER: OnceLock<SdkTracer> = OnceLock::new();
/// A tracer with no exporter, for a span that would arrive before [`TRACER`] is set.
static UNEXPORTED: OnceLock<SdkTracer> = OnceLock::new();

/// The process's tracer, bound late: logging starts before the config is read, tracing once it
/// is, and the subscriber's layers are fixed when it is built (a layer reloaded later would
/// hide the span extensions `traceparent` needs).
#[derive(Debug, Clone, Copy)]
pub struct LateTracer;

impl Tracer for LateTracer {
    type Span = opentelemetry_sdk::trace::Span;

    fn build_with_context(&self, builder: SpanBuilder, parent_cx: &Context) -> Self::Span {
        let tracer = TRACER
            .get()
            .unwrap_or_else(|| UNEXPORTED.get_or_init(|| SdkTracerProvider::builder().build().tracer("seckill")));
        tracer.build_with_context(builder, parent_cx)
    }
}

/// The layer every process's subscriber is built with: it turns the spans of [`SPAN_TARGET`]
/// (and only those) into OpenTelemetry spans, once [`install`] gave it an exporter.
pub fn layer<S>() -> Filtered<tracing_opentelemetry::OpenTelemetryLayer<S, LateTracer>, FilterFn, S>
where
    S: tracing::Subscriber + for<'span> LookupSpan<'span>,
{
    tracing_opentelemetry::layer()
        .with_tracer(LateTracer)
        .with_filter(filter_fn(|metadata| metadata.target() == SPAN_TARGET))
}

/// A running exporter; [`Exporting::shutdown`] sends what is queued.
pub struct Exporting {
    provider: SdkTracerProvider,
}

impl Exporting {
    /// Exports the spans still queued and stops, waiting at most the export timeout.
    pub async fn shutdown(self) {
        let provider = self.provider;
        // The SDK's shutdown blocks its caller until the batch thread is done, and that thread's
        // export runs on this runtime: it must not block one of the runtime's workers.
        let _ = tokio::task::spawn_blocking(move || provider.shutdown()).await;
    }
}

/// Starts exporting when `settings` name an endpoint: `Ok(None)` when tracing is off. Call once,
/// from within the process's tokio runtime, with [`layer`] in the global subscriber.
pub fn install(settings: &Settings) -> Result<Option<Exporting>, String> {
    let Some(endpoint) = &settings.endpoint else { return Ok(None) };
    if !(0.0..=1.0).contains(&settings.sample_ratio) {
        return Err(format!("[telemetry] sample_ratio must be between 0 and 1, got {}", settings.sample_ratio));
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(Poster::new(tokio::runtime::Handle::current(), EXPORT_TIMEOUT))
        .with_endpoint(traces_url(endpoint))
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| format!("OTLP exporter for {endpoint}: {e}"))?;
    let service = std::env::var("OTEL_SERVICE_NAME").ok().filter(|name| !name.is_empty());
    let resource = Resource::builder()
        .with_service_name(service.unwrap_or_else(|| settings.service.clone()))
        .with_attribute(KeyValue::new("service.instance.id", settings.instance.clone()))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        // The decision was made at the edge (edge::server_span): a span that exists is traced.
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)))
        .with_resource(resource)
        .build();
    TRACER.set(provider.tracer("seckill")).map_err(|_| "tracing was installed twice in this process")?;
    crate::edge::turn_on(settings.sample_ratio);
    Ok(Some(Exporting { provider }))
}

/// OTLP/HTTP's base URL gets the signal's path, as the standard variable's value does.
fn traces_url(endpoint: &str) -> String {
    if endpoint.ends_with("/v1/traces") {
        endpoint.to_string()
    } else {
        format!("{}/v1/traces", endpoint.trim_end_matches('/'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: an operator may give the base URL (as `OTEL_EXPORTER_OTLP_ENDPOINT` is) or the
    /// full traces URL; both post to `/v1/traces`.
    #[test]
    fn the_endpoint_is_a_base_url_or_the_traces_url() {
        assert_eq!(traces_url("http://collector:4318"), "http://collector:4318/v1/traces");
        assert_eq!(traces_url("http://collector:4318/"), "http://collector:4318/v1/traces");
        assert_eq!(traces_url("http://collector:4318/v1/traces"), "http://collector:4318/v1/traces");
    }
}
