//! `herald-demo`: the driver behind `make demo`. With `herald run` (ingest, relay, deliver)
//! on the local stack, it produces sample sellers and orders (duplicates, a conflicting
//! re-emission, an unrouted kind, a poison message), waits until the ingest group has
//! committed everything and every sendable intent reached moto, and prints each intent with
//! its attempts and the provider's message ids.
//!
//! Then one e-mail is made `unknown` (toxiproxy holds SES's answer past the attempt
//! timeout) and settled by the provider's own events, published through SNS to the SQS
//! queue the `reconcile` role reads. `herald-demo setup`, run by `deploy/local/demo.sh`
//! before Herald starts, creates that proxy and the queue.
//!
//! Order 8047 comes through HTTP ingest instead: posted twice under one Idempotency-Key,
//! then with a changed total under it (201, 200 replayed, 422).
//!
//! Order ids are fixed: running the demo again converges every event on the intents of
//! the first run, which is the point of Herald.

use std::time::Duration;

use anyhow::{Context, Result};
use herald_core::destination::mask as mask_destination;
use integration_tests::kafka::{committed_lag, produce, producer, read_all};
use integration_tests::moto::{emails_to, MOTO};
use integration_tests::samples::{order_event, Seller};
use integration_tests::ses_events::{ses_event, About, EventQueue};
use integration_tests::toxiproxy::{self, Proxy};
use integration_tests::trace_ui::{trace_url, zipkin_span_names};
use integration_tests::{http, pg_connect, wait_for, PG_ADMIN_URL};

const ORDERS: &str = "order-events";
const SELLERS: &str = "seller-profiles";
const GROUP: &str = "herald-ingest";
/// Herald's admin endpoint in config/local.toml, and Jaeger's query API (the trace UI is
/// Zipkin's, fed by Jaeger: `integration_tests::trace_ui`).
const ADMIN: &str = "127.0.0.1:19464";
/// config/local.toml's admin.token: every /v1 request needs one.
const ADMIN_TOKEN: &str = "local-admin-token-0123456789abcdef0123";
const JAEGER: &str = "127.0.0.1:16686";
/// HTTP ingest in config/local.toml.
const HTTP_INGEST: &str = "127.0.0.1:19480";

