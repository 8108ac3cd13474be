//! The dead-letter topic always takes the record, end to end: a message the dead-letter
//! topic refuses whole (over librdkafka's 1,000,000-byte limit, or over the topic's own
//! `max.message.bytes`) is kept as a bounded prefix with the original's size and digest;
//! when even that is refused, as Herald's headers alone. Ingest never stalls on it, and
//! `herald dead-letter replay` refuses to write such records, or any record naming a
//! source topic ingest does not consume.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use integration_tests::kafka::{
    self, end_offsets, large_producer, produce, read_all, set_max_message_bytes, Record,
};
use integration_tests::{wait_for, TestEnv};

const WAIT: Duration = Duration::from_secs(90);
/// The issue's order event: accepted by the source topic, refused by the dead-letter side.
const BIG: usize = 1_040_247;
/// What Herald keeps of a refused value (`herald_kafka::dead_letter::PREFIX_BYTES`).
const PREFIX: usize = 16 * 1024;
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// A JSON order event of exactly `size` bytes.
fn padded_event(order_id: &str, size: usize) -> Vec<u8> {
    let head = format!(r#"{{"event_kind":"order.created","order_id":"{order_id}","pad":""#);
    let mut v = head.into_bytes();
    v.resize(size - 2, b'x');
    v.extend_from_slice(b"\"}");
    v
}

/// The dead letter of `topic`'s message at (partition, offset), once it is there.
async fn dead_letter_of(dlq: &str, topic: &str, (partition, offset): (i32, i64)) -> Result<Record> {
    let (partition, offset) = (partition.to_string(), offset.to_string());
    wait_for(
        &format!("dead letter of {topic}/{partition}@{offset}"),
        WAIT,
        || async {
            Ok(read_all(dlq)?.into_iter().find(|r| {
                r.headers.get("herald-dlq-source-topic").map(String::as_str) == Some(topic)
                    && r.headers.get("herald-dlq-source-partition") == Some(&partition)
                    && r.headers.get("herald-dlq-source-offset") == Some(&offset)
            }))
        },
    )
    .await
}

fn header<'r>(r: &'r Record, name: &str) -> Option<&'r str> {
    r.headers.get(name).map(String::as_str)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_the_topic_refuses_whole_is_kept_bounded_and_never_stalls_ingest() -> Result<()> {
    let env = TestEnv::new("dlq_bounds", "").await?;
    let orders = env.topic("order-events");
    let dlq = env.topic("herald.dead-letter");
    // The source topic takes 2 MB messages; the dead-letter topic 20,000 bytes.
    set_max_message_bytes(&orders, 2_000_000).await?;
    set_max_message_bytes(&dlq, 20_000).await?;
    let _herald = env.spawn_ingest("ingest", &[])?;
    let p = large_producer(2_000_000)?;
    let junk = "j".repeat(50_000);
    let long_tracestate = format!("vendor={}", "t".repeat(600));

    // 1. The issue's event: 1,040,247 bytes (over ingest.max_message_bytes: too_large), and
    //    over librdkafka's own 1,000,000-byte limit with a 50 KB header on top.
    let big = padded_event("big", BIG);
    let big_at = produce(
        &p,
        &orders,
        Some(b"order-big"),
        Some(&big),
        &[("traceparent", TRACEPARENT), ("x-junk", &junk)],
    )
    .await?;
    // 2. A 600 KB key on a value that is not JSON: under librdkafka's limit, over the
    //    topic's, so the broker refuses it.
    let huge_key = vec![b'k'; 600_000];
    let key_at = produce(
        &p,
        &orders,
        Some(&huge_key),
        Some(b"not json"),
        &[
            ("traceparent", TRACEPARENT),
            ("tracestate", &long_tracestate),
            ("x-junk", &junk),
        ],
    )
    .await?;

    let r = dead_letter_of(&dlq, &orders, big_at).await?;
    assert_eq!(header(&r, "herald-dlq-reason"), Some("too_large"));
    assert_eq!(header(&r, "herald-dlq-payload"), Some("prefix"));
    assert_eq!(header(&r, "herald-dlq-original-size"), Some("1040247"));
    let digest = blake3::hash(&big).to_hex().to_string();
    assert_eq!(header(&r, "herald-dlq-original-blake3"), Some(digest.as_str()));
    assert_eq!(
        r.value.as_deref(),
        Some(&big[..PREFIX]),
        "the first 16 KiB of the value"
    );
    assert_eq!(r.key.as_deref(), Some(&b"order-big"[..]), "a short key is kept");
    assert_eq!(header(&r, "traceparent"), Some(TRACEPARENT));
    assert_eq!(header(&r, "x-junk"), None, "other original headers are dropped");
    assert_eq!(
        header(&r, "herald-dlq-consumer-group"),
        Some(env.group("herald-ingest").as_str())
    );

    let r = dead_letter_of(&dlq, &orders, key_at).await?;
    assert_eq!(header(&r, "herald-dlq-payload"), Some("prefix"));
    assert_eq!(header(&r, "herald-dlq-original-size"), Some("8"));
    let digest = blake3::hash(b"not json").to_hex().to_string();
    assert_eq!(header(&r, "herald-dlq-original-blake3"), Some(digest.as_str()));
    assert_eq!(
        r.value.as_deref(),
        Some(&b"not json"[..]),
        "a short value is its own prefix"
    );
    assert_eq!(r.key, None, "a key over 1 KiB is left out, not cut");
    assert_eq!(header(&r, "traceparent"), Some(TRACEPARENT));
    assert_eq!(
        header(&r, "tracestate"),
        None,
        "a tracestate over 512 bytes is dropped"
    );
    assert_eq!(header(&r, "x-junk"), None);

    // 3. A dead-letter topic too small even for the prefix: Herald's headers alone.
    set_max_message_bytes(&dlq, 3_000).await?;
    let second = padded_event("big-2", 200_000);
    let omitted_at = produce(
        &p,
        &orders,
        Some(b"order-big-2"),
        Some(&second),
        &[("x-junk", &junk)],
    )
    .await?;
    let r = dead_letter_of(&dlq, &orders, omitted_at).await?;
    assert_eq!(header(&r, "herald-dlq-payload"), Some("omitted"));
    assert_eq!(header(&r, "herald-dlq-reason"), Some("too_large"));
    assert_eq!(header(&r, "herald-dlq-original-size"), Some("200000"));
    let digest = blake3::hash(&second).to_hex().to_string();
    assert_eq!(header(&r, "herald-dlq-original-blake3"), Some(digest.as_str()));
    assert_eq!((r.key.as_deref(), r.value.as_deref()), (None, None));
    let dlq_headers: BTreeMap<_, _> = r
        .headers
        .iter()
        .filter(|(k, _)| !k.starts_with("herald-dlq-"))
        .collect();
    assert!(dlq_headers.is_empty(), "only Herald's headers: {dlq_headers:?}");

    // Nothing stalled: the ingest group committed past all three.
    env.wait_lag_zero("herald-ingest", &["order-events"]).await?;

    // 4. A record someone wrote to the dead-letter topic naming another source topic.
    set_max_message_bytes(&dlq, 1_000_000).await?;
    produce(
        &kafka::producer()?,
        &dlq,
        Some(b"k"),
        Some(b"{}"),
        &[
            ("herald-dlq-reason", "invalid_json"),
            ("herald-dlq-source-topic", "payments"),
        ],
    )
    .await?;
    let before = end_offsets(&orders)?;
    let out = env.herald_output(&["dead-letter", "replay", "--all"])?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(!out.status.success(), "replay with refusals must fail:\n{stdout}");
    assert!(
        stdout.contains("replayed 0 record(s)") && stdout.contains("refused 4"),
        "{stdout}"
    );
    assert!(
        stdout.contains("\"payments\" is not one Herald's ingest consumes"),
        "{stdout}"
    );
    assert_eq!(stdout.matches("not the whole message").count(), 3, "{stdout}");
    assert_eq!(
        end_offsets(&orders)?,
        before,
        "nothing was written to order-events"
    );
    let listed = env.herald(&["dead-letter", "list", "--json"])?;
    let listed: serde_json::Value = serde_json::from_str(&listed).context("dead-letter list --json")?;
    let forms: Vec<&str> = listed
        .as_array()
        .context("a list")?
        .iter()
        .filter_map(|r| r["payload"].as_str())
        .collect();
    assert_eq!(forms, ["prefix", "prefix", "omitted"]);

    env.cleanup().await;
    Ok(())
}
