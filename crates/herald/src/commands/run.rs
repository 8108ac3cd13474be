use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;
use herald_store::Store;

use crate::config::Config;
use crate::shutdown::Shutdown;

#[derive(Args)]
pub struct RunArgs {
    /// Comma-separated roles to run in this process: ingest, relay, deliver.
    #[arg(long, value_delimiter = ',', default_value = "ingest,relay,deliver")]
    roles: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Ingest,
    Relay,
    Deliver,
}

fn parse_roles(names: &[String]) -> anyhow::Result<Vec<Role>> {
    let mut roles = Vec::new();
    for name in names {
        let role = match name.trim() {
            "ingest" => Role::Ingest,
            "relay" => Role::Relay,
            "deliver" => Role::Deliver,
            other => bail!("unknown role {other:?}; available roles: ingest, relay, deliver"),
        };
        if !roles.contains(&role) {
            roles.push(role);
        }
    }
    if roles.is_empty() {
        bail!("--roles is empty");
    }
    Ok(roles)
}

pub async fn run(config: Config, args: RunArgs) -> anyhow::Result<()> {
    let roles = parse_roles(&args.roles)?;
    if roles.contains(&Role::Ingest) && config.routes.is_empty() {
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
    // Each role runs until shutdown; the first to fail stops the process with its error
    // (the others are dropped: their uncommitted work is replayed by the next process).
    let mut tasks = tokio::task::JoinSet::new();
    for role in roles {
        let (config, store, shutdown) = (config.clone(), store.clone(), shutdown.clone());
        match role {
            Role::Ingest => tasks.spawn(crate::ingest::run(config, store, shutdown)),
            Role::Relay => tasks.spawn(crate::relay::run(config, store, shutdown)),
            Role::Deliver => tasks.spawn(crate::deliver::run(config, store, shutdown)),
        };
    }
    while let Some(done) = tasks.join_next().await {
        done.context("a role panicked")??;
    }
    tracing::info!("herald stopped");
    Ok(())
}
