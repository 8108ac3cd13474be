//! `herald-bench [--quick] [--storage-only] [--out DIR]`: the benchmark behind `make bench` (and
//! `make bench-quick`). On the real local stack, side by side in one run: ingest against
//! a do-nothing Kafka consumer, Herald's own statements without Kafka and the naive
//! one-transaction-per-event loop; delivery against the Little's-law limit of a 50 ms
//! provider stand-in and the sequential loop; end-to-end latency at half capacity; resource
//! use; scale-out; and ingest rates as the intents table grows. Writes
//! `DIR/<date>.json` and `DIR/<date>.md` (default DIR `bench/results`). Timings are
//! reported, never asserted: the machine is shared and noisy, so read the ratios.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use herald_store::plans::HOT_STATEMENTS;
use integration_tests::bench::ingest::{self, Workload};
use integration_tests::bench::procstat::Usage;
use integration_tests::bench::{delivery, storage, Figure, Target};
use integration_tests::{standin, TestEnv};
use serde_json::json;

const PROVIDER_LATENCY: Duration = Duration::from_millis(50);

struct Plan {
    runs: usize,
    events: usize,
    naive_events: usize,
    delivery_orders: usize,
    latency_seconds: u64,
    growth: Vec<usize>,
    storage_events: usize,
}

impl Plan {
    fn new(quick: bool) -> Self {
        if quick {
            Self {
                runs: 1,
                events: 10_000,
                naive_events: 500,
                delivery_orders: 1000,
                latency_seconds: 10,
                growth: vec![10_000],
                storage_events: 4_000,
            }
        } else {
            Self {
                runs: 3,
                events: 50_000,
                naive_events: 1500,
                delivery_orders: 3000,
                latency_seconds: 20,
                growth: vec![10_000, 100_000, 1_000_000],
                storage_events: 20_000,
            }
        }
    }
}

fn usage_row(role: &str, u: &Usage, per: f64) -> String {
    format!(
        "| {role} | {:.0} | {:.2} |",
        u.peak_rss_mib,
        u.cpu_seconds / per.max(1.0) * 10_000.0
    )
}

