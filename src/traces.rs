//! Starts and stops a server's trace export ([`telemetry`]) from `[telemetry]` and the standard
//! `OTEL_*` variables: each role names itself, and each process its place in the fleet.

use crate::config::TelemetrySection;

/// A server's running exporter, if tracing is on.
pub struct Traces(Option<telemetry::Exporting>);

/// Starts exporting when a collector is named (`section`, then the `OTEL_*` variables); says
/// where to, once, at info.
pub fn start(section: &TelemetrySection, service: &str, instance: &str) -> anyhow::Result<Traces> {
    let settings = section.settings(service, instance, |name| std::env::var(name).ok())?;
    let exporting = telemetry::install(&settings).map_err(anyhow::Error::msg)?;
    if let (Some(endpoint), Some(_)) = (&settings.endpoint, &exporting) {
        tracing::info!(
            "tracing to {endpoint} as {service} ({instance}), {}% of requests without a traceparent",
            settings.sample_ratio * 100.0
        );
    }
    Ok(Traces(exporting))
}

impl Traces {
    /// Sends the spans still queued; call after the server stopped taking requests.
    pub async fn stop(self) {
        if let Some(exporting) = self.0 {
            exporting.shutdown().await;
        }
    }
}
