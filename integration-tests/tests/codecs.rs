//! What producers send, as they send it (issue 41): order events compressed with every
//! codec a Kafka producer may use (none, gzip, snappy, lz4, zstd), each followed on the same
//! partition by an uncompressed healthy order; and record batches librdkafka cannot decode
//! (a corrupt compressed batch, a codec no Kafka version defines yet), which must not
//! stall their partition: their offsets are dead-lettered as a run, the orders behind them
//! are delivered, and the committed offset passes them.
//!
//! The codecs are checked on the broker's own log (`integration_tests::segments`): each
//! event's batch carries the codec the test asked for, so a producer that quietly sent it
//! uncompressed (librdkafka does when compression does not shrink a batch) cannot pass.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use futures::future::join_all;
use herald_kafka::headers::{
    DLQ_DETAIL, DLQ_REASON, DLQ_SOURCE_OFFSET, DLQ_SOURCE_OFFSET_END, DLQ_SOURCE_PARTITION, DLQ_SOURCE_TOPIC,
};
use integration_tests::kafka::{committed_offset, produce_to, producer, producer_with, read_all};
use integration_tests::moto::{emails_to, sms_to};
use integration_tests::samples::{order_event, UniqueSeller};
use integration_tests::segments::{batch_of, codec_name, corrupt_compressed_records, set_codec, Batch};
use integration_tests::{publish_sellers, wait_for, HeraldProcess, TestEnv};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(90);
const SELLER: &str = "seller-1";
const CODECS: [(&str, u8); 5] = [("none", 0), ("gzip", 1), ("snappy", 2), ("lz4", 3), ("zstd", 4)];

/// An order event that compresses well (the sample event with a long repeated note), so
/// that every codec shrinks its batch and the producer sends it compressed.
fn order(order_id: &str) -> Vec<u8> {
    let sample = order_event(
        &format!("evt-{order_id}"),
        "order.created",
        "acme",
        order_id,
        SELLER,
        "12.00",
    );
    let mut event: serde_json::Value = serde_json::from_slice(&sample).expect("the sample event is JSON");
    event["order"]["note"] = json!("gift wrap, leave at the door. ".repeat(40));
    event.to_string().into_bytes()
}

/// Produces `order_id` to partition 0 of the env's `order-events`; its offset.
async fn send(env: &TestEnv, p: &FutureProducer, order_id: &str) -> Result<i64> {
    let (_, offset) = produce_to(
        p,
        &env.topic("order-events"),
        Some(0),
        Some(order_id.as_bytes()),
        Some(&order(order_id)),
        &[],
    )
    .await?;
    Ok(offset)
}

/// Produces the orders together, as one batch compressed with `codec`; the batch.
async fn send_batch(env: &TestEnv, codec: &str, orders: &[String]) -> Result<Batch> {
    let p = producer_with(&[("compression.type", codec), ("linger.ms", "500")])?;
    let topic = env.topic("order-events");
    let values: Vec<Vec<u8>> = orders.iter().map(|o| order(o)).collect();
    let sends = orders.iter().zip(&values).map(|(o, v)| {
        let record: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(&topic).partition(0).key(o.as_bytes()).payload(v);
        p.send(record, Duration::from_secs(30))
    });
    let mut offsets = Vec::new();
    for sent in join_all(sends).await {
        offsets.push(sent.map_err(|(e, _)| e).context("producing the batch")?.offset);
    }
    let batch = batch_of(&topic, 0, offsets[0])?;
    ensure!(
        offsets
            .iter()
            .all(|o| (batch.base_offset..=batch.last_offset).contains(o)),
        "the {} orders went out in one batch: {offsets:?} against {batch:?}",
        orders.len()
    );
    Ok(batch)
}

/// Waits until each order has its two intents accepted, and checks the provider received
/// one e-mail and one SMS for each.
async fn expect_delivered(env: &TestEnv, seller: &UniqueSeller, orders: &[String]) -> Result<()> {
    let list = orders
        .iter()
        .map(|o| format!("'{o}'"))
        .collect::<Vec<_>>()
        .join(",");
    env.wait_count(
        "every order accepted on both channels",
        &format!(
            "SELECT count(*) FROM notification_intents WHERE order_id IN ({list}) AND state = 'accepted'"
        ),
        2 * orders.len() as i64,
        WAIT,
    )
    .await?;
    let emails = emails_to(&seller.email).await?;
    let sms = sms_to(&seller.phone).await?;
    for o in orders {
        let subject = format!("New order {o} on acme");
        let text = format!("New order {o}:");
        let e = emails.iter().filter(|m| m["subject"] == subject.as_str()).count();
        let s = sms
            .iter()
            .filter(|m| m["message"].as_str().is_some_and(|t| t.starts_with(&text)))
            .count();
        ensure!(
            (e, s) == (1, 1),
            "order {o}: {e} e-mails and {s} SMS, one of each expected"
        );
    }
    Ok(())
}

