//! What the tests against the local broker (`make stack-up`, 127.0.0.1:19092) share.

use herald_kafka::admin::{ensure_topics, TopicSpec};
use herald_kafka::KafkaSettings;

pub fn settings() -> KafkaSettings {
    KafkaSettings::plaintext("127.0.0.1:19092", "herald-kafka-test")
}

/// A fresh one-partition topic named `it-PREFIX-` and a uuid, with `config`.
pub async fn topic(settings: &KafkaSettings, prefix: &str, config: Vec<(String, String)>) -> String {
    let name = format!("it-{prefix}-{}", uuid::Uuid::new_v4().simple());
    ensure_topics(
        settings,
        &[TopicSpec {
            name: name.clone(),
            partitions: 1,
            replication: 1,
            config,
        }],
    )
    .await
    .expect("creating the topic (is the local stack up? `make stack-up`)");
    name
}
