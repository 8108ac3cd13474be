//! A consumer that hands out poll batches and stores offsets only when told the batch's
//! work is durable.
//!
//! Ingest processes a batch as a whole (one PostgreSQL transaction), so the positions to
//! store are simply "one past the last message of each partition in the batch".

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::error::KafkaError as RdKafkaError;

use rdkafka::consumer::{Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::message::{Headers, OwnedMessage};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use tracing::{debug, info, warn};

use crate::context::Hooked;
use crate::undecodable::{find_runs, positions, seek_past, Skip, StallWatch};
use crate::{KafkaSettings, LagStats, Result};

/// Logs assignments and revocations and the outcome of each offset commit (the consumer
/// lag from librdkafka's statistics is kept by the context's hooks).
pub struct LoggingContext {
    group: String,
}

impl ConsumerContext for Hooked<LoggingContext> {
    fn post_rebalance(&self, _consumer: &rdkafka::consumer::BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let group = &self.inner.group;
        match rebalance {
            Rebalance::Assign(tpl) => {
                info!(group = %group, partitions = %describe(tpl), "partitions assigned")
            }
            Rebalance::Revoke(tpl) => {
                info!(group = %group, partitions = %describe(tpl), "partitions revoked")
            }
            Rebalance::Error(e) => warn!(group = %group, error = %e, "rebalance error"),
        }
    }

    fn commit_callback(&self, result: rdkafka::error::KafkaResult<()>, offsets: &TopicPartitionList) {
        match result {
            Ok(()) => {
                debug!(group = %self.inner.group, offsets = %describe(offsets), "offsets committed")
            }
            // No stored offset newer than the last commit: nothing to do.
            Err(rdkafka::error::KafkaError::ConsumerCommit(rdkafka::types::RDKafkaErrorCode::NoOffset)) => {}
            Err(e) => {
                warn!(group = %self.inner.group, error = %e, "offset commit failed; it is retried at the next interval")
            }
        }
    }
}

fn describe(tpl: &TopicPartitionList) -> String {
    tpl.elements()
        .iter()
        .map(|e| match e.offset() {
            Offset::Offset(o) => format!("{}/{}@{o}", e.topic(), e.partition()),
            _ => format!("{}/{}", e.topic(), e.partition()),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The next offset to read in one partition: what gets stored and committed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    pub topic: String,
    pub partition: i32,
    pub next_offset: i64,
}

/// Positions to store after a batch: for each partition, one past its highest offset.
pub fn positions_after(batch: &[OwnedMessage]) -> Vec<Position> {
    let mut highest: BTreeMap<(String, i32), i64> = BTreeMap::new();
    for m in batch {
        let e = highest
            .entry((m.topic().to_owned(), m.partition()))
            .or_insert(m.offset());
        *e = (*e).max(m.offset());
    }
    highest
        .into_iter()
        .map(|((topic, partition), o)| Position {
            topic,
            partition,
            next_offset: o + 1,
        })
        .collect()
}

pub struct BatchConsumer {
    consumer: StreamConsumer<Hooked<LoggingContext>>,
    group: String,
    lag: LagStats,
    /// A message received while gathering a batch that it would have taken over its byte
    /// bound: the first of the next batch. Lost with the process like any prefetched
    /// message (its offset was not stored).
    carried: Mutex<Option<OwnedMessage>>,
    /// Undecodable-batch errors seen, and the positions when the first was.
    stalls: Mutex<StallWatch>,
}

/// The ingest consumer's own tuning, under any `[kafka.properties]`. A full prefetch queue
/// postpones a partition's next fetch by `fetch.queue.backoff.ms` (1 s by default): with a
/// queue of a few large messages that idled ingest between batches (300 messages of 1 MB
/// took 8.6 s instead of 3), so it waits 50 ms.
const INGEST_TUNING: &[(&str, &str)] = &[("fetch.queue.backoff.ms", "50")];

/// The ingest consumer's librdkafka configuration. `queued.max.messages.kbytes` goes in
/// after the `[kafka.properties]` pass-through: it is the ingest bound, whose own key is
/// `ingest.prefetch_max_kbytes`.
pub(crate) fn client_config(settings: &KafkaSettings, group: &str, prefetch_kbytes: u32) -> ClientConfig {
    let mut config = settings.consumer(group, INGEST_TUNING);
    config.set("queued.max.messages.kbytes", prefetch_kbytes.to_string());
    config
}

/// What a message costs a batch: its key, value and header bytes (a hostile producer can
/// put its megabyte in headers as well as in the value).
pub fn message_bytes(m: &OwnedMessage) -> usize {
    let headers = m.headers().map_or(0, |h| {
        h.iter()
            .map(|x| x.key.len() + x.value.map_or(0, <[u8]>::len))
            .sum()
    });
    m.key().map_or(0, <[u8]>::len) + m.payload().map_or(0, <[u8]>::len) + headers
}

impl BatchConsumer {
    /// Joins `group` on `topics`. `prefetch_kbytes` bounds librdkafka's queue of fetched
    /// messages not yet handed out (`queued.max.messages.kbytes`: with one consumer queue,
    /// for all partitions together). librdkafka then also asks the broker for at most
    /// that much per fetch (`fetch.max.bytes` follows it, never below the consumer's
    /// `message.max.bytes`); the queue can overshoot by one fetch of a partition
    /// (`fetch.message.max.bytes`, 1 MiB, raised as needed for one larger message).
    pub fn subscribe(
        settings: &KafkaSettings,
        group: &str,
        topics: &[&str],
        prefetch_kbytes: u32,
    ) -> Result<Self> {
        let lag = LagStats::default();
        let config = client_config(settings, group, prefetch_kbytes);
        let hooks = settings.hooks().with_lag(lag.clone());
        let consumer: StreamConsumer<Hooked<LoggingContext>> =
            config.create_with_context(hooks.wrap(LoggingContext {
                group: group.to_owned(),
            }))?;
        consumer.subscribe(topics)?;
        Ok(Self {
            consumer,
            group: group.to_owned(),
            lag,
            carried: Mutex::new(None),
            stalls: Mutex::new(StallWatch::default()),
        })
    }

    /// Notes a consumer error: one that says a batch cannot be decoded opens a stall watch.
    fn note(&self, e: &RdKafkaError) {
        self.stalls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .saw(e, || positions(&self.consumer));
    }

    /// Whether undecodable-batch errors have been coming long enough to look for the
    /// partition they stall ([`BatchConsumer::find_undecodable`]).
    pub fn undecodable_due(&self) -> bool {
        self.stalls.lock().unwrap_or_else(|e| e.into_inner()).due()
    }

    /// Blocking. The undecodable runs that stall partitions now ([`find_runs`]). Call
    /// between batches, once every batch handed out is durable: the caller dead-letters
    /// each run and then moves past it ([`BatchConsumer::skip_past`]).
    pub fn find_undecodable(&self, settings: &KafkaSettings) -> Result<Vec<Skip>> {
        let stood_still = self
            .stalls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .stood_still(&positions(&self.consumer));
        find_runs(&self.consumer, stood_still, settings, &self.group)
    }

    /// Blocking. Moves the consumer past `skip` and stores its end as the partition's
    /// position. Failure policy: call it only once the run's dead letter is acknowledged; a
    /// crash before the offset is committed finds the run again (a second dead letter
    /// naming the same offsets, never a loss).
    pub fn skip_past(&self, skip: &Skip) -> Result<()> {
        seek_past(&self.consumer, skip)?;
        self.store(&[Position {
            topic: skip.topic.clone(),
            partition: skip.partition,
            next_offset: skip.next_offset,
        }]);
        Ok(())
    }

    /// Consumer lag per partition, as of librdkafka's last statistics report.
    pub fn lag(&self) -> &LagStats {
        &self.lag
    }

    /// Waits for a first message, then gathers more until `max` messages, `max_bytes` of
    /// keys and values, or `linger` has passed. A batch always holds at least one message
    /// (a message larger than `max_bytes` comes alone); a message that would take the batch
    /// over `max_bytes` is kept back as the first of the next batch, so a batch holds at
    /// most `max_bytes` unless its one message is larger. Errors from the broker connection
    /// are logged and waited out by librdkafka; they end the batch early rather than
    /// failing it.
    ///
    /// Cancel it only to stop consuming: the messages gathered so far are dropped with the
    /// future, and only a new consumer (or the partition's next owner) reads them again.
    pub async fn next_batch(
        &self,
        max: usize,
        max_bytes: usize,
        linger: Duration,
    ) -> Result<Vec<OwnedMessage>> {
        let carried = self.carried.lock().unwrap_or_else(|e| e.into_inner()).take();
        let first = match carried {
            Some(m) => m,
            None => match self.consumer.recv().await {
                Ok(m) => m.detach(),
                Err(e) => {
                    self.note(&e);
                    return Err(e.into());
                }
            },
        };
        let mut bytes = message_bytes(&first);
        let mut batch = vec![first];
        let deadline = Instant::now() + linger;
        while batch.len() < max && bytes < max_bytes {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match tokio::time::timeout(left, self.consumer.recv()).await {
                Ok(Ok(m)) => {
                    let m = m.detach();
                    let size = message_bytes(&m);
                    if bytes + size > max_bytes {
                        *self.carried.lock().unwrap_or_else(|e| e.into_inner()) = Some(m);
                        break;
                    }
                    bytes += size;
                    batch.push(m);
                }
                Ok(Err(e)) => {
                    self.note(&e);
                    warn!(group = %self.group, error = %e, "consumer error while gathering a batch");
                    break;
                }
                Err(_) => break,
            }
        }
        Ok(batch)
    }

    /// Stores the positions for the next auto-commit. Call only once the work of every
    /// message before them is durable. A partition revoked meanwhile refuses the store:
    /// its messages come back to the next owner, where they converge.
    pub fn store(&self, positions: &[Position]) {
        for p in positions {
            let mut tpl = TopicPartitionList::new();
            if let Err(e) = tpl.add_partition_offset(&p.topic, p.partition, Offset::Offset(p.next_offset)) {
                warn!(error = %e, "invalid offset position");
                continue;
            }
            if let Err(e) = self.consumer.store_offsets(&tpl) {
                info!(group = %self.group, topic = %p.topic, partition = p.partition, error = %e,
                      "offset not stored (partition no longer assigned); the next owner replays it");
            }
        }
    }

    /// Commits the stored offsets now and waits for the broker (used on shutdown).
    pub fn commit_stored(&self) -> Result<()> {
        match self
            .consumer
            .commit_consumer_state(rdkafka::consumer::CommitMode::Sync)
        {
            Ok(()) => Ok(()),
            Err(rdkafka::error::KafkaError::ConsumerCommit(rdkafka::types::RDKafkaErrorCode::NoOffset)) => {
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Leaves the group cleanly (revokes and commits), then returns.
    pub fn unsubscribe(&self) {
        self.consumer.unsubscribe();
    }
}
