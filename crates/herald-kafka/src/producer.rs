//! Herald's producer: each send is awaited until the broker acknowledged the record or
//! refused it. The relay, the dead-letter producer and the dead-letter replay (CLI and
//! admin API) all produce through it.
//!
//! One thread per producer serves librdkafka's delivery reports. rdkafka's own
//! `FutureProducer` is not used: its thread polls 100 ms at a time, and every poll spins
//! through its last millisecond, since librdkafka waits in whole milliseconds and the time
//! left is rounded down to 0 and polled again until the deadline has passed. On an idle
//! Herald that was 1% of a core for each of its two producers, nearly all of the
//! process's idle CPU. Here the thread polls `POLL_WAIT` at a time, so it spins through
//! one millisecond a second (0.1% of a core). A delivery report is handled as soon as it
//! arrives, so the wait bounds only how soon the thread notices that the producer was
//! dropped: it is not joined then (a drop would block its task for up to a second), and
//! the process waits for the stopped threads before it exits ([`wait_for_closed`]).
//!
//! An idempotent producer can enter librdkafka's fatal state (a sequence number the broker
//! no longer agrees with, typically after a broker restart): from then on it refuses every
//! new record, fails those still queued (`PurgeQueue`), and nothing brings it back; only
//! what it had already sent may still be acknowledged. The send that sees the state
//! replaces the client with a new one (a new producer id) and returns its error; the
//! caller's retry goes through the new client. What the old client had not reported
//! acknowledged is unacknowledged for the caller too (it stays in the outbox, its offsets
//! unstored), so the new client may publish again a record the broker already held: a
//! duplicate message, which delivery absorbs, never a loss.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError as RdKafkaError;
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use tokio::sync::oneshot;

use crate::context::{Hooked, Hooks};
use crate::Result;

/// How long the delivery thread waits for a report before it looks at the stop flag.
const POLL_WAIT: Duration = Duration::from_secs(1);

/// How long a send waits for room in librdkafka's queue before it gives up, and between
/// two tries.
const QUEUE_TIMEOUT: Duration = Duration::from_secs(30);
const QUEUE_RETRY: Duration = Duration::from_millis(100);

/// The delivery threads not yet known to have finished.
static THREADS: Mutex<Vec<JoinHandle<()>>> = Mutex::new(Vec::new());

/// The answer to one record: the broker acknowledged it, or why not.
type Answer = std::result::Result<(), RdKafkaError>;

/// Hands each delivery report to the send waiting for it.
pub struct Reports;

impl ProducerContext for Hooked<Reports> {
    type DeliveryOpaque = Box<oneshot::Sender<Answer>>;

    fn delivery(&self, result: &DeliveryResult<'_>, waiting: Self::DeliveryOpaque) {
        let answer = match result {
            Ok(_) => Ok(()),
            Err((e, _)) => Err(e.clone()),
        };
        // The send stopped waiting (its task was cancelled): nobody to tell.
        let _ = waiting.send(answer);
    }
}

/// A producer whose sends return once the broker answered. Cheap to clone (the clones
/// share one client); the delivery thread of a client stops within `POLL_WAIT` after the
/// last clone is dropped, or after the client was replaced and its last send returned.
#[derive(Clone)]
pub struct AckedProducer {
    shared: Arc<Shared>,
}

struct Shared {
    /// What each client is created from: the first, and any that replaces it.
    config: ClientConfig,
    hooks: Hooks,
    current: Mutex<Arc<Instance>>,
    /// Clients replaced after a fatal error.
    renewals: AtomicU64,
}

/// One librdkafka client and its delivery thread.
struct Instance {
    producer: Arc<BaseProducer<Hooked<Reports>>>,
    stop: Arc<AtomicBool>,
}

impl Drop for Instance {
    /// Failure policy: the thread stops within `POLL_WAIT` and drops the client, which
    /// fails the records still queued (those of sends whose tasks were cancelled: no send
    /// can be waiting, each holds the instance). A process that exits before that loses
    /// only records nobody was told were acknowledged: they stay in the outbox, or their
    /// offsets stay unstored.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

impl Instance {
    /// Creates the client and starts its delivery thread (which also serves its token
    /// refreshes, see `context`).
    fn create(config: &ClientConfig, hooks: &Hooks) -> Result<Self> {
        let producer: Arc<BaseProducer<Hooked<Reports>>> =
            Arc::new(config.create_with_context(hooks.clone().wrap(Reports))?);
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let producer = Arc::clone(&producer);
            let stop = Arc::clone(&stop);
            thread::Builder::new()
                .name("herald-producer".to_owned())
                .spawn(move || {
                    while !stop.load(Ordering::Acquire) {
                        producer.poll(POLL_WAIT);
                    }
                })?
        };
        let mut threads = THREADS.lock().unwrap_or_else(PoisonError::into_inner);
        // Forget those that finished (a replay's producer each), keep the rest.
        threads.retain(|t| !t.is_finished());
        threads.push(thread);
        Ok(Self { producer, stop })
    }

    /// librdkafka's fatal error, if the client is in that state (its code and reason).
    fn fatal(&self) -> Option<(RDKafkaErrorCode, String)> {
        self.producer.client().fatal_error()
    }
}

