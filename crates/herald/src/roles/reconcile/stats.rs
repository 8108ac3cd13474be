//! Reconcile's counting, in one place: each counted event is one method here, which adds
//! it to the exported metrics (`herald_telemetry::Metrics`). The line the role logs when it
//! stops reads its totals back from those metrics ([`ReconcileStats::totals`]): the
//! process's counts, so an `unknown` settled by evidence in the deliver role's silence
//! sweep of the same process is in `settled` too. Nothing outside this module counts for
//! reconcile but `retrying` (a call run again), which no log total reads.

use std::sync::Arc;

use herald_core::consent::SuppressionReason;
use tracing::info;

use crate::obs::Obs;

pub struct ReconcileStats<'a> {
    metrics: &'a Arc<herald_telemetry::Metrics>,
}

/// The role's counting, on the process's metrics.
pub fn of(obs: &Obs) -> ReconcileStats<'_> {
    ReconcileStats {
        metrics: &obs.metrics,
    }
}

/// What the log's `reconcile totals` line reports, read from the metrics.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ReconcileTotals {
    /// Provider events stored, matched to an attempt or not, SES events and SMS status
    /// records: `herald_provider_events_total`.
    pub events: u64,
    /// Provider events seen before (no effect).
    pub duplicates: u64,
    /// `unknown` intents the provider's events settled: `herald_unknown_settled_total{by="evidence"}`.
    pub settled: u64,
    /// Destinations the events put on the suppression list: `herald_suppressions_added_total`.
    pub suppressed: u64,
    /// Input that was not a provider event, kept with its reason (one read again counts
    /// again): `herald_provider_messages_total{result="rejected"}`.
    pub rejected: u64,
}

impl ReconcileStats<'_> {
    /// Every series the role counts, at 0, for the SES event types and the SMS ones.
    pub fn init(&self, event_types: &[&'static str]) {
        self.metrics.init_reconcile(event_types);
    }

    /// A queue message or log record read, with its `result` (`event`, `ignored`, `rejected`).
    pub fn message(&self, result: &'static str) {
        self.metrics.provider_message(result);
    }

    /// A provider event of `event_type` stored (`matched`, `unmatched`) or seen before
    /// (`duplicate`).
    pub fn event(&self, event_type: &'static str, outcome: &'static str) {
        self.metrics.provider_event(event_type, outcome);
    }

    /// An `unknown` intent on `channel` settled by the provider's event, as `verdict`.
    pub fn settled_by_evidence(&self, channel: &str, verdict: &'static str) {
        self.metrics.unknown_settled(channel, "evidence", verdict);
    }

    /// `n` destinations put on the suppression list for `reason`.
    pub fn suppressions_added(&self, reason: SuppressionReason, n: u64) {
        self.metrics.suppressions_added(reason.as_str(), n);
    }

    /// `n` addresses a bounce or complaint named that were not suppressed: the event
    /// matched no attempt, or they were not the attempt's destination.
    pub fn suppressions_refused(&self, reason: SuppressionReason, n: u64) {
        self.metrics.suppressions_refused(reason.as_str(), n);
    }

    /// The totals the log reports, as the metrics count them now.
    pub fn totals(&self) -> ReconcileTotals {
        let r = self.metrics.read();
        let events = r.by("herald_provider_events_total", "outcome");
        let events_where = |o: &str| events.get(o).copied().unwrap_or(0);
        ReconcileTotals {
            events: events_where("matched") + events_where("unmatched"),
            duplicates: events_where("duplicate"),
            settled: r.total("herald_unknown_settled_total", Some(("by", "evidence"))),
            suppressed: r.total("herald_suppressions_added_total", None),
            rejected: r.total("herald_provider_messages_total", Some(("result", "rejected"))),
        }
    }

    pub fn log_totals(&self) {
        let t = self.totals();
        info!(
            events = t.events,
            duplicates = t.duplicates,
            settled = t.settled,
            suppressed = t.suppressed,
            rejected = t.rejected,
            "reconcile totals"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every event counted once, and the totals the log reports read back from the metrics.
    /// A total read under a name the metrics do not export stays 0 and fails this.
    #[test]
    fn the_log_totals_are_the_metrics() {
        let metrics = Arc::new(herald_telemetry::Metrics::unexported());
        let stats = ReconcileStats { metrics: &metrics };
        stats.init(&["Bounce", "Delivery"]);
        // Series the totals must leave out: an unknown settled by silence.
        metrics.unknown_settled("email", "silence", "hold");
        stats.message("event");
        stats.message("rejected");
        stats.message("ignored");
        stats.event("Bounce", "matched");
        stats.event("Delivery", "unmatched");
        stats.event("Delivery", "duplicate");
        stats.settled_by_evidence("email", "rejected");
        stats.suppressions_added(SuppressionReason::Bounced, 2);
        assert_eq!(
            stats.totals(),
            ReconcileTotals {
                events: 2,
                duplicates: 1,
                settled: 1,
                suppressed: 2,
                rejected: 1,
            }
        );
    }
}
