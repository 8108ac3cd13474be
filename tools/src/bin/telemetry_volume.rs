//! `herald-telemetry-volume [ORDERS] [LOG_RATIO] [ROUTINE_PERCENT]`: the log and trace volume
//! of Herald per million notifications (intents), before and after sampling
//! (`make telemetry-volume`), on the local stack with moto as the provider.
//!
//! The same production-like mix twice, each in a world of its own: ORDERS orders (two
//! intents each; 2% produced twice, 0.1% reused with another total, 0.5% in a marketplace
//! whose e-mail is rejected).
//! - before: every log line (`log.routine_sampling_ratio = 1`), every span exported
//!   straight to the backend;
//! - after: `log.routine_sampling_ratio = LOG_RATIO`, spans through the repository's
//!   collector configuration (deploy/otel-collector/config.yaml) keeping ROUTINE_PERCENT
//!   of routine traces.
//!
//! The backend is an OTLP/HTTP endpoint that counts what it receives (spans, traces, bytes
//! on the wire and as protobuf); the log is Herald's JSON log as written. Results:
//! bench/results/telemetry-volume.json.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use integration_tests::mixed::{produce_mix, wait_settled, Mix, UNVERIFIED_SENDER};
use integration_tests::otlp::{Collector, CollectorSettings, OtlpSink, Received};
use integration_tests::{workspace_root, TestEnv};
use serde_json::json;

const DECISION_WAIT: Duration = Duration::from_secs(30);

struct Phase {
    name: &'static str,
    intents: u64,
    log_lines: u64,
    log_bytes: u64,
    received: Received,
    seconds: f64,
    rare: Rare,
}

/// The rare paths, and how many of them the log and the backend have.
#[derive(Debug, serde::Serialize)]
struct Rare {
    rejected_intents: usize,
    rejected_log_lines: usize,
    rejected_traces_kept: usize,
    conflicting_events: usize,
    conflict_log_lines: usize,
    conflict_traces_kept: usize,
}

impl Phase {
    fn per_million(&self, v: u64) -> f64 {
        v as f64 * 1e6 / self.intents as f64
    }

    fn json(&self) -> serde_json::Value {
        let r = &self.received;
        json!({
            "phase": self.name,
            "rare": self.rare,
            "intents": self.intents,
            "seconds": self.seconds,
            "log": {"lines": self.log_lines, "bytes": self.log_bytes,
                    "lines_per_million": self.per_million(self.log_lines),
                    "bytes_per_million": self.per_million(self.log_bytes)},
            "traces": {"traces": r.traces.len(), "spans": r.spans, "requests": r.requests,
                       "wire_bytes": r.wire_bytes, "proto_bytes": r.proto_bytes,
                       "spans_per_million": self.per_million(r.spans),
                       "proto_bytes_per_million": self.per_million(r.proto_bytes),
                       "wire_bytes_per_million": self.per_million(r.wire_bytes)},
        })
    }
}

async fn phase(
    name: &'static str,
    mix: Mix,
    log_ratio: f64,
    collector_percent: Option<f64>,
) -> Result<Phase> {
    let backend = OtlpSink::start().await?;
    let logs = workspace_root().join("target/it");
    std::fs::create_dir_all(&logs)?;
    let collector = match collector_percent {
        Some(percent) => Some(
            Collector::start(
                CollectorSettings {
                    backend: &format!("http://{}", backend.addr),
                    routine_percent: percent,
                    decision_wait: DECISION_WAIT,
                },
                logs.join(format!("collector-volume-{name}.log")),
            )
            .await?,
        ),
        None => None,
    };
    let endpoint = collector
        .as_ref()
        .map_or_else(|| backend.traces_endpoint(), Collector::traces_endpoint);
    let env = TestEnv::new(
        &format!("volume_{name}"),
        &format!("[telemetry]\ntraces_endpoint = \"{endpoint}\"\n"),
    )
    .await?;
    let ratio = log_ratio.to_string();
    let started = Instant::now();
    let mut herald = env.spawn_roles(
        "ingest,relay,deliver",
        "herald",
        &[
            ("HERALD_LOG__ROUTINE_SAMPLING_RATIO", ratio.as_str()),
            UNVERIFIED_SENDER,
        ],
    )?;
    produce_mix(&env, mix).await?;
    wait_settled(&env, mix, Duration::from_secs(1800)).await?;
    let seconds = started.elapsed().as_secs_f64();
    // SIGTERM: Herald flushes its span exporter before it exits.
    herald.terminate(Duration::from_secs(60)).await?;
    let log = herald.log();
    let received = backend
        .settled(DECISION_WAIT + Duration::from_secs(10), Duration::from_secs(300))
        .await
        .context("waiting for the last spans")?;
    let intents = env.count("SELECT count(*) FROM notification_intents").await? as u64;
    let rare = rare(&env, mix, &log, &received).await?;
    drop(collector);
    env.cleanup().await;
    Ok(Phase {
        name,
        intents,
        log_lines: log.lines().count() as u64,
        log_bytes: log.len() as u64,
        received,
        seconds,
        rare,
    })
}

