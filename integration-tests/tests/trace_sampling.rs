//! Tail sampling at production volume: Herald's spans through the repository's collector
//! configuration (`deploy/otel-collector/config.yaml`, run by the collector binary) to a
//! backend that records what it receives. Every trace with a rare outcome (a conflict, a
//! rejected attempt, an HTTP request refused for reusing its Idempotency-Key) reaches the
//! backend whole; routine traces reach it at the configured share, whole or not at all.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, Result};
use integration_tests::http::exchange;
use integration_tests::mixed::{produce_mix, wait_settled, Mix, UNVERIFIED_SENDER};
use integration_tests::otlp::{export, Collector, CollectorSettings, OtlpSink, SpanOut, SpanSeen};
use integration_tests::TestEnv;

const WAIT: Duration = Duration::from_secs(90);
const DECISION_WAIT: Duration = Duration::from_secs(4);
const ROUTINE_PERCENT: f64 = 30.0;
const MIX: Mix = Mix {
    orders: 60,
    rejected: 4,
    duplicate_every: 10,
    conflict_every: 30,
};

const TOKEN: &str = "it-sampling-token";

fn new_trace_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// `POST /v1/order-events` of order `http-1` under one Idempotency-Key, traced as `trace`.
async fn post_order(addr: &str, trace: &str, total: &str) -> Result<integration_tests::http::Answer> {
    let body = serde_json::json!({
        "event_id": "evt-http-1", "event_kind": "order.created", "marketplace_id": "acme",
        "order_id": "http-1", "seller_id": "seller-1", "occurred_at": "2026-09-21T10:00:00Z",
        "order": {"total": total, "currency": "EUR", "item_count": 3}, "channel": "email",
    });
    let auth = format!("Bearer {TOKEN}");
    let traceparent = format!("00-{trace}-{}-01", &trace[..16]);
    exchange(
        addr,
        "POST",
        "/v1/order-events",
        &[
            ("Authorization", auth.as_str()),
            ("Content-Type", "application/json"),
            ("Idempotency-Key", "sampling-key-1"),
            ("traceparent", traceparent.as_str()),
        ],
        body.to_string().as_bytes(),
    )
    .await
}

