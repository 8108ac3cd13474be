//! Ingest, end to end: order events on real Kafka become exactly one intent per business
//! key in real PostgreSQL, whatever the duplicates, conflicts, poison and crashes.

use std::time::Duration;

use anyhow::Result;
use integration_tests::kafka::{committed_lag, produce, producer, read_all};
use integration_tests::samples::{opted_in_seller, order_event, Seller};
use integration_tests::{wait_for, TestEnv};

const WAIT: Duration = Duration::from_secs(60);

/// (expected reason, topic, key, value) of one poison message.
type PoisonCase<'a> = (&'a str, &'a str, Option<Vec<u8>>, Option<Vec<u8>>);

/// Produces the seller profile and waits until ingest stored it, so orders render with it.
async fn seed_seller(env: &TestEnv, p: &rdkafka::producer::FutureProducer, s: &Seller<'_>) -> Result<()> {
    produce(
        p,
        &env.topic("seller-profiles"),
        Some(&s.key()),
        Some(&s.value()),
        &[],
    )
    .await?;
    env.wait_count(
        "seller profile stored",
        &format!("SELECT count(*) FROM sellers WHERE seller_id = '{}'", s.seller_id),
        1,
        WAIT,
    )
    .await
}

/// Produces an `order.created` event of marketplace `acme`, keyed by its order id; returns
/// its (partition, offset).
async fn produce_order(
    env: &TestEnv,
    p: &rdkafka::producer::FutureProducer,
    event_id: &str,
    order_id: &str,
    seller_id: &str,
    total: &str,
) -> Result<(i32, i64)> {
    let value = order_event(event_id, "order.created", "acme", order_id, seller_id, total);
    produce(
        p,
        &env.topic("order-events"),
        Some(order_id.as_bytes()),
        Some(&value),
        &[],
    )
    .await
}

