//! Ingest measurements on one workload: order events already on the topic, 30% duplicates,
//! 2% conflicting re-emissions, two channels per event, 1,000 opted-in sellers.
//!
//! - `limit_kafka`: a consumer that reads the topic and does nothing;
//! - `limit_pg`: the same rows written by Herald's own set-based statements, in batches of
//!   500, without Kafka;
//! - `naive`: one transaction and one synchronous offset commit per event, with the same
//!   statements (the straightforward at-least-once loop);
//! - `herald`: `herald run --roles ingest`, from process start to lag 0.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use futures::future::join_all;
use herald_core::render::{RenderOptions, Renderer};
use herald_core::{Channel, OrderEvent, SellerRecord};
use herald_store::ingest::SourceRef;
use herald_store::{IngestTx, NewIntent, Store};
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use rdkafka::{ClientConfig, Message};

use super::procstat::{self, Usage};
use integration_tests::kafka::{committed_lag, producer};
use integration_tests::samples::{opted_in_seller, order_event};
use integration_tests::{brokers, wait_for, TestEnv};

pub const SELLERS: usize = 1000;
const MAX_BYTES: usize = 64 * 1024;
const CHANNELS: [Channel; 2] = [Channel::Email, Channel::Sms];

/// What a workload of `events` holds.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    pub events: usize,
    pub distinct: usize,
    pub duplicates: usize,
    pub conflicts: usize,
    /// Line items per order event (`order.items`, with shipping details); 0: the sample
    /// event's order (total, currency, item count only).
    pub items: usize,
    /// Each event carries a W3C `traceparent` header, as from a traced producer (Herald
    /// then keeps a trace context with each intent).
    pub traced: bool,
}

impl Workload {
    pub fn new(events: usize) -> Self {
        let duplicates = events * 30 / 100;
        let conflicts = events * 2 / 100;
        Self {
            events,
            distinct: events - duplicates - conflicts,
            duplicates,
            conflicts,
            items: 0,
            traced: false,
        }
    }

    /// The same events, each with a `traceparent` header.
    pub fn traced(self) -> Self {
        Self { traced: true, ..self }
    }

    /// The same mix with `items` line items in each order event.
    pub fn with_items(self, items: usize) -> Self {
        Self { items, ..self }
    }

    /// Intents the workload converges on: two per distinct order.
    pub fn intents(&self) -> i64 {
        (self.distinct * 2) as i64
    }

    /// (key, value) of event `n`: distinct orders first, then duplicates (same content,
    /// new event id), then re-emissions of other orders with a changed total.
    fn event(&self, n: usize) -> (String, Vec<u8>) {
        let (order, total) = if n < self.distinct {
            (n, "129.90")
        } else if n < self.distinct + self.duplicates {
            ((n * 7919) % self.distinct, "129.90")
        } else {
            let k = n - self.distinct - self.duplicates;
            (
                (k * (self.distinct / self.conflicts.max(1))) % self.distinct,
                "130.00",
            )
        };
        let seller = format!("seller-{}", order % SELLERS);
        let id = order.to_string();
        let value = order_event(&format!("evt-{n}"), "order.created", "acme", &id, &seller, total);
        if self.items == 0 {
            return (id, value);
        }
        (id, with_items(&value, order, self.items))
    }

    pub fn events(&self) -> Vec<(String, Vec<u8>)> {
        (0..self.events).map(|n| self.event(n)).collect()
    }
}

/// `value` (an order event) with `items` line items of order number `order` and its
/// shipping details: what a marketplace's order event carries for a seller's e-mail.
fn with_items(value: &[u8], order: usize, items: usize) -> Vec<u8> {
    const NAMES: [&str; 6] = [
        "Organic cotton T-shirt, navy, size M",
        "Stainless steel water bottle 750 ml",
        "Recycled paper notebook A5, dotted",
        "Bamboo toothbrush, pack of 4",
        "Wool blend socks, grey, 39-42",
        "Ceramic pour-over coffee dripper",
    ];
    let mut v: serde_json::Value = serde_json::from_slice(value).expect("a sample event is JSON");
    let lines: Vec<serde_json::Value> = (0..items)
        .map(|k| {
            let n = order * 31 + k * 7;
            serde_json::json!({
                "sku": format!("SKU-{:05}-{:02}", n % 100_000, k),
                "name": NAMES[(order + k) % NAMES.len()],
                "quantity": 1 + n % 3,
                "unit_price": format!("{}.{:02}", 5 + n % 60, n % 100),
            })
        })
        .collect();
    let o = &mut v["order"];
    o["item_count"] = serde_json::json!(lines
        .iter()
        .map(|l| l["quantity"].as_u64().unwrap_or(1))
        .sum::<u64>());
    o["items"] = serde_json::Value::Array(lines);
    o["shipping"] = serde_json::json!({"method": "Standard, tracked", "ship_by": "2026-09-23",
                                       "city": "Lyon", "country": "FR"});
    v.to_string().into_bytes()
}

