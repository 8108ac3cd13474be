//! Operator views of Kafka: consumer lag per partition for Herald's groups (`herald lag`),
//! and reading and replaying the dead-letter topic (`herald dead-letter list|replay`).
//!
//! These use a short-lived reader that is assigned partitions and never joins or commits
//! for a group, so running them never disturbs the daemons. Blocking calls: run them on a
//! blocking thread.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use crate::headers::*;
use crate::{KafkaError, KafkaSettings, Result};

/// Most dead-letter records read for one list or replay.
pub const DEAD_LETTER_LIMIT: usize = 10_000;

/// Header added to a replayed message: where in the dead-letter topic it came from.
pub const REPLAYED_FROM: &str = "herald-replayed-from";

#[derive(Debug, Clone, Serialize)]
pub struct PartitionLag {
    pub group: String,
    pub topic: String,
    pub partition: i32,
    /// The group's committed offset; `None` when it never committed on this partition.
    pub committed: Option<i64>,
    pub log_start: i64,
    pub log_end: i64,
    pub lag: i64,
    /// Age of the first message not yet committed (the head of the line), by its
    /// timestamp; `None` when there is no lag.
    pub head_age_ms: Option<i64>,
}

fn partitions(consumer: &BaseConsumer, topic: &str, timeout: Duration) -> Result<Vec<i32>> {
    let md = consumer.fetch_metadata(Some(topic), timeout)?;
    let t = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .ok_or_else(|| KafkaError::Topic {
            topic: topic.to_owned(),
            detail: "not in the cluster metadata".into(),
        })?;
    if let Some(e) = t.error() {
        return Err(KafkaError::Topic {
            topic: topic.to_owned(),
            detail: format!("{:?}", rdkafka::types::RDKafkaErrorCode::from(e)),
        });
    }
    Ok(t.partitions().iter().map(|p| p.id()).collect())
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Committed offset, log end and lag of `group` on every partition of `topics`, and the
/// age of the oldest uncommitted message where there is lag.
pub fn group_lag(
    settings: &KafkaSettings,
    group: &str,
    topics: &[&str],
    timeout: Duration,
) -> Result<Vec<PartitionLag>> {
    let consumer: BaseConsumer = settings.reader(group).create()?;
    let mut tpl = TopicPartitionList::new();
    for topic in topics {
        for p in partitions(&consumer, topic, timeout)? {
            tpl.add_partition(topic, p);
        }
    }
    let committed = consumer.committed_offsets(tpl, timeout)?;
    let mut rows = Vec::new();
    let mut heads = TopicPartitionList::new();
    for e in committed.elements() {
        let (low, high) = consumer.fetch_watermarks(e.topic(), e.partition(), timeout)?;
        let committed = match e.offset() {
            Offset::Offset(o) => Some(o),
            _ => None,
        };
        // Nothing committed: the group starts from the log start (auto.offset.reset).
        let from = committed.unwrap_or(low).max(low);
        let lag = (high - from).max(0);
        if lag > 0 {
            heads.add_partition_offset(e.topic(), e.partition(), Offset::Offset(from))?;
        }
        rows.push(PartitionLag {
            group: group.to_owned(),
            topic: e.topic().to_owned(),
            partition: e.partition(),
            committed,
            log_start: low,
            log_end: high,
            lag,
            head_age_ms: None,
        });
    }
    if heads.count() > 0 {
        let ages = first_timestamps(&consumer, &heads, timeout)?;
        let now = now_ms();
        for r in &mut rows {
            if let Some(ts) = ages.get(&(r.topic.clone(), r.partition)) {
                r.head_age_ms = Some((now - ts).max(0));
            }
        }
    }
    Ok(rows)
}

/// Reads the first message at each assigned position; its timestamp, per partition.
fn first_timestamps(
    consumer: &BaseConsumer,
    positions: &TopicPartitionList,
    timeout: Duration,
) -> Result<BTreeMap<(String, i32), i64>> {
    consumer.assign(positions)?;
    let mut found = BTreeMap::new();
    let deadline = Instant::now() + timeout;
    while found.len() < positions.count() && Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                if let Some(ts) = m.timestamp().to_millis() {
                    found.entry((m.topic().to_owned(), m.partition())).or_insert(ts);
                }
            }
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
    Ok(found)
}

/// One record of the dead-letter topic. The payload is not shown (it may hold personal
/// data); its size is.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetterRecord {
    pub partition: i32,
    pub offset: i64,
    pub timestamp_ms: Option<i64>,
    pub reason: String,
    pub detail: String,
    pub source_topic: Option<String>,
    pub source_partition: Option<i32>,
    pub source_offset: Option<i64>,
    pub consumer_group: Option<String>,
    pub key: Option<String>,
    pub payload_bytes: usize,
    #[serde(skip)]
    raw_key: Option<Vec<u8>>,
    #[serde(skip)]
    raw_payload: Option<Vec<u8>>,
    #[serde(skip)]
    headers: Vec<(String, Option<Vec<u8>>)>,
}

