//! Logging setup for every `herald` command: JSON lines (one event per intent creation,
//! reuse and conflict) or human-readable text, to stderr so that command output on stdout
//! stays machine-readable. Tracing and metrics exporters join here with the observability
//! issue.

use serde::{Deserialize, Serialize};
use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Json,
    Text,
}

#[derive(Debug, thiserror::Error)]
#[error("log.level {level:?} is not a valid filter: {source}")]
pub struct LogInitError {
    level: String,
    source: tracing_subscriber::filter::ParseError,
}

/// Installs the global subscriber. `level` is an `EnvFilter` directive such as `info` or
/// `info,herald=debug`; `RUST_LOG`, when set, wins.
pub fn init_logging(format: LogFormat, level: &str) -> Result<(), LogInitError> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.is_empty() => EnvFilter::try_new(&v),
        _ => EnvFilter::try_new(level),
    }
    .map_err(|source| LogInitError {
        level: level.to_owned(),
        source,
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(true);
    // A second initialisation (tests) keeps the first subscriber.
    let _ = match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
        LogFormat::Text => builder.with_ansi(false).try_init(),
    };
    Ok(())
}
