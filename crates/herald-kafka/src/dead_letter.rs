//! The dead-letter producer: poison input goes to `herald.dead-letter` with headers that
//! name the reason and the source topic, partition and offset, and the original key, value
//! and trace headers, so nothing is lost and it can be replayed once fixed.

use std::time::Duration;

use futures::future::try_join_all;
use rdkafka::message::{Header, Headers, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::Message;

use crate::headers::*;
use crate::{KafkaError, KafkaSettings, Result};

/// One message to dead-letter, with its bounded reason code and a human detail.
pub struct DeadLetter<'a> {
    pub message: &'a OwnedMessage,
    pub reason: &'static str,
    pub detail: String,
}

#[derive(Clone)]
pub struct DeadLetterProducer {
    producer: FutureProducer,
    topic: String,
    group: String,
}

/// Longest detail kept in a header; details quote input, which may be huge.
const MAX_DETAIL: usize = 1024;

impl DeadLetterProducer {
    pub fn new(settings: &KafkaSettings, topic: &str, group: &str) -> Result<Self> {
        Ok(Self {
            producer: settings.producer().create()?,
            topic: topic.to_owned(),
            group: group.to_owned(),
        })
    }

    /// Produces all and waits until the broker acknowledged every one. Fails as a whole
    /// if any is not acknowledged (the caller then keeps the offsets unstored and retries).
    pub async fn send_all(&self, letters: &[DeadLetter<'_>]) -> Result<()> {
        let sends = letters.iter().map(|l| self.send(l));
        try_join_all(sends).await?;
        Ok(())
    }

    async fn send(&self, l: &DeadLetter<'_>) -> Result<()> {
        let m = l.message;
        let mut detail = l.detail.clone();
        if detail.len() > MAX_DETAIL {
            let mut cut = MAX_DETAIL;
            while !detail.is_char_boundary(cut) {
                cut -= 1;
            }
            detail.truncate(cut);
            detail.push('…');
        }
        let partition = m.partition().to_string();
        let offset = m.offset().to_string();
        let timestamp = m.timestamp().to_millis().map(|t| t.to_string());
        let mut headers = OwnedHeaders::new()
            .insert(Header {
                key: DLQ_REASON,
                value: Some(l.reason),
            })
            .insert(Header {
                key: DLQ_DETAIL,
                value: Some(detail.as_str()),
            })
            .insert(Header {
                key: DLQ_SOURCE_TOPIC,
                value: Some(m.topic()),
            })
            .insert(Header {
                key: DLQ_SOURCE_PARTITION,
                value: Some(partition.as_str()),
            })
            .insert(Header {
                key: DLQ_SOURCE_OFFSET,
                value: Some(offset.as_str()),
            })
            .insert(Header {
                key: DLQ_CONSUMER_GROUP,
                value: Some(self.group.as_str()),
            });
        if let Some(ts) = &timestamp {
            headers = headers.insert(Header {
                key: DLQ_SOURCE_TIMESTAMP,
                value: Some(ts.as_str()),
            });
        }
        if let Some(original) = m.headers() {
            for h in original.iter() {
                headers = headers.insert(Header {
                    key: h.key,
                    value: h.value,
                });
            }
        }
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&self.topic).headers(headers);
        if let Some(k) = m.key() {
            record = record.key(k);
        }
        if let Some(v) = m.payload() {
            record = record.payload(v);
        }
        self.producer
            .send(record, Duration::from_secs(30))
            .await
            .map_err(|(e, _)| KafkaError::Client(e))?;
        Ok(())
    }
}
