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
}

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
        Ok(())
    }

    /// The configured token, from `token` or `token_file`; `None` when neither is set.
    pub fn bearer_token(&self) -> anyhow::Result<Option<String>> {
        bearer_token("admin", self.token.as_deref(), self.token_file.as_deref())
    }
}
