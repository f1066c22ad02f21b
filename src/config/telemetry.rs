//! `[telemetry]`: traces over OTLP, off unless a collector is named here or in the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT`. The standard variables fill what the file leaves out, so one
//! image runs under any collector an orchestrator points it at.

use serde::Deserialize;

use super::{invalid, ConfigError};

/// The sampling ratio when neither the file nor `OTEL_TRACES_SAMPLER_ARG` gives one: a flash
/// sale's burst is tens of thousands of requests a second, and one in a hundred is plenty to
/// follow, at a cost the benchmarks measure (BENCHMARKS.md).
pub const SAMPLE_RATIO_DEFAULT: f64 = 0.01;

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetrySection {
    /// The collector's OTLP/HTTP base URL (`http://collector:4318`); `/v1/traces` is added.
    /// Absent: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, then `OTEL_EXPORTER_OTLP_ENDPOINT`; absent
    /// everywhere, tracing is off.
    pub endpoint: Option<String>,
    /// The share of requests arriving without a `traceparent` that are traced, 0 to 1. Absent:
    /// `OTEL_TRACES_SAMPLER_ARG`, else 0.01. A request whose `traceparent` says sampled is
    /// always traced, one that says not sampled never is.
    pub sample_ratio: Option<f64>,
}

impl TelemetrySection {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(endpoint) = &self.endpoint {
            if !endpoint.starts_with("http://") && !endpoint.starts_with("https://") {
                return Err(invalid("telemetry.endpoint", format!("must be an http:// URL, got {endpoint:?}")));
            }
            if endpoint.starts_with("https://") {
                return Err(invalid(
                    "telemetry.endpoint",
                    "https is not supported: export to a collector on the private network over http",
                ));
            }
        }
        if let Some(ratio) = self.sample_ratio {
            if !(0.0..=1.0).contains(&ratio) {
                return Err(invalid("telemetry.sample_ratio", format!("must be between 0 and 1, got {ratio}")));
            }
        }
        Ok(())
    }

    /// The settings of one process: `service` is its role, `instance` its id in the fleet.
    /// `lookup` reads the environment (a parameter so tests need not set the process's).
    pub fn settings(
        &self,
        service: &str,
        instance: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<telemetry::Settings, ConfigError> {
        let set = |name: &str| lookup(name).filter(|value| !value.trim().is_empty());
        let disabled = set("OTEL_SDK_DISABLED").is_some_and(|value| value.trim().eq_ignore_ascii_case("true"));
        let endpoint = if disabled {
            None
        } else {
            self.endpoint
                .clone()
                .or_else(|| set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
                .or_else(|| set("OTEL_EXPORTER_OTLP_ENDPOINT"))
        };
        let sample_ratio = match (self.sample_ratio, set("OTEL_TRACES_SAMPLER_ARG")) {
            (Some(ratio), _) => ratio,
            (None, Some(text)) => {
                text.trim().parse::<f64>().ok().filter(|ratio| (0.0..=1.0).contains(ratio)).ok_or_else(|| {
                    invalid("OTEL_TRACES_SAMPLER_ARG", format!("must be a ratio between 0 and 1, got {text:?}"))
                })?
            }
            (None, None) => SAMPLE_RATIO_DEFAULT,
        };
        let section = TelemetrySection { endpoint: endpoint.clone(), sample_ratio: Some(sample_ratio) };
        section.validate()?;
        Ok(telemetry::Settings { endpoint, sample_ratio, service: service.to_string(), instance: instance.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| pairs.iter().find(|(key, _)| *key == name).map(|(_, value)| (*value).to_string())
    }

    /// Goal: tracing is off unless a collector is named; the file wins over the standard
    /// variables, which fill what it leaves out; `OTEL_SDK_DISABLED=true` turns it all off.
    #[test]
    fn the_file_then_the_standard_variables_name_the_collector() {
        let off = TelemetrySection::default().settings("seckill-node", "n1", env(&[])).unwrap();
        assert_eq!((off.endpoint, off.sample_ratio), (None, SAMPLE_RATIO_DEFAULT));
        let from_env = TelemetrySection::default()
            .settings(
                "seckill-node",
                "n1",
                env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"), ("OTEL_TRACES_SAMPLER_ARG", "0.25")]),
            )
            .unwrap();
        assert_eq!((from_env.endpoint.as_deref(), from_env.sample_ratio), (Some("http://collector:4318"), 0.25));
        assert_eq!((from_env.service.as_str(), from_env.instance.as_str()), ("seckill-node", "n1"));
        let file = TelemetrySection { endpoint: Some("http://file:4318".into()), sample_ratio: Some(1.0) };
        let both = file.settings("s", "i", env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318")])).unwrap();
        assert_eq!((both.endpoint.as_deref(), both.sample_ratio), (Some("http://file:4318"), 1.0));
        let disabled = file.settings("s", "i", env(&[("OTEL_SDK_DISABLED", "true")])).unwrap();
        assert_eq!(disabled.endpoint, None);
    }

    /// Goal: a ratio out of range, or an endpoint that is not an http URL, is refused naming
    /// the setting.
    #[test]
    fn bad_settings_name_the_key() {
        let ratio = TelemetrySection { endpoint: None, sample_ratio: Some(1.5) };
        assert!(ratio.validate().unwrap_err().to_string().starts_with("telemetry.sample_ratio"));
        let endpoint = TelemetrySection { endpoint: Some("collector:4318".into()), sample_ratio: None };
        assert!(endpoint.validate().unwrap_err().to_string().starts_with("telemetry.endpoint"));
        let from_env = TelemetrySection::default().settings("s", "i", env(&[("OTEL_TRACES_SAMPLER_ARG", "lots")]));
        assert!(from_env.unwrap_err().to_string().starts_with("OTEL_TRACES_SAMPLER_ARG"));
    }
}
