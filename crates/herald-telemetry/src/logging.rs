//! The global `tracing` subscriber: JSON lines (or human-readable text) to stderr, so that
//! command output on stdout stays machine-readable, plus the OpenTelemetry layer when traces
//! are exported. Destinations and bodies never reach a log field: callers log ids, channels,
//! revisions and outcome classes only.

use opentelemetry_sdk::trace::Tracer;
use serde::{Deserialize, Serialize};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::{LogSettings, TelemetryError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Json,
    Text,
}

pub(crate) fn install(log: &LogSettings, tracer: Option<Tracer>) -> Result<(), TelemetryError> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.is_empty() => EnvFilter::try_new(&v),
        _ => EnvFilter::try_new(&log.level),
    }
    .map_err(|source| TelemetryError::LogFilter {
        level: log.level.clone(),
        source,
    })?;
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(true);
    let fmt = match log.format {
        LogFormat::Json => fmt
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .boxed(),
        LogFormat::Text => fmt.with_ansi(false).boxed(),
    };
    // The filter applies to logs only: spans for export are chosen by the sampler, not by
    // the log level.
    let otel = tracer.map(|t| {
        tracing_opentelemetry::layer()
            .with_tracer(t)
            .with_filter(tracing_subscriber::filter::Targets::new().with_default(tracing::Level::INFO))
    });
    // A second initialisation (tests) keeps the first subscriber.
    let _ = tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .with(otel)
        .try_init();
    Ok(())
}
