//! The producer's delivery thread ends with the last clone of the producer. A test binary
//! of its own: it counts the process's threads by name, which another test creating a
//! producer at the same time would disturb. Needs the local broker (`make stack-up`).

use std::time::{Duration, Instant};

use herald_kafka::producer::AckedProducer;
use rdkafka::message::OwnedHeaders;

mod common;
use common::{settings, topic};

/// Threads of this process named like the producer's delivery thread.
fn delivery_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim_end() == "herald-producer")
        .count()
}

/// Waits up to 10 s for `want` delivery threads; returns the last count.
async fn settle_at(want: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = delivery_threads();
        if now == want || Instant::now() > deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delivery_thread_ends_with_the_last_clone() {
    let settings = settings();
    assert_eq!(delivery_threads(), 0);
    let producer = AckedProducer::create(&settings.producer()).unwrap();
    let clone = producer.clone();
    // The thread names itself once it runs.
    assert_eq!(
        settle_at(1).await,
        1,
        "one thread for the producer and its clones"
    );
    drop(producer);
    // The clone still sends: the thread serves its delivery reports.
    let topic = topic(&settings, "producer-thread", vec![]).await;
    clone
        .send(&topic, None, Some(b"x"), OwnedHeaders::new())
        .await
        .expect("acknowledged");
    assert_eq!(delivery_threads(), 1, "the thread outlives a clone");
    drop(clone);
    assert_eq!(settle_at(0).await, 0, "the thread ended after the last clone");
}