async fn wait_lag_zero(env: &TestEnv) -> Result<()> {
    env.wait_lag_zero("herald-ingest", &["order-events", "seller-profiles"])
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_events_from_two_ingest_instances_converge_on_one_intent_per_channel() -> Result<()> {
    let env = TestEnv::new("dup", "").await?;
    let mut a = env.spawn_ingest("ingest-a", &[])?;
    let mut b = env.spawn_ingest("ingest-b", &[])?;
    let p = producer()?;
    seed_seller(&env, &p, &opted_in_seller("acme", "seller-19", "fr-FR")).await?;
    // Both instances must own partitions, so that copies of one order are processed
    // concurrently by different processes.
    a.wait_partitions_assigned(WAIT).await?;
    b.wait_partitions_assigned(WAIT).await?;

    // 20 orders, each produced three times with different event ids, keyed differently so
    // the copies land on different partitions and so on both instances.
    let topic = env.topic("order-events");
    for copy in 0..3 {
        for order in 0..20 {
            let value = order_event(
                &format!("evt-{order}-{copy}"),
                "order.created",
                "acme",
                &format!("80{order:02}"),
                "seller-19",
                "129.90",
            );
            let key = format!("k{copy}-{order}");
            produce(&p, &topic, Some(key.as_bytes()), Some(&value), &[]).await?;
        }
    }
    wait_lag_zero(&env).await?;
    assert!(a.is_running() && b.is_running(), "both ingest instances stay up");
    for (name, proc) in [("a", &a), ("b", &b)] {
        assert!(
            proc.log().contains("intent created"),
            "instance {name} created intents too"
        );
    }

    assert_eq!(
        env.count("SELECT count(*) FROM notification_intents").await?,
        40,
        "one intent per (order, channel)"
    );
    assert_eq!(
        env.count("SELECT count(*) FROM (SELECT 1 FROM notification_intents GROUP BY order_id, channel HAVING count(*) > 1) d").await?,
        0
    );
    assert_eq!(
        env.count("SELECT count(*) FROM outbox").await?,
        40,
        "one outbox row per intent"
    );
    assert_eq!(
        env.count("SELECT count(*) FROM intent_conflicts").await?,
        0,
        "duplicates are not conflicts"
    );
    assert_eq!(
        env.count(
            "SELECT count(*) FROM notification_intents WHERE state = 'pending' AND consent = 'granted'"
        )
        .await?,
        40
    );
    // The French seller gets the French revision, frozen in the payload.
    assert_eq!(
        env.count(
            "SELECT count(*) FROM notification_payloads WHERE locale = 'fr' AND destination IS NOT NULL"
        )
        .await?,
        40
    );
    assert!(a.terminate(WAIT).await?.success(), "SIGTERM exits 0");
    assert!(b.terminate(WAIT).await?.success(), "SIGTERM exits 0");
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_content_under_the_same_key_is_a_conflict_and_leaves_the_intent_unchanged() -> Result<()> {
    let env = TestEnv::new("conflict", "").await?;
    let _ingest = env.spawn_ingest("ingest", &[])?;
    let p = producer()?;
    seed_seller(&env, &p, &opted_in_seller("acme", "seller-7", "en")).await?;
    produce_order(&env, &p, "evt-1", "8042", "seller-7", "129.90").await?;
    env.wait_count(
        "intents created",
        "SELECT count(*) FROM notification_intents",
        2,
        WAIT,
    )
    .await?;
    let before = env
        .db
        .query("SELECT channel, id::text, payload_digest, request_fingerprint FROM notification_intents ORDER BY channel", &[])
        .await?;

    let (_, offset) = produce_order(&env, &p, "evt-2", "8042", "seller-7", "139.90").await?;
    wait_lag_zero(&env).await?;

    // One conflict row per channel of the re-emission, each naming the offending message.
    assert_eq!(env.count("SELECT count(*) FROM intent_conflicts").await?, 2);
    assert_eq!(
        env.count(&format!(
            "SELECT count(*) FROM intent_conflicts WHERE offending_event_id = 'evt-2' AND source_offset = {offset} \
             AND offending_event->'order'->>'total' = '139.90' AND existing_fingerprint <> offending_fingerprint"
        ))
        .await?,
        2
    );
    let after = env
        .db
        .query("SELECT channel, id::text, payload_digest, request_fingerprint FROM notification_intents ORDER BY channel", &[])
        .await?;
    assert_eq!(before.len(), after.len());
    for (x, y) in before.iter().zip(&after) {
        for col in 0..4 {
            assert_eq!(
                x.get::<_, String>(col),
                y.get::<_, String>(col),
                "intent unchanged by the conflict"
            );
        }
    }
    assert_eq!(
        env.count("SELECT count(*) FROM outbox").await?,
        2,
        "a conflict is never queued for sending"
    );
    // Nor is its rendering stored: every payload row is some intent's.
    assert_eq!(
        env.count(
            "SELECT count(*) FROM notification_payloads p \
             WHERE NOT EXISTS (SELECT 1 FROM notification_intents i WHERE i.payload_digest = p.digest)"
        )
        .await?,
        0,
        "no payload row for the conflicting re-emission"
    );

    // The operator's view shows the conflict.
    let shown = env.herald(&["intent", "show", "acme", "8042", "order.created", "email"])?;
    assert!(shown.contains("evt-2"), "{shown}");
    assert!(shown.contains("state             pending"), "{shown}");
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn template_revision_published_between_duplicates_keeps_the_first_revision() -> Result<()> {
    let env = TestEnv::new("revision", "").await?;
    let _ingest = env.spawn_ingest("ingest", &[])?;
    let p = producer()?;
    seed_seller(&env, &p, &opted_in_seller("acme", "seller-3", "en")).await?;
    produce_order(&env, &p, "evt-1", "9001", "seller-3", "10.00").await?;
    env.wait_count(
        "intents created",
        "SELECT count(*) FROM notification_intents",
        2,
        WAIT,
    )
    .await?;

    let body = env.dir.join("email-r2.txt");
    std::fs::write(&body, "Revision two for order {{ order_id }}")?;
    env.herald(&[
        "template",
        "publish",
        "--template",
        "order_created",
        "--channel",
        "email",
        "--locale",
        "en",
        "--revision",
        "2",
        "--subject",
        "R2 {{ order_id }}",
        "--body-file",
        body.to_str().unwrap(),
        "--activate",
    ])?;
    // Revisions are immutable: the same content again is a no-op, other content is refused.
    let republish = |body: &std::path::Path| {
        env.herald_output(&[
            "template",
            "publish",
            "--template",
            "order_created",
            "--channel",
            "email",
            "--locale",
            "en",
            "--revision",
            "2",
            "--subject",
            "R2 {{ order_id }}",
            "--body-file",
            body.to_str().unwrap(),
        ])
    };
    let same = republish(&body)?;
    assert!(same.status.success());
    assert!(String::from_utf8_lossy(&same.stdout).contains("already published"));
    let other = env.dir.join("email-r2-changed.txt");
    std::fs::write(&other, "Changed text for {{ order_id }}")?;
    let refused = republish(&other)?;
    assert!(
        !refused.status.success(),
        "re-publishing a revision with other content is refused"
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("immutable"), "{stderr}");

    produce_order(&env, &p, "evt-2", "9001", "seller-3", "10.00").await?;
    // A new order after the activation does get revision 2.
    produce_order(&env, &p, "evt-3", "9002", "seller-3", "10.00").await?;
    wait_lag_zero(&env).await?;

    assert_eq!(env.count("SELECT count(*) FROM notification_intents").await?, 4);
    assert_eq!(
        env.count("SELECT count(*) FROM notification_intents WHERE order_id = '9001' AND channel = 'email' AND template_revision = '1'").await?,
        1,
        "the intent keeps the revision it was created with"
    );
    assert_eq!(
        env.count(
            "SELECT count(*) FROM notification_intents i JOIN notification_payloads p ON p.digest = i.payload_digest \
             WHERE i.order_id = '9001' AND i.channel = 'email' AND p.template_revision = '1' AND p.subject = 'New order 9001 on acme'"
        )
        .await?,
        1,
        "and its frozen payload"
    );
    assert_eq!(
        env.count("SELECT count(*) FROM notification_intents WHERE order_id = '9002' AND channel = 'email' AND template_revision = '2'").await?,
        1
    );
    assert_eq!(env.count("SELECT count(*) FROM intent_conflicts").await?, 0);
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_poison_kind_is_dead_lettered_once_and_lag_returns_to_zero() -> Result<()> {
    // A route whose template has no revision: its events are poison of kind template_missing.
    let env = TestEnv::new(
        "poison",
        "[[routes]]\nevent_kind = \"order.refunded\"\ntemplate = \"order_refunded\"\nchannels = [\"email\"]\n\n\
         [[routes]]\nevent_kind = \"order.broken\"\ntemplate = \"order_broken\"\nchannels = [\"email\"]\n",
    )
    .await?;
    // A template that compiles but fails to render (strict undefined variable).
    let body = env.dir.join("broken.txt");
    std::fs::write(&body, "Hello {{ order.no_such_field }}")?;
    env.herald(&[
        "template",
        "publish",
        "--template",
        "order_broken",
        "--channel",
        "email",
        "--locale",
        "en",
        "--revision",
        "1",
        "--subject",
        "x",
        "--body-file",
        body.to_str().unwrap(),
        "--activate",
    ])?;
    // No profile wait: the good event's seller has no profile and its intents are
    // suppressed at once (tests/profiles.rs holds them).
    let _ingest = env.spawn_ingest("ingest", &[("HERALD_INGEST__PROFILE_WAIT_SECS", "0")])?;
    let p = producer()?;
    let orders = env.topic("order-events");
    let sellers = env.topic("seller-profiles");
    let good = order_event("evt-ok", "order.created", "acme", "1", "s", "1.00");
    let mut missing_field: serde_json::Value = serde_json::from_slice(&good)?;
    missing_field.as_object_mut().unwrap().remove("order_id");
    let mut wrong_type: serde_json::Value = serde_json::from_slice(&good)?;
    wrong_type["order_id"] = serde_json::json!(8042);
    let huge = order_event(
        "evt-big",
        "order.created",
        "acme",
        &"9".repeat(100),
        "s",
        &"1".repeat(9000),
    );

    let cases: Vec<PoisonCase<'_>> = vec![
        (
            "not_json",
            orders.as_str(),
            None,
            Some(b"this is not json".to_vec()),
        ),
        (
            "not_utf8",
            orders.as_str(),
            None,
            Some(b"{\"event_id\":\"\xff\xfe\"}".to_vec()),
        ),
        (
            "missing_field",
            orders.as_str(),
            None,
            Some(missing_field.to_string().into_bytes()),
        ),
        (
            "wrong_type",
            orders.as_str(),
            None,
            Some(wrong_type.to_string().into_bytes()),
        ),
        ("too_large", orders.as_str(), None, Some(huge)),
        (
            "template_missing",
            orders.as_str(),
            None,
            Some(order_event("evt-r", "order.refunded", "acme", "2", "s", "1.00")),
        ),
        (
            "render_failed",
            orders.as_str(),
            None,
            Some(order_event("evt-b", "order.broken", "acme", "3", "s", "1.00")),
        ),
        (
            "bad_key",
            sellers.as_str(),
            Some(b"no-colon-here".to_vec()),
            Some(b"{}".to_vec()),
        ),
        (
            "not_json",
            sellers.as_str(),
            Some(b"acme:s9".to_vec()),
            Some(b"<xml/>".to_vec()),
        ),
    ];
    let mut sources = Vec::new();
    for (reason, topic, key, value) in &cases {
        let (partition, offset) = produce(&p, topic, key.as_deref(), value.as_deref(), &[]).await?;
        sources.push((*reason, topic.to_string(), partition, offset));
    }
    // An unrouted kind is skipped, not dead-lettered; a good event still gets through.
    produce(
        &p,
        &orders,
        None,
        Some(&order_event("evt-x", "order.viewed", "acme", "4", "s", "1.00")),
        &[],
    )
    .await?;
    produce(&p, &orders, None, Some(&good), &[]).await?;
    wait_lag_zero(&env).await?;

    let dlq = env.topic("herald.dead-letter");
    let letters = wait_for("dead letters", WAIT, || async {
        let l = read_all(&dlq)?;
        Ok((l.len() >= cases.len()).then_some(l))
    })
    .await?;
    assert_eq!(
        letters.len(),
        cases.len(),
        "each poison message dead-lettered exactly once"
    );
    for (reason, topic, partition, offset) in &sources {
        let found: Vec<_> = letters
            .iter()
            .filter(|l| {
                l.headers.get("herald-dlq-source-topic") == Some(topic)
                    && l.headers.get("herald-dlq-source-partition") == Some(&partition.to_string())
                    && l.headers.get("herald-dlq-source-offset") == Some(&offset.to_string())
            })
            .collect();
        assert_eq!(found.len(), 1, "{reason} at {topic}/{partition}@{offset}");
        assert_eq!(
            found[0].headers.get("herald-dlq-reason").map(String::as_str),
            Some(*reason)
        );
        assert!(!found[0].headers["herald-dlq-detail"].is_empty());
    }
    // The good event: no seller profile, so its intents exist but are suppressed.
    assert_eq!(env.count("SELECT count(*) FROM notification_intents").await?, 2);
    assert_eq!(
        env.count("SELECT count(*) FROM notification_intents WHERE state = 'suppressed' AND consent = 'no_seller_profile'").await?,
        2
    );
    assert_eq!(
        env.count("SELECT count(*) FROM outbox").await?,
        0,
        "suppressed intents are never queued"
    );
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_killed_after_db_commit_before_offset_commit_replays_into_the_same_intent() -> Result<()> {
    let env = TestEnv::new("crash", "").await?;
    let p = producer()?;
    let mut seeding = env.spawn_ingest("ingest-0", &[])?;
    seed_seller(&env, &p, &opted_in_seller("acme", "seller-5", "en")).await?;
    wait_lag_zero(&env).await?;
    assert!(seeding.terminate(WAIT).await?.success());

    // The failpoint holds the process right after the database commit, before the offsets
    // are stored; the test then kills it there with SIGKILL.
    let mut first = env.spawn_ingest(
        "ingest-1",
        &[("FAILPOINTS", "ingest-after-db-commit=sleep(600000)")],
    )?;
    produce_order(&env, &p, "evt-1", "77", "seller-5", "5.00").await?;
    env.wait_count(
        "intent committed",
        "SELECT count(*) FROM notification_intents",
        2,
        WAIT,
    )
    .await?;
    env.wait_count("outbox rows committed", "SELECT count(*) FROM outbox", 2, WAIT)
        .await?;
    first.kill()?;
    let group = env.group("herald-ingest");
    let orders = env.topic("order-events");
    assert!(
        committed_lag(&group, &[&orders])? > 0,
        "the offset was not committed before the crash"
    );

    let second = env.spawn_ingest("ingest-2", &[])?;
    wait_lag_zero(&env).await?;
    assert!(
        second.log().contains("duplicate converged"),
        "the replay was processed and converged"
    );
    assert_eq!(
        env.count("SELECT count(*) FROM notification_intents").await?,
        2,
        "replay converges: still one intent per channel"
    );
    assert_eq!(
        env.count("SELECT count(*) FROM outbox").await?,
        2,
        "no second outbox row"
    );
    assert_eq!(env.count("SELECT count(*) FROM intent_conflicts").await?, 0);
    env.cleanup().await;
    Ok(())
}
