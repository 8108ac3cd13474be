//! `herald-bench [--quick] [--storage-only | --latency-only | --security-only | --pooler-only] [--growth N,N...] [--out DIR]`: the benchmark behind `make bench` (and
//! `make bench-quick`). On the real local stack, side by side in one run: ingest against
//! a do-nothing Kafka consumer, Herald's own statements without Kafka and the naive
//! one-transaction-per-event loop; delivery against the Little's-law limit of a 50 ms
//! provider stand-in and the sequential loop; ingest and delivery through SASL_SSL against
//! plaintext, and through PgBouncer in transaction mode against a direct PostgreSQL; end-to-end latency at half capacity; resource use; scale-out; and ingest
//! rates as the intents table grows. Writes
//! `DIR/<date>.json` and `DIR/<date>.md` (default DIR `bench/results`). Timings are
//! reported, never asserted: the machine is shared and noisy, so read the ratios.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use herald_store::plans::HOT_STATEMENTS;
use herald_tools::bench::compare::{self, Comparison, Sides};
use herald_tools::bench::host::{self, Calibration, CpuTimes};
use herald_tools::bench::ingest::{self, Workload};
use herald_tools::bench::latency::{self, percentile, HOPS};
use herald_tools::bench::procstat::Usage;
use herald_tools::bench::{cost, delivery, floor, pooler, security, storage, Figure, Target};
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
                growth: vec![10_000, 100_000, 1_000_000, 5_000_000],
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

const USAGE: &str = "\
usage: herald-bench [--quick] [MODE] [--growth N,N...] [--busy N] [--out DIR]

The benchmark behind `make bench` on the running local stack (`make stack-up`), with the
Herald binary in HERALD_BIN. Without a MODE: every measurement (about 25 minutes, far
less with --quick). Results go to DIR/<date>.json and .md (DIR: bench/results), each with
the host's calibration (CPU, fsync, steal time, PostgreSQL's and Kafka's settings).

  --quick           one run of each, at smaller sizes
  --latency-only    end-to-end latency and cost at half the recorded capacity and at
                    1,000 events/s, hop by hop: DIR/<date>-latency.*
  --security-only   ingest and delivery through SASL_SSL against plaintext
  --pooler-only     ingest and delivery through PgBouncer against a direct PostgreSQL
  --storage-only    table and index sizes, WAL and vacuum per notification
  --growth N,N...   the sizes of the ingest-rate-as-the-table-grows series
  --out DIR         where the results go
  --busy N          N threads that only spin, at normal priority, from before the
                    calibration to the end: a host with other work on it (a noisy
                    neighbour), to reproduce a slow host's figures on a fast one
  --host-only       the host's calibration alone, printed as JSON (no stack needed)
  -h, --help        this text

Environment: HERALD_BIN (the herald binary), HERALD_BENCH_TRACE_RATIO (the share of
traces exported for the hop breakdown, 0.1 by default).
";

/// The command line, parsed; `Err` carries what to print (usage, or what was wrong).
#[derive(Debug, Default, PartialEq)]
struct Args {
    quick: bool,
    mode: Option<&'static str>,
    growth: Option<String>,
    out: Option<PathBuf>,
    busy: usize,
}

const MODES: [&str; 5] = [
    "--latency-only",
    "--security-only",
    "--pooler-only",
    "--storage-only",
    "--host-only",
];