/// Every record of the dead-letter `topic` from the log start to its end when called
/// (at most `limit`).
pub fn read_dead_letters(
    settings: &KafkaSettings,
    topic: &str,
    limit: usize,
    timeout: Duration,
) -> Result<Vec<DeadLetterRecord>> {
    let consumer: BaseConsumer = settings.reader("herald-inspect").create()?;
    let mut tpl = TopicPartitionList::new();
    let mut ends = BTreeMap::new();
    for p in partitions(&consumer, topic, timeout)? {
        let (low, high) = consumer.fetch_watermarks(topic, p, timeout)?;
        if high > low {
            tpl.add_partition_offset(topic, p, Offset::Offset(low))?;
            ends.insert(p, high);
        }
    }
    let mut out = Vec::new();
    if ends.is_empty() {
        return Ok(out);
    }
    consumer.assign(&tpl)?;
    let deadline = Instant::now() + timeout;
    // A partition is done once a message at or past its end offset minus one was read;
    // transaction markers can leave the last offset unreadable, hence the deadline too.
    while !ends.is_empty() && out.len() < limit && Instant::now() < deadline {
        let m = match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => m,
            Some(Err(e)) => return Err(e.into()),
            None => continue,
        };
        if let Some(end) = ends.get(&m.partition()) {
            if m.offset() + 1 >= *end {
                ends.remove(&m.partition());
            }
        }
        let h = |name| header_str(&m, name).map(str::to_owned);
        out.push(DeadLetterRecord {
            partition: m.partition(),
            offset: m.offset(),
            timestamp_ms: m.timestamp().to_millis(),
            reason: h(DLQ_REASON).unwrap_or_else(|| "unknown".into()),
            detail: h(DLQ_DETAIL).unwrap_or_default(),
            source_topic: h(DLQ_SOURCE_TOPIC),
            source_partition: h(DLQ_SOURCE_PARTITION).and_then(|v| v.parse().ok()),
            source_offset: h(DLQ_SOURCE_OFFSET).and_then(|v| v.parse().ok()),
            consumer_group: h(DLQ_CONSUMER_GROUP),
            key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
            payload_bytes: m.payload().map_or(0, <[u8]>::len),
            raw_key: m.key().map(<[u8]>::to_vec),
            raw_payload: m.payload().map(<[u8]>::to_vec),
            headers: m
                .headers()
                .map(|hs| {
                    hs.iter()
                        .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                        .collect()
                })
                .unwrap_or_default(),
        });
    }
    out.sort_by_key(|r| (r.partition, r.offset));
    Ok(out)
}

/// Which dead-letter records to replay: the listed ones, all with a reason, or all.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ReplaySelection {
    #[serde(default)]
    pub records: Vec<RecordRef>,
    pub reason: Option<String>,
    #[serde(default)]
    pub all: bool,
}

#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
pub struct RecordRef {
    pub partition: i32,
    pub offset: i64,
}

impl ReplaySelection {
    /// Refuses an empty selection: replaying everything must be asked for.
    pub fn validate(&self) -> Result<(), String> {
        let ways = usize::from(!self.records.is_empty())
            + usize::from(self.reason.is_some())
            + usize::from(self.all);
        if ways != 1 {
            return Err("choose exactly one of: records (partition and offset of each), reason, all".into());
        }
        Ok(())
    }

    pub fn picks(&self, r: &DeadLetterRecord) -> bool {
        self.all
            || self.reason.as_deref() == Some(r.reason.as_str())
            || self.records.contains(&RecordRef {
                partition: r.partition,
                offset: r.offset,
            })
    }
}

/// Produces each record back to its source topic with its original key, value and
/// headers (Herald's dead-letter headers removed, [`REPLAYED_FROM`] added), and waits
/// until every one is acknowledged (in order; the first failure stops the replay and is
/// returned with the count already acknowledged in the error). Ingest converges replays
/// like any duplicate, so replaying a record twice is harmless.
pub async fn replay(
    settings: &KafkaSettings,
    dead_letter_topic: &str,
    records: &[DeadLetterRecord],
) -> Result<usize> {
    let producer: FutureProducer = settings.producer().create()?;
    for r in records {
        let source = r.source_topic.as_deref().ok_or_else(|| KafkaError::Topic {
            topic: dead_letter_topic.to_owned(),
            detail: format!("record {}@{} has no source topic header", r.partition, r.offset),
        })?;
        let from = format!("{dead_letter_topic}/{}@{}", r.partition, r.offset);
        let mut headers = OwnedHeaders::new();
        for (k, v) in r.headers.iter().filter(|(k, _)| !k.starts_with("herald-dlq-")) {
            headers = headers.insert(Header {
                key: k,
                value: v.as_deref(),
            });
        }
        headers = headers.insert(Header {
            key: REPLAYED_FROM,
            value: Some(from.as_str()),
        });
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(source).headers(headers);
        if let Some(k) = &r.raw_key {
            record = record.key(k);
        }
        if let Some(v) = &r.raw_payload {
            record = record.payload(v);
        }
        producer
            .send(record, Duration::from_secs(30))
            .await
            .map_err(|(e, _)| KafkaError::Client(e))?;
    }
    Ok(records.len())
}