/// Seller profiles (key, value) of the workload.
pub fn sellers() -> Vec<(Vec<u8>, Vec<u8>)> {
    (0..SELLERS)
        .map(|n| {
            let s = format!("seller-{n}");
            let p = opted_in_seller("acme", &s, "en");
            (p.key(), p.value())
        })
        .collect()
}

/// Produces the sellers and then the events to the env's topics.
pub async fn fill(env: &TestEnv, w: &Workload) -> Result<()> {
    fill_sellers(env).await?;
    fill_events(env, w).await
}

/// Produces the workload's seller profiles.
pub async fn fill_sellers(env: &TestEnv) -> Result<()> {
    let p = producer()?;
    let sellers_topic = env.topic("seller-profiles");
    let profiles = sellers();
    for r in join_all(profiles.iter().map(|(k, v)| {
        p.send(
            FutureRecord::to(&sellers_topic).key(k).payload(v),
            Duration::from_secs(30),
        )
    }))
    .await
    {
        ensure!(r.is_ok(), "produce failed: {:?}", r.err());
    }
    Ok(())
}

/// Produces the workload's order events.
pub async fn fill_events(env: &TestEnv, w: &Workload) -> Result<()> {
    let p = producer()?;
    let orders_topic = env.topic("order-events");
    let events = w.events();
    for (c, chunk) in events.chunks(5000).enumerate() {
        let sends = chunk.iter().enumerate().map(|(i, (k, v))| {
            let mut record = FutureRecord::to(&orders_topic).key(k).payload(v);
            if w.traced {
                // One trace per order, one producer span per event.
                let span = (c * 5000 + i + 1) as u64;
                let trace = 0x4e7a_1d00_0000_0000_u128 + k.parse::<u128>().unwrap_or(0);
                let traceparent = format!("00-{trace:032x}-{span:016x}-01");
                record = record.headers(OwnedHeaders::new().insert(Header {
                    key: "traceparent",
                    value: Some(traceparent.as_str()),
                }));
            }
            p.send(record, Duration::from_secs(60))
        });
        for r in join_all(sends).await {
            ensure!(r.is_ok(), "produce failed: {:?}", r.err());
        }
    }
    Ok(())
}

pub(super) fn store(env: &TestEnv) -> Result<Store> {
    env.store(4)
}

/// The order events in `values`, decoded as ingest decodes them.
pub(super) fn decode(values: &[&[u8]]) -> Result<Vec<OrderEvent>> {
    values
        .iter()
        .map(|v| OrderEvent::decode(v, MAX_BYTES))
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("decode: {}", e.detail))
}

/// The intents of `events` (both channels), rendered as ingest renders them, with the
/// profiles and templates read in `tx`; `first` numbers their source offsets.
pub(super) async fn render<'e>(
    tx: &IngestTx<'_>,
    events: &'e [OrderEvent],
    first: i64,
) -> Result<Vec<NewIntent<'e>>> {
    let keys: Vec<(String, String)> = events
        .iter()
        .map(|e| (e.marketplace_id.clone(), e.seller_id.clone()))
        .collect();
    let profiles = tx.sellers(&keys).await?;
    let renderer = Renderer::new(
        tx.active_templates().await?,
        RenderOptions {
            default_locale: "en".into(),
            sms_max_segments: 3,
        },
    );
    let mut intents = Vec::with_capacity(events.len() * 2);
    for (i, e) in events.iter().enumerate() {
        let seller = profiles.get(&(e.marketplace_id.clone(), e.seller_id.clone()));
        for channel in CHANNELS {
            let payload = renderer
                .render("order_created", channel, e, seller)
                .map_err(|e| anyhow::anyhow!("render: {e}"))?;
            let source = SourceRef {
                topic: "bench".into(),
                partition: 0,
                offset: first + i as i64,
            };
            intents.push(NewIntent::new(e, channel, payload, None, source));
        }
    }
    Ok(intents)
}

