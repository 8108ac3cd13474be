//! Hostile input, end to end: order events and seller profiles built to break a parser, a
//! template, a SQL statement or a mail header. Each ends in the dead-letter topic with its
//! reason, or as intents whose content reaches the provider inert; nothing crashes Herald
//! or stalls a partition.
//!
//! Issue 14, "no input may stall a partition": U+0000 (the JSON escape `\u0000`) in every
//! kind of field of both topics, which PostgreSQL refuses in `text` and `jsonb`; a
//! conflicting re-emission whose changed field holds it; and an order event of 1,040,247
//! bytes, more than the dead-letter producer may send. For each, what a user checks: the
//! dead letter with its reason and the field it names, a healthy order produced after it
//! on the same partition converged and delivered, and the ingest group's committed offset
//! past the bad message.

use std::time::Duration;

use anyhow::{bail, Result};
use herald_kafka::headers::{
    DLQ_DETAIL, DLQ_ORIGINAL_BLAKE3, DLQ_ORIGINAL_SIZE, DLQ_PAYLOAD, DLQ_REASON, DLQ_SOURCE_OFFSET,
    DLQ_SOURCE_PARTITION, DLQ_SOURCE_TOPIC,
};
use integration_tests::kafka::{
    committed_offset, produce, produce_to, producer, producer_with, read_all, Record,
};
use integration_tests::moto::{emails_to, sms_to};
use integration_tests::samples::{Seller, UniqueSeller};
use integration_tests::{publish_sellers, wait_for, EnvOptions, HeraldProcess, TestEnv};
use rdkafka::producer::FutureProducer;
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

// ---------------------------------------------------------------------------------------
// Issue 14: no input may stall a partition.

/// How long a healthy message behind a bad one may take to be committed before the
/// partition counts as stalled. With nothing wrong it takes a few seconds (a poll batch and
/// the consumer's auto-commit interval).
const STALL: Duration = Duration::from_secs(60);

/// The seller of the order events in the U+0000 tests.
const SELLER: &str = "s-nul";

/// An `order.created` event of seller [`SELLER`] with one of each kind of field: ids,
/// timestamps, nested strings, an array of strings and a nested object.
fn order_value(order_id: &str) -> Value {
    json!({
        "event_id": format!("evt-{order_id}"),
        "event_kind": "order.created",
        "marketplace_id": "acme",
        "order_id": order_id,
        "seller_id": SELLER,
        "occurred_at": "2026-09-21T10:00:00Z",
        "produced_at": "2026-09-21T10:00:01Z",
        "order": {
            "total": "12.00",
            "currency": "EUR",
            "item_count": 3,
            "tags": ["gift", "express"],
            "extras": {"gift_wrap": true},
        },
    })
}

/// Where a message landed.
#[derive(Debug, Clone)]
struct Sent {
    topic: String,
    partition: i32,
    offset: i64,
}

/// One test's world: a namespace of its own, one herald process with every role, and the
/// seller [`SELLER`] stored (which also proves ingest consumes).
struct Stage {
    env: TestEnv,
    herald: HeraldProcess,
    producer: FutureProducer,
    seller: UniqueSeller,
}

impl Stage {
    async fn new(name: &str) -> Result<Self> {
        Self::with(name, EnvOptions::default(), &[], producer()?).await
    }

    async fn with(
        name: &str,
        options: EnvOptions,
        vars: &[(&str, &str)],
        producer: FutureProducer,
    ) -> Result<Self> {
        let env = TestEnv::with_options(name, "", options).await?;
        let herald = env.spawn_roles("ingest,relay,deliver", "herald", vars)?;
        let seller = UniqueSeller::new();
        publish_sellers(&env, &[seller.profile(SELLER)]).await?;
        Ok(Self {
            env,
            herald,
            producer,
            seller,
        })
    }

    /// Produces to an (unprefixed) topic, to `partition` when given, else by key.
    async fn send(&self, topic: &str, partition: Option<i32>, key: &[u8], value: &[u8]) -> Result<Sent> {
        let topic = self.env.topic(topic);
        let (partition, offset) =
            produce_to(&self.producer, &topic, partition, Some(key), Some(value), &[]).await?;
        Ok(Sent {
            topic,
            partition,
            offset,
        })
    }

