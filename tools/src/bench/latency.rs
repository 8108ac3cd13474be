//! End to end, from an order event produced to its attempts `accepted` recorded, with
//! ingest, relay and deliver in one process at a fixed offered rate: the percentiles over
//! every notification (from the ledger), where the time goes hop by hop (from the spans
//! of a sampled share of the traces, sent to an OTLP sink), and what the stretch cost the
//! whole machine ([`super::cost`]).
//!
//! Each run starts as a running deployment would be: a ledger with history, analyzed, just
//! checkpointed ([`integration_tests::history::history`]), and Herald past its first seconds ([`WARMUP_SECONDS`] at the
//! offered rate, reported apart). The driver's producer is connected before the first
//! event is stamped, so its start-up is not counted as Herald's latency.
//!
//! Herald runs with its default settings for every knob on the path (ingest batch and
//! linger, relay poll, pool, lease and sweep, provider timeouts), not the test suite's:
//! the figures are what a deployment gets. Two exceptions: logs at `warn` (the driver's
//! log files are not what is measured) and no channel rate limit (the measured rates are
//! below it, and its reservations are not what is measured).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use chrono::Utc;
use futures::future::join_all;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::{json, Value};
use uuid::Uuid;

use super::cost::{Cost, Meter};
use super::delivery::UNTHROTTLED;
use integration_tests::history::history;
use integration_tests::kafka::producer_connected;
use integration_tests::otlp::{OtlpSink, SpanSeen};
use integration_tests::samples::UniqueSeller;
use integration_tests::{seed_orders, EnvOptions, TestEnv};

/// The share of traces Herald exports for the breakdown: enough for percentiles, little
/// enough that exporting does not weigh on what is measured.
const TRACE_RATIO: f64 = 0.1;

/// `HERALD_BENCH_TRACE_RATIO` (above 0, at most 1), else [`TRACE_RATIO`]: 1.0 measures the
/// cost of exporting every span, as Herald does in front of the tail-sampling collector.
/// Not 0: the hops are measured from the traced share.
pub fn trace_ratio() -> Result<f64> {
    match std::env::var("HERALD_BENCH_TRACE_RATIO") {
        Ok(v) => {
            let r: f64 = v
                .parse()
                .with_context(|| format!("HERALD_BENCH_TRACE_RATIO={v:?}"))?;
            ensure!(
                r > 0.0 && r <= 1.0,
                "HERALD_BENCH_TRACE_RATIO={r}: not above 0 and at most 1"
            );
            Ok(r)
        }
        Err(_) => Ok(TRACE_RATIO),
    }
}

/// The hops of one notification's path, in order; their sum is the end-to-end time.
///
/// The markers are span starts and ends, and some overlap by a little: the intent span
/// ends after its batch's commit and post-commit reporting, while the relay may already be
/// publishing; a relay round's `send` spans all end when its last message is acknowledged,
/// while the first may already be taken. A hop's low percentiles can then be slightly
/// negative; the sum stays the path.
pub const HOPS: [(&str, &str); 7] = [
    ("ingest wait", "event produced -> ingest starts its batch (produce, fetch, batch linger)"),
    ("ingest", "render, converge, commit and report the batch"),
    ("relay", "batch reported -> the relay's produce to the deliveries topic acknowledged (wake-up, claim, publish)"),
    ("deliveries to take", "acknowledged -> the delivery consumer takes the message (fetch, lane and pipeline room)"),
    ("claim and slot", "taken -> provider call starts (claim batch, rate, send slot)"),
    ("provider call", "the SES or SNS request"),
    ("record", "provider answered -> attempt recorded and the message done"),
];

/// Notifications already in the ledger when a run starts: a deployment's tables are not
/// empty, and PostgreSQL plans a statement for the table sizes it sees when it first caches
/// the plan. On a fresh database it caches plans made for empty tables (a sequential scan
/// of the attempts partition per record), which autovacuum's next ANALYZE would replace a
/// minute later, after a 20-second run is over. The measured figures are those of a
/// ledger with history, analyzed: what a running deployment has.
const HISTORY_NOTIFICATIONS: i64 = 200_000;

/// Seconds at the offered rate after Herald's start, before the measured stretch: the
/// measured figures are those of a running process, and the start's are reported apart.
pub const WARMUP_SECONDS: u64 = 5;

/// After the measured stretch, how long the bench reads each process's CPU with no events
/// arriving (Herald still running).
const IDLE_WINDOW: Duration = Duration::from_secs(20);

