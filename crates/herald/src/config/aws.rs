//! `[aws]`: the AWS clients (SES, SNS, SQS, CloudWatch Logs).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::range;

/// The AWS clients. Unset values come from the standard chain (AWS_REGION,
/// AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, profiles, instance roles).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AwsConfig {
    pub region: Option<String>,
    pub endpoint_url: Option<String>,
    pub connect_timeout_ms: u64,
    /// One attempt = one request: the SDK's retries are off; past this the outcome is
    /// `unknown` (the request may have been received).
    pub attempt_timeout_ms: u64,
    /// Static credentials, for the local stack only; production uses the standard chain.
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
}

impl AwsConfig {
    pub(super) fn validate(&self) -> anyhow::Result<()> {
        range("aws.connect_timeout_ms", self.connect_timeout_ms, 10, 600_000)?;
        range("aws.attempt_timeout_ms", self.attempt_timeout_ms, 10, 600_000)?;
        Ok(())
    }

    /// The AWS clients' settings (SES, SNS, SQS).
    pub fn settings(&self) -> herald_channels::AwsSettings {
        herald_channels::AwsSettings {
            region: self.region.clone(),
            endpoint_url: self.endpoint_url.clone(),
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
            attempt_timeout: Duration::from_millis(self.attempt_timeout_ms),
            static_credentials: match (&self.access_key_id, &self.secret_access_key) {
                (Some(id), Some(secret)) => Some(herald_channels::StaticCredentials {
                    access_key_id: id.clone(),
                    secret_access_key: secret.clone(),
                }),
                _ => None,
            },
        }
    }
}
