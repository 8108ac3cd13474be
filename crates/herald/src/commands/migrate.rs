use anyhow::Context;
use herald_store::Store;

use crate::config::Config;

pub async fn run(config: &Config) -> anyhow::Result<()> {
    let store = Store::new(&config.store())?;
    let report = store
        .migrate(config.database.attempt_partitions_ahead)
        .await
        .context("herald migrate")?;
    if report.applied.is_empty() {
        println!("schema is up to date");
    }
    for m in &report.applied {
        println!("applied {m}");
    }
    for p in &report.partitions_created {
        println!("created partition {p}");
    }
    Ok(())
}
