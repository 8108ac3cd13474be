//! Delivery counters, logged; exported as metrics by the observability issue.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::info;

#[derive(Default)]
pub struct DeliveryStats {
    claimed: AtomicU64,
    recorded: AtomicU64,
    skipped: Mutex<BTreeMap<&'static str, u64>>,
    outcomes: Mutex<BTreeMap<&'static str, u64>>,
}

impl DeliveryStats {
    pub fn claimed(&self) {
        self.claimed.fetch_add(1, Relaxed);
    }

    pub fn skipped(&self, reason: &'static str) {
        *self
            .skipped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(reason)
            .or_default() += 1;
    }

    pub fn recorded(&self, outcome: &'static str) {
        self.recorded.fetch_add(1, Relaxed);
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