/// One run's results.
#[derive(Debug, Clone)]
pub struct Run {
    pub offered: f64,
    pub events: usize,
    pub notifications: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Per hop (in [`HOPS`] order), each traced notification's milliseconds.
    pub hops: Vec<Vec<f64>>,
    /// The ingest hop by stage (`herald.ingest.stage` spans under the batch's `receive`
    /// span, in the order they ran) of each traced notification whose batch was traced
    /// too (its `receive` span is sampled apart): [`by_stage`] sums them up.
    pub traced_stages: Vec<Vec<(String, f64)>>,
    /// Each traced notification's whole path (the sum of its hops), to compare with the
    /// ledger's percentiles: the traced share is whole batches, so its tail can differ.
    pub traced_paths: Vec<f64>,
    pub traced: usize,
    /// The first [`WARMUP_SECONDS`] at the offered rate after Herald started (not in the
    /// measured figures): the percentiles of a start.
    pub warmup_p50_ms: f64,
    pub warmup_p99_ms: f64,
    /// The three seconds (UTC, produced) with the highest p99: (time, notifications, p99 ms).
    pub slowest_seconds: Vec<(String, i64, f64)>,
    pub cost: Cost,
}

impl Run {
    pub fn to_json(&self) -> Value {
        json!({
            "offered_events_per_s": self.offered,
            "events": self.events,
            "notifications": self.notifications,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "traced_notifications": self.traced,
            "warmup_seconds": WARMUP_SECONDS,
            "warmup_p50_ms": self.warmup_p50_ms,
            "warmup_p99_ms": self.warmup_p99_ms,
            "slowest_seconds": self.slowest_seconds.iter().map(|(t, n, p99)| json!({
                "second_utc": t, "notifications": n, "p99_ms": p99})).collect::<Vec<_>>(),
            "traced_p50_ms": percentile(&self.traced_paths, 0.5),
            "traced_p99_ms": percentile(&self.traced_paths, 0.99),
            "hops": HOPS.iter().zip(&self.hops).map(|((name, what), v)| json!({
                "hop": name, "what": what, "p50_ms": percentile(v, 0.5), "p99_ms": percentile(v, 0.99)})).collect::<Vec<_>>(),
            "ingest_stages": by_stage(self.traced_stages.iter().map(Vec::as_slice)).iter().map(|(stage, v)| json!({
                "stage": stage, "notifications": v.len(), "p50_ms": percentile(v, 0.5), "p99_ms": percentile(v, 0.99)})).collect::<Vec<_>>(),
            "cost": self.cost.to_json(self.notifications as f64),
        })
    }
}

