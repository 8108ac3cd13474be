//! The relay's side of `herald.deliveries`: every message produced and awaited until the
//! broker acknowledged it, so that only acknowledged rows leave the outbox.

use std::time::Duration;

use crate::deliveries::DeliveryMessage;
use crate::producer::AckedProducer;
use crate::{KafkaSettings, Result};

#[derive(Clone)]
pub struct DeliveryPublisher {
    producer: AckedProducer,
    topic: String,
    message_timeout: Duration,
}

impl DeliveryPublisher {
    pub fn new(settings: &KafkaSettings, topic: &str) -> Result<Self> {
        let config = settings.producer();
        let message_timeout = config
            .get("message.timeout.ms")
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(Duration::from_secs(300), Duration::from_millis);
        Ok(Self {
            producer: AckedProducer::create(&config, settings.hooks())?,
            topic: topic.to_owned(),
            message_timeout,
        })
    }

    /// The longest a message waits for the broker's answer (`message.timeout.ms`): past
    /// it, librdkafka fails it.
    pub fn message_timeout(&self) -> Duration {
        self.message_timeout
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// See [`AckedProducer::raise_fatal_error`]; for the failpoints build only.
    #[cfg(feature = "fault-injection")]
    pub fn raise_fatal_error(&self, reason: &str) -> bool {
        self.producer.raise_fatal_error(reason)
    }

    /// Produces one message; the future resolves with the broker's answer. It owns what it
    /// needs, so it can outlive its caller's wait (spawned as a task). Only the
    /// acknowledged may be removed from the outbox.
    pub fn publish(
        &self,
        message: &DeliveryMessage,
    ) -> impl std::future::Future<Output = Result<()>> + Send + 'static {
        let (id, headers) = message.encode();
        let (producer, topic) = (self.producer.clone(), self.topic.clone());
        async move {
            let key = Some(id.as_bytes());
            Ok(producer.send(&topic, key, key, headers).await?)
        }
    }
}
