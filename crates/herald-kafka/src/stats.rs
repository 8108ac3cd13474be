//! Consumer lag per partition from librdkafka's statistics callback
//! (`statistics.interval.ms`), kept for the metrics sampler to read.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use rdkafka::Statistics;

/// How often librdkafka emits statistics for Herald's consumers.
pub const STATISTICS_INTERVAL_MS: &str = "5000";

/// The latest consumer lag of each partition this client fetches, by (topic, partition).
#[derive(Clone, Default)]
pub struct LagStats(Arc<Mutex<BTreeMap<(String, i32), i64>>>);

impl LagStats {
    /// Replaces the figures with those of one statistics report. Partition -1 (librdkafka's
    /// internal unassigned partition) and lag -1 (not known yet) are skipped.
    pub fn record(&self, stats: &Statistics) {
        let mut lags = BTreeMap::new();
        for (topic, t) in &stats.topics {
            for p in t.partitions.values() {
                if p.partition >= 0 && p.consumer_lag >= 0 {
                    lags.insert((topic.clone(), p.partition), p.consumer_lag);
                }
            }
        }
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = lags;
    }

    pub fn snapshot(&self) -> BTreeMap<(String, i32), i64> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
