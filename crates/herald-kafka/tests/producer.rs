//! `AckedProducer` against the local broker (`make stack-up`, 127.0.0.1:19092): a send
//! returns once the broker holds the record, with its key, value and headers; a record
//! the client or the broker refuses is an error with librdkafka's code. The delivery
//! thread's end is in `producer_thread.rs` (it counts the process's threads).

use std::time::Duration;

use herald_kafka::producer::AckedProducer;
use herald_kafka::{BatchConsumer, Message};
use rdkafka::error::KafkaError as RdKafkaError;
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::types::RDKafkaErrorCode;

mod common;
use common::{settings, topic};

/// `send`, failing the test instead of hanging if no answer comes.
async fn answer(
    producer: &AckedProducer,
    topic: &str,
    key: Option<&[u8]>,
    payload: Option<&[u8]>,
    headers: OwnedHeaders,
) -> Result<(), RdKafkaError> {
    tokio::time::timeout(
        Duration::from_secs(60),
        producer.send(topic, key, payload, headers),
    )
    .await
    .expect("an answer within 60 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_record_is_on_the_topic_as_it_was_sent() {
    let settings = settings();
    let topic = topic(&settings, "producer", vec![]).await;
    let producer = AckedProducer::create(&settings.producer(), settings.hooks()).unwrap();
    let headers = OwnedHeaders::new().insert(Header {
        key: "traceparent",
        value: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    });
    answer(&producer, &topic, Some(b"the-key"), Some(b"the-value"), headers)
        .await
        .expect("acknowledged");
    answer(&producer, &topic, None, None, OwnedHeaders::new())
        .await
        .expect("a record without key or value is acknowledged too");

    let consumer = BatchConsumer::subscribe(&settings, &format!("g-{topic}"), &[&topic], 1024).unwrap();
    let mut got = Vec::new();
    while got.len() < 2 {
        let batch = tokio::time::timeout(
            Duration::from_secs(60),
            consumer.next_batch(10, 1 << 20, Duration::from_secs(1)),
        )
        .await
        .expect("both records within 60 s")
        .unwrap();
        got.extend(batch);
    }
    let first = &got[0];
    assert_eq!(first.key(), Some(&b"the-key"[..]));
    assert_eq!(first.payload(), Some(&b"the-value"[..]));
    let h = first.headers().expect("headers");
    assert_eq!(
        (h.count(), h.get(0).key, h.get(0).value),
        (
            1,
            "traceparent",
            Some(&b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"[..])
        )
    );
    assert_eq!((got[1].key(), got[1].payload()), (None, None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_record_is_an_error_with_its_code() {
    let settings = settings();
    // The broker refuses records over 2,000 bytes on this topic: the refusal comes back in
    // the delivery report.
    let topic = topic(
        &settings,
        "producer",
        vec![("max.message.bytes".into(), "2000".into())],
    )
    .await;
    let producer = AckedProducer::create(&settings.producer(), settings.hooks()).unwrap();
    let big = vec![b'x'; 10_000];
    let refused = answer(&producer, &topic, None, Some(&big), OwnedHeaders::new())
        .await
        .expect_err("refused by the broker");
    assert_eq!(
        refused,
        RdKafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge)
    );
    // Over the client's own message.max.bytes (1,000,000): refused before it is queued.
    let huge = vec![b'x'; 1_100_000];
    let refused = answer(&producer, &topic, None, Some(&huge), OwnedHeaders::new())
        .await
        .expect_err("refused by the client");
    assert_eq!(
        refused,
        RdKafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge)
    );
    // The producer still works after a refusal.
    answer(&producer, &topic, None, Some(b"small"), OwnedHeaders::new())
        .await
        .expect("acknowledged");
}

/// A client in librdkafka's fatal state refuses every new record and throws its queue
/// away, and librdkafka never brings it back: the sends that meet it replace the client
/// once between them, each gets an answer, and the next send is acknowledged. The state
/// is raised with librdkafka's own testing call (`fault-injection`, on in the failpoints
/// build `make test` uses).
#[cfg(feature = "fault-injection")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_in_librdkafkas_fatal_state_is_replaced_once_and_the_next_send_acknowledged() {
    let settings = settings();
    let topic = topic(&settings, "producer-fatal", vec![]).await;
    // A long linger keeps both records queued in the client when the fatal state comes.
    let mut config = settings.producer();
    config.set("linger.ms", "2000");
    let producer = AckedProducer::create(&config, settings.hooks()).unwrap();
    let clone = producer.clone();
    // `biased`: polled in order, so both records are queued before the third branch runs.
    let (a, b, took) = tokio::join!(
        biased;
        answer(&producer, &topic, None, Some(b"queued-1"), OwnedHeaders::new()),
        answer(&clone, &topic, None, Some(b"queued-2"), OwnedHeaders::new()),
        async { producer.raise_fatal_error("a test") },
    );
    assert!(took, "librdkafka took the fatal error");
    for answer in [a, b] {
        let e = answer.expect_err("a queued record of the fatal client is refused");
        assert!(
            matches!(
                e,
                RdKafkaError::MessageProduction(RDKafkaErrorCode::PurgeQueue | RDKafkaErrorCode::Fatal)
            ),
            "{e:?}"
        );
    }
    assert_eq!(producer.renewals(), 1, "replaced once, for both sends");
    answer(&clone, &topic, None, Some(b"after"), OwnedHeaders::new())
        .await
        .expect("the new client's send is acknowledged");
    assert_eq!(producer.renewals(), 1, "a healthy client is kept");
}
