//! The host a benchmark ran on, so that figures from two machines can be compared: a fixed
//! CPU workload's time, the latency of the 8 KiB write + `fdatasync` PostgreSQL's WAL
//! flush does (on the file system of its data directory), the cores, what else took the
//! CPU during the run (steal time, I/O wait: `/proc/stat`), and the PostgreSQL and Kafka
//! versions and settings that decide a commit's and a produce's cost.
//!
//! The calibration is measured before the run, with the stack up and idle; a host busy
//! with something else then reads slow, which is what it is for the run too. The reference
//! figures ([`REFERENCE`]) are those of the host BENCHMARKS.md was measured on: a report
//! gives each of this host's figures as a multiple of the reference's.

use std::io::Write as _;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::{json, Value};

/// The reference host's calibration (BENCHMARKS.md's host: 2 cores of an AMD EPYC VM,
/// PostgreSQL's data on its virtual disk), measured with this module on 2026-12-07: four
/// calibrations with the stack idle read 185-190 ms and 68-69 µs.
pub const REFERENCE: Reference = Reference {
    cpu_ms: 186.0,
    fdatasync_p50_us: 69.0,
};

/// The reference figures a report compares with.
#[derive(Debug, Clone, Copy)]
pub struct Reference {
    /// [`cpu_round`]'s median, release build, one core.
    pub cpu_ms: f64,
    /// The median 8 KiB write + `fdatasync` on PostgreSQL's file system.
    pub fdatasync_p50_us: f64,
}

/// Rounds of the CPU workload; the median is reported (the first warms the caches).
const CPU_ROUNDS: usize = 7;
/// Writes + `fdatasync` timed (pg_test_fsync's "one 8kB write" case, for 100 writes).
const FSYNC_WRITES: usize = 100;

/// The host's calibration, taken once before a run.
#[derive(Debug, Clone)]
pub struct Calibration {
    pub cores: usize,
    pub cpu_model: String,
    pub kernel: String,
    /// [`cpu_round`]: the median and the fastest of [`CPU_ROUNDS`], ms.
    pub cpu_ms: f64,
    pub cpu_min_ms: f64,
    /// Where the `fdatasync` latency was measured, and its p50 / p99 in µs (absent when
    /// no folder took the file).
    pub fsync: Option<(PathBuf, (f64, f64))>,
    /// The 1-minute load average when calibrated: what else was running.
    pub loadavg_1m: f64,
    /// PostgreSQL's version and settings (absent when it could not be asked).
    pub postgres: Option<Value>,
    /// Kafka's version, its JVM's flags and the broker's settings (absent likewise).
    pub kafka: Option<Value>,
    /// Threads the bench itself kept busy (`--busy`): a slowness made on purpose.
    pub busy_threads: usize,
}

