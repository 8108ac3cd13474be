//! Kafka helpers for tests and the demo: produce, read a topic back, and compute a
//! consumer group's committed lag.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

use crate::{brokers, replication};

pub fn producer() -> Result<FutureProducer> {
    producer_with(&[])
}

/// A producer that already holds `topic`'s metadata, and so a connection to the broker:
/// its first message leaves without waiting for either (a bench stamps events with the
/// time they are produced).
pub async fn producer_connected(topic: &str) -> Result<FutureProducer> {
    let p = producer()?;
    let (client, topic) = (p.clone(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        client
            .client()
            .fetch_metadata(Some(&topic), Duration::from_secs(30))
    })
    .await??;
    Ok(p)
}

/// A producer with extra librdkafka settings (e.g. a larger `message.max.bytes`, whose
/// default of 1,000,000 refuses a bigger message before it leaves).
pub fn producer_with(settings: &[(&str, &str)]) -> Result<FutureProducer> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers())
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5");
    for (k, v) in settings {
        config.set(*k, *v);
    }
    Ok(config.create()?)
}

/// Produces one message and waits for the broker's acknowledgement.
pub async fn produce(
    p: &FutureProducer,
    topic: &str,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: &[(&str, &str)],
) -> Result<(i32, i64)> {
    produce_to(p, topic, None, key, value, headers).await
}

/// Like [`produce`], to partition `partition` when given (else the key decides).
pub async fn produce_to(
    p: &FutureProducer,
    topic: &str,
    partition: Option<i32>,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: &[(&str, &str)],
) -> Result<(i32, i64)> {
    let mut h = OwnedHeaders::new();
    for (k, v) in headers {
        h = h.insert(Header {
            key: k,
            value: Some(*v),
        });
    }
    let mut rec: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).headers(h);
    if let Some(n) = partition {
        rec = rec.partition(n);
    }
    if let Some(k) = key {
        rec = rec.key(k);
    }
    if let Some(v) = value {
        rec = rec.payload(v);
    }
    let delivery = p
        .send(rec, Duration::from_secs(30))
        .await
        .map_err(|(e, _)| e)
        .with_context(|| format!("producing to {topic}"))?;
    Ok((delivery.partition, delivery.offset))
}

/// A producer whose own size limit (`message.max.bytes`) is `max_bytes`, for messages
/// larger than librdkafka's default 1,000,000 bytes.
pub fn large_producer(max_bytes: usize) -> Result<FutureProducer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.max.bytes", max_bytes.to_string())
        .create()?)
}

