//! The herald processes of one scenario: started, killed (SIGKILL, as a crash would),
//! restarted and stopped on the scenario's orders. A process that exits without being told
//! to is a finding, reported with the end of its log.

use std::time::Duration;

use anyhow::Result;

use super::rng::Rng;
use crate::{HeraldProcess, Launcher, TestEnv};

pub struct Member {
    pub roles: &'static str,
    pub label: String,
    pub process: HeraldProcess,
    vars: Vec<(String, String)>,
}

pub struct Fleet {
    launcher: Launcher,
    pub members: Vec<Member>,
    spawned: usize,
    /// SIGKILLs sent, by roles.
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
            members: Vec::new(),
            spawned: 0,
            kills: 0,
            graceful_leaves: 0,
            failures: Vec::new(),
        }
    }

    /// Starts `herald run --roles ROLES` with extra environment (settings, FAILPOINTS).
    pub fn spawn(&mut self, roles: &'static str, vars: &[(&str, &str)]) -> Result<()> {
        self.spawned += 1;
        let label = format!("{}-{}", roles.replace(',', "+"), self.spawned);
        let process = self.launcher.spawn_roles(roles, &label, vars)?;
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
    /// environment. Returns the killed member's label.
    pub fn kill_and_replace(&mut self, rng: &mut Rng) -> Result<String> {
        self.note_exits();
        let i = rng.range(0, self.members.len() as u64 - 1) as usize;
        let mut m = self.members.remove(i);
        m.process.kill()?;
        self.kills += 1;
        let vars: Vec<(&str, &str)> = m.vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        self.spawn(m.roles, &vars)?;
        Ok(m.label)
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
    pub fn restart_clean(&mut self, keep: &[&str]) -> Result<()> {
        self.note_exits();
        let old: Vec<Member> = std::mem::take(&mut self.members);
        for mut m in old {
            m.process.kill()?;
            let vars: Vec<(&str, &str)> = m
                .vars
                .iter()
                .filter(|(k, _)| keep.contains(&k.as_str()))
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            self.spawn(m.roles, &vars)?;
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

    /// The admin endpoints of the members, in member order.
    pub async fn admin_addrs(&self) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for m in &self.members {
            out.push(m.process.admin_addr(Duration::from_secs(60)).await?);
        }
        Ok(out)
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
