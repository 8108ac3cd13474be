//! What a measured stretch cost the whole machine, not only Herald's process: CPU seconds
//! of Herald, PostgreSQL and Kafka from `/proc`, and PostgreSQL's WAL bytes, transactions
//! and statements in Herald's database.
//!
//! PostgreSQL is many processes: the postmaster, its background workers and one backend
//! per connection, which come and go. Its CPU is the postmaster's own, that of its live
//! children, and that of the children it has reaped (`cutime`, `cstime`): a backend that
//! exits during the stretch moves its whole life into the postmaster's reaped time, and
//! its share from before the stretch was counted among the live children at the start,
//! so the difference is exact whichever way the backends come and go.
//!
//! CPU is read at the end of the stretch while Herald still runs ([`Meter::stretch_done`]),
//! so Herald's shutdown is not in it, for any process. Statements come from
//! `pg_stat_statements` (the local stack preloads it), counted for Herald's database only;
//! transactions from `pg_stat_database`. Backends publish their transaction counts at most
//! once a second, and at exit: [`Meter::end`] reads them once Herald's processes have
//! stopped and their backends are gone. The driver's own queries on the database (its
//! waits, a few per run) are in both counts.
//!
//! After the stretch, [`Meter::idle`] reads each one's CPU over a window with no events,
//! as percent of one core: what Herald and the work it causes cost between bursts. `/proc`
//! counts in hundredths of a second, so a 20 s window reads in steps of 0.05 points. The
//! WAL, transactions and statements [`Meter::end`] reads include that window's (the
//! relay's and the sweeps' polls, a few statements a second).
//!
//! Autovacuum and autoanalyze runs on Herald's tables that finished between the start and
//! [`Meter::end`] (so including Herald's shutdown; a run still going then is not counted)
//! are counted too (`pg_stat_user_tables`): their CPU is in PostgreSQL's, and whether one
//! fell inside a run may explain part of the spread between runs.

use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use serde_json::json;
use tokio_postgres::Client;

use super::host::{CpuShare, CpuTimes};
use super::procstat::cpu_ticks;
use integration_tests::{pg_connect, wait_for, workspace_root, PG_ADMIN_URL};

/// Ticks per second of `/proc/PID/stat` times (USER_HZ, 100 on Linux).
const TICKS: f64 = 100.0;

/// CPU seconds of `pid` itself (all its threads).
fn own_seconds(pid: u32) -> Result<f64> {
    let ([u, s, _, _], _) = cpu_ticks(pid)?;
    Ok((u + s) as f64 / TICKS)
}

/// CPU seconds of `pid`, its live children and the children it has reaped. A child reaped
/// during the scan of `/proc` would be in neither sum: the reading is taken again if the
/// reaped time moved meanwhile.
fn tree_seconds(pid: u32) -> Result<f64> {
    for _ in 0..10 {
        let ([_, _, cu, cs], _) = cpu_ticks(pid)?;
        let seconds = tree_seconds_once(pid)?;
        let ([_, _, cu_after, cs_after], _) = cpu_ticks(pid)?;
        if (cu, cs) == (cu_after, cs_after) {
            return Ok(seconds);
        }
    }
    bail!("the children of {pid} kept exiting during ten readings")
}

fn tree_seconds_once(pid: u32) -> Result<f64> {
    let ([u, s, cu, cs], _) = cpu_ticks(pid)?;
    let mut ticks = u + s + cu + cs;
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Some(child) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        // A child that exits between the listing and the read is in the reaped time,
        // which `tree_seconds` checks did not move.
        if let Ok(([u, s, cu, cs], parent)) = cpu_ticks(child) {
            if parent == pid {
                ticks += u + s + cu + cs;
            }
        }
    }
    Ok(ticks as f64 / TICKS)
}

/// What the stretch cost, in total.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cost {
    pub herald_cpu_s: f64,
    pub postgres_cpu_s: f64,
    pub kafka_cpu_s: f64,
    pub wal_bytes: f64,
    pub transactions: f64,
    pub statements: f64,
    /// Autovacuum runs on Herald's tables that finished from the stretch's start to [`Meter::end`].
    pub autovacuums: f64,
    /// Autoanalyze runs on Herald's tables that finished from the stretch's start to [`Meter::end`].
    pub autoanalyzes: f64,
    /// After the stretch, with no events arriving ([`Meter::idle`]): percent of one core.
    pub idle_herald_pct: f64,
    pub idle_postgres_pct: f64,
    pub idle_kafka_pct: f64,
    /// The whole machine's CPUs over the stretch: busy, stolen by the hypervisor, waiting
    /// for I/O.
    pub machine: CpuShare,
}

impl Cost {
    pub fn machine_cpu_s(&self) -> f64 {
        self.herald_cpu_s + self.postgres_cpu_s + self.kafka_cpu_s
    }