    /// Produces an order event keyed by `key`.
    async fn send_order(&self, key: &str, value: &Value) -> Result<Sent> {
        self.send("order-events", None, key.as_bytes(), &bytes(value))
            .await
    }

    /// Waits until the ingest group's committed offset passes `healthy`, produced after
    /// `bad` on the same partition: the bad message no longer holds the partition. Fails
    /// naming the stall and herald's last ingest error.
    async fn expect_passed(&self, bad: &Sent, healthy: &Sent) -> Result<()> {
        assert_eq!(
            (&bad.topic, bad.partition),
            (&healthy.topic, healthy.partition),
            "the test must put the healthy message behind the bad one"
        );
        assert!(healthy.offset > bad.offset);
        let group = self.env.group("herald-ingest");
        let passed = wait_for("the committed offset to pass the bad message", STALL, || async {
            let c = committed_offset(&group, &healthy.topic, healthy.partition)?;
            Ok(c.filter(|c| *c > healthy.offset).map(|_| ()))
        })
        .await;
        if passed.is_err() {
            let committed = committed_offset(&group, &healthy.topic, healthy.partition)?;
            bail!(
                "partition stalled: {group} committed {committed:?} on {}[{}] after {STALL:?}; the bad \
                 message is at offset {}, the healthy one behind it at {}; herald's last ingest error: {}",
                healthy.topic,
                healthy.partition,
                bad.offset,
                healthy.offset,
                last_error(&self.herald)
            );
        }
        Ok(())
    }

    /// Waits for the dead letter of `bad`; checks it is the only one in the namespace (the
    /// healthy messages were not dead-lettered) and carries `reason` and a detail naming
    /// `field`.
    async fn expect_dead_letter(&self, bad: &Sent, reason: &str, field: &str) -> Result<Record> {
        let dlq = self.env.topic("herald.dead-letter");
        let letters = wait_for("the dead letter of the bad message", WAIT, || async {
            let letters = read_all(&dlq)?;
            Ok(letters.iter().any(|l| is_letter_of(l, bad)).then_some(letters))
        })
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "no dead letter for {}[{}]@{} ({e}); the dead-letter topic holds {:?}",
                bad.topic,
                bad.partition,
                bad.offset,
                read_all(&dlq).map(|l| l.iter().map(|l| l.headers.clone()).collect::<Vec<_>>())
            )
        })?;
        assert_eq!(
            letters.len(),
            1,
            "only the bad message is dead-lettered: {:?}",
            letters.iter().map(|l| &l.headers).collect::<Vec<_>>()
        );
        let letter = letters.into_iter().next().expect("one letter");
        let header = |name: &str| letter.headers.get(name).cloned().unwrap_or_default();
        assert_eq!(
            header(DLQ_REASON),
            reason,
            "reason; detail: {}",
            header(DLQ_DETAIL)
        );
        assert!(
            header(DLQ_DETAIL).contains(field),
            "the detail names {field}: {:?}",
            header(DLQ_DETAIL)
        );
        Ok(letter)
    }

    /// Waits until `order_id` has its two intents accepted, and checks the provider
    /// received one e-mail and one SMS for it at `seller`'s destinations.
    async fn expect_delivered(&self, order_id: &str, seller: &UniqueSeller) -> Result<()> {
        self.env
            .wait_count(
                &format!("order {order_id} accepted on both channels"),
                &format!(
                    "SELECT count(*) FROM notification_intents WHERE order_id = '{order_id}' AND state = 'accepted'"
                ),
                2,
                WAIT,
            )
            .await?;
        let subject = format!("New order {order_id} on acme");
        let emails = emails_to(&seller.email).await?;
        let emails = emails.iter().filter(|m| m["subject"] == subject.as_str()).count();
        assert_eq!(emails, 1, "one e-mail for {order_id}");
        let text = format!("New order {order_id}:");
        let sms = sms_to(&seller.phone).await?;
        let sms = sms
            .iter()
            .filter(|m| m["message"].as_str().is_some_and(|t| t.starts_with(&text)))
            .count();
        assert_eq!(sms, 1, "one SMS for {order_id}");
        Ok(())
    }

    async fn finish(mut self) -> Result<()> {
        assert!(self.herald.is_running(), "herald survived the bad input");
        assert!(self.herald.terminate(WAIT).await?.success(), "SIGTERM exits 0");
        self.env.cleanup().await;
        Ok(())
    }
}