/// The `q` quantile of `values` (nearest rank), NaN when empty.
pub fn percentile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// Offers `rate` order events per second for `seconds`, two notifications each, and
/// waits until every one is accepted.
pub async fn run(endpoint: &str, rate: f64, seconds: u64) -> Result<Run> {
    let sink = OtlpSink::start().await?;
    let telemetry = format!(
        "[telemetry]\ntraces_endpoint = \"{}\"\nsampling_ratio = {}\n",
        sink.traces_endpoint(),
        trace_ratio()?
    );
    let env = TestEnv::with_options(
        "latency",
        &telemetry,
        EnvOptions {
            aws_endpoint: Some(endpoint.to_owned()),
            on_unknown: "hold",
            ..EnvOptions::default()
        },
    )
    .await?;
    history(&env, HISTORY_NOTIFICATIONS).await?;
    let mut vars: Vec<(&str, &str)> = UNTHROTTLED.to_vec();
    vars.extend([
        // The test suite's faster settings, back to Herald's defaults.
        ("HERALD_INGEST__BATCH_MAX_MESSAGES", "500"),
        ("HERALD_RELAY__POLL_INTERVAL_MS", "1000"),
        ("HERALD_DATABASE__POOL_SIZE", "16"),
        ("HERALD_DELIVERY__LEASE_SECS", "60"),
        ("HERALD_DELIVERY__SWEEP_INTERVAL_MS", "5000"),
        ("HERALD_DELIVERY__DRAIN_TIMEOUT_MS", "15000"),
        ("HERALD_AWS__ATTEMPT_TIMEOUT_MS", "10000"),
        ("HERALD_AWS__CONNECT_TIMEOUT_MS", "2000"),
        // Spans leave every 200 ms, and none is dropped for a full queue.
        ("OTEL_BSP_SCHEDULE_DELAY", "200"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "65536"),
    ]);
    let herald = env.spawn_roles("ingest,relay,deliver", "herald", &vars)?;
    // One order through the whole path first: the consumer groups have joined, the
    // connections are open. It is not among the measured ones (their ids start with `l`).
    let seller = UniqueSeller::new();
    seed_orders(&env, &seller, &["warm-up"]).await?;
    env.wait_count(
        "the warm-up order's notifications accepted",
        "SELECT count(*) FROM notification_intents WHERE marketplace_id = 'acme' AND state = 'accepted'",
        2,
        Duration::from_secs(120),
    )
    .await?;
    // One producer for both stretches, connected before the first event is stamped: a new
    // one spends its first few hundred milliseconds on the broker's metadata and its
    // producer id, and the first tick's events would carry that wait as Herald's latency
    // (the runs before 2026-12-05 04:10 did: their p99 was mostly that).
    let p = producer_connected(&env.topic("order-events")).await?;
    // Then the offered rate for a while, unmeasured but reported: the first seconds after
    // a start pay for opening the pool's connections and the provider's, and for the
    // first changes of pages since the checkpoint.
    offer(&env, &p, rate, WARMUP_SECONDS, "s").await?;
    let warmup = ledger_percentiles(&env, "s").await?;
    let pid = herald.pid().into_iter().collect::<Vec<_>>();
    let mut meter = Meter::start(&env.database, &pid).await?;
    let events = offer(&env, &p, rate, seconds, "l").await?;
    let notifications = events * 2;
    meter.stretch_done()?;
    meter.idle(IDLE_WINDOW).await?;
    let mut herald = herald;
    herald.terminate(Duration::from_secs(30)).await?;
    let cost = meter.end().await?;
    let measured = ledger_percentiles(&env, "l").await?;
    let slowest_seconds = slowest_seconds(&env, "l").await?;
    let produced: HashMap<Uuid, f64> = env
        .db
        .query(
            "SELECT id, 1000 * extract(epoch FROM occurred_at)::float8 FROM notification_intents WHERE marketplace_id = 'acme' AND order_id LIKE 'l%'",
            &[],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let received = sink
        .settled(Duration::from_secs(2), Duration::from_secs(60))
        .await?;
    let index = SpanIndex::new(&received.traces);
    let traced: Vec<Traced> = received
        .traces
        .values()
        .flat_map(|spans| hops_of_trace(spans, &index, &produced))
        .collect();
    let paths: Vec<[f64; HOPS.len()]> = traced.iter().map(|(p, _)| *p).collect();
    let traced_stages = traced.into_iter().map(|(_, s)| s).collect();
    env.cleanup().await;
    ensure!(
        !paths.is_empty(),
        "no traced notification's whole path reached the OTLP sink ({} spans in {} traces)",
        received.spans,
        received.traces.len()
    );
    let hops = (0..HOPS.len())
        .map(|h| paths.iter().map(|p| p[h]).collect())
        .collect();
    Ok(Run {
        offered: rate,
        events,
        notifications,
        p50_ms: measured.0,
        p99_ms: measured.1,
        hops,
        traced_stages,
        traced_paths: paths.iter().map(|p| p.iter().sum()).collect(),
        traced: paths.len(),
        warmup_p50_ms: warmup.0,
        warmup_p99_ms: warmup.1,
        slowest_seconds,
        cost,
    })
}

/// Offers `rate` order events a second for `seconds` (order ids `prefix` and a number)
/// and waits until all their notifications are accepted. Returns the events produced.
async fn offer(env: &TestEnv, p: &FutureProducer, rate: f64, seconds: u64, prefix: &str) -> Result<usize> {
    let events = produce_paced(env, p, rate, seconds, prefix).await?;
    env.wait_count(
        &format!("the notifications of the orders {prefix}* accepted"),
        &format!(
            "SELECT count(*) FROM notification_intents
             WHERE marketplace_id = 'acme' AND order_id LIKE '{prefix}%' AND state = 'accepted'"
        ),
        (events * 2) as i64,
        Duration::from_secs(300),
    )
    .await?;
    Ok(events)
}

/// The ledger's latency of each notification of the orders `$1*`: when its event was
/// produced (`produced`, UTC) and the milliseconds from then to its attempt `accepted`
/// recorded (`ms`).
const LEDGER_LATENCY: &str = "SELECT i.occurred_at AT TIME ZONE 'UTC' AS produced,
            1000 * extract(epoch FROM a.finished_at - i.occurred_at)::float8 AS ms
     FROM notification_attempts a JOIN notification_intents i ON i.id = a.intent_id
     WHERE a.outcome = 'accepted' AND i.marketplace_id = 'acme' AND i.order_id LIKE $1::text || '%'";

/// The ledger's p50 and p99 (ms) over the notifications of the orders `prefix*`.
async fn ledger_percentiles(env: &TestEnv, prefix: &str) -> Result<(f64, f64)> {
    let r = env
        .db
        .query_one(
            &format!(
                "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)
                 FROM ({LEDGER_LATENCY}) t"
            ),
            &[&prefix],
        )
        .await?;
    Ok((r.get(0), r.get(1)))
}

/// The three seconds (by when the events were produced) whose notifications waited
/// longest, as (time UTC, notifications, p99 ms): to line up with PostgreSQL's log
/// (autovacuum, checkpoints), the JVM's or Herald's own.
async fn slowest_seconds(env: &TestEnv, prefix: &str) -> Result<Vec<(String, i64, f64)>> {
    Ok(env
        .db
        .query(
            &format!(
                "SELECT to_char(date_trunc('second', produced), 'HH24:MI:SS'), count(*),
                        percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)
                 FROM ({LEDGER_LATENCY}) t GROUP BY 1 ORDER BY 3 DESC LIMIT 3"
            ),
            &[&prefix],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect())
}

/// Produces `rate * seconds` orders of one seller (ids `prefix` and a number), in ticks of 50 ms: each tick's events
/// (those due by its end) at once, then a sleep to the next tick, so the offered rate
/// holds whatever the produce latency. `occurred_at` is the moment of producing.
async fn produce_paced(
    env: &TestEnv,
    p: &FutureProducer,
    rate: f64,
    seconds: u64,
    prefix: &str,
) -> Result<usize> {
    let topic = env.topic("order-events");
    let total = (rate * seconds as f64) as usize;
    let tick = Duration::from_millis(50);
    let started = Instant::now();
    let mut sent = 0;
    let mut n = 0u64;
    let mut ticks = 0u32;
    while sent < total {
        // What is due by the end of this tick, whatever the earlier ticks' rounding.
        ticks += 1;
        let due = ((rate * (tick * ticks).as_secs_f64()).round() as usize).min(total);
        let values: Vec<(String, Vec<u8>)> = (0..due.saturating_sub(sent))
            .map(|_| {
                n += 1;
                let order = format!("{prefix}{n}");
                let now = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
                let v = json!({"event_id": format!("evt-{order}"), "event_kind": "order.created",
                    "marketplace_id": "acme", "order_id": order, "seller_id": "seller-1",
                    "occurred_at": now, "produced_at": now,
                    "order": {"total": "12.00", "currency": "EUR", "item_count": 1}});
                (order, v.to_string().into_bytes())
            })
            .collect();
        let sends = values.iter().map(|(k, v)| {
            p.send(
                FutureRecord::to(&topic).key(k).payload(v),
                Duration::from_secs(30),
            )
        });
        for r in join_all(sends).await {
            ensure!(r.is_ok(), "produce failed: {:?}", r.err());
        }
        sent += values.len();
        tokio::time::sleep((tick * ticks).saturating_sub(started.elapsed())).await;
    }
    Ok(total)
}

/// One traced notification: its hops (in [`HOPS`] order, ms) and its batch's ingest
/// stages, when that batch was traced too.
type Traced = ([f64; HOPS.len()], Vec<(String, f64)>);

/// Every received span by id, and each span's children, across traces: a `process` span
/// and the batch `receive` span it links to are in different traces.
struct SpanIndex<'a> {
    by_id: HashMap<&'a str, &'a SpanSeen>,
    children: HashMap<&'a str, Vec<&'a SpanSeen>>,
}

