//! The `[log]` and `[telemetry]` configuration sections.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::LogFormat;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSettings {
    pub format: LogFormat,
    /// An `EnvFilter` directive such as `info` or `info,herald=debug`; `RUST_LOG` wins.
    pub level: String,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            format: LogFormat::Json,
            level: "info".into(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
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
        }
    }
}

impl OtelSettings {
    pub fn export_timeout(&self) -> Duration {
        Duration::from_millis(self.export_timeout_ms)
    }
}