fn names(spans: &[SpanSeen]) -> BTreeMap<&str, usize> {
    let mut n = BTreeMap::new();
    for s in spans {
        *n.entry(s.name.as_str()).or_default() += 1;
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rare_traces_are_all_kept_whole_and_routine_ones_at_the_ratio() -> Result<()> {
    let backend = OtlpSink::start().await?;
    let logs = integration_tests::workspace_root().join("target/it");
    std::fs::create_dir_all(&logs)?;
    let collector = Collector::start(
        CollectorSettings {
            backend: &format!("http://{}", backend.addr),
            routine_percent: ROUTINE_PERCENT,
            decision_wait: DECISION_WAIT,
        },
        logs.join(format!("collector-{}.log", uuid::Uuid::new_v4().simple())),
    )
    .await?;
    let env = TestEnv::new(
        "tracesampling",
        &format!(
            "[telemetry]\ntraces_endpoint = \"{}\"\n\n[http_ingest]\nlisten = \"127.0.0.1:0\"\n\
             token = \"{TOKEN}\"\nmax_in_flight = 2\n",
            collector.traces_endpoint()
        ),
    )
    .await?;
    // Spans exported every 200 ms (the SDK's default is 5 s, longer than DECISION_WAIT): an
    // order's spans reach the collector within one decision, as they would with production's
    // 30 s wait.
    let mut herald = env.spawn_roles(
        "ingest,relay,deliver",
        "herald",
        &[UNVERIFIED_SENDER, ("OTEL_BSP_SCHEDULE_DELAY", "200")],
    )?;
    produce_mix(&env, MIX).await?;
    wait_settled(&env, MIX, WAIT).await?;
    // An HTTP producer's order, then the same Idempotency-Key with another total: 422, kept
    // as evidence, and its trace kept whatever the share.
    let http = herald.http_ingest_addr(WAIT).await?;
    let (created, refused) = (new_trace_id(), new_trace_id());
    for (trace, total, status) in [(&created, "12.00", 201), (&refused, "99.00", 422)] {
        let answer = post_order(&http, trace, total).await?;
        assert_eq!(answer.status, status, "{answer:?}");
    }
    env.wait_count(
        "the HTTP order's intent accepted",
        "SELECT count(*) FROM notification_intents WHERE order_id = 'http-1' AND state = 'accepted'",
        1,
        WAIT,
    )
    .await?;
    // Herald exports in batches; the collector decides DECISION_WAIT after a trace's first
    // span. Herald stopped by SIGTERM flushes its exporter; then the backend has all once
    // nothing has come for longer than a decision.
    let status = herald.terminate(WAIT).await?;
    assert!(status.success(), "herald stopped cleanly: {status}");
    let received = backend
        .settled(DECISION_WAIT + Duration::from_secs(4), WAIT)
        .await?;

    let orders_topic = env.topic("order-events");
    let deliveries_topic = env.topic("herald.deliveries");
    let process_orders = format!("process {orders_topic}");
    let send_deliveries = format!("send {deliveries_topic}");
    let process_deliveries = format!("process {deliveries_topic}");
    // Each order's first event starts the trace its intents carry.
    let rows = env
        .db
        .query(
            "SELECT split_part(trace_context, '-', 2), state, channel FROM notification_intents
             WHERE order_id <> 'http-1'",
            &[],
        )
        .await?;
    let mut by_trace: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for r in &rows {
        by_trace
            .entry(r.get(0))
            .or_default()
            .push((r.get::<_, String>(1), r.get::<_, String>(2)));
    }
    assert_eq!(by_trace.len(), MIX.orders + MIX.rejected, "one trace per order");

    // What a whole order trace holds: the ingest span, both intents' spans, and for each
    // intent sent (accepted or rejected) its relay, delivery, attempt and provider spans.
    let whole = |trace: &str, intents: &[(String, String)]| -> Result<()> {
        let spans = received.traces.get(trace).context("trace not received")?;
        let n = names(spans);
        let sent: Vec<&(String, String)> = intents.iter().filter(|(s, _)| s != "suppressed").collect();
        let expect = |name: &str, count: usize| -> Result<()> {
            anyhow::ensure!(
                n.get(name).copied().unwrap_or(0) == count,
                "trace {trace}: {count} {name:?} span(s) expected, got {n:?}"
            );
            Ok(())
        };
        expect(&process_orders, 1)?;
        expect("intent created", 2)?;
        expect(&send_deliveries, sent.len())?;
        expect(&process_deliveries, sent.len())?;
        expect("attempt", sent.len())?;
        expect("SES SendEmail", sent.iter().filter(|(_, c)| c == "email").count())?;
        expect("SNS Publish", sent.iter().filter(|(_, c)| c == "sms").count())?;
        Ok(())
    };

    // Rare: every rejected intent's trace, whole, with the rejection on its attempt span.
    let mut rare = BTreeSet::new();
    for (trace, intents) in &by_trace {
        if intents.iter().any(|(s, _)| s == "rejected") {
            whole(trace, intents).with_context(|| format!("rejected order's trace {trace}"))?;
            let spans = &received.traces[trace];
            assert!(
                spans.iter().any(|s| s.name == "attempt"
                    && s.attributes.get("herald.outcome").map(String::as_str) == Some("rejected")),
                "the rejected attempt's span says so"
            );
            rare.insert(trace.clone());
        }
    }
    assert_eq!(rare.len(), MIX.rejected, "every rejected order's trace kept");
    // Rare: every conflict's trace (its own event's trace, which has no intent of its own).
    let conflict_traces: Vec<&Vec<SpanSeen>> = received
        .traces
        .values()
        .filter(|spans| spans.iter().any(|s| s.name == "intent conflict"))
        .collect();
    assert_eq!(
        conflict_traces.len(),
        MIX.conflicts() / 2,
        "every conflicting event's trace kept"
    );
    for spans in conflict_traces {
        let n = names(spans);
        assert_eq!(
            n.get("intent conflict"),
            Some(&2),
            "both channels' conflicts: {n:?}"
        );
        assert_eq!(
            n.get(process_orders.as_str()),
            Some(&1),
            "with the event's ingest span: {n:?}"
        );
        assert!(spans.iter().filter(|s| s.name == "intent conflict").all(|s| s
            .attributes
            .get("herald.outcome")
            .map(String::as_str)
            == Some("conflict")));
    }

    // Rare: the refused HTTP request's trace, its server span saying why.
    let refused_spans = received
        .traces
        .get(&refused)
        .context("the refused HTTP request's trace was not kept")?;
    let server = refused_spans
        .iter()
        .find(|s| s.name == "POST /v1/order-events")
        .context("its server span")?;
    assert_eq!(
        server.attributes.get("herald.outcome").map(String::as_str),
        Some("idempotency_key_reused")
    );
    assert_eq!(
        server
            .attributes
            .get("http.response.status_code")
            .map(String::as_str),
        Some("422")
    );

    // Routine: the rest, at the share, each one whole or absent.
    let routine: Vec<(&String, &Vec<(String, String)>)> =
        by_trace.iter().filter(|(t, _)| !rare.contains(*t)).collect();
    let mut kept = 0;
    for (trace, intents) in &routine {
        if received.traces.contains_key(*trace) {
            whole(trace, intents).with_context(|| format!("routine trace {trace}, kept"))?;
            kept += 1;
        }
    }
    println!(
        "{kept} of {} routine order traces kept at {ROUTINE_PERCENT}%; {} rare ones; {} traces, {} spans received",
        routine.len(),
        rare.len(),
        received.traces.len(),
        received.spans
    );
    // 60 routine traces at 30%: 18 expected; none or all would be a broken policy (the
    // chance of either by luck is below 1e-9).
    assert!(
        kept > 0 && kept < routine.len(),
        "{kept} of {} routine order traces kept at {ROUTINE_PERCENT}%",
        routine.len()
    );
    drop(collector);
    env.cleanup().await;
    Ok(())
}

/// Waits until the collector has decided `kept` and `dropped` traces in all.
async fn decided(collector: &Collector, kept: u64, dropped: u64) -> Result<()> {
    let waited = integration_tests::wait_for("the collector's decisions", WAIT, || async {
        Ok((collector.decisions().await? == (kept, dropped)).then_some(()))
    })
    .await;
    match waited {
        Ok(()) => Ok(()),
        Err(e) => Err(e.context(format!(
            "expected (kept, dropped) = ({kept}, {dropped}), the collector says {:?}",
            collector.decisions().await.ok()
        ))),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_spans_are_decided_again_when_their_trace_was_dropped_and_kept_when_it_was_kept() -> Result<()> {
    // Spans sent by hand, as Herald's pods send them, to a collector keeping no routine
    // trace: what becomes of spans that arrive after their trace's decision (a retry, a late
    // record, a backlog).
    let backend = OtlpSink::start().await?;
    let logs = integration_tests::workspace_root().join("target/it");
    std::fs::create_dir_all(&logs)?;
    let collector = Collector::start(
        CollectorSettings {
            backend: &format!("http://{}", backend.addr),
            routine_percent: 0.0,
            decision_wait: Duration::from_secs(1),
        },
        logs.join(format!("collector-late-{}.log", uuid::Uuid::new_v4().simple())),
    )
    .await?;
    let addr = collector.otlp_http.clone();
    let (dropped, other, kept) = (new_trace_id(), new_trace_id(), new_trace_id());
    let span = |trace_id, name, attributes| SpanOut {
        trace_id,
        name,
        attributes,
    };
    // A routine order: dropped. Then another routine one, dropped after it.
    export(
        &addr,
        &[span(&dropped, "intent created", &[("herald.outcome", "created")])],
    )
    .await?;
    decided(&collector, 0, 1).await?;
    export(
        &addr,
        &[span(&other, "intent created", &[("herald.outcome", "created")])],
    )
    .await?;
    decided(&collector, 0, 2).await?;
    // The first order's retry, minutes later, goes unknown: decided again, and kept.
    export(
        &addr,
        &[span(&dropped, "attempt", &[("herald.outcome", "unknown")])],
    )
    .await?;
    decided(&collector, 1, 2).await?;
    // A rejected order: kept. Its late routine span (a record) is kept with it.
    export(
        &addr,
        &[span(&kept, "attempt", &[("herald.outcome", "rejected")])],
    )
    .await?;
    decided(&collector, 2, 2).await?;
    export(&addr, &[span(&kept, "process herald.deliveries", &[])]).await?;
    let received = integration_tests::wait_for("the late spans at the backend", WAIT, || async {
        let r = backend.received();
        let late_kept = r.traces.get(&kept).map_or(0, Vec::len) == 2;
        Ok((late_kept && r.traces.contains_key(&dropped)).then_some(r))
    })
    .await?;
    let names = |t: &str| -> Vec<&str> { received.traces[t].iter().map(|s| s.name.as_str()).collect() };
    assert_eq!(
        names(&dropped),
        ["attempt"],
        "only the late unknown attempt of the dropped order"
    );
    assert!(
        !received.traces.contains_key(&other),
        "a routine trace is not kept"
    );
    drop(collector);
    Ok(())
}