async fn rare(env: &TestEnv, mix: Mix, log: &str, received: &Received) -> Result<Rare> {
    let rejected: Vec<String> = env
        .db
        .query(
            "SELECT split_part(trace_context, '-', 2) FROM notification_intents WHERE state = 'rejected'",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let lines: Vec<serde_json::Value> = log.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let message = |l: &serde_json::Value, m: &str| l["message"].as_str().is_some_and(|s| s.starts_with(m));
    Ok(Rare {
        rejected_intents: rejected.len(),
        rejected_log_lines: lines
            .iter()
            .filter(|l| message(l, "attempt finished") && l["outcome"] == "rejected")
            .count(),
        rejected_traces_kept: rejected
            .iter()
            .filter(|t| received.traces.contains_key(*t))
            .count(),
        conflicting_events: mix.conflicts() / 2,
        conflict_log_lines: lines.iter().filter(|l| message(l, "business key reused")).count(),
        conflict_traces_kept: received
            .traces
            .values()
            .filter(|spans| spans.iter().any(|s| s.name == "intent conflict"))
            .count(),
    })
}

fn show(before: &Phase, after: &Phase) {
    let row = |what: &str, b: f64, a: f64| {
        println!(
            "  {what:<28} {b:>16.0} {a:>16.0}   {:>6.1}%",
            if b > 0.0 { 100.0 * a / b } else { 0.0 }
        );
    };
    println!("  per million notifications      before            after   after/before");
    row(
        "log lines",
        before.per_million(before.log_lines),
        after.per_million(after.log_lines),
    );
    row(
        "log bytes",
        before.per_million(before.log_bytes),
        after.per_million(after.log_bytes),
    );
    row(
        "spans",
        before.per_million(before.received.spans),
        after.per_million(after.received.spans),
    );
    row(
        "span bytes (protobuf)",
        before.per_million(before.received.proto_bytes),
        after.per_million(after.received.proto_bytes),
    );
    row(
        "span bytes (wire)",
        before.per_million(before.received.wire_bytes),
        after.per_million(after.received.wire_bytes),
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let orders: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(5000);
    let log_ratio: f64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(0.01);
    let percent: f64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(10.0);
    let mix = Mix {
        orders,
        rejected: orders.div_ceil(200),
        duplicate_every: 50,
        conflict_every: 1000,
    };
    println!("telemetry-volume: {mix:?}; after: log ratio {log_ratio}, {percent}% of routine traces");
    let before = phase("before", mix, 1.0, None).await?;
    let after = phase("after", mix, log_ratio, Some(percent)).await?;
    show(&before, &after);
    for p in [&before, &after] {
        println!("  rare paths, {}: {:?}", p.name, p.rare);
    }
    let out = workspace_root().join("bench/results/telemetry-volume.json");
    let doc = json!({
        "mix": {"orders": mix.orders, "rejected": mix.rejected, "duplicate_every": mix.duplicate_every,
                "conflict_every": mix.conflict_every},
        "log_routine_sampling_ratio": log_ratio,
        "routine_traces_percent": percent,
        "decision_wait_secs": DECISION_WAIT.as_secs(),
        "before": before.json(),
        "after": after.json(),
    });
    std::fs::write(&out, serde_json::to_string_pretty(&doc)? + "\n")?;
    println!("telemetry-volume: written to {}", out.display());
    Ok(())
}
