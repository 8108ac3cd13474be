//! Operator views of Kafka: consumer lag per partition for Herald's groups (`herald lag`),
//! and reading and replaying the dead-letter topic (`herald dead-letter list|replay`).
//!
//! These use a short-lived reader that is assigned partitions and never joins or commits
//! for a group, so running them never disturbs the daemons. Blocking calls: run them on a
//! blocking thread.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::connect::{reader, Plain};
use crate::producer::AckedProducer;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use crate::headers::*;
use crate::{KafkaError, KafkaSettings, Result};

/// Most dead-letter records read for one list or replay.
pub const DEAD_LETTER_LIMIT: usize = 10_000;
/// Most bytes (keys, values, headers) of dead-letter records held for one list or replay.
pub const DEAD_LETTER_MAX_BYTES: usize = 64 << 20;

/// How much of the dead-letter topic one read may hold.
#[derive(Debug, Clone, Copy)]
pub struct ReadBound {
    pub records: usize,
    pub bytes: usize,
}

impl ReadBound {
    /// What a replay or the command line reads.
    pub const ALL: ReadBound = ReadBound {
        records: DEAD_LETTER_LIMIT,
        bytes: DEAD_LETTER_MAX_BYTES,
    };
}

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

fn partitions(consumer: &BaseConsumer<Plain>, topic: &str, timeout: Duration) -> Result<Vec<i32>> {
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
    let consumer = reader(settings, group, &[])?;
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
    consumer: &BaseConsumer<Plain>,
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
    /// For a run of offsets that could not be decoded: one past the last one skipped.
    pub source_offset_end: Option<i64>,
    pub consumer_group: Option<String>,
    pub key: Option<String>,
    pub payload_bytes: usize,
    /// `prefix` or `omitted` when the record does not carry the original value whole
    /// (the dead-letter topic refused it); `None` when it does.
    pub payload: Option<String>,
    #[serde(skip)]
    raw_key: Option<Vec<u8>>,
    #[serde(skip)]
    raw_payload: Option<Vec<u8>>,
    #[serde(skip)]
    headers: Vec<(String, Option<Vec<u8>>)>,
}

