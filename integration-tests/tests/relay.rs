//! The relay, end to end: every outbox row reaches `herald.deliveries` keyed by its intent
//! id, rows are deleted only after the broker acknowledged, and a crash between the two
//! republishes rather than loses.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Result;
use integration_tests::kafka::{produce, producer, read_all, Record};
use integration_tests::samples::{opted_in_seller, order_event};
use integration_tests::{wait_for, TestEnv};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// Seeds one opted-in seller and `orders` order events (the first with a traceparent), and
/// waits until ingest created both channels' intents and outbox rows.
async fn seed_orders(env: &TestEnv, orders: usize) -> Result<()> {
    let p = producer()?;
    let seller = opted_in_seller("acme", "seller-1", "en");
    produce(
        &p,
        &env.topic("seller-profiles"),
        Some(&seller.key()),
        Some(&seller.value()),
        &[],
    )
    .await?;
    env.wait_count("seller stored", "SELECT count(*) FROM sellers", 1, WAIT)
        .await?;
    for n in 0..orders {
        let value = order_event(
            &format!("evt-{n}"),
            "order.created",
            "acme",
            &format!("{n}"),
            "seller-1",
            "1.00",
        );
        let headers: &[(&str, &str)] = if n == 0 {
            &[("traceparent", TRACEPARENT)]
        } else {
            &[]
        };
        produce(
            &p,
            &env.topic("order-events"),
            Some(format!("{n}").as_bytes()),
            Some(&value),
            headers,
        )
        .await?;
    }
    let intents = (orders * 2) as i64;
    env.wait_count(
        "intents created",
        "SELECT count(*) FROM notification_intents",
        intents,
        WAIT,
    )
    .await
}

/// Intent id -> the messages on herald.deliveries carrying it.
fn deliveries_by_intent(env: &TestEnv) -> Result<BTreeMap<String, Vec<Record>>> {
    let mut by_intent: BTreeMap<String, Vec<Record>> = BTreeMap::new();
    for r in read_all(&env.topic("herald.deliveries"))? {
        let key = String::from_utf8(r.key.clone().unwrap_or_default())?;
        by_intent.entry(key).or_default().push(r);
    }
    Ok(by_intent)
}

