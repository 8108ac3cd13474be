//! Ingest's counting, in one place: each counted event is one method here, which adds it
//! to the exported metrics (`herald_telemetry::Metrics`) and, for the events the log's
//! totals name, to the role's totals (the periodic and the final log lines read those).
//! Nothing outside this module counts for ingest.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use herald_core::IntentState;
use tracing::info;

pub struct IngestStats {
    metrics: Arc<herald_telemetry::Metrics>,
    messages: AtomicU64,
    batches: AtomicU64,
    intents_created: AtomicU64,
    intents_suppressed: AtomicU64,
    duplicates: AtomicU64,
    conflicts: AtomicU64,
    no_route: AtomicU64,
    dead_letters: AtomicU64,
    seller_updates: AtomicU64,
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

    /// A poll batch of `messages` was taken.
    pub fn batch_taken(&self, messages: usize) {
        self.messages.fetch_add(messages as u64, Relaxed);
        self.batches.fetch_add(1, Relaxed);
    }

    /// A batch's transaction committed: `events_without_route` order events had no route,
    /// `seller_updates` profile records were applied.
    pub fn batch_committed(
        &self,
        messages: usize,
        took: Duration,
        events_without_route: u64,
        seller_updates: u64,
    ) {
        self.metrics.ingest_batch(messages, took);
        self.no_route.fetch_add(events_without_route, Relaxed);
        self.metrics.events_ignored("no_route", events_without_route);
        self.seller_updates.fetch_add(seller_updates, Relaxed);
    }

    /// A new intent, in the state it was created in.
    pub fn intent_created(
        &self,
        kind: &str,
        channel: &str,
        revision: &str,
        state: IntentState,
        consent: &str,
    ) {
        self.intents_created.fetch_add(1, Relaxed);
        self.metrics.intent_created(kind, channel, revision);
        match state {
            IntentState::Suppressed => {
                self.intents_suppressed.fetch_add(1, Relaxed);
            }
            IntentState::AwaitingProfile => self.metrics.holds("held", 1),
            IntentState::Observed => self.metrics.intent_observed(channel, consent),
            _ => {}
        }
    }

    pub fn duplicate_converged(&self, kind: &str, channel: &str) {
        self.duplicates.fetch_add(1, Relaxed);
        self.metrics.duplicate_converged(kind, channel);
    }

    /// A business key reused with other content, recorded for the first time.
    pub fn conflict_recorded(&self, kind: &str, channel: &str) {
        self.conflicts.fetch_add(1, Relaxed);
        self.metrics.fingerprint_conflict(kind, channel);
    }

    /// Held intents decided (`what`: `released`, `release_failed`, `expired`).
    pub fn holds(&self, what: &'static str, n: usize) {
        self.metrics.holds(what, n as u64);
    }

    /// A held intent decided `observed` (its route was in `observe` mode when it was created).
    pub fn held_intent_observed(&self, channel: &str, consent: &str) {
        self.metrics.intent_observed(channel, consent);
    }

    /// A message alone failed permanently with an error of `class`: it is dead-lettered.
    pub fn message_isolated(&self, class: &'static str) {
        self.metrics.message_isolated(class);
    }

    /// Messages written to the dead-letter topic, with their reasons.
    pub fn dead_lettered(&self, reasons: impl ExactSizeIterator<Item = &'static str>) {
        self.dead_letters.fetch_add(reasons.len() as u64, Relaxed);
        for reason in reasons {
            self.metrics.dead_lettered("ingest", reason);
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
