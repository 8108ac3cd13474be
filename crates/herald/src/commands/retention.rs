//! `herald retention run [--dry-run] [--json]`: one retention pass (partition upkeep and
//! the three clocks of `[retention]`), as the schema owner, then exits: what a Kubernetes
//! CronJob runs when `retention.interval_secs = 0`. Prints exactly what it removed, or
//! with `--dry-run` what it would remove, computed with SELECTs (nothing changes, no
//! partition is created or dropped). Exits non-zero when any step failed.

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use herald_store::partitions::LockMode;
use herald_store::retention::Removed;
use herald_store::Store;

use crate::config::Config;
use crate::retention::{cutoffs, pass, PassContext, PassReport};

#[derive(Subcommand)]
pub enum RetentionCommand {
    /// One pass now: create the attempt partitions ahead, then remove what the clocks say.
    Run(RunArgs),
}

#[derive(Args)]
pub struct RunArgs {
    /// Print what a pass would remove; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// One JSON document instead of text.
    #[arg(long)]
    json: bool,
}

/// `--json`: the same shape for a pass and a dry run.
#[derive(serde::Serialize)]
struct Output<'a> {
    dry_run: bool,
    /// `false`: another instance was running a pass; nothing was removed here.
    clocks_ran: bool,
    partitions_created: &'a [String],
    rows_moved: u64,
    removed: &'a Removed,
    /// Suppression-list entries re-keyed (0 in a dry run, which does not look).
    suppressions_rekeyed: u64,
    failures: &'a [(&'static str, String)],
}

pub async fn run(config: &Config, command: RetentionCommand) -> anyhow::Result<()> {
    let RetentionCommand::Run(args) = command;
    let owner = Store::new(&config.owner_store()).context("the owner's database settings")?;
    let report = if args.dry_run {
        preview(&owner, config).await?
    } else {
        pass(&PassContext {
            owner: &owner,
            config,
            metrics: None,
            upkeep_lock: LockMode::Wait,
            keep_going: &|| true,
        })
        .await
    };
    let created = report.partitions_created.clone().unwrap_or_default();
    if args.json {
        let out = Output {
            dry_run: args.dry_run,
            clocks_ran: report.clocks_ran,
            partitions_created: &created,
            rows_moved: report.rows_moved,
            removed: &report.removed,
            suppressions_rekeyed: report.suppressions_rekeyed,
            failures: &report.failures,
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_text(&report, &created, args.dry_run);
    }
    if let Some((step, e)) = report.failures.first() {
        bail!("retention {step} failed: {e}");
    }
    Ok(())
}

async fn preview(owner: &Store, config: &Config) -> anyhow::Result<PassReport> {
    let now = chrono::Utc::now();
    let cutoffs = cutoffs(&config.retention, now);
    let upkeep = owner
        .partition_upkeep_preview(
            now.date_naive(),
            config.database.attempt_partitions_ahead,
            cutoffs.attempts,
        )
        .await
        .context("partition upkeep (dry run)")?;
    let removed = owner
        .retention_preview(&cutoffs)
        .await
        .context("retention clocks (dry run)")?;
    Ok(PassReport {
        rows_moved: upkeep.moved.iter().map(|(_, n)| n).sum(),
        partitions_created: Some(upkeep.created),
        clocks_ran: true,
        removed,
        // A dry run does not look for the unkeyed entries' addresses (herald_suppressions_unkeyed counts them).
        suppressions_rekeyed: 0,
        failures: Vec::new(),
    })
}

fn print_text(report: &PassReport, created: &[String], dry_run: bool) {
    let (create, drop, verb) = if dry_run {
        ("would create", "would drop", "would be")
    } else {
        ("created", "dropped", "")
    };
    let verb = |past: &str| {
        if dry_run {
            format!("{verb} {past}")
        } else {
            past.to_owned()
        }
    };
    for p in created {
        println!("{create} partition {p}");
    }
    if report.rows_moved > 0 {
        println!(
            "attempt rows moved out of the default partition: {}",
            report.rows_moved
        );
    }
    if !report.clocks_ran {
        println!("another instance is running a retention pass: the clocks ran there, not here");
        return;
    }
    let r = &report.removed;
    for p in &r.partitions {
        println!("{drop} partition {p}");
    }
    println!(
        "default-partition attempts {}: {}",
        verb("deleted"),
        r.default_attempts
    );
    println!("payload bodies {}: {}", verb("purged"), r.payload_bodies);
    println!(
        "provider events and rejected queue messages {}: {}",
        verb("deleted"),
        r.provider_events
    );
    let i = &r.intents;
    println!(
        "intents {}: {} (conflicts {}, resolutions {}, profile holds {}, outbox rows {}, attempts {}, payloads {})",
        verb("deleted"),
        i.intents,
        i.conflicts,
        i.resolutions,
        i.holds,
        i.outbox,
        i.attempts,
        i.payloads
    );
    println!(
        "offending documents of conflicts and HTTP key mismatches {}: {}",
        verb("purged"),
        r.conflict_documents
    );
    if !dry_run {
        println!(
            "suppression-list entries re-keyed: {}",
            report.suppressions_rekeyed
        );
    }
    println!(
        "bodies of refused provider messages {}: {}",
        verb("purged"),
        r.reject_bodies
    );
    println!(
        "expired HTTP ingest keys {}: {}",
        verb("deleted"),
        r.http_requests
    );
    if dry_run {
        println!("dry run: nothing changed");
    }
}
