//! `herald-delivery-rate [ORDERS] [IN_FLIGHT] [LATENCY_MS] [moto|standin]`: one quick
//! delivery measurement on the local stack (`make delivery-rate`). ORDERS orders (two
//! intents each) are published to `herald.deliveries` first; then one
//! `herald run --roles deliver` with `delivery.max_in_flight = IN_FLIGHT` sends them. The
//! provider answers after LATENCY_MS: the stand-in (default) or moto behind a toxiproxy
//! latency toxic (moto, one Python process, is then the bound). Little's law bounds the
//! rate at IN_FLIGHT / LATENCY. The full comparison is `make bench`.

use std::time::Duration;

use anyhow::Result;
use herald_tools::bench::delivery;
use integration_tests::moto::MOTO;
use integration_tests::standin;
use integration_tests::toxiproxy::Proxy;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let orders: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(1000);
    let in_flight: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(64);
    let latency_ms: u64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(50);
    let provider = args.next().unwrap_or_else(|| "standin".into());
    let (endpoint, proxy) = match provider.as_str() {
        "moto" => {
            let name = format!("rate-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
            let proxy = Proxy::create(&name, MOTO).await?;
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
    let (env, intents) = delivery::prepare("deliveryrate", &endpoint, orders).await?;
    let (rate, usage) = delivery::herald(&env, intents, in_flight, 1, &[]).await?;
    let limit = in_flight as f64 / (latency_ms as f64 / 1000.0);
    println!(
        "delivery-rate: in_flight={in_flight}: {intents} sends at {rate:.0}/s from first claim to last record \
         ({:.0}% of the Little's-law limit {limit:.0}/s); peak RSS {:.0} MiB, {:.1} CPU s",
        100.0 * rate / limit,
        usage.peak_rss_mib,
        usage.cpu_seconds
    );
    if let Some(p) = proxy {
        p.delete().await?;
    }
    env.cleanup().await;
    Ok(())
}
