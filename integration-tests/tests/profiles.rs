//! Late seller profiles: an order whose seller has no profile yet is held
//! (`awaiting_profile`), rendered and frozen when the profile arrives, or suppressed
//! (`no_seller_profile`) once `ingest.profile_wait_secs` passed. Checked in PostgreSQL and in
//! what moto (SES v2 / SNS) received.

use std::time::Duration;

use anyhow::Result;
use integration_tests::http::scrape;
use integration_tests::kafka::{produce, producer};
use integration_tests::samples::{order_event, Seller, UniqueSeller};
use integration_tests::{moto, wait_for, TestEnv};

const WAIT: Duration = Duration::from_secs(90);

fn french<'a>(seller: &'a UniqueSeller, seller_id: &'a str) -> Seller<'a> {
    Seller {
        locale: "fr",
        ..seller.profile(seller_id)
    }
}

async fn produce_order(env: &TestEnv, order_id: &str, seller_id: &str, event_id: &str) -> Result<()> {
    let value = order_event(event_id, "order.created", "acme", order_id, seller_id, "42.00");
    produce(
        &producer()?,
        &env.topic("order-events"),
        Some(order_id.as_bytes()),
        Some(&value),
        &[],
    )
    .await?;
    Ok(())
}

async fn produce_profile(env: &TestEnv, s: &Seller<'_>) -> Result<()> {
    produce(
        &producer()?,
        &env.topic("seller-profiles"),
        Some(&s.key()),
        Some(&s.value()),
        &[],
    )
    .await?;
    Ok(())
}

