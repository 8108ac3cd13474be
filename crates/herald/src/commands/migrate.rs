use anyhow::Context;
use herald_store::migrate::MigrationReport;
use herald_store::Store;

use crate::config::Config;

pub async fn run(config: &Config) -> anyhow::Result<()> {
    let report = migrate_as_owner(config).await.context("herald migrate")?;
    if report.applied.is_empty() {
        println!("schema is up to date");
    }
    for m in &report.applied {
        println!("applied {m}");
    }
    for p in &report.partitions_created {
        println!("created partition {p}");
    }
    if let Some(role) = &config.database.runtime_role {
        println!("granted {role} read and write on the tables (no DDL)");
    }
    Ok(())
}

/// Migrates as the schema owner (`database.owner_url`, else `url`), then grants the
/// runtime role (`database.runtime_role`) what `herald run` needs. Used by `herald migrate`
/// and by `herald run` at start-up (`database.migrate_on_start`).
pub async fn migrate_as_owner(config: &Config) -> anyhow::Result<MigrationReport> {
    let owner = Store::new(&config.owner_store())?;
    let report = owner.migrate(config.database.attempt_partitions_ahead).await?;
    if let Some(role) = &config.database.runtime_role {
        owner
            .grant_runtime(role)
            .await
            .with_context(|| format!("granting the runtime role {role}"))?;
    }
    Ok(report)
}
