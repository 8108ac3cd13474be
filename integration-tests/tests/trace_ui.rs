//! The trace UI, as an on-call engineer uses it: one order's trace id (the producer's
//! `traceparent`, also printed by `herald intent show`) opened in a real browser on the local
//! stack's Zipkin UI shows the spans from ingest to the provider call. Herald exports OTLP to
//! Jaeger only; the spans reach Zipkin through Jaeger's collector and Kafka, as in `make demo`.
//! The screenshot is kept under `.local/trace-ui/` for a person to look at.

use std::time::Duration;

use anyhow::Result;
use integration_tests::kafka::{produce, producer};
use integration_tests::samples::{order_event, UniqueSeller};
use integration_tests::trace_ui::{open_trace_page, trace_url, zipkin_span_names};
use integration_tests::{seed_orders, wait_for, workspace_root, TestEnv};

const WAIT: Duration = Duration::from_secs(90);
/// How long the page may take to render the rows once it has loaded.
const PAGE_WAIT: Duration = Duration::from_secs(30);

fn random_hex(len: usize) -> String {
    uuid::Uuid::new_v4().simple().to_string()[..len].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orders_trace_renders_in_the_browser_from_ingest_to_the_provider_call() -> Result<()> {
    let service = format!("herald-ui-{}", random_hex(8));
    let env = TestEnv::new(
        "traceui",
        &format!(
            "[telemetry]\ntraces_endpoint = \"http://127.0.0.1:14318/v1/traces\"\nservice_name = \"{service}\"\n"
        ),
    )
    .await?;
    let _herald = env.spawn_roles("ingest,relay,deliver", "herald", &[])?;
    let seller = UniqueSeller::new();
    seed_orders(&env, &seller, &[]).await?;

    let (trace_id, producer_span) = (random_hex(32), random_hex(16));
    let order = format!("8{}", random_hex(6));
    let value = order_event(
        &format!("evt-{order}"),
        "order.created",
        "acme",
        &order,
        "seller-1",
        "12.00",
    );
    produce(
        &producer()?,
        &env.topic("order-events"),
        Some(order.as_bytes()),
        Some(&value),
        &[("traceparent", &format!("00-{trace_id}-{producer_span}-01"))],
    )
    .await?;
    env.wait_count(
        "both intents accepted by the providers",
        "SELECT count(*) FROM notification_intents WHERE state = 'accepted'",
        2,
        WAIT,
    )
    .await?;

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

    let shots = workspace_root().join(".local/trace-ui");
    let page = open_trace_page(
        &trace_url(&trace_id),
        &rows,
        &shots.join(format!("{trace_id}.png")),
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

    // Canary: the same check on a trace Zipkin never received renders none of the rows, so
    // the check above reads the trace, not the page's frame.
    let unknown = random_hex(32);
    let empty = open_trace_page(
        &trace_url(&unknown),
        &rows,
        &shots.join(format!("canary-{unknown}.png")),
        Duration::from_secs(5),
    )
    .await?;
    assert!(
        empty.found.is_empty(),
        "rows found on the page of a trace that does not exist: {:?}",
        empty.found
    );
    assert_eq!(empty.missing, rows);
    std::fs::remove_file(&empty.screenshot).ok();
    println!(
        "trace {trace_id} rendered {} rows; screenshot {}",
        page.found.len(),
        page.screenshot.display()
    );
    Ok(())
}
