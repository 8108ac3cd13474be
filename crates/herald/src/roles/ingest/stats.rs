//! Ingest counters: totals kept for the periodic and final log lines; the same events go
//! to the exported metrics through `metrics`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use tracing::info;

pub struct IngestStats {
    pub metrics: Arc<herald_telemetry::Metrics>,
    pub messages: AtomicU64,
    pub batches: AtomicU64,
    pub intents_created: AtomicU64,
    pub intents_suppressed: AtomicU64,
    pub duplicates: AtomicU64,
    pub conflicts: AtomicU64,
    pub no_route: AtomicU64,
    pub dead_letters: AtomicU64,
    pub seller_updates: AtomicU64,
}

impl IngestStats {
    pub fn new(metrics: Arc<herald_telemetry::Metrics>) -> Self {
        Self {
            metrics,
            messages: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            intents_created: AtomicU64::new(0),
            intents_suppressed: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            conflicts: AtomicU64::new(0),
            no_route: AtomicU64::new(0),
            dead_letters: AtomicU64::new(0),
            seller_updates: AtomicU64::new(0),
        }
    }

    pub fn log_totals(&self) {
        info!(
            messages = self.messages.load(Relaxed),
            batches = self.batches.load(Relaxed),
            intents_created = self.intents_created.load(Relaxed),
            intents_suppressed = self.intents_suppressed.load(Relaxed),
            duplicates = self.duplicates.load(Relaxed),
            conflicts = self.conflicts.load(Relaxed),
            no_route = self.no_route.load(Relaxed),
            dead_letters = self.dead_letters.load(Relaxed),
            seller_updates = self.seller_updates.load(Relaxed),
            "ingest totals"
        );
    }
}

/// Logs the message rate of the last interval, when there was any traffic.
pub async fn report_every(stats: Arc<IngestStats>, every: Duration) {
    crate::progress::report_rate(every, "ingest messages", move || stats.messages.load(Relaxed)).await
}