impl Calibration {
    /// Measures the CPU and `fsync` and reads the stack's settings: PostgreSQL through
    /// `pg_admin_url`, Kafka through `brokers` and its install under `local`.
    pub async fn take(pg_admin_url: &str, brokers: &str, local: &Path) -> Result<Self> {
        // Neither PostgreSQL nor Kafka is needed: what cannot be read is left out.
        let postgres = match integration_tests::pg_connect(pg_admin_url).await {
            Ok(admin) => postgres_settings(&admin).await.ok(),
            Err(_) => None,
        };
        // Where PostgreSQL's data is (beside its data directory: the same file system
        // unless the data directory is a mount of its own), else the local stack's
        // folder, else the temporary one: the first that takes a file.
        let beside_data = postgres
            .as_ref()
            .and_then(|p| p["data_directory"].as_str())
            .and_then(|d| Path::new(d).parent().map(Path::to_path_buf));
        let fsync = beside_data
            .into_iter()
            .chain([local.to_path_buf(), std::env::temp_dir()])
            .filter(|d| d.is_dir())
            .find_map(|d| fdatasync_latency(&d).ok().map(|l| (d, l)));
        let mut rounds: Vec<f64> = (0..CPU_ROUNDS)
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(cpu_round());
                t.elapsed().as_secs_f64() * 1000.0
            })
            .collect();
        rounds.sort_by(f64::total_cmp);
        let kafka = kafka_settings(brokers, local).await.ok();
        Ok(Self {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model: cpuinfo_field("model name").unwrap_or_default(),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_owned(),
            cpu_ms: rounds[CPU_ROUNDS / 2],
            cpu_min_ms: rounds[0],
            fsync,
            loadavg_1m: std::fs::read_to_string("/proc/loadavg")
                .ok()
                .and_then(|l| l.split_whitespace().next()?.parse().ok())
                .unwrap_or(f64::NAN),
            postgres,
            kafka,
            busy_threads: 0,
        })
    }

    /// The same, noting that `threads` spinning threads ran beside it ([`spin`]).
    pub fn with_busy(mut self, threads: usize) -> Self {
        self.busy_threads = threads;
        self
    }

    /// This host's CPU time for the workload over the reference host's: 2.0 is a host
    /// half as fast.
    pub fn cpu_factor(&self) -> f64 {
        self.cpu_ms / REFERENCE.cpu_ms
    }

    /// The p50 and p99 of the write + `fdatasync`, µs (NaN when not measured).
    pub fn fdatasync_us(&self) -> (f64, f64) {
        self.fsync.as_ref().map_or((f64::NAN, f64::NAN), |(_, l)| *l)
    }

    pub fn fsync_factor(&self) -> f64 {
        self.fdatasync_us().0 / REFERENCE.fdatasync_p50_us
    }

    pub fn to_json(&self) -> Value {
        json!({
            "cores": self.cores,
            "cpu_model": self.cpu_model,
            "kernel": self.kernel,
            "cpu_calibration_ms": self.cpu_ms,
            "cpu_calibration_min_ms": self.cpu_min_ms,
            "cpu_factor": self.cpu_factor(),
            "fsync_dir": self.fsync.as_ref().map(|(d, _)| d.display().to_string()),
            "fdatasync_8k_p50_us": self.fsync.as_ref().map(|(_, l)| l.0),
            "fdatasync_8k_p99_us": self.fsync.as_ref().map(|(_, l)| l.1),
            "fsync_factor": self.fsync_factor(),
            "loadavg_1m": self.loadavg_1m,
            "busy_threads": self.busy_threads,
            "reference": {"cpu_calibration_ms": REFERENCE.cpu_ms, "fdatasync_8k_p50_us": REFERENCE.fdatasync_p50_us},
            "postgres": self.postgres,
            "kafka": self.kafka,
        })
    }

    /// The report's "Host" section: the calibration, and what the run shared the CPU with.
    pub fn markdown(&self, during: Option<&CpuShare>) -> String {
        let mut md = format!(
            "## Host\n\n{} cores ({}), Linux {}; load average {:.2} when calibrated.\n\n\
             | calibration | this host | reference host | factor |\n|---|---|---|---|\n\
             | CPU workload (one core, median of {CPU_ROUNDS}) | {:.0} ms | {:.0} ms | {:.2}x |\n\
             | 8 KiB write + fdatasync, p50 (p99; with the CPUs' scheduling delay in it) | {:.0} µs ({:.0}) | {:.0} µs | {:.2}x |\n",
            self.cores,
            self.cpu_model,
            self.kernel,
            self.loadavg_1m,
            self.cpu_ms,
            REFERENCE.cpu_ms,
            self.cpu_factor(),
            self.fdatasync_us().0,
            self.fdatasync_us().1,
            REFERENCE.fdatasync_p50_us,
            self.fsync_factor(),
        );
        if self.busy_threads > 0 {
            md.push_str(&format!(
                "\n**A slow host made on purpose**: {} threads of the bench spun at normal priority \
                 from before the calibration to the end (`--busy {}`).\n",
                self.busy_threads, self.busy_threads
            ));
        }
        if let Some(c) = during {
            md.push_str(&format!(
                "\nDuring the run: CPU busy {:.0}% of all cores, steal {:.1}%, I/O wait {:.1}%.\n",
                c.busy_pct, c.steal_pct, c.iowait_pct
            ));
        }
        let setting = |v: &Option<Value>, k: &str| {
            v.as_ref()
                .and_then(|v| v["settings"][k].as_str().or(v[k].as_str()).map(str::to_owned))
                .unwrap_or_else(|| "?".into())
        };
        md.push_str(&format!(
            "\nPostgreSQL {} (synchronous_commit {}, fsync {}, wal_sync_method {}, shared_buffers {}); \
             Kafka {} (log.flush.interval.messages {}, num.io.threads {}, num.network.threads {}).\n\n",
            setting(&self.postgres, "server_version"),
            setting(&self.postgres, "synchronous_commit"),
            setting(&self.postgres, "fsync"),
            setting(&self.postgres, "wal_sync_method"),
            setting(&self.postgres, "shared_buffers"),
            setting(&self.kafka, "version"),
            setting(&self.kafka, "log.flush.interval.messages"),
            setting(&self.kafka, "num.io.threads"),
            setting(&self.kafka, "num.network.threads"),
        ));
        md
    }
}