async fn filled(name: &str, w: &Workload) -> Result<TestEnv> {
    let env = TestEnv::new(name, "").await?;
    ingest::fill(&env, w).await?;
    Ok(env)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let out = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1))
        .map_or_else(|| PathBuf::from("bench/results"), PathBuf::from);
    let plan = Plan::new(quick);
    let t0 = Instant::now();
    let say = |s: &str| eprintln!("bench [{:>4}s] {s}", t0.elapsed().as_secs());
    if args.iter().any(|a| a == "--storage-only") {
        let (standin_addr, _) = standin::start(PROVIDER_LATENCY).await?;
        let reports = storage_runs(&format!("http://{standin_addr}"), plan.storage_events, &say).await?;
        return write_storage_only(&out, quick, &reports, t0);
    }

    // --- Ingest -----------------------------------------------------------------------
    let w = Workload::new(plan.events);
    let mut kafka = Figure::new(
        "limit_kafka",
        "events/s",
        "a consumer that reads and does nothing",
    );
    let mut pg = Figure::new(
        "limit_pg",
        "events/s",
        "Herald's statements, batches of 500, no Kafka",
    );
    let mut naive = Figure::new(
        "naive",
        "events/s",
        "one transaction + one sync offset commit per event",
    );
    let mut herald_ingest = Figure::new(
        "herald ingest",
        "events/s",
        "`herald run --roles ingest`, start to lag 0",
    );
    let mut ingest_usage = Usage::default();
    for run in 0..plan.runs {
        say(&format!(
            "ingest run {}/{}: {} events",
            run + 1,
            plan.runs,
            w.events
        ));
        let env = filled("bench_ingest", &w).await?;
        kafka.runs.push(ingest::limit_kafka(&env, &w).await?);
        let (rate, usage) = ingest::herald(&env, &w, 1).await?;
        herald_ingest.runs.push(rate);
        ingest_usage = usage;
        env.cleanup().await;
        let env = TestEnv::new("bench_pg", "").await?;
        pg.runs.push(ingest::limit_pg(&env, &w).await?);
        env.cleanup().await;
        let small = Workload::new(plan.naive_events);
        let env = filled("bench_naive", &small).await?;
        naive.runs.push(ingest::naive(&env, small.events).await?);
        env.cleanup().await;
    }
    say("ingest scale-out: two instances");
    let mut ingest_two = Figure::new("herald ingest x2", "events/s", "two ingest processes");
    for _ in 0..plan.runs {
        let env = filled("bench_ingest2", &w).await?;
        ingest_two.runs.push(ingest::herald(&env, &w, 2).await?.0);
        env.cleanup().await;
    }

    // --- Delivery ---------------------------------------------------------------------
    let (standin_addr, _) = standin::start(PROVIDER_LATENCY).await?;
    let endpoint = format!("http://{standin_addr}");
    let mut delivery_figs = Vec::new();
    let mut deliver_usage = Usage::default();
    let mut sends_measured = 0.0;
    for in_flight in [64usize, 256, 1024] {
        let limit = in_flight as f64 / PROVIDER_LATENCY.as_secs_f64();
        let mut f = Figure::new(
            format!("herald deliver, {in_flight} in flight"),
            "sends/s",
            format!("Little's-law limit {limit:.0}/s"),
        );
        for run in 0..plan.runs {
            say(&format!(
                "delivery {in_flight} in flight, run {}/{}",
                run + 1,
                plan.runs
            ));
            let (env, intents) = delivery::prepare("bench_deliver", &endpoint, plan.delivery_orders).await?;
            let (rate, usage) = delivery::herald(&env, intents, in_flight, 1, &[]).await?;
            f.runs.push(rate);
            if in_flight == 256 {
                deliver_usage = usage;
                sends_measured = intents as f64;
            }
            env.cleanup().await;
        }
        delivery_figs.push((in_flight, limit, f));
    }
    say("delivery sequential");
    let mut sequential = Figure::new(
        "sequential",
        "sends/s",
        "the usual consumer loop: receive, claim, send, record, commit the offset, one at a time",
    );
    for _ in 0..plan.runs {
        let (env, intents) = delivery::prepare("bench_seq", &endpoint, 100).await?;
        sequential
            .runs
            .push(delivery::sequential(&env, &endpoint, intents).await?);
        env.cleanup().await;
    }
    say("delivery scale-out: two instances");
    let mut deliver_two = Figure::new(
        "herald deliver x2, 256 in flight each",
        "sends/s",
        "two delivery processes",
    );
    for _ in 0..plan.runs {
        let (env, intents) = delivery::prepare("bench_deliver2", &endpoint, plan.delivery_orders).await?;
        deliver_two
            .runs
            .push(delivery::herald(&env, intents, 256, 2, &[]).await?.0);
        env.cleanup().await;
    }

    // --- End-to-end latency at half capacity -------------------------------------------
    let at_256 = delivery_figs[1].2.median();
    let capacity = herald_ingest.median().min(at_256 / 2.0);
    let offered = (capacity / 2.0).max(1.0);
    say(&format!("end-to-end latency at {offered:.0} events/s"));
    let (p50, p99, latency_events) = delivery::latency(&endpoint, offered, plan.latency_seconds).await?;

    // --- Growth -------------------------------------------------------------------------
    let mut growth = Vec::new();
    for &size in &plan.growth {
        say(&format!("growth: {size} events"));
        let gw = Workload::new(size);
        let env = filled("bench_growth", &gw).await?;
        let (rate, _) = ingest::herald(&env, &gw, 1).await?;
        growth.push((size, rate));
        env.cleanup().await;
    }

    // --- Storage per intent -------------------------------------------------------------
    let storage_reports = storage_runs(&endpoint, plan.storage_events, &say).await?;

    // --- Report -------------------------------------------------------------------------
    let limit_min = kafka.median().min(pg.median());
    let (_, limit64, f64_) = &delivery_figs[0];
    let (_, limit256, f256) = &delivery_figs[1];
    let targets = [
        Target {
            text: "herald ingest >= 0.5 x min(limit_kafka, limit_pg)".into(),
            lhs: herald_ingest.median(),
            rhs: limit_min,
            factor: 0.5,
        },
        Target {
            text: "herald ingest >= 10 x naive".into(),
            lhs: herald_ingest.median(),
            rhs: naive.median(),
            factor: 10.0,
        },
        Target {
            text: "deliver at 64 in flight >= 80% of the limit".into(),
            lhs: f64_.median(),
            rhs: *limit64,
            factor: 0.8,
        },
        Target {
            text: "deliver at 256 in flight >= 50% of the limit".into(),
            lhs: f256.median(),
            rhs: *limit256,
            factor: 0.5,
        },
        Target {
            text: "deliver (256) >= 20 x sequential".into(),
            lhs: f256.median(),
            rhs: sequential.median(),
            factor: 20.0,
        },
    ];
    let date = chrono::Utc::now().format("%Y-%m-%dT%H%M%SZ").to_string();
    let mut figures = vec![&kafka, &pg, &naive, &herald_ingest, &ingest_two];
    figures.extend(delivery_figs.iter().map(|(_, _, f)| f));
    figures.extend([&sequential, &deliver_two]);
    let json = json!({
        "date": date,
        "quick": quick,
        "workload": {"events": w.events, "distinct_orders": w.distinct, "duplicates": w.duplicates,
                     "conflicting_reemissions": w.conflicts, "channels_per_event": 2, "sellers": ingest::SELLERS},
        "provider_latency_ms": PROVIDER_LATENCY.as_millis() as u64,
        "figures": figures.iter().map(|f| f.to_json()).collect::<Vec<_>>(),
        "delivery": delivery_figs.iter().map(|(n, limit, f)| json!({"in_flight": n, "limit": limit, "median": f.median(),
            "min": f.min(), "max": f.max()})).collect::<Vec<_>>(),
        "targets": targets.iter().map(|t| json!({"target": t.text, "ratio": t.lhs / t.rhs, "met": t.met()})).collect::<Vec<_>>(),
        "latency": {"offered_events_per_s": offered, "events": latency_events, "p50_ms": p50, "p99_ms": p99},
        "resources": {
            "ingest": {"peak_rss_mib": ingest_usage.peak_rss_mib, "cpu_s_per_10k_events": ingest_usage.cpu_seconds / (w.events as f64) * 10_000.0},
            "deliver": {"peak_rss_mib": deliver_usage.peak_rss_mib, "cpu_s_per_10k_sends": deliver_usage.cpu_seconds / sends_measured.max(1.0) * 10_000.0},
        },
        "growth": growth.iter().map(|(n, r)| json!({"events": n, "events_per_s": r})).collect::<Vec<_>>(),
        "storage": storage_reports.iter().map(storage::Report::to_json).collect::<Vec<_>>(),
        "indexes": HOT_STATEMENTS.iter().map(|s| json!({"statement": s.name, "indexes": s.indexes})).collect::<Vec<_>>(),
        "duration_s": t0.elapsed().as_secs(),
    });

    let mut md = String::new();
    writeln!(
        md,
        "# Herald benchmark {date}{}\n",
        if quick { " (quick)" } else { "" }
    )?;
    writeln!(
        md,
        "Workload: {} order events already on the topic ({} distinct orders, {} duplicates, {} conflicting \
         re-emissions), two channels each, {} sellers. Provider stand-in answers after {} ms. Median of {} run(s), min and max.\n",
        w.events, w.distinct, w.duplicates, w.conflicts, ingest::SELLERS, PROVIDER_LATENCY.as_millis(), plan.runs
    )?;
    writeln!(
        md,
        "| figure | median | min | max | unit | what |\n|---|---|---|---|---|---|"
    )?;
    for f in &figures {
        writeln!(md, "{}", f.row())?;
    }
    writeln!(md, "\n| target | ratio | |\n|---|---|---|")?;
    for t in &targets {
        writeln!(md, "{}", t.row())?;
    }
    writeln!(
        md,
        "\nEnd-to-end (event produced -> attempt `accepted` recorded), {latency_events} events at {offered:.0}/s \
         (half the measured capacity): p50 {p50:.0} ms, p99 {p99:.0} ms.\n"
    )?;
    writeln!(md, "| role | peak RSS MiB | CPU s per 10,000 |\n|---|---|---|")?;
    writeln!(
        md,
        "{}",
        usage_row("ingest (events)", &ingest_usage, w.events as f64)
    )?;
    writeln!(
        md,
        "{}",
        usage_row("deliver, 256 in flight (sends)", &deliver_usage, sends_measured)
    )?;
    writeln!(
        md,
        "\nGrowth (one ingest process, start to lag 0):\n\n| events on the topic | events/s |\n|---|---|"
    )?;
    for (n, r) in &growth {
        writeln!(md, "| {n} | {r:.0} |")?;
    }
    writeln!(md)?;
    for r in &storage_reports {
        writeln!(md, "{}", r.markdown())?;
    }
    writeln!(
        md,
        "\nIndexes the hot statements use (checked by `EXPLAIN` in `make test`):\n"
    )?;
    for s in HOT_STATEMENTS {
        writeln!(md, "- {}: `{}`", s.name, s.indexes.join("` or `"))?;
    }
    writeln!(md, "\nTook {} s.", t0.elapsed().as_secs())?;

    std::fs::create_dir_all(&out)?;
    let json_path = out.join(format!("{date}.json"));
    std::fs::write(&json_path, serde_json::to_string_pretty(&json)?)?;
    std::fs::write(out.join(format!("{date}.md")), &md)?;
    std::fs::write(out.join("latest.json"), serde_json::to_string_pretty(&json)?)?;
    println!("{md}");
    println!("bench: wrote {}", json_path.display());
    Ok(())
}

