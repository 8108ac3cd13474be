//! Plan checks: every hot statement keeps using its index on a populated database, so a
//! plan regression (a sequential scan creeping in as `notification_intents` grows) fails
//! `make test`. Only plans are asserted here, never timings.

use std::time::Duration;

use anyhow::Result;
use futures::future::join_all;
use herald_store::plans::HOT_STATEMENTS;
use integration_tests::history::history;
use integration_tests::kafka::producer;
use integration_tests::samples::{opted_in_seller, order_event};
use integration_tests::TestEnv;
use rdkafka::producer::FutureRecord;

const SELLERS: usize = 300;
const ORDERS: usize = 3000;
/// Delivered notifications added to the ledger by SQL ([`history`]).
const HISTORY: i64 = 100_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_statements_use_their_indexes() -> Result<()> {
    let env = TestEnv::new("plans", "").await?;
    let ingest = env.spawn_ingest("ingest", &[])?;
    let p = producer()?;
    let sellers_topic = env.topic("seller-profiles");
    let profiles: Vec<(Vec<u8>, Vec<u8>)> = (0..SELLERS)
        .map(|n| {
            let s = format!("seller-{n}");
            let p = opted_in_seller("acme", &s, "en");
            (p.key(), p.value())
        })
        .collect();
    join_all(profiles.iter().map(|(k, v)| {
        p.send(
            FutureRecord::to(&sellers_topic).key(k).payload(v),
            Duration::from_secs(30),
        )
    }))
    .await;
    env.wait_count(
        "sellers stored",
        "SELECT count(*) FROM sellers",
        SELLERS as i64,
        Duration::from_secs(60),
    )
    .await?;
    let orders_topic = env.topic("order-events");
    let events: Vec<(String, Vec<u8>)> = (0..ORDERS)
        .map(|n| {
            let seller = format!("seller-{}", n % SELLERS);
            let order = n.to_string();
            let v = order_event(
                &format!("evt-{n}"),
                "order.created",
                "acme",
                &order,
                &seller,
                "9.00",
            );
            (order, v)
        })
        .collect();
    join_all(events.iter().map(|(k, v)| {
        p.send(
            FutureRecord::to(&orders_topic).key(k).payload(v),
            Duration::from_secs(30),
        )
    }))
    .await;
    env.wait_count(
        "intents created",
        "SELECT count(*) FROM notification_intents",
        (ORDERS * 2) as i64,
        Duration::from_secs(120),
    )
    .await?;
    drop(ingest);
    // Attempts as delivery leaves them, one per intent, a resolution of the silence sweep
    // for every tenth (as after a provider outage), a hold for every intent (one in twenty
    // open, the others released), and fresh statistics.
    env.db
        .batch_execute(
            "INSERT INTO notification_attempts (id, intent_id, attempt_no, outcome, worker, finished_at)
             SELECT gen_random_uuid(), id, 1, 'accepted', 'plans', now() FROM notification_intents;
             INSERT INTO intent_resolutions (intent_id, resolved_as, reason, operator, settled_by)
             SELECT id, 'retry', 'no provider event', 'plans', 'silence' FROM notification_intents
              WHERE order_id::int % 10 = 0;
             INSERT INTO intent_holds (intent_id, marketplace_id, seller_id, event, fallback_digest, hold_until,
                                       decision, decided_at, profile_version)
             SELECT id, marketplace_id, 'seller-held', CASE WHEN order_id::int % 20 = 1 THEN '{}'::jsonb END,
                    payload_digest, now() + interval '1 hour',
                    CASE WHEN order_id::int % 20 <> 1 THEN 'released' END,
                    CASE WHEN order_id::int % 20 <> 1 THEN now() END,
                    CASE WHEN order_id::int % 20 <> 1 THEN 1 END
               FROM notification_intents;
             ANALYZE;",
        )
        .await?;
    // Then a ledger of a deployment's size, so that the largest batch (256 ids) is a small
    // share of every table, as it is in production: on 6,000 intents, hashing the whole
    // table is the planner's right answer for 256 ids. Delivered notifications, their
    // decided holds, 20,000 more sellers, and a suppression list of one address in ten,
    // keyed (a digest is 64 hex characters). (`history` also vacuums and checkpoints.)
    history(&env, HISTORY).await?;
    env.db
        .batch_execute(&format!(
            "INSERT INTO intent_holds (intent_id, marketplace_id, seller_id, fallback_digest, hold_until,
                                       decision, decided_at, profile_version)
             SELECT id, marketplace_id, seller_id, payload_digest, now(), 'released', now(), 1
               FROM notification_intents WHERE marketplace_id = 'history';
             INSERT INTO sellers (marketplace_id, seller_id, email, locale, email_opt_in, version)
             SELECT 'history', 'seller-' || g, 'seller-' || g || '@seller.example', 'en', true, 1
               FROM generate_series(1, {sellers}) g;
             INSERT INTO suppressions (channel, destination_digest, reason, digest_version, digest_key)
             SELECT CASE WHEN g % 2 = 0 THEN 'email' ELSE 'sms' END,
                    encode(sha256(('history-' || g)::bytea), 'hex'), 'bounced', 2, 'plans'
               FROM generate_series(1, {sellers} / 10) g;
             ANALYZE;",
            sellers = HISTORY / 5
        ))
        .await?;

    let store = env.store(1)?;
    let mut failures = Vec::new();
    check_plans(&store, "statistics with the intents live", &mut failures).await?;
    // Statistics as a running deployment has them: taken when nearly every intent was
    // terminal (live ones are few and short-lived), then a backlog they have not seen, as
    // after an outage. Autoanalyze is kept away from the table so that it cannot correct
    // them before the plans are taken. Claims by id once scanned every live intent here.
    env.db
        .batch_execute(
            "ALTER TABLE intent_states SET (autovacuum_enabled = false);
             UPDATE intent_states SET state = 'accepted';
             ANALYZE intent_states;
             UPDATE intent_states SET state = 'pending';",
        )
        .await?;
    check_plans(
        &store,
        "statistics taken with every intent terminal, then a backlog",
        &mut failures,
    )
    .await?;
    assert!(
        failures.is_empty(),
        "plan regressions:\n{}",
        failures.join("\n\n")
    );
    env.cleanup().await;
    Ok(())
}

/// Adds to `failures` each hot statement whose plan, under the statistics `when`
/// describes, does not use its index: the plan for the sample values, and for the
/// statements prepared once per connection the generic plan they may settle on after their
/// first executions.
async fn check_plans(store: &herald_store::Store, when: &str, failures: &mut Vec<String>) -> Result<()> {
    for s in HOT_STATEMENTS {
        for &kind in s.plan_kinds() {
            let plan = store.explain(s, kind).await?;
            if let Some(problem) = s.check(&plan) {
                failures.push(format!("{} ({when}, {kind:?} plan): {problem}\n{plan}", s.name));
            }
        }
    }
    Ok(())
}
