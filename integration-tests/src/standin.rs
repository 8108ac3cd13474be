//! A provider stand-in for measurements: answers SES v2 `SendEmail` and SNS `Publish` after
//! a fixed delay, so that the provider is never the bottleneck (moto, one Python process,
//! manages a few hundred requests a second here). It speaks just enough HTTP/1.1
//! (keep-alive, Content-Length bodies) for the AWS SDK's client. Not for correctness
//! tests: moto stays the fake for those.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Starts the stand-in on a free loopback port; returns its address and a request counter.
pub async fn start(delay: Duration) -> Result<(String, Arc<AtomicU64>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let served = Arc::new(AtomicU64::new(0));
    let counter = served.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream, delay, counter.clone()));
        }
    });
    Ok((addr, served))
}

/// One HTTP/1.1 request read off a connection: its head (lower-cased) and its raw bytes.
pub struct Request {
    pub head: String,
    pub raw: Vec<u8>,
}

/// Reads the next request (headers, then Content-Length bytes of body) from `s`, keeping
/// what arrived beyond it in `buf`; `None` when the peer closed or the read failed.
pub async fn read_request(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Request> {
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        read_more(s, buf).await?;
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + len {
        read_more(s, buf).await?;
    }
    let raw = buf.drain(..head_end + len).collect();
    Some(Request { head, raw })
}

async fn read_more(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<()> {
    let mut chunk = [0u8; 8192];
    match s.read(&mut chunk).await {
        Ok(0) | Err(_) => None,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            Some(())
        }
    }
}

async fn serve(mut s: TcpStream, delay: Duration, served: Arc<AtomicU64>) {
    let mut buf = Vec::with_capacity(8192);
    while let Some(req) = read_request(&mut s, &mut buf).await {
        let is_ses = req.head.starts_with("post /v2/email/outbound-emails");
        tokio::time::sleep(delay).await;
        let n = served.fetch_add(1, Ordering::Relaxed);
        // Message ids as long as the providers' (what the ledger stores): SES v2's are 60
        // characters (`<16 hex>-<uuid>-000000`), SNS's a UUID.
        let uuid = format!("5e1d1e00-0000-4000-8000-{n:012x}");
        let (content_type, body) = if is_ses {
            (
                "application/json",
                format!("{{\"MessageId\":\"010001{n:010x}-{uuid}-000000\"}}"),
            )
        } else {
            (
                "text/xml",
                format!(
                    "<PublishResponse xmlns=\"http://sns.amazonaws.com/doc/2010-03-31/\"><PublishResult>\
                     <MessageId>{uuid}</MessageId></PublishResult><ResponseMetadata>\
                     <RequestId>req-{n}</RequestId></ResponseMetadata></PublishResponse>"
                ),
            )
        };
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nx-amzn-RequestId: req-{n}\r\n\r\n{body}",
            body.len()
        );
        if s.write_all(response.as_bytes()).await.is_err() {
            return;
        }
    }
}
