//! The delivery group's consumer: many attempts in flight per partition, offsets stored
//! only up to the contiguous completed prefix, an outstanding window that is never
//! exceeded (nothing buffered without bound), and revocations that wait (bounded) for the
//! attempts in flight on the revoked partitions.
//!
//! Backpressure: when the window is full the poll loop stops taking messages; librdkafka
//! keeps what it prefetched (bounded by `queued.max.messages.kbytes`) and stops fetching.
//! Partitions are paused only when one partition holds its own limit (a stuck head of
//! line), or when the window stays full for [`STALL`] (a stalled provider): pausing makes
//! librdkafka throw away its prefetched messages and fetch them again on resume, which
//! as routine backpressure starved the workers of messages.
//!
//! librdkafka runs rebalance callbacks inside `poll`, and the revoke callback here blocks
//! until in-flight attempts are recorded; so the poll loop runs on its own OS thread
//! (blocking there is allowed) and hands messages to the async side through a bounded
//! channel. The async side reports back through [`DeliveryHandle`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::message::Headers;
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::headers::TRACEPARENT;
use crate::tracker::PartitionTracker;
use crate::{KafkaSettings, LagStats, Result};

/// Flow-control limits of the delivery consumer.
#[derive(Debug, Clone)]
pub struct FlowLimits {
    /// Messages received and not yet completed, all partitions together. At it the poll
    /// loop takes no more messages; when it stays there for [`STALL`], every partition is
    /// paused until the window is below three quarters again.
    pub max_outstanding: usize,
    /// The same, per partition: a partition over it is paused alone, so that one slow
    /// partition cannot hold the whole window. `None`: no limit of its own.
    pub max_outstanding_per_partition: Option<usize>,
    /// How long a revocation (or shutdown) waits for in-flight attempts to be recorded.
    pub drain_timeout: Duration,
}

/// One message of `herald.deliveries` to work on.
#[derive(Debug, Clone)]
pub struct Work {
    pub partition: i32,
    pub offset: i64,
    /// The partition's assignment generation when the message was received.
    pub generation: u64,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub traceparent: Option<String>,
}

struct PartitionEntry {
    generation: u64,
    tracker: PartitionTracker,
    revoking: bool,
    paused: bool,
}

#[derive(Default)]
struct State {
    partitions: HashMap<i32, PartitionEntry>,
    next_generation: u64,
    total_outstanding: usize,
}

struct Shared {
    topic: String,
    group: String,
    limits: FlowLimits,
    state: Mutex<State>,
    /// Notified whenever an attempt completes.
    completed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain counters behind; keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub struct DeliveryContext {
    shared: Arc<Shared>,
    lag: LagStats,
}

impl ClientContext for DeliveryContext {
    fn stats(&self, statistics: rdkafka::Statistics) {
        self.lag.record(&statistics);
    }
}

impl ConsumerContext for DeliveryContext {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let partitions: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
            self.drain(&partitions);
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let mut st = self.shared.lock();
                let mut assigned = Vec::new();
                for e in tpl.elements() {
                    st.next_generation += 1;
                    let generation = st.next_generation;
                    st.partitions.insert(
                        e.partition(),
                        PartitionEntry {
                            generation,
                            tracker: PartitionTracker::default(),
                            revoking: false,
                            paused: false,
                        },
                    );
                    assigned.push(e.partition());
                }
                info!(group = %self.shared.group, topic = %self.shared.topic, partitions = ?assigned, "delivery partitions assigned");
            }
            Rebalance::Revoke(tpl) => {
                let revoked: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
                info!(group = %self.shared.group, topic = %self.shared.topic, partitions = ?revoked, "delivery partitions revoked");
            }
            Rebalance::Error(e) => warn!(group = %self.shared.group, error = %e, "rebalance error"),
        }
    }
}