impl<'a> SpanIndex<'a> {
    fn new(traces: &'a std::collections::BTreeMap<String, Vec<SpanSeen>>) -> Self {
        let mut by_id = HashMap::new();
        let mut children: HashMap<&str, Vec<&SpanSeen>> = HashMap::new();
        for s in traces.values().flatten() {
            by_id.insert(s.span_id.as_str(), s);
            children.entry(s.parent_span_id.as_str()).or_default().push(s);
        }
        Self { by_id, children }
    }

    fn child(&self, parent: &SpanSeen, prefix: &str) -> Option<&'a SpanSeen> {
        self.children
            .get(parent.span_id.as_str())?
            .iter()
            .copied()
            .find(|s| s.name.starts_with(prefix))
    }

    /// The ingest stages of the batch `process` was converged in (the `receive` span it
    /// links to), in the order they ran, with their milliseconds; empty when that batch's
    /// spans were not sampled.
    fn ingest_stages(&self, process: &SpanSeen) -> Vec<(String, f64)> {
        let Some(batch) = process.links.iter().find_map(|l| self.by_id.get(l.as_str())) else {
            return Vec::new();
        };
        let mut stages: Vec<&SpanSeen> = self
            .children
            .get(batch.span_id.as_str())
            .into_iter()
            .flatten()
            .copied()
            .filter(|s| s.attributes.contains_key(STAGE))
            .collect();
        stages.sort_by_key(|s| s.start_ns);
        stages
            .iter()
            .map(|s| (s.attributes[STAGE].clone(), (s.end_ns - s.start_ns) as f64 / 1e6))
            .collect()
    }
}

