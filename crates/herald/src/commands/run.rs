//! `herald run --roles ...`: the daemon. Validates the roles against the configuration,
//! migrates if `database.migrate_on_start`, starts health, gauges, retention and the admin
//! endpoints, then runs each role (ingest, relay, deliver, reconcile) until SIGTERM or
//! SIGINT; the first role to fail stops the process with its error.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use herald_core::ErrorClass;
use herald_kafka::admin::Probe;
use herald_store::Store;
use herald_telemetry::ScrapeHandle;

use crate::admin::AdminState;
use crate::config::Config;
use crate::health::{Health, RoleStatus};
use crate::obs::Obs;
use crate::shutdown::Shutdown;

#[derive(Args)]
pub struct RunArgs {
    /// Comma-separated roles to run in this process: ingest, relay, deliver, reconcile
    /// (reads the provider's events; needs reconcile.queue_url or
    /// reconcile.sms_status_log_groups).
    #[arg(long, value_delimiter = ',', default_value = "ingest,relay,deliver")]
    roles: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Ingest,
    Relay,
    Deliver,
    Reconcile,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::Ingest => "ingest",
            Role::Relay => "relay",
            Role::Deliver => "deliver",
            Role::Reconcile => "reconcile",
        }
    }
}

fn parse_roles(names: &[String]) -> anyhow::Result<Vec<Role>> {
    let mut roles = Vec::new();
    for name in names {
        let role = match name.trim() {
            "ingest" => Role::Ingest,
            "relay" => Role::Relay,
            "deliver" => Role::Deliver,
            "reconcile" => Role::Reconcile,
            other => bail!("unknown role {other:?}; available roles: ingest, relay, deliver, reconcile"),
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

pub async fn run(config: Config, args: RunArgs, obs: Obs, scrape: ScrapeHandle) -> anyhow::Result<()> {
    let roles = parse_roles(&args.roles)?;
    if roles.contains(&Role::Ingest) && config.routes.is_empty() {
        tracing::warn!("no routes configured: every order event will be skipped");
    }
    if roles.contains(&Role::Reconcile)
        && config.reconcile.queue_url.is_none()
        && config.reconcile.sms_status_log_groups.is_empty()
    {
        bail!(
            "the reconcile role needs reconcile.queue_url (the SQS queue of the SES configuration set's events) \
             or reconcile.sms_status_log_groups (SNS's SMS delivery status in CloudWatch Logs)"
        );
    }
    let config = Arc::new(config);
    let store = Store::new(&config.store())?;
    if config.database.migrate_on_start {
        let report = super::migrate::migrate_as_owner(&config)
            .await
            .context("migrations at start-up (database.migrate_on_start)")?;
        for m in report.applied {
            tracing::info!(migration = %m, "migration applied");
        }
        // Never a reason not to start: the retention schedule tries again.
        match report.partitions {
            Ok(upkeep) => {
                for p in upkeep.created {
                    tracing::info!(partition = %p, "attempt partition created");
                }
            }
            Err(e) => {
                let e = anyhow::Error::new(e);
                tracing::error!(error = %format!("{e:#}"), "attempt partition upkeep failed at start-up; starting anyway");
                obs.metrics.retention_failed("partition_upkeep");
            }
        }
    }
    check_suppression_key(&store, &obs.metrics).await?;
    // A refused password or certificate stops start-up here, naming the broker and why.
    super::check_kafka(&config).await?;
    let shutdown = Shutdown::install().context("installing signal handlers")?;
    tracing::info!(roles = ?args.roles, version = env!("CARGO_PKG_VERSION"), tracing = obs.tracing, "herald started");

    let health = Health::new(
        store.clone(),
        Probe::new(&config.kafka_settings())?,
        config.topic(&config.kafka.topics.deliveries),
        obs.metrics.clone(),
    );
    let mut background = tokio::task::JoinSet::new();
    background.spawn(health.clone().refresh_loop());
    background.spawn(crate::gauges::watch_database(obs.metrics.clone(), store.clone()));
    background.spawn(crate::retention::run(
        config.clone(),
        obs.metrics.clone(),
        shutdown.clone(),
    ));
    let listeners = [&config.admin.listen, &config.admin.probe_listen];
    if listeners.iter().any(|l| !l.is_empty()) {
        let state = std::sync::Arc::new(AdminState {
            store: store.clone(),
            scrape,
            health: health.clone(),
            token: config.admin.bearer_token()?,
            read_token: config.admin.read_token()?,
            requests: tokio::sync::Semaphore::new(config.admin.max_concurrent_requests as usize),
            kafka: config.kafka_settings(),
            dead_letter_topic: config.topic(&config.kafka.topics.dead_letter),
            ingest_topics: config.ingest_topics(),
            metrics: obs.metrics.clone(),
            dead_letter_reads: Default::default(),
        });
        // Bound before the roles start, so that a port clash fails start-up. They stop
        // serving when shutdown is requested: a draining process is no longer ready.
        for (listen, probes_only, limits) in [
            (&config.admin.listen, false, config.listeners.admin()),
            (&config.admin.probe_listen, true, config.listeners.probe()),
        ] {
            if listen.is_empty() {
                continue;
            }
            let server = crate::admin::bind(listen).await?;
            let (sd, state) = (shutdown.clone(), state.clone());
            background.spawn(async move {
                if let Err(e) = crate::admin::serve(server, state, probes_only, limits, sd).await {
                    tracing::error!(error = %format!("{e:#}"), "admin endpoint stopped");
                }
            });
        }
    }

    // Each role runs until shutdown; the first to fail stops the process with its error
    // (the others are dropped: their uncommitted work is replayed by the next process).
    let mut tasks = tokio::task::JoinSet::new();
    for role in roles {
        let (config, store, shutdown, obs) = (config.clone(), store.clone(), shutdown.clone(), obs.clone());
        health.set_role(role.as_str(), RoleStatus::Running);
        let work = async move {
            let result = match role {
                Role::Ingest => crate::roles::ingest::run(config, store, shutdown, obs).await,
                Role::Relay => crate::roles::relay::run(config, store, shutdown, obs).await,
                Role::Deliver => crate::roles::deliver::run(config, store, shutdown, obs).await,
                Role::Reconcile => crate::roles::reconcile::run(config, store, shutdown, obs).await,
            };
            (role, result)
        };
        tasks.spawn(work);
    }
    // Start-up is over: systemd (Type=notify) may start what depends on this unit.
    // Readiness (PostgreSQL, Kafka) is reported as STATUS, and on /readyz.
    crate::sd_notify::notify("READY=1\nSTATUS=started; checking readiness");
    {
        let (health, mut sd) = (health.clone(), shutdown.clone());
        background.spawn(async move {
            let mut was = None;
            loop {
                tokio::select! {
                    _ = sd.requested() => {
                        crate::sd_notify::notify("STOPPING=1\nSTATUS=draining");
                        return;
                    }
                    _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                }
                let ready = health.readiness().ready;
                if was != Some(ready) {
                    crate::sd_notify::notify(if ready {
                        "STATUS=ready"
                    } else {
                        "STATUS=not ready (see /readyz)"
                    });
                    was = Some(ready);
                }
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        let (role, result) = done.context("a role panicked")?;
        match &result {
            Ok(()) => health.set_role(role.as_str(), RoleStatus::Stopped),
            Err(e) => health.set_role(role.as_str(), RoleStatus::Failed(format!("{e:#}"))),
        }
        result?;
    }
    background.abort_all();
    tracing::info!("herald stopped");
    Ok(())
}

/// Refuses to start with another `suppression.key` than the one the list is keyed with
/// (recorded by the first instance: see `Store::check_destination_key`). A database that
/// does not answer is waited for: starting unchecked could key new entries with a key the
/// rest of the deployment does not have.
async fn check_suppression_key(store: &Store, metrics: &herald_telemetry::Metrics) -> anyhow::Result<()> {
    use crate::retrying::{run_with_retries, GaveUp, Schedule, Stage};
    let stage = Stage {
        name: "suppression_key_check",
        metrics,
    };
    let schedule = Schedule::new(Duration::from_millis(500), Duration::from_secs(5));
    let refuse_changed = |e: &herald_store::StoreError| match e {
        herald_store::StoreError::DestinationKeyChanged { .. } => ErrorClass::Permanent("key_changed"),
        other => other.class(),
    };
    match run_with_retries(
        stage,
        || store.check_destination_key(),
        refuse_changed,
        schedule,
        None,
    )
    .await
    {
        Ok(()) => Ok(()),
        Err(GaveUp::Permanent(e, _)) => Err(e.into()),
        Err(GaveUp::Shutdown) => unreachable!("no shutdown to wait for"),
    }
}
