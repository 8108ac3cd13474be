//! `[admin]`: the admin HTTP endpoint (health, readiness, metrics, the inspection API).

use serde::{Deserialize, Serialize};

use super::{bearer_token, listen_address};

/// The admin HTTP endpoint: health, readiness, metrics and the inspection API.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// `host:port`; loopback by default. Empty: no admin endpoint.
    pub listen: String,
    /// `host:port` of a second listener serving only `/healthz`, `/readyz` and `/metrics`:
    /// what a pod exposes to its kubelet and Prometheus while `listen` (the ledger, the
    /// mutations) stays on loopback. Empty (the default): none.
    pub probe_listen: String,
    /// Bearer token the mutating endpoints (resolve, dead-letter replay) require. Prefer
    /// `token_file` or `HERALD_ADMIN__TOKEN`; without a token those endpoints answer 401.
    pub token: Option<String>,
    /// A file holding the token (trailing whitespace ignored).
    pub token_file: Option<String>,
    /// A read-only operator's token: the `/v1` reads, no mutation.
    pub read_token: Option<String>,
    pub read_token_file: Option<String>,
    /// `/v1` requests answered at once; more wait up to 5 s, then get 503. Each may hold a
    /// connection of the pool the roles share: below database.pool_size.
    pub max_concurrent_requests: u64,
}

/// The shortest token accepted: 32 bytes (256 bits of a random token's worth).
pub const MIN_TOKEN_BYTES: usize = 32;

impl AdminConfig {
    pub(super) fn validate(&self) -> anyhow::Result<()> {
        listen_address("admin.listen", &self.listen)?;
        listen_address("admin.probe_listen", &self.probe_listen)?;
        if !self.probe_listen.is_empty() && self.probe_listen == self.listen && !self.listen.ends_with(":0") {
            anyhow::bail!(
                "admin.probe_listen and admin.listen are both {:?}: give each its own",
                self.listen
            );
        }
        super::range(
            "admin.max_concurrent_requests",
            self.max_concurrent_requests,
            1,
            64,
        )?;
        // Inline tokens now; token files when they are read, at start.
        long_enough("admin.token", self.token.clone().filter(|t| !t.is_empty()))?;
        long_enough(
            "admin.read_token",
            self.read_token.clone().filter(|t| !t.is_empty()),
        )?;
        Ok(())
    }

    /// The configured token, from `token` or `token_file`; `None` when neither is set.
    /// Shorter than [`MIN_TOKEN_BYTES`]: an error.
    pub fn bearer_token(&self) -> anyhow::Result<Option<String>> {
        long_enough(
            "admin.token",
            bearer_token(
                "admin.token_file",
                self.token.as_deref(),
                self.token_file.as_deref(),
            )?,
        )
    }

    /// The read-only token, from `read_token` or `read_token_file`.
    pub fn read_token(&self) -> anyhow::Result<Option<String>> {
        let token = bearer_token(
            "admin.read_token_file",
            self.read_token.as_deref(),
            self.read_token_file.as_deref(),
        )?;
        let token = long_enough("admin.read_token", token)?;
        if token.is_some() && token == self.bearer_token()? {
            anyhow::bail!("admin.read_token is admin.token: give the read-only operator a token of its own");
        }
        Ok(token)
    }
}

fn long_enough(key: &str, token: Option<String>) -> anyhow::Result<Option<String>> {
    match token {
        Some(t) if t.len() < MIN_TOKEN_BYTES => anyhow::bail!(
            "{key} is {} bytes: at least {MIN_TOKEN_BYTES} are required (for instance `openssl rand -hex 32`)",
            t.len()
        ),
        t => Ok(t),
    }
}
