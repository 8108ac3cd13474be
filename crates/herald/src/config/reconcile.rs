//! `[reconcile]`: where the reconcile role reads the providers' evidence (SES events through
//! SQS, SNS's SMS delivery status in CloudWatch Logs), and how long an `unknown` waits for it.

use anyhow::bail;
use serde::{Deserialize, Serialize};

use super::range;

/// The `reconcile` role: SES event records (configuration set -> SNS topic -> SQS queue)
/// settle `unknown` e-mail attempts and feed the suppression list (README, "Provider
/// evidence").
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReconcileConfig {
    /// The SQS queue subscribed to the configuration set's event topic. Unset: no evidence
    /// is read, and an `unknown` e-mail attempt follows `on_unknown` at once.
    pub queue_url: Option<String>,
    /// How long an `unknown` e-mail attempt waits for an event before the channel's
    /// `on_unknown` policy decides (and records that no evidence came). SES publishes
    /// `Send` within seconds; a `Delivery` may take minutes.
    pub silence_secs: u64,
    /// SQS long polling: how long one receive waits for messages (at most 20).
    pub wait_secs: u64,
    /// Messages per receive (at most 10).
    pub batch: u64,
    /// How long a received message stays invisible to other readers; it must cover one
    /// batch's commit. A crash before the delete: the message comes back after it.
    pub visibility_timeout_secs: u64,
    /// CloudWatch Logs groups of SNS's SMS delivery status (`sns/<region>/<account>/
    /// DirectPublishToPhoneNumber` and its `/Failure`). Empty: SMS status is not read.
    pub sms_status_log_groups: Vec<String>,
    /// Seconds between reads of those groups.
    pub sms_status_poll_secs: u64,
    /// Each read starts this long before the newest record stored (records reach
    /// CloudWatch Logs late; those read twice converge).
    pub sms_status_overlap_secs: u64,
    /// The first read of a group starts this long ago.
    pub sms_status_lookback_secs: u64,
}

impl ReconcileConfig {
    pub(super) fn validate(&self) -> anyhow::Result<()> {
        if self.queue_url.as_deref().is_some_and(|u| u.trim().is_empty()) {
            bail!("reconcile.queue_url is empty: remove it, or name the SQS queue");
        }
        range("reconcile.silence_secs", self.silence_secs, 1, 7 * 86_400)?;
        if self.sms_status_log_groups.iter().any(|g| g.trim().is_empty()) {
            bail!("reconcile.sms_status_log_groups has an empty name");
        }
        range(
            "reconcile.sms_status_poll_secs",
            self.sms_status_poll_secs,
            1,
            86_400,
        )?;
        range(
            "reconcile.sms_status_overlap_secs",
            self.sms_status_overlap_secs,
            0,
            7 * 86_400,
        )?;
        range(
            "reconcile.sms_status_lookback_secs",
            self.sms_status_lookback_secs,
            0,
            30 * 86_400,
        )?;
        range("reconcile.wait_secs", self.wait_secs, 0, 20)?;
        range("reconcile.batch", self.batch, 1, 10)?;
        range(
            "reconcile.visibility_timeout_secs",
            self.visibility_timeout_secs,
            5,
            43_200,
        )?;
        Ok(())
    }
}
