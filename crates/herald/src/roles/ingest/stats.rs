//! Ingest's counting, in one place: each counted event is one method here, which adds it
//! to the exported metrics (`herald_telemetry::Metrics`). The periodic and the final log
//! lines read their totals back from those metrics ([`IngestStats::totals`]): one count,
//! which the log and the scrape both show. Nothing outside this module counts for ingest
//! but `retrying` (a batch run again), which no log total reads.

use std::sync::Arc;
use std::time::Duration;

use herald_core::IntentState;
use tracing::info;

pub struct IngestStats {
    metrics: Arc<herald_telemetry::Metrics>,
}

/// What the log's `ingest totals` line reports, read from the metrics.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct IngestTotals {
    /// Messages finished with (converged or dead-lettered): `herald_ingest_messages_total`.
    pub messages: u64,
    /// Ingest transactions committed: `herald_ingest_batch_size`'s count.
    pub batches: u64,
    pub intents_created: u64,
    pub intents_suppressed: u64,
    pub duplicates: u64,
    pub conflicts: u64,
    pub no_route: u64,
    pub dead_letters: u64,
    pub seller_updates: u64,
}

impl IngestStats {
    /// Ingest's counting; its counters are exported at 0 from here on.
    pub fn new(metrics: Arc<herald_telemetry::Metrics>) -> Self {
        metrics.init_ingest();
        Self { metrics }
    }

    /// Ingest finished with a poll batch of `messages`: each converged in the ledger or
    /// was dead-lettered.
    pub fn batch_done(&self, messages: usize) {
        self.metrics.ingest_messages(messages as u64);
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
        self.metrics.events_ignored("no_route", events_without_route);
        self.metrics.seller_updates(seller_updates);
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
        self.metrics.intent_created(kind, channel, revision);
        match state {
            IntentState::Suppressed => self.metrics.intent_suppressed(channel, consent),
            IntentState::AwaitingProfile => self.metrics.holds("held", 1),
            IntentState::Observed => self.metrics.intent_observed(channel, consent),
            _ => {}
        }
    }

    pub fn duplicate_converged(&self, kind: &str, channel: &str) {
        self.metrics.duplicate_converged(kind, channel);
    }

    /// A business key reused with other content, recorded for the first time.
    pub fn conflict_recorded(&self, kind: &str, channel: &str) {
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
    pub fn dead_lettered(&self, reasons: impl Iterator<Item = &'static str>) {
        for reason in reasons {
            self.metrics.dead_lettered("ingest", reason);
        }
    }

    /// The totals the log reports, as the metrics count them now.
    pub fn totals(&self) -> IngestTotals {
        let r = self.metrics.read();
        IngestTotals {
            messages: r.total("herald_ingest_messages_total", None),
            batches: r.observations("herald_ingest_batch_size"),
            intents_created: r.total("herald_intents_created_total", None),
            intents_suppressed: r.total("herald_intents_suppressed_total", None),
            duplicates: r.total("herald_duplicates_converged_total", None),
            conflicts: r.total("herald_fingerprint_conflicts_total", None),
            no_route: r.total("herald_events_ignored_total", Some(("reason", "no_route"))),
            dead_letters: r.total("herald_dead_letters_total", Some(("source", "ingest"))),
            seller_updates: r.total("herald_seller_updates_total", None),
        }
    }

    pub fn log_totals(&self) {
        let t = self.totals();
        info!(
            messages = t.messages,
            batches = t.batches,
            intents_created = t.intents_created,
            intents_suppressed = t.intents_suppressed,
            duplicates = t.duplicates,
            conflicts = t.conflicts,
            no_route = t.no_route,
            dead_letters = t.dead_letters,
            seller_updates = t.seller_updates,
            "ingest totals"
        );
    }
}

/// Logs the message rate of the last interval, when there was any traffic.
pub async fn report_every(stats: Arc<IngestStats>, every: Duration) {
    crate::progress::report_rate(every, "ingest messages", move || stats.totals().messages).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every event counted once, and the totals the log reports read back from the metrics.
    /// A total read under a name the metrics do not export stays 0 and fails this.
    #[test]
    fn the_log_totals_are_the_metrics() {
        let metrics = Arc::new(herald_telemetry::Metrics::unexported());
        let stats = IngestStats::new(metrics.clone());
        // Series the totals must leave out: another reason to ignore an event, another
        // source of dead letters.
        metrics.events_ignored("not_an_order", 5);
        metrics.dead_lettered("delivery", "malformed");
        stats.batch_committed(6, Duration::from_millis(3), 2, 1);
        stats.batch_committed(1, Duration::from_millis(3), 0, 0);
        for state in [
            IntentState::Pending,
            IntentState::Suppressed,
            IntentState::Observed,
        ] {
            stats.intent_created("order.created", "email", "3", state, "opted_out");
        }
        stats.duplicate_converged("order.created", "sms");
        stats.conflict_recorded("order.created", "sms");
        stats.dead_lettered(["malformed", "template_missing"].into_iter());
        stats.batch_done(9);
        assert_eq!(
            stats.totals(),
            IngestTotals {
                messages: 9,
                batches: 2,
                intents_created: 3,
                intents_suppressed: 1,
                duplicates: 1,
                conflicts: 1,
                no_route: 2,
                dead_letters: 2,
                seller_updates: 1,
            }
        );
    }
}
