//! A minimal HTTP/1.0 client for the local stack's control APIs (moto, toxiproxy, Jaeger)
//! and Herald's admin endpoint: enough for small requests on loopback, without pulling an
//! HTTP client crate into the build.

use anyhow::{Context, Result};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends `method path` with an optional JSON body; returns (status, body as JSON or Null).
pub async fn request(addr: &str, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, Value)> {
    let (status, text) = request_text(addr, method, path, &[], body).await?;
    let json = if text.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(Value::Null)
    };
    Ok((status, json))
}

/// The Prometheus text of a Herald process's `/metrics`.
pub async fn scrape(addr: &str) -> Result<String> {
    let (status, text) = request_text(addr, "GET", "/metrics", &[], None).await?;
    anyhow::ensure!(status == 200, "GET /metrics answered {status}");
    Ok(text)
}

/// The sum of the series of metric `name` in a scrape whose labels include every one of
/// `labels` (each written `key="value"`).
pub fn metric(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| labels.iter().all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Like [`request`] with extra headers; returns the body as text.
pub async fn request_text(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> Result<(u16, String)> {
    let mut s = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr} (is the local stack up?)"))?;
    let body = body.map(Value::to_string).unwrap_or_default();
    let extra: String = headers.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
    s.write_all(
        format!(
            "{method} {path} HTTP/1.0\r\nHost: {addr}\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").context("malformed HTTP response")?;
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no status in {head:?}"))?;
    Ok((status, body.to_owned()))
}
