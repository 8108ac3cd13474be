//! `[http_ingest]`: `POST /v1/order-events`, for producers that cannot write to Kafka.

use anyhow::bail;
use serde::{Deserialize, Serialize};

use super::{bearer_token, listen_address, range};

/// HTTP ingest: `POST /v1/order-events` with an `Idempotency-Key`, for producers that
/// cannot write to Kafka. Served by processes running the ingest role.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpIngestConfig {
    /// `host:port`; empty (the default): no HTTP ingest.
    pub listen: String,
    /// Bearer token every request needs (not the admin token). Prefer `token_file` or
    /// `HERALD_HTTP_INGEST__TOKEN`; the listener refuses to start without one.
    pub token: Option<String>,
    pub token_file: Option<String>,
    /// How long an Idempotency-Key is answered with its first response: at least 24.
    pub key_retention_hours: u32,
    /// How long a request waits for another request with the same key before answering
    /// 409 (still in progress).
    pub in_progress_wait_ms: u64,
    /// Most requests converging at once (each holds a database connection of the pool the
    /// role's Kafka batches use); more answer 503 with Retry-After. Below database.pool_size.
    pub max_in_flight: usize,
}

impl HttpIngestConfig {
    /// Its own keys; `database.pool_size` and `admin.listen` are checked with the
    /// configuration ([`super::Config::validate`]).
    pub(super) fn validate(&self) -> anyhow::Result<()> {
        range(
            "http_ingest.key_retention_hours",
            self.key_retention_hours.into(),
            24,
            24 * 365,
        )?;
        range(
            "http_ingest.in_progress_wait_ms",
            self.in_progress_wait_ms,
            1,
            10_000,
        )?;
        if !self.listen.is_empty() {
            listen_address("http_ingest.listen", &self.listen)?;
            if self.token.as_deref().is_none_or(str::is_empty)
                && self.token_file.as_deref().is_none_or(str::is_empty)
            {
                bail!(
                    "http_ingest.listen is set but neither http_ingest.token nor http_ingest.token_file is"
                );
            }
        }
        Ok(())
    }

    pub fn bearer_token(&self) -> anyhow::Result<Option<String>> {
        bearer_token(
            "http_ingest.token_file",
            self.token.as_deref(),
            self.token_file.as_deref(),
        )
    }

    pub fn key_retention(&self) -> std::time::Duration {
        std::time::Duration::from_secs(u64::from(self.key_retention_hours) * 3600)
    }
}
