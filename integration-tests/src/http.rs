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

/// Like [`request`] to a Herald admin endpoint, with the tests' admin token.
pub async fn admin_request(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, Value)> {
    let auth = format!("Bearer {}", crate::ADMIN_TOKEN);
    let (status, text) = request_text(addr, method, path, &[("Authorization", &auth)], body).await?;
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
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
    let body = body.map(Value::to_string).unwrap_or_default();
    let mut all = headers.to_vec();
    all.push(("Content-Type", "application/json"));
    let r = exchange(addr, method, path, &all, body.as_bytes()).await?;
    Ok((r.status, r.body))
}

/// An answer: status, headers (names lowercased) and body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON (Null when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// Sends exactly these headers (and Host, Content-Length) and body bytes, as `curl -H ...
/// --data-binary` would.
pub async fn exchange(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Answer> {
    let mut s = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr} (is the local stack up?)"))?;
    let extra: String = headers.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
    let mut request = format!(
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\n{extra}Content-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    s.write_all(&request).await?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").context("malformed HTTP response")?;
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no status in {head:?}"))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Ok(Answer {
        status,
        headers,
        body: body.to_owned(),
    })
}