/// Waits, up to `limit`, until the delivery threads of every dropped producer have
/// finished, each destroying its client on the way out (its connections closed, its own
/// threads joined). For the process's exit: librdkafka's threads must not run on while
/// `exit` tears the process down (with TLS, a known way to crash there). Returns how many
/// threads still run: those of producers not dropped, or past the limit.
pub fn wait_for_closed(limit: Duration) -> usize {
    let deadline = Instant::now() + limit;
    let mut threads = std::mem::take(&mut *THREADS.lock().unwrap_or_else(PoisonError::into_inner));
    loop {
        let (done, running): (Vec<_>, Vec<_>) = threads.into_iter().partition(JoinHandle::is_finished);
        for t in done {
            // The thread only polls; a panic there has been reported already.
            let _ = t.join();
        }
        threads = running;
        if threads.is_empty() || Instant::now() >= deadline {
            let left = threads.len();
            THREADS
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend(threads);
            return left;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

impl AckedProducer {
    /// Creates the client and starts its delivery thread. `hooks`: from
    /// [`crate::KafkaSettings::hooks`], shared by the clients that replace this one.
    pub fn create(config: &ClientConfig, hooks: Hooks) -> Result<Self> {
        let first = Instance::create(config, &hooks)?;
        Ok(Self {
            shared: Arc::new(Shared {
                config: config.clone(),
                hooks,
                current: Mutex::new(Arc::new(first)),
                renewals: AtomicU64::new(0),
            }),
        })
    }

    fn current(&self) -> Arc<Instance> {
        Arc::clone(&self.shared.current.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// How many times the client was replaced after a fatal error.
    pub fn renewals(&self) -> u64 {
        self.shared.renewals.load(Ordering::Relaxed)
    }

    /// Produces one record and waits for the broker's answer. A full local queue is
    /// waited out for up to `QUEUE_TIMEOUT`; any other refusal is returned at once. A
    /// client found in librdkafka's fatal state is replaced before the error is returned.
    pub async fn send(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        payload: Option<&[u8]>,
        headers: OwnedHeaders,
    ) -> Answer {
        let instance = self.current();
        let answer = Self::send_through(&instance, topic, key, payload, headers).await;
        if answer.is_err() {
            self.renew_if_fatal(&instance);
        }
        answer
    }

    async fn send_through(
        instance: &Instance,
        topic: &str,
        key: Option<&[u8]>,
        payload: Option<&[u8]>,
        headers: OwnedHeaders,
    ) -> Answer {
        let (tx, rx) = oneshot::channel();
        let mut record: BaseRecord<'_, [u8], [u8], _> =
            BaseRecord::with_opaque_to(topic, Box::new(tx)).headers(headers);
        if let Some(k) = key {
            record = record.key(k);
        }
        if let Some(p) = payload {
            record = record.payload(p);
        }
        let start = Instant::now();
        loop {
            match instance.producer.send(record) {
                Ok(()) => break,
                Err((RdKafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                    if start.elapsed() < QUEUE_TIMEOUT =>
                {
                    record = back;
                    tokio::time::sleep(QUEUE_RETRY).await;
                }
                Err((e, _)) => return Err(e),
            }
        }
        // A dropped sender means the client went away with the record unanswered.
        rx.await.unwrap_or(Err(RdKafkaError::Canceled))
    }

    /// Replaces `failed` with a new client if it is in librdkafka's fatal state and still
    /// the current one (the sends that failed with it together replace it once). Failure
    /// policy: a crash here loses nothing, the caller was told of no acknowledgement; a
    /// new client that cannot be created leaves the old one, and the next failed send
    /// tries again.
    fn renew_if_fatal(&self, failed: &Arc<Instance>) {
        let Some((code, reason)) = failed.fatal() else {
            return;
        };
        if !Arc::ptr_eq(&self.current(), failed) {
            return; // another send replaced it already
        }
        // Created outside the lock (a client's creation may take a while: certificates,
        // a thread); the lock is held only to swap, and a send that lost the race to
        // replace the same client drops its spare.
        let fresh = match Instance::create(&self.shared.config, &self.shared.hooks) {
            Ok(fresh) => Arc::new(fresh),
            Err(e) => {
                tracing::error!(code = ?code, reason = %reason, error = %e,
                    "producer in librdkafka's fatal state and no new client could be created; trying again at the next failed send");
                return;
            }
        };
        let mut current = self.shared.current.lock().unwrap_or_else(PoisonError::into_inner);
        if !Arc::ptr_eq(&current, failed) {
            return;
        }
        *current = fresh;
        drop(current);
        let renewals = self.shared.renewals.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::error!(code = ?code, reason = %reason, renewals,
            "producer in librdkafka's fatal state: replaced by a new client; what it had not acknowledged is sent again");
    }

    /// Puts the current client in librdkafka's fatal state, as a broker that no longer
    /// agrees with its sequence numbers would. For the failpoints that test the
    /// replacement; compiled with `fault-injection` only. Returns whether it took.
    #[cfg(feature = "fault-injection")]
    pub fn raise_fatal_error(&self, reason: &str) -> bool {
        herald_kafka_faults::raise_fatal_error(self.current().producer.client(), reason)
    }
}
