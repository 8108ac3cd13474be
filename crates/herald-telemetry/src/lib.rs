//! Herald's telemetry: JSON logs, OpenTelemetry traces exported over OTLP when configured,
//! and one set of metric instruments read both by the Prometheus scrape on the admin port
//! and (when configured) by an OTLP metrics exporter, and read back in the process for
//! the log lines that report totals (`Metrics::read`).
//!
//! [`Telemetry::init`] runs once, before the async runtime starts (the OTLP exporters run
//! on threads of their own); [`Telemetry::shutdown`] flushes and stops them on exit.

mod logging;
pub mod metrics;
pub mod propagation;
mod settings;

use std::sync::Arc;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use opentelemetry_sdk::Resource;

pub use logging::{log_layer, routine_kept, routine_lines_sampled_out, trace_layer, LogFormat};
pub use metrics::{Gauges, Metrics, PartitionKey, PartitionSample, Reading};
pub use settings::{LogSettings, OtelSettings};

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("log.level {level:?} is not a valid filter: {source}")]
    LogFilter {
        level: String,
        source: tracing_subscriber::filter::ParseError,
    },
    #[error("log.routine_sampling_ratio must be within 0.0..=1.0, got {0}")]
    RoutineSamplingRatio(f64),
    #[error("telemetry.sampling_ratio must be within 0.0..=1.0, got {0}")]
    SamplingRatio(f64),
    #[error("OTLP {signal} exporter for {endpoint:?}: {detail}")]
    Exporter {
        signal: &'static str,
        endpoint: String,
        detail: String,
    },
    #[error("Prometheus exporter: {0}")]
    Prometheus(String),
}

/// The process's telemetry providers. Keep it for the life of the process and call
/// [`Telemetry::shutdown`] before exiting so that buffered spans and metrics are sent.
pub struct Telemetry {
    tracer_provider: Option<SdkTracerProvider>,
    meter_provider: SdkMeterProvider,
    registry: prometheus::Registry,
    metrics: Arc<Metrics>,
}

impl Telemetry {
    /// Installs the global `tracing` subscriber (JSON or text logs to stderr, plus the
    /// OpenTelemetry layer when `otel.traces_endpoint` is set) and builds the meter
    /// provider with its Prometheus reader (and OTLP reader when `otel.metrics_endpoint`
    /// is set).
    pub fn init(log: &LogSettings, otel: &OtelSettings) -> Result<Self, TelemetryError> {
        if !(0.0..=1.0).contains(&otel.sampling_ratio) {
            return Err(TelemetryError::SamplingRatio(otel.sampling_ratio));
        }
        if !(0.0..=1.0).contains(&log.routine_sampling_ratio) {
            return Err(TelemetryError::RoutineSamplingRatio(log.routine_sampling_ratio));
        }
        let resource = resource(otel);
        let tracer_provider = match otel.traces_endpoint.as_deref().filter(|e| !e.is_empty()) {
            Some(endpoint) => Some(tracer_provider(otel, endpoint, resource.clone())?),
            None => None,
        };
        let tracer = tracer_provider.as_ref().map(|p| p.tracer("herald"));
        logging::install(log, tracer)?;

        let registry = prometheus::Registry::new();
        let mut meters = SdkMeterProvider::builder()
            .with_resource(resource)
            .with_reader(prometheus_reader(&registry)?);
        if let Some(endpoint) = otel.metrics_endpoint.as_deref().filter(|e| !e.is_empty()) {
            let exporter = opentelemetry_otlp::MetricExporter::builder()
                .with_http()
                .with_endpoint(endpoint)
                .with_headers(otel.headers.clone().into_iter().collect())
                .with_timeout(otel.export_timeout())
                .build()
                .map_err(|e| TelemetryError::Exporter {
                    signal: "metrics",
                    endpoint: endpoint.to_owned(),
                    detail: e.to_string(),
                })?;
            meters = meters.with_periodic_exporter(exporter);
        }
        let meter_provider = meters.build();
        let metrics = Arc::new(Metrics::new(
            &opentelemetry::metrics::MeterProvider::meter(&meter_provider, "herald"),
            registry.clone(),
            env!("CARGO_PKG_VERSION"),
        ));
        Ok(Self {
            tracer_provider,
            meter_provider,
            registry,
            metrics,
        })
    }

