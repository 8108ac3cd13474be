//! `[rendering]`: the default locale and the SMS length limit.

use anyhow::bail;
use serde::{Deserialize, Serialize};

use super::range;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenderingConfig {
    pub default_locale: String,
    pub sms_max_segments: u32,
}

impl RenderingConfig {
    pub(super) fn validate(&self) -> anyhow::Result<()> {
        if self.default_locale.trim().is_empty() {
            bail!("rendering.default_locale is empty");
        }
        range("rendering.sms_max_segments", self.sms_max_segments.into(), 1, 10)?;
        Ok(())
    }
}