    /// Per `notifications` delivered: CPU seconds per 10,000, the rest per notification.
    pub fn to_json(&self, notifications: f64) -> serde_json::Value {
        let per_10k = |s: f64| s / notifications.max(1.0) * 10_000.0;
        let per_one = |v: f64| v / notifications.max(1.0);
        json!({
            "notifications": notifications,
            "cpu_s_per_10k": {"herald": per_10k(self.herald_cpu_s), "postgres": per_10k(self.postgres_cpu_s),
                              "kafka": per_10k(self.kafka_cpu_s), "machine": per_10k(self.machine_cpu_s())},
            "wal_bytes_per_notification": per_one(self.wal_bytes),
            "transactions_per_notification": per_one(self.transactions),
            "statements_per_notification": per_one(self.statements),
            "autovacuums": self.autovacuums,
            "autoanalyzes": self.autoanalyzes,
            "idle_pct_of_a_core": {"herald": self.idle_herald_pct, "postgres": self.idle_postgres_pct,
                                   "kafka": self.idle_kafka_pct},
            "machine_during_stretch": self.machine.to_json(),
        })
    }
}

/// CPU seconds of the three, at one moment.
#[derive(Clone, Copy)]
struct Cpu {
    herald: f64,
    postgres: f64,
    kafka: f64,
}

/// PostgreSQL's counters, at one moment.
struct Counters {
    wal_lsn: String,
    transactions: i64,
    statements: i64,
    autovacuums: i64,
    autoanalyzes: i64,
}

/// Fails at once, with what to do, when PostgreSQL does not preload pg_stat_statements
/// (a stack started before `deploy/local/postgres.sh` asked for it); creates the
/// extension's view in the admin database otherwise.
pub async fn check_statements_tracked(admin: &Client) -> Result<()> {
    let preloaded: String = admin
        .query_one("SHOW shared_preload_libraries", &[])
        .await?
        .get(0);
    if !preloaded.contains("pg_stat_statements") {
        bail!(
            "PostgreSQL does not preload pg_stat_statements (it has {preloaded:?}): restart the \
             local stack (make stack-down stack-up) so that it reads deploy/local/postgres.sh's settings"
        );
    }
    admin
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await
        .context("creating pg_stat_statements in the admin database")
}

/// Measures one stretch: [`Meter::start`] before it, [`Meter::stretch_done`] at its end
/// while Herald's processes still run, [`Meter::end`] after they stopped.
pub struct Meter {
    admin: Client,
    /// Connected to Herald's database: its tables' maintenance counts.
    db: Client,
    database: String,
    postmaster: u32,
    kafka: u32,
    herald: Vec<u32>,
    cpu_start: Cpu,
    cpu_end: Option<Cpu>,
    machine_start: CpuTimes,
    machine: Option<CpuShare>,
    /// Percent of a core of each, over the idle window.
    idle: Option<Cpu>,
    counters_start: Counters,
}

impl Meter {
    pub async fn start(database: &str, herald: &[u32]) -> Result<Self> {
        let admin = pg_connect(PG_ADMIN_URL).await?;
        check_statements_tracked(&admin).await?;
        // Only this database's entries, so none is evicted by other databases' during the
        // stretch (the view holds 5,000 by default).
        admin
            .execute(
                "SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database WHERE datname = $1), 0)",
                &[&database],
            )
            .await?;
        let backend: i32 = admin.query_one("SELECT pg_backend_pid()", &[]).await?.get(0);
        let (_, postmaster) = cpu_ticks(backend as u32)?;
        let kafka = kafka_pid()?;
        let herald = herald.to_vec();
        let cpu_start = cpu(&herald, postmaster, kafka)?;
        let machine_start = CpuTimes::now()?;
        let db = pg_connect(&database_url(database)).await?;
        let counters_start = counters(&admin, &db, database).await?;
        Ok(Self {
            admin,
            db,
            database: database.to_owned(),
            postmaster,
            kafka,
            herald,
            cpu_start,
            cpu_end: None,
            machine_start,
            machine: None,
            idle: None,
            counters_start,
        })
    }

    /// The end of the stretch, read while Herald's processes still run (afterwards their
    /// time is the driver's reaped time, mixed with everything else it ran).
    pub fn stretch_done(&mut self) -> Result<()> {
        self.cpu_end = Some(cpu(&self.herald, self.postmaster, self.kafka)?);
        self.machine = Some(self.machine_start.share_until(&CpuTimes::now()?));
        Ok(())
    }

    /// After [`Meter::stretch_done`], once the stretch's last notification is accepted and
    /// while Herald still runs with nothing to do: the CPU of the next `window`, as percent
    /// of one core. It starts right after the last acceptance, so it includes the
    /// stretch's tail (offset commits, the last spans' export): what a deployment between
    /// bursts pays.
    pub async fn idle(&mut self, window: Duration) -> Result<()> {
        let before = cpu(&self.herald, self.postmaster, self.kafka)?;
        let started = std::time::Instant::now();
        tokio::time::sleep(window).await;
        let after = cpu(&self.herald, self.postmaster, self.kafka)?;
        let elapsed = started.elapsed().as_secs_f64();
        let pct = |a: f64, b: f64| (b - a) / elapsed * 100.0;
        self.idle = Some(Cpu {
            herald: pct(before.herald, after.herald),
            postgres: pct(before.postgres, after.postgres),
            kafka: pct(before.kafka, after.kafka),
        });
        Ok(())
    }