/// Every record of the dead-letter `topic` from the log start to its end when called, up
/// to `bound` (the first ones read; a record that crosses the byte bound is the last).
/// The flag says whether the read stopped at a bound (there may be more).
pub fn read_dead_letters(
    settings: &KafkaSettings,
    topic: &str,
    bound: ReadBound,
    timeout: Duration,
) -> Result<(Vec<DeadLetterRecord>, bool)> {
    let consumer = reader(settings, "herald-inspect", &[])?;
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
        return Ok((out, false));
    }
    let mut bytes = 0usize;
    consumer.assign(&tpl)?;
    let deadline = Instant::now() + timeout;
    // A partition is done once a message at or past its end offset minus one was read;
    // transaction markers can leave the last offset unreadable, hence the deadline too.
    while !ends.is_empty() && out.len() < bound.records && bytes < bound.bytes && Instant::now() < deadline {
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
        bytes += m.key().map_or(0, <[u8]>::len)
            + m.payload().map_or(0, <[u8]>::len)
            + m.headers().map_or(0, |hs| {
                hs.iter()
                    .map(|h| h.key.len() + h.value.map_or(0, <[u8]>::len))
                    .sum()
            });
        out.push(DeadLetterRecord {
            partition: m.partition(),
            offset: m.offset(),
            timestamp_ms: m.timestamp().to_millis(),
            reason: h(DLQ_REASON).unwrap_or_else(|| "unknown".into()),
            detail: h(DLQ_DETAIL).unwrap_or_default(),
            source_topic: h(DLQ_SOURCE_TOPIC),
            source_partition: h(DLQ_SOURCE_PARTITION).and_then(|v| v.parse().ok()),
            source_offset: h(DLQ_SOURCE_OFFSET).and_then(|v| v.parse().ok()),
            source_offset_end: h(DLQ_SOURCE_OFFSET_END).and_then(|v| v.parse().ok()),
            consumer_group: h(DLQ_CONSUMER_GROUP),
            key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
            payload_bytes: m.payload().map_or(0, <[u8]>::len),
            payload: h(DLQ_PAYLOAD),
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
    let bounded = out.len() >= bound.records || bytes >= bound.bytes;
    out.sort_by_key(|r| (r.partition, r.offset));
    Ok((out, bounded))
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

/// A replay selection that does not say which records: none of the ways, or several.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("choose exactly one of: records (partition and offset of each), reason, all")]
pub struct AmbiguousSelection;

impl ReplaySelection {
    /// Refuses an empty selection (replaying everything must be asked for) and a mixed one.
    pub fn validate(&self) -> Result<(), AmbiguousSelection> {
        let ways = usize::from(!self.records.is_empty())
            + usize::from(self.reason.is_some())
            + usize::from(self.all);
        if ways != 1 {
            return Err(AmbiguousSelection);
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

/// Why a dead-letter record is not replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayRefusal {
    /// No `herald-dlq-source-topic` header: nothing says where it came from.
    NoSourceTopic,
    /// The source header names a topic Herald's ingest does not consume. The header is
    /// input like any other (a producer can write it): replay never writes elsewhere.
    ForeignTopic(String),
    /// The record carries a prefix of the value or none (`herald-dlq-payload`); the whole
    /// message is at its source offset.
    PartialPayload(String),
    /// The record names a run of offsets that could not be decoded: there is nothing to
    /// replay; the records are still at those offsets of the source topic.
    Undecodable { first: Option<i64>, end: i64 },
}

impl std::fmt::Display for ReplayRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplayRefusal::NoSourceTopic => write!(f, "no source topic header"),
            ReplayRefusal::ForeignTopic(t) => write!(
                f,
                "source topic {t:?} is not one Herald's ingest consumes; replay writes only to those"
            ),
            ReplayRefusal::PartialPayload(p) => write!(
                f,
                "the record holds the value's {p}, not the whole message; read it at its source offset"
            ),
            ReplayRefusal::Undecodable { first, end } => write!(
                f,
                "offsets {}..{end} of the source could not be decoded: nothing to replay; the records \
                 are still in the source topic, for a build that can decode them",
                first.map_or_else(|| "?".to_owned(), |o| o.to_string())
            ),
        }
    }
}

/// A record not replayed, and why.
#[derive(Debug, Clone, Serialize)]
pub struct RefusedReplay {
    pub partition: i32,
    pub offset: i64,
    pub source_topic: Option<String>,
    pub refusal: String,
}

/// What a replay did.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ReplayReport {
    pub replayed: usize,
    pub refused: Vec<RefusedReplay>,
}

/// Where `r` may be replayed: its source topic, if that is one of `ingest_topics` (the
/// full names, with the prefix, of the topics Herald's ingest consumes) and the record
/// holds the whole original message.
pub fn replay_target<'r>(r: &'r DeadLetterRecord, ingest_topics: &[&str]) -> Result<&'r str, ReplayRefusal> {
    let source = r.source_topic.as_deref().ok_or(ReplayRefusal::NoSourceTopic)?;
    if !ingest_topics.contains(&source) {
        return Err(ReplayRefusal::ForeignTopic(source.to_owned()));
    }
    if let Some(end) = r.source_offset_end {
        return Err(ReplayRefusal::Undecodable {
            first: r.source_offset,
            end,
        });
    }
    if let Some(p) = &r.payload {
        return Err(ReplayRefusal::PartialPayload(p.clone()));
    }
    Ok(source)
}

