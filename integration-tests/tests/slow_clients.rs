//! Slow and idle clients against every listener (issue 43): several hundred connections
//! that never finish their headers, on the HTTP ingest, admin and probe ports, loopback,
//! bounded in count and time. What a user checks: Herald closes every one of them by
//! itself (those past a listener's max_connections at once, the others when
//! header_read_timeout_ms passes), a kept-alive connection without a next request is
//! closed by the same timeout, a request whose body never comes after idle_timeout_secs,
//! healthy requests are answered, each close is counted, and the process's memory stays
//! bounded (the figures are printed).
//!
//! Canary: the same slow connections against `axum::serve` (what the listeners were before)
//! stay open: `slow_connections_stay_open_without_a_header_timeout` below, on a bare axum
//! server in this process.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use integration_tests::http::{metric, request_text, scrape};
use integration_tests::{EnvOptions, TestEnv, ADMIN_TOKEN};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const WAIT: Duration = Duration::from_secs(60);
const SLOW: usize = 300;
const ADMIN_MAX: usize = 64;

const SETTINGS: &str = r#"
[http_ingest]
listen = "127.0.0.1:0"
token = "it-ingest-token"
max_in_flight = 2

[listeners]
header_read_timeout_ms = 2000
idle_timeout_secs = 3
http_ingest_max_connections = 1024
admin_max_connections = 64
probe_max_connections = 64
"#;

/// Opens `n` connections to `addr` that send the start of a request and never its end.
/// Each task answers how long the connection stayed open (until Herald closed it), or
/// None if it was still open after `bound`.
async fn slow_connections(
    addr: &str,
    n: usize,
    bound: Duration,
) -> Result<Vec<tokio::task::JoinHandle<Option<Duration>>>> {
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let mut stream = TcpStream::connect(addr).await.context("connecting")?;
        let opened = Instant::now();
        tasks.push(tokio::spawn(async move {
            // A refused connection may be closed before this write; that is its answer too.
            let _ = stream
                .write_all(b"POST /v1/order-events HTTP/1.1\r\nHost: herald\r\nX-Slow: ")
                .await;
            let mut buf = [0u8; 256];
            let read = tokio::time::timeout(bound, async {
                loop {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        // A 408 or similar before the close: keep reading to the end.
                        Ok(_) => continue,
                    }
                }
            })
            .await;
            read.ok().map(|()| opened.elapsed())
        }));
    }
    Ok(tasks)
}

fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("VmRSS")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_idle_connections_are_closed_by_herald_on_every_listener() -> Result<()> {
    let env = TestEnv::with_options(
        "slowclients",
        SETTINGS,
        EnvOptions {
            // Below listeners.idle_timeout_secs, as the configuration requires.
            database_extra: "query_timeout_ms = 2000\n",
            ..EnvOptions::default()
        },
    )
    .await?;
    let herald = env.spawn_roles(
        "ingest",
        "herald",
        &[("HERALD_ADMIN__PROBE_LISTEN", "127.0.0.1:0")],
    )?;
    let ingest = herald.http_ingest_addr(WAIT).await?;
    let admin = herald.admin_addr(WAIT).await?;
    let probe = herald.probe_addr(WAIT).await?;
    let pid = herald.pid().context("pid")?;
    let bound = Duration::from_secs(20);
    for (name, addr, max) in [
        ("http_ingest", &ingest, 1024),
        ("admin", &admin, ADMIN_MAX),
        ("probe", &probe, ADMIN_MAX),
    ] {
        let before = rss_kib(pid)?;
        let started = Instant::now();
        let tasks = slow_connections(addr, SLOW, bound).await?;
        let during = rss_kib(pid)?;
        if SLOW < max {
            // Below the cap: a healthy request is answered while they hang.
            let (status, _) = request_text(addr, "GET", healthy_path(name), &[], None).await?;
            ensure!(
                status == 200,
                "{name}: a healthy request answered {status} beside the slow ones"
            );
        }
        let mut open_for = Vec::with_capacity(SLOW);
        for t in tasks {
            open_for.push(
                t.await?
                    .with_context(|| format!("{name}: a slow connection still open after {bound:?}"))?,
            );
        }
        let closed_in = started.elapsed();
        let quick = open_for
            .iter()
            .filter(|d| **d < Duration::from_millis(1500))
            .count();
        let longest = open_for.iter().max().copied().unwrap_or_default();
        println!(
            "{name}: {SLOW} slow connections, RSS {before} KiB -> {during} KiB with them open; \
             {quick} closed at once (over the cap), the longest open {longest:?}; all closed in {closed_in:?}"
        );
        ensure!(
            during < before + 64 * 1024,
            "{name}: RSS grew from {before} to {during} KiB"
        );
        // Each slot held for one header timeout, not longer.
        ensure!(
            longest < Duration::from_secs(10),
            "{name}: one stayed open {longest:?}"
        );
        if SLOW > max {
            // Those past the cap, at once (fewer if a slot freed while they connected).
            ensure!(quick > 0, "{name}: none closed at the cap");
        }
        let (status, _) = request_text(addr, "GET", healthy_path(name), &[], None).await?;
        ensure!(
            status == 200,
            "{name}: a healthy request after them answered {status}"
        );
    }

    // A kept-alive connection that sends no next request: closed when the header timeout
    // passes after its answer.
    let mut kept = TcpStream::connect(&ingest).await?;
    kept.write_all(b"GET /openapi.json HTTP/1.1\r\nHost: herald\r\n\r\n")
        .await?;
    let mut buf = vec![0u8; 64 * 1024];
    let first = kept.read(&mut buf).await?;
    ensure!(
        buf[..first].starts_with(b"HTTP/1.1 200"),
        "the keep-alive request answered"
    );
    let answered = Instant::now();
    ensure!(
        closed_by_herald(&mut kept).await,
        "the kept-alive connection was never closed"
    );
    println!(
        "kept-alive connection without a next request closed {:?} after its answer",
        answered.elapsed()
    );
    // A request whose body never comes: its headers are complete, so only the idle
    // timeout ends it.
    let mut stalled = TcpStream::connect(&admin).await?;
    // With the operator's token: past the gate, into the body's read.
    let head = format!(
        "POST /v1/suppressions/lift HTTP/1.1\r\nHost: herald\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{"
    );
    stalled.write_all(head.as_bytes()).await?;
    let sent = Instant::now();
    ensure!(
        closed_by_herald(&mut stalled).await,
        "the stalled body's connection was never closed"
    );
    let waited = sent.elapsed();
    println!("a body that never came: its connection closed after {waited:?}");
    ensure!(
        waited >= Duration::from_secs(2),
        "closed before it was idle: {waited:?}"
    );

    let metrics = scrape(&probe).await?;
    let closed = |listener: &str, reason: &str| {
        metric(
            &metrics,
            "herald_http_connections_closed_total",
            &[
                &format!("listener=\"{listener}\""),
                &format!("reason=\"{reason}\""),
            ],
        ) as usize
    };
    // (listener, closed at the cap, in their headers, idle)
    // Every slow connection closed by one of the two; at least the cap's worth timed out in
    // their headers (a slot freed while they were still connecting admits one more).
    for (listener, slow, cap, idle) in [
        ("http_ingest", SLOW + 1, 1024, 0),
        ("admin", SLOW, ADMIN_MAX, 1),
        ("probe", SLOW, ADMIN_MAX, 0),
    ] {
        let (limited, headers) = (closed(listener, "limit"), closed(listener, "header_timeout"));
        assert_eq!(
            limited + headers,
            slow,
            "{listener}: {limited} at the cap, {headers} in their headers"
        );
        assert!(
            headers >= slow.min(cap),
            "{listener}: {headers} timed out in their headers"
        );
        assert_eq!(closed(listener, "idle"), idle, "{listener}");
    }
    env.cleanup().await;
    Ok(())
}

/// Whether Herald closed `stream` within [`WAIT`] (whatever it answered first).
async fn closed_by_herald(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    tokio::time::timeout(WAIT, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    })
    .await
    .is_ok()
}

fn healthy_path(listener: &str) -> &'static str {
    match listener {
        "http_ingest" => "/openapi.json",
        _ => "/healthz",
    }
}

/// The canary: `axum::serve` as Herald used it, with no timer, keeps the same slow
/// connections open for as long as they last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_connections_stay_open_without_a_header_timeout() -> Result<()> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let server = tokio::spawn(async move {
        let app = axum::Router::new().route("/healthz", axum::routing::get(|| async { "ok" }));
        axum::serve(listener, app).await
    });
    let tasks = slow_connections(&addr, 20, Duration::from_secs(6)).await?;
    let mut still_open = 0;
    for t in tasks {
        still_open += usize::from(t.await?.is_none());
    }
    server.abort();
    assert_eq!(still_open, 20, "without a header timeout none is closed in 6 s");
    Ok(())
}