fn is_letter_of(l: &Record, m: &Sent) -> bool {
    l.headers.get(DLQ_SOURCE_TOPIC) == Some(&m.topic)
        && l.headers.get(DLQ_SOURCE_PARTITION) == Some(&m.partition.to_string())
        && l.headers.get(DLQ_SOURCE_OFFSET) == Some(&m.offset.to_string())
}

/// The last error herald logged (the reason a batch is being retried), for a failure
/// message.
fn last_error(herald: &HeraldProcess) -> String {
    herald
        .log()
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["level"] == "ERROR")
        .map_or_else(
            || "none".to_owned(),
            |v| format!("{} ({})", v["message"], v["error"]),
        )
}

/// An order event holding U+0000 somewhere (`mutate`), then a healthy order on the same
/// key: the bad one is dead-lettered as `invalid_value` naming `field`, the healthy one is
/// converged and delivered, and the committed offset passes both.
async fn order_event_holding_nul(label: &str, field: &str, mutate: fn(&mut Value)) -> Result<()> {
    let stage = Stage::new(label).await?;
    let order = format!("{}-1", label.replace('_', "-"));
    let mut bad = order_value(&order);
    mutate(&mut bad);
    assert!(
        bad.to_string().contains("\\u0000"),
        "the case holds U+0000: {bad}"
    );
    let bad = stage.send_order(&order, &bad).await?;
    let healthy = stage.send_order(&order, &order_value(&order)).await?;
    stage.expect_passed(&bad, &healthy).await?;
    stage.expect_dead_letter(&bad, "invalid_value", field).await?;
    stage.expect_delivered(&order, &stage.seller).await?;
    stage.finish().await
}

macro_rules! order_event_field_holding_nul {
    ($($test:ident ($label:literal, $field:literal): $mutate:expr;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() -> Result<()> {
            order_event_holding_nul($label, $field, $mutate).await
        }
    )*};
}

order_event_field_holding_nul! {
    nul_in_event_id_is_dead_lettered_and_the_partition_moves_on ("nul_event_id", "event_id"):
        |v| v["event_id"] = json!("evt-\u{0}");
    nul_in_event_kind_is_dead_lettered_and_the_partition_moves_on ("nul_event_kind", "event_kind"):
        |v| v["event_kind"] = json!("order.created\u{0}");
    nul_in_marketplace_id_is_dead_lettered_and_the_partition_moves_on ("nul_market", "marketplace_id"):
        |v| v["marketplace_id"] = json!("acme\u{0}");
    nul_in_order_id_is_dead_lettered_and_the_partition_moves_on ("nul_order_id", "order_id"):
        |v| v["order_id"] = json!(format!("{}\u{0}", v["order_id"].as_str().unwrap_or_default()));
    nul_in_seller_id_is_dead_lettered_and_the_partition_moves_on ("nul_seller_id", "seller_id"):
        |v| v["seller_id"] = json!(format!("{SELLER}\u{0}"));
    nul_in_occurred_at_is_dead_lettered_and_the_partition_moves_on ("nul_occurred", "occurred_at"):
        |v| v["occurred_at"] = json!("2026-09-21T10:00:00Z\u{0}");
    nul_in_produced_at_is_dead_lettered_and_the_partition_moves_on ("nul_produced", "produced_at"):
        |v| v["produced_at"] = json!("2026-09-21T10:00:01Z\u{0}");
    // Issue 14 as reported: `order.currency` holding U+0000.
    nul_in_order_currency_is_dead_lettered_and_the_partition_moves_on ("nul_currency", "order.currency"):
        |v| v["order"]["currency"] = json!("EU\u{0}R");
    nul_in_a_string_in_an_array_is_dead_lettered_and_the_partition_moves_on ("nul_array", "order.tags"):
        |v| v["order"]["tags"][1] = json!("exp\u{0}ress");
    nul_in_an_object_key_is_dead_lettered_and_the_partition_moves_on ("nul_obj_key", "order.extras"):
        |v| v["order"]["extras"] = json!({"gift\u{0}wrap": true});
}