/// The storage measurement, once with the sample templates and once with the 6 KB e-mail.
async fn storage_runs(endpoint: &str, events: usize, say: &impl Fn(&str)) -> Result<Vec<storage::Report>> {
    let mut reports = Vec::new();
    for variant in [storage::SAMPLE, storage::EMAIL_6KB] {
        say(&format!("storage per intent: {}, {events} events", variant.name));
        reports.push(storage::run(endpoint, events, variant).await?);
    }
    Ok(reports)
}

/// `--storage-only`: the storage measurement alone, to `DIR/<date>-storage.json` and `.md`.
fn write_storage_only(
    out: &std::path::Path,
    quick: bool,
    reports: &[storage::Report],
    t0: Instant,
) -> Result<()> {
    let date = chrono::Utc::now().format("%Y-%m-%dT%H%M%SZ").to_string();
    let json = json!({"date": date, "quick": quick,
                      "storage": reports.iter().map(storage::Report::to_json).collect::<Vec<_>>(),
                      "duration_s": t0.elapsed().as_secs()});
    let mut md = format!(
        "# Herald storage per intent {date}{}\n\n",
        if quick { " (quick)" } else { "" }
    );
    for r in reports {
        writeln!(md, "{}", r.markdown())?;
    }
    std::fs::create_dir_all(out)?;
    let json_path = out.join(format!("{date}-storage.json"));
    std::fs::write(&json_path, serde_json::to_string_pretty(&json)?)?;
    std::fs::write(out.join(format!("{date}-storage.md")), &md)?;
    println!("{md}");
    println!("bench: wrote {}", json_path.display());
    Ok(())
}