    /// Once Herald's processes have stopped: waits until their backends are gone (their
    /// last counts published), then reads the counters.
    pub async fn end(self) -> Result<Cost> {
        let cpu_end = self
            .cpu_end
            .context("Meter::stretch_done was not called before Meter::end")?;
        let idle = self
            .idle
            .context("Meter::idle was not called before Meter::end")?;
        wait_for("Herald's backends to exit", Duration::from_secs(30), || async {
            let n: i64 = self
                .admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND application_name = 'herald'",
                    &[&self.database],
                )
                .await?
                .get(0);
            Ok((n == 0).then_some(()))
        })
        .await?;
        let end = counters(&self.admin, &self.db, &self.database).await?;
        let wal_bytes: f64 = self
            .admin
            .query_one(
                "SELECT pg_wal_lsn_diff($1::text::pg_lsn, $2::text::pg_lsn)::float8",
                &[&end.wal_lsn, &self.counters_start.wal_lsn],
            )
            .await?
            .get(0);
        Ok(Cost {
            herald_cpu_s: cpu_end.herald - self.cpu_start.herald,
            postgres_cpu_s: cpu_end.postgres - self.cpu_start.postgres,
            kafka_cpu_s: cpu_end.kafka - self.cpu_start.kafka,
            wal_bytes,
            transactions: (end.transactions - self.counters_start.transactions) as f64,
            statements: (end.statements - self.counters_start.statements) as f64,
            autovacuums: (end.autovacuums - self.counters_start.autovacuums) as f64,
            autoanalyzes: (end.autoanalyzes - self.counters_start.autoanalyzes) as f64,
            idle_herald_pct: idle.herald,
            idle_postgres_pct: idle.postgres,
            idle_kafka_pct: idle.kafka,
            machine: self.machine.unwrap_or_default(),
        })
    }
}

fn cpu(herald: &[u32], postmaster: u32, kafka: u32) -> Result<Cpu> {
    let mut h = 0.0;
    for &pid in herald {
        h += own_seconds(pid)?;
    }
    Ok(Cpu {
        herald: h,
        postgres: tree_seconds(postmaster)?,
        kafka: own_seconds(kafka)?,
    })
}

/// `database` on the admin URL's server, as the admin URL's user.
fn database_url(database: &str) -> String {
    let server = PG_ADMIN_URL
        .rsplit_once('/')
        .map_or(PG_ADMIN_URL, |(server, _)| server);
    format!("{server}/{database}")
}

async fn counters(admin: &Client, db: &Client, database: &str) -> Result<Counters> {
    // pg_stat_clear_snapshot: a fresh read of the cumulative statistics, not the
    // transaction's cached one.
    admin.batch_execute("SELECT pg_stat_clear_snapshot()").await?;
    db.batch_execute("SELECT pg_stat_clear_snapshot()").await?;
    let maintenance = db
        .query_one(
            "SELECT coalesce(sum(autovacuum_count), 0)::int8, coalesce(sum(autoanalyze_count), 0)::int8
               FROM pg_stat_user_tables",
            &[],
        )
        .await?;
    let row = admin
        .query_one(
            "SELECT pg_current_wal_insert_lsn()::text,
                    (SELECT (xact_commit + xact_rollback)::int8 FROM pg_stat_database WHERE datname = $1),
                    (SELECT coalesce(sum(calls), 0)::int8 FROM pg_stat_statements s
                       JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = $1)",
            &[&database],
        )
        .await?;
    Ok(Counters {
        wal_lsn: row.get(0),
        transactions: row.get::<_, Option<i64>>(1).unwrap_or(0),
        statements: row.get(2),
        autovacuums: maintenance.get(0),
        autoanalyzes: maintenance.get(1),
    })
}

/// The local broker's pid, from the pidfile `deploy/local/kafka.sh` keeps.
fn kafka_pid() -> Result<u32> {
    let local =
        std::env::var_os("HERALD_LOCAL_DIR").map_or_else(|| workspace_root().join(".local"), Into::into);
    let path = local.join("kafka/kafka.pid");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let pid: u32 = text
        .trim()
        .parse()
        .with_context(|| format!("{} holds no pid", path.display()))?;
    ensure!(
        std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the broker of {} (pid {pid}) is not running",
        path.display()
    );
    Ok(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_that_exits_keeps_its_cpu_time_in_its_parents_tree() {
        let me = std::process::id();
        let (tree, own) = (tree_seconds(me).unwrap(), own_seconds(me).unwrap());
        // A second or so of shell arithmetic in a child, which exits and is reaped.
        let status = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 1000000 ]; do i=$((i+1)); done"])
            .status()
            .unwrap();
        assert!(status.success());
        let tree_grew = tree_seconds(me).unwrap() - tree;
        let own_grew = own_seconds(me).unwrap() - own;
        assert!(
            tree_grew >= 0.1,
            "the reaped child's time is missing: the tree grew {tree_grew} s"
        );
        assert!(own_grew < tree_grew, "own {own_grew} s, tree {tree_grew} s");
    }
}
