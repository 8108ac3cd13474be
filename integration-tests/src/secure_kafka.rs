//! The local broker's SASL_SSL listener (deploy/local/kafka.sh): its address, CA and user,
//! the broker's own count of the authentications it accepted and refused, and which broker
//! ports a process is connected to (from /proc), so a test can show Herald's connections
//! were authenticated and none was plaintext.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::{local_dir, workspace_root};

/// SASL_SSL: SCRAM-SHA-512/256, PLAIN and OAUTHBEARER (Kafka's unsecured validator); its
/// certificate names 127.0.0.1 and localhost.
pub const SASL_SSL: &str = "127.0.0.1:19094";
/// SASL_SSL (SCRAM-SHA-512) with a certificate for another host.
pub const WRONG_HOST: &str = "127.0.0.1:19095";
/// SSL with a client certificate required (signed by the local CA): mTLS, no SASL.
pub const MTLS: &str = "127.0.0.1:19096";
pub const MTLS_PORT: u16 = 19096;
pub const SASL_PORT: u16 = 19094;
pub const PLAINTEXT_PORT: u16 = 19092;
pub const USER: &str = "herald";

/// The local CA that signed the broker's certificates.
pub fn ca_file() -> PathBuf {
    local_dir().join("kafka/tls/ca.crt")
}

/// The file holding user `herald`'s password.
pub fn password_file() -> PathBuf {
    local_dir().join("kafka/sasl/herald.password")
}

pub fn password() -> Result<String> {
    let p = password_file();
    Ok(std::fs::read_to_string(&p)
        .with_context(|| format!("{} (the local broker's SASL user; `make stack-up`)", p.display()))?
        .trim_end()
        .to_owned())
}

/// Herald's environment for SCRAM-SHA-512 over SASL_SSL with the local CA, the password
/// from its file.
pub fn scram_env() -> Vec<(&'static str, String)> {
    vec![
        ("HERALD_KAFKA__BROKERS", SASL_SSL.to_owned()),
        ("HERALD_KAFKA__SECURITY_PROTOCOL", "sasl_ssl".to_owned()),
        ("HERALD_KAFKA__TLS__CA_FILE", ca_file().display().to_string()),
        ("HERALD_KAFKA__SASL__MECHANISM", "scram-sha-512".to_owned()),
        ("HERALD_KAFKA__SASL__USERNAME", USER.to_owned()),
        (
            "HERALD_KAFKA__SASL__PASSWORD_FILE",
            password_file().display().to_string(),
        ),
    ]
}

/// Herald's environment for OAUTHBEARER (unsecured JWTs) over SASL_SSL.
pub fn oauthbearer_env() -> Vec<(&'static str, String)> {
    vec![
        ("HERALD_KAFKA__BROKERS", SASL_SSL.to_owned()),
        ("HERALD_KAFKA__SECURITY_PROTOCOL", "sasl_ssl".to_owned()),
        ("HERALD_KAFKA__TLS__CA_FILE", ca_file().display().to_string()),
        (
            "HERALD_KAFKA__SASL__MECHANISM",
            "oauthbearer_unsecured_jwt".to_owned(),
        ),
        ("HERALD_KAFKA__SASL__USERNAME", USER.to_owned()),
    ]
}

/// The broker's authentication counts per listener: (successful, failed), from
/// `deploy/local/kafka.sh auth-stats` (its socket-server metrics through JMX).
pub fn auth_stats() -> Result<BTreeMap<String, (u64, u64)>> {
    let out = Command::new(workspace_root().join("deploy/local/kafka.sh"))
        .arg("auth-stats")
        .output()
        .context("deploy/local/kafka.sh auth-stats")?;
    if !out.status.success() {
        bail!("kafka.sh auth-stats: {}", String::from_utf8_lossy(&out.stderr));
    }
    let mut stats = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let mut words = line.split_whitespace();
        let Some(listener) = words.next() else { continue };
        let (mut ok, mut failed) = (None, None);
        for w in words {
            if let Some(n) = w.strip_prefix("successful=") {
                ok = n.parse().ok();
            } else if let Some(n) = w.strip_prefix("failed=") {
                failed = n.parse().ok();
            }
        }
        if let (Some(ok), Some(failed)) = (ok, failed) {
            stats.insert(listener.to_owned(), (ok, failed));
        }
    }
    Ok(stats)
}

/// The remote ports of `pid`'s established TCP connections to 127.0.0.1, from /proc: its
/// sockets (/proc/PID/fd) matched to the kernel's connection table (/proc/net/tcp).
pub fn remote_ports(pid: u32) -> Result<Vec<u16>> {
    let mut inodes = std::collections::BTreeSet::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        let Ok(target) = std::fs::read_link(fd?.path()) else {
            continue;
        };
        let t = target.to_string_lossy();
        if let Some(inode) = t.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')) {
            inodes.insert(inode.to_owned());
        }
    }
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp"))?;
    let mut ports = Vec::new();
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        // local, remote (hex addr:port), state (01 = established), ..., inode at 9.
        if f.len() < 10 || f[3] != "01" || !inodes.contains(f[9]) {
            continue;
        }
        if let Some((addr, port)) = f[2].split_once(':') {
            // 127.0.0.1 in the kernel's little-endian hex.
            if addr == "0100007F" {
                ports.push(u16::from_str_radix(port, 16)?);
            }
        }
    }
    Ok(ports)
}

/// Makes (or resets) a SCRAM-SHA-512 user `name` with `password` on the local broker
/// (`deploy/local/kafka.sh scram-user`, the password on stdin).
pub fn add_scram_user(name: &str, password: &str) -> Result<()> {
    use std::io::Write as _;
    let mut child = Command::new(workspace_root().join("deploy/local/kafka.sh"))
        .args(["scram-user", name])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("deploy/local/kafka.sh scram-user")?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(format!("{password}\n").as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "kafka.sh scram-user {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Herald's environment for SCRAM-SHA-512 over SASL_SSL as `user` with `password` given in
/// the environment.
pub fn scram_env_as(user: &str, password: &str) -> Vec<(&'static str, String)> {
    let mut env: Vec<(&'static str, String)> = scram_env()
        .into_iter()
        .filter(|(k, _)| !k.starts_with("HERALD_KAFKA__SASL__"))
        .collect();
    env.extend([
        ("HERALD_KAFKA__SASL__MECHANISM", "scram-sha-512".to_owned()),
        ("HERALD_KAFKA__SASL__USERNAME", user.to_owned()),
        ("HERALD_KAFKA__SASL__PASSWORD", password.to_owned()),
    ]);
    env
}
