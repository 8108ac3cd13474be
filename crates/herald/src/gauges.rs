//! Samplers behind the gauges: per-partition figures from the Kafka consumers (lag from
//! librdkafka statistics; outstanding offsets and head-of-line age from delivery's
//! tracker, head-of-line age from ingest's unfinished batches) and the outbox and `unknown` figures from PostgreSQL.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use herald_kafka::deliver::DeliveryHandle;
use herald_kafka::LagStats;
use herald_store::Store;
use herald_telemetry::{Metrics, PartitionKey, PartitionSample};

use crate::roles::ingest::HeadOfLine;

/// How often the per-partition gauges are refreshed (librdkafka reports every 5 s).
const PARTITION_EVERY: Duration = Duration::from_secs(2);
/// How often the database is asked for the outbox backlog and `unknown` count.
const DATABASE_EVERY: Duration = Duration::from_secs(10);

/// Where a role's unfinished work per partition is known.
pub enum Pending {
    /// Delivery's out-of-order window: outstanding offsets and their head-of-line age.
    Delivery(DeliveryHandle),
    /// Ingest's unfinished batches: head-of-line age only.
    Ingest(HeadOfLine),
}

/// Refreshes the per-partition gauges of `group` until dropped (the role aborts it and
/// clears the group's gauges when it stops).
pub async fn watch_partitions(metrics: Arc<Metrics>, group: String, lag: LagStats, pending: Pending) {
    {
        let gauges = metrics.gauges();
        loop {
            let mut samples: BTreeMap<PartitionKey, PartitionSample> = BTreeMap::new();
            for ((topic, partition), l) in lag.snapshot() {
                let key = PartitionKey {
                    group: group.clone(),
                    topic,
                    partition,
                };
                samples.entry(key).or_default().lag = Some(l);
            }
            match &pending {
                Pending::Delivery(h) => {
                    for p in h.partitions() {
                        let key = PartitionKey {
                            group: group.clone(),
                            topic: h.topic().to_owned(),
                            partition: p.partition,
                        };
                        let s = samples.entry(key).or_default();
                        s.outstanding = Some(p.outstanding as i64);
                        s.head_of_line_age = Some(p.head_age.unwrap_or_default());
                    }
                }
                Pending::Ingest(head) => {
                    let ages = head.ages();
                    // Assigned partitions (those librdkafka reports lag for) without
                    // unfinished work are at 0, so a stall shows as a rising line.
                    for (key, s) in samples.iter_mut() {
                        s.head_of_line_age = Some(Duration::ZERO);
                        if let Some(age) = ages.get(&(key.topic.clone(), key.partition)) {
                            s.head_of_line_age = Some(*age);
                        }
                    }
                    for ((topic, partition), age) in ages {
                        let key = PartitionKey {
                            group: group.clone(),
                            topic,
                            partition,
                        };
                        samples.entry(key).or_default().head_of_line_age = Some(age);
                    }
                }
            }
            gauges.set_partitions(&group, samples);
            tokio::time::sleep(PARTITION_EVERY).await;
        }
    }
}

/// Samples the outbox backlog, the intents in `unknown` and the rows of the attempts'
/// default partition until dropped. A failed
/// sample keeps the last values (readiness reports the database itself).
pub async fn watch_database(metrics: Arc<Metrics>, store: Store) {
    {
        loop {
            match store.backlog_sample().await {
                Ok(s) => {
                    let gauges = metrics.gauges();
                    gauges.set_database(s.outbox_due, s.outbox_oldest_age, s.intents_unknown);
                    gauges.set_holds(s.holds.open, s.holds.oldest_age);
                    gauges.set_evidence(
                        s.intents_awaiting_evidence,
                        s.suppressions,
                        s.suppressions_unkeyed,
                    );
                }
                Err(e) => tracing::debug!(error = %e, "backlog sample failed"),
            }
            match store.evidence_table_rows().await {
                Ok(rows) => metrics.gauges().set_evidence_rows(&rows),
                Err(e) => tracing::debug!(error = %e, "evidence table sample failed"),
            }
            match store
                .default_partition_rows(crate::retention::DEFAULT_ROWS_CAP)
                .await
            {
                Ok(n) => metrics.gauges().set_attempts_default_rows(n),
                Err(e) => tracing::debug!(error = %e, "default partition sample failed"),
            }
            tokio::time::sleep(DATABASE_EVERY).await;
        }
    }
}