/// One round of the CPU calibration workload, single-threaded and deterministic: what
/// Herald's hot path does most (JSON parsed and written, a template's strings formatted,
/// hashing), no I/O, no allocation-free shortcut the optimizer can take.
pub fn cpu_round() -> u64 {
    let mut acc = 0u64;
    for i in 0..100_000u64 {
        let event = format!(
            r#"{{"event_id":"evt-{i}","event_kind":"order.created","marketplace_id":"acme","order_id":"o-{i}","seller_id":"seller-{s}","occurred_at":"2026-12-07T10:00:00.123456Z","order":{{"total":"{t}.{c:02}","currency":"EUR","item_count":{n}}}}}"#,
            s = i % 97,
            t = i % 1000,
            c = i % 100,
            n = i % 7 + 1
        );
        let v: Value = serde_json::from_str(&event).expect("the calibration's JSON parses");
        let text = format!(
            "Order {} of {} {}: {} items",
            v["order_id"].as_str().unwrap_or(""),
            v["order"]["total"].as_str().unwrap_or(""),
            v["order"]["currency"].as_str().unwrap_or(""),
            v["order"]["item_count"]
        );
        let out = serde_json::to_vec(&json!({"subject": text, "body": event})).expect("serializes");
        acc = acc.wrapping_add(u64::from(blake3::hash(&out).as_bytes()[0]));
    }
    acc
}

/// p50 and p99 (µs) of an 8 KiB write at offset 0 followed by `fdatasync`, in a temporary
/// file in `dir` (removed after): the cost of each WAL flush PostgreSQL's commit waits for.
fn fdatasync_latency(dir: &Path) -> Result<(f64, f64)> {
    let path = dir.join(format!(".herald-bench-fsync-{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        let block = [0x5au8; 8192];
        // Allocated first, as a WAL segment is: the timed writes overwrite, never extend.
        f.write_all(&block)?;
        f.sync_all()?;
        let mut us: Vec<f64> = (0..FSYNC_WRITES)
            .map(|_| {
                let t = Instant::now();
                f.write_all_at(&block, 0)?;
                f.sync_data()?;
                Ok(t.elapsed().as_secs_f64() * 1e6)
            })
            .collect::<std::io::Result<_>>()?;
        us.sort_by(f64::total_cmp);
        Ok((
            super::latency::percentile(&us, 0.5),
            super::latency::percentile(&us, 0.99),
        ))
    })();
    let _ = std::fs::remove_file(&path);
    result
}

fn cpuinfo_field(name: &str) -> Option<String> {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()?
        .lines()
        .find(|l| l.starts_with(name))?
        .split_once(':')
        .map(|(_, v)| v.trim().to_owned())
}

/// PostgreSQL's settings that decide what a commit and a statement cost.
const PG_SETTINGS: [&str; 16] = [
    "server_version",
    "data_directory",
    "synchronous_commit",
    "fsync",
    "wal_sync_method",
    "full_page_writes",
    "wal_compression",
    "shared_buffers",
    "wal_buffers",
    "commit_delay",
    "wal_writer_delay",
    "checkpoint_timeout",
    "max_wal_size",
    "synchronous_standby_names",
    "jit",
    "max_connections",
];

async fn postgres_settings(admin: &tokio_postgres::Client) -> Result<Value> {
    let names: Vec<String> = PG_SETTINGS.iter().map(|s| (*s).to_owned()).collect();
    let rows = admin
        .query(
            "SELECT name, setting || coalesce(' ' || unit, '') FROM pg_settings WHERE name = ANY($1)",
            &[&names],
        )
        .await
        .context("reading pg_settings")?;
    let settings: serde_json::Map<String, Value> = rows
        .iter()
        .map(|r| (r.get::<_, String>(0), Value::String(r.get(1))))
        .collect();
    let data_directory = settings.get("data_directory").cloned().unwrap_or(Value::Null);
    Ok(json!({"settings": settings, "data_directory": data_directory}))
}

/// The broker's settings that decide what a produce and a fetch cost.
const KAFKA_SETTINGS: [&str; 9] = [
    "log.flush.interval.messages",
    "log.flush.interval.ms",
    "num.io.threads",
    "num.network.threads",
    "num.replica.fetchers",
    "default.replication.factor",
    "min.insync.replicas",
    "compression.type",
    "log.segment.bytes",
];

