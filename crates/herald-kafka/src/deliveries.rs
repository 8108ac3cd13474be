//! The producer side of `herald.deliveries`: one message per intent to deliver, key = the
//! intent id (so every message of one intent lands on one partition), value = the intent id,
//! W3C trace context in the headers. Idempotent producer, `acks=all`.

use std::time::Duration;

use futures::future::join_all;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::headers::TRACEPARENT;
use crate::{KafkaSettings, Result};

/// One intent to publish.
pub struct DeliveryMessage<'a> {
    pub intent_id: &'a str,
    pub trace_context: Option<&'a str>,
}

#[derive(Clone)]
pub struct DeliveryPublisher {
    producer: FutureProducer,
    topic: String,
}

impl DeliveryPublisher {
    pub fn new(settings: &KafkaSettings, topic: &str) -> Result<Self> {
        Ok(Self {
            producer: settings.producer().create()?,
            topic: topic.to_owned(),
        })
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Produces every message and waits for each acknowledgement. Returns, per message,
    /// whether the broker acknowledged it: only those may be removed from the outbox.
    pub async fn publish_all(&self, messages: &[DeliveryMessage<'_>]) -> Vec<bool> {
        let sends = messages.iter().map(|m| async move {
            let mut record: FutureRecord<'_, str, str> =
                FutureRecord::to(&self.topic).key(m.intent_id).payload(m.intent_id);
            if let Some(tc) = m.trace_context {
                record = record.headers(OwnedHeaders::new().insert(Header {
                    key: TRACEPARENT,
                    value: Some(tc),
                }));
            }
            match self.producer.send(record, Duration::from_secs(30)).await {
                Ok(_) => true,
                Err((e, _)) => {
                    tracing::warn!(error = %e, intent_id = m.intent_id, "delivery message not acknowledged; it stays in the outbox");
                    false
                }
            }
        });
        join_all(sends).await
    }
}
