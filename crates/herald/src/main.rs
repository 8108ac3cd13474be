//! `herald`: the daemon and its operator commands.
//!
//! ```text
//! herald [--config FILE] migrate
//! herald [--config FILE] topics ensure
//! herald [--config FILE] template publish --template T --channel email|sms --locale L --revision R ...
//! herald [--config FILE] intent show <intent_id> | <marketplace_id> <order_id> <event_kind> <channel> [--json]
//! herald [--config FILE] intent list <marketplace_id> <order_id> [--json]
//! herald [--config FILE] intent resolve <business key> --as accepted|retry --reason R
//! herald [--config FILE] dead-letter list [--reason R] [--json]
//! herald [--config FILE] dead-letter replay --record P:O ... | --reason R | --all [--dry-run]
//! herald [--config FILE] lag [--json]
//! herald [--config FILE] template activate --template T --channel email|sms --locale L --revision R
//! herald [--config FILE] retention run [--dry-run] [--json]
//! herald [--config FILE] suppression list [--all] | remove --channel email|sms --reason R (--address A | --digest D)
//! herald [--config FILE] check-config [--consumers]
//! herald [--config FILE] run [--roles ingest,relay,deliver,reconcile]   (default: ingest,relay,deliver)
//! ```
//!
//! `herald <command> --help` is the reference; `commands/` holds one module per command.

mod admin;
mod commands;
mod config;
mod gauges;
mod health;
mod listener;
mod obs;
mod progress;
mod retention;
mod retrying;
mod roles;
mod sd_notify;
mod shutdown;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use herald_telemetry::Telemetry;

use crate::config::Config;

const DEFAULT_CONFIG: &str = "config/herald.toml";

/// How long the exit waits for the Kafka producers' clients to close (each within about a
/// second of its last use; `herald_kafka::producer`).
const CLOSE_LIMIT: Duration = Duration::from_secs(3);