/// Waits until the ingest group's committed offset on partition 0 is past `offset`.
async fn expect_committed_past(env: &TestEnv, offset: i64) -> Result<()> {
    let (group, topic) = (env.group("herald-ingest"), env.topic("order-events"));
    wait_for("the committed offset past the last order", WAIT, || async {
        Ok(committed_offset(&group, &topic, 0)?
            .filter(|c| *c > offset)
            .map(|_| ()))
    })
    .await
}

async fn start(env: &TestEnv) -> Result<HeraldProcess> {
    env.spawn_roles("ingest,relay,deliver", "herald", &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_codec_a_producer_uses_is_read_and_the_orders_behind_each_delivered() -> Result<()> {
    let env = TestEnv::new("codecs", "").await?;
    let mut herald = start(&env).await?;
    let seller = UniqueSeller::new();
    publish_sellers(&env, &[seller.profile(SELLER)]).await?;
    let healthy = producer()?;
    let topic = env.topic("order-events");
    let mut orders = Vec::new();
    let mut last = 0;
    for (codec, id) in CODECS {
        let compressed = format!("c{id}{codec}");
        let p = producer_with(&[("compression.type", codec)])?;
        let offset = send(&env, &p, &compressed).await?;
        let batch = batch_of(&topic, 0, offset)?;
        ensure!(
            batch.codec == id,
            "order {compressed} reached the broker as {}, not {codec}",
            codec_name(batch.codec)
        );
        let behind = format!("h{id}{codec}");
        last = send(&env, &healthy, &behind).await?;
        orders.extend([compressed, behind]);
    }
    expect_delivered(&env, &seller, &orders).await?;
    expect_committed_past(&env, last).await?;
    ensure!(
        read_all(&env.topic("herald.dead-letter"))?.is_empty(),
        "nothing dead-lettered"
    );
    ensure!(herald.terminate(WAIT).await?.success(), "SIGTERM exits 0");
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_batch_that_cannot_be_decoded_is_dead_lettered_and_its_partition_moves_on() -> Result<()> {
    let env = TestEnv::new("undecodable", "").await?;
    let seller = UniqueSeller::new();
    let healthy = producer()?;
    // A first order delivered: the group has consumed and committed up to here.
    let mut herald = start(&env).await?;
    publish_sellers(&env, &[seller.profile(SELLER)]).await?;
    let first = send(&env, &healthy, "u-first").await?;
    expect_delivered(&env, &seller, &["u-first".to_owned()]).await?;
    expect_committed_past(&env, first).await?;
    ensure!(herald.terminate(WAIT).await?.success(), "SIGTERM exits 0");

    // While no consumer runs: a gzip batch of 6 orders whose compressed stream is then
    // corrupted, a healthy order, an lz4 batch of 3 whose codec bits then name codec 5
    // (none yet: what a codec added after this build looks like), another healthy order.
    // Six, so that the search for the first batch's end reads (1, 2, 4, 8 after its start)
    // into the second batch, past the healthy order between them: that order must not be
    // taken for part of the first (canary: a search on "the read fails" alone skipped it).
    let corrupt: Vec<String> = (0..6).map(|i| format!("u-gzip-{i}")).collect();
    let future: Vec<String> = (0..3).map(|i| format!("u-codec5-{i}")).collect();
    let bad_gzip = send_batch(&env, "gzip", &corrupt).await?;
    send(&env, &healthy, "u-behind-gzip").await?;
    let bad_codec = send_batch(&env, "lz4", &future).await?;
    let last = send(&env, &healthy, "u-behind-codec5").await?;
    corrupt_compressed_records(&bad_gzip)?;
    set_codec(&bad_codec, 5)?;

    let mut herald = start(&env).await?;
    expect_delivered(
        &env,
        &seller,
        &["u-behind-gzip".to_owned(), "u-behind-codec5".to_owned()],
    )
    .await?;
    expect_committed_past(&env, last).await?;

    // One dead letter per run, naming its offsets and librdkafka's reason.
    let topic = env.topic("order-events");
    let letters = wait_for("both runs dead-lettered", WAIT, || async {
        let l = read_all(&env.topic("herald.dead-letter"))?;
        Ok((l.len() >= 2).then_some(l))
    })
    .await?;
    ensure!(
        letters.len() == 2,
        "two dead letters: {:?}",
        letters.iter().map(|l| &l.headers).collect::<Vec<_>>()
    );
    for (letter, batch, code) in [
        (&letters[0], &bad_gzip, "BadCompression"),
        (&letters[1], &bad_codec, "NotImplemented"),
    ] {
        let h = |k: &str| letter.headers.get(k).cloned().unwrap_or_default();
        ensure!(h(DLQ_REASON) == "undecodable", "reason: {:?}", letter.headers);
        ensure!(
            h(DLQ_SOURCE_TOPIC) == topic && h(DLQ_SOURCE_PARTITION) == "0",
            "{:?}",
            letter.headers
        );
        ensure!(
            h(DLQ_SOURCE_OFFSET) == batch.base_offset.to_string()
                && h(DLQ_SOURCE_OFFSET_END) == (batch.last_offset + 1).to_string(),
            "the run is the batch {}..={}: {:?}",
            batch.base_offset,
            batch.last_offset,
            letter.headers
        );
        ensure!(
            h(DLQ_DETAIL).contains(code),
            "librdkafka's reason {code}: {}",
            h(DLQ_DETAIL)
        );
        ensure!(
            letter.value.is_none() && letter.key.is_none(),
            "a run carries no record"
        );
    }
    // The undecodable orders made nothing, and were never half-read.
    let none = env
        .count("SELECT count(*) FROM notification_intents WHERE order_id LIKE 'u-gzip-%' OR order_id LIKE 'u-codec5-%'")
        .await?;
    ensure!(none == 0, "{none} intents from undecodable batches");
    ensure!(
        herald.log().contains("record batch librdkafka cannot decode"),
        "the skip is logged"
    );
    ensure!(herald.terminate(WAIT).await?.success(), "SIGTERM exits 0");
    env.cleanup().await;
    Ok(())
}

/// A batch of Herald's own deliveries topic that cannot be decoded (one corrupted on the
/// broker's disk): the delivery consumer moves past it, the intents whose messages it held
/// are queued again by the relay's stranded-intent check, and every order is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_deliveries_batch_is_passed_and_its_intents_queued_again() -> Result<()> {
    let env = TestEnv::new("undecodable_deliveries", "").await?;
    let seller = UniqueSeller::new();
    let healthy = producer()?;
    // The relay's check finds intents due without an outbox row after 15 s.
    let relay_vars = [
        ("HERALD_RELAY__STRANDED_GRACE_SECS", "15"),
        ("HERALD_RELAY__STRANDED_CHECK_SECS", "2"),
    ];
    let mut feed = env.spawn_roles("ingest,relay", "feed", &relay_vars)?;
    publish_sellers(&env, &[seller.profile(SELLER)]).await?;
    let orders: Vec<String> = (0..6).map(|i| format!("d-{i}")).collect();
    for o in &orders {
        send(&env, &healthy, o).await?;
    }
    env.wait_count(
        "every intent created",
        "SELECT count(*) FROM notification_intents",
        12,
        WAIT,
    )
    .await?;
    env.wait_count("the outbox published", "SELECT count(*) FROM outbox", 0, WAIT)
        .await?;
    // The first batch of partition 0 of the deliveries topic, made undecodable.
    let deliveries = env.topic("herald.deliveries");
    let batch = integration_tests::segments::batches(&deliveries, 0)?
        .into_iter()
        .next()
        .context("a batch on the deliveries topic's partition 0")?;
    set_codec(&batch, 5)?;
    let mut deliver = env.spawn_roles("deliver", "deliver", &[])?;
    expect_delivered(&env, &seller, &orders).await?;
    env.wait_lag_zero("herald-delivery", &["herald.deliveries"])
        .await?;
    ensure!(
        deliver
            .log()
            .contains("deliveries record batch librdkafka cannot decode: moved past it"),
        "the skip is logged: {}",
        deliver.log()
    );
    ensure!(
        feed.log().contains("intents due without an outbox row"),
        "the skipped intents were queued again"
    );
    ensure!(deliver.terminate(WAIT).await?.success(), "SIGTERM exits 0");
    ensure!(feed.terminate(WAIT).await?.success(), "SIGTERM exits 0");
    env.cleanup().await;
    Ok(())
}
