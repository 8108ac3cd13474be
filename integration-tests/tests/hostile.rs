//! Hostile input, end to end: order events and seller profiles built to break a parser, a
//! template, a SQL statement or a mail header. Each ends in the dead-letter topic with its
//! reason, or as intents whose content reaches the provider inert; nothing crashes Herald
//! or stalls a partition.

use std::time::Duration;

use anyhow::Result;
use integration_tests::kafka::{produce, producer, read_all};
use integration_tests::moto::emails_to;
use integration_tests::samples::{Seller, UniqueSeller};
use integration_tests::{wait_for, TestEnv};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(90);

fn event(order_id: &str, seller_id: &str, order: Value) -> Value {
    json!({
        "event_id": format!("evt-{order_id}"),
        "event_kind": "order.created",
        "marketplace_id": "acme",
        "order_id": order_id,
        "seller_id": seller_id,
        "occurred_at": "2026-09-21T10:00:00Z",
        "order": order,
    })
}

fn bytes(v: &Value) -> Vec<u8> {
    v.to_string().into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_events_and_profiles_end_dead_lettered_or_inert() -> Result<()> {
    let env = TestEnv::new("hostile", "").await?;
    let mut herald = env.spawn_roles("ingest,relay,deliver", "herald", &[])?;
    let p = producer()?;
    let orders = env.topic("order-events");
    let sellers = env.topic("seller-profiles");

    // Sellers: one good, one with malformed destinations, one with header injection.
    let good = UniqueSeller::new();
    let injected = format!("{}\r\nBcc: evil@attacker.example", good.email);
    let profiles = [
        good.profile("s-good"),
        Seller {
            email: Some("not-an-address"),
            phone: Some("12ab"),
            ..good.profile("s-malformed")
        },
        Seller {
            email: Some(&injected),
            phone: Some("+1555\n0100"),
            ..good.profile("s-injected")
        },
    ];
    for s in &profiles {
        produce(&p, &sellers, Some(&s.key()), Some(&s.value()), &[]).await?;
    }
    env.wait_lag_zero("herald-ingest", &["seller-profiles"]).await?;

    // Decodable and routed: these become intents.
    let sql_id = "1'; DROP TABLE notification_intents; --";
    let sent = [
        // Template syntax in data is data: rendered as written, never evaluated.
        event(
            "h-template",
            "s-good",
            json!({"total": "{{ 7*7 }}", "currency": "{% for x in range(99999999) %}x{% endfor %}", "item_count": 3}),
        ),
        // Markup in data: escaped in the HTML part.
        event(
            "h-markup",
            "s-good",
            json!({"total": "<script>alert(1)</script>", "currency": "EUR", "item_count": 1}),
        ),
        // SQL metacharacters in an id: stored and shown verbatim.
        event(
            sql_id,
            "s-good",
            json!({"total": "1.00", "currency": "EUR", "item_count": 1}),
        ),
        // Numbers as strings and strings as numbers, unknown fields anywhere.
        {
            let mut e = event(
                "h-types",
                "s-good",
                json!({"total": 12.5, "currency": "EUR", "item_count": "3", "x_unknown": {"a": [1, 2]}}),
            );
            e["x_extra_top_level"] = json!({"nested": true});
            e
        },
        // CR/LF and other controls inside order data (not in ids): they stay in the body.
        event(
            "h-controls",
            "s-good",
            json!({"total": "1.00\r\nBcc: evil@attacker.example", "currency": "EUR\u{0007}", "item_count": 1}),
        ),
    ];
    let suppressed = [
        event(
            "h-malformed",
            "s-malformed",
            json!({"total": "1.00", "currency": "EUR", "item_count": 1}),
        ),
        event(
            "h-injected",
            "s-injected",
            json!({"total": "1.00", "currency": "EUR", "item_count": 1}),
        ),
    ];
    for e in sent.iter().chain(&suppressed) {
        produce(&p, &orders, None, Some(&bytes(e)), &[]).await?;
    }

    // Not decodable: each must be dead-lettered with its reason.
    let good_text = bytes(&event("h-ok", "s-good", json!({"total": "1.00"})));
    let good_text = String::from_utf8(good_text)?;
    let nested = format!("{}{}", "[".repeat(1_000), "]".repeat(1_000));
    let poison: Vec<(&str, Vec<u8>)> = vec![
        ("not_utf8", b"{\"event_id\":\"\xc3\x28\"}".to_vec()),
        (
            "invalid_value",
            good_text
                .replacen(
                    "\"order_id\":\"h-ok\"",
                    "\"order_id\":\"h-ok\",\"order_id\":\"h-other\"",
                    1,
                )
                .into_bytes(),
        ),
        (
            "not_json",
            good_text
                .replacen("{\"total\":\"1.00\"}", &format!("{{\"total\":{nested}}}"), 1)
                .into_bytes(),
        ),
        (
            "too_large",
            bytes(&event("h-huge", "s-good", json!({"total": "9".repeat(100_000)}))),
        ),
        (
            "invalid_value",
            bytes(&event("h\r\nX-Header: 1", "s-good", json!({}))),
        ),
        (
            "invalid_value",
            bytes(&event("h-nul\u{0000}", "s-good", json!({}))),
        ),
        (
            "wrong_type",
            good_text
                .replacen("\"order_id\":\"h-ok\"", "\"order_id\":8042", 1)
                .into_bytes(),
        ),
        ("missing_field", {
            let mut e = event("h-no-seller", "s-good", json!({"total": "1.00"}));
            e.as_object_mut().map(|o| o.remove("seller_id"));
            bytes(&e)
        }),
        ("not_json", b"\xef\xbb\xbf{\"bom\": true}".to_vec()),
        ("not_json", b"null".to_vec()),
        ("not_json", b"".to_vec()),
    ];
    let mut sources = Vec::new();
    for (reason, value) in &poison {
        let (partition, offset) = produce(&p, &orders, None, Some(value), &[]).await?;
        sources.push((*reason, partition, offset));
    }

    // Nothing stalls: every message is consumed, every intent settles.
    env.wait_lag_zero("herald-ingest", &["order-events", "seller-profiles"])
        .await?;
    let intents = 2 * (sent.len() + suppressed.len()) as i64;
    env.wait_count(
        "every intent accepted or suppressed",
        "SELECT count(*) FROM notification_intents WHERE state IN ('accepted', 'suppressed')",
        intents,
        WAIT,
    )
    .await?;
    env.wait_lag_zero("herald-delivery", &["herald.deliveries"])
        .await?;
    assert!(herald.is_running(), "Herald survived the corpus");

    // Dead letters: one per poison message, with the expected reason.
    let dlq = env.topic("herald.dead-letter");
    let letters = wait_for("dead letters", WAIT, || async {
        let l = read_all(&dlq)?;
        Ok((l.len() >= poison.len()).then_some(l))
    })
    .await?;
    assert_eq!(
        letters.len(),
        poison.len(),
        "each poison message dead-lettered once"
    );
    for (reason, partition, offset) in &sources {
        let letter = letters
            .iter()
            .find(|l| {
                l.headers.get("herald-dlq-source-partition") == Some(&partition.to_string())
                    && l.headers.get("herald-dlq-source-offset") == Some(&offset.to_string())
            })
            .unwrap_or_else(|| panic!("no dead letter for {reason} at {partition}@{offset}"));
        assert_eq!(
            letter.headers.get("herald-dlq-reason").map(String::as_str),
            Some(*reason),
            "{partition}@{offset}: {:?}",
            letter.headers.get("herald-dlq-detail")
        );
    }

    // The malformed and injected destinations: suppressed, never sent.
    assert_eq!(
        env.count(
            "SELECT count(*) FROM notification_intents
             WHERE state = 'suppressed' AND consent = 'invalid_destination'"
        )
        .await?,
        4
    );
    // The SQL-looking id is just an id.
    assert_eq!(
        env.count(&format!(
            "SELECT count(*) FROM notification_intents WHERE order_id = '{}' AND state = 'accepted'",
            sql_id.replace('\'', "''")
        ))
        .await?,
        2
    );

    // What the provider received: one e-mail per sent order, each inert.
    let emails = emails_to(&good.email).await?;
    assert_eq!(emails.len(), sent.len(), "one e-mail per sendable order");
    assert!(
        emails_to("evil@attacker.example").await?.is_empty(),
        "no header injection reached the provider"
    );
    for m in &emails {
        let subject = m["subject"].as_str().unwrap_or_default();
        assert!(!subject.contains(['\r', '\n']), "subject {subject:?}");
        let text = m["body"].to_string();
        // moto keeps the HTML part as the body: markup from data arrives escaped there.
        assert!(
            !text.contains("<script>"),
            "markup escaped in the HTML part: {text}"
        );
    }
    let all = serde_json::to_string(&emails)?;
    assert!(
        all.contains("{{ 7*7 }}"),
        "template syntax in data is sent as written"
    );
    assert!(!all.contains("total 49 "), "and never evaluated");
    assert!(all.contains(sql_id), "the id verbatim in the subject");

    assert!(herald.terminate(WAIT).await?.success());
    env.cleanup().await;
    Ok(())
}