/// Converges `values` (order events) in one transaction with Herald's statements; `first`
/// numbers their source offsets.
async fn converge(store: &Store, values: &[&[u8]], first: i64) -> Result<()> {
    let events = decode(values)?;
    let mut conn = store.conn().await?;
    let tx = IngestTx::begin(&mut conn).await?;
    let intents = render(&tx, &events, first).await?;
    tx.converge(&intents).await?;
    tx.commit().await?;
    Ok(())
}

/// The workload's seller profiles, written directly (untimed set-up).
pub(super) async fn apply_sellers(store: &Store) -> Result<()> {
    let records: Vec<SellerRecord> = sellers()
        .iter()
        .map(|(k, v)| SellerRecord::decode(Some(k), Some(v), MAX_BYTES))
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("seller: {}", e.detail))?;
    let mut conn = store.conn().await?;
    let tx = IngestTx::begin(&mut conn).await?;
    tx.apply_sellers(records).await?;
    tx.commit().await?;
    Ok(())
}

/// Reads every event of the env's order topic and does nothing with them; events/s.
pub async fn limit_kafka(env: &TestEnv, w: &Workload) -> Result<f64> {
    let consumer = reader(&format!("{}bench-limit", env.prefix), &env.topic("order-events"))?;
    let started = Instant::now();
    for _ in 0..w.events {
        consumer.recv().await?;
    }
    Ok(w.events as f64 / started.elapsed().as_secs_f64())
}

pub(super) fn reader(group: &str, topic: &str) -> Result<StreamConsumer> {
    let c: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()?;
    c.subscribe(&[topic])?;
    Ok(c)
}

/// The workload's rows written by Herald's statements in batches of 500, no Kafka;
/// events/s (sellers applied first, untimed).
pub async fn limit_pg(env: &TestEnv, w: &Workload) -> Result<f64> {
    let store = store(env)?;
    apply_sellers(&store).await?;
    let events = w.events();
    let values: Vec<&[u8]> = events.iter().map(|(_, v)| v.as_slice()).collect();
    let started = Instant::now();
    for (i, chunk) in values.chunks(500).enumerate() {
        converge(&store, chunk, (i * 500) as i64).await?;
    }
    let rate = w.events as f64 / started.elapsed().as_secs_f64();
    let intents = env.count("SELECT count(*) FROM notification_intents").await?;
    ensure!(
        intents == w.intents(),
        "limit_pg: {intents} intents, expected {}",
        w.intents()
    );
    Ok(rate)
}

