//! `herald-ingest-rate [EVENTS] [BATCH]`: one quick ingest measurement on the local stack
//! (`make ingest-rate`): the bench workload of EVENTS order events (30% duplicates, 2%
//! conflicting re-emissions, two channels each) on the topic first, then one
//! `herald run --roles ingest` with `ingest.batch_max_messages = BATCH`, from start to
//! lag 0. The full comparison with limits and baselines is `make bench`.

use anyhow::Result;
use herald_tools::bench::ingest::{self, Workload};
use integration_tests::TestEnv;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let events: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(20_000);
    let batch: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(500);
    // Read by the herald processes the measurement spawns.
    std::env::set_var("HERALD_INGEST__BATCH_MAX_MESSAGES", batch.to_string());
    let w = Workload::new(events);
    let env = TestEnv::new("rate", "").await?;
    ingest::fill(&env, &w).await?;
    let ingest::IngestRun { rate, usage, .. } = ingest::herald(&env, &w, 1).await?;
    println!(
        "ingest-rate: batch_max_messages={batch}: {events} events ({} distinct orders, {} intents) at {rate:.0} events/s \
         from process start to lag 0; peak RSS {:.0} MiB, {:.1} CPU s",
        w.distinct,
        w.intents(),
        usage.peak_rss_mib,
        usage.cpu_seconds
    );
    env.cleanup().await;
    Ok(())
}
