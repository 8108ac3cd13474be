//! `[channels.email]` and `[channels.sms]`: senders, and each channel's retries and send rate.

use std::collections::BTreeMap;

use anyhow::bail;
use herald_core::consent::is_plausible_email;
use herald_core::lease::LeaseBudget;
use herald_core::retry::UnknownPolicy;
use herald_core::Channel;
use serde::{Deserialize, Serialize};

use super::range;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelsConfig {
    pub email: EmailChannelConfig,
    pub sms: SmsChannelConfig,
}

/// Retry behaviour shared by both channels.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryConfig {
    /// Attempts in all, the first included; then a retryable failure is `failed`.
    pub max_attempts: u32,
    pub base_backoff_ms: u64,
    pub max_backoff_ms: u64,
    /// "hold" (state unknown until `herald intent resolve`) or "retry".
    pub on_unknown: UnknownPolicy,
    /// Sends per second through this channel (SES MaxSendRate, SNS SMS TPS).
    pub rate_per_second: u32,
}

/// serde documents `deny_unknown_fields` beside `flatten` as unsupported, yet it is what
/// refuses an unknown key here (without it one is silently ignored, even though the
/// flattened [`RetryConfig`] denies unknown fields): `make test` tries one in every table.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmailChannelConfig {
    /// Default From address (a verified SES identity).
    pub sender: String,
    /// marketplace_id -> From address.
    pub sender_overrides: BTreeMap<String, String>,
    pub configuration_set: Option<String>,
    #[serde(flatten)]
    pub retry: RetryConfig,
}

/// serde documents `deny_unknown_fields` beside `flatten` as unsupported, yet it is what
/// refuses an unknown key here (without it one is silently ignored, even though the
/// flattened [`RetryConfig`] denies unknown fields): `make test` tries one in every table.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SmsChannelConfig {
    pub sender_id: Option<String>,
    #[serde(flatten)]
    pub retry: RetryConfig,
}

impl ChannelsConfig {
    /// Each channel's keys, and that `lease` (`delivery.lease_secs`, the AWS attempt
    /// timeout, `delivery.lease_margin_ms`) covers at least one send at its rate.
    pub(super) fn validate(&self, lease: &LeaseBudget) -> anyhow::Result<()> {
        if !is_plausible_email(&self.email.sender) {
            bail!(
                "channels.email.sender = {:?} is not an e-mail address",
                self.email.sender
            );
        }
        for (m, a) in &self.email.sender_overrides {
            if !is_plausible_email(a) {
                bail!("channels.email.sender_overrides.{m} = {a:?} is not an e-mail address");
            }
        }
        for (name, r) in [
            ("channels.email", &self.email.retry),
            ("channels.sms", &self.sms.retry),
        ] {
            range(&format!("{name}.max_attempts"), r.max_attempts.into(), 1, 100)?;
            range(
                &format!("{name}.base_backoff_ms"),
                r.base_backoff_ms,
                1,
                86_400_000,
            )?;
            range(
                &format!("{name}.max_backoff_ms"),
                r.max_backoff_ms,
                r.base_backoff_ms,
                86_400_000,
            )?;
            range(
                &format!("{name}.rate_per_second"),
                r.rate_per_second.into(),
                1,
                100_000,
            )?;
            // Not even one attempt of this channel could wait for its rate, a send slot
            // and its send inside the lease: every attempt would end `not_sent`.
            if lease.claim_window(r.rate_per_second) == 0 {
                bail!(
                    "delivery.lease_secs = {} cannot cover a send of {name} at rate_per_second = {}: a lease \
                     must hold one rate interval ({:.0} ms) + 2 x aws.attempt_timeout_ms ({} ms: one waiting \
                     for a send slot, one sending) + delivery.lease_margin_ms ({} ms); raise lease_secs or \
                     lower the timeouts",
                    lease.lease.as_secs(),
                    r.rate_per_second,
                    1000.0 / f64::from(r.rate_per_second),
                    lease.attempt_timeout.as_millis(),
                    lease.margin.as_millis()
                );
            }
        }
        Ok(())
    }

    /// A channel's retry and rate settings.
    pub fn retry(&self, channel: Channel) -> &RetryConfig {
        match channel {
            Channel::Email => &self.email.retry,
            Channel::Sms => &self.sms.retry,
        }
    }
}
