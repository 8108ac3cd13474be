//! The trace UI, as an on-call engineer uses it: one order's trace id (the producer's
//! `traceparent`, also printed by `herald intent show`) opened in a real browser on the local
//! stack's Zipkin UI shows the spans from ingest to the provider call. Herald exports OTLP to
//! Jaeger only; the spans reach Zipkin through Jaeger's collector and Kafka, as in `make demo`.
//! The screenshot is kept under `.local/trace-ui/` for a person to look at.

use std::time::Duration;

use anyhow::Result;
use integration_tests::samples::UniqueSeller;
use integration_tests::trace_ui::{
    open_trace_page, random_hex, send_traced_order, trace_url, traced_env, zipkin_span_names, TracedOrder,
};
use integration_tests::{local_dir, wait_for};

const WAIT: Duration = Duration::from_secs(90);
/// How long the page may take to render the rows once it has loaded.
const PAGE_WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orders_trace_renders_in_the_browser_from_ingest_to_the_provider_call() -> Result<()> {
    let service = format!("herald-ui-{}", random_hex(8));
    let env = traced_env("traceui", &service).await?;
    let _herald = env.spawn_roles("ingest,relay,deliver", "herald", &[])?;
    let TracedOrder { trace_id, .. } = send_traced_order(&env, &UniqueSeller::new(), WAIT).await?;

    // The rows the page must render, as Zipkin names them: "service: span name", lower case.
    let process = format!("process {}", env.topic("order-events"));
    let spans = [process.as_str(), "attempt", "SES SendEmail"];
    let rows: Vec<String> = spans
        .iter()
        .map(|s| format!("{service}: {s}").to_lowercase())
        .collect();

    // Zipkin holds the spans once Jaeger's Kafka exporter and Zipkin's collector passed them.
    let names = wait_for("the trace in Zipkin's query API", WAIT, || async {
        let names = zipkin_span_names(&trace_id).await?.unwrap_or_default();
        let complete = spans.iter().all(|s| names.iter().any(|n| *n == s.to_lowercase()));
        Ok(complete.then_some(names))
    })
    .await?;

    // One file, overwritten by each run: the latest trace this test opened.
    let shots = local_dir().join("trace-ui");
    let page = open_trace_page(
        &trace_url(&trace_id),
        &rows,
        &shots.join("order-trace.png"),
        PAGE_WAIT,
    )
    .await?;
    assert!(
        page.missing.is_empty(),
        "the trace page did not render {:?} (rendered {:?}; Zipkin holds {names:?}); see {}",
        page.missing,
        page.found,
        page.screenshot.display()
    );
    assert_eq!(page.found, rows);
    assert_eq!(page.title, "Zipkin");
    assert!(
        page.screenshot.is_file(),
        "no screenshot at {}",
        page.screenshot.display()
    );

    // Canary: on the same page, the check reports a span the trace does not have (this
    // order had no conflict) as missing: it reads the rendered rows, not the page's frame.
    let absent = format!("{service}: intent conflict");
    let canary = open_trace_page(
        &trace_url(&trace_id),
        // The absent row last: its wait takes the whole limit.
        &[rows[1].clone(), absent.clone()],
        &shots.join("canary.png"),
        Duration::from_secs(5),
    )
    .await?;
    assert_eq!(canary.missing, vec![absent], "{canary:?}");
    assert_eq!(canary.found, vec![rows[1].clone()], "{canary:?}");
    std::fs::remove_file(&canary.screenshot).ok();
    println!(
        "trace {trace_id} rendered {} rows; screenshot {}",
        page.found.len(),
        page.screenshot.display()
    );
    Ok(())
}
