//! The herald processes of one scenario: started, killed (SIGKILL, as a crash would),
//! restarted and stopped on the scenario's orders. A process that exits without being told
//! to is a finding, reported with the end of its log.

use std::time::Duration;

use anyhow::Result;

use super::rng::Rng;
use integration_tests::{HeraldProcess, Launcher, TestEnv};

/// Delivery settings sized to the provider fake: moto, one Python process, answers a few
/// hundred requests a second, so 256 requests in flight with a 2 s attempt timeout (the
/// test configuration) would turn its queueing into `unknown` outcomes that no injected
/// fault caused. A scenario's own settings come after these and win.
/// (15 s lease, 4 s attempts, 3 s margin: a claimed attempt may wait 4 s for its channel's
/// rate; herald refuses a lease that cannot cover one send at a channel's rate.)
pub const PROVIDER_BUDGET: [(&str, &str); 3] = [
    ("HERALD_DELIVERY__MAX_IN_FLIGHT", "32"),
    ("HERALD_AWS__ATTEMPT_TIMEOUT_MS", "4000"),
    ("HERALD_DELIVERY__LEASE_SECS", "15"),
];

pub struct Member {
    pub roles: &'static str,
    pub label: String,
    pub process: HeraldProcess,
    vars: Vec<(String, String)>,
}

pub struct Fleet {
    launcher: Launcher,
    /// The scenario's settings for every process it starts, after [`PROVIDER_BUDGET`].
    common: Vec<(String, String)>,
    pub members: Vec<Member>,
    spawned: usize,
    /// SIGKILLs sent.
    pub kills: usize,
    /// Processes that left on SIGTERM (and exited 0).
    pub graceful_leaves: usize,
    /// Findings: processes that exited on their own, or not cleanly on SIGTERM.
    pub failures: Vec<String>,
}

impl Fleet {
    pub fn new(env: &TestEnv) -> Self {
        Self {
            launcher: env.launcher(),
            common: Vec::new(),
            members: Vec::new(),
            spawned: 0,
            kills: 0,
            graceful_leaves: 0,
            failures: Vec::new(),
        }
    }

    /// Settings every process of the scenario gets (policies, rates), after
    /// [`PROVIDER_BUDGET`] and before a spawn's own.
    pub fn set_common(&mut self, vars: &[(&str, &str)]) {
        self.common = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
    }

    /// Starts `herald run --roles ROLES` with extra environment (settings, FAILPOINTS),
    /// after [`PROVIDER_BUDGET`] and the scenario's common settings.
    pub fn spawn(&mut self, roles: &'static str, vars: &[(&str, &str)]) -> Result<()> {
        self.spawned += 1;
        let label = format!("{}-{}", roles.replace(',', "+"), self.spawned);
        let common: Vec<(&str, &str)> = self
            .common
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let all: Vec<(&str, &str)> = PROVIDER_BUDGET
            .iter()
            .copied()
            .chain(common)
            .chain(vars.iter().copied())
            .collect();
        let process = self.launcher.spawn_roles(roles, &label, &all)?;
        self.members.push(Member {
            roles,
            label,
            process,
            vars: vars
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        });
        Ok(())
    }

    pub fn count(&self, roles: &str) -> usize {
        self.members.iter().filter(|m| m.roles == roles).count()
    }

    /// SIGKILLs a member chosen at random and starts a replacement with the same roles and
    /// environment.
    pub fn kill_and_replace(&mut self, rng: &mut Rng) -> Result<()> {
        self.note_exits();
        if self.members.is_empty() {
            return Ok(());
        }
        let i = rng.range(0, self.members.len() as u64 - 1) as usize;
        let mut m = self.members.remove(i);
        m.process.kill()?;
        self.kills += 1;
        let vars: Vec<(&str, &str)> = m.vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        self.spawn(m.roles, &vars)
    }

    /// Takes a member with `roles` out: SIGTERM (it must drain and exit 0), or SIGKILL.
    pub async fn leave(&mut self, roles: &str, rng: &mut Rng, graceful: bool) -> Result<()> {
        self.note_exits();
        let candidates: Vec<usize> = (0..self.members.len())
            .filter(|i| self.members[*i].roles == roles)
            .collect();
        if candidates.is_empty() {
            return Ok(());
        }
        let mut m = self.members.remove(*rng.pick(&candidates));
        if graceful {
            match m.process.terminate(Duration::from_secs(30)).await {
                Ok(status) if status.success() => self.graceful_leaves += 1,
                Ok(status) => {
                    self.failures
                        .push(format!("{} exited {status} on SIGTERM: {}", m.label, tail(&m)))
                }
                Err(e) => self.failures.push(format!("{}: {e:#}", m.label)),
            }
        } else {
            m.process.kill()?;
            self.kills += 1;
        }
        Ok(())
    }

    /// Replaces every member by one without the extra environment (no failpoints): what a
    /// fault phase leaves parked is killed, and the rest of the run settles normally.
    pub fn restart_clean(&mut self) -> Result<()> {
        self.note_exits();
        for mut m in std::mem::take(&mut self.members) {
            m.process.kill()?;
            self.spawn(m.roles, &[])?;
        }
        Ok(())
    }

    /// Records members that exited without being told to, and drops them.
    pub fn note_exits(&mut self) {
        let mut i = 0;
        while i < self.members.len() {
            if self.members[i].process.is_running() {
                i += 1;
            } else {
                let m = self.members.remove(i);
                self.failures
                    .push(format!("{} exited on its own: {}", m.label, tail(&m)));
            }
        }
    }

    /// Waits until every member serves its admin endpoint; fails at once, with its log,
    /// if one exits instead (a configuration it refuses, say).
    pub async fn wait_started(&mut self) -> Result<()> {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        for m in &mut self.members {
            while !m.process.log().contains("admin endpoint listening") {
                if !m.process.is_running() {
                    anyhow::bail!("{} exited at start: {}", m.label, tail(m));
                }
                anyhow::ensure!(
                    std::time::Instant::now() < deadline,
                    "{} did not start: {}",
                    m.label,
                    tail(m)
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// The admin endpoints of the members, in member order.
    pub async fn admin_addrs(&self) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for m in &self.members {
            out.push(m.process.admin_addr(Duration::from_secs(60)).await?);
        }
        Ok(out)
    }

    /// Sends `signal` (`STOP`, `CONT`, ...) to the `i`-th member.
    pub fn signal(&self, i: usize, signal: &str) -> Result<()> {
        let pid = self.members[i]
            .process
            .pid()
            .ok_or_else(|| anyhow::anyhow!("{} is not running", self.members[i].label))?;
        let status = std::process::Command::new("kill")
            .args([format!("-{signal}"), pid.to_string()])
            .status()?;
        anyhow::ensure!(status.success(), "kill -{signal} {pid} failed");
        Ok(())
    }

    pub fn pids(&self) -> Vec<Option<u32>> {
        self.members.iter().map(|m| m.process.pid()).collect()
    }
}

fn tail(m: &Member) -> String {
    let log = m.process.log();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}
