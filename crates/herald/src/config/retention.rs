//! `[retention]`: the clocks and their pass.

use serde::{Deserialize, Serialize};

use super::range;

/// Retention's three clocks (DESIGN.md, "Retention"). Defaults and their reasons are in
/// `config/herald.example.toml`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionConfig {
    /// Whole monthly partitions of `notification_attempts` whose upper bound is older than
    /// this many months are dropped (older rows of the default partition deleted).
    pub attempt_months: u32,
    /// Rendered subject, bodies and destination of payloads created longer ago are purged
    /// (never while a non-terminal intent references the payload). 0: as soon as every
    /// intent referencing the payload is terminal.
    pub payload_body_days: u32,
    /// Terminal intents created and last updated longer ago are deleted with their rows.
    /// Unset: kept forever.
    pub intent_days: Option<u32>,
    /// The offending documents of fingerprint conflicts and reused Idempotency-Keys
    /// (personal data) detected longer ago are purged; the rows stay.
    pub conflict_document_days: u32,
    /// The bodies of queue messages the reconcile role refused (they may quote addresses)
    /// received longer ago are purged; the rows stay.
    pub reject_body_days: u32,
    /// The pass inside `herald run` (partition upkeep and the clocks); 0: none (run
    /// `herald retention run` from a scheduler instead).
    pub interval_secs: u64,
    /// Rows per statement (and transaction) of the clocks.
    pub batch_size: i64,
}

impl RetentionConfig {
    pub(super) fn validate(&self) -> anyhow::Result<()> {
        range("retention.attempt_months", self.attempt_months.into(), 1, 1200)?;
        range(
            "retention.payload_body_days",
            self.payload_body_days.into(),
            0,
            365_000,
        )?;
        range(
            "retention.conflict_document_days",
            self.conflict_document_days.into(),
            1,
            365_000,
        )?;
        range(
            "retention.reject_body_days",
            self.reject_body_days.into(),
            1,
            365_000,
        )?;
        if let Some(days) = self.intent_days {
            range("retention.intent_days", days.into(), 1, 365_000)?;
        }
        if self.interval_secs != 0 {
            range("retention.interval_secs", self.interval_secs, 60, 7 * 86_400)?;
        }
        range("retention.batch_size", self.batch_size as u64, 1, 10_000)?;
        Ok(())
    }
}
