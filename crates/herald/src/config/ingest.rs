//! `[ingest]`: the ingest role's consumer group, poll batches and their bounds, and the
//! hold of orders whose seller has no profile yet.

use anyhow::bail;
use serde::{Deserialize, Serialize};

use super::range;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IngestConfig {
    pub group_id: String,
    /// Most messages per poll batch (one PostgreSQL transaction).
    pub batch_max_messages: usize,
    /// How long a batch waits for more messages after its first.
    pub batch_linger_ms: u64,
    /// Most bytes (keys, values and headers) per poll batch; a larger message comes alone.
    pub batch_max_bytes: usize,
    /// librdkafka's queue of fetched messages not yet in a batch, in KiB
    /// (`queued.max.messages.kbytes` of the ingest consumer; it may overshoot by one fetch).
    pub prefetch_max_kbytes: u32,
    /// Larger messages are dead-lettered as `too_large`.
    pub max_message_bytes: usize,
    /// Longest wait between retries of a batch whose database work failed.
    pub retry_backoff_max_ms: u64,
    /// How long an order whose seller has no profile yet is held (`awaiting_profile`)
    /// before its intents are `suppressed` / `no_seller_profile`. 0: suppressed at once.
    pub profile_wait_secs: u64,
}

impl IngestConfig {
    pub(super) fn validate(&self) -> anyhow::Result<()> {
        if self.group_id.trim().is_empty() {
            bail!("ingest.group_id is empty");
        }
        range(
            "ingest.batch_max_messages",
            self.batch_max_messages as u64,
            1,
            100_000,
        )?;
        range("ingest.batch_linger_ms", self.batch_linger_ms, 0, 60_000)?;
        range("ingest.batch_max_bytes", self.batch_max_bytes as u64, 1, 1 << 30)?;
        // librdkafka's own range for `queued.max.messages.kbytes` is 1..=2097151.
        range(
            "ingest.prefetch_max_kbytes",
            self.prefetch_max_kbytes.into(),
            64,
            2_097_151,
        )?;
        range(
            "ingest.max_message_bytes",
            self.max_message_bytes as u64,
            256,
            64 << 20,
        )?;
        range(
            "ingest.retry_backoff_max_ms",
            self.retry_backoff_max_ms,
            10,
            600_000,
        )?;
        range("ingest.profile_wait_secs", self.profile_wait_secs, 0, 7 * 86_400)?;
        Ok(())
    }

    /// The hold of an order whose seller has no profile, if orders are held.
    pub fn profile_wait(&self) -> Option<std::time::Duration> {
        (self.profile_wait_secs > 0).then(|| std::time::Duration::from_secs(self.profile_wait_secs))
    }
}