fn parse_args(args: &[String]) -> std::result::Result<Args, String> {
    let mut parsed = Args::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-h" | "--help" => return Err(USAGE.to_owned()),
            "--quick" => parsed.quick = true,
            "--growth" | "--out" | "--busy" => {
                let value = it
                    .next()
                    .filter(|v| !v.starts_with("--"))
                    .ok_or_else(|| format!("herald-bench: {a} needs a value\n\n{USAGE}"))?;
                if a == "--growth" {
                    parsed.growth = Some(value.clone());
                } else if a == "--busy" {
                    parsed.busy = value.parse().map_err(|_| {
                        format!("herald-bench: --busy {value}: not a number of threads\n\n{USAGE}")
                    })?;
                } else {
                    parsed.out = Some(PathBuf::from(value));
                }
            }
            m => match MODES.iter().find(|k| **k == m) {
                Some(mode) if parsed.mode.is_none() => parsed.mode = Some(mode),
                Some(mode) => {
                    return Err(format!(
                        "herald-bench: {mode} and {} are different modes; give one\n\n{USAGE}",
                        parsed.mode.unwrap_or_default()
                    ))
                }
                None => return Err(format!("herald-bench: unknown argument {m:?}\n\n{USAGE}")),
            },
        }
    }
    Ok(parsed)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse_args(&raw) {
        Ok(a) => a,
        Err(text) => {
            // --help to stdout and exit 0; a wrong argument to stderr and exit 2.
            if raw.iter().any(|a| a == "-h" || a == "--help") {
                print!("{text}");
                return Ok(());
            }
            eprint!("{text}");
            std::process::exit(2);
        }
    };
    let quick = args.quick;
    let out = args.out.clone().unwrap_or_else(|| PathBuf::from("bench/results"));
    let mut plan = Plan::new(quick);
    // `--growth 10000,100000`: other sizes for the growth series (the full one reaches 5
    // million events, about half an hour of the run).
    if let Some(list) = &args.growth {
        plan.growth = list
            .split(',')
            .map(|n| n.trim().parse())
            .collect::<Result<_, _>>()
            .map_err(|e| anyhow::anyhow!("--growth {list}: {e}"))?;
    }
    // Spins until the process exits (at the end of the run).
    host::spin(args.busy);
    if args.mode == Some("--host-only") {
        return host::print_calibration(args.busy).await;
    }
    let t0 = Instant::now();
    let say = |s: &str| eprintln!("bench [{:>4}s] {s}", t0.elapsed().as_secs());
    say("calibrating the host (CPU workload, fdatasync, the stack's settings)");
    let calibration = Calibration::take(
        integration_tests::PG_ADMIN_URL,
        integration_tests::BROKERS,
        &integration_tests::local_dir(),
    )
    .await?;
    say(&format!(
        "host: CPU workload {:.0} ms ({:.2}x the reference), fdatasync p50 {:.0} µs ({:.2}x)",
        calibration.cpu_ms,
        calibration.cpu_factor(),
        calibration.fdatasync_us().0,
        calibration.fsync_factor()
    ));
    let _ = HOST.set((calibration.with_busy(args.busy), CpuTimes::now()?));
    // The cost measurement needs pg_stat_statements: find out now, not after half an hour.
    cost::check_statements_tracked(&integration_tests::pg_connect(integration_tests::PG_ADMIN_URL).await?)
        .await?;
    if args.mode == Some("--latency-only") {
        let (standin_addr, _) = standin::start(PROVIDER_LATENCY).await?;
        let half = recorded_half_capacity(&out).unwrap_or(LATENCY_RATE);
        let series = latency_runs(&format!("http://{standin_addr}"), half, &plan, &say).await?;
        return write_latency_only(&out, quick, &series, t0);
    }
    for (flag, sides) in [
        ("--security-only", &security::SIDES),
        ("--pooler-only", &pooler::SIDES),
    ] {
        if args.mode == Some(flag) {
            let (standin_addr, _) = standin::start(PROVIDER_LATENCY).await?;
            let w = Workload::new(plan.events);
            let endpoint = format!("http://{standin_addr}");
            let c = compare::run(sides, &w, &endpoint, plan.delivery_orders, plan.runs, &say).await?;
            return write_comparison_only(&out, quick, &w, plan.delivery_orders, sides, &c, t0);
        }
    }
    if args.mode == Some("--storage-only") {
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
    let mut floor = Figure::new(
        "floor_pg",
        "events/s",
        "the same rows by COPY into a staging table and set-based inserts, batches of 500, no Kafka",
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
        let run = ingest::herald(&env, &w, 1).await?;
        herald_ingest.runs.push(run.rate);
        ingest_usage = run.usage;
        env.cleanup().await;
        let env = TestEnv::new("bench_pg", "").await?;
        pg.runs.push(ingest::limit_pg(&env, &w).await?);
        let herald_conflicts = env.count("SELECT count(*) FROM intent_conflicts").await?;
        env.cleanup().await;
        let env = TestEnv::new("bench_floor", "").await?;
        let (rate, conflicts) = floor::ingest_copy(&env, &w).await?;
        anyhow::ensure!(
            conflicts == herald_conflicts,
            "the floor stored {conflicts} conflicts, Herald's statements {herald_conflicts}"
        );
        floor.runs.push(rate);
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
        ingest_two.runs.push(ingest::herald(&env, &w, 2).await?.rate);
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
    say("delivery floor: claim and record statements alone");
    let mut delivery_floor = Figure::new(
        "delivery floor, batches of 256",
        "notifications/s",
        "Herald's claim and record statements alone, one batch after the other, no Kafka, no provider",
    );
    for _ in 0..plan.runs {
        let (env, _) = delivery::prepare("bench_dfloor", &endpoint, plan.delivery_orders).await?;
        delivery_floor
            .runs
            .push(floor::delivery_statements(&env, 256).await?);
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

    // --- The cost of TLS and SASL, and of a transaction-mode pooler ----------------------
    let mut comparisons = Vec::new();
    for sides in [&security::SIDES, &pooler::SIDES] {
        comparisons.push(compare::run(sides, &w, &endpoint, plan.delivery_orders, plan.runs, &say).await?);
    }
    let [security, pooled] =
        <[Comparison; 2]>::try_from(comparisons).map_err(|_| anyhow::anyhow!("two comparisons"))?;

    // --- End-to-end latency and whole-machine cost ---------------------------------------
    let at_256 = delivery_figs[1].2.median();
    let capacity = herald_ingest.median().min(at_256 / 2.0);
    let half = (capacity / 2.0).max(1.0);
    let latency_series = latency_runs(&endpoint, half, &plan, &say).await?;

    // --- Growth -------------------------------------------------------------------------
    let mut growth = Vec::new();
    for &size in &plan.growth {
        say(&format!("growth: {size} events"));
        let gw = Workload::new(size);
        let env = filled("bench_growth", &gw).await?;
        let run = ingest::herald(&env, &gw, 1).await?;
        growth.push((size, run.rate, run.commit_p99_ms));
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
            text: "herald ingest >= 0.5 x min(limit_kafka, floor_pg)".into(),
            lhs: herald_ingest.median(),
            rhs: kafka.median().min(floor.median()),
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
    let mut figures = vec![&kafka, &pg, &floor, &naive, &herald_ingest, &ingest_two];
    figures.extend(delivery_figs.iter().map(|(_, _, f)| f));
    figures.extend([&delivery_floor, &sequential, &deliver_two]);
    figures.extend(security.figures());
    figures.extend(pooled.figures());
    let json = json!({
        "date": date,
        "quick": quick,
        "workload": {"events": w.events, "distinct_orders": w.distinct, "duplicates": w.duplicates,
                     "conflicting_reemissions": w.conflicts, "channels_per_event": 2, "sellers": ingest::SELLERS},
        "provider_latency_ms": PROVIDER_LATENCY.as_millis() as u64,
        "trace_ratio": latency::trace_ratio()?,
        "figures": figures.iter().map(|f| f.to_json()).collect::<Vec<_>>(),
        "delivery": delivery_figs.iter().map(|(n, limit, f)| json!({"in_flight": n, "limit": limit, "median": f.median(),
            "min": f.min(), "max": f.max()})).collect::<Vec<_>>(),
        "targets": targets.iter().map(|t| json!({"target": t.text, "ratio": t.lhs / t.rhs, "met": t.met()})).collect::<Vec<_>>(),
        "latency": latency_series.iter().map(Series::to_json).collect::<Vec<_>>(),
        "security": comparison_json(&security),
        "pooler": comparison_json(&pooled),
        "resources": {
            "ingest": {"peak_rss_mib": ingest_usage.peak_rss_mib, "cpu_s_per_10k_events": ingest_usage.cpu_seconds / (w.events as f64) * 10_000.0},
            "deliver": {"peak_rss_mib": deliver_usage.peak_rss_mib, "cpu_s_per_10k_sends": deliver_usage.cpu_seconds / sends_measured.max(1.0) * 10_000.0},
        },
        "growth": growth.iter().map(|(n, r, p99)| json!({"events": n, "events_per_s": r, "ingest_commit_p99_ms": p99})).collect::<Vec<_>>(),
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
    writeln!(md)?;
    write_comparison(&mut md, &security::SIDES, &security)?;
    writeln!(md)?;
    write_comparison(&mut md, &pooler::SIDES, &pooled)?;
    writeln!(md)?;
    write_latency(&mut md, &latency_series)?;
    writeln!(md)?;
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
        "\nGrowth (one ingest process, start to lag 0):\n\n| events on the topic | events/s | ingest commit p99, ms |\n|---|---|---|"
    )?;
    for (n, r, p99) in &growth {
        writeln!(md, "| {n} | {r:.0} | {p99:.0} |")?;
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

    let json = write_results(&out, &date, &json, &md)?;
    std::fs::write(out.join("latest.json"), serde_json::to_string_pretty(&json)?)?;
    Ok(())
}

/// The host's calibration, taken before the run, and its CPU times then: every report
/// carries both ([`write_results`]).
static HOST: std::sync::OnceLock<(Calibration, CpuTimes)> = std::sync::OnceLock::new();

/// Writes `DIR/<stem>.json` and `.md`, each with the host's calibration and what the CPUs
/// did from the start of the run to now, and prints the Markdown. Returns the JSON written.
fn write_results(
    out: &std::path::Path,
    stem: &str,
    json: &serde_json::Value,
    md: &str,
) -> Result<serde_json::Value> {
    let (json, md) = match HOST.get() {
        Some((calibration, start)) => {
            let during = start.share_until(&CpuTimes::now()?);
            let mut json = json.clone();
            json["host"] = calibration.to_json();
            json["host"]["during_run"] = during.to_json();
            // After the title line: the host is what the figures below are read against.
            let (title, rest) = md.split_once("\n\n").unwrap_or((md, ""));
            let md = format!("{title}\n\n{}{rest}", calibration.markdown(Some(&during)));
            (json, md)
        }
        None => (json.clone(), md.to_owned()),
    };
    std::fs::create_dir_all(out)?;
    let json_path = out.join(format!("{stem}.json"));
    std::fs::write(&json_path, serde_json::to_string_pretty(&json)?)?;
    std::fs::write(out.join(format!("{stem}.md")), &md)?;
    println!("{md}");
    println!("bench: wrote {}", json_path.display());
    Ok(json)
}

/// One comparison's figures and each pair's ratio of medians.
fn write_comparison(md: &mut String, sides: &Sides, c: &Comparison) -> Result<()> {
    let [first, second] = sides.names;
    writeln!(md, "Herald through {second} against {first}, alternating:\n")?;
    writeln!(
        md,
        "| figure | median | min | max | unit | what |\n|---|---|---|---|---|---|"
    )?;
    for f in c.figures() {
        writeln!(md, "{}", f.row())?;
    }
    writeln!(
        md,
        "\n| {second} / {first} | ratio of medians | each run against the {first} run beside it |\n|---|---|---|"
    )?;
    for (what, ratio, paired) in c.ratios() {
        let paired: Vec<String> = paired.iter().map(|r| format!("{r:.3}")).collect();
        writeln!(md, "| {what} | {ratio:.3} | {} |", paired.join(", "))?;
    }
    Ok(())
}

fn comparison_json(c: &Comparison) -> serde_json::Value {
    json!({
        "sides": c.names,
        "figures": c.figures().iter().map(|f| f.to_json()).collect::<Vec<_>>(),
        "ratios": c.ratios().iter().map(|(what, r, paired)| json!({"what": what, "second_over_first": r, "paired": paired})).collect::<Vec<_>>(),
    })
}

/// `--security-only`, `--pooler-only`: one comparison alone, to
/// `DIR/<date>-<namespace>.json` and `.md`.
fn write_comparison_only(
    out: &std::path::Path,
    quick: bool,
    w: &Workload,
    delivery_orders: usize,
    sides: &Sides,
    c: &Comparison,
    t0: Instant,
) -> Result<()> {
    let date = chrono::Utc::now().format("%Y-%m-%dT%H%M%SZ").to_string();
    let json = json!({"date": date, "quick": quick, "events": w.events, "delivery_orders": delivery_orders,
                      sides.namespace: comparison_json(c), "duration_s": t0.elapsed().as_secs()});
    let mut md = format!(
        "# Herald through {} against {} {date}{}\n\nIngest: {} events; delivery: {} orders (two channels), 50 ms provider stand-in.\n\n",
        sides.names[1],
        sides.names[0],
        if quick { " (quick)" } else { "" },
        w.events,
        delivery_orders
    );
    write_comparison(&mut md, sides, c)?;
    writeln!(md, "\nTook {} s.", t0.elapsed().as_secs())?;
    write_results(out, &format!("{date}-{}", sides.namespace), &json, &md)?;
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
    write_results(out, &format!("{date}-storage"), &json, &md)?;
    Ok(())
}

/// The fixed offered rate of the latency measurement, beside half the capacity.
const LATENCY_RATE: f64 = 1000.0;

/// The figures of [`Series::costs`].
const COST_FIGURES: usize = 14;

/// The runs at one offered rate.
struct Series {
    label: String,
    runs: Vec<latency::Run>,
}

impl Series {
    fn of<T>(&self, f: impl Fn(&latency::Run) -> T) -> Vec<T> {
        self.runs.iter().map(f).collect()
    }

    fn figure(&self, name: &str, unit: &'static str, f: impl Fn(&latency::Run) -> f64) -> Figure {
        let mut fig = Figure::new(format!("{} {name}", self.label), unit, "");
        fig.runs = self.of(f);
        fig
    }

    /// Each hop's p50 and p99 over the traced notifications of every run together.
    fn hops(&self) -> Vec<(f64, f64)> {
        (0..HOPS.len())
            .map(|h| {
                let all: Vec<f64> = self.runs.iter().flat_map(|r| r.hops[h].iter().copied()).collect();
                (percentile(&all, 0.5), percentile(&all, 0.99))
            })
            .collect()
    }

    /// The ingest hop by stage over every run's notifications whose batch was traced, in
    /// the order the stages run.
    fn ingest_stages(&self) -> Vec<(String, Vec<f64>)> {
        latency::by_stage(
            self.runs
                .iter()
                .flat_map(|r| r.traced_stages.iter().map(Vec::as_slice)),
        )
    }

    fn costs(&self) -> [Figure; COST_FIGURES] {
        let per_10k = |s: f64, r: &latency::Run| s / r.notifications.max(1) as f64 * 10_000.0;
        let per_one = |v: f64, r: &latency::Run| v / r.notifications.max(1) as f64;
        [
            self.figure("CPU s per 10k, Herald", "s", |r| per_10k(r.cost.herald_cpu_s, r)),
            self.figure("CPU s per 10k, PostgreSQL", "s", |r| {
                per_10k(r.cost.postgres_cpu_s, r)
            }),
            self.figure("CPU s per 10k, Kafka", "s", |r| per_10k(r.cost.kafka_cpu_s, r)),
            self.figure("CPU s per 10k, machine", "s", |r| {
                per_10k(r.cost.machine_cpu_s(), r)
            }),
            self.figure("WAL bytes per notification", "bytes", |r| {
                per_one(r.cost.wal_bytes, r)
            }),
            self.figure("transactions per notification", "", |r| {
                per_one(r.cost.transactions, r)
            }),
            self.figure("statements per notification", "", |r| {
                per_one(r.cost.statements, r)
            }),
            // Finished from the stretch's start to the end of Herald's shutdown: their CPU is
            // in PostgreSQL's.
            self.figure("autovacuum runs on Herald's tables", "runs", |r| {
                r.cost.autovacuums
            }),
            self.figure("autoanalyze runs on Herald's tables", "runs", |r| {
                r.cost.autoanalyzes
            }),
            // The 20 s after the stretch, without events, while Herald still runs.
            self.figure("idle, % of a core, Herald", "%", |r| r.cost.idle_herald_pct),
            self.figure("idle, % of a core, PostgreSQL", "%", |r| r.cost.idle_postgres_pct),
            self.figure("idle, % of a core, Kafka", "%", |r| r.cost.idle_kafka_pct),
            // The whole machine's CPUs over the stretch (/proc/stat): what else ran.
            self.figure("machine CPU busy, % of all cores", "%", |r| {
                r.cost.machine.busy_pct
            }),
            self.figure("steal, % of all cores' time", "%", |r| r.cost.machine.steal_pct),
        ]
    }

    fn to_json(&self) -> serde_json::Value {
        let p50 = self.figure("p50", "ms", |r| r.p50_ms);
        let p99 = self.figure("p99", "ms", |r| r.p99_ms);
        json!({
            "label": self.label,
            "p50_ms": p50.to_json(),
            "p99_ms": p99.to_json(),
            "hops": HOPS.iter().zip(self.hops()).map(|((name, what), (p50, p99))|
                json!({"hop": name, "what": what, "p50_ms": p50, "p99_ms": p99})).collect::<Vec<_>>(),
            "ingest_stages": self.ingest_stages().iter().map(|(stage, v)| json!({"stage": stage,
                "notifications": v.len(), "p50_ms": percentile(v, 0.5), "p99_ms": percentile(v, 0.99)})).collect::<Vec<_>>(),
            "cost": self.costs().iter().map(Figure::to_json).collect::<Vec<_>>(),
            "runs": self.of(latency::Run::to_json),
        })
    }
}

/// End-to-end latency and whole-machine cost at half the capacity and at 1,000 events/s.
async fn latency_runs(endpoint: &str, half: f64, plan: &Plan, say: &impl Fn(&str)) -> Result<Vec<Series>> {
    let mut all = Vec::new();
    for (label, rate) in [
        (format!("half capacity ({half:.0}/s)"), half),
        (format!("{LATENCY_RATE:.0}/s"), LATENCY_RATE),
    ] {
        let mut series = Series {
            label,
            runs: Vec::new(),
        };
        for run in 0..plan.runs {
            say(&format!(
                "end to end at {rate:.0} events/s, run {}/{}",
                run + 1,
                plan.runs
            ));
            let r = latency::run(endpoint, rate, plan.latency_seconds).await?;
            let slowest: Vec<String> = r
                .slowest_seconds
                .iter()
                .map(|(t, n, p99)| format!("{t} UTC ({n} notifications, p99 {p99:.0} ms)"))
                .collect();
            say(&format!(
                "p50 {:.0} ms, p99 {:.0} ms (the start's first {} s: p99 {:.0} ms); slowest seconds: {}",
                r.p50_ms,
                r.p99_ms,
                latency::WARMUP_SECONDS,
                r.warmup_p99_ms,
                slowest.join(", ")
            ));
            series.runs.push(r);
        }
        all.push(series);
    }
    Ok(all)
}

fn write_latency(md: &mut String, series: &[Series]) -> Result<()> {
    writeln!(
        md,
        "End to end (event produced -> attempt `accepted` recorded; ingest, relay and deliver in one \
         process with default settings), {} s of events per run:\n",
        series
            .first()
            .and_then(|s| s.runs.first())
            .map_or(0, |r| r.events as u64 / r.offered.max(1.0) as u64)
    )?;
    writeln!(
        md,
        "| offered | p50 ms, median (min-max) | p99 ms, median (min-max) | notifications per run | \
         the first {} s after the start: p50 / p99 ms, median (p99 max) |\n|---|---|---|---|---|",
        latency::WARMUP_SECONDS
    )?;
    for s in series {
        let p50 = s.figure("p50", "ms", |r| r.p50_ms);
        let p99 = s.figure("p99", "ms", |r| r.p99_ms);
        let start_p50 = s.figure("warmup p50", "ms", |r| r.warmup_p50_ms);
        let start_p99 = s.figure("warmup p99", "ms", |r| r.warmup_p99_ms);
        writeln!(
            md,
            "| {} | {:.0} ({:.0}-{:.0}) | {:.0} ({:.0}-{:.0}) | {} | {:.0} / {:.0} ({:.0}) |",
            s.label,
            p50.median(),
            p50.min(),
            p50.max(),
            p99.median(),
            p99.min(),
            p99.max(),
            s.runs.first().map_or(0, |r| r.notifications),
            start_p50.median(),
            start_p99.median(),
            start_p99.max()
        )?;
    }
    writeln!(
        md,
        "\nWhere the time goes, per hop, from the spans of the traced share (p50 / p99 ms):\n"
    )?;
    write!(md, "| hop | what |")?;
    for s in series {
        write!(md, " {} |", s.label)?;
    }
    writeln!(md, "\n|---|---|{}", "---|".repeat(series.len()))?;
    let hops: Vec<Vec<(f64, f64)>> = series.iter().map(Series::hops).collect();
    for (h, (name, what)) in HOPS.iter().enumerate() {
        write!(md, "| {name} | {what} |")?;
        for s in &hops {
            write!(md, " {:.1} / {:.1} |", s[h].0, s[h].1)?;
        }
        writeln!(md)?;
    }
    write!(md, "| whole path of the traced | the sum of the hops |")?;
    for s in series {
        let all: Vec<f64> = s
            .runs
            .iter()
            .flat_map(|r| r.traced_paths.iter().copied())
            .collect();
        write!(
            md,
            " {:.1} / {:.1} |",
            percentile(&all, 0.5),
            percentile(&all, 0.99)
        )?;
    }
    write!(
        md,
        "\n| traced notifications | whole batches, {:.0}% of them |",
        latency::trace_ratio()? * 100.0
    )?;
    for s in series {
        write!(md, " {} |", s.runs.iter().map(|r| r.traced).sum::<usize>())?;
    }
    writeln!(
        md,
        "\n\nThe ingest hop by stage (spans under the batch's `receive` span; the notifications \
         whose batch was traced too; p50 / p99 ms):\n"
    )?;
    write!(md, "| stage |")?;
    for s in series {
        write!(md, " {} |", s.label)?;
    }
    writeln!(md, "\n|---|{}", "---|".repeat(series.len()))?;
    let stages: Vec<Vec<(String, Vec<f64>)>> = series.iter().map(Series::ingest_stages).collect();
    let names: Vec<String> = stages
        .iter()
        .max_by_key(|s| s.len())
        .map(|s| s.iter().map(|(n, _)| n.clone()).collect())
        .unwrap_or_default();
    for name in &names {
        write!(md, "| {name} |")?;
        for s in &stages {
            match s.iter().find(|(n, _)| n == name) {
                Some((_, v)) => write!(md, " {:.2} / {:.2} |", percentile(v, 0.5), percentile(v, 0.99))?,
                None => write!(md, " - |")?,
            }
        }
        writeln!(md)?;
    }
    write!(md, "| notifications |")?;
    for s in &stages {
        write!(md, " {} |", s.first().map_or(0, |(_, v)| v.len()))?;
    }
    writeln!(
        md,
        "\n\nWhole-machine cost (Herald, PostgreSQL and Kafka processes; median (min-max) of the runs):\n"
    )?;
    write!(md, "| figure |")?;
    for s in series {
        write!(md, " {} |", s.label)?;
    }
    writeln!(md, "\n|---|{}", "---|".repeat(series.len()))?;
    let costs: Vec<[Figure; COST_FIGURES]> = series.iter().map(Series::costs).collect();
    for i in 0..COST_FIGURES {
        let name = costs[0][i]
            .name
            .strip_prefix(&format!("{} ", series[0].label))
            .unwrap_or(&costs[0][i].name)
            .to_owned();
        write!(md, "| {name} |")?;
        for c in &costs {
            let f = &c[i];
            let digits = if f.median() >= 100.0 || f.unit == "runs" {
                0
            } else {
                2
            };
            write!(
                md,
                " {:.*} ({:.*}-{:.*}) |",
                digits,
                f.median(),
                digits,
                f.min(),
                digits,
                f.max()
            )?;
        }
        writeln!(md)?;
    }
    Ok(())
}

/// Half the capacity the last full run measured, from `DIR/latest.json`.
fn recorded_half_capacity(out: &std::path::Path) -> Option<f64> {
    let text = std::fs::read_to_string(out.join("latest.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let latency = v.get("latency")?;
    match latency {
        serde_json::Value::Array(series) => series
            .first()?
            .get("runs")?
            .get(0)?
            .get("offered_events_per_s")?
            .as_f64(),
        other => other.get("offered_events_per_s")?.as_f64(),
    }
}

/// `--latency-only`: the latency and cost series alone, to `DIR/<date>-latency.json` and `.md`.
fn write_latency_only(out: &std::path::Path, quick: bool, series: &[Series], t0: Instant) -> Result<()> {
    let date = chrono::Utc::now().format("%Y-%m-%dT%H%M%SZ").to_string();
    let json = json!({"date": date, "quick": quick, "provider_latency_ms": PROVIDER_LATENCY.as_millis() as u64,
                      "trace_ratio": latency::trace_ratio()?,
                      "latency": series.iter().map(Series::to_json).collect::<Vec<_>>(),
                      "duration_s": t0.elapsed().as_secs()});
    let mut md = format!(
        "# Herald latency and cost {date}{}\n\n",
        if quick { " (quick)" } else { "" }
    );
    write_latency(&mut md, series)?;
    write_results(out, &format!("{date}-latency"), &json, &md)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> std::result::Result<Args, String> {
        parse_args(&args.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>())
    }

    #[test]
    fn help_and_anything_unknown_print_the_usage_instead_of_running() {
        for args in [
            &["--help"][..],
            &["-h"],
            &["--quick", "--help"],
            &["--latency"],
            &["quick"],
            &["--out"],
        ] {
            let text = parse(args).expect_err(&format!("{args:?} must not start a run"));
            assert!(text.contains("usage: herald-bench"), "{args:?}: {text}");
        }
        assert!(parse(&["--latency-only", "--storage-only"]).is_err());
        assert!(parse(&["--out", "--quick"]).is_err(), "a flag is not a directory");
        assert!(parse(&["--busy", "two"]).is_err());
    }

    #[test]
    fn the_known_arguments_parse() {
        assert_eq!(parse(&[]).unwrap(), Args::default());
        assert_eq!(
            parse(&[
                "--quick",
                "--latency-only",
                "--out",
                "x",
                "--growth",
                "1,2",
                "--busy",
                "2"
            ])
            .unwrap(),
            Args {
                quick: true,
                mode: Some("--latency-only"),
                growth: Some("1,2".into()),
                out: Some(PathBuf::from("x")),
                busy: 2,
            }
        );
    }
}