/// The attribute naming an ingest stage's span.
const STAGE: &str = "herald.ingest.stage";

/// Per stage (in the order they run), every notification's milliseconds in it; a stage a
/// notification's batch did not run (`profiles` without seller records) counts 0 for it.
pub fn by_stage<'s>(notifications: impl Iterator<Item = &'s [(String, f64)]>) -> Vec<(String, Vec<f64>)> {
    let notifications: Vec<&[(String, f64)]> = notifications.filter(|s| !s.is_empty()).collect();
    let mut order: Vec<String> = Vec::new();
    for stages in &notifications {
        // Merged in the order each batch ran them: a stage only some batches run lands
        // between its neighbours.
        let mut at = 0;
        for (stage, _) in stages.iter() {
            match order.iter().position(|s| s == stage) {
                Some(i) => at = i + 1,
                None => {
                    order.insert(at, stage.clone());
                    at += 1;
                }
            }
        }
    }
    order
        .into_iter()
        .map(|stage| {
            let v = notifications
                .iter()
                .map(|s| s.iter().filter(|(n, _)| *n == stage).map(|(_, ms)| ms).sum())
                .collect();
            (stage, v)
        })
        .collect()
}

/// Each notification's hops in one trace: the path from the order's `process` span
/// through its `intent created`, the relay's `send`, the delivery consumer's `process`,
/// the `attempt` and the provider call; and its ingest hop by stage, when its batch was
/// traced. A notification whose path is incomplete (a span still in an exporter's queue)
/// is left out.
fn hops_of_trace(spans: &[SpanSeen], index: &SpanIndex<'_>, produced_ms: &HashMap<Uuid, f64>) -> Vec<Traced> {
    let ms = |ns: u64| ns as f64 / 1e6;
    spans
        .iter()
        // The intent's span is renamed after the commit by what became of it.
        .filter(|s| s.name == "intent created")
        .filter_map(|intent| {
            let id: Uuid = intent.attributes.get("herald.intent.id")?.parse().ok()?;
            let produced = *produced_ms.get(&id)?;
            let ingest = index.by_id.get(intent.parent_span_id.as_str())?;
            let send = index.child(intent, "send ")?;
            let take = index.child(send, "process ")?;
            let attempt = index.child(take, "attempt")?;
            let call = index
                .child(attempt, "SES SendEmail")
                .or_else(|| index.child(attempt, "SNS Publish"))?;
            Some((
                [
                    ms(ingest.start_ns) - produced,
                    ms(intent.end_ns) - ms(ingest.start_ns),
                    ms(send.end_ns) - ms(intent.end_ns),
                    ms(take.start_ns) - ms(send.end_ns),
                    ms(call.start_ns) - ms(take.start_ns),
                    ms(call.end_ns) - ms(call.start_ns),
                    ms(take.end_ns) - ms(call.end_ns),
                ],
                index.ingest_stages(ingest),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
        assert!(percentile(&[], 0.5).is_nan());
    }

    #[test]
    fn stages_keep_the_order_they_ran_in_and_a_skipped_one_counts_zero() {
        let s = |v: &[(&str, f64)]| v.iter().map(|(n, ms)| ((*n).to_owned(), *ms)).collect::<Vec<_>>();
        let without = s(&[("connection", 1.0), ("sellers", 2.0), ("commit", 3.0)]);
        let with = s(&[
            ("connection", 1.0),
            ("profiles", 5.0),
            ("sellers", 2.0),
            ("commit", 4.0),
        ]);
        let stages = by_stage([without.as_slice(), &[], with.as_slice()].into_iter());
        let names: Vec<&str> = stages.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["connection", "profiles", "sellers", "commit"]);
        assert_eq!(
            stages[1].1,
            [0.0, 5.0],
            "one value per traced batch's notification"
        );
        assert_eq!(stages[3].1, [3.0, 4.0]);
    }
}
