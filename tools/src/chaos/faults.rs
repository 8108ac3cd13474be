//! Fault injectors that toxiproxy does not have: the local stack's broker and database
//! stopped and started through their own scripts, a provider that answers "slow down"
//! (SES v2 `TooManyRequestsException`, SNS `Throttling`) for a share of requests, and the
//! resident memory of a process.

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use integration_tests::standin::read_request;
use integration_tests::workspace_root;

/// Runs `deploy/local/COMPONENT.sh ACTION` (start, stop) and returns how long it took.
pub async fn stack(component: &str, action: &str) -> Result<Duration> {
    Ok(script(component, &[action]).await?.1)
}

/// Runs `deploy/local/COMPONENT.sh ARGS…`: its standard output, trimmed, and how long it
/// took.
pub async fn script(component: &str, args: &[&str]) -> Result<(String, Duration)> {
    let script = workspace_root().join(format!("deploy/local/{component}.sh"));
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let shown = args.join(" ");
    let started = Instant::now();
    let out = tokio::task::spawn_blocking(move || Command::new(script).args(&args).output()).await??;
    if !out.status.success() {
        bail!(
            "deploy/local/{component}.sh {shown} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok((
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        started.elapsed(),
    ))
}

/// The current resident set of `pid` in MiB (`VmRSS`).
pub fn rss_mib(pid: u32) -> Result<f64> {
    Ok(crate::bench::procstat::status_kib(pid, "VmRSS")? / 1024.0)
}

/// A loopback HTTP forwarder in front of the provider fake that answers a share of
/// requests itself with the provider's throttling error, without forwarding them.
pub struct Throttler {
    pub addr: String,
    share_permille: Arc<AtomicU64>,
    pub throttled: Arc<AtomicU64>,
    pub forwarded: Arc<AtomicU64>,
}

impl Throttler {
    pub async fn start(upstream: &str) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let t = Self {
            addr: listener.local_addr()?.to_string(),
            share_permille: Arc::new(AtomicU64::new(0)),
            throttled: Arc::new(AtomicU64::new(0)),
            forwarded: Arc::new(AtomicU64::new(0)),
        };
        let (share, throttled, forwarded) =
            (t.share_permille.clone(), t.throttled.clone(), t.forwarded.clone());
        let upstream = upstream.to_owned();
        tokio::spawn(async move {
            let seq = Arc::new(AtomicU64::new(0));
            while let Ok((stream, _)) = listener.accept().await {
                let ctx = (
                    share.clone(),
                    throttled.clone(),
                    forwarded.clone(),
                    seq.clone(),
                    upstream.clone(),
                );
                tokio::spawn(async move {
                    let _ = serve(stream, ctx).await;
                });
            }
        });
        Ok(t)
    }

    /// Answers `share` (0.0..=1.0) of the requests from now on with a throttling error.
    pub fn throttle(&self, share: f64) {
        self.share_permille
            .store((share.clamp(0.0, 1.0) * 1000.0) as u64, Ordering::Relaxed);
    }
}

type Ctx = (
    Arc<AtomicU64>,
    Arc<AtomicU64>,
    Arc<AtomicU64>,
    Arc<AtomicU64>,
    String,
);

async fn serve(mut client: TcpStream, (share, throttled, forwarded, seq, upstream): Ctx) -> Result<()> {
    let mut buf = Vec::new();
    while let Some(req) = read_request(&mut client, &mut buf).await {
        // An even spread over the requests: the n-th is throttled when its hash says so.
        let n = seq.fetch_add(1, Ordering::Relaxed);
        if super::rng::Rng::new(n).next_u64() % 1000 < share.load(Ordering::Relaxed) {
            throttled.fetch_add(1, Ordering::Relaxed);
            client.write_all(throttling_answer(&req.head).as_bytes()).await?;
            continue;
        }
        // One upstream connection per request (moto closes it after answering).
        let mut up = TcpStream::connect(&upstream).await?;
        up.write_all(&req.raw).await?;
        let mut up_buf = Vec::new();
        let answer = read_request(&mut up, &mut up_buf)
            .await
            .context("the provider closed without answering")?;
        forwarded.fetch_add(1, Ordering::Relaxed);
        client.write_all(&answer.raw).await?;
    }
    Ok(())
}

/// SES v2 (REST/JSON) says 429 `TooManyRequestsException`; SNS (query protocol) says 400
/// with the `Throttling` code.
fn throttling_answer(head: &str) -> String {
    let (status, content_type, extra, body) = if head.starts_with("post /v2/email/") {
        (
            "429 Too Many Requests",
            "application/json",
            "x-amzn-ErrorType: TooManyRequestsException\r\n",
            r#"{"message":"Maximum sending rate exceeded."}"#.to_owned(),
        )
    } else {
        (
            "400 Bad Request",
            "text/xml",
            "",
            "<ErrorResponse xmlns=\"http://sns.amazonaws.com/doc/2010-03-31/\"><Error><Type>Sender</Type>\
             <Code>Throttling</Code><Message>Rate exceeded</Message></Error>\
             <RequestId>chaos-throttle</RequestId></ErrorResponse>"
                .to_owned(),
        )
    };
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n{extra}x-amzn-RequestId: chaos-throttle\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}
