//! A periodic progress line for a role's main counter (messages/s, attempts/s), logged
//! only when there was traffic: for someone reading the log without a metrics backend.
//! `read` gives the counter's total as the exported metrics have it (`ingest::stats`,
//! `deliver::stats` read it back from `herald_telemetry::Metrics`).

use std::time::{Duration, Instant};

pub async fn report_rate(every: Duration, what: &'static str, read: impl Fn() -> u64) {
    let mut last = read();
    let mut at = Instant::now();
    loop {
        tokio::time::sleep(every).await;
        let now = read();
        if now != last {
            let per_s = now.saturating_sub(last) as f64 / at.elapsed().as_secs_f64();
            tracing::info!(what, per_second = per_s.round() as u64, total = now, "progress");
        }
        last = now;
        at = Instant::now();
    }
}