    /// Logging only, for commands that neither trace nor serve metrics (`migrate`,
    /// `intent show`, ...). Metrics recorded through it go nowhere but are still valid.
    pub fn init_logging(log: &LogSettings) -> Result<Self, TelemetryError> {
        Self::init(log, &OtelSettings::default())
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Whether spans are exported: callers skip building per-message spans otherwise.
    pub fn tracing_enabled(&self) -> bool {
        self.tracer_provider.is_some()
    }

    /// A handle the admin endpoint uses to render `/metrics`.
    pub fn scrape_handle(&self) -> ScrapeHandle {
        ScrapeHandle(self.registry.clone())
    }

    /// Flushes buffered spans and metrics and stops the exporter threads. Call outside
    /// the async runtime (the OTLP HTTP client blocks).
    pub fn shutdown(self) {
        if let Some(p) = self.tracer_provider {
            if let Err(e) = p.shutdown() {
                eprintln!("herald: trace exporter shutdown: {e}");
            }
        }
        if let Err(e) = self.meter_provider.shutdown() {
            eprintln!("herald: metrics shutdown: {e}");
        }
    }
}

/// The reader that serves `registry` to the scrape: Herald's names as given (no scope
/// labels, no `target_info`).
fn prometheus_reader(
    registry: &prometheus::Registry,
) -> Result<opentelemetry_prometheus::PrometheusExporter, TelemetryError> {
    opentelemetry_prometheus::exporter()
        .with_registry(registry.clone())
        .scope_info_enabled(false)
        .without_target_info()
        .build()
        .map_err(|e| TelemetryError::Prometheus(e.to_string()))
}

/// Renders the Prometheus text exposition (`GET /metrics`).
#[derive(Clone)]
pub struct ScrapeHandle(prometheus::Registry);

impl ScrapeHandle {
    pub fn render(&self) -> String {
        render(&self.0)
    }
}

fn render(registry: &prometheus::Registry) -> String {
    use prometheus::Encoder;
    let mut out = Vec::new();
    // Encoding text into a Vec cannot fail on I/O; a malformed family is skipped by the
    // encoder's error, which we surface as an empty scrape rather than a panic.
    if prometheus::TextEncoder::new()
        .encode(&registry.gather(), &mut out)
        .is_err()
    {
        return String::new();
    }
    String::from_utf8(out).unwrap_or_default()
}

fn resource(otel: &OtelSettings) -> Resource {
    let mut attributes = vec![KeyValue::new("service.version", env!("CARGO_PKG_VERSION"))];
    if !otel.environment.is_empty() {
        attributes.push(KeyValue::new(
            "deployment.environment.name",
            otel.environment.clone(),
        ));
    }
    for (k, v) in &otel.resource_attributes {
        attributes.push(KeyValue::new(k.clone(), v.clone()));
    }
    Resource::builder()
        .with_service_name(otel.service_name.clone())
        .with_attributes(attributes)
        .build()
}

fn tracer_provider(
    otel: &OtelSettings,
    endpoint: &str,
    resource: Resource,
) -> Result<SdkTracerProvider, TelemetryError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(endpoint)
        .with_headers(otel.headers.clone().into_iter().collect())
        .with_timeout(otel.export_timeout())
        .build()
        .map_err(|e| TelemetryError::Exporter {
            signal: "traces",
            endpoint: endpoint.to_owned(),
            detail: e.to_string(),
        })?;
    // Parent-based: a producer's sampling decision (the traceparent flags) is honoured;
    // traces Herald starts itself are sampled at the configured ratio.
    let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(otel.sampling_ratio)));
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(sampler)
        .with_resource(resource)
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ratio_outside_zero_to_one_is_refused_naming_its_key() {
        for bad in [1.5, -0.1, f64::NAN] {
            let log = LogSettings {
                routine_sampling_ratio: bad,
                ..LogSettings::default()
            };
            let e = Telemetry::init(&log, &OtelSettings::default())
                .err()
                .map(|e| e.to_string());
            assert!(
                e.as_deref()
                    .is_some_and(|e| e.starts_with("log.routine_sampling_ratio")),
                "{bad}: {e:?}"
            );
        }
    }
}
