//! The adoption path's first step: a route in `observe` mode, while another notifier still
//! sends. Herald converges, renders, decides consent and freezes each intent, records
//! conflicts and counts it all, and the provider receives nothing. Switching the route to
//! `deliver` sends only what is created afterwards: the observed intents (also when their
//! order is re-emitted after the switch), and an intent held for its seller's profile while
//! the route observed and released after the switch, are never sent.

use std::time::Duration;

use anyhow::Result;
use integration_tests::http::{metric, scrape};
use integration_tests::kafka::{produce, producer};
use integration_tests::moto::{emails_to, sms_to};
use integration_tests::samples::{order_event, UniqueSeller};
use integration_tests::{produce_order, produce_seller, publish_sellers, wait_for, EnvOptions, TestEnv};

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observed_route_freezes_and_counts_but_never_sends_and_the_switch_sends_only_new_intents(
) -> Result<()> {
    let env = TestEnv::with_options(
        "observe",
        "",
        EnvOptions {
            route_mode: "observe",
            ..EnvOptions::default()
        },
    )
    .await?;
    // Every role runs: a delivery worker is there to send anything that got queued.
    let mut herald = env.spawn_roles("ingest,relay,deliver", "observing", &[])?;
    let p = producer()?;
    let seller = UniqueSeller::new();
    let late = UniqueSeller::new();
    // SMS opted out: observed intents keep any consent decision, not only `granted`.
    let mut profile = seller.profile("seller-1");
    profile.sms_opt_in = false;
    publish_sellers(&env, &[profile]).await?;

    let order_a = format!("9{}", &uuid::Uuid::new_v4().simple().to_string()[..6]);
    let order_b = format!("{order_a}b");
    let order_c = format!("{order_a}c");
    produce_order(&env, &p, &format!("evt-{order_a}"), &order_a, "seller-1", "12.00").await?;
    produce_order(&env, &p, &format!("evt-{order_a}"), &order_a, "seller-1", "12.00").await?; // a retry
    produce_order(
        &env,
        &p,
        &format!("evt-{order_a}-2"),
        &order_a,
        "seller-1",
        "13.00",
    )
    .await?; // changed
    produce_order(&env, &p, &format!("evt-{order_b}"), &order_b, "seller-1", "20.00").await?;
    // seller-2 has no profile yet: held, in observe mode.
    produce_order(&env, &p, &format!("evt-{order_c}"), &order_c, "seller-2", "30.00").await?;

    env.wait_count(
        "4 intents observed, 2 held",
        "SELECT count(*) FILTER (WHERE state = 'observed') * 10 + count(*) FILTER (WHERE state = 'awaiting_profile')
           FROM notification_intents",
        42,
        WAIT,
    )
    .await?;
    env.wait_count(
        "2 conflicts recorded",
        "SELECT count(*) FROM intent_conflicts",
        2,
        WAIT,
    )
    .await?;
    env.wait_lag_zero("herald-ingest", &["order-events", "seller-profiles"])
        .await?;

    // Frozen like any intent: payload, revision and consent; never due, never queued.
    let frozen = env
        .count(
            "SELECT count(*) FROM notification_intents
              WHERE state = 'observed' AND payload_digest IS NOT NULL AND template_revision IS NOT NULL
                AND next_attempt_at IS NULL
                AND consent = CASE channel WHEN 'email' THEN 'granted' ELSE 'opted_out' END",
        )
        .await?;
    assert_eq!(
        frozen, 4,
        "observed intents are frozen with their consent decision"
    );
    assert_eq!(
        env.count("SELECT count(*) FROM outbox").await?,
        0,
        "nothing queued"
    );
    assert_eq!(
        env.count("SELECT count(*) FROM notification_attempts").await?,
        0,
        "no attempt"
    );
    let text = scrape(&herald.admin_addr(WAIT).await?).await?;
    let observed = |labels: &[&str]| metric(&text, "herald_intents_observed_total", labels);
    assert_eq!(
        observed(&["channel=\"email\"", "consent=\"granted\""]),
        2.0,
        "{text}"
    );
    assert_eq!(
        observed(&["channel=\"sms\"", "consent=\"opted_out\""]),
        2.0,
        "{text}"
    );
    assert_eq!(metric(&text, "herald_fingerprint_conflicts_total", &[]), 2.0);
    assert_eq!(metric(&text, "herald_duplicates_converged_total", &[]), 2.0);
    assert_eq!(metric(&text, "herald_intents_created_total", &[]), 6.0);
    // The relay deletes what it publishes: nothing published is what shows nothing queued.
    assert_eq!(metric(&text, "herald_relay_published_total", &[]), 0.0, "{text}");

    // The switch: the operator sets the route to deliver events that occurred from a given
    // instant (the samples occur at 10:00:00), and restarts.
    herald.terminate(Duration::from_secs(30)).await?;
    env.set_route("mode = \"deliver\"\ndeliver_from = \"2026-09-21T10:00:00Z\"")?;
    let herald = env.spawn_roles("ingest,relay,deliver", "delivering", &[])?;
    // seller-2's profile arrives after the switch: the held intents were created while the
    // route observed, so they are released `observed`.
    produce_seller(&env, &p, &late.profile("seller-2")).await?;
    env.wait_count(
        "the held intents released, observed",
        &format!(
            "SELECT count(*) FROM notification_intents WHERE state = 'observed' AND consent = 'granted'
                AND order_id = '{order_c}'"
        ),
        2,
        WAIT,
    )
    .await?;

    // A re-emission of an observed order after the switch converges on its observed intent
    // and is not sent.
    produce_order(&env, &p, &format!("evt-{order_a}"), &order_a, "seller-1", "12.00").await?;
    // A late event that occurred before deliver_from (a backlog, a replay) is observed.
    let order_e = format!("{order_a}e");
    let mut late_event: serde_json::Value = serde_json::from_slice(&order_event(
        &format!("evt-{order_e}"),
        "order.created",
        "acme",
        &order_e,
        "seller-1",
        "50.00",
    ))?;
    late_event["occurred_at"] = "2026-09-21T09:59:59Z".into();
    produce(
        &p,
        &env.topic("order-events"),
        Some(order_e.as_bytes()),
        Some(late_event.to_string().as_bytes()),
        &[],
    )
    .await?;
    // A new order after the switch is delivered (the SMS is suppressed: opted out).
    let order_d = format!("{order_a}d");
    produce_order(&env, &p, &format!("evt-{order_d}"), &order_d, "seller-1", "40.00").await?;
    wait_for("order D's e-mail at the provider", WAIT, || async {
        Ok((!emails_to(&seller.email).await?.is_empty()).then_some(()))
    })
    .await?;
    env.wait_count(
        "order D's intents decided",
        &format!(
            "SELECT count(*) FROM notification_intents WHERE order_id = '{order_d}'
                AND state IN ('accepted', 'suppressed')"
        ),
        2,
        WAIT,
    )
    .await?;
    env.wait_lag_zero("herald-ingest", &["order-events", "seller-profiles"])
        .await?;
    env.wait_lag_zero("herald-delivery", &["herald.deliveries"])
        .await?;

    // Read again once every message was consumed and every delivery recorded.
    let sent = emails_to(&seller.email).await?;
    assert_eq!(sent.len(), 1, "only order D's e-mail: {sent:#?}");
    assert!(
        sent[0].to_string().contains(&order_d),
        "the e-mail is order D's: {sent:#?}"
    );
    assert!(
        emails_to(&late.email).await?.is_empty(),
        "the released observed e-mail was sent"
    );
    assert!(
        sms_to(&late.phone).await?.is_empty(),
        "the released observed SMS was sent"
    );
    assert!(sms_to(&seller.phone).await?.is_empty());
    assert_eq!(
        env.count("SELECT count(*) FROM notification_intents WHERE state = 'observed'")
            .await?,
        8,
        "observed intents stay observed, and order E's are observed"
    );
    assert_eq!(
        env.count(&format!(
            "SELECT count(*) FROM notification_intents WHERE order_id = '{order_e}' AND state = 'observed'"
        ))
        .await?,
        2,
        "order E occurred before deliver_from"
    );
    let text = scrape(&herald.admin_addr(WAIT).await?).await?;
    assert_eq!(
        metric(&text, "herald_intents_observed_total", &[]),
        4.0,
        "C's 2 released and E's 2, counted by the delivering instance: {text}"
    );
    let queued = env
        .count(&format!(
            "SELECT count(*) FROM notification_attempts a JOIN notification_intents i ON i.id = a.intent_id
              WHERE i.order_id <> '{order_d}'"
        ))
        .await?;
    assert_eq!(queued, 0, "an attempt for an intent created before the switch");
    Ok(())
}
