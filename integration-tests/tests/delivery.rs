//! Delivery, end to end against moto: order events end as messages at the provider, every
//! attempt on record, and a message delivered twice to the worker is sent once.

use std::time::Duration;

use anyhow::Result;
use integration_tests::http::{metric, scrape};
use integration_tests::kafka::{produce, producer};
use integration_tests::moto::{emails_to, sms_to};
use integration_tests::samples::UniqueSeller;
use integration_tests::{seed_orders, wait_for, TestEnv};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_event_ends_as_one_email_and_one_sms_at_the_provider() -> Result<()> {
    let env = TestEnv::new("e2e", "").await?;
    let mut herald = env.spawn_roles("ingest,relay,deliver", "herald", &[])?;
    let seller = UniqueSeller::new();
    seed_orders(&env, &seller, &["5001"]).await?;
    env.wait_count(
        "both intents accepted",
        "SELECT count(*) FROM notification_intents WHERE state = 'accepted'",
        2,
        WAIT,
    )
    .await?;

    let attempts = env
        .db
        .query(
            "SELECT i.channel, a.attempt_no, a.outcome, a.provider_message_id, a.finished_at IS NOT NULL
             FROM notification_attempts a JOIN notification_intents i ON i.id = a.intent_id ORDER BY i.channel",
            &[],
        )
        .await?;
    assert_eq!(attempts.len(), 2, "one attempt per intent");
    for a in &attempts {
        assert_eq!(a.get::<_, i32>(1), 1);
        assert_eq!(a.get::<_, String>(2), "accepted");
        assert!(a.get::<_, bool>(4), "finished");
    }
    let email_id: String = attempts[0].get(3);
    let sms_id: String = attempts[1].get(3);

    let emails = emails_to(&seller.email).await?;
    assert_eq!(emails.len(), 1, "one e-mail at the provider: {emails:?}");
    assert_eq!(
        emails[0]["id"].as_str(),
        Some(email_id.as_str()),
        "the attempt carries the provider's id"
    );
    assert_eq!(emails[0]["subject"].as_str(), Some("New order 5001 on acme"));
    let sms = sms_to(&seller.phone).await?;
    assert_eq!(sms.len(), 1, "one SMS at the provider: {sms:?}");
    assert_eq!(sms[0]["message_id"].as_str(), Some(sms_id.as_str()));

    env.wait_lag_zero("herald-delivery", &["herald.deliveries"])
        .await?;
    let metrics = scrape(&herald.admin_addr(WAIT).await?).await?;
    assert!(
        herald.terminate(WAIT).await?.success(),
        "SIGTERM drains and exits 0"
    );
    // The totals an operator reads in the log at exit are what the scrape served: the
    // same counts (nothing happened in between: every offset was committed).
    let log = herald.log();
    let totals = |message: &str| -> Value {
        log.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|l| l["message"] == message)
            .unwrap_or_else(|| panic!("no {message:?} line in\n{log}"))
    };
    let scraped = |name: &str, labels: &[&str]| json!(metric(&metrics, name, labels) as u64);
    let delivery = totals("delivery totals");
    assert_eq!(
        (&delivery["claimed"], &delivery["recorded"], &delivery["outcomes"]),
        (
            &scraped("herald_attempts_started_total", &[]),
            &scraped("herald_attempt_records_total", &[]),
            &json!(format!(
                r#"{{"accepted": {}}}"#,
                metric(&metrics, "herald_attempts_total", &[r#"outcome="accepted""#])
            )),
        ),
        "{delivery}"
    );
    assert_eq!(
        (&delivery["claimed"], &delivery["recorded"]),
        (&json!(2), &json!(2)),
        "{delivery}"
    );
    let ingest = totals("ingest totals");
    assert_eq!(
        (
            &ingest["messages"],
            &ingest["batches"],
            &ingest["intents_created"],
            &ingest["seller_updates"]
        ),
        (
            &scraped("herald_ingest_messages_total", &[]),
            &scraped("herald_ingest_batch_size_count", &[]),
            &scraped("herald_intents_created_total", &[]),
            &scraped("herald_seller_updates_total", &[]),
        ),
        "{ingest}"
    );
    assert_eq!(
        (
            &ingest["messages"],
            &ingest["intents_created"],
            &ingest["seller_updates"],
            &ingest["dead_letters"]
        ),
        (&json!(2), &json!(2), &json!(1), &json!(0)),
        "{ingest}"
    );
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_intent_published_five_times_is_sent_once() -> Result<()> {
    let env = TestEnv::new("fivefold", "").await?;
    let _ingest = env.spawn_roles("ingest", "ingest", &[])?;
    let seller = UniqueSeller::new();
    seed_orders(&env, &seller, &["6001"]).await?;
    env.wait_count(
        "intents created",
        "SELECT count(*) FROM notification_intents",
        2,
        WAIT,
    )
    .await?;
    let id: String = env
        .db
        .query_one(
            "SELECT id::text FROM notification_intents WHERE channel = 'email'",
            &[],
        )
        .await?
        .get(0);
    // No relay runs: the test publishes the e-mail intent's id itself, five times.
    env.db.execute("DELETE FROM outbox", &[]).await?;
    let p = producer()?;
    for _ in 0..5 {
        produce(
            &p,
            &env.topic("herald.deliveries"),
            Some(id.as_bytes()),
            Some(id.as_bytes()),
            &[],
        )
        .await?;
    }
    let _deliver = env.spawn_roles("deliver", "deliver", &[])?;
    env.wait_lag_zero("herald-delivery", &["herald.deliveries"])
        .await?;

    assert_eq!(
        env.count("SELECT count(*) FROM notification_attempts").await?,
        1,
        "one attempt"
    );
    assert_eq!(
        env.count("SELECT count(*) FROM notification_intents WHERE channel = 'email' AND state = 'accepted'")
            .await?,
        1
    );
    assert_eq!(
        emails_to(&seller.email).await?.len(),
        1,
        "one send at the provider"
    );
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unverified_sender_is_rejected_and_not_retried() -> Result<()> {
    let env = TestEnv::new("rejected", "").await?;
    let _herald = env.spawn_roles(
        "ingest,relay,deliver",
        "herald",
        &[(
            "HERALD_CHANNELS__EMAIL__SENDER_OVERRIDES__ACME",
            "orders@not-verified.example",
        )],
    )?;
    let seller = UniqueSeller::new();
    seed_orders(&env, &seller, &["7001"]).await?;
    env.wait_count(
        "e-mail rejected",
        "SELECT count(*) FROM notification_intents WHERE channel = 'email' AND state = 'rejected'",
        1,
        WAIT,
    )
    .await?;
    env.wait_count(
        "SMS accepted",
        "SELECT count(*) FROM notification_intents WHERE channel = 'sms' AND state = 'accepted'",
        1,
        WAIT,
    )
    .await?;
    let row = env
        .db
        .query_one(
            "SELECT count(*), min(a.outcome), min(a.error_category) FROM notification_attempts a
             JOIN notification_intents i ON i.id = a.intent_id WHERE i.channel = 'email'",
            &[],
        )
        .await?;
    assert_eq!(row.get::<_, i64>(0), 1, "no retry after a rejection");
    assert_eq!(row.get::<_, String>(1), "rejected");
    assert_eq!(row.get::<_, String>(2), "unverified_sender");
    assert_eq!(
        env.count("SELECT count(*) FROM outbox").await?,
        0,
        "nothing scheduled"
    );
    assert!(emails_to(&seller.email).await?.is_empty());
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_instances_joining_and_leaving_send_each_intent_once() -> Result<()> {
    use integration_tests::moto::MOTO;
    use integration_tests::toxiproxy::Proxy;

    // Every provider answer takes 100 ms and each instance runs 8 attempts at once, so the
    // run lasts long enough for the group to change under it several times.
    let proxy = Proxy::create(
        &format!("churn-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
        MOTO,
    )
    .await?;
    proxy
        .add_toxic(
            "slow",
            "latency",
            "downstream",
            serde_json::json!({"latency": 100}),
        )
        .await?;
    let env = TestEnv::with_options(
        "churn",
        "",
        integration_tests::EnvOptions {
            aws_endpoint: Some(proxy.url()),
            on_unknown: "hold",
            ..integration_tests::EnvOptions::default()
        },
    )
    .await?;
    let _feed = env.spawn_roles("ingest,relay", "feed", &[])?;
    let limits = [("HERALD_DELIVERY__MAX_IN_FLIGHT", "8")];
    let mut d1 = env.spawn_roles("deliver", "deliver-1", &limits)?;
    let seller = UniqueSeller::new();
    let orders: Vec<String> = (0..100).map(|n| format!("9{n:03}")).collect();
    let order_refs: Vec<&str> = orders.iter().map(String::as_str).collect();
    seed_orders(&env, &seller, &order_refs).await?;

    let accepted = "SELECT count(*) FROM notification_intents WHERE state = 'accepted'";
    let at_least = |n: i64| {
        let env = &env;
        async move {
            wait_for(&format!("{n} intents accepted"), WAIT, || async {
                Ok((env.count(accepted).await? >= n).then_some(()))
            })
            .await
        }
    };
    at_least(20).await?;
    let mut d2 = env.spawn_roles("deliver", "deliver-2", &limits)?;
    let _d3 = env.spawn_roles("deliver", "deliver-3", &limits)?;
    at_least(80).await?;
    assert!(d1.terminate(WAIT).await?.success(), "instance 1 leaves cleanly");
    at_least(130).await?;
    let _d4 = env.spawn_roles("deliver", "deliver-4", &limits)?;
    assert!(d2.terminate(WAIT).await?.success(), "instance 2 leaves cleanly");

    env.wait_count("every intent accepted", accepted, 200, Duration::from_secs(120))
        .await?;
    env.wait_lag_zero("herald-delivery", &["herald.deliveries"])
        .await?;
    assert_eq!(
        env.count(
            "SELECT count(*) FROM (SELECT intent_id FROM notification_attempts WHERE outcome = 'accepted'
             GROUP BY intent_id HAVING count(*) > 1) d"
        )
        .await?,
        0,
        "no intent with two accepted attempts"
    );
    // Leaving instances release the attempts still waiting for a send slot: `not_sent`,
    // nothing at the provider. Nothing else but acceptances.
    assert_eq!(
        env.count(
            "SELECT count(*) FROM notification_attempts
              WHERE outcome <> 'accepted'
                AND NOT (outcome = 'not_sent' AND error_category IN ('revoked', 'shutdown'))"
        )
        .await?,
        0
    );
    let sends = emails_to(&seller.email).await?.len() + sms_to(&seller.phone).await?.len();
    assert_eq!(
        sends as i64,
        env.count("SELECT count(*) FROM notification_attempts WHERE outcome = 'accepted'")
            .await?
    );
    assert_eq!(sends, 200, "sends at the provider = accepted attempts = intents");
    proxy.delete().await?;
    env.cleanup().await;
    Ok(())
}

/// Every record runs one INSERT of retry rows into the outbox, usually of no row. Only a
/// statement that queued rows may notify the relays: a transaction that notifies takes a
/// database-wide lock while it commits, which once made every record commit one at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_records_that_queue_a_retry_wake_the_relays() -> Result<()> {
    use futures::StreamExt;
    use herald_core::retry::NextState;
    use herald_core::AttemptOutcome;
    use herald_store::delivery::{ChannelPolicies, ClaimOutcome, ClaimRequest, ClaimTry};
    use tokio_postgres::AsyncMessage;

    let env = TestEnv::new("notify", "").await?;
    let mut ingest = env.spawn_roles("ingest", "ingest", &[])?;
    seed_orders(&env, &UniqueSeller::new(), &["7101"]).await?;
    env.wait_count(
        "intents created",
        "SELECT count(*) FROM notification_intents",
        2,
        WAIT,
    )
    .await?;
    ingest.terminate(WAIT).await?;
    // No relay runs: clear the rows the ingest queued, so that only records add any.
    env.db.batch_execute("DELETE FROM outbox").await?;

    // A listener of our own: notifications arrive in commit order.
    let (listener, mut connection) = tokio_postgres::connect(&env.db_url, tokio_postgres::NoTls).await?;
    let (tx, mut notifications) = tokio::sync::mpsc::unbounded_channel();
    let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
    tokio::spawn(async move {
        while let Some(Ok(m)) = messages.next().await {
            if let AsyncMessage::Notification(n) = m {
                let _ = tx.send(n.payload().to_owned());
            }
        }
    });
    listener.batch_execute("LISTEN herald_outbox").await?;

    let store = env.store(2)?;
    let ids: Vec<uuid::Uuid> = env
        .db
        .query("SELECT id FROM notification_intents ORDER BY channel", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let policies: ChannelPolicies = herald_core::Channel::ALL
        .iter()
        .map(|c| {
            let policy = herald_core::retry::RetryPolicy {
                max_attempts: 3,
                base_backoff: Duration::from_secs(60),
                max_backoff: Duration::from_secs(60),
                on_unknown: herald_core::retry::UnknownPolicy::Hold,
                evidence_window: None,
            };
            (*c, policy)
        })
        .collect();
    let requests: Vec<ClaimRequest> = ids.iter().map(|id| ClaimRequest::new(*id)).collect();
    let claimed = store
        .claim(
            "notify-test",
            Duration::from_secs(60),
            &requests,
            &policies,
            ClaimTry::First,
        )
        .await?;
    let record = |outcome: &ClaimOutcome, attempt: AttemptOutcome, next: NextState| match outcome {
        ClaimOutcome::Claimed(c) => Ok(c.record(attempt, None, None, None, next)),
        ClaimOutcome::Skipped(s) => Err(anyhow::anyhow!("not claimed: {}", s.as_str())),
    };

    store
        .record(&[record(
            &claimed[0],
            AttemptOutcome::Accepted,
            NextState::Accepted,
        )?])
        .await?;
    env.db.batch_execute("NOTIFY herald_outbox, 'marker'").await?;
    let first = tokio::time::timeout(WAIT, notifications.recv()).await?;
    assert_eq!(
        first.as_deref(),
        Some("marker"),
        "the accepted record (committed before the marker) notified the relays"
    );

    store
        .record(&[record(
            &claimed[1],
            AttemptOutcome::Retryable,
            NextState::RetryAfter(Duration::from_secs(60)),
        )?])
        .await?;
    let woken = tokio::time::timeout(WAIT, notifications.recv()).await?;
    assert_eq!(woken.as_deref(), Some(""), "a queued retry wakes the relays");
    assert_eq!(
        env.count("SELECT count(*) FROM outbox").await?,
        1,
        "one outbox row: the retry"
    );
    env.cleanup().await;
    Ok(())
}
