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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError as RdKafkaError;
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientContext;
use tokio::sync::oneshot;

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
struct Reports;

impl ClientContext for Reports {}

impl ProducerContext for Reports {
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

/// A producer whose sends return once the broker answered. Cheap to clone; the
/// delivery thread stops within `POLL_WAIT` after the last clone is dropped.
#[derive(Clone)]
pub struct AckedProducer {
    shared: Arc<Shared>,
}

struct Shared {
    producer: Arc<BaseProducer<Reports>>,
    stop: Arc<AtomicBool>,
}

impl Drop for Shared {
    /// Failure policy: the thread stops within `POLL_WAIT` and drops the client, which
    /// fails the records still queued (those of sends whose tasks were cancelled: no send
    /// can be waiting, each borrows the producer). A process that exits before that loses
    /// only records nobody was told were acknowledged: they stay in the outbox, or their
    /// offsets stay unstored.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
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
    /// Creates the client and starts its delivery thread.
    pub fn create(config: &ClientConfig) -> Result<Self> {
        let producer: Arc<BaseProducer<Reports>> = Arc::new(config.create_with_context(Reports)?);
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
        Ok(Self {
            shared: Arc::new(Shared { producer, stop }),
        })
    }

    /// Produces one record and waits for the broker's answer. A full local queue is
    /// waited out for up to `QUEUE_TIMEOUT`; any other refusal is returned at once.
    pub async fn send(
        &self,
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
            match self.shared.producer.send(record) {
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
}