/// Sets `max.message.bytes` of `topic` and waits until the broker reports it. (A
/// non-incremental alter: the topic's other overrides return to the broker's defaults,
/// which on the single-node local stack are what Herald sets.)
pub async fn set_max_message_bytes(topic: &str, bytes: usize) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", brokers()).create()?;
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(30)));
    let value = bytes.to_string();
    let alter = AlterConfig::new(ResourceSpecifier::Topic(topic)).set("max.message.bytes", &value);
    for r in admin.alter_configs([&alter], &opts).await? {
        r.map_err(|(_, code)| anyhow::anyhow!("altering {topic}: {code:?}"))?;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let described = admin
            .describe_configs([&ResourceSpecifier::Topic(topic)], &opts)
            .await?;
        let now = described
            .into_iter()
            .next()
            .and_then(|r| r.ok())
            .and_then(|c| c.get("max.message.bytes").and_then(|e| e.value.clone()));
        if now.as_deref() == Some(value.as_str()) {
            return Ok(());
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "{topic}: max.message.bytes is {now:?}, not {value}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The high watermark of every partition of `topic`, summed: how many messages it holds.
pub fn end_offsets(topic: &str) -> Result<i64> {
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", brokers()).create()?;
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let mut sum = 0;
    for t in md.topics().iter().filter(|t| t.name() == topic) {
        for p in t.partitions() {
            sum += consumer
                .fetch_watermarks(topic, p.id(), Duration::from_secs(10))?
                .1;
        }
    }
    Ok(sum)
}

pub async fn flush(p: &FutureProducer) -> Result<()> {
    p.flush(Duration::from_secs(30))?;
    Ok(())
}

/// A message read back from a topic.
#[derive(Debug, Clone)]
pub struct Record {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: BTreeMap<String, String>,
}

/// Reads every message currently in `topic` (from the beginning to the high watermarks).
pub fn read_all(topic: &str) -> Result<Vec<Record>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", "herald-it-reader")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()?;
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let partitions: Vec<i32> = md
        .topics()
        .iter()
        .filter(|t| t.name() == topic)
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    let mut tpl = TopicPartitionList::new();
    let mut remaining = BTreeMap::new();
    for p in &partitions {
        let (_, high) = consumer.fetch_watermarks(topic, *p, Duration::from_secs(10))?;
        if high > 0 {
            tpl.add_partition_offset(topic, *p, Offset::Beginning)?;
            remaining.insert(*p, high);
        }
    }
    if remaining.is_empty() {
        return Ok(Vec::new());
    }
    consumer.assign(&tpl)?;
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !remaining.is_empty() {
        anyhow::ensure!(std::time::Instant::now() < deadline, "timed out reading {topic}");
        let Some(m) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = m?;
        let headers = m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|x| {
                        (
                            x.key.to_owned(),
                            x.value
                                .map(|v| String::from_utf8_lossy(v).into_owned())
                                .unwrap_or_default(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(Record {
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            value: m.payload().map(<[u8]>::to_vec),
            headers,
        });
        if let Some(high) = remaining.get(&m.partition()) {
            if m.offset() + 1 >= *high {
                remaining.remove(&m.partition());
            }
        }
    }
    Ok(out)
}

/// A client that reads `group`'s committed offsets without joining it or committing.
fn group_reader(group: &str) -> Result<BaseConsumer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?)
}

/// Sum over the topics' partitions of (high watermark - committed offset of `group`).
/// A partition with no committed offset counts its whole high watermark.
pub fn committed_lag(group: &str, topics: &[&str]) -> Result<i64> {
    let consumer = group_reader(group)?;
    let mut tpl = TopicPartitionList::new();
    let mut highs = BTreeMap::new();
    for topic in topics {
        let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
        for t in md.topics().iter().filter(|t| t.name() == *topic) {
            for p in t.partitions() {
                let (_, high) = consumer.fetch_watermarks(topic, p.id(), Duration::from_secs(10))?;
                highs.insert((topic.to_string(), p.id()), high);
                tpl.add_partition(topic, p.id());
            }
        }
    }
    let committed = consumer.committed_offsets(tpl, Duration::from_secs(10))?;
    let mut lag = 0;
    for e in committed.elements() {
        let high = highs[&(e.topic().to_owned(), e.partition())];
        let c = match e.offset() {
            Offset::Offset(o) => o,
            _ => 0,
        };
        lag += (high - c).max(0);
    }
    Ok(lag)
}

/// The offset `group` committed on `topic`'s `partition` (the next one it will read), if any.
pub fn committed_offset(group: &str, topic: &str, partition: i32) -> Result<Option<i64>> {
    let consumer = group_reader(group)?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    let committed = consumer.committed_offsets(tpl, Duration::from_secs(10))?;
    Ok(committed.elements().first().and_then(|e| match e.offset() {
        Offset::Offset(o) => Some(o),
        _ => None,
    }))
}

/// Creates `topic` with `partitions`, a replica per broker and the given topic configs (e.g.
/// `max.message.bytes`); fails if it exists.
pub async fn create_topic(topic: &str, partitions: i32, configs: &[(&str, &str)]) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", brokers()).create()?;
    let new = configs.iter().fold(
        NewTopic::new(topic, partitions, TopicReplication::Fixed(replication())),
        |t, (k, v)| t.set(k, v),
    );
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for result in admin.create_topics([&new], &opts).await? {
        result.map_err(|(name, code)| anyhow::anyhow!("creating topic {name}: {code}"))?;
    }
    Ok(())
}