/// What demo.sh points Herald's senders at (toxiproxy, in front of moto), and the queue of
/// SES events its reconcile role reads.
const AWS_PROXY: &str = "herald-demo-aws";
const AWS_PROXY_LISTEN: &str = "127.0.0.1:14567";
const EVENT_QUEUE: &str = "herald-demo-ses-events";

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    if std::env::args().nth(1).as_deref() == Some("setup") {
        let (status, body) = http::request(
            toxiproxy::API,
            "POST",
            "/proxies",
            Some(&serde_json::json!({
                "name": AWS_PROXY, "listen": AWS_PROXY_LISTEN, "upstream": MOTO, "enabled": true
            })),
        )
        .await?;
        anyhow::ensure!(
            matches!(status, 200 | 201 | 409),
            "creating the toxiproxy proxy {AWS_PROXY}: {status} {body}"
        );
        // For demo.sh: the queue, then the topic whose envelopes reach it.
        let queue = EventQueue::named(EVENT_QUEUE).await?;
        println!("{}\n{}", queue.queue_url, queue.envelope_topic());
        return Ok(());
    }
    let db =
        pg_connect(&std::env::var("DEMO_DATABASE_URL").unwrap_or_else(|_| PG_ADMIN_URL.to_owned())).await?;
    let p = producer()?;
    let dlq_before = read_all("herald.dead-letter").map(|v| v.len()).unwrap_or(0);

    let sellers = [
        Seller {
            marketplace: "acme",
            seller_id: "seller-19",
            email: Some("s19@example.com"),
            phone: Some("+15555550100"),
            locale: "fr-FR",
            email_opt_in: true,
            sms_opt_in: true,
            version: 3,
        },
        Seller {
            marketplace: "acme",
            seller_id: "seller-23",
            email: Some("s23@example.com"),
            phone: Some("+15555550123"),
            locale: "en-GB",
            email_opt_in: true,
            sms_opt_in: false,
            version: 1,
        },
        Seller {
            marketplace: "globex",
            seller_id: "seller-7",
            email: Some("s7@example.org"),
            phone: None,
            locale: "en",
            email_opt_in: true,
            sms_opt_in: true,
            version: 2,
        },
        Seller {
            marketplace: "acme",
            seller_id: "seller-42",
            email: Some("not-an-address"),
            phone: Some("+15555550142"),
            locale: "de-DE",
            email_opt_in: true,
            sms_opt_in: true,
            version: 1,
        },
    ];
    println!("demo: producing {} seller profiles to {SELLERS}", sellers.len());
    for s in &sellers {
        produce(&p, SELLERS, Some(&s.key()), Some(&s.value()), &[]).await?;
    }
    wait_for("seller profiles stored by herald", Duration::from_secs(60), || async {
        let n: i64 = db
            .query_one("SELECT count(*) FROM sellers WHERE (marketplace_id, seller_id) IN (('acme','seller-19'),('acme','seller-23'),('globex','seller-7'),('acme','seller-42'))", &[])
            .await?
            .get(0);
        Ok((n == 4).then_some(()))
    })
    .await
    .context("is `herald run` consuming? see .local/demo/herald.log")?;

    // (event_id, kind, marketplace, order, seller, total, copies)
    let orders: [(&str, &str, &str, &str, &str, &str, usize); 7] = [
        (
            "evt-8042",
            "order.created",
            "acme",
            "8042",
            "seller-19",
            "129.90",
            3,
        ),
        (
            "evt-8043",
            "order.created",
            "acme",
            "8043",
            "seller-23",
            "15.00",
            2,
        ),
        (
            "evt-1001",
            "order.created",
            "globex",
            "1001",
            "seller-7",
            "42.00",
            1,
        ),
        (
            "evt-8044",
            "order.created",
            "acme",
            "8044",
            "seller-42",
            "7.50",
            1,
        ),
        (
            "evt-8045",
            "order.created",
            "acme",
            "8045",
            "seller-99",
            "99.99",
            1,
        ),
        (
            "evt-8043-x",
            "order.cancelled",
            "acme",
            "8043",
            "seller-23",
            "15.00",
            1,
        ),
        (
            "evt-8046-v",
            "order.viewed",
            "acme",
            "8046",
            "seller-19",
            "1.00",
            1,
        ),
    ];
    // A second run converges on the first run's intents: its trace ends at "intent reused".
    let first_run = db
        .query_one(
            "SELECT count(*) FROM notification_intents WHERE marketplace_id = 'acme' AND order_id = '8042'",
            &[],
        )
        .await?
        .get::<_, i64>(0)
        == 0;
    let mut produced = 0;
    // As an instrumented producer would: each order's events carry W3C trace context (one
    // trace per order, one producer span per copy), which Herald continues to the send.
    let mut traces = std::collections::BTreeMap::new();
    for (id, kind, m, order, seller, total, copies) in orders {
        let trace_id = traces
            .entry((m, order))
            .or_insert_with(|| uuid::Uuid::new_v4().simple().to_string())
            .clone();
        for copy in 0..copies {
            let value = order_event(&format!("{id}-{copy}"), kind, m, order, seller, total);
            let span_id = &uuid::Uuid::new_v4().simple().to_string()[..16];
            let traceparent = format!("00-{trace_id}-{span_id}-01");
            produce(
                &p,
                ORDERS,
                Some(format!("{m}:{order}:{copy}").as_bytes()),
                Some(&value),
                &[("traceparent", traceparent.as_str())],
            )
            .await?;
            produced += 1;
        }
    }
    // The same business key with a changed total: a caller bug, recorded, never sent.
    produce(
        &p,
        ORDERS,
        Some(b"acme:8042:x"),
        Some(&order_event(
            "evt-8042-fix",
            "order.created",
            "acme",
            "8042",
            "seller-19",
            "139.90",
        )),
        &[],
    )
    .await?;
    // Poison: not JSON.
    produce(&p, ORDERS, Some(b"garbage"), Some(b"{this is not json"), &[]).await?;
    produced += 2;
    println!("demo: produced {produced} order events to {ORDERS}: 3 duplicate copies, 1 conflicting re-emission, 1 unrouted kind (order.viewed), 1 poison message");

    wait_for("ingest group lag 0", Duration::from_secs(60), || async {
        Ok((committed_lag(GROUP, &[ORDERS, SELLERS])? == 0).then_some(()))
    })
    .await?;
    println!("demo: consumer group {GROUP} has committed every offset (lag 0)\n");

    wait_for("every sendable intent delivered", Duration::from_secs(90), || async {
        let n: i64 = db
            .query_one(
                "SELECT count(*) FROM notification_intents WHERE state IN ('pending', 'sending', 'retry_scheduled')",
                &[],
            )
            .await?
            .get(0);
        Ok((n == 0).then_some(()))
    })
    .await
    .context("intents still on their way; see .local/demo/herald.log")?;
    println!("demo: every sendable intent reached a final state\n");

    // Order 8045's seller had no profile when the order came: its intents were created but
    // held (awaiting_profile), with nothing rendered. The profile arrives now, late.
    let held: i64 = db
        .query_one(
            "SELECT count(*) FROM notification_intents WHERE order_id = '8045' AND state = 'awaiting_profile'",
            &[],
        )
        .await?
        .get(0);
    println!("demo: order 8045's seller (seller-99) has no profile yet: {held} intent(s) held in awaiting_profile; producing the profile late");
    let late = Seller {
        marketplace: "acme",
        seller_id: "seller-99",
        email: Some("s99@example.com"),
        phone: Some("+15555550199"),
        locale: "fr",
        email_opt_in: true,
        sms_opt_in: false,
        version: 1,
    };
    produce(&p, SELLERS, Some(&late.key()), Some(&late.value()), &[]).await?;
    wait_for(
        "order 8045 released and delivered",
        Duration::from_secs(90),
        || async {
            let n: i64 = db
                .query_one(
                    "SELECT count(*) FROM notification_intents WHERE order_id = '8045'
                   AND state IN ('awaiting_profile', 'pending', 'sending', 'retry_scheduled')",
                    &[],
                )
                .await?
                .get(0);
            Ok((n == 0).then_some(()))
        },
    )
    .await
    .context("order 8045 still held or on its way; see .local/demo/herald.log")?;
    println!("demo: order 8045 rendered with the late profile (its locale, address and consent) and sent\n");

    http_ingest().await?;
    wait_for("order 8047 delivered", Duration::from_secs(90), || async {
        let n: i64 = db
            .query_one(
                "SELECT count(*) FROM notification_intents WHERE order_id = '8047' AND state = 'accepted'",
                &[],
            )
            .await?
            .get(0);
        Ok((n == 1).then_some(()))
    })
    .await
    .context("order 8047 (HTTP ingest) not delivered; see .local/demo/herald.log")?;
    println!("demo: order 8047 (HTTP ingest) sent once\n");
    settle_by_evidence(&db, &p).await?;

    let rows = db
        .query(
            "SELECT i.marketplace_id, i.order_id, i.event_kind, i.channel, i.state, i.consent, i.template_revision,
                    p.locale, p.destination, left(i.payload_digest, 12),
                    (SELECT count(*) FROM intent_conflicts c WHERE c.intent_id = i.id),
                    coalesce((SELECT string_agg(a.attempt_no || ':' || a.outcome || coalesce(' ' || a.provider_message_id, ''), ', ' ORDER BY a.attempt_no)
                              FROM notification_attempts a WHERE a.intent_id = i.id), '-')
             FROM notification_intents i LEFT JOIN notification_payloads p ON p.digest = i.payload_digest
             ORDER BY i.marketplace_id, i.order_id, i.event_kind, i.channel",
            &[],
        )
        .await?;
    const HEADER: [&str; 12] = [
        "market",
        "order",
        "event_kind",
        "chan",
        "state",
        "consent",
        "rev",
        "locale",
        "destination",
        "payload",
        "conflicts",
        "attempts (no:outcome provider-message-id)",
    ];
    println!(
        "{:<8} {:<6} {:<16} {:<6} {:<11} {:<20} {:<4} {:<6} {:<18} {:<13} {:<9} {}",
        HEADER[0],
        HEADER[1],
        HEADER[2],
        HEADER[3],
        HEADER[4],
        HEADER[5],
        HEADER[6],
        HEADER[7],
        HEADER[8],
        HEADER[9],
        HEADER[10],
        HEADER[11]
    );
    for r in &rows {
        println!(
            "{:<8} {:<6} {:<16} {:<6} {:<11} {:<20} {:<4} {:<6} {:<18} {:<13} {:<9} {}",
            r.get::<_, String>(0),
            r.get::<_, String>(1),
            r.get::<_, String>(2),
            r.get::<_, String>(3),
            r.get::<_, String>(4),
            // Revision, consent and payload are frozen together; a held intent has none.
            r.get::<_, Option<String>>(5).unwrap_or_else(|| "-".into()),
            r.get::<_, Option<String>>(6).unwrap_or_else(|| "-".into()),
            r.get::<_, Option<String>>(7).unwrap_or_else(|| "-".into()),
            r.get::<_, Option<String>>(8)
                .map_or_else(|| "-".to_owned(), |d| mask_destination(&d)),
            r.get::<_, Option<String>>(9).unwrap_or_else(|| "-".into()),
            r.get::<_, i64>(10),
            r.get::<_, String>(11),
        );
    }
    let dlq_after = read_all("herald.dead-letter")?.len();
    println!(
        "\ndemo: {} intents; {} dead letter(s) added to herald.dead-letter by this run",
        rows.len(),
        dlq_after.saturating_sub(dlq_before)
    );
    let trace = &traces[&("acme", "8042")];
    // The same order through Herald's admin API and in Jaeger, while herald still runs.
    let (status, text) = http::request_text(
        ADMIN,
        "GET",
        "/v1/intents?marketplace_id=acme&order_id=8042",
        &[("Authorization", &format!("Bearer {ADMIN_TOKEN}"))],
        None,
    )
    .await?;
    let body: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let states: Vec<String> = body["intents"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|i| {
                    format!(
                        "{} {}",
                        i["channel"].as_str().unwrap_or("?"),
                        i["state"].as_str().unwrap_or("?")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    println!(
        "\ndemo: admin API GET /v1/intents?marketplace_id=acme&order_id=8042 -> {status}: {}",
        states.join(", ")
    );
    let spans = wait_for(
        "the trace of acme/8042 in Jaeger",
        Duration::from_secs(30),
        || async {
            let (status, body) = http::request(JAEGER, "GET", &format!("/api/traces/{trace}"), None).await?;
            let names: Vec<String> = body["data"][0]["spans"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s["operationName"].as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            // Complete once both provider calls are in (or, on a re-run, the reuse).
            let has = |n: &str| names.iter().any(|x| x == n);
            let done = status == 200
                && if first_run {
                    has("SES SendEmail") && has("SNS Publish")
                } else {
                    has("intent reused")
                };
            Ok(done.then_some(names))
        },
    )
    .await
    .context("Jaeger (127.0.0.1:16686) did not show the trace: is it running (make stack-status)?")?;
    let mut kinds = spans.clone();
    kinds.sort();
    kinds.dedup();
    println!(
        "demo: Jaeger holds {} spans for trace {trace}: {}",
        spans.len(),
        kinds.join(", ")
    );
    // The trace UI: Zipkin gets the same spans from Jaeger's collector, through Kafka.
    let in_zipkin = wait_for(
        "the trace of acme/8042 in Zipkin",
        Duration::from_secs(60),
        || async {
            let names = zipkin_span_names(trace).await?.unwrap_or_default();
            let all = kinds.iter().all(|k| names.contains(&k.to_lowercase()));
            Ok(all.then_some(names.len()))
        },
    )
    .await
    .context("Zipkin (127.0.0.1:19411) did not show the trace: is it running (make stack-status)?")?;
    println!("demo: Zipkin holds {in_zipkin} spans for trace {trace}");
    println!("\ndemo: order acme/8042 side by side, as trace and as ledger:");
    println!("  trace id      {trace}");
    println!(
        "  trace UI      {}  (Zipkin: open it in a browser)",
        trace_url(trace)
    );
    println!("  Jaeger API    http://127.0.0.1:16686/api/traces/{trace}  (the same spans as JSON)");
    println!(
        "  admin API     curl -H 'Authorization: Bearer {ADMIN_TOKEN}' \\\n                  'http://127.0.0.1:19464/v1/intents?marketplace_id=acme&order_id=8042'  (while herald runs: make run)"
    );
    println!("  metrics       http://127.0.0.1:19464/metrics");
    println!("  ledger        target/debug/herald --config config/local.toml intent list acme 8042");
    println!("  one intent    target/debug/herald --config config/local.toml intent show acme 8042 order.created email");
    println!("  evidence      target/debug/herald --config config/local.toml intent show acme 8042 order.cancelled email");
    println!("  lag           target/debug/herald --config config/local.toml lag");
    Ok(())
}

/// One e-mail made `unknown` and settled by the provider's events: order 8042 is cancelled
/// while toxiproxy holds SES's answers; then SES's `Send` and `Delivery` records for that
/// message arrive on the event queue.
/// Order 8047 through HTTP ingest (config/local.toml's `[http_ingest]`), as a producer
/// without Kafka posts it: twice under one Idempotency-Key (a retry), then with a changed
/// total under the same key. A second demo run finds the key answered: its first post is a
/// replay too.
async fn http_ingest() -> Result<()> {
    let body = |total: &str| {
        let mut event: serde_json::Value = serde_json::from_slice(&order_event(
            "evt-8047",
            "order.created",
            "acme",
            "8047",
            "seller-19",
            total,
        ))
        .expect("a sample event is JSON");
        event["channel"] = "email".into();
        event.to_string()
    };
    let headers = [
        ("Authorization", "Bearer local-ingest-token"),
        ("Idempotency-Key", "demo-order-8047"),
        ("Content-Type", "application/json"),
    ];
    let mut answers = Vec::new();
    for total in ["58.00", "58.00", "59.00"] {
        let a = http::exchange(
            HTTP_INGEST,
            "POST",
            "/v1/order-events",
            &headers,
            body(total).as_bytes(),
        )
        .await
        .context("posting to HTTP ingest (is http_ingest.listen set?)")?;
        let v = a.json();
        let what = match (a.status, v["intents"][0]["outcome"].as_str(), v["error"].as_str()) {
            (201, Some(outcome), _) => format!("{outcome}, intent {}", v["intents"][0]["intent_id"]),
            (200, _, _) => "replayed (Idempotent-Replayed: true)".to_owned(),
            (_, _, Some(error)) => error.to_owned(),
            _ => a.body.clone(),
        };
        println!("demo: POST /v1/order-events order 8047 total {total}, Idempotency-Key demo-order-8047 -> {} {what}", a.status);
        answers.push(a.status);
    }
    anyhow::ensure!(
        matches!(answers[..], [201 | 200, 200, 422]),
        "HTTP ingest answered {answers:?}, expected [201, 200, 422]"
    );
    Ok(())
}

async fn settle_by_evidence(
    db: &tokio_postgres::Client,
    p: &rdkafka::producer::FutureProducer,
) -> Result<()> {
    let done: i64 = db
        .query_one(
            "SELECT count(*) FROM notification_intents
              WHERE order_id = '8042' AND event_kind = 'order.cancelled' AND channel = 'email'",
            &[],
        )
        .await?
        .get(0);
    if done > 0 {
        println!("demo: order 8042's cancellation e-mail was settled in an earlier run\n");
        return Ok(());
    }
    let proxy = Proxy {
        name: AWS_PROXY.into(),
        listen: AWS_PROXY_LISTEN.into(),
    };
    let before = emails_to("s19@example.com").await?.len();
    proxy.delay_responses().await?;
    produce(
        p,
        ORDERS,
        Some(b"acme:8042:cancel"),
        Some(&order_event(
            "evt-8042-cancel",
            "order.cancelled",
            "acme",
            "8042",
            "seller-19",
            "129.90",
        )),
        &[],
    )
    .await?;
    println!("demo: order 8042 cancelled while toxiproxy holds SES's answers past the attempt timeout");
    let waited = wait_for(
        "the cancellation e-mail unknown",
        Duration::from_secs(90),
        || async {
            let r = db
                .query_opt(
                    "SELECT i.id FROM notification_intents i
                  WHERE i.order_id = '8042' AND i.event_kind = 'order.cancelled' AND i.channel = 'email'
                    AND i.state = 'unknown' AND i.next_attempt_at IS NOT NULL",
                    &[],
                )
                .await?;
            Ok(r.map(|r| r.get::<_, uuid::Uuid>(0)))
        },
    )
    .await;
    proxy.remove_toxic("slow-responses").await?;
    let intent = waited.context("the cancellation e-mail did not end unknown; see .local/demo/herald.log")?;
    let sent = emails_to("s19@example.com").await?;
    let message_id = sent
        .get(before)
        .and_then(|m| m["id"].as_str())
        .context("SES (moto) did not receive the cancellation e-mail")?
        .to_owned();
    println!(
        "demo: intent {intent} is unknown (SES took the message as {message_id}, Herald never heard back); \
         it waits reconcile.silence_secs for SES's events instead of resending"
    );
    let queue = EventQueue::named(EVENT_QUEUE).await?;
    let simple = intent.simple().to_string();
    let about = About {
        message_id: &message_id,
        tags: Some((&simple, 1)),
        recipient: "s19@example.com",
    };
    queue.publish(&ses_event("send", &about)?, true).await?;
    queue.publish(&ses_event("delivery", &about)?, false).await?;
    println!(
        "demo: SES's Send and Delivery events for {message_id} published to SNS, delivered to {EVENT_QUEUE}"
    );
    wait_for("the intent settled by evidence", Duration::from_secs(90), || async {
        let r = db
            .query_opt(
                "SELECT r.resolved_as, r.settled_by, e.event_type
                   FROM intent_resolutions r JOIN provider_events e ON e.id = r.provider_event_id
                  WHERE r.intent_id = $1",
                &[&intent],
            )
            .await?;
        Ok(r.map(|r| (r.get::<_, String>(0), r.get::<_, String>(1), r.get::<_, String>(2))))
    })
    .await
    .map(|(r#as, by, event)| {
        println!("demo: the reconcile role settled it: {as} by {by} (the {event} event); one message at SES, no resend\n")
    })
    .context("the reconcile role did not settle the intent; see .local/demo/reconcile.log")?;
    Ok(())
}