impl DeliveryContext {
    /// Stops new work on `partitions`, waits (bounded) for their in-flight attempts, then
    /// forgets them. Their completed offsets were stored as they completed; librdkafka
    /// commits stored offsets when it unassigns. Queued messages never started stay
    /// uncommitted and go to the next owner.
    fn drain(&self, partitions: &[i32]) {
        let deadline = Instant::now() + self.shared.limits.drain_timeout;
        let mut st = self.shared.lock();
        for p in partitions {
            if let Some(e) = st.partitions.get_mut(p) {
                e.revoking = true;
            }
        }
        loop {
            let busy: usize = partitions
                .iter()
                .filter_map(|p| st.partitions.get(p))
                .map(|e| e.tracker.in_flight())
                .sum();
            let left = deadline.saturating_duration_since(Instant::now());
            if busy == 0 || left.is_zero() {
                if busy > 0 {
                    warn!(group = %self.shared.group, in_flight = busy, partitions = ?partitions,
                          "drain timed out: those attempts' messages will be redelivered and find their leases");
                }
                break;
            }
            st = self
                .shared
                .completed
                .wait_timeout(st, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        for p in partitions {
            if let Some(e) = st.partitions.remove(p) {
                st.total_outstanding -= e.tracker.outstanding();
            }
        }
    }
}

type Client = BaseConsumer<DeliveryContext>;

/// The async side's handle: start and complete work, in the consumer's bookkeeping.
#[derive(Clone)]
pub struct DeliveryHandle {
    shared: Arc<Shared>,
    consumer: Arc<Client>,
    lag: LagStats,
}

/// One assigned partition as the metrics see it.
#[derive(Debug, Clone)]
pub struct PartitionLoad {
    pub partition: i32,
    pub outstanding: usize,
    /// How long the oldest outstanding message has been waiting.
    pub head_age: Option<Duration>,
}

impl DeliveryHandle {
    /// Counts the work as in flight, unless its partition is being revoked or was
    /// reassigned since (then the work must be dropped: it belongs to the next owner).
    pub fn try_start(&self, w: &Work) -> bool {
        let mut st = self.shared.lock();
        match st.partitions.get_mut(&w.partition) {
            Some(e) if e.generation == w.generation && !e.revoking => {
                e.tracker.started();
                true
            }
            _ => false,
        }
    }

    /// Marks the work done (its attempt recorded, or skipped) and stores the next offset
    /// when the contiguous completed prefix advanced. `started` says whether
    /// [`DeliveryHandle::try_start`] had counted it in flight.
    pub fn complete(&self, w: &Work, started: bool) {
        let mut st = self.shared.lock();
        let Some(e) = st.partitions.get_mut(&w.partition) else {
            return; // revoked meanwhile: the next owner replays it
        };
        if e.generation != w.generation {
            return;
        }
        let before = e.tracker.outstanding();
        let store = e.tracker.completed(w.offset, started);
        let removed = before - e.tracker.outstanding();
        st.total_outstanding -= removed;
        if let Some(next) = store {
            let mut tpl = TopicPartitionList::new();
            let stored = tpl
                .add_partition_offset(&self.shared.topic, w.partition, Offset::Offset(next))
                .and_then(|_| self.consumer.store_offsets(&tpl));
            if let Err(err) = stored {
                debug!(partition = w.partition, error = %err, "offset not stored (partition no longer assigned)");
            }
        }
        drop(st);
        self.shared.completed.notify_all();
    }

    /// Each assigned partition's window: for the outstanding and head-of-line gauges.
    pub fn partitions(&self) -> Vec<PartitionLoad> {
        let now = std::time::Instant::now();
        let st = self.shared.lock();
        let mut v: Vec<PartitionLoad> = st
            .partitions
            .iter()
            .map(|(p, e)| PartitionLoad {
                partition: *p,
                outstanding: e.tracker.outstanding(),
                head_age: e.tracker.head_age(now),
            })
            .collect();
        v.sort_by_key(|l| l.partition);
        v
    }

    /// Consumer lag per partition, as of librdkafka's last statistics report.
    pub fn lag(&self) -> &LagStats {
        &self.lag
    }

    pub fn topic(&self) -> &str {
        &self.shared.topic
    }

    /// (outstanding, in flight) over all partitions.
    pub fn load(&self) -> (usize, usize) {
        let st = self.shared.lock();
        let in_flight = st.partitions.values().map(|e| e.tracker.in_flight()).sum();
        (st.total_outstanding, in_flight)
    }
}

pub struct DeliveryConsumer {
    pub handle: DeliveryHandle,
    pub work: mpsc::Receiver<Work>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl DeliveryConsumer {
    pub fn subscribe(settings: &KafkaSettings, group: &str, topic: &str, limits: FlowLimits) -> Result<Self> {
        let shared = Arc::new(Shared {
            topic: topic.to_owned(),
            group: group.to_owned(),
            limits: limits.clone(),
            state: Mutex::new(State::default()),
            completed: Condvar::new(),
        });
        let mut config = settings.consumer(group);
        // With many partitions and a small window, prefetch little: backpressure is
        // pausing, not a deep local queue.
        config.set("queued.max.messages.kbytes", "2048");
        let lag = LagStats::default();
        let consumer: Client = config.create_with_context(DeliveryContext {
            shared: shared.clone(),
            lag: lag.clone(),
        })?;
        consumer.subscribe(&[topic])?;
        let consumer = Arc::new(consumer);
        let (tx, rx) = mpsc::channel(limits.max_outstanding.max(1));
        let stop = Arc::new(AtomicBool::new(false));
        let handle = DeliveryHandle {
            shared: shared.clone(),
            consumer: consumer.clone(),
            lag,
        };
        let thread = {
            let (stop, consumer) = (stop.clone(), consumer.clone());
            std::thread::Builder::new()
                .name("delivery-poll".into())
                .spawn(move || poll_loop(consumer, shared, tx, stop))?
        };
        Ok(Self {
            handle,
            work: rx,
            stop,
            thread: Some(thread),
        })
    }

    /// Stops polling, commits the stored offsets and leaves the group (the revoke callback
    /// drains what is still in flight, bounded). Call after the async side finished.
    pub fn shutdown(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.work.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How long the window may stay full before every partition is paused. Until then the
/// poll loop just waits; after it, it pauses and polls again (rebalance callbacks and
/// statistics are served from `poll`).
pub const STALL: Duration = Duration::from_millis(200);

/// Waits while the window is full, up to [`STALL`]. Returns whether it is still full.
fn wait_for_window(shared: &Shared, stop: &AtomicBool) -> bool {
    let limit = shared.limits.max_outstanding;
    let until = Instant::now() + STALL;
    let mut st = shared.lock();
    while st.total_outstanding >= limit {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || stop.load(Ordering::SeqCst) {
            return true;
        }
        st = shared
            .completed
            .wait_timeout(st, left.min(Duration::from_millis(20)))
            .map(|(g, _)| g)
            .unwrap_or_else(|e| e.into_inner().0);
    }
    false
}

fn poll_loop(consumer: Arc<Client>, shared: Arc<Shared>, tx: mpsc::Sender<Work>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::SeqCst) {
        let stalled = wait_for_window(&shared, &stop);
        // While paused, nothing arrives to end a long poll: look again soon, so that a
        // window that drained resumes its partitions without waiting out the timeout.
        let paused = flow_control(&consumer, &shared, stalled);
        let timeout = if paused {
            Duration::from_millis(5)
        } else {
            Duration::from_millis(100)
        };
        let msg = match consumer.poll(timeout) {
            None => continue,
            Some(Err(e)) => {
                warn!(error = %e, "delivery consumer error");
                continue;
            }
            Some(Ok(m)) => m,
        };
        let generation = {
            let mut st = shared.lock();
            let Some(e) = st.partitions.get_mut(&msg.partition()) else {
                continue; // not (or no longer) ours
            };
            let g = e.generation;
            e.tracker.received(msg.offset());
            st.total_outstanding += 1;
            g
        };
        let traceparent = msg.headers().and_then(|h| {
            h.iter()
                .find(|x| x.key == TRACEPARENT)
                .and_then(|x| x.value)
                .and_then(|v| std::str::from_utf8(v).ok())
                .map(str::to_owned)
        });
        let work = Work {
            partition: msg.partition(),
            offset: msg.offset(),
            generation,
            key: msg.key().map(<[u8]>::to_vec),
            payload: msg.payload().map(<[u8]>::to_vec),
            traceparent,
        };
        drop(msg);
        // The channel holds max_outstanding items and the loop stops taking messages at
        // that many outstanding, so this rarely waits; when it does, only polling is
        // delayed.
        if tx.blocking_send(work).is_err() {
            break;
        }
    }
    if let Err(e) = consumer.commit_consumer_state(rdkafka::consumer::CommitMode::Sync) {
        debug!(error = %e, "final commit of stored offsets");
    }
    consumer.unsubscribe();
    // Keep polling briefly so the revoke callback runs and the group is left cleanly.
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until && !shared.lock().partitions.is_empty() {
        let _ = consumer.poll(Duration::from_millis(100));
    }
}

/// Pauses partitions whose own window is full (or all, when the global window `stalled`),
/// and resumes them below three quarters. Returns whether any partition stays paused.
fn flow_control(consumer: &Client, shared: &Shared, stalled: bool) -> bool {
    let limits = &shared.limits;
    let mut st = shared.lock();
    let global_full = stalled && st.total_outstanding >= limits.max_outstanding;
    let global_low = st.total_outstanding <= limits.max_outstanding * 3 / 4;
    let mut pause = TopicPartitionList::new();
    let mut resume = TopicPartitionList::new();
    for (p, e) in st.partitions.iter_mut() {
        let n = e.tracker.outstanding();
        let own = limits.max_outstanding_per_partition;
        let full = global_full || own.is_some_and(|limit| n >= limit);
        let low = global_low && own.is_none_or(|limit| n <= limit * 3 / 4);
        if !e.paused && full {
            let _ = pause.add_partition(&shared.topic, *p);
            e.paused = true;
        } else if e.paused && low {
            let _ = resume.add_partition(&shared.topic, *p);
            e.paused = false;
        }
    }
    let any_paused = st.partitions.values().any(|e| e.paused);
    drop(st);
    if pause.count() > 0 {
        debug!(partitions = pause.count(), "pausing: outstanding window full");
        if let Err(e) = consumer.pause(&pause) {
            warn!(error = %e, "pause failed");
        }
    }
    if resume.count() > 0 {
        if let Err(e) = consumer.resume(&resume) {
            warn!(error = %e, "resume failed");
        }
    }
    any_paused
}
