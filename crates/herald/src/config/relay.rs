//! `[relay]`: outbox rounds, and the check for due intents without an outbox row.

use serde::{Deserialize, Serialize};

use super::range;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayConfig {
    /// Most outbox rows claimed and published per round.
    pub batch_size: i64,
    /// Fallback poll when no LISTEN notification arrives (also picks up rows that become
    /// due later, such as scheduled retries).
    pub poll_interval_ms: u64,
    /// Longest wait between failed rounds.
    pub retry_backoff_max_ms: u64,
    /// How long a round waits for its messages' acknowledgements before it commits what
    /// was acknowledged and goes on; the others stay on their way (see the relay role).
    pub ack_wait_ms: u64,
    /// Most messages on their way past a round at once; at this many, rounds wait for them
    /// instead of claiming more.
    pub max_unacknowledged: usize,
    /// How often intents that are due but have no outbox row (a lost delivery message, a
    /// database clock step) are looked for and re-queued.
    pub stranded_check_secs: u64,
    /// How long past due an intent without an outbox row may be before it counts as
    /// stranded. Keep it above the deliveries topic's usual lag: an intent whose message
    /// is only waiting would be queued twice (harmless, but counted).
    pub stranded_grace_secs: u64,
}

impl RelayConfig {
    pub(super) fn validate(&self) -> anyhow::Result<()> {
        range("relay.batch_size", self.batch_size as u64, 1, 10_000)?;
        range("relay.poll_interval_ms", self.poll_interval_ms, 10, 600_000)?;
        range(
            "relay.retry_backoff_max_ms",
            self.retry_backoff_max_ms,
            10,
            600_000,
        )?;
        range("relay.ack_wait_ms", self.ack_wait_ms, 10, 600_000)?;
        range(
            "relay.max_unacknowledged",
            self.max_unacknowledged as u64,
            1,
            1_000_000,
        )?;
        range("relay.stranded_check_secs", self.stranded_check_secs, 1, 86_400)?;
        range(
            "relay.stranded_grace_secs",
            self.stranded_grace_secs,
            1,
            7 * 86_400,
        )?;
        Ok(())
    }
}