/// The held intents' rows: no payload, revision or consent, no outbox row, one open hold.
async fn assert_held(env: &TestEnv, intents: i64) -> Result<()> {
    assert_eq!(
        env.count(
            "SELECT count(*) FROM notification_intents WHERE state = 'awaiting_profile' \
             AND payload_digest IS NULL AND template_revision IS NULL AND consent IS NULL"
        )
        .await?,
        intents
    );
    assert_eq!(
        env.count("SELECT count(*) FROM outbox").await?,
        0,
        "nothing held is queued"
    );
    assert_eq!(
        env.count("SELECT count(*) FROM intent_holds WHERE decision IS NULL AND event IS NOT NULL")
            .await?,
        intents
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_arriving_after_the_order_releases_it_once_with_the_profiles_locale_and_address(
) -> Result<()> {
    let env = TestEnv::new("late_profile", "").await?;
    let herald = env.spawn_roles("ingest,relay,deliver", "herald", &[])?;
    let admin = herald.admin_addr(WAIT).await?;
    let seller = UniqueSeller::new();

    produce_order(&env, "7001", "seller-late", "evt-1").await?;
    env.wait_count(
        "intents held",
        "SELECT count(*) FROM notification_intents WHERE state = 'awaiting_profile'",
        2,
        WAIT,
    )
    .await?;
    assert_held(&env, 2).await?;

    // A duplicate of the order while it is held converges on the held intents.
    produce_order(&env, "7001", "seller-late", "evt-1").await?;
    env.wait_lag_zero("herald-ingest", &["order-events"]).await?;
    assert_eq!(env.count("SELECT count(*) FROM notification_intents").await?, 2);
    assert_eq!(env.count("SELECT count(*) FROM intent_conflicts").await?, 0);
    assert_held(&env, 2).await?;
    let shown = env.herald(&["intent", "show", "acme", "7001", "order.created", "email"])?;
    assert!(shown.contains("state             awaiting_profile"), "{shown}");
    assert!(shown.contains("held for profile"), "{shown}");
    assert!(shown.contains("not rendered yet"), "{shown}");

    // The profile comes 5 s after the order was held.
    wait_for("the hold to be 5 s old", WAIT, || async {
        Ok((env
            .count("SELECT count(*) FROM intent_holds WHERE held_at <= now() - interval '5 seconds'")
            .await?
            == 2)
            .then_some(()))
    })
    .await?;
    produce_profile(&env, &french(&seller, "seller-late")).await?;

    env.wait_count(
        "both intents delivered",
        "SELECT count(*) FROM notification_intents WHERE state = 'accepted'",
        2,
        WAIT,
    )
    .await?;
    // Frozen with the profile: its locale, its address, its consent, and the revision of
    // the moment; released in the profile's transaction, with the profile's version.
    assert_eq!(
        env.count(&format!(
            "SELECT count(*) FROM notification_intents i JOIN notification_payloads p ON p.digest = i.payload_digest \
             WHERE i.consent = 'granted' AND i.template_revision = '1' AND p.locale = 'fr' \
               AND p.destination IN ('{}', '{}')",
            seller.email, seller.phone
        ))
        .await?,
        2
    );
    assert_eq!(
        env.count(
            "SELECT count(*) FROM intent_holds WHERE decision = 'released' AND profile_version = 1 \
             AND event IS NULL AND decided_at - held_at >= interval '5 seconds'"
        )
        .await?,
        2
    );
    let emails = moto::emails_to(&seller.email).await?;
    assert_eq!(emails.len(), 1, "{emails:?}");
    assert!(
        emails[0].to_string().contains("Nouvelle commande 7001"),
        "{:?}",
        emails[0]
    );
    let sms = moto::sms_to(&seller.phone).await?;
    assert_eq!(sms.len(), 1, "{sms:?}");
    assert!(
        sms[0].to_string().contains("Nouvelle commande 7001"),
        "{:?}",
        sms[0]
    );

    // Released by the profile's own transaction, not by the sweeper's backstop.
    assert!(herald.log().contains("\"how\":\"profile\""), "{}", herald.log());
    let shown = env.herald(&["intent", "show", "acme", "7001", "order.created", "email"])?;
    assert!(shown.contains("released"), "{shown}");
    assert!(shown.contains("with profile version 1"), "{shown}");
    wait_for("hold counters exported", WAIT, || async {
        let text = scrape(&admin).await?;
        Ok((text.contains("herald_intents_held_total{outcome=\"held\"} 2")
            && text.contains("herald_intents_held_total{outcome=\"released\"} 2")
            && text.contains("herald_intents_awaiting_profile 0"))
        .then_some(()))
    })
    .await?;
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_profile_within_the_wait_the_intents_are_suppressed_and_a_later_profile_changes_nothing(
) -> Result<()> {
    let env = TestEnv::new("no_profile", "").await?;
    let _herald = env.spawn_roles(
        "ingest,relay,deliver",
        "herald",
        &[("HERALD_INGEST__PROFILE_WAIT_SECS", "3")],
    )?;
    let seller = UniqueSeller::new();

    produce_order(&env, "7101", "seller-never", "evt-1").await?;
    env.wait_count(
        "intents suppressed after the wait",
        "SELECT count(*) FROM notification_intents WHERE state = 'suppressed' AND consent = 'no_seller_profile'",
        2,
        WAIT,
    )
    .await?;
    // Frozen with what was rendered without a profile when the order was held: the
    // default locale, no destination; the hold records that the wait ran out.
    assert_eq!(
        env.count(
            "SELECT count(*) FROM notification_intents i JOIN notification_payloads p ON p.digest = i.payload_digest \
             JOIN intent_holds h ON h.intent_id = i.id \
             WHERE p.locale = 'en' AND p.destination IS NULL AND i.template_revision = p.template_revision \
               AND h.decision = 'expired' AND h.fallback_digest = i.payload_digest \
               AND h.decided_at >= h.hold_until AND h.event IS NULL"
        )
        .await?,
        2
    );

    // The profile arrives after the wait: stored, and the suppressed intents stay so.
    produce_profile(&env, &seller.profile("seller-never")).await?;
    env.wait_count("profile stored", "SELECT count(*) FROM sellers", 1, WAIT)
        .await?;
    env.wait_lag_zero("herald-ingest", &["order-events", "seller-profiles"])
        .await?;
    // A full sweep period (1 s for a 3 s wait) and then some.
    let quiet = std::time::Instant::now();
    wait_for("two sweep periods", WAIT, || async {
        Ok((quiet.elapsed() >= Duration::from_secs(3)).then_some(()))
    })
    .await?;
    assert_eq!(
        env.count("SELECT count(*) FROM notification_intents WHERE state = 'suppressed'")
            .await?,
        2
    );
    assert_eq!(env.count("SELECT count(*) FROM outbox").await?, 0);
    assert_eq!(env.count("SELECT count(*) FROM notification_attempts").await?, 0);
    assert!(moto::emails_to(&seller.email).await?.is_empty());
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_orders_of_a_seller_are_held_then_released_together() -> Result<()> {
    let env = TestEnv::new("two_held", "").await?;
    let _herald = env.spawn_roles("ingest,relay,deliver", "herald", &[])?;
    let seller = UniqueSeller::new();

    produce_order(&env, "7201", "seller-two", "evt-1").await?;
    produce_order(&env, "7202", "seller-two", "evt-2").await?;
    env.wait_count(
        "intents held",
        "SELECT count(*) FROM notification_intents WHERE state = 'awaiting_profile'",
        4,
        WAIT,
    )
    .await?;
    assert_held(&env, 4).await?;

    produce_profile(&env, &seller.profile("seller-two")).await?;
    env.wait_count(
        "all four delivered",
        "SELECT count(*) FROM notification_intents WHERE state = 'accepted'",
        4,
        WAIT,
    )
    .await?;
    // One transaction released them all: one decision time.
    assert_eq!(
        env.count("SELECT count(DISTINCT decided_at) FROM intent_holds WHERE decision = 'released'")
            .await?,
        1
    );
    assert_eq!(
        env.count("SELECT count(*) FROM intent_holds WHERE decision = 'released'")
            .await?,
        4
    );
    let emails = moto::emails_to(&seller.email).await?;
    assert_eq!(emails.len(), 2, "one e-mail per order: {emails:?}");
    assert_eq!(moto::sms_to(&seller.phone).await?.len(), 2);
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_wait_an_order_without_a_profile_is_suppressed_at_once() -> Result<()> {
    let env = TestEnv::new("no_wait", "").await?;
    let _ingest = env.spawn_ingest("ingest", &[("HERALD_INGEST__PROFILE_WAIT_SECS", "0")])?;
    produce_order(&env, "7301", "seller-none", "evt-1").await?;
    env.wait_count(
        "intents suppressed",
        "SELECT count(*) FROM notification_intents WHERE state = 'suppressed' AND consent = 'no_seller_profile'",
        2,
        WAIT,
    )
    .await?;
    assert_eq!(env.count("SELECT count(*) FROM intent_holds").await?, 0);
    env.cleanup().await;
    Ok(())
}

/// An adversary's schedule: two ingest instances, each seller's first order and its profile
/// produced back to back, so that the order's transaction and the profile's run at the
/// same moment in different processes. No order may stay held once its profile is stored:
/// every hold is released by the profile's own transaction, never by the sweeper's
/// backstop (which would hide a missed release for up to a sweep period).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_and_profiles_racing_in_two_instances_leave_no_order_held() -> Result<()> {
    const SELLERS: usize = 300;
    let env = TestEnv::new("profile_race", "").await?;
    let a = env.spawn_ingest("ingest-a", &[])?;
    let b = env.spawn_ingest("ingest-b", &[])?;
    a.wait_partitions_assigned(WAIT).await?;
    b.wait_partitions_assigned(WAIT).await?;
    let sellers: Vec<UniqueSeller> = (0..SELLERS).map(|_| UniqueSeller::new()).collect();
    let ids: Vec<String> = (0..SELLERS).map(|i| format!("seller-r{i}")).collect();
    let p = producer()?;
    let orders = env.topic("order-events");
    let profiles = env.topic("seller-profiles");
    for (i, (seller, id)) in sellers.iter().zip(&ids).enumerate() {
        let order_id = format!("9{i:04}");
        let order = order_event(
            &format!("evt-{i}"),
            "order.created",
            "acme",
            &order_id,
            id,
            "5.00",
        );
        let profile = seller.profile(id);
        let (key, value) = (profile.key(), profile.value());
        // Both in flight at once: neither waits for the other's acknowledgement.
        let (o, s) = tokio::join!(
            produce(&p, &orders, Some(order_id.as_bytes()), Some(&order), &[]),
            produce(&p, &profiles, Some(&key), Some(&value), &[]),
        );
        o?;
        s?;
    }
    env.wait_count(
        "every intent frozen",
        "SELECT count(*) FROM notification_intents WHERE state = 'pending' AND consent = 'granted'",
        2 * SELLERS as i64,
        WAIT,
    )
    .await?;
    assert_eq!(
        env.count("SELECT count(*) FROM intent_holds WHERE decision IS DISTINCT FROM 'released'")
            .await?,
        0,
        "no hold open or expired"
    );
    let held = env.count("SELECT count(*) FROM intent_holds").await?;
    let swept = [&a, &b]
        .iter()
        .map(|p| p.log().matches("\"how\":\"sweep\"").count())
        .sum::<usize>();
    assert_eq!(
        swept, 0,
        "{swept} of {held} holds were released by the sweeper, not by their profile's transaction"
    );
    println!(
        "{held} of {} intents were held and released by their profile",
        2 * SELLERS
    );
    env.cleanup().await;
    Ok(())
}

/// SIGKILL at both commit points of a release: inside the profile's transaction (its rows
/// written, not committed) and just after its commit (offsets not stored). The first
/// leaves the hold open and the profile unstored; the second's replay finds the hold
/// decided. Either way the order is released once: two intents, two outbox rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_killed_before_or_after_its_commit_is_done_once_on_replay() -> Result<()> {
    let env = TestEnv::new("release_kill", "").await?;
    let seller = UniqueSeller::new();
    let mut first = env.spawn_ingest("ingest-1", &[])?;
    produce_order(&env, "7401", "seller-kill", "evt-1").await?;
    env.wait_count(
        "intents held",
        "SELECT count(*) FROM notification_intents WHERE state = 'awaiting_profile'",
        2,
        WAIT,
    )
    .await?;
    env.wait_lag_zero("herald-ingest", &["order-events"]).await?;
    first.terminate(WAIT).await?;

    // Killed inside the profile's transaction: it holds the seller's lock when it parks.
    let mut second = env.spawn_ingest(
        "ingest-2",
        &[("FAILPOINTS", "ingest-before-db-commit=sleep(600000)")],
    )?;
    produce_profile(&env, &seller.profile("seller-kill")).await?;
    env.wait_count(
        "the profile's transaction parked with the seller's lock",
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        1,
        WAIT,
    )
    .await?;
    second.kill()?;
    env.wait_count(
        "the killed transaction rolled back",
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        0,
        WAIT,
    )
    .await?;
    assert_eq!(env.count("SELECT count(*) FROM sellers").await?, 0);
    assert_held(&env, 2).await?;

    // Killed just after the commit, before the offsets are stored.
    let mut third = env.spawn_ingest(
        "ingest-3",
        &[("FAILPOINTS", "ingest-after-db-commit=sleep(600000)")],
    )?;
    env.wait_count(
        "released by the replayed profile",
        "SELECT count(*) FROM intent_holds WHERE decision = 'released'",
        2,
        WAIT,
    )
    .await?;
    third.kill()?;

    let fourth = env.spawn_ingest("ingest-4", &[])?;
    env.wait_lag_zero("herald-ingest", &["order-events", "seller-profiles"])
        .await?;
    assert!(fourth.log().contains("ingest consuming"), "{}", fourth.log());
    assert_eq!(
        env.count("SELECT count(*) FROM notification_intents WHERE state = 'pending'")
            .await?,
        2
    );
    assert_eq!(
        env.count("SELECT count(*) FROM outbox").await?,
        2,
        "released once: one outbox row per intent"
    );
    assert_eq!(
        env.count("SELECT count(*) FROM intent_holds WHERE decision = 'released' AND profile_version = 1")
            .await?,
        2
    );
    env.cleanup().await;
    Ok(())
}
