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
//! Statements come from `pg_stat_statements` (the local stack preloads it), counted for
//! Herald's database only; transactions from `pg_stat_database`. Backends publish their
//! statistics at most once a second, and at exit: read [`Meter::end`] after Herald's
//! processes have stopped, so that their last counts are in.

use anyhow::{bail, ensure, Context, Result};
use serde_json::json;
use tokio_postgres::Client;

use crate::{pg_connect, workspace_root, PG_ADMIN_URL};

/// Ticks per second of `/proc/PID/stat` times (USER_HZ, 100 on Linux).
const TICKS: f64 = 100.0;

/// utime, stime, cutime and cstime of `pid`, and its parent's pid.
fn stat(pid: u32) -> Result<([u64; 4], u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces, inside parentheses): the
    // state is the first, the parent the second, utime..cstime the 12th to the 15th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).context("malformed stat")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    ensure!(f.len() > 14, "short /proc/{pid}/stat");
    let n = |i: usize| f[i].parse::<u64>().unwrap_or(0);
    Ok(([n(11), n(12), n(13), n(14)], n(1) as u32))
}

/// CPU seconds of `pid` itself (all its threads).
fn own_seconds(pid: u32) -> Result<f64> {
    let ([u, s, _, _], _) = stat(pid)?;
    Ok((u + s) as f64 / TICKS)
}

/// CPU seconds of `pid`, its live children and the children it has reaped.
fn tree_seconds(pid: u32) -> Result<f64> {
    let ([u, s, cu, cs], _) = stat(pid)?;
    let mut ticks = u + s + cu + cs;
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Some(child) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        // A child may exit between the listing and the read: it is then in `cutime` of
        // the next reading, or it was too short-lived to matter to this one.
        if let Ok(([u, s, cu, cs], parent)) = stat(child) {
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
        })
    }
}

struct Reading {
    postgres_cpu_s: f64,
    kafka_cpu_s: f64,
    wal_lsn: String,
    transactions: i64,
    statements: i64,
}

/// Measures one stretch: [`Meter::start`] before it, [`Meter::herald_done`] while
/// Herald's processes still run, [`Meter::end`] after they stopped.
pub struct Meter {
    admin: Client,
    database: String,
    postmaster: u32,
    kafka: u32,
    herald: Vec<u32>,
    herald_start: f64,
    herald_cpu_s: Option<f64>,
    start: Reading,
}

impl Meter {
    pub async fn start(database: &str, herald: &[u32]) -> Result<Self> {
        let admin = pg_connect(PG_ADMIN_URL).await?;
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
            .context("creating pg_stat_statements in the admin database")?;
        let backend: i32 = admin.query_one("SELECT pg_backend_pid()", &[]).await?.get(0);
        let (_, postmaster) = stat(backend as u32)?;
        let kafka = kafka_pid()?;
        let mut herald_start = 0.0;
        for &pid in herald {
            herald_start += own_seconds(pid)?;
        }
        let mut meter = Self {
            admin,
            database: database.to_owned(),
            postmaster,
            kafka,
            herald: herald.to_vec(),
            herald_start,
            herald_cpu_s: None,
            start: Reading {
                postgres_cpu_s: 0.0,
                kafka_cpu_s: 0.0,
                wal_lsn: String::new(),
                transactions: 0,
                statements: 0,
            },
        };
        meter.start = meter.read().await?;
        Ok(meter)
    }

    /// Herald's CPU, read while its processes still run (afterwards their time is the
    /// driver's reaped time, mixed with everything else it ran).
    pub fn herald_done(&mut self) -> Result<()> {
        let mut now = 0.0;
        for &pid in &self.herald {
            now += own_seconds(pid)?;
        }
        self.herald_cpu_s = Some(now - self.herald_start);
        Ok(())
    }

    pub async fn end(self) -> Result<Cost> {
        let herald_cpu_s = self
            .herald_cpu_s
            .context("Meter::herald_done was not called before Meter::end")?;
        let end = self.read().await?;
        let wal_bytes: f64 = self
            .admin
            .query_one(
                "SELECT pg_wal_lsn_diff($1::text::pg_lsn, $2::text::pg_lsn)::float8",
                &[&end.wal_lsn, &self.start.wal_lsn],
            )
            .await?
            .get(0);
        Ok(Cost {
            herald_cpu_s,
            postgres_cpu_s: end.postgres_cpu_s - self.start.postgres_cpu_s,
            kafka_cpu_s: end.kafka_cpu_s - self.start.kafka_cpu_s,
            wal_bytes,
            transactions: (end.transactions - self.start.transactions) as f64,
            statements: (end.statements - self.start.statements) as f64,
        })
    }

    async fn read(&self) -> Result<Reading> {
        let row = self
            .admin
            .query_one(
                "SELECT pg_current_wal_lsn()::text,
                        (SELECT (xact_commit + xact_rollback)::int8 FROM pg_stat_database WHERE datname = $1),
                        (SELECT coalesce(sum(calls), 0)::int8 FROM pg_stat_statements s
                           JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = $1)",
                &[&self.database],
            )
            .await?;
        Ok(Reading {
            postgres_cpu_s: tree_seconds(self.postmaster)?,
            kafka_cpu_s: own_seconds(self.kafka)?,
            wal_lsn: row.get(0),
            transactions: row.get::<_, Option<i64>>(1).unwrap_or(0),
            statements: row.get(2),
        })
    }
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
