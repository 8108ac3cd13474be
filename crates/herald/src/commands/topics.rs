//! `herald topics ensure`: creates Herald's topics that do not exist yet, with the partition
//! counts and replication factor of the configuration; existing topics are reported, never
//! changed.

use clap::Subcommand;
use herald_kafka::admin::{ensure_topics, TopicStatus};

use crate::config::Config;

#[derive(Subcommand)]
pub enum TopicsCommand {
    /// Create Herald's topics that do not exist yet (partition counts from config).
    Ensure,
}

pub async fn run(config: &Config, command: TopicsCommand) -> anyhow::Result<()> {
    match command {
        TopicsCommand::Ensure => {
            super::check_kafka(config).await?;
            let specs = config.topic_specs();
            let results = ensure_topics(&config.kafka_settings(), &specs).await?;
            for (name, status) in results {
                let wanted = specs.iter().find(|s| s.name == name).map(|s| s.partitions);
                match status {
                    TopicStatus::Created => println!("created {name} ({} partitions)", wanted.unwrap_or(0)),
                    TopicStatus::Exists { partitions } if Some(partitions) == wanted => {
                        println!("exists  {name} ({partitions} partitions)")
                    }
                    TopicStatus::Exists { partitions } => println!(
                        "exists  {name} ({partitions} partitions; config asks for {}: left unchanged)",
                        wanted.unwrap_or(0)
                    ),
                }
            }
            Ok(())
        }
    }
}
