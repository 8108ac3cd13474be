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

use crate::kafka::{produce, producer};
use crate::samples::{order_event, UniqueSeller};
use crate::{http, local_dir, seed_orders, workspace_root, TestEnv};

/// Zipkin's UI and query API.
pub const ZIPKIN: &str = "127.0.0.1:19411";

/// `len` random hex digits (trace and span ids, order ids).
pub fn random_hex(len: usize) -> String {
    uuid::Uuid::new_v4().simple().to_string()[..len].to_owned()
}

/// A test's world whose herald processes export their spans over OTLP to the local Jaeger
/// (and so, through Kafka, to Zipkin) under the service name `service`.
pub async fn traced_env(name: &str, service: &str) -> Result<TestEnv> {
    TestEnv::new(
        name,
        &format!(
            "[telemetry]\ntraces_endpoint = \"http://127.0.0.1:14318/v1/traces\"\nservice_name = \"{service}\"\n"
        ),
    )
    .await
}

/// One order as an instrumented producer sends it, through to the provider.
pub struct TracedOrder {
    pub order_id: String,
    pub trace_id: String,
    /// The producer's span, which Herald's spans continue.
    pub producer_span: String,
}

/// Seeds `seller` as seller-1, produces one `order.created` event carrying a producer's
/// `traceparent`, and waits until both its intents are accepted by the providers (needs
/// ingest, relay and deliver running).
pub async fn send_traced_order(
    env: &TestEnv,
    seller: &UniqueSeller,
    timeout: Duration,
) -> Result<TracedOrder> {
    seed_orders(env, seller, &[]).await?;
    let order = TracedOrder {
        order_id: format!("7{}", random_hex(6)),
        trace_id: random_hex(32),
        producer_span: random_hex(16),
    };
    let value = order_event(
        &format!("evt-{}", order.order_id),
        "order.created",
        "acme",
        &order.order_id,
        "seller-1",
        "12.00",
    );
    let traceparent = format!("00-{}-{}-01", order.trace_id, order.producer_span);
    produce(
        &producer()?,
        &env.topic("order-events"),
        Some(order.order_id.as_bytes()),
        Some(&value),
        &[("traceparent", &traceparent)],
    )
    .await?;
    env.wait_count(
        "both intents accepted by the providers",
        "SELECT count(*) FROM notification_intents WHERE state = 'accepted'",
        2,
        timeout,
    )
    .await?;
    Ok(order)
}

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
    let modules = local_dir().join("browser/node_modules");
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
        .arg(workspace_root().join("deploy/local/browser/trace-page.cjs"))
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
