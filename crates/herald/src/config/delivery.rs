//! `[delivery]`: the delivery role's consumer group, its window of attempts in flight,
//! claim and record batches, leases and their sweep.

use anyhow::bail;
use serde::{Deserialize, Serialize};

use super::range;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveryConfig {
    /// Consumer group on herald.deliveries.
    pub group_id: String,
    /// Provider requests in flight at once in this process. Around them, up to as many
    /// again attempts are being claimed or recorded, so that database round trips overlap
    /// the sends instead of holding a slot.
    pub max_in_flight: usize,
    /// Messages received and not yet completed per partition before it is paused alone,
    /// so that one slow partition cannot hold the whole window. 0 (the default): no limit
    /// of its own, only the process's window (8 x max_in_flight, at least 1,024). Pausing
    /// makes librdkafka drop and re-fetch what it prefetched: keep it above the window's
    /// share of a partition, or it becomes routine and starves the workers.
    pub max_outstanding_per_partition: usize,
    /// Most claims (or records) grouped into one transaction.
    pub db_batch_max: usize,
    /// How long a claim or record batch waits for company after its first attempt. 2 ms
    /// (the default) lets the answers of one claim's sends, which come back together, share
    /// a commit; 0 waits not at all, and batches form only from what queued during the
    /// transactions in progress. A record's wait is spent inside `lease_margin_ms`, so at most
    /// half of it is accepted.
    pub db_batch_linger_ms: u64,
    /// A claimed intent's lease. A claimed attempt may wait for its channel's rate, then
    /// for a send slot (at most one attempt timeout), then send (one attempt timeout),
    /// with `lease_margin_ms` to spare; each channel claims no more than its rate sends in
    /// what is left (`herald_core::lease`). An attempt whose turn comes too late is
    /// recorded `not_sent`, never sent on an expiring lease.
    pub lease_secs: u64,
    /// Kept free at the end of every lease: the claim's round trip, scheduling, the record.
    pub lease_margin_ms: u64,
    /// How often expired leases (dead workers) are looked for.
    pub sweep_interval_ms: u64,
    /// On revoke and on SIGTERM: the longest wait for in-flight attempts to be recorded.
    pub drain_timeout_ms: u64,
}

impl DeliveryConfig {
    /// Its own keys; whether a lease covers a send of each channel is checked with the
    /// configuration ([`super::Config::validate`]).
    pub(super) fn validate(&self) -> anyhow::Result<()> {
        if self.group_id.trim().is_empty() {
            bail!("delivery.group_id is empty");
        }
        range("delivery.max_in_flight", self.max_in_flight as u64, 1, 100_000)?;
        range(
            "delivery.max_outstanding_per_partition",
            self.max_outstanding_per_partition as u64,
            0,
            1_000_000,
        )?;
        range("delivery.db_batch_max", self.db_batch_max as u64, 1, 10_000)?;
        range("delivery.db_batch_linger_ms", self.db_batch_linger_ms, 0, 10_000)?;
        range(
            "delivery.sweep_interval_ms",
            self.sweep_interval_ms,
            100,
            3_600_000,
        )?;
        range("delivery.drain_timeout_ms", self.drain_timeout_ms, 0, 600_000)?;
        range("delivery.lease_secs", self.lease_secs, 1, 86_400)?;
        range("delivery.lease_margin_ms", self.lease_margin_ms, 100, 600_000)?;
        // A finished attempt's record waits up to the linger before its transaction starts,
        // all of it inside the margin. A record that lands after the lease may find the
        // attempt already swept to `unknown` (its outcome is then kept beside it, late; with
        // `on_unknown = retry` a second send may follow). Half the margin is left for the
        // transaction and scheduling; a wait for a free record slot and the record's retries
        // also use it, and no setting bounds those.
        if self.db_batch_linger_ms * 2 > self.lease_margin_ms {
            bail!(
                "delivery.db_batch_linger_ms = {} is more than half of delivery.lease_margin_ms ({} ms): a record \
                 waits up to the linger inside the margin, which must also hold its transaction, or the sweep may \
                 record the attempt unknown first; lower the linger or raise the margin",
                self.db_batch_linger_ms,
                self.lease_margin_ms
            );
        }
        Ok(())
    }
}
