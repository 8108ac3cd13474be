//! Delivery's counting, in one place: each counted event is one method here, which adds it
//! to the exported metrics (`herald_telemetry::Metrics`) and, for the events the log's
//! totals name, to the role's totals (the periodic and the final log lines read those).
//! Nothing outside this module counts for delivery.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::info;

pub struct DeliveryStats {
    metrics: Arc<herald_telemetry::Metrics>,
    claimed: AtomicU64,
    recorded: AtomicU64,
    skipped: Mutex<BTreeMap<&'static str, u64>>,
    outcomes: Mutex<BTreeMap<&'static str, u64>>,
}

impl DeliveryStats {
    pub fn new(metrics: Arc<herald_telemetry::Metrics>) -> Self {
        Self {
            metrics,
            claimed: AtomicU64::new(0),
            recorded: AtomicU64::new(0),
            skipped: Mutex::default(),
            outcomes: Mutex::default(),
        }
    }

    pub fn claimed(&self, channel: &str) {
        self.claimed.fetch_add(1, Relaxed);
        self.metrics.attempt_started(channel);
        self.metrics.gauges().add_in_flight(1);
    }

    pub fn skipped(&self, reason: &'static str) {
        self.metrics.claim_skipped(reason);
        *self
            .skipped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(reason)
            .or_default() += 1;
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

    /// An attempt's `outcome` was recorded; `result`: what the record did (on time, late,
    /// already recorded, ...).
    pub fn recorded(&self, outcome: &'static str, result: &'static str) {
        self.metrics.attempt_recorded(result);
        self.recorded.fetch_add(1, Relaxed);
        self.metrics.gauges().add_in_flight(-1);
        *self
            .outcomes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(outcome)
            .or_default() += 1;
    }

    pub fn log_totals(&self) {
        info!(
            claimed = self.claimed.load(Relaxed),
            recorded = self.recorded.load(Relaxed),
            skipped = ?self.skipped.lock().unwrap_or_else(|e| e.into_inner()),
            outcomes = ?self.outcomes.lock().unwrap_or_else(|e| e.into_inner()),
            "delivery totals"
        );
    }
}

pub async fn report_every(stats: Arc<DeliveryStats>, every: Duration) {
    crate::progress::report_rate(every, "delivery attempts", move || stats.recorded.load(Relaxed)).await
}
