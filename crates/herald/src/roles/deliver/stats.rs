//! Delivery counters: totals for the periodic and final log lines; skips also go to the
//! exported metrics (attempts are counted where they start and finish, with their channel).

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

    pub fn recorded(&self, outcome: &'static str) {
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
