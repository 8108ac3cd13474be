//! `[suppression]`: the key of the suppression list's digests.

use std::fmt;

use herald_store::destination::{DestinationKey, KEY_MIN_BYTES};
use serde::{Deserialize, Serialize};

use super::bearer_token;

/// The suppression list names destinations by an HMAC of the address keyed with this
/// secret (see herald-store's `destination`): without the key, the list and a purged
/// payload's destination digest say nothing of who is on it. Required, at least 32 bytes.
/// Every instance of a deployment must have the same key: the first records its id in the
/// database, and `herald run` and retention refuse another.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SuppressionConfig {
    /// The key itself. Prefer `key_file` or `HERALD_SUPPRESSION__KEY`. Trailing
    /// whitespace is ignored, as in a file. Never serialized.
    #[serde(skip_serializing)]
    pub key: Option<String>,
    /// A file holding the key (trailing whitespace ignored).
    pub key_file: Option<String>,
}

impl fmt::Debug for SuppressionConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SuppressionConfig")
            .field("key", &self.key.as_ref().map(|_| "<redacted>"))
            .field("key_file", &self.key_file)
            .finish()
    }
}

impl SuppressionConfig {
    /// An inline key is long enough. Whether one is set at all is checked where it is
    /// needed ([`SuppressionConfig::require`]): the example configuration, Herald's
    /// defaults, sets none.
    pub(super) fn validate(&self) -> anyhow::Result<()> {
        if let Some(k) = self.key.as_deref().filter(|k| !k.is_empty()) {
            DestinationKey::new(k.trim_end().as_bytes())?;
        }
        Ok(())
    }

    /// A key is configured, inline or as a file (not read here: `check-config` validates
    /// a file without the secrets it names).
    pub fn require(&self) -> anyhow::Result<()> {
        let set = |v: &Option<String>| v.as_deref().is_some_and(|v| !v.is_empty());
        if !set(&self.key) && !set(&self.key_file) {
            anyhow::bail!(
                "suppression.key is required: a secret of {KEY_MIN_BYTES} bytes or more that keys the suppression \
                 list's digests (set suppression.key_file or HERALD_SUPPRESSION__KEY; `openssl rand -hex 32` makes one)"
            );
        }
        Ok(())
    }

    /// The key, from `key` or `key_file`.
    pub fn destination_key(&self) -> anyhow::Result<DestinationKey> {
        self.require()?;
        let secret = bearer_token(
            "suppression.key_file",
            self.key.as_deref(),
            self.key_file.as_deref(),
        )?
        .ok_or_else(|| anyhow::anyhow!("suppression.key is required"))?;
        Ok(DestinationKey::new(secret.trim_end().as_bytes())?)
    }
}
