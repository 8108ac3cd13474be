//! No input stalls ingest: what PostgreSQL refuses permanently is narrowed down to the
//! message at fault and dead-lettered, the rest of its batch commits and the offsets move
//! on; what fails transiently (the database gone) is retried and never dead-lettered.
//!
//! The refusals here come from constraints the test adds to its own database: input the
//! decoder has no reason to refuse, which only the database knows it cannot store.

use std::time::Duration;

use anyhow::Result;
use integration_tests::http::{metric, scrape};
use integration_tests::kafka::{produce, producer, read_all};
use integration_tests::samples::{order_event, UniqueSeller};
use integration_tests::{pg_connect, publish_sellers, wait_for, TestEnv, PG_ADMIN_URL};

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread")]
async fn rows_the_database_refuses_are_isolated_and_the_rest_of_the_batch_commits() -> Result<()> {
    let env = TestEnv::new("isolation", "").await?;
    let seller = UniqueSeller::new();
    let mut herald = env.spawn_ingest("ingest", &[])?;
    publish_sellers(&env, &[seller.profile("seller-1")]).await?;
    herald.terminate(Duration::from_secs(30)).await?;

    env.db
        .batch_execute(
            "ALTER TABLE intent_contents ADD CONSTRAINT it_refused_order
                 CHECK (order_id <> 'refused-by-the-database');
             ALTER TABLE sellers ADD CONSTRAINT it_refused_email
                 CHECK (email IS NULL OR email NOT LIKE '%@refused.example')",
        )
        .await?;
    let p = producer()?;
    let orders = env.topic("order-events");
    let sellers = env.topic("seller-profiles");
    // One key, so one partition, in this order: healthy orders before, between and after
    // the refused order and the refused seller profile.
    let key = b"acme:isolation".as_slice();
    let mut healthy = Vec::new();
    let mut refused = Vec::new();
    for (n, order_id) in ["ok-1", "ok-2", "refused-by-the-database", "ok-3", "ok-4"]
        .iter()
        .enumerate()
    {
        let value = order_event(
            &format!("evt-{n}"),
            "order.created",
            "acme",
            order_id,
            "seller-1",
            "9.00",
        );
        let at = produce(&p, &orders, Some(key), Some(&value), &[]).await?;
        if order_id.starts_with("ok") {
            healthy.push(*order_id);
        } else {
            refused.push((orders.clone(), at));
        }
    }
    let bad_profile = serde_json::json!({
        "marketplace_id": "acme", "seller_id": "seller-2", "email": "s2@refused.example",
        "email_opt_in": true, "version": 1
    });
    let at = produce(
        &p,
        &sellers,
        Some(b"acme:seller-2"),
        Some(bad_profile.to_string().as_bytes()),
        &[],
    )
    .await?;
    refused.push((sellers.clone(), at));
    let value = order_event("evt-9", "order.created", "acme", "ok-5", "seller-1", "9.00");
    produce(&p, &orders, Some(key), Some(&value), &[]).await?;
    healthy.push("ok-5");

    // A long linger: everything produced above is in Herald's first poll batch.
    let herald = env.spawn_ingest("ingest-2", &[("HERALD_INGEST__BATCH_LINGER_MS", "2000")])?;
    env.wait_lag_zero("herald-ingest", &["order-events", "seller-profiles"])
        .await?;

    // Every healthy order has its intents; the refused ones have none.
    let orders_with_intents = env
        .count("SELECT count(DISTINCT order_id) FROM notification_intents")
        .await?;
    assert_eq!(
        orders_with_intents,
        healthy.len() as i64,
        "healthy orders: {healthy:?}"
    );
    assert_eq!(
        env.count("SELECT count(*) FROM sellers WHERE seller_id = 'seller-2'")
            .await?,
        0
    );

    // Each refused message is on the dead-letter topic once, as `store_rejected` with the
    // SQLSTATE of a CHECK violation.
    let dlq = env.topic("herald.dead-letter");
    let letters = wait_for("dead letters", WAIT, || async {
        let l = read_all(&dlq)?;
        Ok((l.len() >= refused.len()).then_some(l))
    })
    .await?;
    assert_eq!(letters.len(), refused.len(), "{letters:#?}");
    for (topic, (partition, offset)) in &refused {
        let letter = letters
            .iter()
            .find(|l| {
                l.headers.get("herald-dlq-source-topic") == Some(topic)
                    && l.headers.get("herald-dlq-source-partition") == Some(&partition.to_string())
                    && l.headers.get("herald-dlq-source-offset") == Some(&offset.to_string())
            })
            .unwrap_or_else(|| panic!("no dead letter for {topic}/{partition}@{offset}: {letters:#?}"));
        assert_eq!(letter.headers["herald-dlq-reason"], "store_rejected");
        let detail = &letter.headers["herald-dlq-detail"];
        assert!(
            detail.starts_with("SQLSTATE 23514 (constraint_violation)"),
            "{detail}"
        );
    }

    // Operators see it: two messages isolated, and no batch retried as if it were transient.
    let addr = herald.admin_addr(WAIT).await?;
    let text = scrape(&addr).await?;
    assert_eq!(
        metric(
            &text,
            "herald_ingest_messages_isolated_total",
            &["class=\"constraint_violation\""]
        ),
        2.0,
        "{text}"
    );
    assert_eq!(
        metric(&text, "herald_batches_retried_total", &["stage=\"ingest\""]),
        0.0,
        "a permanent refusal is never retried: {text}"
    );
    assert!(herald.log().contains("bisecting"), "the batch was narrowed down");
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_database_outage_is_retried_and_dead_letters_nothing() -> Result<()> {
    let env = TestEnv::new("outage", "").await?;
    let seller = UniqueSeller::new();
    let mut herald = env.spawn_ingest("ingest", &[("HERALD_INGEST__RETRY_BACKOFF_MAX_MS", "500")])?;
    publish_sellers(&env, &[seller.profile("seller-1")]).await?;
    let addr = herald.admin_addr(WAIT).await?;

    // The database stops taking connections and drops the ones it has: every ingest
    // transaction fails with a connection error until it comes back.
    let admin = pg_connect(PG_ADMIN_URL).await?;
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {db} ALLOW_CONNECTIONS false;
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{db}'",
            db = env.database
        ))
        .await?;
    let p = producer()?;
    for n in 0..20 {
        let value = order_event(
            &format!("evt-{n}"),
            "order.created",
            "acme",
            &format!("o-{n}"),
            "seller-1",
            "1.00",
        );
        produce(
            &p,
            &env.topic("order-events"),
            Some(format!("o-{n}").as_bytes()),
            Some(&value),
            &[],
        )
        .await?;
    }
    wait_for("ingest retrying the outage", WAIT, || async {
        let text = scrape(&addr).await?;
        Ok((metric(&text, "herald_batches_retried_total", &["stage=\"ingest\""]) >= 3.0).then_some(()))
    })
    .await?;
    admin
        .batch_execute(&format!("ALTER DATABASE {} ALLOW_CONNECTIONS true", env.database))
        .await?;

    env.wait_lag_zero("herald-ingest", &["order-events"]).await?;
    let db = pg_connect(&env.db_url).await?;
    let orders: i64 = db
        .query_one("SELECT count(DISTINCT order_id) FROM notification_intents", &[])
        .await?
        .get(0);
    assert_eq!(orders, 20, "every order converged once the database was back");
    assert!(
        read_all(&env.topic("herald.dead-letter"))?.is_empty(),
        "an outage dead-letters nothing"
    );
    let text = scrape(&addr).await?;
    assert_eq!(
        metric(&text, "herald_ingest_messages_isolated_total", &[]),
        0.0,
        "{text}"
    );
    assert!(herald.is_running());
    herald.terminate(Duration::from_secs(30)).await?;
    env.cleanup().await;
    Ok(())
}
