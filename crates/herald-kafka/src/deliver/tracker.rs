//! Per-partition offset tracking for out-of-order completion.
//!
//! Delivery runs many attempts at once per partition and they finish in any order. The
//! offset that may be stored is the smallest offset still outstanding (received, not yet
//! completed) or, with none outstanding, one past the highest received: so an offset is
//! committed only when every message before it is done, and gaps in the offset sequence
//! (compaction, transaction markers) never hold anything up because only offsets actually
//! received are tracked.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

#[derive(Debug, Default)]
pub struct PartitionTracker {
    /// Outstanding offsets and when each was received.
    outstanding: BTreeMap<i64, Instant>,
    highest_received: Option<i64>,
    last_stored: Option<i64>,
    /// Attempts started and not yet completed (the rest of `outstanding` is queued).
    in_flight: usize,
}

impl PartitionTracker {
    pub fn received(&mut self, offset: i64) {
        // Where consumption (re)started is, in effect, already stored.
        self.last_stored.get_or_insert(offset);
        self.outstanding.entry(offset).or_insert_with(Instant::now);
        self.highest_received = Some(self.highest_received.map_or(offset, |h| h.max(offset)));
    }

    pub fn started(&mut self) {
        self.in_flight += 1;
    }

    /// Marks `offset` done; returns the next offset to store when it advanced.
    /// `was_started` says whether the work had been started (counted in flight).
    pub fn completed(&mut self, offset: i64, was_started: bool) -> Option<i64> {
        self.outstanding.remove(&offset)?;
        if was_started {
            self.in_flight = self.in_flight.saturating_sub(1);
        }
        let next = match self.outstanding.first_key_value() {
            Some((first, _)) => *first,
            None => self.highest_received? + 1,
        };
        if self.last_stored.is_none_or(|s| next > s) {
            self.last_stored = Some(next);
            Some(next)
        } else {
            None
        }
    }

    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The oldest offset not yet completed: the head of the line.
    pub fn head(&self) -> Option<i64> {
        self.outstanding.first_key_value().map(|(o, _)| *o)
    }

    /// How long the head of the line has been outstanding (received, not completed).
    pub fn head_age(&self, now: Instant) -> Option<Duration> {
        self.outstanding
            .first_key_value()
            .map(|(_, at)| now.saturating_duration_since(*at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_only_the_contiguous_prefix() {
        let mut t = PartitionTracker::default();
        for o in [10, 11, 12] {
            t.received(o);
        }
        assert_eq!(t.completed(12, false), None, "10 and 11 still outstanding");
        assert_eq!(t.completed(10, false), Some(11));
        assert_eq!(
            t.completed(11, false),
            Some(13),
            "everything done: one past the highest"
        );
        assert_eq!(t.outstanding(), 0);
    }

    #[test]
    fn offset_gaps_do_not_block() {
        let mut t = PartitionTracker::default();
        // 101..=104 were compacted away or are transaction markers: never received.
        t.received(100);
        t.received(105);
        assert_eq!(t.completed(100, false), Some(105));
        assert_eq!(t.completed(105, false), Some(106));
    }

    #[test]
    fn never_moves_backwards_and_ignores_unknown_offsets() {
        let mut t = PartitionTracker::default();
        t.received(5);
        assert_eq!(t.completed(5, false), Some(6));
        assert_eq!(t.completed(5, false), None, "completing twice is harmless");
        assert_eq!(t.completed(99, false), None, "never received");
        t.received(3); // a replay after a seek: below what was stored
        assert_eq!(t.completed(3, false), None);
    }

    #[test]
    fn counts_in_flight_separately_from_queued() {
        let mut t = PartitionTracker::default();
        t.received(1);
        t.received(2);
        t.started();
        assert_eq!((t.outstanding(), t.in_flight()), (2, 1));
        t.completed(1, true);
        assert_eq!((t.outstanding(), t.in_flight(), t.head()), (1, 0, Some(2)));
    }
}
