//! `BatchConsumer::next_batch` against the local broker (`make stack-up`, 127.0.0.1:19092):
//! a batch stops at its byte bound, keeps the message that would cross it for the next
//! batch, and takes a message larger than the bound alone.

use std::time::Duration;

use herald_kafka::ingest::message_bytes;
use herald_kafka::{BatchConsumer, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};

mod common;
use common::{settings, topic};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_holds_at_most_its_byte_bound_unless_one_message_is_larger() {
    let settings = settings();
    let topic = topic(&settings, "batch-bytes", vec![]).await;
    let producer: FutureProducer = settings.producer().create().unwrap();
    // Key + value sizes: 300 KB three times, 800 KB, 100 KB; the bound is 700 KB.
    let sizes = [300_000, 300_000, 300_000, 800_000, 100_000];
    for (n, size) in sizes.iter().enumerate() {
        let key = format!("k{n}");
        let value = vec![b'v'; size - key.len()];
        let record: FutureRecord<'_, str, [u8]> =
            FutureRecord::to(&topic).key(key.as_str()).payload(&value[..]);
        producer
            .send(record, Duration::from_secs(30))
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }
    let consumer = BatchConsumer::subscribe(&settings, &format!("g-{topic}"), &[&topic], 4096).unwrap();
    let mut batches = Vec::new();
    let mut seen = 0;
    while seen < sizes.len() {
        let batch = tokio::time::timeout(
            Duration::from_secs(60),
            consumer.next_batch(100, 700_000, Duration::from_secs(3)),
        )
        .await
        .expect("a batch within 60 s")
        .unwrap();
        seen += batch.len();
        batches.push(batch);
    }
    let shape: Vec<Vec<usize>> = batches
        .iter()
        .map(|b| b.iter().map(message_bytes).collect())
        .collect();
    assert_eq!(
        shape,
        vec![
            vec![300_000, 300_000],
            vec![300_000],
            vec![800_000],
            vec![100_000]
        ],
        "bytes per message, per batch"
    );
    let offsets: Vec<i64> = batches.iter().flatten().map(|m| m.offset()).collect();
    assert_eq!(
        offsets,
        vec![0, 1, 2, 3, 4],
        "nothing lost or reordered by the carry-over"
    );
}