/// Kafka's version (the installed jar's), its JVM's flags (`-X...` of the broker's command
/// line) and the broker's effective settings (DescribeConfigs of node 1).
async fn kafka_settings(brokers: &str, local: &Path) -> Result<Value> {
    use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
    use rdkafka::client::DefaultClientContext;
    let version = std::fs::read_dir(local.join("kafka/libs"))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .find_map(|n| {
            n.strip_prefix("kafka_2.13-")?
                .strip_suffix(".jar")
                .map(str::to_owned)
        })
        .unwrap_or_default();
    let jvm: Vec<String> = std::fs::read_to_string(local.join("kafka/kafka.pid"))
        .ok()
        .and_then(|p| std::fs::read(format!("/proc/{}/cmdline", p.trim())).ok())
        .map(|c| {
            c.split(|b| *b == 0)
                .filter_map(|a| std::str::from_utf8(a).ok())
                .filter(|a| a.starts_with("-X"))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("log_level", "3")
        .create()?;
    let described = admin
        .describe_configs(
            &[ResourceSpecifier::Broker(1)],
            &AdminOptions::new().request_timeout(Some(Duration::from_secs(5))),
        )
        .await?;
    let mut settings = serde_json::Map::new();
    for resource in described.into_iter().flatten() {
        for entry in resource.entries {
            if KAFKA_SETTINGS.contains(&entry.name.as_str()) {
                settings.insert(entry.name.clone(), json!(entry.value.unwrap_or_default()));
            }
        }
    }
    Ok(json!({"version": version, "jvm": jvm, "settings": settings}))
}

/// The machine's CPU time by kind (`/proc/stat`'s first line, in ticks), at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuTimes {
    busy: u64,
    idle: u64,
    iowait: u64,
    steal: u64,
}

impl CpuTimes {
    pub fn now() -> Result<Self> {
        let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
        let line = stat.lines().next().context("empty /proc/stat")?;
        Self::parse(line)
    }

    fn parse(line: &str) -> Result<Self> {
        // cpu user nice system idle iowait irq softirq steal guest guest_nice; guest time
        // is already in user.
        let f: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|v| v.parse().unwrap_or(0))
            .collect();
        anyhow::ensure!(f.len() >= 8, "short /proc/stat cpu line: {line}");
        Ok(Self {
            busy: f[0] + f[1] + f[2] + f[5] + f[6],
            idle: f[3],
            iowait: f[4],
            steal: f[7],
        })
    }

    /// What the machine's CPUs did from `self` to `later`, as shares of the time.
    pub fn share_until(&self, later: &CpuTimes) -> CpuShare {
        let d = |a: u64, b: u64| b.saturating_sub(a) as f64;
        let busy = d(self.busy, later.busy);
        let idle = d(self.idle, later.idle);
        let iowait = d(self.iowait, later.iowait);
        let steal = d(self.steal, later.steal);
        let total = (busy + idle + iowait + steal).max(1.0);
        CpuShare {
            busy_pct: busy / total * 100.0,
            steal_pct: steal / total * 100.0,
            iowait_pct: iowait / total * 100.0,
        }
    }
}

/// Shares of all cores' time over a stretch, in percent.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuShare {
    pub busy_pct: f64,
    /// Taken by the hypervisor for other guests: a host that reads slow for no reason of
    /// its own.
    pub steal_pct: f64,
    pub iowait_pct: f64,
}

impl CpuShare {
    pub fn to_json(&self) -> Value {
        json!({"busy_pct": self.busy_pct, "steal_pct": self.steal_pct, "iowait_pct": self.iowait_pct})
    }
}

/// Starts `threads` threads that spin until the process exits, at normal priority: other
/// work on the host, as a noisy neighbour or a busier machine has, which CFS shares the
/// cores with Herald, PostgreSQL and Kafka. The calibration then reads slower, as a slow
/// host's does.
pub fn spin(threads: usize) {
    for i in 0..threads {
        let _ = std::thread::Builder::new().name(format!("busy-{i}")).spawn(|| {
            let mut x = 0u64;
            loop {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        });
    }
}

/// `--host-only`: the calibration alone, as JSON on standard output.
pub async fn print_calibration(busy_threads: usize) -> Result<()> {
    let c = Calibration::take(
        integration_tests::PG_ADMIN_URL,
        integration_tests::BROKERS,
        &integration_tests::local_dir(),
    )
    .await?
    .with_busy(busy_threads);
    let mut out = std::io::stdout();
    writeln!(out, "{}", serde_json::to_string_pretty(&c.to_json())?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_shares_come_from_the_deltas_of_proc_stat() {
        let a = CpuTimes::parse("cpu  100 0 50 800 10 0 0 40 0 0").unwrap();
        let b = CpuTimes::parse("cpu  160 0 70 880 20 0 0 70 0 0").unwrap();
        let s = a.share_until(&b);
        // 80 busy, 80 idle, 10 iowait, 30 steal of 200 ticks.
        assert_eq!((s.busy_pct, s.iowait_pct, s.steal_pct), (40.0, 5.0, 15.0));
        assert!(CpuTimes::parse("cpu 1 2").is_err());
    }

    #[test]
    fn the_cpu_round_is_deterministic() {
        assert_eq!(cpu_round(), cpu_round());
    }
}
