//! The local stack's trace UI, as a person reads it: Zipkin's server (deploy/local/zipkin.sh),
//! fed by Jaeger's collector through Kafka. [`zipkin_span_names`] reads a trace through
//! Zipkin's query API; [`open_trace_page`] opens the trace's page in a real browser
//! (chromium driven by playwright-core, deploy/local/browser/trace-page.cjs) and reports which
//! span rows the page rendered.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::{http, workspace_root};

/// Zipkin's UI and query API.
pub const ZIPKIN: &str = "127.0.0.1:19411";

/// The page of one trace in Zipkin's UI.
pub fn trace_url(trace_id: &str) -> String {
    format!("http://{ZIPKIN}/zipkin/traces/{trace_id}")
}

/// The span names Zipkin holds for a trace (lower case: Zipkin stores names that way), or
/// `None` while it holds none (404).
pub async fn zipkin_span_names(trace_id: &str) -> Result<Option<Vec<String>>> {
    let (status, body) = http::request(ZIPKIN, "GET", &format!("/api/v2/trace/{trace_id}"), None).await?;
    match status {
        200 => Ok(Some(
            body.as_array()
                .map(|spans| {
                    spans
                        .iter()
                        .filter_map(|s| s["name"].as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default(),
        )),
        404 => Ok(None),
        other => bail!("Zipkin answered {other} for trace {trace_id}: {body}"),
    }
}

/// What the browser saw on a trace page.
#[derive(Debug, Deserialize)]
pub struct PageReport {
    pub url: String,
    pub title: String,
    /// The requested rows ("service: span name", lower case) the page rendered.
    pub found: Vec<String>,
    pub missing: Vec<String>,
    pub screenshot: PathBuf,
}

/// Opens `url` in chromium, waits up to `timeout` for each of `rows` ("service: span name")
/// to be rendered as a row of the trace's timeline, saves a full-page screenshot to
/// `screenshot` and reports what was found. Needs `deploy/local/tool.sh browser` (make test
/// runs it).
pub async fn open_trace_page(
    url: &str,
    rows: &[String],
    screenshot: &std::path::Path,
    timeout: Duration,
) -> Result<PageReport> {
    let root = workspace_root();
    let modules = root.join(".local/browser/node_modules");
    if !modules.join("playwright-core").is_dir() {
        bail!(
            "playwright-core is not installed in {}: run deploy/local/tool.sh browser (make test does)",
            modules.display()
        );
    }
    if let Some(dir) = screenshot.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let out = tokio::process::Command::new("node")
        .arg(root.join("deploy/local/browser/trace-page.cjs"))
        .arg(url)
        .arg(screenshot)
        .arg(timeout.as_millis().to_string())
        .args(rows)
        .env("NODE_PATH", &modules)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    // The script bounds every wait by `timeout`; the browser's start and the screenshot get
    // a minute more before the run counts as hung.
    let out = tokio::time::timeout(timeout + Duration::from_secs(60), out)
        .await
        .context("the browser did not finish")?
        .context("running node deploy/local/browser/trace-page.cjs")?;
    if !out.status.success() {
        bail!(
            "the browser failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).with_context(|| format!("the browser's report: {stdout}"))
}
