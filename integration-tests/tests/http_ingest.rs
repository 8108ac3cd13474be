//! HTTP ingest, as a client sees it through curl-shaped requests (exactly the headers and
//! bytes curl sends): the design's black-box check at an HTTP boundary (the same event
//! posted twice under one Idempotency-Key is one intent, one frozen payload, one e-mail; a
//! changed total under that key is a 422 and still one intent), the refusals, a request
//! still in progress, and a process killed mid-request, before and after its commit.

use std::time::Duration;

use anyhow::Result;
use integration_tests::http::{admin_request, exchange, metric, scrape, Answer};
use integration_tests::moto::emails_to;
use integration_tests::samples::UniqueSeller;
use integration_tests::{publish_sellers, wait_for, HeraldProcess, TestEnv};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(60);
const TOKEN: &str = "it-ingest-token";
const HTTP_INGEST: &str = r#"
[http_ingest]
listen = "127.0.0.1:0"
token = "it-ingest-token"
in_progress_wait_ms = 200
# The tests' pool has 4 connections.
max_in_flight = 2
"#;

fn order(order_id: &str, total: &str) -> Value {
    json!({
        "event_id": format!("evt-{order_id}"),
        "event_kind": "order.created",
        "marketplace_id": "acme",
        "order_id": order_id,
        "seller_id": "seller-1",
        "occurred_at": "2026-09-21T10:00:00Z",
        "order": {"total": total, "currency": "EUR", "item_count": 3},
        "channel": "email",
    })
}

