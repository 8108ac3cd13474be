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
            producer: AckedProducer::create(&settings.producer())?,
            topic: topic.to_owned(),
        })
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Produces every message and waits for each acknowledgement. Returns, per message,
    /// whether the broker acknowledged it: only those may be removed from the outbox.
    pub async fn publish_all(&self, messages: &[DeliveryMessage]) -> Vec<bool> {
        let sends = messages.iter().map(|m| async move {
            let (id, headers) = m.encode();
            let id = Some(id.as_bytes());
            match self.producer.send(&self.topic, id, id, headers).await {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(error = %e, intent_id = %m.intent_id, "delivery message not acknowledged; it stays in the outbox");
                    false
                }
            }
        });
        join_all(sends).await
    }
}
