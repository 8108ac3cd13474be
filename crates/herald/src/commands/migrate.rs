//! `herald migrate`: applies pending migrations as the schema owner, creates the attempt
//! partitions ahead and grants the runtime role what `herald run` needs. `herald run`
//! does the same at start-up when `database.migrate_on_start` is set.

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
    if let Some(role) = &config.database.runtime_role {
        println!("granted {role} what herald run needs, table by table (no DDL, no DELETE on the ledger)");
    }
    let upkeep = report
        .partitions
        .context("herald migrate: migrations applied, but the partition upkeep failed")?;
    for p in &upkeep.created {
        println!("created partition {p}");
    }
    for (p, n) in &upkeep.moved {
        println!("moved {n} attempt rows from the default partition into {p}");
    }
    Ok(())
}

/// Migrates as the schema owner (`database.owner_url`, else `url`), then grants the
/// runtime role (`database.runtime_role`) what `herald run` needs. Used by `herald migrate`
/// and by `herald run` at start-up (`database.migrate_on_start`).
pub async fn migrate_as_owner(config: &Config) -> anyhow::Result<MigrationReport> {
    let owner = Store::new(&config.owner_store())?;
    let keep_from = crate::retention::cutoffs(&config.retention, chrono::Utc::now()).attempts;
    let role = config.database.runtime_role.as_deref();
    let report = owner
        .migrate(config.database.attempt_partitions_ahead, keep_from, role)
        .await
        .with_context(|| match role {
            Some(role) => format!("migrating, then granting the runtime role {role}"),
            None => "migrating".to_owned(),
        })?;
    Ok(report)
}