/// Produces each record whose [`replay_target`] is allowed back to its source topic with
/// its original key, value and headers (Herald's dead-letter headers removed,
/// [`REPLAYED_FROM`] added), and waits until every one is acknowledged (in order; the
/// first failure stops the replay and is returned; the records before it are already
/// written). The others are listed in the report, never produced. Ingest converges replays
/// like any duplicate, so replaying a record twice is harmless.
pub async fn replay(
    settings: &KafkaSettings,
    dead_letter_topic: &str,
    ingest_topics: &[&str],
    records: &[DeadLetterRecord],
) -> Result<ReplayReport> {
    let mut report = ReplayReport::default();
    let mut allowed = Vec::new();
    for r in records {
        match replay_target(r, ingest_topics) {
            Ok(topic) => allowed.push((topic, r)),
            Err(refusal) => report.refused.push(RefusedReplay {
                partition: r.partition,
                offset: r.offset,
                source_topic: r.source_topic.clone(),
                refusal: refusal.to_string(),
            }),
        }
    }
    if allowed.is_empty() {
        return Ok(report);
    }
    let producer = AckedProducer::create(&settings.producer(), settings.hooks())?;
    for (source, r) in allowed {
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
        producer
            .send(source, r.raw_key.as_deref(), r.raw_payload.as_deref(), headers)
            .await
            .map_err(KafkaError::Client)?;
        report.replayed += 1;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(source: Option<&str>, payload: Option<&str>) -> DeadLetterRecord {
        DeadLetterRecord {
            partition: 0,
            offset: 7,
            timestamp_ms: None,
            reason: "invalid_json".into(),
            detail: String::new(),
            source_topic: source.map(str::to_owned),
            source_partition: Some(1),
            source_offset: Some(2),
            source_offset_end: None,
            consumer_group: Some("p-herald-ingest".into()),
            key: None,
            payload_bytes: 3,
            payload: payload.map(str::to_owned),
            raw_key: None,
            raw_payload: Some(b"{}x".to_vec()),
            headers: Vec::new(),
        }
    }

    #[test]
    fn a_run_of_undecodable_offsets_is_never_replayed() {
        let mut r = record(Some("p-order-events"), None);
        r.raw_payload = None;
        r.source_offset_end = Some(12);
        let refusal = replay_target(&r, &["p-order-events"]).unwrap_err();
        assert_eq!(
            refusal,
            ReplayRefusal::Undecodable {
                first: Some(2),
                end: 12
            }
        );
        assert!(
            refusal.to_string().contains("still in the source topic"),
            "{refusal}"
        );
    }

    #[test]
    fn replay_writes_only_to_the_topics_ingest_consumes() {
        let ingest = ["p-order-events", "p-seller-profiles"];
        assert_eq!(
            replay_target(&record(Some("p-order-events"), None), &ingest),
            Ok("p-order-events")
        );
        assert_eq!(
            replay_target(&record(Some("p-seller-profiles"), None), &ingest),
            Ok("p-seller-profiles")
        );
        for foreign in [
            "p-herald.deliveries",
            "p-herald.dead-letter",
            "order-events",
            "payments",
            "",
        ] {
            assert_eq!(
                replay_target(&record(Some(foreign), None), &ingest),
                Err(ReplayRefusal::ForeignTopic(foreign.to_owned())),
                "{foreign:?}"
            );
        }
        assert_eq!(
            replay_target(&record(None, None), &ingest),
            Err(ReplayRefusal::NoSourceTopic)
        );
        assert_eq!(
            replay_target(&record(Some("p-order-events"), Some("prefix")), &ingest),
            Err(ReplayRefusal::PartialPayload("prefix".into()))
        );
        let why = ReplayRefusal::ForeignTopic("payments".into()).to_string();
        assert!(
            why.contains("\"payments\"") && why.contains("not one Herald's ingest consumes"),
            "{why}"
        );
    }

    #[tokio::test]
    async fn a_refused_record_is_reported_and_nothing_is_produced() {
        // No broker at this address: a produce would fail; refusals alone need none.
        let settings = KafkaSettings::plaintext("127.0.0.1:1", "herald-test");
        let records = [
            record(Some("payments"), None),
            record(Some("p-order-events"), Some("omitted")),
        ];
        let report = replay(&settings, "p-herald.dead-letter", &["p-order-events"], &records)
            .await
            .unwrap();
        assert_eq!(report.replayed, 0);
        assert_eq!(report.refused.len(), 2);
        assert_eq!(report.refused[0].source_topic.as_deref(), Some("payments"));
    }
}