async fn pending_intent_ids(env: &TestEnv) -> Result<BTreeSet<String>> {
    Ok(env
        .db
        .query(
            "SELECT id::text FROM notification_intents WHERE state = 'pending'",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_publish_every_outbox_row_keyed_by_intent_and_delete_it() -> Result<()> {
    let env = TestEnv::new("relay", "").await?;
    let _ingest = env.spawn_ingest("ingest", &[])?;
    seed_orders(&env, 60).await?;
    env.wait_count("outbox rows queued", "SELECT count(*) FROM outbox", 120, WAIT)
        .await?;
    assert_eq!(
        env.count("SELECT count(*) FROM outbox WHERE channel IS NULL")
            .await?,
        0,
        "ingest writes each outbox row with its intent's channel (V14)"
    );
    // Rows as a Herald older than V14 queued them (a rolling upgrade): no channel.
    let cleared = env
        .db
        .execute(
            "UPDATE outbox SET channel = NULL
              WHERE intent_id IN (SELECT id FROM intent_contents WHERE order_id IN ('0', '1', '2'))",
            &[],
        )
        .await?;
    assert_eq!(cleared, 6, "three orders' rows, both channels");
    let mut r1 = env.spawn_roles("relay", "relay-1", &[("HERALD_RELAY__BATCH_SIZE", "16")])?;
    let mut r2 = env.spawn_roles("relay", "relay-2", &[("HERALD_RELAY__BATCH_SIZE", "16")])?;
    env.wait_count("outbox drained", "SELECT count(*) FROM outbox", 0, WAIT)
        .await?;

    let expected = pending_intent_ids(&env).await?;
    assert_eq!(expected.len(), 120);
    let published = deliveries_by_intent(&env)?;
    let keys: BTreeSet<String> = published.keys().cloned().collect();
    assert_eq!(
        keys, expected,
        "every intent published, keyed by its id, nothing else"
    );
    for (id, records) in &published {
        for r in records {
            assert_eq!(r.value.as_deref(), Some(id.as_bytes()), "value is the intent id");
        }
    }
    // Each message names its intent's channel, read from the intent for the rows that
    // carried none.
    let channels: BTreeMap<String, String> = env
        .db
        .query("SELECT id::text, channel FROM notification_intents", &[])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    for (id, records) in &published {
        let header = records[0].headers.get("herald-channel");
        assert_eq!(header, channels.get(id), "the channel header of {id}");
    }
    // The order event's trace context travels through the outbox into the headers.
    let traced: Vec<String> = env
        .db
        .query(
            "SELECT id::text FROM notification_intents WHERE trace_context = $1",
            &[&TRACEPARENT],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(traced.len(), 2);
    for id in &traced {
        assert_eq!(
            published[id][0].headers.get("traceparent").map(String::as_str),
            Some(TRACEPARENT)
        );
    }

    // Woken by LISTEN/NOTIFY: a new order is relayed while both relays idle.
    let p = producer()?;
    let value = order_event("evt-late", "order.created", "acme", "late", "seller-1", "1.00");
    produce(&p, &env.topic("order-events"), Some(b"late"), Some(&value), &[]).await?;
    wait_for("late order relayed", WAIT, || async {
        let n = env
            .count("SELECT count(*) FROM notification_intents WHERE order_id = 'late'")
            .await?;
        let left = env.count("SELECT count(*) FROM outbox").await?;
        Ok((n == 2 && left == 0).then_some(()))
    })
    .await?;
    assert!(r1.terminate(WAIT).await?.success());
    assert!(r2.terminate(WAIT).await?.success());
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_killed_after_publish_before_delete_republishes_and_loses_nothing() -> Result<()> {
    let env = TestEnv::new("relaycrash", "").await?;
    let _ingest = env.spawn_ingest("ingest", &[])?;
    seed_orders(&env, 10).await?;
    let mut crashing = env.spawn_roles(
        "relay",
        "relay-1",
        &[
            ("FAILPOINTS", "relay-after-publish=sleep(600000)"),
            ("HERALD_RELAY__BATCH_SIZE", "8"),
        ],
    )?;
    // The first round's 8 messages are acknowledged; the process hangs before the delete.
    wait_for("first round published", WAIT, || async {
        Ok((deliveries_by_intent(&env)?.len() >= 8).then_some(()))
    })
    .await?;
    crashing.kill()?;
    assert_eq!(
        env.count("SELECT count(*) FROM outbox").await?,
        20,
        "nothing deleted before the commit"
    );

    let _relay = env.spawn_roles("relay", "relay-2", &[])?;
    env.wait_count("outbox drained", "SELECT count(*) FROM outbox", 0, WAIT)
        .await?;
    let published = deliveries_by_intent(&env)?;
    let keys: BTreeSet<String> = published.keys().cloned().collect();
    assert_eq!(keys, pending_intent_ids(&env).await?, "no intent lost");
    let twice = published.values().filter(|r| r.len() == 2).count();
    assert_eq!(
        twice, 8,
        "the crashed round's messages were published again, the rest once"
    );
    env.cleanup().await;
    Ok(())
}

/// An idempotent producer in librdkafka's fatal state (a broker restart that leaves its
/// sequence numbers out of step with the broker's can put it there) refuses every record
/// from then on, and librdkafka never brings it back. The failpoint puts the relay's
/// producer there before each of its first three rounds (one row each) publishes: each
/// time the row stays, the client is replaced, and the round fails and is retried after a
/// growing pause (not at once, which would spin); in the end every row is published, each
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_in_librdkafkas_fatal_state_is_replaced_and_every_row_published() -> Result<()> {
    let env = TestEnv::new("relayfatal", "").await?;
    let _ingest = env.spawn_ingest("ingest", &[])?;
    seed_orders(&env, 10).await?;
    let mut relay = env.spawn_roles(
        "relay",
        "relay-1",
        &[
            ("FAILPOINTS", "relay-producer-fatal=3*return"),
            ("HERALD_RELAY__BATCH_SIZE", "1"),
        ],
    )?;
    env.wait_count("outbox drained", "SELECT count(*) FROM outbox", 0, WAIT)
        .await?;
    let published = deliveries_by_intent(&env)?;
    let keys: BTreeSet<String> = published.keys().cloned().collect();
    assert_eq!(keys, pending_intent_ids(&env).await?, "every intent published");
    assert!(
        published.values().all(|r| r.len() == 1),
        "the refused round's records never reached the broker: each message once"
    );
    let log = relay.log();
    // Each of the three rounds meets the fatal state with its only send, which replaces
    // the client; the round fails as transient and is retried after a pause that grows with
    // each failure in a row.
    let retried: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["message"] == "transient failure; retrying" && v["stage"] == "relay")
        .filter(|v| v["class"] == "producer_fatal")
        .collect();
    let retries: Vec<(i64, i64)> = retried
        .iter()
        .map(|v| {
            (
                v["retry"].as_i64().unwrap_or(0),
                v["retry_in_ms"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        retries.iter().map(|r| r.0).collect::<Vec<_>>(),
        [1, 2, 3],
        "three failed rounds in a row:\n{log}"
    );
    assert!(
        retries.iter().all(|r| r.1 > 0),
        "each retried after a pause: {retries:?}"
    );
    for v in &retried {
        let error = v["error"].as_str().unwrap_or_default();
        assert!(
            error.contains("1 of 1 delivery messages not acknowledged; they stay in the outbox"),
            "the round's failure says what stayed and why: {error}"
        );
    }
    let replaced: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("fatal state: replaced by a new client"))
        .collect();
    assert_eq!(
        replaced.len(),
        3,
        "the client replaced at each fatal state:\n{log}"
    );
    assert!(
        replaced
            .iter()
            .all(|l| l.contains("failpoint relay-producer-fatal")),
        "with librdkafka's reason: {replaced:?}"
    );
    assert!(relay.terminate(WAIT).await?.success());
    env.cleanup().await;
    Ok(())
}
