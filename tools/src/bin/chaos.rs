//! `herald-chaos [--long] [--seed N] [SCENARIO ...]`: the reliability scenarios over the
//! real local stack (`make chaos` runs the long version, `make test` the short one). Each
//! scenario prints one line of figures; a violated invariant is printed under it with the
//! intents involved, and the run exits 1. Scenarios: storm, conflicts, sigkill, broker,
//! database, provider, churn, slow, ratelimit, pause, db-outage, hostile, and on the
//! three-node cluster (deploy/local/kafka-cluster.sh, started when needed) leader,
//! paused-broker, controller: all by default with --long, all but the last two without.
//! The seed makes a run reproducible.
//!
//! It stops and starts the stack's broker and database: do not run it next to other tests.
//! A scenario's database and logs are dropped when its invariants hold, kept (and named)
//! otherwise; `HERALD_CHAOS_KEEP=1` keeps them either way.

use std::process::ExitCode;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Result};
use herald_tools::chaos::rng::Rng;
use herald_tools::chaos::scenarios::{self, ALL};
use herald_tools::chaos::Scale;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("herald-chaos: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run() -> Result<bool> {
    let (mut scale, mut seed, mut names) = (Scale::Short, None, Vec::new());
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--long" => scale = Scale::Long,
            "--seed" => seed = Some(args.next().unwrap_or_default().parse::<u64>()?),
            "-h" | "--help" => {
                println!("usage: herald-chaos [--long] [--seed N] [{}]", ALL.join("|"));
                return Ok(true);
            }
            s if s.starts_with('-') => bail!("unknown option {s}"),
            s => names.push(s.to_owned()),
        }
    }
    if names.is_empty() {
        names = scenarios::defaults(scale)
            .into_iter()
            .map(str::to_owned)
            .collect();
    }
    let seed = seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    println!(
        "chaos: {scale:?} run of {}, seed {seed} (herald-chaos --seed {seed} to repeat)",
        names.join(", ")
    );
    let mut rng = Rng::new(seed);
    let (started, mut failed) = (Instant::now(), Vec::new());
    for name in &names {
        let report = scenarios::run(name, scale, &mut rng).await?;
        println!("{}", report.line());
        for v in &report.violations {
            println!("  VIOLATION {v}");
        }
        if !report.violations.is_empty() {
            failed.push(name.clone());
        }
    }
    let secs = started.elapsed().as_secs();
    if failed.is_empty() {
        println!(
            "chaos: every invariant held in {} scenario(s), {secs}s",
            names.len()
        );
        Ok(true)
    } else {
        println!("chaos: invariants violated in {} ({secs}s)", failed.join(", "));
        Ok(false)
    }
}
