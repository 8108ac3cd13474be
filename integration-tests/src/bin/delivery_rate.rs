//! `herald-delivery-rate [ORDERS] [IN_FLIGHT] [LATENCY_MS] [moto|standin]`: a quick
//! measurement of the delivery rate on the local stack (`make delivery-rate`). ORDERS order
//! events become two intents each (e-mail and SMS) and are published to `herald.deliveries`
//! first; then one `herald run --roles deliver` with `delivery.max_in_flight = IN_FLIGHT`
//! sends them, and the time from the first claim to the last record is measured. The
//! provider answers after LATENCY_MS: the stand-in of [`integration_tests::standin`]
//! (default), or moto behind a toxiproxy latency toxic (moto, one Python process, is then
//! the bound). Little's law bounds the rate at IN_FLIGHT / LATENCY. The full benchmark is
//! `make bench` (later issue).

use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use integration_tests::moto::MOTO;
use integration_tests::samples::UniqueSeller;
use integration_tests::toxiproxy::Proxy;
use integration_tests::{seed_orders, standin, wait_for, EnvOptions, TestEnv};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let orders: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(1000);
    let in_flight: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(64);
    let latency_ms: u64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(50);
    let provider = args.next().unwrap_or_else(|| "standin".into());
    let (endpoint, proxy) = match provider.as_str() {
        "moto" => {
            let proxy = Proxy::create(
                &format!("rate-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
                MOTO,
            )
            .await?;
            proxy
                .add_toxic(
                    "latency",
                    "latency",
                    "downstream",
                    serde_json::json!({"latency": latency_ms}),
                )
                .await?;
            (proxy.url(), Some(proxy))
        }
        "standin" => {
            let (addr, _) = standin::start(Duration::from_millis(latency_ms)).await?;
            (format!("http://{addr}"), None)
        }
        other => anyhow::bail!("provider {other:?}: expected moto or standin"),
    };
    let env = TestEnv::with_options(
        "deliveryrate",
        "",
        EnvOptions {
            aws_endpoint: Some(endpoint),
            on_unknown: "hold",
        },
    )
    .await?;
    let mut feed = env.spawn_roles("ingest,relay", "feed", &[])?;
    let seller = UniqueSeller::new();
    let ids: Vec<String> = (0..orders).map(|n| format!("r{n}")).collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    seed_orders(&env, &seller, &refs).await?;
    let intents = (orders * 2) as i64;
    env.wait_count(
        "intents created",
        "SELECT count(*) FROM notification_intents",
        intents,
        Duration::from_secs(300),
    )
    .await?;
    env.wait_count(
        "outbox published",
        "SELECT count(*) FROM outbox",
        0,
        Duration::from_secs(300),
    )
    .await?;
    feed.terminate(Duration::from_secs(30)).await?;
    println!(
        "delivery-rate: {intents} intents published to herald.deliveries; provider latency {latency_ms} ms"
    );

    let in_flight_env = in_flight.to_string();
    let started = Instant::now();
    let mut deliver = env.spawn_roles(
        "deliver",
        "deliver",
        &[
            ("HERALD_DELIVERY__MAX_IN_FLIGHT", &in_flight_env),
            ("HERALD_CHANNELS__EMAIL__RATE_PER_SECOND", "100000"),
            ("HERALD_CHANNELS__SMS__RATE_PER_SECOND", "100000"),
            ("HERALD_LOG__LEVEL", "warn"),
        ],
    )?;
    wait_for("every intent accepted", Duration::from_secs(600), || async {
        Ok((env
            .count("SELECT count(*) FROM notification_intents WHERE state = 'accepted'")
            .await?
            == intents)
            .then_some(()))
    })
    .await?;
    let elapsed = started.elapsed();
    let first_to_last: f64 = env
        .db
        .query_one("SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8 FROM notification_attempts", &[])
        .await?
        .get(0);
    let claim_to_record_ms: f64 = env
        .db
        .query_one(
            "SELECT 1000 * avg(extract(epoch FROM finished_at - started_at))::float8 FROM notification_attempts",
            &[],
        )
        .await?
        .get(0);
    println!("delivery-rate: mean time from claim commit to record commit: {claim_to_record_ms:.0} ms");
    ensure!(
        env.count("SELECT count(*) FROM notification_attempts").await? == intents,
        "one attempt per intent expected"
    );
    let limit = in_flight as f64 / (latency_ms as f64 / 1000.0);
    let rate = intents as f64 / first_to_last;
    println!(
        "delivery-rate: in_flight={in_flight}: {intents} sends in {first_to_last:.2}s from first claim to last record = {rate:.0}/s \
         ({:.0}% of the Little's-law limit {limit:.0}/s); {:.2}s including process start and group join",
        100.0 * rate / limit,
        elapsed.as_secs_f64()
    );
    deliver.terminate(Duration::from_secs(60)).await?;
    if let Some(p) = proxy {
        p.delete().await?;
    }
    env.cleanup().await;
    Ok(())
}