/// A seller profile holding U+0000 somewhere (`mutate`), then a healthy profile of
/// another seller on the same partition, then an order of that seller: the bad profile is
/// dead-lettered with `reason` naming `field` and never stored, the healthy one is stored,
/// the order delivered to its destinations, and the committed offset passes both
/// profiles. `key` replaces the bad profile's key when given. (The healthy profile is of
/// another seller: a newer version of the same seller in the same poll batch would win
/// over the bad one before PostgreSQL sees it, and hide what is tested.)
async fn seller_profile_holding_nul(
    label: &str,
    reason: &str,
    field: &str,
    key: Option<&str>,
    mutate: fn(&mut Value),
) -> Result<()> {
    let stage = Stage::new(label).await?;
    let bad_id = format!("{}-seller", label.replace('_', "-"));
    let next_id = format!("{}-next", label.replace('_', "-"));
    let (bad_seller, next_seller) = (UniqueSeller::new(), UniqueSeller::new());
    let profile = bad_seller.profile(&bad_id);
    let mut bad: Value = serde_json::from_slice(&profile.value())?;
    mutate(&mut bad);
    let bad_key = key.map_or_else(|| profile.key(), |k| k.as_bytes().to_vec());
    assert!(
        bad.to_string().contains("\\u0000") || bad_key.contains(&0),
        "the case holds U+0000: {bad}"
    );
    let bad = stage
        .send("seller-profiles", None, &bad_key, &bytes(&bad))
        .await?;
    let next = next_seller.profile(&next_id);
    let healthy = stage
        .send("seller-profiles", Some(bad.partition), &next.key(), &next.value())
        .await?;
    stage.expect_passed(&bad, &healthy).await?;
    stage.expect_dead_letter(&bad, reason, field).await?;
    let stored = |id: &str| format!("SELECT count(*) FROM sellers WHERE seller_id = '{id}'");
    assert_eq!(
        stage.env.count(&stored(&bad_id)).await?,
        0,
        "the bad profile is not stored"
    );
    assert_eq!(
        stage
            .env
            .count(&format!(
                "{} AND email = '{}'",
                stored(&next_id),
                next_seller.email
            ))
            .await?,
        1,
        "the healthy profile is stored"
    );
    // Once the profile is stored (an order read before it would wait for it).
    let order = format!("{}-1", label.replace('_', "-"));
    let mut event = order_value(&order);
    event["seller_id"] = json!(next_id);
    stage.send_order(&order, &event).await?;
    stage.expect_delivered(&order, &next_seller).await?;
    stage.finish().await
}

macro_rules! seller_profile_field_holding_nul {
    ($($test:ident ($label:literal, $reason:literal, $field:literal, $key:expr): $mutate:expr;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() -> Result<()> {
            seller_profile_holding_nul($label, $reason, $field, $key, $mutate).await
        }
    )*};
}

seller_profile_field_holding_nul! {
    // Issue 14 as reported: a seller profile whose `email` holds U+0000.
    nul_in_seller_email_is_dead_lettered_and_the_partition_moves_on
        ("nul_email", "invalid_value", "email", None):
        |v| v["email"] = json!(format!("s\u{0}{}", v["email"].as_str().unwrap_or_default()));
    nul_in_seller_phone_is_dead_lettered_and_the_partition_moves_on
        ("nul_phone", "invalid_value", "phone", None):
        |v| v["phone"] = json!("+1555\u{0}0100");
    nul_in_seller_locale_is_dead_lettered_and_the_partition_moves_on
        ("nul_locale", "invalid_value", "locale", None):
        |v| v["locale"] = json!("en\u{0}");
    nul_in_seller_body_marketplace_id_is_dead_lettered_and_the_partition_moves_on
        ("nul_s_market", "invalid_value", "marketplace_id", None):
        |v| v["marketplace_id"] = json!("acme\u{0}");
    nul_in_seller_body_seller_id_is_dead_lettered_and_the_partition_moves_on
        ("nul_s_seller", "invalid_value", "seller_id", None):
        |v| v["seller_id"] = json!(format!("{}\u{0}", v["seller_id"].as_str().unwrap_or_default()));
    // The Kafka key is not JSON: a bad key keeps its own reason.
    nul_in_seller_key_is_dead_lettered_and_the_partition_moves_on
        ("nul_s_key", "bad_key", "key", Some("acme:nul-s-key-seller\u{0}")):
        |_| {};
}

