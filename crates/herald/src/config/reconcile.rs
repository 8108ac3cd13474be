//! `[reconcile]`: where the reconcile role reads the providers' evidence (SES events through
//! SQS, SNS's SMS delivery status in CloudWatch Logs), and how long an `unknown` waits for it.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use herald_channels::reconcile::sns::{SignatureCheck, TrustSettings};
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
    /// The SNS topics whose envelopes are evidence (the configuration set's event
    /// destination): an envelope from any other topic is refused. Required with queue_url.
    pub sns_topic_arns: Vec<String>,
    /// `verify`: each envelope's signature is checked against SNS's certificate.
    /// `unchecked`: not (a local stand-in SNS that signs nothing verifiable).
    pub sns_signatures: SignatureCheck,
    /// The queue is fed by SNS raw message delivery: bare SES records, which carry no
    /// signature, are accepted; the queue's policy must then admit only the topic.
    pub raw_delivery: bool,
    /// Fetch SNS signing certificates from this HTTPS base instead of the certificate
    /// URL's host (the URL is still checked, its path kept).
    pub sns_certificate_endpoint: Option<String>,
    /// Trusted roots (PEM) for that fetch; else the system's.
    pub sns_certificate_ca_file: Option<PathBuf>,
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
        if self.queue_url.is_some() && self.sns_topic_arns.is_empty() && !self.raw_delivery {
            bail!(
                "reconcile.sns_topic_arns is empty: name the SNS topic the configuration set publishes to \
                 (only its signed envelopes are evidence), or set reconcile.raw_delivery if the queue \
                 receives bare records through SNS raw message delivery"
            );
        }
        for arn in &self.sns_topic_arns {
            let parts: Vec<&str> = arn.split(':').collect();
            if parts.len() != 6
                || parts[0] != "arn"
                || parts[2] != "sns"
                || parts[3].is_empty()
                || parts[5].is_empty()
            {
                bail!("reconcile.sns_topic_arns: {arn:?} is not an SNS topic ARN (arn:aws:sns:<region>:<account>:<name>)");
            }
        }
        if let Some(endpoint) = &self.sns_certificate_endpoint {
            if !endpoint.starts_with("https://") {
                bail!("reconcile.sns_certificate_endpoint {endpoint:?}: certificates are fetched over HTTPS only");
            }
        }
        if let Some(ca) = &self.sns_certificate_ca_file {
            if !ca.is_file() {
                bail!("reconcile.sns_certificate_ca_file {}: no such file", ca.display());
            }
        }
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

impl ReconcileConfig {
    /// How the role authenticates what arrives on the queue.
    pub fn trust_settings(&self) -> TrustSettings {
        TrustSettings {
            topic_arns: self.sns_topic_arns.clone(),
            signatures: self.sns_signatures,
            raw_delivery: self.raw_delivery,
            certificate_endpoint: self.sns_certificate_endpoint.clone(),
            certificate_ca_file: self.sns_certificate_ca_file.clone(),
            fetch_timeout: Duration::from_secs(10),
        }
    }
}
