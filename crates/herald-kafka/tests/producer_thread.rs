//! The producer's delivery thread ends with the last clone of the producer, and destroys
//! the client on its way out; `wait_for_closed` waits for that. A test binary of its own:
//! it counts the process's threads by name, which another test creating a client at the
//! same time would disturb. Needs the local broker (`make stack-up`).

use std::time::{Duration, Instant};

use herald_kafka::producer::{wait_for_closed, AckedProducer};
use rdkafka::message::OwnedHeaders;

mod common;
use common::{settings, topic};

/// Threads of this process whose name `is`.
fn threads(is: fn(&str) -> bool) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| is(name.trim_end()))
        .count()
}

/// The producer's delivery thread.
fn delivery(name: &str) -> bool {
    name == "herald-producer"
}

/// librdkafka's own threads (`rdk:main`, `rdk:broker1`, ...), of any client.
fn librdkafka(name: &str) -> bool {
    name.starts_with("rdk:")
}

/// Waits up to 10 s for `want` threads whose name `is`; returns the last count.
async fn settle_at(is: fn(&str) -> bool, want: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = threads(is);
        if now == want || Instant::now() > deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_closes_after_the_last_clone_and_the_exit_can_wait_for_it() {
    let settings = settings();
    let topic = topic(&settings, "producer-thread", vec![]).await;
    // The topic's admin client is gone with its threads.
    assert_eq!(settle_at(librdkafka, 0).await, 0, "no client before the producer");
    let producer = AckedProducer::create(&settings.producer(), settings.hooks()).unwrap();
    let clone = producer.clone();
    // The thread names itself once it runs.
    assert_eq!(
        settle_at(delivery, 1).await,
        1,
        "one thread for the producer and its clones"
    );
    drop(producer);
    // The clone still sends: the thread serves its delivery reports.
    tokio::time::timeout(
        Duration::from_secs(60),
        clone.send(&topic, None, Some(b"x"), OwnedHeaders::new()),
    )
    .await
    .expect("an answer within 60 s")
    .expect("acknowledged");
    assert_eq!(threads(delivery), 1, "the thread outlives a clone");
    assert!(threads(librdkafka) > 0, "the client runs");
    drop(clone);
    let left = tokio::task::spawn_blocking(|| wait_for_closed(Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(left, 0, "every delivery thread finished within the limit");
    // Joined, so already gone: the delivery thread, and the client it destroyed.
    assert_eq!(threads(delivery), 0, "the delivery thread ended");
    assert_eq!(
        threads(librdkafka),
        0,
        "librdkafka's threads ended with the client"
    );
}