/// Issue 14 as reported: a known order re-emitted with a changed field that holds U+0000
/// (kept as evidence, in `jsonb`, it was refused by PostgreSQL). It is dead-lettered as
/// `invalid_value` naming the field, recorded as no conflict, and the next order on the
/// same key is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicting_re_emission_holding_nul_is_dead_lettered_and_the_partition_moves_on() -> Result<()> {
    let stage = Stage::new("nul_conflict").await?;
    let (order, next) = ("nul-conflict-first", "nul-conflict-next");
    stage.send_order(order, &order_value(order)).await?;
    stage.expect_delivered(order, &stage.seller).await?;

    let mut changed = order_value(order);
    changed["event_id"] = json!("evt-nul-conflict-changed");
    changed["order"]["currency"] = json!("USD\u{0}");
    let bad = stage.send_order(order, &changed).await?;
    let mut healthy = order_value(next);
    healthy["event_id"] = json!("evt-nul-conflict-next");
    let healthy = stage.send_order(order, &healthy).await?;
    stage.expect_passed(&bad, &healthy).await?;
    stage
        .expect_dead_letter(&bad, "invalid_value", "order.currency")
        .await?;
    stage.expect_delivered(next, &stage.seller).await?;
    assert_eq!(
        stage.env.count("SELECT count(*) FROM intent_conflicts").await?,
        0,
        "a refused message is not a conflict"
    );
    // The first order's intents are unchanged, and sent once (checked again).
    stage.expect_delivered(order, &stage.seller).await?;
    stage.finish().await
}

/// Size of the order event of issue 14: the source topic took it, Herald's limit is 64 KiB,
/// and the dead-letter producer refused to copy it (MessageSizeTooLarge) forever.
const ISSUE_14_SIZE: usize = 1_040_247;

/// Issue 14 as reported: an order event of 1,040,247 bytes on a topic that accepts it. It
/// is dead-lettered as `too_large`, as a bounded prefix with the original size and blake3
/// digest in headers, and the next order on the same key is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_event_larger_than_the_dead_letter_producer_takes_is_dead_lettered_as_a_prefix() -> Result<()> {
    let limit = "2097152";
    let stage = Stage::with(
        "huge_event",
        EnvOptions {
            topic_configs: vec![("order-events", "max.message.bytes", limit.to_owned())],
            ..EnvOptions::default()
        },
        // Herald's default limit, as the reporter ran it.
        &[("HERALD_INGEST__MAX_MESSAGE_BYTES", "65536")],
        producer_with(&[("message.max.bytes", limit)])?,
    )
    .await?;
    let (order, next) = ("huge-1", "huge-next");
    let mut huge = order_value(order);
    huge["order"]["note"] = json!("");
    let padding = ISSUE_14_SIZE - bytes(&huge).len();
    huge["order"]["note"] = json!("n".repeat(padding));
    let huge = bytes(&huge);
    assert_eq!(huge.len(), ISSUE_14_SIZE);

    let bad = stage.send("order-events", None, order.as_bytes(), &huge).await?;
    let healthy = stage.send_order(order, &order_value(next)).await?;
    stage.expect_passed(&bad, &healthy).await?;
    let letter = stage
        .expect_dead_letter(&bad, "too_large", &ISSUE_14_SIZE.to_string())
        .await?;
    let header = |name: &str| letter.headers.get(name).map(String::as_str);
    assert_eq!(header(DLQ_PAYLOAD), Some("prefix"), "{:?}", letter.headers);
    assert_eq!(
        header(DLQ_ORIGINAL_SIZE),
        Some(ISSUE_14_SIZE.to_string().as_str())
    );
    assert_eq!(
        header(DLQ_ORIGINAL_BLAKE3),
        Some(blake3::hash(&huge).to_hex().as_str()),
        "the digest of the whole original value"
    );
    let prefix = letter.value.unwrap_or_default();
    assert!(
        !prefix.is_empty() && prefix.len() < huge.len() && huge.starts_with(&prefix),
        "a proper prefix of the original ({} bytes)",
        prefix.len()
    );
    stage.expect_delivered(next, &stage.seller).await?;
    stage.finish().await
}
