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

/// utime, stime, cutime and cstime of `pid` (in ticks of USER_HZ, 100 on Linux), and
/// its parent's pid, from `/proc/PID/stat`.
pub fn cpu_ticks(pid: u32) -> Result<([u64; 4], u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces, inside parentheses): the
    // state is the first, the parent the second, utime..cstime the 12th to the 15th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).context("malformed stat")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    anyhow::ensure!(f.len() > 14, "short /proc/{pid}/stat");
    let n = |i: usize| f[i].parse::<u64>().unwrap_or(0);
    Ok(([n(11), n(12), n(13), n(14)], n(1) as u32))
}

/// `VmHWM` (peak resident set) and utime + stime of `pid`, read while it still runs.
pub fn usage(pid: u32) -> Result<Usage> {
    let hwm_kib = status_kib(pid, "VmHWM")?;
    let ([utime, stime, _, _], _) = cpu_ticks(pid)?;
    // USER_HZ is 100 on Linux.
    Ok(Usage {
        peak_rss_mib: hwm_kib / 1024.0,
        cpu_seconds: (utime + stime) as f64 / 100.0,
    })
}
