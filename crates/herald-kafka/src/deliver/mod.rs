//! The delivery group's consumer: many attempts in flight per partition, offsets stored
//! only up to the contiguous completed prefix, an outstanding window that is never
//! exceeded (nothing buffered without bound), and revocations that wait (bounded) for the
//! attempts in flight on the revoked partitions. The bookkeeping and its rules are in
//! [`window`]; this module connects them to librdkafka.
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
//! channel. The async side reports back through [`DeliveryHandle`]; a revocation is also
//! announced on [`DeliveryHandle::revocations`], so that attempts waiting for their turn
//! can release themselves instead of holding up the drain.

pub mod tracker;
pub mod window;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use crate::context::Hooked;
use crate::deliveries::{DeliveryDecodeError, DeliveryMessage};
use crate::undecodable::{find_runs, positions, seek_past, StallWatch};
use crate::{KafkaSettings, LagStats, Result};
use window::Window;
pub use window::{FlowLimits, PartitionLoad, Slot};

/// One message of `herald.deliveries`, received and not yet started.
#[derive(Debug)]
pub struct Work {
    pub slot: Slot,
    pub message: Result<DeliveryMessage, DeliveryDecodeError>,
}

/// Work counted in flight: it must be handed back through [`DeliveryHandle::complete`]
/// (not `Clone`: work is completed once).
#[derive(Debug)]
pub struct InFlight {
    slot: Slot,
}

