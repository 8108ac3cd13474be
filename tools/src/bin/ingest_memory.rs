//! `herald-ingest-memory [MESSAGES] [MESSAGE_BYTES]` (`make ingest-memory`): the peak
//! resident memory of `herald run --roles ingest` while it consumes a backlog of large order
//! events, each over `ingest.max_message_bytes` (dead-lettered `too_large`) and over
//! librdkafka's 1,000,000-byte producer limit (so the dead letter is a 16 KiB prefix).
//!
//! MESSAGES order events of MESSAGE_BYTES (default 300 of 1,040,247 bytes) are produced to
//! an order-events topic that accepts 2 MB messages, then one ingest process runs with
//! Herald's default ingest bounds (or `HERALD_INGEST__*` from the environment) until its
//! group's lag is 0, at most 10 minutes. Its `VmHWM` (the kernel's high-water mark of the
//! resident set, from `/proc/PID/status`) is read every 100 ms and at the end; the run fails
//! if fewer dead letters than messages carry a prefix.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use herald_tools::bench::procstat;
use integration_tests::kafka::{committed_lag, large_producer, read_all, set_max_message_bytes};
use integration_tests::TestEnv;
use rdkafka::producer::{FutureRecord, Producer};

const DEADLINE: Duration = Duration::from_secs(600);

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let messages: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(300);
    let size: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(1_040_247);
    ensure!(
        (65_537..=1_900_000).contains(&size),
        "MESSAGE_BYTES must be over 64 KiB and under 1.9 MB"
    );
    // Herald's own defaults for the ingest bounds, unless the environment sets them: the
    // test namespace's configuration uses smaller batches and an 8 KiB message limit.
    for (key, default) in [
        ("HERALD_INGEST__BATCH_MAX_MESSAGES", "500"),
        ("HERALD_INGEST__MAX_MESSAGE_BYTES", "65536"),
    ] {
        if std::env::var_os(key).is_none() {
            std::env::set_var(key, default);
        }
    }
    let env = TestEnv::new("memory", "").await?;
    let orders = env.topic("order-events");
    let dlq = env.topic("herald.dead-letter");
    set_max_message_bytes(&orders, 2_000_000).await?;

    let produced = Instant::now();
    let p = large_producer(2_000_000)?;
    let mut value = br#"{"event_kind":"order.created","pad":""#.to_vec();
    value.resize(size - 2, b'x');
    value.extend_from_slice(b"\"}");
    for n in 0..messages {
        let key = format!("order-{n}");
        let record: FutureRecord<'_, str, [u8]> =
            FutureRecord::to(&orders).key(key.as_str()).payload(&value[..]);
        // Bounded in flight: librdkafka's queue holds what is not yet acknowledged.
        p.send(record, Duration::from_secs(60))
            .await
            .map_err(|(e, _)| e)
            .context("producing")?;
    }
    p.flush(Duration::from_secs(60))?;
    println!(
        "ingest-memory: {messages} messages of {size} bytes on {orders} in {:.1} s",
        produced.elapsed().as_secs_f64()
    );

    let mut herald = env.spawn_ingest("ingest", &[("HERALD_LOG__LEVEL", "warn")])?;
    let pid = herald.pid().context("ingest exited")?;
    let started = Instant::now();
    let group = env.group("herald-ingest");
    let topics = [orders.clone(), env.topic("seller-profiles")];
    let refs: Vec<&str> = topics.iter().map(String::as_str).collect();
    let mut last_lag_check = Instant::now();
    let mut peak_kib: f64 = 0.0;
    loop {
        ensure!(herald.is_running(), "ingest exited; log:\n{}", herald.log());
        // The kernel keeps the high-water mark; the samples show it as it grows.
        peak_kib = peak_kib.max(procstat::status_kib(pid, "VmHWM")?);
        if last_lag_check.elapsed() >= Duration::from_secs(1) {
            last_lag_check = Instant::now();
            if committed_lag(&group, &refs)? == 0 {
                break;
            }
        }
        ensure!(
            started.elapsed() < DEADLINE,
            "ingest lag not 0 after {DEADLINE:?}; log:\n{}",
            herald.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = started.elapsed();
    let peak = peak_kib.max(procstat::status_kib(pid, "VmHWM")?) / 1024.0;
    herald.terminate(Duration::from_secs(60)).await?;

    let letters = read_all(&dlq)?;
    let prefixes = letters
        .iter()
        .filter(|r| r.headers.get("herald-dlq-payload").map(String::as_str) == Some("prefix"))
        .count();
    ensure!(
        prefixes >= messages,
        "{prefixes} prefix dead letters for {messages} messages ({} dead letters in all)",
        letters.len()
    );
    let var = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_owned());
    println!(
        "ingest-memory: {messages} x {size} bytes dead-lettered as {prefixes} prefixes in {:.1} s; \
         batch_max_messages={} batch_max_bytes={} prefetch_max_kbytes={}: peak RSS (VmHWM) {peak:.0} MiB",
        elapsed.as_secs_f64(),
        var("HERALD_INGEST__BATCH_MAX_MESSAGES", "500"),
        var("HERALD_INGEST__BATCH_MAX_BYTES", "8388608 (default)"),
        var("HERALD_INGEST__PREFETCH_MAX_KBYTES", "16384 (default)"),
    );
    env.cleanup().await;
    Ok(())
}
