//! The `[log]` and `[telemetry]` configuration sections.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::LogFormat;

/// Loaded from the configuration's `[log]`, whose defaults are `config/herald.example.toml`:
/// every key must be there ([`Default`] is for callers outside the configuration, and
/// herald's tests check that it equals the example).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    pub format: LogFormat,
    /// An `EnvFilter` directive such as `info` or `info,herald=debug`; `RUST_LOG` wins. A
    /// span-scoped one (`herald[attempt]=debug`) needs the text format: the JSON log
    /// ignores spans.
    pub level: String,
    /// Share of intents whose routine lines (`routine = true`: created to be sent, observed
    /// or suppressed by consent, duplicate converged, first attempt started or accepted)
    /// are written; the rest is always written. 1.0 writes every line.
    pub routine_sampling_ratio: f64,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            format: LogFormat::Json,
            level: "info".into(),
            routine_sampling_ratio: 1.0,
        }
    }
}

/// Loaded from the configuration's `[telemetry]`, whose defaults are
/// `config/herald.example.toml` (see [`LogSettings`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtelSettings {
    /// OTLP/HTTP traces endpoint, used verbatim (include `/v1/traces`). Empty: no export.
    pub traces_endpoint: Option<String>,
    /// OTLP/HTTP metrics endpoint, used verbatim (include `/v1/metrics`). Empty: metrics
    /// are only served on the admin port's `/metrics`.
    pub metrics_endpoint: Option<String>,
    /// Extra headers on every export request (an API key for a hosted backend).
    pub headers: BTreeMap<String, String>,
    /// Share of traces Herald starts itself that are sampled; a producer's decision in
    /// the `traceparent` flags is honoured (parent-based sampling).
    pub sampling_ratio: f64,
    pub service_name: String,
    /// `deployment.environment.name` resource attribute.
    pub environment: String,
    pub resource_attributes: BTreeMap<String, String>,
    pub export_timeout_ms: u64,
    /// Where a person opens a trace: a URL with `{trace_id}` in it, such as
    /// `https://zipkin.example/zipkin/traces/{trace_id}`. `herald intent show` prints it with
    /// the intent's trace id. Empty: the trace id alone.
    pub trace_link: Option<String>,
}

impl Default for OtelSettings {
    fn default() -> Self {
        Self {
            traces_endpoint: None,
            metrics_endpoint: None,
            headers: BTreeMap::new(),
            sampling_ratio: 1.0,
            service_name: "herald".into(),
            environment: String::new(),
            resource_attributes: BTreeMap::new(),
            export_timeout_ms: 10_000,
            trace_link: None,
        }
    }
}

impl OtelSettings {
    pub fn export_timeout(&self) -> Duration {
        Duration::from_millis(self.export_timeout_ms)
    }

    /// The trace UI's page of `trace_id`, when `trace_link` is set.
    pub fn trace_link(&self, trace_id: &str) -> Option<String> {
        self.trace_link
            .as_deref()
            .filter(|t| !t.is_empty())
            .map(|t| t.replace("{trace_id}", trace_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_link_puts_the_trace_id_in_the_template() {
        let mut otel = OtelSettings::default();
        assert_eq!(otel.trace_link("4bf9"), None);
        otel.trace_link = Some(String::new());
        assert_eq!(otel.trace_link("4bf9"), None);
        otel.trace_link = Some("http://127.0.0.1:19411/zipkin/traces/{trace_id}".into());
        assert_eq!(
            otel.trace_link("4bf9").as_deref(),
            Some("http://127.0.0.1:19411/zipkin/traces/4bf9")
        );
    }
}
