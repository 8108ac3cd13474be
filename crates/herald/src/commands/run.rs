use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;
use herald_store::Store;

use crate::config::Config;
use crate::shutdown::Shutdown;

#[derive(Args)]
pub struct RunArgs {
    /// Comma-separated roles to run in this process. Available: ingest.
    #[arg(long, value_delimiter = ',', default_value = "ingest")]
    roles: Vec<String>,
}

pub async fn run(config: Config, args: RunArgs) -> anyhow::Result<()> {
    for role in &args.roles {
        match role.as_str() {
            "ingest" => {}
            "relay" | "deliver" => bail!("role {role:?} is not available in this build yet"),
            other => bail!("unknown role {other:?}; available roles: ingest"),
        }
    }
    if config.routes.is_empty() {
        tracing::warn!("no routes configured: every order event will be skipped");
    }
    let config = Arc::new(config);
    let store = Store::new(&config.store())?;
    if config.database.migrate_on_start {
        let report = store
            .migrate(config.database.attempt_partitions_ahead)
            .await
            .context("migrations at start-up (database.migrate_on_start)")?;
        for m in report.applied {
            tracing::info!(migration = %m, "migration applied");
        }
    }
    let shutdown = Shutdown::install().context("installing signal handlers")?;
    tracing::info!(roles = ?args.roles, version = env!("CARGO_PKG_VERSION"), "herald started");
    crate::ingest::run(config, store, shutdown).await?;
    tracing::info!("herald stopped");
    Ok(())
}
