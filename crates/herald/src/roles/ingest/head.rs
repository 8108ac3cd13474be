//! How long each partition's oldest unfinished message has been in Herald's hands: from
//! the moment its batch began until the batch's offsets are stored. Exported as
//! `herald_partition_head_of_line_age_seconds` for the ingest group; it grows only while a
//! batch cannot finish (a stall), whatever the producers' clocks say.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use herald_kafka::{Message, OwnedMessage};

#[derive(Clone, Default)]
pub struct HeadOfLine(Arc<Mutex<BTreeMap<(String, i32), Instant>>>);

impl HeadOfLine {
    /// The batch's partitions have work in progress from now (or from earlier, if a batch
    /// of theirs is already unfinished).
    pub fn begin(&self, batch: &[OwnedMessage]) {
        let now = Instant::now();
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for (topic, partition) in partitions(batch) {
            map.entry((topic.to_owned(), partition)).or_insert(now);
        }
    }

    /// The batch's work is durable and its offsets stored.
    pub fn done(&self, batch: &[OwnedMessage]) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for (topic, partition) in partitions(batch) {
            map.remove(&(topic.to_owned(), partition));
        }
    }

    /// The age of each partition's unfinished work; partitions without any are absent.
    pub fn ages(&self) -> BTreeMap<(String, i32), Duration> {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.iter()
            .map(|(k, since)| (k.clone(), since.elapsed()))
            .collect()
    }
}

/// The batch's partitions, once each (a batch holds hundreds of messages of a few).
fn partitions(batch: &[OwnedMessage]) -> BTreeSet<(&str, i32)> {
    batch.iter().map(|m| (m.topic(), m.partition())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_kafka::Timestamp;

    fn m(partition: i32, offset: i64) -> OwnedMessage {
        OwnedMessage::new(
            None,
            None,
            "t".into(),
            Timestamp::NotAvailable,
            partition,
            offset,
            None,
        )
    }

    #[test]
    fn age_runs_from_the_first_unfinished_batch_until_it_is_done() {
        let head = HeadOfLine::default();
        head.begin(&[m(0, 1), m(1, 1)]);
        let first = head.ages()[&("t".to_owned(), 0)];
        std::thread::sleep(Duration::from_millis(5));
        head.begin(&[m(0, 2)]);
        assert!(
            head.ages()[&("t".to_owned(), 0)] > first,
            "kept from the first batch"
        );
        head.done(&[m(0, 1), m(0, 2)]);
        assert_eq!(
            head.ages().keys().cloned().collect::<Vec<_>>(),
            [("t".to_owned(), 1)]
        );
    }
}
