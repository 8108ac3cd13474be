//! Peak RSS and CPU time of a process, from `/proc` (Linux).

use anyhow::{Context, Result};

#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub peak_rss_mib: f64,
    pub cpu_seconds: f64,
}

/// A `kB` field of `/proc/PID/status` (`VmRSS`, `VmHWM`, ...).
pub fn status_kib(pid: u32, field: &str) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).context("reading /proc status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}

/// `VmHWM` (peak resident set) and utime + stime of `pid`, read while it still runs.
pub fn usage(pid: u32) -> Result<Usage> {
    let hwm_kib = status_kib(pid, "VmHWM")?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).context("reading /proc stat")?;
    // Fields after the command name (which may hold spaces, inside parentheses).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).context("malformed stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    let ticks: f64 = fields
        .get(11..13)
        .context("short stat")?
        .iter()
        .map(|v| v.parse::<f64>().unwrap_or(0.0))
        .sum();
    // USER_HZ is 100 on Linux.
    Ok(Usage {
        peak_rss_mib: hwm_kib / 1024.0,
        cpu_seconds: ticks / 100.0,
    })
}