/// One transaction and one synchronous offset commit per event, over the first `n` events
/// of the topic (sellers written first, untimed); events/s.
pub async fn naive(env: &TestEnv, n: usize) -> Result<f64> {
    let store = store(env)?;
    apply_sellers(&store).await?;
    let consumer = reader(&format!("{}bench-naive", env.prefix), &env.topic("order-events"))?;
    let started = Instant::now();
    for i in 0..n {
        let m = consumer.recv().await?;
        converge(&store, &[m.payload().context("no payload")?], i as i64).await?;
        consumer.commit_message(&m, CommitMode::Sync)?;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// `herald run --roles ingest` x `instances`: events/s from start to lag 0, and the first
/// instance's resource use.
pub async fn herald(env: &TestEnv, w: &Workload, instances: usize) -> Result<IngestRun> {
    herald_with(env, w, instances, &[]).await
}

/// [`herald`] with `extra` settings for every process (Kafka through SASL_SSL, say).
pub async fn herald_with(
    env: &TestEnv,
    w: &Workload,
    instances: usize,
    extra: &[(&str, &str)],
) -> Result<IngestRun> {
    let started = Instant::now();
    let mut procs = Vec::new();
    let mut admin = Vec::new();
    for i in 0..instances {
        // A port of its own for /metrics (the log, at warn, does not name an ephemeral one).
        let addr = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .to_string();
        let mut vars = vec![
            ("HERALD_LOG__LEVEL", "warn"),
            ("HERALD_ADMIN__LISTEN", addr.as_str()),
        ];
        vars.extend_from_slice(extra);
        procs.push(env.spawn_ingest(&format!("ingest-{i}"), &vars)?);
        admin.push(addr);
    }
    let group = env.group("herald-ingest");
    let topics = [env.topic("order-events"), env.topic("seller-profiles")];
    let refs: Vec<&str> = topics.iter().map(String::as_str).collect();
    wait_for("ingest lag 0", Duration::from_secs(3600), || async {
        Ok((committed_lag(&group, &refs)? == 0).then_some(()))
    })
    .await?;
    let rate = (w.events + SELLERS) as f64 / started.elapsed().as_secs_f64();
    let usage = procstat::usage(procs[0].pid().context("ingest exited")?)?;
    let metrics = integration_tests::http::scrape(&admin[0]).await?;
    let commit_p99_ms = histogram_quantile(&metrics, "herald_ingest_commit_duration_seconds", 0.99)? * 1000.0;
    for mut p in procs {
        p.terminate(Duration::from_secs(60)).await?;
    }
    let intents = env.count("SELECT count(*) FROM notification_intents").await?;
    ensure!(
        intents == w.intents(),
        "herald: {intents} intents, expected {}",
        w.intents()
    );
    Ok(IngestRun {
        rate,
        usage,
        commit_p99_ms,
    })
}

/// One `herald run --roles ingest` measurement.
#[derive(Debug, Clone, Copy)]
pub struct IngestRun {
    /// Events (and seller profiles) per second, from process start to lag 0.
    pub rate: f64,
    /// The first process's peak RSS and CPU.
    pub usage: Usage,
    /// The first process's ingest commit p99, from its histogram as Prometheus's
    /// `histogram_quantile` computes it (linear within a bucket).
    pub commit_p99_ms: f64,
}

/// `q` of the histogram `name` (unlabelled) in a Prometheus text exposition, linear
/// within the bucket it falls in, as `histogram_quantile` does.
pub fn histogram_quantile(text: &str, name: &str, q: f64) -> Result<f64> {
    let prefix = format!("{name}_bucket{{");
    let mut buckets: Vec<(f64, f64)> = text
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            let count: f64 = l.rsplit(' ').next()?.parse().ok()?;
            Some((le, count))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last().map_or(0.0, |b| b.1);
    ensure!(total > 0.0, "no observations of {name}");
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for (le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return Ok(lower);
            }
            return Ok(lower + (le - lower) * (rank - below) / (count - below).max(f64::MIN_POSITIVE));
        }
        (lower, below) = (le, count);
    }
    Ok(lower)
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;

    #[test]
    fn histogram_quantile_interpolates_within_the_bucket() {
        let text = "x_bucket{le=\"0.1\"} 50\nx_bucket{le=\"0.2\"} 90\nx_bucket{le=\"0.4\"} 100\nx_bucket{le=\"+Inf\"} 100\n";
        assert!((histogram_quantile(text, "x", 0.5).unwrap() - 0.1).abs() < 1e-9);
        assert!((histogram_quantile(text, "x", 0.7).unwrap() - 0.15).abs() < 1e-9);
        assert!((histogram_quantile(text, "x", 0.95).unwrap() - 0.3).abs() < 1e-9);
        assert!(histogram_quantile("", "x", 0.5).is_err());
    }

    #[test]
    fn the_workload_has_the_stated_mix() {
        let w = Workload::new(10_000);
        assert_eq!((w.distinct, w.duplicates, w.conflicts), (6_800, 3_000, 200));
        let mut totals: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (key, value) in w.events() {
            let v: serde_json::Value = serde_json::from_slice(&value).unwrap();
            totals
                .entry(key)
                .or_default()
                .insert(v["order"]["total"].as_str().unwrap().to_owned());
        }
        assert_eq!(totals.len(), w.distinct, "distinct orders");
        let conflicting = totals.values().filter(|t| t.len() > 1).count();
        assert_eq!(conflicting, w.conflicts, "each re-emission changes another order");
    }
}
