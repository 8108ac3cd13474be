//! `herald-ingest-rate [EVENTS] [BATCH]`: a quick measurement of the ingest rate on the
//! local stack (`make ingest-rate`). In its own database and topic namespace it puts
//! EVENTS order events on the topic first (30% duplicates of earlier orders, two channels
//! each, 1,000 opted-in sellers), then starts one `herald run --roles ingest` with
//! `ingest.batch_max_messages = BATCH` and measures the time from start to lag 0.
//! The full benchmark suite, with limits and ratios, is `make bench` (later issue).

use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use futures::future::join_all;
use integration_tests::kafka::{committed_lag, producer};
use integration_tests::samples::{opted_in_seller, order_event};
use integration_tests::{wait_for, TestEnv};
use rdkafka::producer::FutureRecord;

const SELLERS: usize = 1000;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let events: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(20_000);
    let batch: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(500);
    let env = TestEnv::new("rate", "").await?;
    let p = producer()?;

    let seller_ids: Vec<String> = (0..SELLERS).map(|n| format!("seller-{n}")).collect();
    let sellers_topic = env.topic("seller-profiles");
    let profiles: Vec<(Vec<u8>, Vec<u8>)> = seller_ids
        .iter()
        .map(|s| {
            let p = opted_in_seller("acme", s, "en");
            (p.key(), p.value())
        })
        .collect();
    join_all(profiles.iter().map(|(k, v)| {
        p.send(
            FutureRecord::to(&sellers_topic).key(k).payload(v),
            Duration::from_secs(30),
        )
    }))
    .await;

    let unique = events * 7 / 10;
    let orders_topic = env.topic("order-events");
    let values: Vec<(String, Vec<u8>)> = (0..events)
        .map(|n| {
            let order = if n < unique { n } else { (n * 7919) % unique };
            let seller = &seller_ids[order % SELLERS];
            (
                format!("{order}"),
                order_event(
                    &format!("evt-{n}"),
                    "order.created",
                    "acme",
                    &format!("{order}"),
                    seller,
                    "129.90",
                ),
            )
        })
        .collect();
    for chunk in values.chunks(5000) {
        let sends = chunk.iter().map(|(k, v)| {
            p.send(
                FutureRecord::to(&orders_topic).key(k).payload(v),
                Duration::from_secs(60),
            )
        });
        for r in join_all(sends).await {
            ensure!(r.is_ok(), "produce failed: {:?}", r.err());
        }
    }
    println!(
        "ingest-rate: {events} order events ({unique} distinct orders) and {SELLERS} sellers on the topics"
    );

    let batch_env = batch.to_string();
    let started = Instant::now();
    let mut ingest = env.spawn_ingest("ingest", &[("HERALD_INGEST__BATCH_MAX_MESSAGES", &batch_env)])?;
    let group = env.group("herald-ingest");
    let topics = [orders_topic.as_str(), sellers_topic.as_str()];
    wait_for("ingest lag 0", Duration::from_secs(600), || async {
        Ok((committed_lag(&group, &topics)? == 0).then_some(()))
    })
    .await?;
    let elapsed = started.elapsed();
    let intents = env.count("SELECT count(*) FROM notification_intents").await?;
    ensure!(
        intents == (unique * 2) as i64,
        "expected {} intents, found {intents}",
        unique * 2
    );
    println!(
        "ingest-rate: batch_max_messages={batch}: {} messages to lag 0 in {:.2}s = {:.0} events/s ({intents} intents; includes process start, group join and the 1 s auto-commit interval)",
        events + SELLERS,
        elapsed.as_secs_f64(),
        (events + SELLERS) as f64 / elapsed.as_secs_f64()
    );
    ingest.terminate(Duration::from_secs(60)).await?;
    env.cleanup().await;
    Ok(())
}