/// mimalloc instead of glibc's malloc: in a profile at 1,000 events/s, glibc's malloc and
/// free were 24% of Herald's CPU samples, much of it arena locks and consolidation
/// between the runtime's worker threads (BENCHMARKS.md, 2026-12-05). On transparent huge
/// pages ingest's peak RSS doubled (64 to 132 MiB; 73-81 MiB without): built `no_thp`
/// (Cargo.toml), mimalloc asks for none, and where the host's THP setting is `always` the
/// image and the systemd unit set `MIMALLOC_ALLOW_THP=0`, which turns them off for the
/// process.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "herald",
    version,
    about = "Order events on Kafka to seller e-mail and SMS, never duplicated by retries"
)]
struct Cli {
    /// Configuration file (TOML). Environment variables HERALD_SECTION__KEY override it.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Apply pending database migrations and create attempt partitions ahead of time.
    Migrate,
    /// Manage Kafka topics.
    Topics {
        #[command(subcommand)]
        command: commands::topics::TopicsCommand,
    },
    /// Publish and activate immutable template revisions.
    Template {
        #[command(subcommand)]
        command: commands::template::TemplateCommand,
    },
    /// Inspect notification intents.
    Intent {
        #[command(subcommand)]
        command: commands::intent::IntentCommand,
    },
    /// Inspect and replay the dead-letter topic.
    DeadLetter {
        #[command(subcommand)]
        command: commands::dead_letter::DeadLetterCommand,
    },
    /// Consumer lag and head-of-line age per partition, for both consumer groups.
    Lag(commands::lag::LagArgs),
    /// Partition upkeep and the retention clocks, once (a CronJob's command).
    Retention {
        #[command(subcommand)]
        command: commands::retention::RetentionCommand,
    },
    /// The suppression list: destinations the provider reported bounced or complaining.
    Suppression {
        #[command(subcommand)]
        command: commands::suppression::SuppressionCommand,
    },
    /// Run the daemon with the given roles until SIGTERM or SIGINT.
    Run(commands::run::RunArgs),
    /// Load and validate the configuration (file and HERALD_* environment), touching no
    /// database, broker or provider: exit 0, or 2 with the error naming the key.
    CheckConfig {
        /// Print, as JSON, the Kafka consumer groups and topics this configuration gives each
        /// consuming role, with the prefix (what a lag-based autoscaler must watch).
        #[arg(long)]
        consumers: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (path, explicit) = match &cli.config {
        Some(p) => (p.clone(), true),
        None => (PathBuf::from(DEFAULT_CONFIG), false),
    };
    let config = match Config::load(&path, explicit) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("herald: {e:#}");
            return ExitCode::from(2);
        }
    };
    // Only the daemon exports spans and metrics; operator commands just log.
    let telemetry = match &cli.command {
        Command::Run(_) => Telemetry::init(&config.log, &config.telemetry),
        _ => Telemetry::init_logging(&config.log),
    };
    let telemetry = match telemetry {
        Ok(t) => t,
        Err(e) => {
            eprintln!("herald: {e}");
            return ExitCode::from(2);
        }
    };
    // Reads FAILPOINTS (e.g. `ingest-after-db-commit=sleep(600000)`) when built with the
    // `failpoints` feature; without it the named points compile to nothing.
    let scenario = fail::FailScenario::setup();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("herald: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let obs = obs::Obs {
        metrics: telemetry.metrics(),
        tracing: telemetry.tracing_enabled(),
    };
    let scrape = telemetry.scrape_handle();
    let result = runtime.block_on(async move {
        let mut config = config;
        // Kafka's secrets are read, and an MSK IAM token source started, only for the
        // commands that make Kafka clients: the migration Job, retention and the ledger's
        // commands run without them (and without their files mounted), and check-config
        // validates a file without the secrets it names.
        if matches!(
            cli.command,
            Command::Run(_) | Command::Topics { .. } | Command::DeadLetter { .. } | Command::Lag(_)
        ) {
            config
                .resolve_kafka_security()
                .await
                .map_err(|e| e.context("Kafka security ([kafka] security_protocol, tls, sasl)"))?;
        }
        // The suppression list's key, likewise, only where the list is read or written
        // (the migration Job has none mounted).
        if matches!(
            cli.command,
            Command::Run(_) | Command::Retention { .. } | Command::Suppression { .. }
        ) {
            config.resolve_destination_key()?;
        }
        match cli.command {
            Command::Migrate => commands::migrate::run(&config).await,
            Command::Topics { command } => commands::topics::run(&config, command).await,
            Command::Template { command } => commands::template::run(&config, command).await,
            Command::Intent { command } => commands::intent::run(&config, command).await,
            Command::DeadLetter { command } => commands::dead_letter::run(&config, command).await,
            Command::Lag(args) => commands::lag::run(&config, args).await,
            Command::Retention { command } => commands::retention::run(&config, command).await,
            Command::Suppression { command } => commands::suppression::run(&config, command).await,
            Command::Run(args) => commands::run::run(config, args, obs, scrape).await,
            Command::CheckConfig { consumers: false } => {
                config.suppression.require()?;
                println!("configuration valid: {}", path.display());
                Ok(())
            }
            Command::CheckConfig { consumers: true } => {
                config.suppression.require()?;
                println!("{}", config.consumers());
                Ok(())
            }
        }
    });
    // Tasks still running (a role's helpers) are dropped here; then buffered spans and
    // metrics are flushed, outside the runtime (the OTLP client blocks).
    drop(runtime);
    // The producers were dropped with their tasks: their clients close on their own
    // threads, within about a second. Exiting first would leave librdkafka running while
    // the process tears down.
    let still_open = herald_kafka::producer::wait_for_closed(CLOSE_LIMIT);
    if still_open > 0 {
        tracing::warn!(producers = still_open, "exiting with Kafka producers still open");
    }
    telemetry.shutdown();
    scenario.teardown();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "herald failed");
            eprintln!("herald: {e:#}");
            ExitCode::FAILURE
        }
    }
}