struct Shared {
    topic: String,
    group: String,
    limits: FlowLimits,
    window: Mutex<Window>,
    /// Notified whenever work completes.
    completed: Condvar,
    /// Bumped at every revocation, before its drain waits.
    revocations: watch::Sender<u64>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Window> {
        // A panic while holding the lock leaves plain counters behind; keep going.
        self.window.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// librdkafka's rebalance callbacks (statistics are kept by the context's hooks).
pub struct ConsumerCallbacks {
    shared: Arc<Shared>,
}

impl ConsumerContext for Hooked<ConsumerCallbacks> {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let partitions: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
            self.inner.drain(&partitions);
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let shared = &self.inner.shared;
        match rebalance {
            Rebalance::Assign(tpl) => {
                let assigned: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
                shared.lock().assign(&assigned);
                info!(group = %shared.group, topic = %shared.topic, partitions = ?assigned, "delivery partitions assigned");
            }
            Rebalance::Revoke(tpl) => {
                let revoked: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
                info!(group = %shared.group, topic = %shared.topic, partitions = ?revoked, "delivery partitions revoked");
            }
            Rebalance::Error(e) => warn!(group = %shared.group, error = %e, "rebalance error"),
        }
    }
}

impl ConsumerCallbacks {
    /// Stops new work on `partitions`, tells the waiting attempts (they release
    /// themselves as not sent), waits (bounded) for the in-flight attempts to be
    /// recorded, then forgets the partitions. Completed offsets were stored as they
    /// completed; librdkafka commits stored offsets when it unassigns. Messages never
    /// started stay uncommitted and go to the next owner.
    fn drain(&self, partitions: &[i32]) {
        let deadline = Instant::now() + self.shared.limits.drain_timeout;
        let mut w = self.shared.lock();
        w.begin_drain(partitions);
        self.shared.revocations.send_modify(|n| *n += 1);
        loop {
            let busy = w.in_flight_on(partitions);
            let left = deadline.saturating_duration_since(Instant::now());
            if busy == 0 || left.is_zero() {
                if busy > 0 {
                    warn!(group = %self.shared.group, in_flight = busy, partitions = ?partitions,
                          "drain timed out: those attempts' messages will be redelivered and find their leases");
                }
                break;
            }
            w = self
                .shared
                .completed
                .wait_timeout(w, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        w.forget(partitions);
    }
}

type Client = BaseConsumer<Hooked<ConsumerCallbacks>>;

/// The async side's handle: start and complete work, in the consumer's bookkeeping.
#[derive(Clone)]
pub struct DeliveryHandle {
    shared: Arc<Shared>,
    consumer: Arc<Client>,
    lag: LagStats,
}

impl DeliveryHandle {
    /// Counts the work as in flight, unless its partition is being revoked or was
    /// reassigned since (then the work is dropped: it belongs to the next owner).
    pub fn start(&self, slot: Slot) -> Option<InFlight> {
        self.shared.lock().start(&slot).then_some(InFlight { slot })
    }

    /// Whether the work is still this consumer's (its partition not revoked since).
    pub fn is_current(&self, work: &InFlight) -> bool {
        self.shared.lock().is_current(&work.slot)
    }

    /// Changes at every revocation: a waiting attempt checks [`DeliveryHandle::is_current`]
    /// again.
    pub fn revocations(&self) -> watch::Receiver<u64> {
        self.shared.revocations.subscribe()
    }

    /// Marks work done (its attempt recorded, or the message skipped) and stores the next
    /// offset when the contiguous completed prefix advanced.
    pub fn complete(&self, work: InFlight) {
        self.done(&work.slot, true);
    }

    /// Marks a message done that was never started (it was not a delivery message).
    pub fn acknowledge(&self, slot: Slot) {
        self.done(&slot, false);
    }

    fn done(&self, slot: &Slot, started: bool) {
        let mut w = self.shared.lock();
        if let Some(next) = w.complete(slot, started) {
            let mut tpl = TopicPartitionList::new();
            let stored = tpl
                .add_partition_offset(&self.shared.topic, slot.partition, Offset::Offset(next))
                .and_then(|_| self.consumer.store_offsets(&tpl));
            if let Err(err) = stored {
                debug!(partition = slot.partition, error = %err, "offset not stored (partition no longer assigned)");
            }
        }
        drop(w);
        self.shared.completed.notify_all();
    }

    /// Each assigned partition's window: for the outstanding and head-of-line gauges.
    pub fn partitions(&self) -> Vec<PartitionLoad> {
        self.shared.lock().loads(Instant::now())
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
        self.shared.lock().load()
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
            window: Mutex::new(Window::default()),
            completed: Condvar::new(),
            revocations: watch::Sender::new(0),
        });
        let config = client_config(settings, group);
        let lag = LagStats::default();
        let hooks = settings.hooks().with_lag(lag.clone());
        let consumer: Client = config.create_with_context(hooks.wrap(ConsumerCallbacks {
            shared: shared.clone(),
        }))?;
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
            let undecodable = Undecodable {
                settings: settings.clone(),
                group: group.to_owned(),
                watch: StallWatch::default(),
            };
            std::thread::Builder::new()
                .name("delivery-poll".into())
                .spawn(move || poll_loop(consumer, shared, tx, stop, undecodable))?
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

/// The delivery consumer's own tuning, under any `[kafka.properties]` (an operator's
/// `queued.max.messages.kbytes` wins). Its work is bounded by the outstanding window, not
/// by librdkafka's queue, so the queue of prefetched messages is kept small: 2 MiB for all
/// partitions together, against librdkafka's 64 MiB.
const DELIVERY_TUNING: &[(&str, &str)] = &[("queued.max.messages.kbytes", "2048")];

/// The delivery consumer's librdkafka configuration.
pub(crate) fn client_config(settings: &KafkaSettings, group: &str) -> ClientConfig {
    settings.consumer(group, DELIVERY_TUNING)
}

/// How long the window may stay full before every partition is paused. Until then the
/// poll loop just waits; after it, it pauses and polls again (rebalance callbacks and
/// statistics are served from `poll`).
pub const STALL: Duration = Duration::from_millis(200);

/// Waits while the window is full, up to [`STALL`]. Returns whether it is still full.
fn wait_for_window(shared: &Shared, stop: &AtomicBool) -> bool {
    let limit = shared.limits.max_outstanding;
    let until = Instant::now() + STALL;
    let mut w = shared.lock();
    while w.total_outstanding() >= limit {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || stop.load(Ordering::SeqCst) {
            return true;
        }
        w = shared
            .completed
            .wait_timeout(w, left.min(Duration::from_millis(20)))
            .map(|(g, _)| g)
            .unwrap_or_else(|e| e.into_inner().0);
    }
    false
}

/// Record batches of the deliveries topic that librdkafka cannot decode (a batch corrupted
/// on the broker's disk: Herald's own producer wrote them): found as ingest finds them
/// (`crate::undecodable`), and the consumer moved past them. Their messages are Herald's
/// own intent ids, and nothing is lost with them: the relay's stranded-intent check queues
/// every intent that is due without an outbox row again (`relay.stranded_grace_secs`). The
/// skipped offsets are a gap the contiguous-prefix tracker passes, as it passes a
/// transaction marker's.
struct Undecodable {
    settings: KafkaSettings,
    group: String,
    watch: StallWatch,
}

impl Undecodable {
    /// Notes a consumer error; once undecodable errors have come for a while, finds the
    /// runs and moves past them. Blocking (the poll thread), up to the lookup's budget.
    fn on_error(&mut self, consumer: &Client, shared: &Shared, e: &rdkafka::error::KafkaError) {
        self.watch.saw(e, || positions(consumer));
        if !self.watch.due() {
            return;
        }
        let stood_still = self.watch.stood_still(&positions(consumer));
        let runs = match find_runs(consumer, stood_still, &self.settings, &self.group) {
            Ok(runs) => runs,
            Err(e) => {
                warn!(error = %e, "could not look for the deliveries partition an undecodable record batch stalls; trying again at the next errors");
                return;
            }
        };
        for run in runs {
            // Failure policy: nothing to record before the seek; a crash after it finds the
            // run again (the offset is stored only past later messages).
            match seek_past(consumer, &run) {
                Ok(()) => {
                    tracing::error!(topic = %shared.topic, partition = run.partition, first_offset = run.first_offset,
                    next_offset = run.next_offset, reason = %run.reason, detail = %run.detail(),
                    "deliveries record batch librdkafka cannot decode: moved past it; its intents are queued again by the stranded-intent check")
                }
                Err(e) => {
                    warn!(partition = run.partition, error = %e, "could not move past an undecodable deliveries batch; found again at the next errors")
                }
            }
        }
    }
}

fn poll_loop(
    consumer: Arc<Client>,
    shared: Arc<Shared>,
    tx: mpsc::Sender<Work>,
    stop: Arc<AtomicBool>,
    mut undecodable: Undecodable,
) {
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
                undecodable.on_error(&consumer, &shared, &e);
                continue;
            }
            Some(Ok(m)) => m,
        };
        let Some(slot) = shared.lock().received(msg.partition(), msg.offset()) else {
            continue; // not (or no longer) ours
        };
        let message = DeliveryMessage::decode(msg.key(), msg.payload(), msg.headers());
        drop(msg);
        // The channel holds max_outstanding items and the loop stops taking messages at
        // that many outstanding, so this rarely waits; when it does, only polling is
        // delayed.
        if tx.blocking_send(Work { slot, message }).is_err() {
            break;
        }
    }
    if let Err(e) = consumer.commit_consumer_state(rdkafka::consumer::CommitMode::Sync) {
        debug!(error = %e, "final commit of stored offsets");
    }
    consumer.unsubscribe();
    // Keep polling briefly so the revoke callback runs and the group is left cleanly.
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until && !shared.lock().is_empty() {
        let _ = consumer.poll(Duration::from_millis(100));
    }
}

/// Applies the window's flow decisions to librdkafka. Returns whether any partition stays
/// paused.
fn flow_control(consumer: &Client, shared: &Shared, stalled: bool) -> bool {
    let (pause, resume, any_paused) = shared.lock().flow(&shared.limits, stalled);
    let list = |partitions: &[i32]| {
        let mut tpl = TopicPartitionList::new();
        for p in partitions {
            tpl.add_partition(&shared.topic, *p);
        }
        tpl
    };
    if !pause.is_empty() {
        debug!(partitions = pause.len(), "pausing: outstanding window full");
        if let Err(e) = consumer.pause(&list(&pause)) {
            warn!(error = %e, "pause failed");
        }
    }
    if !resume.is_empty() {
        if let Err(e) = consumer.resume(&list(&resume)) {
            warn!(error = %e, "resume failed");
        }
    }
    any_paused
}
