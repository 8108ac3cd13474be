//! The relay's side of `herald.deliveries`: every message produced and awaited until the
//! broker acknowledged it, so that only acknowledged rows leave the outbox.

use futures::future::join_all;

use crate::deliveries::DeliveryMessage;
use crate::producer::AckedProducer;
use crate::{KafkaSettings, Result};

#[derive(Clone)]
pub struct DeliveryPublisher {
    producer: AckedProducer,
    topic: String,
}

impl DeliveryPublisher {
    pub fn new(settings: &KafkaSettings, topic: &str) -> Result<Self> {
        Ok(Self {
            producer: AckedProducer::create(&settings.producer(), settings.hooks())?,
            topic: topic.to_owned(),
        })
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// See [`AckedProducer::raise_fatal_error`]; for the failpoints build only.
    #[cfg(feature = "fault-injection")]
    pub fn raise_fatal_error(&self, reason: &str) -> bool {
        self.producer.raise_fatal_error(reason)
    }

    /// Produces every message and waits for each acknowledgement. Returns, per message,
    /// the broker's answer: only the acknowledged may be removed from the outbox.
    pub async fn publish_all(&self, messages: &[DeliveryMessage]) -> Vec<Result<()>> {
        let sends = messages.iter().map(|m| async move {
            let (id, headers) = m.encode();
            let id = Some(id.as_bytes());
            Ok(self.producer.send(&self.topic, id, id, headers).await?)
        });
        join_all(sends).await
    }
}
