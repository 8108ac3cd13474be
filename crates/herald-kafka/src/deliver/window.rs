//! The delivery consumer's bookkeeping, without Kafka: each assigned partition's state,
//! the outstanding window, the flow-control decisions (which partitions to pause and
//! resume) and the drain of revoked partitions. Pure, so every rule is unit-tested here;
//! the poll loop and the rebalance callbacks apply the decisions to librdkafka.
//!
//! A partition is [`Consuming`] (work starts and completes) or [`Draining`] (revoked: no
//! work starts, work in flight may still complete and store its offset until the drain
//! ends). [`Consuming::begin_drain`] consumes the consuming state, so a draining
//! partition cannot start work by accident.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::deliver::tracker::PartitionTracker;

/// Flow-control limits of the delivery consumer.
#[derive(Debug, Clone)]
pub struct FlowLimits {
    /// Messages received and not yet completed, all partitions together. At it the poll
    /// loop takes no more messages; when it stays there for `STALL`, every partition is
    /// paused until the window is below three quarters again.
    pub max_outstanding: usize,
    /// The same, per partition: a partition over it is paused alone, so that one slow
    /// partition cannot hold the whole window. `None`: no limit of its own.
    pub max_outstanding_per_partition: Option<usize>,
    /// How long a revocation (or shutdown) waits for in-flight attempts to be recorded.
    pub drain_timeout: Duration,
}

/// A partition this consumer owns and takes work from.
#[derive(Debug)]
pub struct Consuming {
    generation: u64,
    tracker: PartitionTracker,
    paused: bool,
}

/// A revoked partition whose in-flight work is being waited for.
#[derive(Debug)]
pub struct Draining {
    generation: u64,
    tracker: PartitionTracker,
}

impl Consuming {
    fn new(generation: u64) -> Self {
        Self {
            generation,
            tracker: PartitionTracker::default(),
            paused: false,
        }
    }

    /// Stops new work: what is in flight may still complete.
    pub fn begin_drain(self) -> Draining {
        Draining {
            generation: self.generation,
            tracker: self.tracker,
        }
    }
}

#[derive(Debug)]
pub enum Partition {
    Consuming(Consuming),
    Draining(Draining),
}

impl Partition {
    fn generation(&self) -> u64 {
        match self {
            Partition::Consuming(c) => c.generation,
            Partition::Draining(d) => d.generation,
        }
    }

    fn tracker(&self) -> &PartitionTracker {
        match self {
            Partition::Consuming(c) => &c.tracker,
            Partition::Draining(d) => &d.tracker,
        }
    }

    fn tracker_mut(&mut self) -> &mut PartitionTracker {
        match self {
            Partition::Consuming(c) => &mut c.tracker,
            Partition::Draining(d) => &mut d.tracker,
        }
    }
}

/// Where one message sits: its partition, offset, and the partition's assignment
/// generation when it was received (a message of an earlier assignment is not ours).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub partition: i32,
    pub offset: i64,
    pub generation: u64,
}

/// One assigned partition as the metrics see it.
#[derive(Debug, Clone)]
pub struct PartitionLoad {
    pub partition: i32,
    pub outstanding: usize,
    /// How long the oldest outstanding message has been waiting.
    pub head_age: Option<Duration>,
}

/// Every assigned partition and the window over all of them.
#[derive(Debug, Default)]
pub struct Window {
    partitions: HashMap<i32, Partition>,
    next_generation: u64,
    total_outstanding: usize,
}

impl Window {
    /// Partitions assigned: each starts consuming under a new generation.
    pub fn assign(&mut self, partitions: &[i32]) {
        for p in partitions {
            self.next_generation += 1;
            self.partitions
                .insert(*p, Partition::Consuming(Consuming::new(self.next_generation)));
        }
    }

    /// A message arrived. Returns its slot, or `None` if its partition is not consuming
    /// here (not assigned, or being drained): the message is not ours to work on.
    pub fn received(&mut self, partition: i32, offset: i64) -> Option<Slot> {
        let Some(Partition::Consuming(c)) = self.partitions.get_mut(&partition) else {
            return None;
        };
        c.tracker.received(offset);
        self.total_outstanding += 1;
        Some(Slot {
            partition,
            offset,
            generation: c.generation,
        })
    }