fn unique_order() -> String {
    format!("h{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
}

/// `curl -sS -X POST http://ADDR/v1/order-events -H "Authorization: Bearer TOKEN"
/// -H "Idempotency-Key: KEY" -H "Content-Type: application/json" --data-binary BODY`
async fn post(addr: &str, key: Option<&str>, body: &[u8]) -> Result<Answer> {
    let auth = format!("Bearer {TOKEN}");
    let mut headers = vec![
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
    ];
    if let Some(k) = key {
        headers.push(("Idempotency-Key", k));
    }
    exchange(addr, "POST", "/v1/order-events", &headers, body).await
}

async fn post_json(addr: &str, key: &str, body: &Value) -> Result<Answer> {
    post(addr, Some(key), body.to_string().as_bytes()).await
}

async fn start(env: &TestEnv, label: &str, failpoints: &str) -> Result<(HeraldProcess, String)> {
    start_roles(env, "ingest,relay,deliver", label, failpoints).await
}

async fn start_roles(
    env: &TestEnv,
    roles: &str,
    label: &str,
    failpoints: &str,
) -> Result<(HeraldProcess, String)> {
    let herald = env.spawn_roles(roles, label, &[("FAILPOINTS", failpoints)])?;
    let addr = herald.http_ingest_addr(WAIT).await?;
    Ok((herald, addr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_event_twice_under_one_key_is_one_intent_and_one_email_and_a_changed_total_is_refused(
) -> Result<()> {
    let env = TestEnv::new("http_ingest", HTTP_INGEST).await?;
    let (herald, addr) = start(&env, "herald", "").await?;
    let seller = UniqueSeller::new();
    publish_sellers(&env, &[seller.profile("seller-1")]).await?;
    let order_id = unique_order();
    let key = format!("checkout-{order_id}");

    let first = post_json(&addr, &key, &order(&order_id, "129.90")).await?;
    assert_eq!(first.status, 201, "{first:?}");
    let intents = first.json()["intents"].clone();
    assert_eq!(
        intents.as_array().map(Vec::len),
        Some(1),
        "only the e-mail channel: {first:?}"
    );
    let intent_id = intents[0]["intent_id"].as_str().unwrap().to_owned();
    assert_eq!(intents[0]["outcome"], "created");
    assert_eq!(intents[0]["state"], "pending");
    assert_eq!(first.json()["replayed"], false);

    // The client's retry: the same bytes under the same key.
    let again = post_json(&addr, &key, &order(&order_id, "129.90")).await?;
    assert_eq!(again.status, 200, "{again:?}");
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.json()["replayed"], true);
    assert_eq!(
        again.json()["intents"],
        first.json()["intents"],
        "the stored answer"
    );

    // A changed total under the same key: 422 naming the key and both fingerprints.
    let changed = post_json(&addr, &key, &order(&order_id, "130.00")).await?;
    assert_eq!(changed.status, 422, "{changed:?}");
    let refusal = changed.json();
    assert_eq!(refusal["error"], "idempotency_key_reused");
    assert_eq!(refusal["idempotency_key"], key.as_str());
    assert_eq!(refusal["stored_fingerprint"], first.json()["request_fingerprint"]);
    assert_ne!(refusal["request_fingerprint"], refusal["stored_fingerprint"]);
    assert!(refusal["request_fingerprint"].is_string());
    // ... kept as evidence: the offending document, under the key.
    let (status, kept) = admin_request(
        &herald.admin_addr(WAIT).await?,
        "GET",
        &format!("/v1/http-requests/{key}"),
        None,
    )
    .await?;
    assert_eq!(status, 200, "{kept}");
    assert_eq!(kept["mismatches"].as_array().map(Vec::len), Some(1), "{kept}");
    assert_eq!(
        kept["mismatches"][0]["offending_request"]["order"]["total"],
        "130.00"
    );
    assert_eq!(kept["response_status"], 201);

    // Another key naming the same order converges on the same intent; another key with
    // the changed total is a business-key conflict, recorded and never sent.
    let other_key = post_json(&addr, &format!("{key}-b"), &order(&order_id, "129.90")).await?;
    assert_eq!(other_key.status, 201, "{other_key:?}");
    assert_eq!(other_key.json()["intents"][0]["intent_id"], intent_id.as_str());
    assert_eq!(other_key.json()["intents"][0]["outcome"], "duplicate");
    let conflicting = post_json(&addr, &format!("{key}-c"), &order(&order_id, "130.00")).await?;
    assert_eq!(conflicting.status, 422, "{conflicting:?}");
    assert_eq!(conflicting.json()["error"], "business_key_conflict");
    assert_eq!(conflicting.json()["intents"][0]["outcome"], "conflict");
    assert_eq!(
        conflicting.json()["intents"][0]["existing_fingerprint"],
        first.json()["intents"][0]["event_fingerprint"]
    );

    // One intent, one frozen payload digest, one send.
    wait_for("the e-mail sent", WAIT, || async {
        Ok((emails_to(&seller.email).await?.len() == 1).then_some(()))
    })
    .await?;
    let admin = herald.admin_addr(WAIT).await?;
    let inspect = first.json()["intents"][0]["inspect"].as_str().unwrap().to_owned();
    let view = wait_for("the intent accepted", WAIT, || async {
        let (status, v) = admin_request(&admin, "GET", &inspect, None).await?;
        Ok((status == 200 && v["state"] == "accepted").then_some(v))
    })
    .await?;
    assert_eq!(view["id"], intent_id.as_str());
    assert_eq!(view["attempts"].as_array().map(Vec::len), Some(1), "{view}");
    assert_eq!(view["source"], format!("http:{key}"));
    assert_eq!(view["conflicts"].as_array().map(Vec::len), Some(1), "{view}");
    assert_eq!(view["conflicts"][0]["source"], format!("http:{key}-c"));
    assert_eq!(
        env.count(&format!(
            "SELECT count(*) * 10 + count(DISTINCT payload_digest) FROM notification_intents WHERE order_id = '{order_id}'"
        ))
        .await?,
        11
    );
    // Every delivery message handled and committed: no redelivery is left to come.
    env.wait_lag_zero("herald-delivery", &["herald.deliveries"])
        .await?;
    assert_eq!(emails_to(&seller.email).await?.len(), 1, "one send");

    let text = scrape(&admin).await?;
    let answered = |outcome: &str| {
        metric(
            &text,
            "herald_http_ingest_requests_total",
            &[&format!("outcome=\"{outcome}\"")],
        )
    };
    assert_eq!(
        (
            answered("created"),
            answered("replayed"),
            answered("idempotency_key_reused"),
            answered("business_key_conflict")
        ),
        (2.0, 1.0, 1.0, 1.0),
        "{text}"
    );
    assert_eq!(metric(&text, "herald_fingerprint_conflicts_total", &[]), 1.0);

    // Past its retention the key is a new request's: the changed total is then judged on the
    // business key alone (a conflict), and the key's old evidence is gone with it.
    env.db
        .execute(
            "UPDATE http_requests SET received_at = now() - interval '8 days', expires_at = now() - interval '1 day'
              WHERE idempotency_key = $1",
            &[&key],
        )
        .await?;
    let after_expiry = post_json(&addr, &key, &order(&order_id, "130.00")).await?;
    assert_eq!(after_expiry.status, 422, "{after_expiry:?}");
    assert_eq!(after_expiry.json()["error"], "business_key_conflict");
    assert_eq!(
        env.count(&format!(
            "SELECT count(*) FROM http_request_mismatches WHERE idempotency_key = '{key}'"
        ))
        .await?,
        0
    );
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_store_nothing_and_name_their_reason() -> Result<()> {
    let env = TestEnv::new("http_refusals", HTTP_INGEST).await?;
    let (_herald, addr) = start(&env, "herald", "").await?;
    let order_id = unique_order();
    let body = order(&order_id, "12.00").to_string();

    let no_token = exchange(
        &addr,
        "POST",
        "/v1/order-events",
        &[("Idempotency-Key", "k1"), ("Content-Type", "application/json")],
        body.as_bytes(),
    )
    .await?;
    assert_eq!(no_token.status, 401, "{no_token:?}");
    assert_eq!(no_token.header("www-authenticate"), Some("Bearer"));
    let admin_auth = format!("Bearer {}", integration_tests::ADMIN_TOKEN);
    let admin_token = exchange(
        &addr,
        "POST",
        "/v1/order-events",
        &[
            ("Authorization", admin_auth.as_str()),
            ("Idempotency-Key", "k1"),
            ("Content-Type", "application/json"),
        ],
        body.as_bytes(),
    )
    .await?;
    assert_eq!(admin_token.status, 401);

    let no_key = post(&addr, None, body.as_bytes()).await?;
    assert_eq!(
        (no_key.status, no_key.json()["error"].clone()),
        (400, json!("idempotency_key_missing"))
    );
    let bad_key = post(&addr, Some("two words"), body.as_bytes()).await?;
    assert_eq!(bad_key.json()["error"], "idempotency_key_invalid");
    let form = exchange(
        &addr,
        "POST",
        "/v1/order-events",
        &[
            ("Authorization", &format!("Bearer {TOKEN}")),
            ("Idempotency-Key", "k1"),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        body.as_bytes(),
    )
    .await?;
    assert_eq!(form.status, 415);

    // The dead-letter topic's reasons.
    let mut missing = order(&order_id, "12.00");
    missing.as_object_mut().unwrap().remove("seller_id");
    for (bytes, reason) in [
        (b"{\"event_id\":".to_vec(), "not_json"),
        (missing.to_string().into_bytes(), "missing_field"),
        (body.replace("12.00", "1\\u00002").into_bytes(), "invalid_value"),
        (body.replace("\"email\"", "\"fax\"").into_bytes(), "invalid_value"),
    ] {
        let a = post(&addr, Some("k1"), &bytes).await?;
        assert_eq!(
            (a.status, a.json()["error"].as_str()),
            (400, Some(reason)),
            "{a:?}"
        );
    }
    // A body that never finishes arriving: answered 408 (after 10 s) instead of held open.
    let slow = {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut c = tokio::net::TcpStream::connect(&addr).await?;
        c.write_all(
            format!(
                "POST /v1/order-events HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\n\
                 Idempotency-Key: k1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
                body.len(),
                &body[..10]
            )
            .as_bytes(),
        )
        .await?;
        let mut head = [0u8; 12];
        tokio::time::timeout(WAIT, c.read_exact(&mut head)).await??;
        String::from_utf8_lossy(&head).into_owned()
    };
    assert_eq!(slow, "HTTP/1.1 408", "a body that never arrives");
    // ingest.max_message_bytes is 8192 in the tests.
    let mut large = order(&order_id, "12.00");
    large["order"]["note"] = "x".repeat(9000).into();
    let too_large = post_json(&addr, "k1", &large).await?;
    assert_eq!(
        (too_large.status, too_large.json()["error"].clone()),
        (413, json!("too_large"))
    );
    let mut unrouted = order(&order_id, "12.00");
    unrouted["event_kind"] = "order.refunded".into();
    let not_routed = post_json(&addr, "k1", &unrouted).await?;
    assert_eq!(
        (not_routed.status, not_routed.json()["error"].clone()),
        (422, json!("not_routed"))
    );

    // A value the database refuses (a constraint this test adds, that the decoder does not
    // know of): what Kafka would dead-letter as store_rejected.
    env.db
        .batch_execute(
            "ALTER TABLE intent_contents ADD CONSTRAINT it_refused_order
                 CHECK (order_id <> 'refused-by-the-database')",
        )
        .await?;
    let refused = post_json(&addr, "k1", &order("refused-by-the-database", "12.00")).await?;
    assert_eq!(refused.status, 422, "{refused:?}");
    assert_eq!(refused.json()["error"], "store_rejected");
    assert!(
        refused.json()["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("23514"),
        "{refused:?}"
    );

    assert_eq!(
        env.count(
            "SELECT (SELECT count(*) FROM http_requests) + (SELECT count(*) FROM notification_intents)"
        )
        .await?,
        0,
        "a refusal stores nothing"
    );
    // The key is still free: the fixed request is the first.
    let fixed = post(&addr, Some("k1"), body.as_bytes()).await?;
    assert_eq!(fixed.status, 201, "{fixed:?}");
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_in_progress_answers_409_and_a_kill_before_or_after_the_commit_loses_nothing() -> Result<()>
{
    let env = TestEnv::new("http_in_progress", HTTP_INGEST).await?;
    let seller = UniqueSeller::new();
    let pause = "http-ingest-before-commit=sleep(600000)";
    // Ingest alone while processes are killed: nothing is sent before the last one runs.
    let (mut herald, addr) = start_roles(&env, "ingest", "paused", pause).await?;
    publish_sellers(&env, &[seller.profile("seller-1")]).await?;
    let order_id = unique_order();
    let key = format!("k-{order_id}");
    let body = order(&order_id, "12.00");

    // The first request stops before its commit; its transaction holds the key.
    let first = {
        let (addr, key, body) = (addr.clone(), key.clone(), body.clone());
        tokio::spawn(async move { post_json(&addr, &key, &body).await })
    };
    env.wait_count(
        "the first request waiting at its commit",
        &format!(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = '{}' AND state = 'idle in transaction'
                AND query LIKE 'UPDATE http_requests%'",
            env.database
        ),
        1,
        WAIT,
    )
    .await?;
    let busy = post_json(&addr, &key, &body).await?;
    assert_eq!(busy.status, 409, "{busy:?}");
    assert_eq!(busy.header("retry-after"), Some("1"));
    assert_eq!(busy.json()["error"], "request_in_progress");

    // Killed there: the client gets no answer, and nothing was committed.
    herald.kill()?;
    assert!(first.await?.is_err(), "the connection dies with the process");
    assert_eq!(
        env.count(
            "SELECT (SELECT count(*) FROM http_requests) + (SELECT count(*) FROM notification_intents)"
        )
        .await?,
        0
    );

    // The retry, to a process that stops after its commit instead: committed, no answer.
    let (mut herald, addr) = start_roles(
        &env,
        "ingest",
        "after-commit",
        "http-ingest-after-commit=sleep(600000)",
    )
    .await?;
    let retry = {
        let (addr, key, body) = (addr.clone(), key.clone(), body.clone());
        tokio::spawn(async move { post_json(&addr, &key, &body).await })
    };
    env.wait_count(
        "the retry committed",
        "SELECT count(*) FROM http_requests WHERE response_status = 201",
        1,
        WAIT,
    )
    .await?;
    herald.kill()?;
    assert!(retry.await?.is_err());

    // The next retry gets the committed answer again, and the order is sent once.
    let (_herald, addr) = start(&env, "healthy", "").await?;
    let last = post_json(&addr, &key, &body).await?;
    assert_eq!(last.status, 200, "{last:?}");
    assert_eq!(last.json()["replayed"], true);
    wait_for("the e-mail sent", WAIT, || async {
        Ok((emails_to(&seller.email).await?.len() == 1).then_some(()))
    })
    .await?;
    env.wait_count(
        "one intent, accepted",
        "SELECT count(*) FROM notification_intents WHERE state = 'accepted'",
        1,
        WAIT,
    )
    .await?;
    assert_eq!(env.count("SELECT count(*) FROM notification_intents").await?, 1);
    env.wait_lag_zero("herald-delivery", &["herald.deliveries"])
        .await?;
    assert_eq!(emails_to(&seller.email).await?.len(), 1, "one send");
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_mid_request_does_not_cut_its_transaction_short_and_expired_keys_are_swept(
) -> Result<()> {
    use tokio::io::AsyncWriteExt;
    let env = TestEnv::new("http_hang_up", HTTP_INGEST).await?;
    let (herald, addr) = start_roles(&env, "ingest", "herald", "").await?;
    // The test holds the outbox: the request's transaction waits for it inside PostgreSQL
    // (an await in Herald, where a dropped handler would drop the transaction).
    let mut blocker = integration_tests::pg_connect(&env.db_url).await?;
    let lock = blocker.transaction().await?;
    lock.batch_execute("LOCK TABLE outbox IN EXCLUSIVE MODE").await?;
    let body = order(&unique_order(), "12.00").to_string();
    let mut c = tokio::net::TcpStream::connect(&addr).await?;
    c.write_all(
        format!(
            "POST /v1/order-events HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\n\
             Idempotency-Key: hang-up\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await?;
    env.wait_count(
        "the request waiting for the outbox",
        &format!(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = '{}' AND wait_event_type = 'Lock'",
            env.database
        ),
        1,
        WAIT,
    )
    .await?;
    // The client leaves; then the outbox is free again.
    drop(c);
    tokio::time::sleep(Duration::from_millis(500)).await; // hyper sees the hang-up meanwhile
    lock.rollback().await?;
    // Committed all the same, with its answer stored for the client's retry.
    env.wait_count(
        "the request committed",
        "SELECT count(*) FROM http_requests WHERE response_status = 201",
        1,
        WAIT,
    )
    .await?;
    let retry = post(&addr, Some("hang-up"), body.as_bytes()).await?;
    assert_eq!(
        (retry.status, retry.json()["replayed"].clone()),
        (200, json!(true)),
        "{retry:?}"
    );
    assert_eq!(env.count("SELECT count(*) FROM notification_intents").await?, 1);

    // Expired keys are swept (at start, then every 10 minutes) whether or not a request
    // comes back for them.
    env.db
        .batch_execute(
            "UPDATE http_requests SET received_at = now() - interval '8 days', expires_at = now() - interval '1 day'",
        )
        .await?;
    drop(herald);
    let _herald = start_roles(&env, "ingest", "restarted", "").await?;
    env.wait_count(
        "the expired key swept",
        "SELECT count(*) FROM http_requests",
        0,
        WAIT,
    )
    .await?;
    env.cleanup().await;
    Ok(())
}
