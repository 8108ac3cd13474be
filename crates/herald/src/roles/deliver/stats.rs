//! Delivery's counting, in one place: each counted event is one method here, which adds it
//! to the exported metrics (`herald_telemetry::Metrics`). The periodic and the final log
//! lines read their totals back from those metrics ([`DeliveryStats::totals`]): one count,
//! which the log and the scrape both show. Nothing outside this module counts for delivery
//! but `retrying` (a batch run again), which no log total reads.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tracing::info;

pub struct DeliveryStats {
    metrics: Arc<herald_telemetry::Metrics>,
}

/// What the log's `delivery totals` line reports, read from the metrics.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DeliveryTotals {
    /// Attempts claimed: `herald_attempts_started_total`.
    pub claimed: u64,
    /// Attempt records, whatever they could do: `herald_attempt_records_total`.
    pub recorded: u64,
    /// Delivery messages that started no attempt, by reason: `herald_claims_skipped_total`.
    pub skipped: BTreeMap<String, u64>,
    /// Attempts finished, by outcome (`not_sent` included): `herald_attempts_total`.
    pub outcomes: BTreeMap<String, u64>,
}

impl DeliveryStats {
    pub fn new(metrics: Arc<herald_telemetry::Metrics>) -> Self {
        Self { metrics }
    }

    pub fn claimed(&self, channel: &str) {
        self.metrics.attempt_started(channel);
        self.metrics.gauges().add_in_flight(1);
    }

    pub fn skipped(&self, reason: &'static str) {
        self.metrics.claim_skipped(reason);
    }

    /// A claim or record batch (`stage`) of `size` took `took`, its retries included.
    pub fn batch(&self, stage: &'static str, size: usize, took: Duration) {
        self.metrics.delivery_batch(stage, size, took);
    }

    /// An `unknown` intent decided `how` (`evidence`, `silence`) as `decided`.
    pub fn unknown_settled(&self, channel: &str, how: &'static str, decided: &'static str) {
        self.metrics.unknown_settled(channel, how, decided);
    }

    /// A provider call ended with `outcome` after `took`.
    pub fn sent(&self, channel: &str, outcome: &str, took: Duration) {
        self.metrics.attempt_finished(channel, outcome, took);
    }

    /// A claimed attempt ended without a provider call (`reason`).
    pub fn not_sent(&self, channel: &str, reason: &'static str) {
        self.metrics.attempt_not_sent(channel, reason);
    }

    /// An attempt was recorded; `result`: what the record did (on time, late, already
    /// recorded, ...).
    pub fn recorded(&self, result: &'static str) {
        self.metrics.attempt_recorded(result);
        self.metrics.gauges().add_in_flight(-1);
    }

    /// Attempt records so far (the progress line's count).
    fn records(&self) -> u64 {
        self.metrics.read().total("herald_attempt_records_total", None)
    }

    /// The totals the log reports, as the metrics count them now.
    pub fn totals(&self) -> DeliveryTotals {
        let r = self.metrics.read();
        DeliveryTotals {
            claimed: r.total("herald_attempts_started_total", None),
            recorded: r.total("herald_attempt_records_total", None),
            skipped: r.by("herald_claims_skipped_total", "reason"),
            outcomes: r.by("herald_attempts_total", "outcome"),
        }
    }

    pub fn log_totals(&self) {
        let t = self.totals();
        info!(
            claimed = t.claimed,
            recorded = t.recorded,
            skipped = ?t.skipped,
            outcomes = ?t.outcomes,
            "delivery totals"
        );
    }
}

/// Logs the rate of attempts recorded in the last interval, when there were any.
pub async fn report_every(stats: Arc<DeliveryStats>, every: Duration) {
    crate::progress::report_rate(every, "delivery attempts", move || stats.records()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every event counted once, and the totals the log reports read back from the metrics.
    /// A total read under a name the metrics do not export stays 0 and fails this.
    #[test]
    fn the_log_totals_are_the_metrics() {
        let stats = DeliveryStats::new(Arc::new(herald_telemetry::Metrics::unexported()));
        stats.claimed("email");
        stats.claimed("sms");
        stats.skipped("leased");
        stats.sent("email", "accepted", Duration::from_millis(50));
        stats.not_sent("sms", "shutdown");
        stats.recorded("on_time");
        stats.recorded("fenced");
        let owned = |pairs: &[(&str, u64)]| pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
        assert_eq!(
            stats.totals(),
            DeliveryTotals {
                claimed: 2,
                recorded: 2,
                skipped: owned(&[("leased", 1)]),
                outcomes: owned(&[("accepted", 1), ("not_sent", 1)]),
            }
        );
    }
}