    /// Counts the message's work as in flight, if its partition is still consuming under
    /// the same assignment. `false`: the work belongs to the partition's next owner.
    pub fn start(&mut self, slot: &Slot) -> bool {
        match self.partitions.get_mut(&slot.partition) {
            Some(Partition::Consuming(c)) if c.generation == slot.generation => {
                c.tracker.started();
                true
            }
            _ => false,
        }
    }

    /// Whether work of `slot` is still this consumer's: its partition consuming, same
    /// assignment.
    pub fn is_current(&self, slot: &Slot) -> bool {
        matches!(self.partitions.get(&slot.partition),
                 Some(Partition::Consuming(c)) if c.generation == slot.generation)
    }

    /// Marks the message done (`started`: its work had been counted in flight). Returns
    /// the offset to store when the partition's contiguous completed prefix advanced; a
    /// draining partition still stores (librdkafka commits stored offsets when it
    /// unassigns), a forgotten one does not.
    pub fn complete(&mut self, slot: &Slot, started: bool) -> Option<i64> {
        let p = self.partitions.get_mut(&slot.partition)?;
        if p.generation() != slot.generation {
            return None;
        }
        let tracker = p.tracker_mut();
        let before = tracker.outstanding();
        let store = tracker.completed(slot.offset, started);
        self.total_outstanding -= before - tracker.outstanding();
        store
    }

    /// Revoked partitions stop taking work; their in-flight work may still complete.
    pub fn begin_drain(&mut self, partitions: &[i32]) {
        for p in partitions {
            if let Some(Partition::Consuming(c)) = self.partitions.remove(p) {
                self.partitions.insert(*p, Partition::Draining(c.begin_drain()));
            }
        }
    }

    /// Work in flight on these partitions.
    pub fn in_flight_on(&self, partitions: &[i32]) -> usize {
        partitions
            .iter()
            .filter_map(|p| self.partitions.get(p))
            .map(|p| p.tracker().in_flight())
            .sum()
    }

