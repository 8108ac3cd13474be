//! `herald lag`: for both of Herald's consumer groups, per partition, the committed offset,
//! the log end, the lag and the age of the oldest message not yet committed (head of line).
//! Read from the cluster, so it works with no Herald process running.

use std::time::Duration;

use clap::Args;
use herald_kafka::inspect::{self, PartitionLag};

use crate::config::Config;

#[derive(Args)]
pub struct LagArgs {
    #[arg(long)]
    json: bool,
}

pub async fn run(config: &Config, args: LagArgs) -> anyhow::Result<()> {
    let groups = [
        (
            config.group(&config.ingest.group_id),
            vec![
                config.topic(&config.kafka.topics.order_events),
                config.topic(&config.kafka.topics.seller_profiles),
            ],
        ),
        (
            config.group(&config.delivery.group_id),
            vec![config.topic(&config.kafka.topics.deliveries)],
        ),
    ];
    let settings = config.kafka_settings();
    let rows: Vec<PartitionLag> = tokio::task::spawn_blocking(move || {
        let mut rows = Vec::new();
        for (group, topics) in &groups {
            let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
            rows.extend(inspect::group_lag(
                &settings,
                group,
                &topics,
                Duration::from_secs(10),
            )?);
        }
        Ok::<_, herald_kafka::KafkaError>(rows)
    })
    .await??;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "{:<22}  {:<24}  {:>4}  {:>10}  {:>10}  {:>8}  HEAD-OF-LINE AGE",
        "GROUP", "TOPIC", "PART", "COMMITTED", "END", "LAG"
    );
    for r in &rows {
        println!(
            "{:<22}  {:<24}  {:>4}  {:>10}  {:>10}  {:>8}  {}",
            r.group,
            r.topic,
            r.partition,
            r.committed.map_or("-".into(), |c| c.to_string()),
            r.log_end,
            r.lag,
            r.head_age_ms
                .map_or("-".into(), |ms| format!("{:.1}s", ms as f64 / 1000.0)),
        );
    }
    let total: i64 = rows.iter().map(|r| r.lag).sum();
    println!("total lag {total}");
    Ok(())
}