    /// The drain is over: the partitions are gone, and with them their outstanding
    /// messages (never started, or never completed: the next owner replays them).
    pub fn forget(&mut self, partitions: &[i32]) {
        for p in partitions {
            if let Some(p) = self.partitions.remove(p) {
                self.total_outstanding -= p.tracker().outstanding();
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.partitions.is_empty()
    }

    pub fn total_outstanding(&self) -> usize {
        self.total_outstanding
    }

    /// (outstanding, in flight) over all partitions.
    pub fn load(&self) -> (usize, usize) {
        let in_flight = self.partitions.values().map(|p| p.tracker().in_flight()).sum();
        (self.total_outstanding, in_flight)
    }

    /// Each partition's window, for the outstanding and head-of-line gauges.
    pub fn loads(&self, now: Instant) -> Vec<PartitionLoad> {
        let mut v: Vec<PartitionLoad> = self
            .partitions
            .iter()
            .map(|(p, e)| PartitionLoad {
                partition: *p,
                outstanding: e.tracker().outstanding(),
                head_age: e.tracker().head_age(now),
            })
            .collect();
        v.sort_by_key(|l| l.partition);
        v
    }

    /// Pauses consuming partitions whose own window is full (or all of them, when the
    /// whole window is full and `stalled`), and resumes paused ones below three quarters.
    /// Returns (to pause, to resume, whether any partition stays paused).
    pub fn flow(&mut self, limits: &FlowLimits, stalled: bool) -> (Vec<i32>, Vec<i32>, bool) {
        let global_full = stalled && self.total_outstanding >= limits.max_outstanding;
        let global_low = self.total_outstanding <= limits.max_outstanding * 3 / 4;
        let own = limits.max_outstanding_per_partition;
        let (mut pause, mut resume) = (Vec::new(), Vec::new());
        for (p, e) in self.partitions.iter_mut() {
            let Partition::Consuming(c) = e else {
                continue; // a draining partition is left as librdkafka has it
            };
            let n = c.tracker.outstanding();
            let full = global_full || own.is_some_and(|limit| n >= limit);
            let low = global_low && own.is_none_or(|limit| n <= limit * 3 / 4);
            if !c.paused && full {
                pause.push(*p);
                c.paused = true;
            } else if c.paused && low {
                resume.push(*p);
                c.paused = false;
            }
        }
        pause.sort_unstable();
        resume.sort_unstable();
        let any_paused = self
            .partitions
            .values()
            .any(|e| matches!(e, Partition::Consuming(c) if c.paused));
        (pause, resume, any_paused)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize, per_partition: Option<usize>) -> FlowLimits {
        FlowLimits {
            max_outstanding: max,
            max_outstanding_per_partition: per_partition,
            drain_timeout: Duration::from_secs(1),
        }
    }

    fn receive(w: &mut Window, partition: i32, offsets: std::ops::Range<i64>) -> Vec<Slot> {
        offsets
            .map(|o| w.received(partition, o).expect("consuming"))
            .collect()
    }

    #[test]
    fn a_full_window_pauses_every_partition_only_once_it_stalls() {
        let mut w = Window::default();
        w.assign(&[0, 1]);
        let slots = receive(&mut w, 0, 0..6);
        receive(&mut w, 1, 0..2);
        let l = limits(8, None);
        assert_eq!(w.flow(&l, false), (vec![], vec![], false), "full, not stalled");
        assert_eq!(w.flow(&l, true), (vec![0, 1], vec![], true));
        // Down to 7 of 8: still above three quarters.
        w.complete(&slots[0], false);
        assert_eq!(w.flow(&l, false), (vec![], vec![], true));
        w.complete(&slots[1], false);
        assert_eq!(w.flow(&l, false), (vec![], vec![0, 1], false), "6 of 8 resumes");
    }

    #[test]
    fn a_partition_over_its_own_limit_is_paused_alone() {
        let mut w = Window::default();
        w.assign(&[0, 1]);
        let slots = receive(&mut w, 0, 0..4);
        receive(&mut w, 1, 0..1);
        let l = limits(1000, Some(4));
        assert_eq!(w.flow(&l, false), (vec![0], vec![], true));
        w.complete(&slots[0], false);
        assert_eq!(w.flow(&l, false), (vec![], vec![0], false), "3 <= 4 * 3/4");
    }

    #[test]
    fn a_draining_partition_starts_nothing_but_its_work_in_flight_completes_and_stores() {
        let mut w = Window::default();
        w.assign(&[0]);
        let slots = receive(&mut w, 0, 10..13);
        assert!(w.start(&slots[0]) && w.start(&slots[1]));
        w.begin_drain(&[0]);
        assert!(!w.start(&slots[2]), "no new work once draining");
        assert!(!w.is_current(&slots[0]));
        assert_eq!(w.received(0, 13), None, "a late message is not ours");
        assert_eq!(w.in_flight_on(&[0]), 2);
        assert_eq!(w.complete(&slots[0], true), Some(11), "offsets are still stored");
        assert_eq!(w.complete(&slots[1], true), Some(12));
        assert_eq!(w.in_flight_on(&[0]), 0, "drained");
        w.forget(&[0]);
        assert_eq!(w.total_outstanding(), 0, "the unstarted message goes with it");
        assert_eq!(w.complete(&slots[2], false), None, "forgotten: nothing to store");
        assert!(w.is_empty());
    }

    #[test]
    fn work_of_an_earlier_assignment_is_not_counted_in_the_new_one() {
        let mut w = Window::default();
        w.assign(&[0]);
        let old = receive(&mut w, 0, 0..1);
        w.begin_drain(&[0]);
        w.forget(&[0]);
        w.assign(&[0]);
        assert!(!w.start(&old[0]));
        assert_eq!(w.complete(&old[0], true), None);
        let new = receive(&mut w, 0, 0..1);
        assert!(w.start(&new[0]));
        assert_eq!(w.load(), (1, 1));
        assert_eq!(w.complete(&new[0], true), Some(1));
        assert_eq!(w.load(), (0, 0));
    }

    #[test]
    fn draining_partitions_are_neither_paused_nor_resumed() {
        let mut w = Window::default();
        w.assign(&[0, 1]);
        receive(&mut w, 0, 0..4);
        let l = limits(4, None);
        assert_eq!(w.flow(&l, true), (vec![0, 1], vec![], true));
        w.begin_drain(&[0]);
        w.forget(&[0]);
        assert_eq!(w.flow(&l, false), (vec![], vec![1], false));
    }
}
